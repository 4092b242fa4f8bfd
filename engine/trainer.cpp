// engine/trainer.cpp — the training loop of engine/trainer.h.
#include "engine/trainer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <tbb/global_control.h>

#include "core/cpu.h"
#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/trace.h"
#include "core/watchdog.h"
#include "engine/checkpoint_writer.h"
#include "engine/test_hooks.h"
#include "comm/comm_nccl.h"
#include "engine/data.h"
#include "comm/mesh.h"
#include "engine/file_util.h"
#include "engine/model.h"
#include "engine/pipeline.h"
#include "engine/plan.h"
#include "engine/safetensors.h"
#include "engine/tensor_parallel.h"
#include "engine/zero.h"
#include "kernels/device.h"
#include "optimizer/schedule.h"

namespace strata {
namespace {

// A resumed run trains the steps after its checkpoint again. The lines an earlier run logged past
// that step (it ran on after the save, then ended) are dropped before the resumed run appends,
// and so is a line that is not JSON (cut short by a crash), so that the file holds every step
// once and in order. The file is replaced atomically, and only when something is dropped.
// `expect_line`: whether the run logs a line at `step` (log.every, eval.every), else its
// absence is no loss.
void trim_metrics_past(const std::string& path, int64_t step, bool expect_line) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return;
  const std::string text = fileutil::read_file(path, "train::metrics");
  std::string kept;
  size_t dropped = 0, begin = 0;
  bool has_line_at_step = false;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + begin, end - begin);
    begin = end + 1;
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool has_step = j.is_object() && j.contains("step") && j["step"].is_number_integer();
    if (!has_step || j["step"].get<int64_t>() > step) {
      ++dropped;
      continue;
    }
    has_line_at_step = has_line_at_step || j["step"].get<int64_t>() == step;
    kept.append(line);
    kept += '\n';
  }
  if (dropped > 0 || (!text.empty() && text.back() != '\n')) {  // (appends start on a new line)
    fileutil::write_file_atomic(path, kept, "train::metrics");
    if (dropped > 0)
      log_info("train", "log.metrics '", path, "': dropped ", dropped, " line(s) past step ",
               step, " or not JSON (this run trains those steps again)");
  }
  if (!has_line_at_step && expect_line)
    log_warn("train", "log.metrics '", path, "' has no line for step ", step, ", the step the ",
             "checkpoint holds: the run that saved it ended before logging it");
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Numbers of the progress line: "%.Nf", "%.2e", and a duration as 45s, 12m05s or 3h07m.
std::string fixed(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}
std::string sci(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}
std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const int64_t s = int64_t(seconds + 0.5);
  char b[64];
  if (s < 60)
    std::snprintf(b, sizeof b, "%llds", (long long)s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(b, sizeof b, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  return b;
}

DeviceKind pick_device(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda") return DeviceKind::cuda;
  return cuda_device_count() > 0 ? DeviceKind::cuda : DeviceKind::cpu;  // auto
}

// Host staging for one micro-batch: inputs and targets (B × T each) and the event that says the
// device has consumed them.
struct HostBatch {
  Buffer tokens;
  std::unique_ptr<Event> consumed;
};

// Keys that describe only a rank's own machine (paths on its disks, its cores, its I/O knobs,
// files only it writes): they may differ between ranks.
bool rank_local_key(std::string_view key) {
  return key == "offload.nvme_path" || key == "train.threads" || key.rfind("io.", 0) == 0 ||
         key == "log.metrics" || key == "log.trace";
}

// The compared keys and their values (the JSON of config_to_json: numbers as they round-trip,
// so 1e-3 and 0.001 agree), and the text that carries them to the other ranks: one "key=value"
// line each, sorted.
std::map<std::string, std::string> comparable_config(const Config& config) {
  std::map<std::string, std::string> keys;
  const nlohmann::json all = config_to_json(config);
  for (const auto& [section, values] : all.items())
    for (const auto& [key, value] : values.items()) {
      std::string name = section + "." + key;
      if (!rank_local_key(name)) keys[name] = value.dump();
    }
  return keys;
}
std::string config_text(const std::map<std::string, std::string>& keys) {
  std::string out;
  for (const auto& [name, value] : keys) out += name + "=" + value + "\n";
  return out;
}
std::map<std::string, std::string> config_lines(const std::string& text) {
  std::map<std::string, std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = text.find('\n', at), eq = text.find('=', at);
    out[text.substr(at, eq - at)] = text.substr(eq + 1, end - eq - 1);
    at = end + 1;
  }
  return out;
}

// A fingerprint of the weights under an --init-from path (a .safetensors file, or every one in a
// folder): each file's name, size and xxHash64 of its first 64 KiB (the header) and of 64 pieces
// of 4 KiB spread over it. Ranks whose weights differ in any of those (another model, another
// fine-tune of the same shapes) tell apart without reading the whole file.
std::string weights_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  } else {
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  XXH64_state_t* h = XXH64_createState();
  XXH64_reset(h, 0);
  std::vector<char> buf(size_t{64} << 10);
  for (const std::string& f : files) {
    const std::string name = fs::path(f).filename().string();
    XXH64_update(h, name.data(), name.size());
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // the loader names what cannot be read
    struct stat st {};
    ::fstat(fd, &st);
    const uint64_t size = uint64_t(st.st_size);
    XXH64_update(h, &size, sizeof size);
    auto take = [&](uint64_t at, size_t n) {
      const ssize_t got = ::pread(fd, buf.data(), std::min<uint64_t>(n, size - std::min(at, size)),
                                  off_t(at));
      if (got > 0) XXH64_update(h, buf.data(), size_t(got));
    };
    take(0, buf.size());
    for (uint64_t i = 0; i < 64; ++i) take(size / 64 * i, 4096);
    ::close(fd);
  }
  const uint64_t d = XXH64_digest(h);
  XXH64_freeState(h);
  return str(files.size(), " file(s), xxh64 ", hash_hex(d));
}

// The rank's index among the ranks of its machine, as Open MPI, MPICH (Hydra) or Slurm set it;
// 0 without any of them.
int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* e = std::getenv(v)) return std::atoi(e);
  return 0;
}

}  // namespace

int training_cuda_ordinal() {
  const int gpus = cuda_device_count();
  return gpus > 0 ? local_rank() % gpus : 0;  // one GPU per rank on each machine
}

void check_same_config_on_every_rank(const Config& config, Communicator& world,
                                     const std::map<std::string, std::string>& start) {
  if (world.size() == 1) return;
  auto dev = make_device(DeviceKind::cpu);
  auto stream = dev->make_stream("config check");
  // Rank 0's text to every rank (its length first).
  auto broadcast_text = [&](std::string& text, int root) {
    int32_t n = int32_t(text.size());
    world.broadcast(*stream, &n, 1, CommType::i32, root);
    stream->synchronize();
    text.resize(size_t(n));
    world.broadcast(*stream, text.data(), text.size(), CommType::u8, root);
    stream->synchronize();
  };
  const auto b = [&] {
    auto keys = comparable_config(config);
    keys.insert(start.begin(), start.end());
    return keys;
  }();
  const std::string mine = config_text(b);
  std::string lead = mine;
  broadcast_text(lead, 0);
  std::string differences;
  int n_keys = 0;
  if (lead != mine) {
    const auto a = config_lines(lead);
    std::set<std::string> names;
    for (const auto& [k, v] : a) names.insert(k);
    for (const auto& [k, v] : b) names.insert(k);
    for (const std::string& k : names) {
      const auto ia = a.find(k), ib = b.find(k);
      const std::string va = ia == a.end() ? "(none)" : ia->second;
      const std::string vb = ib == b.end() ? "(none)" : ib->second;
      if (va == vb) continue;
      if (++n_keys <= 8)
        differences += str(n_keys > 1 ? "; " : "", k, " = ", vb, " (rank 0: ", va, ")");
    }
    if (n_keys > 8) differences += str("; and ", n_keys - 8, " more");
  }
  // Which ranks differ: the first one tells every rank what.
  std::vector<int32_t> differs(size_t(world.size()), 0);
  const int32_t here = n_keys > 0 ? 1 : 0;
  world.all_gather(*stream, differs.data(), &here, 1, CommType::i32);
  stream->synchronize();
  int first = -1, count = 0;
  for (int r = 0; r < world.size(); ++r)
    if (differs[size_t(r)]) {
      if (first < 0) first = r;
      ++count;
    }
  if (first < 0) return;
  broadcast_text(differences, first);
  fail("train::config",
       str("rank ", first, " of ", world.size(),
           " runs with a configuration that differs from rank 0's: ", differences,
           count > 1 ? str(" (", count - 1, " other rank(s) differ too)") : ""),
       "every rank must run the same configuration, from the same --resume checkpoint or "
       "--init-from weights: the same config file and options on every node (only "
       "offload.nvme_path, train.threads, io.* and log.metrics / log.trace may differ)");
}

