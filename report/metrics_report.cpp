// report/metrics_report.cpp — metrics JSONL → runs → CSV and the figure of report/chart.h.
#include "report/metrics_report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/file_util.h"

namespace strata::report {
namespace fs = std::filesystem;
namespace {

using Json = nlohmann::json;

// obj[a][b]... as a pointer, or nullptr where a key is missing or a level is not an object.
const Json* find(const Json& obj, std::initializer_list<const char*> keys) {
  const Json* j = &obj;
  for (const char* k : keys) {
    if (!j->is_object()) return nullptr;
    auto it = j->find(k);
    if (it == j->end()) return nullptr;
    j = &*it;
  }
  return j;
}

std::optional<double> number(const Json& obj, std::initializer_list<const char*> keys) {
  const Json* j = find(obj, keys);
  if (!j || !j->is_number()) return std::nullopt;
  return j->get<double>();
}

std::optional<uint64_t> bytes(const Json& obj, std::initializer_list<const char*> keys) {
  const Json* j = find(obj, keys);
  if (!j || !j->is_number()) return std::nullopt;
  if (j->is_number_unsigned()) return j->get<uint64_t>();
  if (j->is_number_integer()) {
    const int64_t v = j->get<int64_t>();
    return v >= 0 ? std::optional<uint64_t>(uint64_t(v)) : std::nullopt;
  }
  const double v = j->get<double>();
  if (!(v >= 0 && v < 0x1p64)) return std::nullopt;
  return uint64_t(std::round(v));  // not llround: a long long holds only v < 2^63
}

// The integral step of a line, or nullopt.
std::optional<int64_t> step_of(const Json& j) {
  const Json* s = find(j, {"step"});
  if (!s || !s->is_number()) return std::nullopt;
  if (s->is_number_unsigned()) {
    const uint64_t v = s->get<uint64_t>();
    return v <= uint64_t(std::numeric_limits<int64_t>::max()) ? std::optional<int64_t>(int64_t(v)) : std::nullopt;
  }
  if (s->is_number_integer()) return s->get<int64_t>();
  const double v = s->get<double>();
  if (!(std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 0x1p62)) return std::nullopt;
  return int64_t(v);
}

template <class T>
void take(std::optional<T>& into, const std::optional<T>& from) {
  if (from) into = from;
}

void merge(MetricsPoint& into, const MetricsPoint& from) {
  take(into.loss, from.loss);
  take(into.eval_loss, from.eval_loss);
  take(into.tokens_per_s, from.tokens_per_s);
  take(into.step_ms, from.step_ms);
  take(into.compute_ms, from.compute_ms);
  take(into.comm_ms, from.comm_ms);
  take(into.optimizer_ms, from.optimizer_ms);
  take(into.io_wait_ms, from.io_wait_ms);
  take(into.device_peak_bytes, from.device_peak_bytes);
  take(into.pinned_bytes, from.pinned_bytes);
  take(into.host_state_bytes, from.host_state_bytes);
  take(into.nvme_bytes, from.nvme_bytes);
  take(into.process_cores, from.process_cores);
  take(into.steal_share, from.steal_share);
}

bool blank(std::string_view line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

std::string number_text(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ec == std::errc() ? end : buf);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// One curve per run of a panel: what it draws and what its tooltip calls it.
struct Curve {
  const char* name;
  std::function<std::optional<double>(const MetricsPoint&)> value;
};

std::optional<double> as_double(const std::optional<uint64_t>& v) {
  return v ? std::optional<double>(double(*v)) : std::nullopt;
}

chart::Series series_of(const MetricsRun& run, const Curve& c, const char* color) {
  chart::Series s;
  s.name = run.name + ": " + c.name;
  s.color = color;
  for (const MetricsPoint& p : run.points)
    if (auto v = c.value(p)) {
      s.x.push_back(double(p.step));
      s.y.push_back(*v);
    }
  s.markers = s.x.size() <= 30;  // sparse runs show where each logged step is
  s.marker_radius = 2.5;
  return s;
}

}  // namespace

MetricsRun parse_metrics(std::string_view text, std::string name, std::string path) {
  MetricsRun run;
  run.name = std::move(name);
  run.path = std::move(path);
  std::map<int64_t, MetricsPoint> by_step;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (blank(line)) continue;
    ++run.lines;
    Json j = Json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    std::optional<int64_t> step = j.is_object() ? step_of(j) : std::nullopt;
    if (!step) {
      ++run.skipped;
      continue;
    }
    MetricsPoint p;
    p.step = *step;
    p.loss = number(j, {"loss"});
    p.eval_loss = number(j, {"eval_loss"});
    p.tokens_per_s = number(j, {"tokens_per_s"});
    p.step_ms = number(j, {"step_ms"});
    p.compute_ms = number(j, {"time", "compute_ms"});
    p.comm_ms = number(j, {"time", "wait_comm_ms"});
    p.optimizer_ms = number(j, {"time", "optimizer_ms"});
    p.io_wait_ms = number(j, {"io", "wait_ms"});
    p.device_peak_bytes = bytes(j, {"mem", "device_peak_bytes"});
    p.pinned_bytes = bytes(j, {"mem", "pinned_bytes"});
    p.host_state_bytes = bytes(j, {"mem", "host_state_bytes"});
    p.nvme_bytes = bytes(j, {"mem", "nvme_bytes"});
    p.process_cores = number(j, {"cpu", "process_cores"});
    p.steal_share = number(j, {"cpu", "steal_share"});
    auto [it, fresh] = by_step.try_emplace(p.step, p);
    if (!fresh) {
      merge(it->second, p);
      ++run.merged;
    }
  }
  if (by_step.empty())
    fail("report::read",
         str("'", run.path, "' has no metrics line: ", run.lines == 0 ? "it is empty" : str(run.lines, " line(s), none a JSON object with a numeric \"step\"")),
         "pass the JSONL file that training wrote with --set log.metrics=FILE");
  for (auto& [step, p] : by_step) run.points.push_back(p);
  return run;
}

MetricsRun read_metrics(const std::string& path, std::string name) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    fail("report::read", str("'", path, "' is a folder, not a metrics file"),
         "pass the JSONL file that training wrote with --set log.metrics=FILE");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    fail("report::read", str("cannot open metrics file '", path, "': ", detail::errno_text(err)),
         "check the path (relative paths start at the working directory)");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("report::read", str("cannot read metrics file '", path, "'"));
  return parse_metrics(text.str(), std::move(name), path);
}

