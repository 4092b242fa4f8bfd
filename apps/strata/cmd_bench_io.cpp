// apps/strata/cmd_bench_io.cpp — `strata bench io`: the NVMe tier's write and read rates through
// FileIO, data checked; `--sweep` over block sizes and queue depths with a recommendation.
// With --json, one JSON object on stdout. Blocks read back wrong make the command fail.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/strata/commands.h"
#include "bench/io_bench.h"
#include "core/error.h"
#include "core/size.h"
#include "core/trace.h"
#include "engine/config.h"

namespace strata::app {
namespace {

struct BenchIoArgs {
  std::vector<std::string> dirs;
  std::string size, block = "1M", stripe;  // stripe: empty = the larger of 1M and the block
  int qd = 32;
  int submit_batch = kDefaultSubmitBatch;
  std::string backend = "auto";
  bool json = false, sweep = false, no_huge_pages = false, no_register = false;
  std::string pages = "auto", pattern = "sequential";
  double seconds = 2.0;
  std::string trace;
};

void run(const BenchIoArgs& a) {
  if (!a.trace.empty()) trace_enable(true);
  IoBenchOptions o;
  o.dirs = a.dirs;
  o.block_bytes = parse_bytes(a.block, "--block");
  o.stripe_bytes = a.stripe.empty() ? std::max<uint64_t>(1ull << 20, o.block_bytes)
                                    : parse_bytes(a.stripe, "--stripe");
  o.queue_depth = a.qd;
  o.submit_batch = a.submit_batch;
  o.backend = a.backend;
  o.pages = a.no_huge_pages ? "none" : a.pages;
  o.register_buffers = !a.no_register;
  o.update = a.pattern == "update";
  o.overwrite = a.pattern == "overwrite";
  // The engine's rules for these settings (engine/config.cpp's validate): the block a multiple
  // of 4096, the stripe of the block (the sweep varies the block), each folder once.
  Config rules;
  rules.offload.nvme_path = o.dirs;
  if (!a.sweep) rules.io.block_size = o.block_bytes;
  if (!a.sweep) rules.io.stripe_size = o.stripe_bytes;
  rules.io.queue_depth = a.qd;
  rules.io.submit_batch = a.submit_batch;
  rules.io.backend = a.backend;
  try {
    validate(rules);
  } catch (const Error& e) {
    std::vector<std::string> hints = e.hints();
    hints.push_back("here io.block_size is --block, io.stripe_size --stripe, io.queue_depth --qd, "
                    "io.submit_batch --submit-batch, offload.nvme_path --dir");
    throw Error(e.where(), e.what_failed(), hints);
  }
  nlohmann::json result;
  if (a.sweep && a.pattern != "sequential")
    fail("bench::io", "--sweep runs the sequential pattern only",
         str("drop --pattern ", a.pattern, " or --sweep"));
  if (a.sweep) {
    IoSweepOptions s;
    s.base = o;
    s.base.size_bytes = parse_bytes(a.size.empty() ? "1G" : a.size, "--size");
    s.seconds_per_phase = a.seconds;
    result = run_io_sweep(s);
  } else {
    o.size_bytes = parse_bytes(a.size.empty() ? "4G" : a.size, "--size");
    result = run_io_bench(o);
  }
  if (!a.trace.empty()) trace_write(a.trace);
  if (a.json)
    std::printf("%s\n", result.dump().c_str());
  else
    std::printf("%s", format_io_bench(result).c_str());
  std::fflush(stdout);
  uint64_t wrong = result["wrong"].get<uint64_t>();
  if (wrong)
    fail("bench::io", str(wrong, " sectors of 4K read back differ from what was written"),
         "the device or file system returned wrong data: check `dmesg`");
}

}  // namespace

void register_bench_io(CLI::App& bench) {
  auto args = std::make_shared<BenchIoArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "io", "NVMe tier: sequential write then read through FileIO (O_DIRECT), data checked");
  cmd->add_option("--dir", args->dirs, "directory for the files (repeat: one per NVMe device)")
      ->required();
  cmd->add_option("--size", args->size, "bytes written then read (default 4G; sweep: 1G per point)");
  cmd->add_option("--block", args->block, "bytes per request (io.block_size)")
      ->capture_default_str();
  cmd->add_option("--qd", args->qd, "requests in flight (io.queue_depth)")->capture_default_str();
  cmd->add_option("--submit-batch", args->submit_batch,
                  "io_uring: requests per system call (io.submit_batch)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--backend", args->backend, "auto | uring | posix (io.backend)")
      ->check(CLI::IsMember({"auto", "uring", "posix"}))
      ->capture_default_str();
  cmd->add_option("--stripe", args->stripe,
                  "stripe size across --dir directories (io.stripe_size; default the larger of 1M "
                  "and --block)");
  cmd->add_option("--pattern", args->pattern,
                  "sequential (write, then read), update (write, then read each block and "
                  "write it back in place, then read: the optimizer's traffic over its states) or "
                  "overwrite (an untimed write first, then sequential: blocks written before, as "
                  "the engine's swap after its first step)")
      ->check(CLI::IsMember({"sequential", "update", "overwrite"}))
      ->capture_default_str();
  cmd->add_flag("--sweep", args->sweep, "sweep block sizes 128K..8M and depths 1..64");
  cmd->add_option("--seconds", args->seconds, "sweep: time cap per phase and point")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  cmd->add_option("--pages", args->pages,
                  "staging pages: auto (explicit huge pages when reserved, else transparent huge "
                  "pages, else 4K), thp, none")
      ->check(CLI::IsMember({"auto", "thp", "none"}))
      ->capture_default_str();
  cmd->add_flag("--no-huge-pages", args->no_huge_pages, "staging buffers on 4K pages (--pages none)");
  cmd->add_flag("--no-register", args->no_register,
                "do not register the staging buffers with io_uring (files stay registered)");
  cmd->add_flag("--json", args->json, "print one JSON object");
  cmd->add_option("--trace", args->trace, "write a Chrome-trace timeline of the I/O queue here");
  cmd->callback([args] { run(*args); });
}

}  // namespace strata::app