struct Trainer::Impl {
  Config cfg;
  TrainerOptions opt;
  Communicator& world;
  Mesh mesh;
  Communicator* dpc = nullptr;  // the data-parallel group: mesh.dp_comm, or NCCL on CUDA
  std::unique_ptr<Communicator> nccl_dp;       // the data-parallel group over NCCL (CUDA)
  Communicator* tpc = nullptr;  // the tensor-parallel group (tp > 1): mesh.tp_comm, or NCCL
  Communicator* kvc = nullptr;  // the ranks sharing this rank's kv head (tp > n_kv_heads)
  std::unique_ptr<Communicator> kv_mpi, nccl_tp, nccl_kv;
  // Pipeline stages (parallel.pp > 1; engine/pipeline.h): the partition, this rank's stage and
  // schedule, and the links to the neighbouring stages. Each direction of each link has its
  // own stream and communicator (a duplicate of the pp group per link parity), so a send never
  // queues behind a receive and the two ranks of a link use each communicator from one stream.
  int pp = 1, stage = 0;
  std::vector<StageUnits> stages;
  std::vector<PipeOp> schedule;
  Communicator* ppc = nullptr;                 // the pp group for the loss and the norm (NCCL on CUDA)
  std::unique_ptr<Communicator> nccl_pp;
  std::unique_ptr<Communicator> pp_links[4], nccl_links[4];  // activations ×2 parities, gradients ×2
  Communicator *send_next_c = nullptr, *recv_prev_c = nullptr, *recv_next_c = nullptr,
               *send_prev_c = nullptr;
  std::unique_ptr<Stream> send_next, recv_prev, recv_next, send_prev;
  // Per micro-batch slot of the runner: the compute stream finished its forward / backward; the
  // stage input / output gradient arrived; the output / input gradient has been sent.
  struct SlotEvents {
    std::unique_ptr<Event> fwd_done, bwd_done, act_in, grad_in, act_sent, grad_sent;
  };
  std::vector<SlotEvents> slot_events;
  std::unique_ptr<Device> host_device;         // for host-memory collectives over `world`
  std::unique_ptr<Stream> host_stream;
  std::unique_ptr<tbb::global_control> threads;
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> compute, comm, reduce;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<ZeroEngine> zero;
  std::unique_ptr<TokenSource> train_src, eval_src;
  std::unique_ptr<WindowSampler> train_windows, eval_windows;
  HostBatch host[2];
  Buffer loss_host;  // grad_accum doubles
  Buffer stop_flag;  // any_rank_asks_to_stop's all-reduce (host memory)
  int stopped_by = 0;  // > 0: every rank ends the run after the current step (the reason)
  std::ofstream metrics;
  int rank = 0, dp = 1;
  int64_t steps_done = 0;
  double last_eval_loss = -1;   // the latest evaluate() and the step it followed
  int64_t last_eval_step = -1;
  // Progress line: the end of this run, the latest eval loss, the clock of its ETA.
  int64_t progress_end = 0;
  double progress_eval_loss = -1;
  int64_t progress_eval_step = -1;
  int64_t progress_first_step = -1;
  Clock::time_point progress_t0;
  bool steal_warned = false;  // warn_steal: once per run
  uint64_t windows_done = 0;  // logical data windows the completed steps read
  // Checkpoints: the resume source, and the writer (declared after `zero`, so it is destroyed —
  // and its save in progress finished — before the engine whose states it reads).
  std::string resume_dir;
  CheckpointManifest resume_manifest;
  std::unique_ptr<Communicator> ckpt_comm;
  std::string trace_path;  // log.trace of this rank (rank r > 0: PATH.rank<r>); empty: none
  std::unique_ptr<CheckpointDirClaim> ckpt_claim;  // before the writer: released after it
  std::unique_ptr<CheckpointWriter> writer;
  std::vector<CheckpointPiece> ckpt_pieces;  // rank 0: the manifest's pieces, built at the first save

  // An error mid-pass (an overlapped optimizer step's failure surfaces in the next forward) can
  // leave work queued on the streams that reads the host batches and buffers freed with the
  // members below: drain the streams first (one that fails does not skip the others). The
  // pipeline's send and receive streams too: they are declared before the model and the runner
  // whose activation buffers their transfers read and write, so they would otherwise be drained
  // (by their own destructors) only after those buffers are gone.
  ~Impl() {
    for (Stream* st : {compute.get(), comm.get(), reduce.get(), host_stream.get(), send_next.get(),
                       recv_prev.get(), recv_next.get(), send_prev.get()}) {
      if (!st) continue;
      try {
        st->synchronize();
      } catch (const std::exception& e) {
        log_warn("train", "error while draining stream '", st->name(), "' at shutdown: ", e.what());
      }
    }
  }

  Impl(const Config& c, Communicator& w, TrainerOptions o) : cfg(c), opt(std::move(o)), world(w) {
    validate(cfg);
    watchdog_set_timeout(cfg.parallel.timeout);
    watchdog_set_step(-1);
    watchdog_set_phase("setup");
    // A read-ahead set where it cannot apply is not an error (one config serves several
    // placements, as `strata bench sweep` runs them), but it is said, not dropped in silence.
    if (world.rank() == 0 && cfg.offload.optimizer_read_ahead &&
        (cfg.offload.optimizer != Tier::nvme || !cfg.offload.overlap_optimizer))
      log_warn("train", "offload.optimizer_read_ahead = ",
               format_bytes(cfg.offload.optimizer_read_ahead), " is not used: it reads NVMe ",
               "optimizer states ahead of an overlapped step, and here offload.optimizer = \"",
               tier_name(cfg.offload.optimizer), "\"",
               cfg.offload.optimizer == Tier::nvme ? " with offload.overlap_optimizer = false" : "");
    // Files this run writes are opened first, so that a bad path fails before any collective
    // (and, on another rank, ends the job through the caller: see apps/strata/main.cpp).
    if (!opt.resume.empty()) {
      resume_dir = resolve_checkpoint(opt.resume);
      resume_manifest = read_manifest(resume_dir);
      check_same_model(resume_manifest, resume_dir);
      if (cfg.train.steps <= resume_manifest.step)
        fail("checkpoint::resume",
             str("train.steps = ", cfg.train.steps, ", but ", resume_dir, " has completed ",
                 resume_manifest.step, " steps: nothing is left to train"),
             str("set train.steps above ", resume_manifest.step, " (--set train.steps=N); "
                 "`strata checkpoint export` writes its weights"));
    }
    // Outputs that are written late are checked now, and none may be an input: a metrics file
    // opened with truncation, or a trace renamed over it, would destroy data.path.
    trace_path = world.rank() > 0 && !cfg.log.trace.empty()
                     ? str(cfg.log.trace, ".rank", world.rank())
                     : cfg.log.trace;
    if (!trace_path.empty()) fileutil::check_output_file(trace_path, "log.trace", "train::trace");
    for (const auto& [out, out_key] : {std::pair{cfg.log.metrics, "log.metrics"},
                                       std::pair{trace_path, "log.trace"}})
      for (const auto& [in, in_key] : {std::pair{cfg.data.path, "data.path"},
                                       std::pair{cfg.eval.path, "eval.path"}})
        fileutil::check_not_an_input(out, out_key, in, in_key, "train::outputs");
    if (!cfg.checkpoint.dir.empty())
      ckpt_claim = std::make_unique<CheckpointDirClaim>(
          cfg.checkpoint.dir, resume_dir.empty() ? 0 : resume_manifest.step, world.rank() == 0);
    if (world.rank() == 0 && !cfg.log.metrics.empty()) {
      // A resumed run appends: its lines carry the true step numbers after the earlier ones.
      if (!resume_dir.empty()) {
        const int64_t s = resume_manifest.step;
        trim_metrics_past(cfg.log.metrics, s, logs_line_at(s));
      }
      WatchedWait w(str("open of metrics file '", cfg.log.metrics, "'"), WaitKind::io,
                    watchdog_context());
      metrics.open(cfg.log.metrics,
                   std::ios::out | (resume_dir.empty() ? std::ios::trunc : std::ios::app));
      if (!metrics)
        fail("train::metrics", str("cannot open metrics file '", cfg.log.metrics, "' for writing"),
             "check that the directory exists and is writable (log.metrics)");
    }
    if (!opt.init_from.empty() && opt.resume.empty()) {
      const int loss_chunk = cfg.model.loss_chunk;  // a run setting, not the architecture's
      cfg.model = read_hf_config(opt.init_from);
      cfg.model.loss_chunk = loss_chunk;
      validate(cfg);
    }
    // Before the first collective that depends on the config (the mesh's splits), and after
    // --init-from's model is read: the ranks compare what they will train (each may read the
    // model from a folder of its own, a node-local copy).
    // What the ranks start from must agree too, and what the caller names.
    std::map<std::string, std::string> start = opt.same_on_every_rank;
    if (!resume_dir.empty())
      start["--resume"] = str("step ", resume_manifest.step, ", manifest xxh64 ",
                              hash_hex(checkpoint_file_hash(resume_dir + "/manifest.json")));
    else if (!opt.init_from.empty())
      start["--init-from"] = str("weights fingerprint ", weights_fingerprint(opt.init_from));
    check_same_config_on_every_rank(cfg, world, start);
    mesh = make_mesh(world, cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp);
    dpc = mesh.dp_comm.get();
    rank = mesh.dp_index;
    dp = mesh.dp;
    if (world.size() > 1) set_log_rank(world.rank());
    if (cfg.train.threads > 0)
      threads = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                      size_t(cfg.train.threads));
    pp = mesh.pp;
    stage = mesh.pp_index;
    stages = pipeline_partition(cfg);  // {all units} with pp = 1
    if (pp > 1) {
      schedule = pipeline_schedule(cfg.parallel.pp_schedule, pp, stage, cfg.train.grad_accum);
      ppc = mesh.pp_comm.get();
      ppc->set_name("pp");
      for (int j = 0; j < 4; ++j) {
        pp_links[j] = mesh.pp_comm->split(0, mesh.pp_index);
        pp_links[j]->set_name(str(j < 2 ? "pp activations " : "pp gradients ", j % 2));
      }
    }
    const TpShard shard = tp_shard(cfg.model, mesh.tp, mesh.tp_index);
    if (mesh.tp > 1) {
      tpc = mesh.tp_comm.get();
      tpc->set_name("tp");
      if (shard.kv_replicas > 1) {
        kv_mpi = mesh.tp_comm->split(mesh.tp_index / shard.kv_replicas, mesh.tp_index);
        kv_mpi->set_name("tp (kv heads)");
        kvc = kv_mpi.get();
      }
    }

