// report/metrics_report.h — `strata report`: reads the metrics JSONL that training writes
// (log.metrics; one object per logged step, engine/trainer.cpp) and renders, for one or more
// runs overlaid, an SVG of curves against step — loss with eval loss, tokens/s, the step time
// split (compute, waiting on communication, optimizer, waiting on NVMe), bytes per tier — and a
// CSV with one row per run × step. It reads only the keys it draws; a line may lack any of them
// but "step". It does not smooth, thin or align runs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "report/chart.h"

namespace strata::report {

// One logged step. A key absent from the line (or null, as NaN is written) is nullopt.
struct MetricsPoint {
  int64_t step = 0;
  std::optional<double> loss, eval_loss, tokens_per_s, step_ms;
  std::optional<double> compute_ms;    // time.compute_ms: forward + backward, waits included
  std::optional<double> comm_ms;       // time.wait_comm_ms: of compute, blocked on communication
  std::optional<double> optimizer_ms;  // time.optimizer_ms
  std::optional<double> io_wait_ms;    // io.wait_ms: the engine's thread waited for NVMe
  std::optional<uint64_t> device_peak_bytes, pinned_bytes, host_state_bytes, nvme_bytes;  // mem.*
  std::optional<double> process_cores;  // cpu.process_cores: this process's CPU s per step s
  std::optional<double> steal_share;    // cpu.steal_share: the machine's CPU time a hypervisor took
};

struct MetricsRun {
  std::string name;  // legend and CSV `run`
  std::string path;  // names the file in messages
  std::vector<MetricsPoint> points;  // ascending step, one per step
  int64_t lines = 0;    // non-blank lines read
  int64_t skipped = 0;  // of them: not a JSON object, or without a numeric integral "step"
  int64_t merged = 0;   // of them: a step seen before (a resumed run's repeat, a separate eval
                        // line); its keys replace the earlier line's, key by key
};

// Parses JSONL text. Error "[report::read]" naming `path` when no line is usable.
MetricsRun parse_metrics(std::string_view text, std::string name, std::string path);
// Reads and parses a file (a pipe works too). Error when it cannot be read or has no usable line.
MetricsRun read_metrics(const std::string& path, std::string name);

// Run names for files: the file stem ("runs/a.jsonl" → "a"); where stems collide, the path as
// given without its extension ("x/metrics", "y/metrics"); a repeat of that gets " #2", " #3".
std::vector<std::string> run_names(const std::vector<std::string>& paths);

// The CSV table: a header, then one row per run × step with run, step, loss, eval_loss,
// tokens_per_s, step_ms, compute_ms, comm_ms, optimizer_ms, io_wait_ms, device_peak_bytes,
// pinned_bytes, host_state_bytes, nvme_bytes, process_cores, steal_share. Empty cells for
// missing values; numbers in their shortest exact decimal form; a run name with a comma, quote
// or newline is quoted (RFC 4180).
std::string report_csv(const std::vector<MetricsRun>& runs);

// The figure: ten panels in two columns, one colour per run (legend on top). Polyline tooltips
// read "RUN: SERIES" with SERIES one of: loss, eval loss, tokens/s, compute ms, optimizer ms,
// comm wait ms, NVMe wait ms, device peak, pinned, host state, NVMe. The loss axis is
// logarithmic when every loss is positive and the largest is 10× the smallest or more.
chart::Figure report_figure(const std::vector<MetricsRun>& runs, std::string title = {});
std::string report_svg(const std::vector<MetricsRun>& runs, std::string title = {});

// Writes `text` to `path` whole or not at all (PATH.tmp, fsync, rename). Error when the folder
// of `path` does not exist; `option` names the command-line option in the message ("--out").
void write_output(const std::string& path, std::string_view text, std::string_view option);
// The checks of write_output alone, so that a command writing several files can refuse before
// it writes any.
void check_output(const std::string& path, std::string_view option);

}  // namespace strata::report
