// tests/fuzz/fuzz_metrics_jsonl.cpp — fuzz target: the metrics JSONL that `strata report` reads
// (parse_metrics), then the CSV and the SVG it renders from an accepted run.
//
// Input: the JSONL text (engine/trainer.cpp writes one JSON object per logged step). Each
// non-blank line is also parsed alone: its point must hold that line's own numbers (step, every
// key report/metrics_report.h reads; mem.* bytes exact, or a float to the nearest integer). The
// run of the whole text must be those points merged in order: one per step, ascending, a later
// line's keys replacing an earlier one's; every non-blank line counted once, as a point, skipped
// or merged; refused only when no line is usable. Its CSV has a header and one row per point, and
// its SVG is well-formed.
#include <cmath>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "report/metrics_report.h"
#include "tests/fuzz/fuzz_targets.h"
#include "tests/report/svg_check.h"

namespace strata::fuzz {
namespace {

using report::MetricsPoint;
using report::MetricsRun;
using Json = nlohmann::json;

// A key of the line (b: nested in a) and the member of MetricsPoint it fills.
template <class T>
struct Field {
  const char* a;
  const char* b;
  std::optional<T> MetricsPoint::*member;
};
const Field<double> kNumbers[] = {
    {"loss", nullptr, &MetricsPoint::loss},
    {"eval_loss", nullptr, &MetricsPoint::eval_loss},
    {"tokens_per_s", nullptr, &MetricsPoint::tokens_per_s},
    {"step_ms", nullptr, &MetricsPoint::step_ms},
    {"time", "compute_ms", &MetricsPoint::compute_ms},
    {"time", "wait_comm_ms", &MetricsPoint::comm_ms},
    {"time", "optimizer_ms", &MetricsPoint::optimizer_ms},
    {"io", "wait_ms", &MetricsPoint::io_wait_ms},
    {"cpu", "process_cores", &MetricsPoint::process_cores},
    {"cpu", "steal_share", &MetricsPoint::steal_share},
};
const Field<uint64_t> kBytes[] = {
    {"mem", "device_peak_bytes", &MetricsPoint::device_peak_bytes},
    {"mem", "pinned_bytes", &MetricsPoint::pinned_bytes},
    {"mem", "host_state_bytes", &MetricsPoint::host_state_bytes},
    {"mem", "nvme_bytes", &MetricsPoint::nvme_bytes},
};

// The line's number at a (or a.b), or nullptr where it is absent or not a number.
const Json* number_at(const Json& line, const char* a, const char* b) {
  const Json* j = &line;
  for (const char* key : {a, b}) {
    if (!key) break;
    if (!j->is_object() || !j->contains(key)) return nullptr;
    j = &(*j)[key];
  }
  return j->is_number() ? j : nullptr;
}

// Whether a point's bytes are the line's number v: exact for an integer, the nearest integer for
// a float. Negative and out-of-range numbers are not checked.
bool same_bytes(const std::optional<uint64_t>& got, const Json& v) {
  if (v.is_number_unsigned()) return got == v.get<uint64_t>();
  if (v.is_number_integer()) return v.get<int64_t>() < 0 || got == uint64_t(v.get<int64_t>());
  const double d = v.get<double>();
  if (!(d >= 0 && d < 0x1p64)) return true;
  return got && std::fabs(double(*got) - d) <= 0.5;
}

// Checks that the point parsed from `line` alone holds its numbers.
void check_point(const MetricsPoint& p, const Json& line) {
  const Json* step = number_at(line, "step", nullptr);
  if (!step) broken("a line without a numeric step gave a point");
  if (step->is_number_float() ? double(p.step) != step->get<double>()
                              : step->dump() != std::to_string(p.step))
    broken(str("a line with step ", step->dump(), " gave the point of step ", p.step));
  for (const Field<double>& f : kNumbers) {
    const Json* v = number_at(line, f.a, f.b);
    const std::optional<double>& got = p.*f.member;
    if (v ? got != v->get<double>() : got.has_value())
      broken(str("a line with ", f.a, f.b ? "." : "", f.b ? f.b : "", " = ",
                 v ? v->dump() : "(none)", " gave ", got ? str(*got) : "nullopt"));
  }
  for (const Field<uint64_t>& f : kBytes) {
    const Json* v = number_at(line, f.a, f.b);
    const std::optional<uint64_t>& got = p.*f.member;
    if (v ? !same_bytes(got, *v) : got.has_value())
      broken(str("a line with ", f.a, ".", f.b, " = ", v ? v->dump() : "(none)", " gave ",
                 got ? str(*got) : "nullopt"));
  }
}

// A later line's keys replace an earlier one's, key by key.
void merge(MetricsPoint& into, const MetricsPoint& from) {
  for (const Field<double>& f : kNumbers)
    if (from.*f.member) into.*f.member = from.*f.member;
  for (const Field<uint64_t>& f : kBytes)
    if (from.*f.member) into.*f.member = from.*f.member;
}

bool same_values(const MetricsPoint& a, const MetricsPoint& b) {
  for (const Field<double>& f : kNumbers)
    if (a.*f.member != b.*f.member) return false;
  for (const Field<uint64_t>& f : kBytes)
    if (a.*f.member != b.*f.member) return false;
  return true;
}

}  // namespace

void metrics_jsonl(Bytes input) {
  const std::string_view text = as_text(input);
  std::map<int64_t, MetricsPoint> want;  // the lines parsed alone, merged in order
  int64_t lines = 0, skipped = 0, merged = 0;
  for (std::string_view line : split(text, "\n")) {
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // blank
    ++lines;
    MetricsRun alone;
    try {
      alone = report::parse_metrics(line, "line", "line.jsonl");
    } catch (const Error&) {
      ++skipped;
      continue;
    }
    if (alone.points.size() != 1 || alone.lines != 1 || alone.skipped != 0 || alone.merged != 0)
      broken(str("one line gave ", alone.points.size(), " points of ", alone.lines, " lines"));
    const MetricsPoint& p = alone.points[0];
    check_point(p, Json::parse(line.begin(), line.end()));
    auto [at, fresh] = want.try_emplace(p.step, p);
    if (!fresh) {
      merge(at->second, p);
      ++merged;
    }
  }

  if (want.empty()) {
    (void)report::parse_metrics(text, "fuzz", "fuzz.jsonl");  // must be refused
    broken("a text without a usable line is accepted");
  }
  MetricsRun run;
  try {
    run = report::parse_metrics(text, "fuzz", "fuzz.jsonl");
  } catch (const Error& e) {
    broken(str("a text with a usable line is refused: ", e.what()));
  }
  if (run.name != "fuzz" || run.path != "fuzz.jsonl") broken("the run's name or path changed");
  if (run.lines != lines || run.skipped != skipped || run.merged != merged)
    broken(str("the run counts ", run.lines, " lines, ", run.skipped, " skipped, ", run.merged,
               " merged; its lines alone: ", lines, ", ", skipped, ", ", merged));
  if (run.points.size() != want.size()) broken("the run has another number of steps");
  auto w = want.begin();
  for (const MetricsPoint& p : run.points) {
    if (p.step != w->first || !same_values(p, w->second))
      broken(str("step ", p.step, " differs from its lines parsed alone and merged"));
    ++w;
  }

  const std::string csv = report::report_csv({run});
  size_t rows = 0;
  for (char c : csv) rows += c == '\n';
  if (!csv.starts_with("run,step,") || rows != run.points.size() + 1)
    broken(str("the CSV has ", rows, " lines for ", run.points.size(), " points"));
  const std::string svg = report::report_svg({run});
  if (const std::string problem = test::svg_problem(svg); !problem.empty())
    broken(str("the SVG is not well-formed: ", problem));
}

}  // namespace strata::fuzz