    DeviceOptions dopt;
    dopt.mem_limit_bytes = cfg.offload.device_mem_limit;
    dopt.cpu_ops = opt.cpu_ops;
    const DeviceKind kind = pick_device(cfg.train.device);
    if (kind == DeviceKind::cuda) {
      const int gpus = cuda_device_count();
      if (gpus == 0)
        fail("train::device", "train.device = cuda but no CUDA device is present",
             "use train.device = cpu or auto");
      dopt.ordinal = training_cuda_ordinal();
      dopt.bf16_matmuls = cuda_bf16_matmuls(cfg.train);
    } else if (cfg.train.matmul_precision == "bf16") {
      fail("train::device", "train.matmul_precision = bf16 needs the CUDA device: the CPU device "
           "multiplies in f32", "set train.matmul_precision = auto or f32, or train.device = cuda");
    }
    device = make_device(kind, dopt);
    // World-level host collectives (metrics) run on a CPU stream: MPI moves host memory.
    host_device = kind == DeviceKind::cpu ? nullptr : make_device(DeviceKind::cpu);
    if (host_device) host_stream = host_device->make_stream("host-comm");
    // On CUDA, each group's collectives run over NCCL, on a communicator made over its MPI one.
    auto nccl_over = [&](Communicator& mpi, const std::string& name, const char* what) {
      if (!nccl_built())
        fail("train::comm", str(what, " training on CUDA needs NCCL, and this strata was built without it"),
             "install NCCL with the CUDA toolkit and rebuild");
      std::unique_ptr<Communicator> c = make_nccl_communicator(mpi, dopt.ordinal);
      c->set_name(name);
      return c;
    };
    if (kind == DeviceKind::cuda && dp > 1) {
      nccl_dp = nccl_over(*mesh.dp_comm, "dp", "data-parallel");
      dpc = nccl_dp.get();
    }
    if (kind == DeviceKind::cuda && mesh.tp > 1) {
      nccl_tp = nccl_over(*mesh.tp_comm, "tp", "tensor-parallel");
      tpc = nccl_tp.get();
      if (kv_mpi) {
        nccl_kv = nccl_over(*kv_mpi, "tp (kv heads)", "tensor-parallel");
        kvc = nccl_kv.get();
      }
    }
    if (kind == DeviceKind::cuda && pp > 1) {
      nccl_pp = nccl_over(*mesh.pp_comm, "pp", "pipeline-parallel");
      ppc = nccl_pp.get();
      for (int j = 0; j < 4; ++j)
        nccl_links[j] = nccl_over(*pp_links[j], pp_links[j]->name(), "pipeline-parallel");
    }
    if (pp > 1) {
      auto link = [&](int j) { return nccl_links[j] ? nccl_links[j].get() : pp_links[j].get(); };
      send_next_c = link(stage % 2);            // stage s → s + 1 on activations[s % 2]
      recv_prev_c = link((stage + 1) % 2);      // s − 1 → s on activations[(s − 1) % 2]
      recv_next_c = link(2 + stage % 2);        // s + 1 → s on gradients[s % 2]
      send_prev_c = link(2 + (stage + 1) % 2);  // s → s − 1 on gradients[(s − 1) % 2]
    }

    PlanMachine machine;
    machine.device_is_host_memory = device->kind() == DeviceKind::cpu;
    machine.device_capacity = device->memory().limit_bytes;
    {  // the host-memory and NVMe checks count the ranks of this machine, not of the job
      Device& cpu = host_device ? *host_device : *device;
      auto node_stream = cpu.make_stream("ranks per node");
      machine.ranks_here = ranks_on_this_node(world, *node_stream);
    }
    MemoryPlan plan = plan_memory(cfg, dp, machine, stage);
    if (!plan.fits())
      fail("train::plan", str("the run does not fit: ", plan.failed_checks(), "\n", plan.table()),
           str(plan.hint(), " (`strata plan` prints this table)"));
    compute = device->make_stream("compute");
    comm = device->make_stream("comm");
    reduce = device->make_stream("reduce");
    model = std::make_unique<LlamaModel>(cfg.model, dp, mesh.tp, mesh.tp_index, stages[size_t(stage)]);
    const int slots = pp > 1 ? max_in_flight(schedule) : 1;
    runner = std::make_unique<ModelRunner>(*model, *device, cfg.data.micro_batch, cfg.data.seq_len,
                                           cfg.zero.activation_checkpointing, cfg.train.grad_accum,
                                           TpOptions{tpc, kvc, cfg.parallel.sequence_parallel}, slots);
    if (pp > 1) {
      send_next = device->make_stream("pp send next");
      recv_prev = device->make_stream("pp recv prev");
      recv_next = device->make_stream("pp recv next");
      send_prev = device->make_stream("pp send prev");
      slot_events.resize(size_t(slots));
      for (auto& e : slot_events)
        for (auto* ev : {&e.fwd_done, &e.bwd_done, &e.act_in, &e.grad_in, &e.act_sent, &e.grad_sent})
          *ev = device->make_event();
    }
    ZeroOptions zo = zero_options(cfg);
    zo.test_hooks = opt.test_hooks;
    zo.world_rank = world.rank();
    zero = std::make_unique<ZeroEngine>(*model, *device, *dpc, *compute, *comm, *reduce, zo, tpc,
                                        pp > 1 ? ppc : nullptr);
    if (!resume_dir.empty()) {
      resume_from_checkpoint();
    } else if (opt.init_from.empty()) {
      zero->init_from_seed(cfg.train.seed);
    } else {
      SafetensorsReader reader(opt.init_from);
      if (std::filesystem::is_directory(opt.init_from)) check_every_tensor_used(reader);
      zero->init_from(reader);
    }
    if (!cfg.checkpoint.dir.empty()) {
      ckpt_comm = world.split(0, world.rank());
      ckpt_comm->set_name("checkpoint");
      CheckpointWriterOptions wo;
      wo.root = cfg.checkpoint.dir;
      wo.keep = cfg.checkpoint.keep;
      wo.io_backend = cfg.io.backend;
      wo.io_queue_depth = cfg.io.queue_depth;
      wo.io_block_size = cfg.io.block_size;
      wo.io_submit_batch = cfg.io.submit_batch;
      wo.test_hooks = opt.test_hooks;
      writer = std::make_unique<CheckpointWriter>(*ckpt_comm, wo);
    }

