// apps/strata/common.cpp — shared option handling for the subcommands.
#include "apps/strata/common.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "bench/rate_probe.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/checkpoint.h"
#include "engine/safetensors.h"
#include "engine/test_hooks.h"
#include "kernels/device.h"
#include "comm/comm_registry.h"

namespace strata::app {

void add_config_options(CLI::App& cmd, ConfigArgs& args) {
  cmd.add_option("--config,-c", args.config_path, "TOML config file (default: built-in defaults)");
  cmd.add_option("--set,-s", args.sets, "override one key: --set section.key=value (repeatable)")
      ->take_all();
  cmd.add_option("--init-from", args.init_from,
                 "Hugging Face directory (config.json + safetensors) to start from");
}

Config load(const ConfigArgs& args) {
  Config cfg = load_config(args.config_path, args.sets);
  if (args.init_from.empty()) return cfg;
  // The model is --init-from's (its config.json), for the plan and "auto" placement as for the
  // trainer. A --set of a model key that says otherwise is an error, not dropped in silence;
  // model.loss_chunk is a run setting and stays.
  Config theirs = cfg;
  theirs.model = read_hf_config(args.init_from);
  theirs.model.loss_chunk = cfg.model.loss_chunk;
  const nlohmann::json mine = config_to_json(cfg)["model"], hf = config_to_json(theirs)["model"];
  for (const std::string& set : args.sets) {
    const std::string key = override_key(set);
    if (key.rfind("model.", 0) != 0 || key == "model.loss_chunk") continue;
    const std::string name = key.substr(6);
    if (hf.contains(name) && mine.value(name, nlohmann::json()) != hf[name])
      fail("train::init_from",
           str("--set ", set, " contradicts --init-from ", args.init_from, ", whose config.json "
               "gives ", key, " = ", hf[name].dump()),
           "drop that --set: the model comes from --init-from (model.loss_chunk is the one model "
           "key a run sets)");
  }
  validate(theirs);
  return theirs;
}

Config load_for_resume(const ConfigArgs& args, const std::string& resume) {
  if (!args.init_from.empty())
    fail("train::resume", "--init-from and --resume both give the starting weights",
         "drop --init-from: a resumed run continues from the checkpoint's weights and optimizer state");
  const std::string dir = resolve_checkpoint(resume);
  const bool dir_set = std::any_of(args.sets.begin(), args.sets.end(), [](const std::string& s) {
    return override_key(s) == "checkpoint.dir";
  });
  if (!args.config_path.empty()) {
    Config c = load_config(args.config_path, args.sets);
    if (c.checkpoint.dir.empty())
      log_warn("train", "--config ", args.config_path, " has no checkpoint.dir: this resumed run "
               "saves no checkpoints (--set checkpoint.dir=",
               std::filesystem::path(dir).parent_path().string(),
               " goes on saving where it was resumed from)");
    return c;
  }
  const CheckpointManifest m = read_manifest(dir);
  Config c = parse_config(m.config_toml, dir + "/manifest.json (config_toml)", args.sets);
  // The run goes on saving where it was resumed from: the manifest's checkpoint.dir may be
  // relative to another working directory, or the folder a copy of this one.
  if (!dir_set) c.checkpoint.dir = std::filesystem::path(dir).parent_path().string();
  return c;
}

PlanMachine plan_machine(const Config& cfg, int ranks) {
  PlanMachine machine;
  machine.ranks_here = ranks;
  if (uses_cuda(cfg)) {
    machine.device_is_host_memory = false;
    if (cuda_device_count() > 0) {
      machine.device_capacity = make_device(DeviceKind::cuda)->memory().limit_bytes;
    } else if (cfg.offload.device_mem_limit) {
      machine.device_capacity = cfg.offload.device_mem_limit;
    } else {
      fail("plan::device", "train.device = cuda but this machine has no CUDA device to size",
           "set offload.device_mem_limit to the GPU memory to plan for");
    }
  } else {
    machine.device_is_host_memory = true;
    machine.device_capacity = physical_memory_bytes();
  }
  return machine;
}

std::unique_ptr<Communicator> make_world() { return make_world_communicator(); }

void end_job_if_peers(const std::exception& e) {
  if (!world_has_peers()) return;
  std::fprintf(stderr, "strata: error on rank %d of %d: %s\nstrata: ending every rank of the job\n",
               world_rank_hint(), world_size_hint(), e.what());
  std::fflush(stderr);
  abort_world(1);
}

void apply_fault_hooks(int rank, TrainerOptions& options) {
  const char* spec = std::getenv("STRATA_FAULT");
  if (!spec || !*spec) return;
  int target = 0;
  int64_t step = 1;
  int skip = 0;
  std::string fault, phase;
  std::string text = spec;
  size_t at = 0;
  while (at <= text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    try {
      if (key == "rank") target = std::stoi(value);
      else if (key == "step") step = std::stoll(value);
      else if (key == "skip") skip = std::stoi(value);
      else if (key == "fault") fault = value;
      else if (key == "phase") phase = value;
      else throw std::invalid_argument(key);
    } catch (const std::exception&) {
      fail("app::fault", str("STRATA_FAULT: cannot read '", item, "'"),
           "write e.g. STRATA_FAULT=rank=1,step=2,fault=hang (keys: rank, step, skip, fault)");
    }
  }
  if (rank != target) return;
  auto hooks = std::make_shared<TestHooks>();
  if (fault == "hang") {
    hooks->before_step = [step](int64_t s) {
      if (s != step) return;
      std::fprintf(stderr, "strata: STRATA_FAULT: rank stops responding before step %lld\n", (long long)s);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    };
  } else if (fault == "hang_at_exit") {
    // Registered after the MPI runtime's exit handler, so it runs first: this rank never reaches
    // MPI_Finalize, and the others wait for it there.
    std::atexit([] {
      std::fprintf(stderr, "strata: STRATA_FAULT: rank stops responding at exit\n");
      std::fflush(stderr);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    });
  } else if (fault == "error") {
    hooks->before_step = [step, rank](int64_t s) {
      if (s == step) fail("app::fault", str("STRATA_FAULT: injected error on rank ", rank, " before step ", s));
    };
  } else if (fault == "nvme_read_error" || fault == "nvme_write_error") {
    FaultRule rule;
    rule.fault = Fault::io_error;
    rule.op = int(fault == "nvme_read_error" ? IoOp::read : IoOp::write);
    rule.skip = skip;
    rule.times = 1;
    hooks->io_faults.push_back(rule);
  } else if (fault == "kill") {  // SIGKILL at a phase of the save of step S
    if (phase != "shard" && phase != "manifest" && phase != "rename" && phase != "latest" &&
        phase != "prune")
      fail("app::fault", str("STRATA_FAULT: phase '", phase, "'"),
           "allowed: shard, manifest, rename, latest, prune");
    hooks->checkpoint_hook = [step, phase](const char* at, int64_t s) {
      if (s != step || phase != at) return;
      std::fprintf(stderr, "strata: STRATA_FAULT: killed at phase '%s' of the save of step %lld\n", at,
                   (long long)s);
      std::fflush(stderr);
      std::raise(SIGKILL);
    };
  } else if (fault == "checkpoint_eio" || fault == "checkpoint_enospc") {
    FaultRule rule;
    rule.fault = fault == "checkpoint_eio" ? Fault::io_error : Fault::no_space;
    rule.op = int(IoOp::write);
    rule.skip = skip;
    rule.times = 1;
    hooks->checkpoint_io_faults.push_back(rule);
  } else {
    fail("app::fault", str("STRATA_FAULT: unknown fault '", fault, "'"),
         "allowed: hang, error, nvme_read_error, nvme_write_error, kill (with phase=shard | "
         "manifest | rename | latest), checkpoint_eio, checkpoint_enospc");
  }
  options.test_hooks = std::move(hooks);
}

}  // namespace strata::app