std::vector<std::string> run_names(const std::vector<std::string>& paths) {
  std::vector<std::string> stems, names;
  for (const auto& p : paths) stems.push_back(fs::path(p).stem().string());
  for (size_t i = 0; i < paths.size(); ++i)
    names.push_back(std::count(stems.begin(), stems.end(), stems[i]) > 1
                        ? fs::path(paths[i]).replace_extension().string()
                        : stems[i]);
  const std::vector<std::string> base = names;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto seen = 1 + std::count(base.begin(), base.begin() + long(i), base[i]);
    if (seen > 1) names[i] += str(" #", seen);
  }
  return names;
}

std::string report_csv(const std::vector<MetricsRun>& runs) {
  std::string out =
      "run,step,loss,eval_loss,tokens_per_s,step_ms,compute_ms,comm_ms,optimizer_ms,io_wait_ms,"
      "device_peak_bytes,pinned_bytes,host_state_bytes,nvme_bytes,process_cores,steal_share\n";
  auto cell = [&out](const std::optional<double>& v) {
    out += ',';
    if (v) out += number_text(*v);
  };
  auto bytes_cell = [&out](const std::optional<uint64_t>& v) {
    out += ',';
    if (v) out += std::to_string(*v);
  };
  for (const MetricsRun& r : runs)
    for (const MetricsPoint& p : r.points) {
      out += csv_field(r.name);
      out += ',';
      out += std::to_string(p.step);
      for (const auto* v : {&p.loss, &p.eval_loss, &p.tokens_per_s, &p.step_ms, &p.compute_ms, &p.comm_ms,
                            &p.optimizer_ms, &p.io_wait_ms})
        cell(*v);
      for (const auto* v : {&p.device_peak_bytes, &p.pinned_bytes, &p.host_state_bytes, &p.nvme_bytes}) bytes_cell(*v);
      cell(p.process_cores);
      cell(p.steal_share);
      out += '\n';
    }
  return out;
}