    train_src = open_tokens(cfg.data.path, cfg.model.vocab_size);
    train_windows = std::make_unique<WindowSampler>(*train_src, cfg.data.seq_len, cfg.data.shuffle,
                                                    cfg.train.seed);
    size_t n = size_t(cfg.data.micro_batch) * cfg.data.seq_len;
    for (auto& h : host) {
      h.tokens = device->alloc_host(2 * n * 4, true, "token staging");
      h.consumed = device->make_event();
    }
    loss_host = device->alloc_host(size_t(cfg.train.grad_accum) * 8, true, "loss readback");
  }

  // Fills host staging buffer `slot` (fill(inputs, targets)) and enqueues its copy.
  template <class Fill>
  void load(int slot, Fill fill) {
    HostBatch& h = host[slot];
    h.consumed->synchronize();  // the device has read the previous contents
    const size_t n = size_t(cfg.data.micro_batch) * cfg.data.seq_len;
    int32_t* in = h.tokens.as<int32_t>();
    fill(in, in + n);
    // Only the first stage reads inputs, only the last targets.
    runner->load_batch(*compute, model->has_embedding() ? in : nullptr,
                       model->has_head() ? in + n : nullptr);
    compute->record(*h.consumed);
  }
  void load(WindowSampler& windows, uint64_t first, int slot) {
    load(slot, [&](int32_t* in, int32_t* tgt) { windows.windows(first, cfg.data.micro_batch, in, tgt); });
  }

  std::vector<int> forward_order, backward_order;

  // keep: the units stay held for the backward that follows (zero.reshard_after_forward =
  // false); otherwise each is released after its forward (the tied embedding after the step).
  void forward_all(bool keep = false) {
    const int U = model->num_units();
    const bool tied = model->tied();
    if (forward_order.empty())
      for (int u = 0; u < U; ++u) forward_order.push_back(u);
    watchdog_set_phase("forward");
    zero->begin_pass(forward_order);
    const float* emb = tied ? zero->acquire(0) : nullptr;
    const int ahead = std::min(cfg.zero.prefetch, U);
    for (int u = 0; u < U; ++u) {
      const float* p = zero->acquire(u);
      runner->forward(*compute, u, p, emb);
      if (opt.test_hooks && opt.test_hooks->after_forward) {
        const std::span<const float> params(p, model->unit(u).layout.numel());
        compute->host_task("test hook", [hooks = opt.test_hooks, u, params] {
          hooks->after_forward(u, params);  // before release(u) lets the slot go
        });
      }
      // The look-ahead after the compute is enqueued: what it waits for on the host (an NVMe
      // read, the update of unit u+1 after an overlapped step) then overlaps unit u's forward.
      for (int k = 1; k <= ahead; ++k) zero->prefetch(u + k);
      if (!keep && !(tied && u == 0)) zero->release(u);
    }
  }

  // release: each unit's gathered parameters are freed after its backward (false keeps them
  // held for a later micro-batch of a pipeline step, zero.reshard_after_forward = false).
  void backward_all(float dloss, bool release = true) {
    const int U = model->num_units();
    const bool tied = model->tied();
    if (backward_order.empty())
      for (int u = U - 1; u >= 0; --u) backward_order.push_back(u);
    watchdog_set_phase("backward");
    zero->begin_pass(backward_order);
    const float* emb = tied ? zero->acquire(0) : nullptr;
    float* emb_grad = nullptr;
    const int ahead = std::min(cfg.zero.prefetch, U);
    for (int u = U - 1; u >= 0; --u) {
      const float* p = zero->acquire(u);
      float* g = zero->acquire_grad(u);
      // Tied embeddings: the head's backward also accumulates into unit 0's gradient, which
      // stays held until unit 0's own backward has run and it is reduced like any other.
      if (tied && u == U - 1) emb_grad = zero->acquire_grad(0);
      runner->backward(*compute, u, p, g, dloss, emb, emb_grad);
      for (int k = 1; k <= ahead; ++k) zero->prefetch(u - k);  // as in forward_all
      if (release) zero->release(u);
      zero->reduce_grad(u);
    }
  }

  // ---- pipeline stages ----

  // The trace's stage track: a span from the compute stream reaching `begin` to it reaching
  // the end mark, named like "F3" or "B3" (one track per stage, so the schedule can be seen).
  std::shared_ptr<int64_t> stage_mark_begin() {
    if (!trace_enabled()) return nullptr;
    auto t0 = std::make_shared<int64_t>(0);
    compute->host_task("pipeline mark", [t0] { *t0 = trace_now_us(); });
    return t0;
  }
  void stage_mark_end(const std::shared_ptr<int64_t>& t0, std::string name) {
    if (!t0) return;
    compute->host_task("pipeline mark", [t0, name = std::move(name), track = str("pipeline stage ", stage)] {
      trace_span(track, name, *t0, trace_now_us() - *t0);
    });
  }

  // Posts the receives of micro-batch i into its slot once the slot's previous occupant is done
  // with the buffers: its stage input (from the previous stage) and, when `grads`, the gradient
  // of its output (from the next stage).
  void post_receives(int i, bool grads = true) {
    const int k = i % runner->slots();
    runner->use_slot(k);
    SlotEvents& e = slot_events[size_t(k)];
    const size_t n = runner->boundary_floats();
    if (!model->has_embedding()) {
      recv_prev->wait(*e.fwd_done);
      recv_prev->wait(*e.bwd_done);
      recv_prev_c->recv(*recv_prev, runner->stage_input(), n, CommType::f32, stage - 1, i);
      recv_prev->record(*e.act_in);
    }
    if (grads && !model->has_head()) {
      recv_next->wait(*e.bwd_done);
      recv_next_c->recv(*recv_next, runner->grad_output(), n, CommType::f32, stage + 1, i);
      recv_next->record(*e.grad_in);
    }
  }

  // The stage's forward of micro-batch i (its receive posted): inputs or targets loaded where
  // this stage reads them, the units run, the output sent on.
  template <class LoadMicro>
  void pipe_forward(int i, LoadMicro& load_micro, bool keep) {
    const int k = i % runner->slots();
    runner->use_slot(k);
    SlotEvents& e = slot_events[size_t(k)];
    if (model->has_embedding() || model->has_head()) load_micro(i);
    if (!model->has_embedding()) compute->wait(*e.act_in);
    if (!model->has_head()) compute->wait(*e.act_sent);  // the slot's last output has left
    auto t0 = stage_mark_begin();
    forward_all(keep);
    stage_mark_end(t0, str("F", i));
    compute->record(*e.fwd_done);
    if (!model->has_head()) {
      send_next->wait(*e.fwd_done);
      send_next_c->send(*send_next, runner->stage_output(), runner->boundary_floats(), CommType::f32,
                        stage + 1, i);
      send_next->record(*e.act_sent);
    }
  }

  void pipe_backward(int i, float dloss, bool release) {
    const int k = i % runner->slots();
    runner->use_slot(k);
    SlotEvents& e = slot_events[size_t(k)];
    if (!model->has_head()) compute->wait(*e.grad_in);
    if (!model->has_embedding()) compute->wait(*e.grad_sent);  // the slot's last gradient has left
    auto t0 = stage_mark_begin();
    backward_all(dloss, release);
    stage_mark_end(t0, str("B", i));
    compute->record(*e.bwd_done);
    if (!model->has_embedding()) {
      send_prev->wait(*e.bwd_done);
      send_prev_c->send(*send_prev, runner->grad_input(), runner->boundary_floats(), CommType::f32,
                        stage - 1, i);
      send_prev->record(*e.grad_sent);
    }
  }

  // One step's micro-batches through this stage in schedule order. Receives are posted as soon
  // as their slot is free, so they wait on the link while compute runs. With
  // zero.reshard_after_forward = false the units stay gathered for the whole step (gathered once,
  // released after the last backward); otherwise each forward and each backward gathers them.
  template <class LoadMicro, class LastBackward>
  void pipeline_step(float dloss, LoadMicro& load_micro, LastBackward& last_backward) {
    const int A = cfg.train.grad_accum, slots = runner->slots();
    const bool keep = !cfg.zero.reshard_after_forward;
    int held = 0;
    for (int i = 0; i < std::min(slots, A); ++i) post_receives(i);
    for (size_t j = 0; j < schedule.size(); ++j) {
      const PipeOp op = schedule[j];
      if (op.forward) {
        // The memory accounting's promise: never more micro-batches than slots.
        STRATA_CHECK(++held <= slots, "train::pipeline", "stage ", stage, " would hold ", held,
                     " micro-batches with ", slots, " slots (", schedule_text(schedule), ")");
        pipe_forward(op.micro, load_micro, keep);
      } else {
        --held;
        if (j + 1 == schedule.size()) last_backward();
        pipe_backward(op.micro, dloss, !keep || j + 1 == schedule.size());
        if (op.micro + slots < A) post_receives(op.micro + slots);
      }
    }
  }

  void sync_links() {
    for (Stream* s : {send_next.get(), recv_prev.get(), recv_next.get(), send_prev.get()})
      if (s) s->synchronize();
  }

  double mean_loss(int micro_batches, uint64_t tokens_per_rank) {
    runner->copy_losses(*compute, loss_host.as<double>());
    compute->synchronize();
    double local = 0;
    STRATA_CHECK(runner->loss_count() == (model->has_head() ? micro_batches : 0), "train::loss",
                 runner->loss_count(), " losses for ", micro_batches, " micro-batches");
    for (int i = 0; i < runner->loss_count(); ++i) local += loss_host.as<double>()[i];
    double* h = loss_host.as<double>();
    h[0] = local;
    if (dp > 1) {
      dpc->all_reduce(*comm, h, 1, CommType::f64, ReduceOp::sum);
      comm->synchronize();
    }
    if (pp > 1) {  // only the last stage has losses: the others add zero
      ppc->all_reduce(*comm, h, 1, CommType::f64, ReduceOp::sum);
      comm->synchronize();
    }
    return h[0] / double(tokens_per_rank * uint64_t(dp));
  }

  StepRecord step(const LrSchedule& lr) {
    const int B = cfg.data.micro_batch, T = cfg.data.seq_len, A = cfg.train.grad_accum;
    const uint64_t G = uint64_t(B) * A * dp;  // windows per step
    const uint64_t tokens_per_rank = uint64_t(B) * T * A;
    const float dloss = float(1.0 / double(G * T));
    StepRecord r;
    r.step = steps_done + 1;
    watchdog_set_step(r.step);
    if (writer) writer->poll();  // a save that failed ends the run here
    if (opt.test_hooks && opt.test_hooks->before_step) opt.test_hooks->before_step(r.step);
    auto t0 = Clock::now();
    const CpuTimes cpu0 = cpu_times();
    const double waited0 = compute->waited_ms();
    runner->reset_loss();
    auto load_micro = [&](int a) {
      if (opt.batch_source)
        load(a % 2, [&](int32_t* in, int32_t* tgt) { opt.batch_source(steps_done, a, rank, in, tgt); });
      else
        load(*train_windows, windows_done + (uint64_t(a) * dp + rank) * B, a % 2);
    };
    r.lr = lr.at(steps_done);
    AdamWHyper h;
    h.lr = float(r.lr);
    h.beta1 = cfg.train.beta1;
    h.beta2 = cfg.train.beta2;
    h.eps = cfg.train.eps;
    h.weight_decay = cfg.train.weight_decay;
    // Before the step's last backward. Clipping needs the norm of every final gradient, so the
    // optimizer only reads its states ahead (prepare_step); without it nothing waits for the
    // norm and each unit is updated as soon as its gradient is final, beside the rest of the
    // backward (update_in_backward) — unless on_gradients must see the gradients first. A save
    // in progress must have read master, m and v before they change.
    const bool update_in_backward = cfg.train.grad_clip <= 0.0f && !opt.on_gradients;
    auto last_backward = [&] {
      if (!update_in_backward) return zero->prepare_step();
      if (writer) {
        auto tw = Clock::now();
        writer->wait_reads();
        r.checkpoint_stall_ms += ms_since(tw);
      }
      zero->update_in_backward(h, r.step, cfg.train.decay_norms);
    };
    if (pp > 1) {
      pipeline_step(dloss, load_micro, last_backward);
    } else {
      for (int a = 0; a < A; ++a) {
        load_micro(a);
        forward_all(!cfg.zero.reshard_after_forward);
        if (a + 1 == A) last_backward();
        backward_all(dloss);
      }
    }
    watchdog_set_phase("loss");
    r.loss = mean_loss(A, tokens_per_rank);
    comm->synchronize();
    reduce->synchronize();
    sync_links();
    r.compute_ms = ms_since(t0);
    r.wait_comm_ms = compute->waited_ms() - waited0;
    r.traffic = zero->take_traffic();
    r.tp_comm_bytes = runner->take_tp_bytes();
    r.comm_bytes = r.traffic.comm_bytes + r.tp_comm_bytes;
    if (opt.on_gradients) opt.on_gradients(r.step);
    auto t1 = Clock::now();
    watchdog_set_phase("optimizer");
    r.grad_norm = zero->grad_norm();
    if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss))
      fail("train::step", str("step ", r.step, ": loss ", r.loss, ", gradient norm ", r.grad_norm,
                              " — training diverged"),
           "lower train.lr, raise train.warmup_steps, or set train.grad_clip");
    if (writer) {  // a save in progress must have read master, m and v before they change
      auto tw = Clock::now();
      writer->wait_reads();
      r.checkpoint_stall_ms += ms_since(tw);
    }
    // Zeroes the gradients too; with offload.overlap_optimizer it returns at once and the next
    // step's forward of unit u waits only for unit u's update (unclipped: the backward and
    // grad_norm() applied the step already).
    zero->optimizer_step(h, r.step, clip_coefficient(r.grad_norm, cfg.train.grad_clip),
                         cfg.train.decay_norms);
    compute->synchronize();
    r.optimizer_ms = ms_since(t1);
    ZeroTraffic opt_traffic = zero->take_traffic();  // the optimizer's NVMe reads and writes
    r.traffic.nvme_read_bytes += opt_traffic.nvme_read_bytes;
    r.traffic.nvme_write_bytes += opt_traffic.nvme_write_bytes;
    r.traffic.nvme_busy_ms += opt_traffic.nvme_busy_ms;
    r.traffic.nvme_wait_ms += opt_traffic.nvme_wait_ms;
    r.traffic.update_wait_ms += opt_traffic.update_wait_ms;
    r.traffic.read_ahead_bytes += opt_traffic.read_ahead_bytes;
    r.traffic.forwarded_bytes += opt_traffic.forwarded_bytes;
    r.traffic.h2d_bytes += opt_traffic.h2d_bytes;
    r.traffic.d2h_bytes += opt_traffic.d2h_bytes;
    r.step_ms = ms_since(t0);
    r.cpu = cpu_times() - cpu0;
    r.tokens_per_s = double(G * T) / (r.step_ms / 1000.0);
    if (opt.peak_flops > 0)
      r.mfu = r.tokens_per_s * model->train_flops_per_token(T) / (opt.peak_flops * world.size());
    ++steps_done;
    windows_done += G;
    if (opt.stop_requested && !stopped_by) stopped_by = any_rank_asks_to_stop();
    const bool last = r.step == cfg.train.steps || r.step == opt.stop_after || stopped_by > 0;
    if (writer && (r.step % cfg.checkpoint.every == 0 || last)) {
      auto tc = Clock::now();
      save_checkpoint(r.step);
      r.checkpoint_stall_ms += ms_since(tc);
      r.checkpoint_saved = r.step;
    }
    return r;
  }

  // The largest TrainerOptions::stop_requested() over the ranks (every rank asks after the same
  // step, so all of them agree on stopping after it).
  int any_rank_asks_to_stop() {
    const int mine = std::max(0, opt.stop_requested());
    if (world.size() == 1) return mine;
    if (!stop_flag)
      stop_flag = (host_device ? *host_device : *device).alloc_host(8, true, "stop flag");
    double* h = stop_flag.as<double>();
    h[0] = double(mine);
    Stream& hs = host_stream ? *host_stream : *comm;
    world.all_reduce(hs, h, 1, CommType::f64, ReduceOp::max);
    hs.synchronize();
    return int(h[0]);
  }

  // Hands this step's states to the writer (synchronously when checkpoint.async = false).
  void save_checkpoint(int64_t step) {
    watchdog_set_phase("checkpoint");
    CheckpointManifest m;
    m.strata_version = STRATA_VERSION;
    m.step = step;
    m.windows_consumed = windows_done;
    m.precision = std::string(precision_name(cfg.train.precision));
    m.optimizer_state_dtype = cfg.train.optimizer_state_dtype;
    m.world = world.size();
    m.dp = dp;
    m.tp = mesh.tp;
    m.pp = mesh.pp;
    m.config = config_to_json(cfg);
    m.config_toml = config_to_toml(cfg);
    m.tensors = checkpoint_tensors(*model);
    // Rank 0 lists every rank's pieces (the same table for every save of the run); each rank
    // writes its own blocks into the file of its world rank (the writer's communicator).
    if (world.rank() == 0) {
      if (ckpt_pieces.empty())
        ckpt_pieces = checkpoint_pieces(model->config(), dp, mesh.tp, cfg.train.optimizer_state_dtype,
                                        pp > 1 ? stages : std::vector<StageUnits>{});
      m.pieces = ckpt_pieces;
    }
    CheckpointSource& source = zero->checkpoint_source();
    writer->start(std::move(m), checkpoint_blocks(*model, rank, cfg.train.optimizer_state_dtype), source);
    if (!cfg.checkpoint.async) writer->wait();
  }

  // Every tensor of an --init-from folder's files is loaded, or the files are of another model
  // than its config.json (more layers, an untied output head): none is dropped in silence.
  // Rotary tables (rotary_emb.inv_freq, saved by older transformers) are derived, not weights; a
  // tied model's lm_head.weight may be there if it is the embedding.
  void check_every_tensor_used(const SafetensorsReader& reader) const {
    std::set<std::string> loaded;
    for (const auto& unit : model->all_units())
      for (const auto& v : unit.layout.views()) loaded.insert(v.name);
    auto same_values = [&](const std::string& a, const std::string& b) {
      if (!reader.has(b) || reader.info(a).shape != reader.info(b).shape) return false;
      const size_t n = size_t(reader.info(a).numel());
      std::vector<float> x(n), y(n);
      reader.read_f32(a, x.data());
      reader.read_f32(b, y.data());
      return std::memcmp(x.data(), y.data(), n * sizeof(float)) == 0;
    };
    std::vector<std::string> unused;
    for (const std::string& name : reader.names()) {
      if (loaded.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
      if (name == "lm_head.weight" && cfg.model.tie_embeddings &&
          same_values(name, "model.embed_tokens.weight"))
        continue;
      unused.push_back(name);
    }
    if (unused.empty()) return;
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(unused.size(), 3); ++i)
      list += str(i ? ", " : "", unused[i]);
    if (unused.size() > 3) list += str(", ... (", unused.size(), " in all)");
    fail("train::init_from",
         str(opt.init_from, " holds tensors that the model of its config.json does not have: ",
             list),
         "the weights are of another model than config.json describes (more layers? an output "
         "head of its own with tie_word_embeddings = true?): fix config.json, or use the folder "
         "the weights came with");
  }

  // A resumed run continues the model it was saved from: every model key but the ones that only
  // bound or split the run (max_seq_len, loss_chunk) and init_std (used before step 1) must be
  // the checkpoint's. Some would load (the same shapes) and train another function in silence:
  // rope_theta, norm_eps, the rope scaling.
  void check_same_model(const CheckpointManifest& m, const std::string& dir) const {
    if (!m.config.contains("model")) return;  // a manifest from before the model was recorded
    const nlohmann::json& saved = m.config["model"];
    const nlohmann::json mine = config_to_json(cfg)["model"];
    for (const auto& [key, value] : mine.items()) {
      if (key == "max_seq_len" || key == "loss_chunk" || key == "init_std") continue;
      if (!saved.contains(key) || saved[key] == value) continue;
      fail("checkpoint::resume",
           str("model.", key, " = ", value.dump(), ", but the checkpoint ", dir,
               " was trained with ", saved[key].dump(), ": a resumed run continues the same model"),
           str("drop that setting (--set model.", key, ") to resume; to train another model from "
               "these weights, export them (strata checkpoint export) and start from them with "
               "--init-from"));
    }
  }

  // Verifies the checkpoint's files (each rank a share; nobody starts until all are checked),
  // then loads this rank's shards from it, whatever mesh wrote it.
  void resume_from_checkpoint() {
    watchdog_set_phase("resume");
    const CheckpointManifest& m = resume_manifest;
    verify_checkpoint_files(resume_dir, m, world.rank(), world.size());
    double* h = loss_host ? loss_host.as<double>() : nullptr;
    Buffer flag;
    if (!h) {
      flag = device->alloc_host(8, true, "resume barrier");
      h = flag.as<double>();
    }
    h[0] = 1;
    if (world.size() > 1) {
      Stream& hs = host_stream ? *host_stream : *comm;
      world.all_reduce(hs, h, 1, CommType::f64, ReduceOp::sum);  // every rank has verified
      hs.synchronize();
    }
    zero->load_checkpoint(resume_dir, m);
    steps_done = m.step;
    windows_done = m.windows_consumed;
    // The data goes on from the window the checkpoint stopped at; with another global batch the
    // run reads other windows per step than the uninterrupted run would (allowed, and said).
    const nlohmann::json& saved = m.config;
    if (world.rank() == 0 && saved.contains("data") && saved.contains("train")) {
      const int64_t before = saved["data"].value("micro_batch", 0) *
                             int64_t(saved["train"].value("grad_accum", 0)) * m.dp;
      const int64_t now = int64_t(cfg.data.micro_batch) * cfg.train.grad_accum * dp;
      if (before > 0 && before != now)
        log_warn("checkpoint", "the global batch is ", now, " sequences (micro_batch ",
                 cfg.data.micro_batch, " x grad_accum ", cfg.train.grad_accum, " x dp ", dp,
                 "); the checkpoint was trained with ", before, ": each step now reads ", now,
                 " windows, and the steps left are the same number");
    }
    if (world.rank() == 0)
      log_info("checkpoint", "resuming from ", resume_dir, " (step ", m.step, ", written by ", m.world,
               " rank(s): pp ", m.pp, " x dp ", m.dp, " x tp ", m.tp, "); training continues to step ",
               cfg.train.steps);
  }

  // Whether a step logs a metrics line by the schedule alone (log.every, the first and last
  // steps, eval.every); a step logs one as well when a stop ends the run there.
  bool logs_line_at(int64_t step) const {
    return step == 1 || step % cfg.log.every == 0 || step == cfg.train.steps ||
           (cfg.eval.every > 0 && step % cfg.eval.every == 0);
  }

  bool logged_step(const StepRecord& r) const {
    return logs_line_at(r.step) || r.eval_loss >= 0 || stopped_by > 0;
  }

  // Largest device peak over all ranks (collective: every rank calls it on logged steps).
  uint64_t device_peak_over_ranks() {
    double* h = loss_host.as<double>();
    h[0] = double(device->memory().peak_bytes);
    if (world.size() > 1) {
      Stream& hs = host_stream ? *host_stream : *comm;
      world.all_reduce(hs, h, 1, CommType::f64, ReduceOp::max);
      hs.synchronize();
    }
    return uint64_t(h[0]);
  }

  // Tracing covers steps 2..4 (after the warm-up step); the file (trace_path) is written after
  // step 4 or at the last step.
  void trace_step_begin(int64_t step) {
    if (trace_path.empty()) return;
    if (step == std::min<int64_t>(2, cfg.train.steps)) {
      trace_clear();
      trace_enable(true);
    }
  }
  void trace_step_end(int64_t step) {
    if (trace_path.empty() || !trace_enabled()) return;
    if (step >= 4 || step == cfg.train.steps) {
      trace_enable(false);
      compute->synchronize();
      comm->synchronize();
      trace_write(trace_path, world.rank());
    }
  }

  void log_step(StepRecord& r) {
    bool logged = logged_step(r);
    if (logged) r.device_peak_bytes = device_peak_over_ranks();
    if (world.rank() != 0) return;
    if (metrics.is_open() && logged) {
      const ZeroMemory zmem = zero->memory();
      // GB/s over the time the swapper had I/O in flight (reads and writes share it).
      auto rate = [](uint64_t bytes, double ms) { return ms > 0 ? double(bytes) / (ms * 1e6) : 0.0; };
      nlohmann::json j = {
          {"step", r.step},
          {"loss", r.loss},
          {"lr", r.lr},
          {"grad_norm", r.grad_norm},
          {"tokens_per_s", r.tokens_per_s},
          {"mfu", r.mfu},
          {"step_ms", r.step_ms},
          {"params", model->num_params()},
          {"time", {{"compute_ms", r.compute_ms}, {"wait_comm_ms", r.wait_comm_ms}, {"optimizer_ms", r.optimizer_ms},
                    {"update_wait_ms", r.traffic.update_wait_ms}}},
          {"comm_bytes", r.comm_bytes},
          {"tp_comm_bytes", r.tp_comm_bytes},
          {"gathers", r.traffic.gathers},
          {"mesh", {{"dp", dp}, {"tp", mesh.tp}, {"pp", mesh.pp}}},
          {"pipeline", pp == 1 ? nlohmann::json(nullptr)
                               : nlohmann::json{{"schedule", cfg.parallel.pp_schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b"},
                                                {"micro_batches", cfg.train.grad_accum},
                                                {"micro_batches_held", runner->slots()}}},
          {"ranks", world.size()},
          {"mem",
           {{"device_peak_bytes", r.device_peak_bytes},
            {"host_rss_bytes", current_rss_bytes()},
            {"pinned_bytes", zmem.pinned_bytes},
            {"host_state_bytes", zmem.host_bytes},
            {"nvme_bytes", zmem.nvme_bytes}}},
          {"io",
           {{"read_bytes", r.traffic.nvme_read_bytes},
            {"write_bytes", r.traffic.nvme_write_bytes},
            {"read_gbps", rate(r.traffic.nvme_read_bytes, r.traffic.nvme_busy_ms)},
            {"write_gbps", rate(r.traffic.nvme_write_bytes, r.traffic.nvme_busy_ms)},
            {"busy_ms", r.traffic.nvme_busy_ms},
            {"wait_ms", r.traffic.nvme_wait_ms},
            {"read_ahead_bytes", r.traffic.read_ahead_bytes},
            {"forwarded_bytes", r.traffic.forwarded_bytes}}},
          {"links", {{"h2d_bytes", r.traffic.h2d_bytes}, {"d2h_bytes", r.traffic.d2h_bytes}}},
          {"cpu", cpu_json(r)},
      };
      if (writer) {
        const CheckpointStats cs = writer->last_stats();
        j["checkpoint"] = {{"stall_ms", r.checkpoint_stall_ms},
                           {"saved_step", r.checkpoint_saved},
                           {"last_step", cs.step},
                           {"last_bytes", cs.bytes},
                           {"last_write_ms", cs.write_ms},
                           {"last_write_gbps", cs.write_ms > 0 ? double(cs.bytes) / (cs.write_ms * 1e6) : 0.0},
                           {"last_commit_ms", cs.commit_ms}};
      }
      if (r.eval_loss >= 0) j["eval_loss"] = r.eval_loss;
      {
        WatchedWait w(str("write of metrics file '", cfg.log.metrics, "'"), WaitKind::io,
                      watchdog_context());
        metrics << j.dump() << '\n';
        metrics.flush();
      }
      if (!metrics)  // a record lost in silence would leave a gap nobody sees
        fail("train::metrics", str("cannot write step ", r.step, " to metrics file '",
                                   cfg.log.metrics, "'"),
             "check the free space and the file system of log.metrics; resume from the last "
             "checkpoint (--resume) to go on");
    }
    warn_steal(r);
    if (!opt.progress) return;
    std::string line = progress_line(r);
    if (isatty(STDERR_FILENO)) {
      std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), r.step == progress_end ? "\n" : "");
      std::fflush(stderr);
    } else if (logged) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

  // The step's CPU time: the cores this process kept busy (its CPU seconds per second of the
  // step) and the machine's time by kind as shares of all its CPUs' time (null off Linux).
  static nlohmann::json cpu_json(const StepRecord& r) {
    const CpuTimes& c = r.cpu;
    auto share = [&](double s) {
      const std::optional<double> v = c.share(s);
      return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
    };
    return {{"process_cores", c.process_cores(r.step_ms / 1000.0)},
            {"busy_share", share(c.busy_s)},
            {"idle_share", share(c.idle_s)},
            {"steal_share", share(c.steal_s)}};
  }

  static double steal_share(const StepRecord& r) { return r.cpu.share(r.cpu.steal_s).value_or(0.0); }

  // Once per run: a step in which a hypervisor took a tenth of the machine's CPU time or more.
  void warn_steal(const StepRecord& r) {
    constexpr double kWarnShare = 0.10;
    const double s = steal_share(r);
    if (steal_warned || s < kWarnShare) return;
    steal_warned = true;
    log_warn("train", "step ", r.step, ": the hypervisor took ", fixed(100 * s, 0),
             "% of this machine's CPU time (steal in /proc/stat: its virtual CPUs had work, the ",
             "host ran something else), so the step ran slower than these cores allow. On a VM ",
             "the host's own work, such as emulating the disk under offload.nvme_path, can run ",
             "on the cores this guest computes on: see docs/tuning.md, \"CPU time a VM's host ",
             "takes\"");
  }

  // step, loss, the latest eval loss, tokens/s, ETA, and this rank's state bytes per tier.
  std::string progress_line(const StepRecord& r) {
    if (r.eval_loss >= 0) {
      progress_eval_loss = r.eval_loss;
      progress_eval_step = r.step;
    }
    // ETA from the wall time since this run's first step ended (evaluations and saves included);
    // after the first step only, from that step's time.
    const auto now = Clock::now();
    double per_step_ms = r.step_ms;
    if (progress_first_step < 0) {
      progress_first_step = r.step;
      progress_t0 = now;
    } else {
      per_step_ms = ms_since(progress_t0) / double(r.step - progress_first_step);
    }
    const double eta_s = per_step_ms * double(std::max<int64_t>(0, progress_end - r.step)) / 1000.0;
    std::string line = str("step ", r.step, "/", progress_end, " | loss ", fixed(r.loss, 4));
    if (progress_eval_step >= 0)
      line += str(" | eval ", fixed(progress_eval_loss, 4), r.eval_loss >= 0 ? "" : str(" @", progress_eval_step));
    line += str(" | lr ", sci(r.lr), " | ", fixed(r.tokens_per_s, 0), " tok/s | ", fixed(r.step_ms, 0),
                " ms | ETA ", format_duration(eta_s));
    const ZeroMemory z = zero->memory();
    line += str(" | states dev ", format_bytes(z.shard_bytes + z.gathered_bytes));
    if (z.pinned_bytes) line += str(" pin ", format_bytes(z.pinned_bytes));
    if (z.host_bytes) line += str(" host ", format_bytes(z.host_bytes));
    if (z.nvme_bytes) line += str(" nvme ", format_bytes(z.nvme_bytes));
    if (steal_share(r) >= 0.05) line += str(" | steal ", fixed(100 * steal_share(r), 0), "%");
    return line;
  }

  double evaluate() {
    if (cfg.eval.batches <= 0)
      fail("eval::run", "eval.batches = 0: nothing to evaluate", "set eval.batches to 1 or more");
    if (!eval_src) {
      const std::string& path = cfg.eval.path.empty() ? cfg.data.path : cfg.eval.path;
      eval_src = open_tokens(path, cfg.model.vocab_size);
      eval_windows = std::make_unique<WindowSampler>(*eval_src, cfg.data.seq_len, false, cfg.train.seed);
    }
    const int B = cfg.data.micro_batch, T = cfg.data.seq_len;
    double total = 0;
    // Eval batch i reads windows i·B … i·B + B − 1; rank r takes batches r, r + dp, ... Every
    // gather is collective, so all ranks run the same number of forwards: a rank without a
    // batch in the last round runs batch 0 again and discards its loss.
    const int64_t batches = cfg.eval.batches;
    const int64_t rounds = (batches + dp - 1) / dp;  // 64-bit: no overflow near INT_MAX
    watchdog_set_phase("eval");
    bool cut_short = false;
    for (int64_t k = 0; k < rounds; ++k) {
      // A stop asked from outside ends an evaluation too (every rank at the same round).
      if (opt.stop_requested && !stopped_by && (stopped_by = any_rank_asks_to_stop()) > 0) {
        cut_short = true;
        break;
      }
      const int64_t i = k * dp + rank;
      const bool mine = i < batches;
      runner->reset_loss();
      if (pp > 1) {  // one micro-batch through the stages; the last one's loss
        auto load_eval = [&](int) { load(*eval_windows, uint64_t(mine ? i : 0) * B, 0); };
        post_receives(0, false);
        pipe_forward(0, load_eval, false);
      } else {
        load(*eval_windows, uint64_t(mine ? i : 0) * B, 0);
        forward_all_eval();
      }
      runner->copy_losses(*compute, loss_host.as<double>());
      compute->synchronize();
      if (mine && runner->loss_count() > 0) total += loss_host.as<double>()[0];
    }
    sync_links();
    double* h = loss_host.as<double>();
    h[0] = total;
    if (dp > 1) {
      dpc->all_reduce(*comm, h, 1, CommType::f64, ReduceOp::sum);
      comm->synchronize();
    }
    if (pp > 1) {
      ppc->all_reduce(*comm, h, 1, CommType::f64, ReduceOp::sum);
      comm->synchronize();
    }
    if (cut_short) return -1;
    last_eval_loss = h[0] / (double(cfg.eval.batches) * B * T);
    last_eval_step = steps_done;
    return last_eval_loss;
  }

  std::vector<float> whole_tensor(const std::string& name, bool grad, const char* where);

  void forward_all_eval() {
    forward_all();
    if (model->tied()) zero->release(0);
  }
};

