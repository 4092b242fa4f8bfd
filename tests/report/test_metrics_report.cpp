// report/metrics_report.h: two small metrics files written here (one with eval_loss, one with
// lines to skip, missing keys, a null loss and a repeated step) → the CSV, cell by cell, and
// the SVG: well-formed, one polyline per run per series with one point per logged value, the
// legend. Then names, errors, a single point, non-finite values and the atomic write.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "report/metrics_report.h"
#include "tests/report/svg_check.h"

using namespace strata;
using namespace strata::report;
namespace fs = std::filesystem;

namespace {

fs::path work_dir(const std::string& name) {
  fs::path d = fs::path(STRATA_TEST_WORK_DIR) / "report" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string write(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// A line as engine/trainer.cpp writes it (keys sorted, as nlohmann prints them).
std::string line(int step, const std::string& loss, double tps, double step_ms, double compute,
                 double comm, double optim, double io_wait, uint64_t device, uint64_t pinned,
                 uint64_t host, uint64_t nvme, const std::string& extra = "") {
  return str("{\"comm_bytes\":0,\"grad_norm\":1.5,", extra, "\"io\":{\"busy_ms\":0,\"read_bytes\":0,\"wait_ms\":",
             io_wait, "},\"links\":{\"d2h_bytes\":0,\"h2d_bytes\":0},\"loss\":", loss,
             ",\"lr\":0.001,\"mem\":{\"device_peak_bytes\":", device, ",\"host_rss_bytes\":1,\"host_state_bytes\":",
             host, ",\"nvme_bytes\":", nvme, ",\"pinned_bytes\":", pinned, "},\"mfu\":0,\"params\":100,\"ranks\":1,\"step\":",
             step, ",\"step_ms\":", step_ms, ",\"time\":{\"compute_ms\":", compute, ",\"optimizer_ms\":", optim,
             ",\"wait_comm_ms\":", comm, "},\"tokens_per_s\":", tps, "}\n");
}

// Run a: three steps, eval loss on steps 2 and 3; a folder name with markup in it.
// Run b: five lines to skip, a step without most keys, a null loss, a step written twice.
struct Files {
  std::string a, b;
};

Files write_files(const fs::path& d) {
  Files f;
  f.a = write(d / "run_a.jsonl",
              line(1, "2.5", 1000, 12.5, 10, 1.25, 2.5, 0.5, 1073741824, 268435456, 0, 0,
                   "\"cpu\":{\"busy_share\":0.75,\"idle_share\":0.125,\"process_cores\":1.5,"
                   "\"steal_share\":0.125},") +
              line(2, "2.25", 1250, 10, 8, 1, 2, 0.25, 1073741824, 268435456, 0, 0, "\"eval_loss\":2.375,") +
              line(3, "2", 1000, 12.5, 10, 1, 2.5, 0, 1073741824, 268435456, 0, 0, "\"eval_loss\":2.125,"));
  f.b = write(d / "run_b.jsonl",
              "not json at all\n"
              "{\"loss\":3}\n"
              "[1,2,3]\n"
              "\n"
              "{\"step\":\"4\",\"loss\":3}\n" +
              line(10, "3.5", 500, 40, 30, 0, 10, 5, 2147483648, 0, 4294967296, 17179869184) +
              "{\"step\":20,\"loss\":3.25}\n" +
              line(30, "null", 600, 33.5, 25, 0, 8.5, 4, 2147483648, 0, 4294967296, 17179869184,
                   "\"cpu\":{\"busy_share\":null,\"idle_share\":null,\"process_cores\":2,"
                   "\"steal_share\":null},") +
              "{\"step\":30,\"eval_loss\":3.0}\n"
              "{\"step\":2.5}\n"
              "{\"step\":40,\"loss\":3.1,\"tokens_per_s\":700,\"mem\":{\"nvme_bytes\":17179869184}}\n"
              "{\"step\":40,\"loss\":3.05,\"tokens_per_s\":710}\n"
              "{\"step\":50,\"loss\":2.9,\"ste");  // the run was killed mid-line
  return f;
}

}  // namespace

TEST(MetricsReport, ReadsLinesSkipsAndMerges) {
  const Files f = write_files(work_dir("read"));
  MetricsRun a = read_metrics(f.a, "a");
  EXPECT_EQ(a.lines, 3);
  EXPECT_EQ(a.skipped, 0);
  EXPECT_EQ(a.merged, 0);
  ASSERT_EQ(a.points.size(), 3u);
  EXPECT_FALSE(a.points[0].eval_loss);
  EXPECT_EQ(*a.points[1].eval_loss, 2.375);
  EXPECT_EQ(*a.points[0].comm_ms, 1.25);
  EXPECT_EQ(*a.points[0].io_wait_ms, 0.5);

  MetricsRun b = read_metrics(f.b, "b");
  EXPECT_EQ(b.lines, 12);    // the blank line is not counted
  EXPECT_EQ(b.skipped, 6);   // not JSON, no step, an array, a string step, step 2.5, the cut line
  EXPECT_EQ(b.merged, 2);    // step 30's eval line, step 40's second line
  ASSERT_EQ(b.points.size(), 4u);
  EXPECT_EQ(b.points[0].step, 10);
  EXPECT_FALSE(b.points[2].loss);       // null, as NaN is written
  EXPECT_EQ(*b.points[2].eval_loss, 3.0);  // merged from its own line
  EXPECT_EQ(*b.points[2].tokens_per_s, 600);
  EXPECT_EQ(*b.points[3].loss, 3.05);   // the later line wins
  EXPECT_EQ(*b.points[3].nvme_bytes, 17179869184u);  // kept where the later line lacks it
}

TEST(MetricsReport, CsvCellByCell) {
  const Files f = write_files(work_dir("csv"));
  std::vector<MetricsRun> runs = {read_metrics(f.a, "a"), read_metrics(f.b, "b, the \"second\"")};
  EXPECT_EQ(report_csv(runs),
            "run,step,loss,eval_loss,tokens_per_s,step_ms,compute_ms,comm_ms,optimizer_ms,io_wait_ms,"
            "device_peak_bytes,pinned_bytes,host_state_bytes,nvme_bytes,process_cores,steal_share\n"
            "a,1,2.5,,1000,12.5,10,1.25,2.5,0.5,1073741824,268435456,0,0,1.5,0.125\n"
            "a,2,2.25,2.375,1250,10,8,1,2,0.25,1073741824,268435456,0,0,,\n"
            "a,3,2,2.125,1000,12.5,10,1,2.5,0,1073741824,268435456,0,0,,\n"
            "\"b, the \"\"second\"\"\",10,3.5,,500,40,30,0,10,5,2147483648,0,4294967296,17179869184,,\n"
            "\"b, the \"\"second\"\"\",20,3.25,,,,,,,,,,,,,\n"
            "\"b, the \"\"second\"\"\",30,,3,600,33.5,25,0,8.5,4,2147483648,0,4294967296,17179869184,2,\n"
            "\"b, the \"\"second\"\"\",40,3.05,,710,,,,,,,,,17179869184,,\n");
}

TEST(MetricsReport, SvgHasOnePolylinePerRunPerSeries) {
  const Files f = write_files(work_dir("svg"));
  std::vector<MetricsRun> runs = {read_metrics(f.a, "a"), read_metrics(f.b, "b <&>")};
  const std::string svg = report_svg(runs);
  ASSERT_EQ(test::svg_problem(svg), "") << svg;
  const auto lines = test::polylines(svg);
  const std::map<std::string, int> want = {
      {"a: loss", 3},           {"a: eval loss", 2},         {"a: tokens/s", 3},
      {"a: compute ms", 3},     {"a: optimizer ms", 3},      {"a: comm wait ms", 3},
      {"a: NVMe wait ms", 3},   {"a: device peak", 3},       {"a: pinned", 3},
      {"a: host state", 3},     {"a: NVMe", 3},
      {"b &lt;&amp;&gt;: loss", 3},        {"b &lt;&amp;&gt;: eval loss", 1},
      {"b &lt;&amp;&gt;: tokens/s", 3},    {"b &lt;&amp;&gt;: compute ms", 2},
      {"b &lt;&amp;&gt;: optimizer ms", 2}, {"b &lt;&amp;&gt;: comm wait ms", 2},
      {"b &lt;&amp;&gt;: NVMe wait ms", 2}, {"b &lt;&amp;&gt;: device peak", 2},
      {"b &lt;&amp;&gt;: pinned", 2},      {"b &lt;&amp;&gt;: host state", 2},
      {"b &lt;&amp;&gt;: NVMe", 3}};
  EXPECT_EQ(lines, want);
  // Eval loss: dashed in the run's colour.
  EXPECT_NE(svg.find("stroke=\"#1f77b4\" stroke-width=\"1.5\" stroke-linejoin=\"round\" stroke-dasharray=\"5 3\"><title>a: eval loss"),
            std::string::npos);
  // Legend: each run with its steps and last loss, then the two line styles.
  EXPECT_NE(svg.find(">a (steps 1–3, last loss 2)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">b &lt;&amp;&gt; (steps 10–40, last loss 3.05)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">eval loss</text>"), std::string::npos);
  EXPECT_NE(svg.find("6 line(s) skipped"), std::string::npos);
  EXPECT_NE(svg.find(">4G</text>"), std::string::npos);  // a byte tick
  EXPECT_EQ(test::count(svg, "<svg "), 1);
}

TEST(MetricsReport, SinglePointFlatAndNonFinite) {
  MetricsRun one;
  one.name = "one";
  MetricsPoint p;
  p.step = 5;
  p.loss = 2.0;
  p.tokens_per_s = 100;
  p.device_peak_bytes = 0;
  one.points = {p};
  MetricsRun odd;
  odd.name = "odd";
  for (int s = 1; s <= 4; ++s) {
    MetricsPoint q;
    q.step = s;
    q.loss = s == 2 ? std::numeric_limits<double>::quiet_NaN() : s == 3 ? std::numeric_limits<double>::infinity() : 1.0;
    q.tokens_per_s = 7;  // flat
    q.step_ms = 0;
    odd.points.push_back(q);
  }
  MetricsRun none;  // only through the API: read_metrics refuses a file without a step
  none.name = "none";
  const std::string svg = report_svg({one, odd, none});
  EXPECT_NE(svg.find(">none (no steps)</text>"), std::string::npos);
  ASSERT_EQ(test::svg_problem(svg), "") << svg;
  const auto lines = test::polylines(svg);
  EXPECT_EQ(lines.at("one: loss"), 1);
  EXPECT_EQ(lines.at("one: tokens/s"), 1);
  EXPECT_EQ(lines.at("one: device peak"), 1);
  EXPECT_EQ(lines.at("odd: loss"), 2);  // NaN and inf left out
  EXPECT_EQ(lines.at("odd: tokens/s"), 4);
  EXPECT_EQ(lines.count("odd: device peak"), 0u);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_NE(svg.find("not in these files"), std::string::npos);  // e.g. compute: in neither run
  // The CSV keeps what was there: non-finite values are written, not hidden.
  const std::string csv = report_csv({odd});
  EXPECT_NE(csv.find("odd,2,nan,"), std::string::npos);
  EXPECT_NE(csv.find("odd,3,inf,"), std::string::npos);
}

TEST(MetricsReport, LogLossAxisWhenTheLossSpansTenTimes) {
  MetricsRun r;
  r.name = "r";
  for (int s = 1; s <= 3; ++s) {
    MetricsPoint p;
    p.step = s;
    p.loss = 10.0 / (s * s * s);  // 10 → 0.37
    r.points.push_back(p);
  }
  EXPECT_EQ(report_figure({r}).panels[0].y.scale, chart::Scale::log);
  EXPECT_NE(report_svg({r}).find("loss (log scale)"), std::string::npos);
  r.points[2].loss = 2;
  EXPECT_EQ(report_figure({r}).panels[0].y.scale, chart::Scale::linear);
}

TEST(MetricsReport, RunNames) {
  EXPECT_EQ(run_names({"x/a.jsonl", "y/b.metrics.jsonl"}), (std::vector<std::string>{"a", "b.metrics"}));
  EXPECT_EQ(run_names({"x/metrics.jsonl", "y/metrics.jsonl", "z/other.jsonl"}),
            (std::vector<std::string>{"x/metrics", "y/metrics", "other"}));
  EXPECT_EQ(run_names({"a.jsonl", "a.jsonl", "a.jsonl"}), (std::vector<std::string>{"a", "a #2", "a #3"}));
}

TEST(MetricsReport, ClearErrors) {
  const fs::path d = work_dir("errors");
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  std::string m = message([&] { read_metrics((d / "missing.jsonl").string(), "m"); });
  EXPECT_NE(m.find("[report::read]"), std::string::npos) << m;
  EXPECT_NE(m.find("missing.jsonl"), std::string::npos) << m;
  m = message([&] { read_metrics(write(d / "junk.jsonl", "hello\n[1]\n{\"loss\":1}\n"), "j"); });
  EXPECT_NE(m.find("no metrics line"), std::string::npos) << m;
  EXPECT_NE(m.find("3 line(s)"), std::string::npos) << m;
  m = message([&] { read_metrics(write(d / "empty.jsonl", ""), "e"); });
  EXPECT_NE(m.find("it is empty"), std::string::npos) << m;
  m = message([&] { read_metrics(d.string(), "dir"); });
  EXPECT_NE(m.find("is a folder"), std::string::npos) << m;
  m = message([&] { write_output((d / "no_such_dir" / "r.svg").string(), "x", "--out"); });
  EXPECT_NE(m.find("[report::write]"), std::string::npos) << m;
  EXPECT_NE(m.find("no_such_dir"), std::string::npos) << m;
  EXPECT_NE(m.find("--out"), std::string::npos) << m;
  EXPECT_NE(m.find("does not exist"), std::string::npos) << m;
}

TEST(MetricsReport, WritesWholeFilesOnly) {
  const fs::path d = work_dir("write");
  const std::string path = (d / "r.svg").string();
  write_output(path, "<svg/>\n", "--out");
  write_output(path, "<svg></svg>\n", "--out");  // replaces
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "<svg></svg>\n");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(std::distance(fs::directory_iterator(d), fs::directory_iterator()), 1);
}
