// apps/strata/cmd_checkpoint.cpp — `strata checkpoint inspect DIR [--json]` (what a checkpoint
// holds, with every file's checksum verified) and `strata checkpoint export DIR --out HF_DIR`
// (its weights as Hugging Face safetensors, without a training run).
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "apps/strata/commands.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/size.h"
#include "engine/checkpoint.h"
#include "engine/config.h"

namespace strata::app {
namespace {

struct InspectArgs {
  std::string dir;
  bool json = false;
};

struct ExportArgs {
  std::string dir, out;
  std::string out_dtype = "f32";
};

void run_inspect(const InspectArgs& a) {
  const std::string dir = resolve_checkpoint(a.dir);
  const CheckpointManifest m = read_manifest(dir);
  uint64_t total = 0, params = 0;
  for (const auto& f : m.files) total += f.bytes;
  for (const auto& t : m.tensors) params += t.numel();
  // Every file's size and hash, each checked even when an earlier one failed.
  nlohmann::json files = nlohmann::json::array();
  std::string failures;
  for (const auto& f : m.files) {
    const std::string path = (std::filesystem::path(dir) / f.name).string();
    std::string status = "ok";
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(path, ec);
    if (ec) {
      status = str("unreadable: ", ec.message());
    } else if (size != f.bytes) {
      status = str("size ", size, " bytes, the manifest says ", f.bytes);
    } else {
      const uint64_t h = checkpoint_file_hash(path);
      if (h != f.xxh64) status = str("damaged: xxHash64 ", hash_hex(h), ", the manifest recorded ", hash_hex(f.xxh64));
    }
    if (status != "ok") failures += str("\n  ", path, ": ", status);
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", hash_hex(f.xxh64)}, {"status", status}});
  }
  const std::string state(dtype_name(m.optimizer_state_dtype));
  if (a.json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& t : m.tensors) tensors.push_back({{"name", t.name}, {"shape", t.shape}});
    nlohmann::json j = {{"path", dir},
                        {"step", m.step},
                        {"strata_version", m.strata_version},
                        {"format_version", m.version},
                        {"precision", m.precision},
                        {"state_dtypes", {{"master", "f32"}, {"m", state}, {"v", state}}},
                        {"mesh", {{"world", m.world}, {"dp", m.dp}, {"tp", m.tp}, {"pp", m.pp}}},
                        {"windows_consumed", m.windows_consumed},
                        {"tensors", tensors},
                        {"parameters", params},
                        {"bytes", total},
                        {"files", files},
                        {"verified", failures.empty()}};
    std::printf("%s\n", j.dump(1).c_str());
  } else {
    std::printf("checkpoint %s\n", dir.c_str());
    std::printf("  step %lld (data windows consumed %llu), written by strata %s\n", (long long)m.step,
                (unsigned long long)m.windows_consumed, m.strata_version.c_str());
    std::printf("  mesh: %d rank(s) = dp %d x tp %d x pp %d; precision %s\n", m.world, m.dp, m.tp, m.pp,
                m.precision.c_str());
    std::printf("  %zu tensors, %llu parameters; master in f32, m and v in %s (format version %d)\n",
                m.tensors.size(), (unsigned long long)params, state.c_str(), m.version);
    std::printf("  %zu file(s), %s:\n", m.files.size(), format_bytes(total).c_str());
    for (const auto& f : files)
      std::printf("    %-16s %12s  xxh64 %s  %s\n", f["name"].get<std::string>().c_str(),
                  format_bytes(f["bytes"].get<uint64_t>()).c_str(), f["xxh64"].get<std::string>().c_str(),
                  f["status"].get<std::string>().c_str());
    std::printf("  checksums: %s\n", failures.empty() ? "every file verified" : "FAILED");
  }
  if (!failures.empty())
    fail("checkpoint::inspect", str("the checkpoint in '", dir, "' is damaged:", failures),
         "resume from an earlier step_N folder; this one would not load");
}

void run_export(const ExportArgs& a) {
  const DType dtype = parse_dtype(a.out_dtype);
  check_not_a_checkpoint_folder(a.out, "--out", "checkpoint::export");
  const std::string dir = resolve_checkpoint(a.dir);
  const CheckpointManifest m = read_manifest(dir);
  const Config cfg = parse_config(m.config_toml, dir + "/manifest.json (config_toml)", {});
  export_checkpoint(dir, m, cfg.model, a.out, dtype);
  std::printf("exported step %lld of %s to %s (%s)\n", (long long)m.step, dir.c_str(), a.out.c_str(),
              a.out_dtype.c_str());
}

}  // namespace

void register_checkpoint(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("checkpoint", "inspect or export a checkpoint (checkpoint.dir)");
  cmd->require_subcommand(1);
  auto ia = std::make_shared<InspectArgs>();
  CLI::App* inspect = cmd->add_subcommand(
      "inspect", "step, mesh, precision, tensors, files and bytes, with every checksum verified");
  inspect->add_option("dir", ia->dir, "a checkpoint.dir root (its newest complete checkpoint) or a step_N folder")
      ->required();
  inspect->add_flag("--json", ia->json, "print JSON");
  inspect->callback([ia] { run_inspect(*ia); });
  auto ea = std::make_shared<ExportArgs>();
  CLI::App* exp = cmd->add_subcommand("export", "write the weights as Hugging Face safetensors + config.json");
  exp->add_option("dir", ea->dir, "a checkpoint.dir root or a step_N folder")->required();
  exp->add_option("--out,-o", ea->out, "output folder")->required();
  exp->add_option("--out-dtype", ea->out_dtype, "f32, bf16 or f16");
  exp->callback([ea] { run_export(*ea); });
}

}  // namespace strata::app
