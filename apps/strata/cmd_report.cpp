// apps/strata/cmd_report.cpp — `strata report METRICS.jsonl [MORE.jsonl...] --out report.svg
// [--csv table.csv] [--label NAME]... [--title TEXT]`: curves of one or more training runs from
// their metrics JSONL (report/metrics_report.h), in one SVG, and optionally the table as CSV.
// Lines that are not metrics are skipped and counted (a note on stderr); nothing is written
// unless every file has a usable line and both destinations can be written.
#include <cstdio>
#include <filesystem>

#include "apps/strata/commands.h"
#include "core/error.h"
#include "engine/file_util.h"
#include "report/metrics_report.h"

namespace strata::app {

void register_report(CLI::App& app) {
  struct Args {
    std::vector<std::string> files;
    std::vector<std::string> labels;
    std::string out, csv, title;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "report", "curves from metrics JSONL: loss and eval loss, tokens/s, step time split, bytes per tier");
  cmd->add_option("files", args->files, "metrics JSONL files (written by --set log.metrics=FILE)")->required();
  cmd->add_option("--out,-o", args->out, "the SVG to write")->required();
  cmd->add_option("--csv", args->csv, "also write the table: one row per run x step");
  cmd->add_option("--label", args->labels, "a run's name in the legend and CSV, once per file in order (default: the file stem)")
      ->allow_extra_args(false);
  cmd->add_option("--title", args->title, "the chart's title (default: strata report)");
  cmd->callback([args] {
    if (!args->labels.empty() && args->labels.size() != args->files.size())
      fail("report::args", str(args->labels.size(), " --label for ", args->files.size(), " file(s)"),
           "give one --label per file, in the order of the files, or none");
    report::check_output(args->out, "--out");
    if (!args->csv.empty()) report::check_output(args->csv, "--csv");
    std::error_code ec;
    namespace fs = std::filesystem;
    if (!args->csv.empty() &&
        fs::weakly_canonical(args->out, ec) == fs::weakly_canonical(args->csv, ec))
      fail("report::args",
           str("--csv '", args->csv, "' is --out '", args->out, "': the table would replace the "
               "chart"),
           "give --csv another path");
    for (const std::string& in : args->files) {
      fileutil::check_not_an_input(args->out, "--out", in, "the metrics file", "report::args");
      fileutil::check_not_an_input(args->csv, "--csv", in, "the metrics file", "report::args");
    }
    std::vector<std::string> names = args->labels.empty() ? report::run_names(args->files) : args->labels;
    std::vector<report::MetricsRun> runs;
    for (size_t i = 0; i < args->files.size(); ++i) runs.push_back(report::read_metrics(args->files[i], names[i]));
    for (const auto& r : runs)
      if (r.skipped > 0)
        std::fprintf(stderr, "strata: note: %s: %lld of %lld line(s) skipped (not a JSON object with a numeric \"step\")\n",
                     r.path.c_str(), (long long)r.skipped, (long long)r.lines);
    report::write_output(args->out, report::report_svg(runs, args->title), "--out");
    if (!args->csv.empty()) report::write_output(args->csv, report::report_csv(runs), "--csv");
    size_t points = 0;
    for (const auto& r : runs) points += r.points.size();
    std::printf("wrote %s%s%s: %zu run(s), %zu step(s)\n", args->out.c_str(), args->csv.empty() ? "" : " and ",
                args->csv.c_str(), runs.size(), points);
  });
}

}  // namespace strata::app