Trainer::Trainer(const Config& config, Communicator& world, TrainerOptions options)
    : impl_(std::make_unique<Impl>(config, world, std::move(options))) {}

Trainer::~Trainer() = default;

int64_t Trainer::num_params() const { return impl_->model->num_params(); }

const Config& Trainer::config() const { return impl_->cfg; }

std::vector<std::string> Trainer::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& u : impl_->model->all_units())  // every stage's
    for (const auto& v : u.layout.views()) names.push_back(v.name);
  return names;
}

ZeroMemory Trainer::state_memory() const { return impl_->zero->memory(); }

TrainSummary Trainer::train() {
  Impl& m = *impl_;
  TrainSummary s;
  s.params = m.model->num_params();
  LrSchedule lr;
  lr.shape = m.cfg.train.schedule == Schedule::cosine ? LrShape::cosine : LrShape::constant;
  lr.lr = m.cfg.train.lr;
  lr.warmup_steps = m.cfg.train.warmup_steps;
  lr.total_steps = m.cfg.train.steps;
  lr.min_ratio = m.cfg.train.min_lr_ratio;
  auto t0 = Clock::now();
  double timed_ms = 0, timed_tokens = 0;
  const int64_t first = m.steps_done;  // > 0 when resumed
  const int64_t end = m.opt.stop_after > 0 ? std::min<int64_t>(m.opt.stop_after, m.cfg.train.steps)
                                           : m.cfg.train.steps;
  m.progress_end = end;
  m.progress_first_step = -1;
  while (m.steps_done < end) {
    const int64_t i = m.steps_done - first;
    m.trace_step_begin(m.steps_done + 1);
    StepRecord r = m.step(lr);
    m.trace_step_end(r.step);
    s.losses.push_back(r.loss);
    // Validation on the fixed eval windows: it reads only the compute copy, so training (and a
    // save reading master, m and v behind it) goes on exactly as without it.
    if (m.cfg.eval.every > 0 && (r.step % m.cfg.eval.every == 0 || r.step == end)) {
      r.eval_loss = m.evaluate();  // < 0: a stop asked during it cut it short
      if (r.eval_loss >= 0 && (s.best_eval_step < 0 || r.eval_loss < s.best_eval_loss)) {
        s.best_eval_loss = r.eval_loss;
        s.best_eval_step = r.step;
      }
      if (m.stopped_by && m.writer && r.checkpoint_saved != r.step) {
        auto tc = Clock::now();  // the step it followed is the run's last: saved as such
        m.save_checkpoint(r.step);
        r.checkpoint_stall_ms += ms_since(tc);
        r.checkpoint_saved = r.step;
      }
    }
    if (i > 0 || end - first == 1) {
      timed_ms += r.step_ms;
      timed_tokens += r.tokens_per_s * r.step_ms / 1000.0;
    }
    m.log_step(r);
    if (m.opt.on_step) m.opt.on_step(r);
    if (m.stopped_by) {
      s.stopped_by = m.stopped_by;
      break;
    }
  }
  m.zero->finish_step();  // the last step's overlapped update (its error, if any, is the run's)
  if (m.writer) m.writer->wait();  // every save is committed before the run reports
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  s.tokens_per_s = timed_ms > 0 ? timed_tokens / (timed_ms / 1000.0) : 0;
  if (m.opt.peak_flops > 0)
    s.mfu = s.tokens_per_s * m.model->train_flops_per_token(m.cfg.data.seq_len) /
            (m.opt.peak_flops * m.world.size());
  s.device_peak_bytes_here = m.device->memory().peak_bytes;
  s.device_peak_bytes = m.device_peak_over_ranks();
  // A stopped run ends as soon as its checkpoint is committed: no evaluation of its own.
  if (m.cfg.eval.batches > 0 && !s.stopped_by) {
    s.eval_loss = m.last_eval_step == m.steps_done ? m.last_eval_loss : m.evaluate();
    s.stopped_by = m.stopped_by;  // a stop in the final evaluation: no eval loss (every step ran)
  }
  if (s.eval_loss >= 0 && (s.best_eval_step < 0 || s.eval_loss < s.best_eval_loss)) {
    s.best_eval_loss = s.eval_loss;
    s.best_eval_step = m.steps_done;
  }
  s.host_peak_rss_bytes = peak_rss_bytes();
  s.last_step = m.steps_done;
  return s;
}

