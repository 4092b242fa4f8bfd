// report/chart.h: tick choice (linear, bytes, log, whole numbers), scale mapping, tick labels,
// escaping, degenerate and empty ranges, and the SVG it writes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/size.h"
#include "report/chart.h"
#include "tests/report/svg_check.h"

using namespace strata;
using namespace strata::chart;

namespace {

void expect_values(const Ticks& t, std::vector<double> want) {
  ASSERT_EQ(t.values.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(t.values[i], want[i], 1e-9 * std::max(1.0, std::fabs(want[i]))) << "tick " << i;
}

std::vector<std::string> labels(const Ticks& t, Format f) {
  std::vector<std::string> out;
  for (double v : t.values) out.push_back(tick_label(v, t.step, f));
  return out;
}

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();

}  // namespace

TEST(ChartTicks, LinearStepsAreOneTwoFiveAndCoverTheData) {
  Ticks t = linear_ticks(0.3, 9.7, 5);
  EXPECT_EQ(t.step, 2);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 10);
  expect_values(t, {0, 2, 4, 6, 8, 10});

  t = linear_ticks(4.6, 6.2, 5);  // span 1.6 → 0.32 a tick → 0.5
  EXPECT_DOUBLE_EQ(t.step, 0.5);
  expect_values(t, {4.5, 5, 5.5, 6, 6.5});
  EXPECT_EQ(labels(t, Format::number), (std::vector<std::string>{"4.5", "5", "5.5", "6", "6.5"}));

  t = linear_ticks(0, 1, 5);
  expect_values(t, {0, 0.2, 0.4, 0.6, 0.8, 1.0});

  t = linear_ticks(-3, 3, 5);
  EXPECT_EQ(t.step, 2);
  expect_values(t, {-4, -2, 0, 2, 4});
  EXPECT_EQ(labels(t, Format::number)[2], "0");

  t = linear_ticks(0, 47000, 5);  // tokens/s: 10k steps, labelled with k
  expect_values(t, {0, 10000, 20000, 30000, 40000, 50000});
  EXPECT_EQ(labels(t, Format::number), (std::vector<std::string>{"0", "10k", "20k", "30k", "40k", "50k"}));
}

TEST(ChartTicks, WholeNumbersForSteps) {
  Ticks t = linear_ticks(1, 3, 5, Format::number, /*integer=*/true);
  EXPECT_EQ(t.step, 1);
  expect_values(t, {1, 2, 3});
  t = linear_ticks(1, 1000, 5, Format::number, true);
  EXPECT_EQ(t.step, 200);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 1000);
}

TEST(ChartTicks, BytesStepByPowersOfTwo) {
  Ticks t = linear_ticks(0, 2.4 * double(GiB), 5, Format::bytes);
  EXPECT_EQ(t.step, double(512 * MiB));
  EXPECT_EQ(labels(t, Format::bytes),
            (std::vector<std::string>{"0", "512M", "1G", "1.5G", "2G", "2.5G"}));
  t = linear_ticks(0, 1000, 5, Format::bytes);  // below 1K: plain bytes
  EXPECT_EQ(t.step, 256);
  EXPECT_EQ(labels(t, Format::bytes), (std::vector<std::string>{"0", "256", "512", "768", "1K"}));
  t = linear_ticks(0, 0.3, 5, Format::bytes);  // never a step below one byte
  EXPECT_EQ(t.step, 1);
}

TEST(ChartTicks, Log) {
  Ticks t = log_ticks(0.03, 7);
  EXPECT_DOUBLE_EQ(t.lo, 0.02);
  EXPECT_DOUBLE_EQ(t.hi, 10);
  expect_values(t, {0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10});
  EXPECT_EQ(labels(t, Format::number),
            (std::vector<std::string>{"0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10"}));

  t = log_ticks(1.5, 2.5);  // within one 1-2-5 interval: still three ticks
  expect_values(t, {1, 2, 5});
  t = log_ticks(3.1, 3.9);  // 2..5: 1-2-5 gives two, so every 1..9
  expect_values(t, {2, 3, 4, 5});

  t = log_ticks(1e-3, 3e5);  // many decades: every n-th, the domain ending on a tick
  expect_values(t, {1e-3, 1e-1, 1e1, 1e3, 1e5, 1e7});
  EXPECT_DOUBLE_EQ(t.hi, 1e7);
  for (double v : t.values) EXPECT_GT(v, 0);
}

