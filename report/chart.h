// report/chart.h — a small SVG chart writer with no plotting dependency: a figure is a title, a
// legend and a grid of panels; a panel has two axes (linear or log, "nice" ticks, numbers or
// byte sizes such as 512M and 2G) and series drawn as polylines and/or markers. It draws
// `strata report` (curves from metrics JSONL) and `strata bench sweep` (device memory against
// throughput). It does not read data, draw bars or areas, or thin long series. Text is escaped
// here, so callers pass plain strings. Points that are not finite (and, on a log axis, not
// positive) are left out of the drawing; an empty or one-valued range is widened, never
// divided by.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace strata::chart {

enum class Scale { linear, log };
enum class Format { number, bytes };  // tick labels: 0.5, 20k, 1.5M — or 512M, 2G (binary units)

// The ticks of one axis: the domain [lo, hi] the axis spans (the data range widened to round
// values) and the tick values inside it, ascending. `step` is the distance between linear ticks
// (0 for log ticks); tick_label uses it to choose the decimals.
struct Ticks {
  double lo = 0, hi = 1;
  double step = 0;
  std::vector<double> values;
};

// Linear ticks over [lo, hi] (lo < hi, both finite): about `target` intervals of a round step,
// the domain widened to multiples of it. Numbers step by 1, 2 or 5 × 10^k; bytes by a power of
// two (256M, 512M, 1G...); `integer` keeps the step at 1 or more (training steps).
// Example: linear_ticks(0.3, 9.7, 5) → step 2, domain [0, 10], ticks 0 2 4 6 8 10.
Ticks linear_ticks(double lo, double hi, int target = 5, Format format = Format::number,
                   bool integer = false);
// Log ticks over [lo, hi] (0 < lo < hi): up to three decades, the domain widened to 1-2-5 values
// with ticks at 1, 2, 5 × 10^k (at every 1..9 × 10^k when that gives fewer than three); past
// three decades, whole decades with a tick every n-th decade so that at most seven remain.
// Example: log_ticks(0.03, 7) → domain [0.02, 10], ticks 0.02 0.05 0.1 0.2 0.5 1 2 5 10.
Ticks log_ticks(double lo, double hi);

// Numbers: "0.5", "800", "1.5k", "20k", "2.5M" — an SI suffix from 1000 up, decimals from `step`
// (%g for log ticks, step 0), trailing zeros dropped. Bytes: "512M", "1.5G", "1152M" — the
// largest binary unit that shows the value exactly to two decimals.
std::string tick_label(double value, double step, Format format);

// Text for SVG content and attribute values: & < > " ' escaped; control characters other than
// tab and newline, which XML 1.0 forbids, become '?'.
std::string escape(std::string_view text);

struct Axis {
  std::string label;
  Scale scale = Scale::linear;
  Format format = Format::number;
  bool from_zero = false;  // linear: the domain includes 0, so distances read as ratios
  bool integer = false;    // linear: whole-number ticks
  double headroom = 0;     // linear: the top widened by this fraction of the range (room for labels)
};

// The domain and ticks Figure uses for `axis` given the finite data range [data_min, data_max]
// (data_min > data_max: no data). A one-valued range is widened by 10% of its value each way
// (by 1 when the value is 0; by a factor of 2 on a log axis).
Ticks axis_ticks(const Axis& axis, double data_min, double data_max);

// Domain → pixels: linear, or linear in log10 on a log axis. A degenerate domain maps to the
// middle of the pixel range.
struct Mapping {
  double d0 = 0, d1 = 1;  // domain
  double p0 = 0, p1 = 1;  // pixels (p1 < p0 for a y axis)
  Scale scale = Scale::linear;
  double operator()(double v) const;
};

struct Series {
  std::string name;  // the tooltip (<title>) of the polyline and its markers
  std::string color = "#1f77b4";
  std::vector<double> x, y;  // same length
  bool line = true;          // one <polyline> through the drawable points (when there is one)
  bool dashed = false;
  bool markers = false;      // a circle at every drawable point (always, for a single point)
  double marker_radius = 3;
  std::string label;         // text drawn above the last drawable point, e.g. "1"
  double label_dy = 10;      // how far above, in pixels
};

struct Panel {
  std::string title;
  Axis x, y;
  std::vector<Series> series;
  std::string empty_note = "no data";  // shown in the plot area when no series has a point
};

struct LegendEntry {
  std::string text;
  std::string color;
  bool line = true;  // a short line sample; dashed when `dashed`
  bool dashed = false;
  bool marker = false;  // a circle sample
};

struct Figure {
  std::string title;
  std::string subtitle;  // one line under the title (empty: none)
  std::vector<LegendEntry> legend;
  bool legend_below = false;  // false: in rows under the title; true: one entry a line below the panels
  std::vector<Panel> panels;  // filled row by row
  int columns = 1;
  double panel_width = 460, panel_height = 250;  // each panel's box, margins and title included
};

std::string render_svg(const Figure& figure);

// The i-th colour of a ten-colour palette (it wraps around).
const char* palette(size_t i);

}  // namespace strata::chart