double Trainer::evaluate() { return impl_->evaluate(); }

CheckpointStats Trainer::checkpoint_stats() const {
  return impl_->writer ? impl_->writer->last_stats() : CheckpointStats{};
}

void Trainer::save(const std::string& dir, const std::string& dtype) {
  Impl& m = *impl_;
  if (m.pp == 1) {
    m.zero->save(dir, parse_dtype(dtype));
    return;
  }
  // One safetensors file per stage (Hugging Face's sharded layout), then, by world rank 0 once
  // every stage has written its file, the index naming the file of every tensor and config.json
  // last: a folder with a config.json holds every stage's weights (a save cut short, none).
  auto file_of = [&](int s) {
    char b[64];
    std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", s + 1, m.pp);
    return std::string(b);
  };
  const DType out_dtype = parse_dtype(dtype);
  m.zero->save(dir, out_dtype, file_of(m.stage), /*config=*/false);  // creates dir
  Stream& hs = m.host_stream ? *m.host_stream : *m.comm;
  m.world.barrier(hs);  // every stage's file is in place
  hs.synchronize();
  if (m.world.rank() == 0) {
    nlohmann::json map = nlohmann::json::object();
    const auto& all = m.model->all_units();
    for (int s = 0; s < m.pp; ++s)
      for (int u = m.stages[size_t(s)].begin; u < m.stages[size_t(s)].end; ++u)
        for (const auto& v : all[size_t(u)].layout.views()) map[v.name] = file_of(s);
    const std::string text = nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", map}}.dump(2);
    fileutil::AtomicFile f(dir + "/model.safetensors.index.json", "train::save");
    f.write(text.data(), text.size());
    f.commit();
    write_hf_config(dir, m.model->config(), out_dtype);
  }
  m.world.barrier(hs);  // when save returns on any rank, every file is in place
  hs.synchronize();
}