TEST(ChartTicks, Labels) {
  EXPECT_EQ(tick_label(20000, 5000, Format::number), "20k");
  EXPECT_EQ(tick_label(1500, 500, Format::number), "1.5k");
  EXPECT_EQ(tick_label(800, 200, Format::number), "800");
  EXPECT_EQ(tick_label(1e6, 2e5, Format::number), "1M");
  EXPECT_EQ(tick_label(2.5e6, 5e5, Format::number), "2.5M");
  EXPECT_EQ(tick_label(-1e-12, 0.2, Format::number), "0");  // no "-0.0"
  EXPECT_EQ(tick_label(0.05, 0.01, Format::number), "0.05");
  EXPECT_EQ(tick_label(1e5, 0, Format::number), "100k");
  EXPECT_EQ(tick_label(0.002, 0, Format::number), "0.002");
  EXPECT_EQ(tick_label(double(512 * MiB), 0, Format::bytes), "512M");
  EXPECT_EQ(tick_label(double(3 * GiB / 2), 0, Format::bytes), "1.5G");
  EXPECT_EQ(tick_label(1.25 * double(GiB), 0, Format::bytes), "1.25G");
  EXPECT_EQ(tick_label(1.125 * double(GiB), 0, Format::bytes), "1152M");  // exact, not "1.13G"
  EXPECT_EQ(tick_label(100, 0, Format::bytes), "100");
  EXPECT_EQ(tick_label(0, 0, Format::bytes), "0");
  EXPECT_EQ(tick_label(kNaN, 1, Format::number), "nan");
}

TEST(ChartTicks, DegenerateAndEmptyRanges) {
  Axis lin;
  // One value: widened by 10% each way.
  Ticks t = axis_ticks(lin, 5, 5);
  EXPECT_LT(t.lo, 5);
  EXPECT_GT(t.hi, 5);
  EXPECT_GE(t.values.size(), 2u);
  // Zero alone, and no data at all: [0, 1].
  Axis zero;
  zero.from_zero = true;
  t = axis_ticks(zero, 0, 0);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 1);
  t = axis_ticks(lin, kInf, -kInf);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 1);
  t = axis_ticks(lin, kNaN, kNaN);
  EXPECT_EQ(t.lo, 0);
  EXPECT_EQ(t.hi, 1);
  // A constant memory curve drawn from zero: no widening below zero.
  Axis mem;
  mem.from_zero = true;
  mem.format = Format::bytes;
  t = axis_ticks(mem, 2.0 * double(GiB), 2.0 * double(GiB));
  EXPECT_EQ(t.lo, 0);
  EXPECT_GE(t.hi, 2.0 * double(GiB));
  // One step on a whole-number axis: the neighbours.
  Axis steps;
  steps.integer = true;
  t = axis_ticks(steps, 7, 7);
  expect_values(t, {6, 7, 8});
  // Log: one value → a factor of two each way; nothing positive → [1, 10].
  Axis lg;
  lg.scale = Scale::log;
  t = axis_ticks(lg, 3, 3);
  EXPECT_LE(t.lo, 1.5);
  EXPECT_GE(t.hi, 6);
  t = axis_ticks(lg, kInf, -kInf);
  EXPECT_EQ(t.lo, 1);
  EXPECT_EQ(t.hi, 10);
  // Headroom widens the top before the ticks are chosen.
  Axis room;
  room.from_zero = true;
  room.headroom = 0.2;
  t = axis_ticks(room, 0, 100);
  EXPECT_GE(t.hi, 120);
  // Straight to the tick functions with nothing to span: no division, two values.
  t = linear_ticks(3, 3);
  EXPECT_EQ(t.values.size(), 2u);
  t = log_ticks(0, 0);
  EXPECT_EQ(t.values.size(), 2u);
  // A span lost in rounding far from zero still ends.
  t = linear_ticks(1e17, 1e17 + 64, 5);
  EXPECT_FALSE(t.values.empty());
  EXPECT_LE(t.values.size(), 1001u);
}