chart::Figure report_figure(const std::vector<MetricsRun>& runs, std::string title) {
  chart::Figure f;
  f.title = title.empty() ? "strata report" : std::move(title);
  f.columns = 2;
  f.panel_width = 470;
  f.panel_height = 250;
  int64_t skipped = 0, merged = 0;
  for (const MetricsRun& r : runs) {
    skipped += r.skipped;
    merged += r.merged;
  }
  f.subtitle = str(runs.size(), runs.size() == 1 ? " run" : " runs", "; x: step");
  if (skipped) f.subtitle += str("; ", skipped, " line(s) skipped (not a JSON object with a numeric step)");
  if (merged) f.subtitle += str("; ", merged, " line(s) of a repeated step merged (later values win)");

  for (size_t i = 0; i < runs.size(); ++i) {
    const MetricsRun& r = runs[i];
    std::string text = r.points.empty() ? str(r.name, " (no steps")
                                        : str(r.name, " (steps ", r.points.front().step, "–", r.points.back().step);
    for (auto it = r.points.rbegin(); it != r.points.rend(); ++it)
      if (it->loss && std::isfinite(*it->loss)) {
        text += ", last loss " + chart::tick_label(*it->loss, 0, chart::Format::number);
        break;
      }
    f.legend.push_back({text + ")", chart::palette(i), true, false, false});
  }
  f.legend.push_back({"loss", "#555", true, false, false});
  f.legend.push_back({"eval loss", "#555", true, true, true});

  chart::Axis step_axis;
  step_axis.label = "step";
  step_axis.integer = true;
  auto panel = [&](std::string title, std::string y_label, chart::Format format,
                   std::vector<Curve> curves) {
    chart::Panel p;
    p.title = std::move(title);
    p.x = step_axis;
    p.y.label = std::move(y_label);
    p.y.format = format;
    p.y.from_zero = true;
    for (size_t i = 0; i < runs.size(); ++i)
      for (const Curve& c : curves) p.series.push_back(series_of(runs[i], c, chart::palette(i)));
    p.empty_note = "not in these files";
    f.panels.push_back(std::move(p));
  };
  using F = chart::Format;
  panel("loss", "loss", F::number,
        {{"loss", [](const MetricsPoint& p) { return p.loss; }},
         {"eval loss", [](const MetricsPoint& p) { return p.eval_loss; }}});
  {  // eval loss: dashed, every point marked, drawn over the training curves; the axis fits the
     // curves, log when they span 10x
    chart::Panel& p = f.panels.back();
    p.y.from_zero = false;
    std::vector<chart::Series> train, eval;
    for (size_t k = 0; k < p.series.size(); ++k) (k % 2 == 0 ? train : eval).push_back(std::move(p.series[k]));
    for (chart::Series& s : eval) {
      s.dashed = true;
      s.markers = true;
      s.marker_radius = 3.5;
    }
    p.series = std::move(train);
    p.series.insert(p.series.end(), eval.begin(), eval.end());
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const chart::Series& s : p.series)
      for (double v : s.y)
        if (std::isfinite(v)) {
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
    if (lo > 0 && hi >= 10 * lo) {
      p.y.scale = chart::Scale::log;
      p.title = "loss (log scale)";
    }
  }
  panel("throughput", "tokens/s (all ranks)", F::number,
        {{"tokens/s", [](const MetricsPoint& p) { return p.tokens_per_s; }}});
  panel("compute: forward + backward", "ms per step", F::number,
        {{"compute ms", [](const MetricsPoint& p) { return p.compute_ms; }}});
  panel("optimizer: norm, clipping, AdamW", "ms per step", F::number,
        {{"optimizer ms", [](const MetricsPoint& p) { return p.optimizer_ms; }}});
  panel("waiting on communication (within compute)", "ms per step", F::number,
        {{"comm wait ms", [](const MetricsPoint& p) { return p.comm_ms; }}});
  panel("waiting on NVMe (within compute and optimizer)", "ms per step", F::number,
        {{"NVMe wait ms", [](const MetricsPoint& p) { return p.io_wait_ms; }}});
  panel("device memory: peak (largest rank)", "bytes", F::bytes,
        {{"device peak", [](const MetricsPoint& p) { return as_double(p.device_peak_bytes); }}});
  panel("pinned host staging (rank 0)", "bytes", F::bytes,
        {{"pinned", [](const MetricsPoint& p) { return as_double(p.pinned_bytes); }}});
  panel("state in host memory (rank 0)", "bytes", F::bytes,
        {{"host state", [](const MetricsPoint& p) { return as_double(p.host_state_bytes); }}});
  panel("state on NVMe (rank 0)", "bytes", F::bytes,
        {{"NVMe", [](const MetricsPoint& p) { return as_double(p.nvme_bytes); }}});
  return f;
}

std::string report_svg(const std::vector<MetricsRun>& runs, std::string title) {
  return chart::render_svg(report_figure(runs, std::move(title)));
}

void check_output(const std::string& path, std::string_view option) {
  fileutil::check_output_file(path, option, "report::write");
}

void write_output(const std::string& path, std::string_view text, std::string_view option) {
  check_output(path, option);
  fileutil::write_file_atomic(path, text, "report::write");
}

}  // namespace strata::report