namespace {
// The unit holding parameter `name` (global index) and its view there; Error naming `where`
// when absent.
std::pair<int, const ParamView*> locate(const LlamaModel& model, const std::string& name,
                                        const char* where) {
  const auto& all = model.all_units();
  for (int u = 0; u < int(all.size()); ++u)
    if (const ParamView* v = all[size_t(u)].layout.find(name)) return {u, v};
  fail(where, str("no parameter named '", name, "'"));
}

// The whole tensor of view v of unit u from the unit's gathered values on this rank (every rank
// calls it: collective over the tp group).
std::vector<float> whole(Communicator* tp, Device& device, Stream& stream, const LlamaModel& model,
                         int u, const ParamView& v, const std::vector<float>& unit) {
  const auto& views = model.unit(u).layout.views();
  const size_t i = size_t(&v - views.data());
  return std::move(assemble_unit(tp, device, stream, model, u, unit)[i]);
}
}  // namespace

// The whole tensor `name` on every rank: its stage assembles it (collective over that stage's
// dp and tp groups) and, with pipeline stages, broadcasts it over the pp group.
std::vector<float> Trainer::Impl::whole_tensor(const std::string& name, bool grad, const char* where) {
  const auto [g, v] = locate(*model, name, where);
  const int owner = [&, g = g] {  // a structured binding is captured by name (clang < 16)
    for (int s = 0; s < pp; ++s)
      if (stages[size_t(s)].contains(g)) return s;
    return 0;
  }();
  std::vector<float> out(v->global_numel());
  if (owner == stage) {
    const int u = g - stages[size_t(stage)].begin;
    const ParamView& mine = *model->unit(u).layout.find(name);
    out = whole(tpc, *device, *comm, *model, u, mine,
                grad ? zero->gather_grad_to_host(u) : zero->gather_unit_to_host(u));
  }
  if (pp > 1) {
    Stream& hs = host_stream ? *host_stream : *comm;
    mesh.pp_comm->broadcast(hs, out.data(), out.size(), CommType::f32, owner);
    hs.synchronize();
  }
  return out;
}