TEST(ChartScale, Mapping) {
  EXPECT_DOUBLE_EQ((Mapping{0, 10, 100, 200, Scale::linear})(5), 150);
  EXPECT_DOUBLE_EQ((Mapping{0, 10, 200, 100, Scale::linear})(2.5), 175);  // a y axis: up is smaller
  EXPECT_DOUBLE_EQ((Mapping{1, 100, 0, 100, Scale::log})(10), 50);
  EXPECT_DOUBLE_EQ((Mapping{0.01, 1, 0, 100, Scale::log})(0.1), 50);
  EXPECT_DOUBLE_EQ((Mapping{3, 3, 0, 100, Scale::linear})(3), 50);  // degenerate: the middle
  EXPECT_DOUBLE_EQ((Mapping{5, 5, 0, 100, Scale::log})(5), 50);
}

TEST(ChartText, Escape) {
  EXPECT_EQ(escape("a<b & \"c\" 'd' >"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos; &gt;");
  EXPECT_EQ(escape(std::string("bell\x07 tab\t nl\n\0", 15)), "bell? tab\t nl\n?");  // NUL too
  EXPECT_EQ(escape("µs — ok"), "µs — ok");  // UTF-8 passes through
  EXPECT_EQ(escape(""), "");
}

TEST(ChartSvg, SeriesPointsLegendAndEscaping) {
  Figure f;
  f.title = "runs <a> & <b>";
  f.columns = 2;
  f.legend = {{"run <a>", palette(0)}, {"eval", "#555", true, true, true}};
  Panel p;
  p.title = "loss";
  p.x.integer = true;
  p.x.label = "step";
  Series a;
  a.name = "a: loss";
  a.x = {1, 2, 3, 4, 5};
  a.y = {3, kNaN, 2, kInf, 1};  // non-finite points are left out, the line goes on
  Series b;
  b.name = "b: loss";
  b.color = palette(1);
  b.x = {7};
  b.y = {2.5};  // a single point: a marker as well
  b.dashed = true;
  Series none;
  none.name = "c: loss";
  none.x = {1};
  none.y = {kNaN};  // nothing drawable: no element at all
  p.series = {a, b, none};
  Panel empty;
  empty.title = "nothing";
  empty.empty_note = "no data here";
  Panel lg;
  lg.title = "log";
  lg.y.scale = Scale::log;
  Series c;
  c.name = "c: log";
  c.x = {1, 2, 3, 4};
  c.y = {10, 0, -1, 0.1};  // not positive: not on a log axis
  lg.series = {c};
  f.panels = {p, empty, lg};

  const std::string svg = render_svg(f);
  EXPECT_EQ(test::svg_problem(svg), "") << svg;
  auto lines = test::polylines(svg);
  EXPECT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines["a: loss"], 3);
  EXPECT_EQ(lines["b: loss"], 1);
  EXPECT_EQ(lines["c: log"], 2);
  EXPECT_EQ(lines.count("c: loss"), 0u);
  EXPECT_EQ(test::count(svg, "<circle"), 1 + 1);  // b's single point, and the legend's eval sample
  EXPECT_EQ(test::count(svg, "stroke-dasharray"), 2);  // b, and the legend's eval sample
  EXPECT_NE(svg.find("runs &lt;a&gt; &amp; &lt;b&gt;"), std::string::npos);
  EXPECT_NE(svg.find(">run &lt;a&gt;</text>"), std::string::npos);
  EXPECT_NE(svg.find(">no data here</text>"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  EXPECT_EQ(svg.find("inf"), std::string::npos);
}

TEST(ChartSvg, EmptyFigureIsStillAnSvg) {
  const std::string svg = render_svg(Figure{});
  EXPECT_EQ(test::svg_problem(svg), "");
  EXPECT_TRUE(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  EXPECT_TRUE(svg.ends_with("</svg>\n"));
}