std::vector<float> Trainer::parameter(const std::string& name) {
  return impl_->whole_tensor(name, false, "train::parameter");
}

std::vector<float> Trainer::gradient(const std::string& name) {
  return impl_->whole_tensor(name, true, "train::gradient");
}

void Trainer::set_parameter(const std::string& name, const std::vector<float>& values) {
  auto [g, gv] = locate(*impl_->model, name, "train::set_parameter");
  if (values.size() != gv->global_numel())
    fail("train::set_parameter",
         str("'", name, "' has ", gv->global_numel(), " elements, got ", values.size()));
  const StageUnits& here = impl_->stages[size_t(impl_->stage)];
  if (!here.contains(g)) return;  // another stage's tensor
  const int u = g - here.begin;
  const ParamView* v = impl_->model->unit(u).layout.find(name);
  // This rank's slice of the whole tensor, in the slice's row-major order.
  std::vector<float> mine(v->numel);
  for (size_t i = 0; i < v->numel; ++i) mine[i] = values[v->global_index(i)];
  impl_->zero->set_values(u, v->offset, mine);
}

double Trainer::forward_logits(const int32_t* inputs, const int32_t* targets,
                               std::vector<float>* logits) {
  Impl& m = *impl_;
  if (m.pp > 1)
    fail("train::forward_logits", "the logits of a pipeline run are on its last stage only",
         "run forward_logits with parallel.pp = 1");
  const size_t n = size_t(m.cfg.data.micro_batch) * m.cfg.data.seq_len;
  m.runner->reset_loss();
  m.load(0, [&](int32_t* in, int32_t* tgt) {
    std::copy(inputs, inputs + n, in);
    std::copy(targets, targets + n, tgt);
  });
  m.forward_all_eval();
  if (logits) {
    logits->resize(n * size_t(m.cfg.model.vocab_size));
    m.runner->copy_logits(*m.compute, logits->data());
  }
  m.runner->copy_losses(*m.compute, m.loss_host.as<double>());
  m.compute->synchronize();
  return m.loss_host.as<double>()[0] / double(n);
}

}  // namespace strata
