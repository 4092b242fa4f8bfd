// report/chart.cpp — ticks, scales, escaping and the SVG layout of report/chart.h.
#include "report/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace strata::chart {
namespace {

// Panel margins (pixels): room for the title, the tick labels and the axis labels.
constexpr double kMarginLeft = 66, kMarginRight = 14, kMarginTop = 28, kMarginBottom = 40;
constexpr double kPad = 10;            // around the figure
constexpr double kLegendRow = 20;      // height of one legend line
constexpr double kCharWidth = 6.6;     // rough width of a 12px sans-serif character
constexpr int kMaxTicks = 1000;        // past this, rounding has eaten the step

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string px(double v) { return fmt("%.1f", v); }

// The largest of 1, 2, 5 × 10^k at or below v (round_up: the smallest at or above), v > 0.
double round_125(double v, bool round_up) {
  const double mag = std::pow(10.0, std::floor(std::log10(v)));
  const double m = v / mag;
  if (round_up) {
    for (double c : {1.0, 2.0, 5.0, 10.0})
      if (c >= m * (1 - 1e-9)) return c * mag;
    return 10 * mag;
  }
  double best = 1;
  for (double c : {1.0, 2.0, 5.0, 10.0})
    if (c <= m * (1 + 1e-9)) best = c;
  return best * mag;
}

}  // namespace

Ticks linear_ticks(double lo, double hi, int target, Format format, bool integer) {
  Ticks t;
  t.lo = lo;
  t.hi = hi;
  const double span = hi - lo;
  if (!(std::isfinite(span) && span > 0) || target < 1) {
    t.values = {lo, hi};
    return t;
  }
  const double raw = span / target;
  double step;
  if (format == Format::bytes) {
    step = std::max(1.0, std::exp2(std::ceil(std::log2(raw))));
  } else {
    step = round_125(raw, true);
  }
  if (integer) step = std::max(step, 1.0);
  const double first = std::floor(lo / step + 1e-9), last = std::ceil(hi / step - 1e-9);
  if (!(last - first >= 1) || last - first > kMaxTicks) {  // the step is lost in rounding
    t.values = {lo, hi};
    return t;
  }
  t.step = step;
  t.lo = first * step;
  t.hi = last * step;
  for (int k = 0; k <= int(last - first); ++k) t.values.push_back((first + k) * step);
  return t;
}

Ticks log_ticks(double lo, double hi) {
  Ticks t;
  if (!(lo > 0 && hi > lo && std::isfinite(hi))) {
    t.lo = lo;
    t.hi = hi;
    t.values = {lo, hi};
    return t;
  }
  const double wlo = round_125(lo, false), whi = round_125(hi, true);
  const double decades = std::log10(whi / wlo);
  if (decades <= 3 + 1e-9) {
    t.lo = wlo;
    t.hi = whi;
    for (const auto& mantissas : {std::vector<double>{1, 2, 5}, std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8, 9}}) {
      t.values.clear();
      for (int k = int(std::floor(std::log10(wlo))) - 1; k <= int(std::ceil(std::log10(whi))); ++k)
        for (double m : mantissas) {
          const double v = m * std::pow(10.0, k);
          if (v >= wlo * (1 - 1e-9) && v <= whi * (1 + 1e-9)) t.values.push_back(v);
        }
      if (t.values.size() >= 3) break;
    }
    return t;
  }
  const int k0 = int(std::floor(std::log10(lo) + 1e-9)), k1 = int(std::ceil(std::log10(hi) - 1e-9));
  const int every = std::max(1, (k1 - k0 + 5) / 6);
  const int k_end = k0 + (k1 - k0 + every - 1) / every * every;  // the domain ends on a tick
  t.lo = std::pow(10.0, k0);
  t.hi = std::pow(10.0, k_end);
  for (int k = k0; k <= k_end; k += every) t.values.push_back(std::pow(10.0, k));
  return t;
}

std::string tick_label(double value, double step, Format format) {
  if (!std::isfinite(value)) return value != value ? "nan" : (value > 0 ? "inf" : "-inf");
  if (format == Format::bytes) {
    if (std::fabs(value) < 0.5) return "0";
    const char* sign = value < 0 ? "-" : "";
    const double v = std::fabs(value);
    static const char* kUnit[] = {"", "K", "M", "G", "T", "P"};
    for (int k = 5; k >= 1; --k) {
      const double x = v / std::exp2(10.0 * k);
      if (x < 1) continue;
      const double hundredths = x * 100;
      if (std::fabs(hundredths - std::round(hundredths)) > 1e-6 * hundredths) continue;  // not exact
      const double r = std::round(hundredths);
      const char* f = std::fmod(r, 100) == 0 ? "%.0f" : std::fmod(r, 10) == 0 ? "%.1f" : "%.2f";
      return sign + fmt(f, x) + kUnit[k];
    }
    return sign + fmt("%.0f", v);
  }
  // Numbers: an SI suffix chosen per value (800, 1.2k, 20k, 1.5M); decimals from the step,
  // trailing zeros dropped. Log ticks (step 0) print as %g.
  if (value == 0 || (step > 0 && std::fabs(value) < step * 1e-6)) return "0";
  static const char* kSuffix[] = {"", "k", "M", "G", "T"};
  int k = 0;
  while (k < 4 && std::fabs(value) >= std::pow(1000.0, k + 1)) ++k;
  const double unit = std::pow(1000.0, k);
  if (step <= 0) return fmt("%g", value / unit) + kSuffix[k];
  const int decimals = std::clamp(int(std::ceil(-std::log10(step / unit) - 1e-9)), 0, 12);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value / unit);
  std::string out = buf;
  if (out.find('.') != std::string::npos) {
    while (out.back() == '0') out.pop_back();
    if (out.back() == '.') out.pop_back();
  }
  return out + kSuffix[k];
}

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n') out += '?';
        else out += c;
    }
  }
  return out;
}

Ticks axis_ticks(const Axis& axis, double data_min, double data_max) {
  const bool has_data = std::isfinite(data_min) && std::isfinite(data_max) && data_min <= data_max;
  if (axis.scale == Scale::log) {
    if (!has_data || data_max <= 0) return log_ticks(1, 10);
    double lo = data_min > 0 ? data_min : data_max / 10, hi = data_max;
    if (hi <= lo * (1 + 1e-12)) {
      lo /= 2;
      hi *= 2;
    }
    return log_ticks(lo, hi);
  }
  double lo = has_data ? data_min : 0, hi = has_data ? data_max : 1;
  if (axis.from_zero) {
    lo = std::min(lo, 0.0);
    hi = std::max(hi, 0.0);
  }
  if (hi - lo <= 1e-12 * std::max(std::fabs(lo), std::fabs(hi))) {  // one value (or none)
    double d = lo != 0 ? std::fabs(lo) * 0.1 : 1;
    if (axis.integer) d = std::max(d, 1.0);
    const double v = lo;
    lo = v - d;
    hi = v + d;
    if (axis.from_zero && v >= 0) lo = std::max(lo, 0.0);
    if (axis.from_zero && v <= 0) hi = std::min(hi, 0.0);
    if (hi <= lo) hi = lo + d;
  }
  hi += (hi - lo) * std::max(0.0, axis.headroom);
  return linear_ticks(lo, hi, 5, axis.format, axis.integer);
}

double Mapping::operator()(double v) const {
  double a = d0, b = d1, x = v;
  if (scale == Scale::log) {
    a = std::log10(d0);
    b = std::log10(d1);
    x = std::log10(v);
  }
  const double den = b - a;
  const double t = (std::isfinite(den) && den > 0) ? (x - a) / den : 0.5;
  return p0 + t * (p1 - p0);
}

const char* palette(size_t i) {
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e",
                                  "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"};
  return kColors[i % (sizeof kColors / sizeof kColors[0])];
}

namespace {

struct Point {
  double x, y;
};

bool drawable(double v, Scale s) { return std::isfinite(v) && (s == Scale::linear || v > 0); }

std::vector<Point> points_of(const Series& s, const Panel& p) {
  std::vector<Point> out;
  const size_t n = std::min(s.x.size(), s.y.size());
  for (size_t i = 0; i < n; ++i)
    if (drawable(s.x[i], p.x.scale) && drawable(s.y[i], p.y.scale)) out.push_back({s.x[i], s.y[i]});
  return out;
}

// A short sample of a legend entry at (x, y): its line and/or marker.
void legend_sample(std::string& o, const LegendEntry& e, double x, double y) {
  const std::string c = escape(e.color);
  if (e.line)
    o += "<line x1=\"" + px(x) + "\" y1=\"" + px(y) + "\" x2=\"" + px(x + 22) + "\" y2=\"" + px(y) +
         "\" stroke=\"" + c + "\" stroke-width=\"2\"" + (e.dashed ? " stroke-dasharray=\"5 3\"" : "") + "/>\n";
  if (e.marker)
    o += "<circle cx=\"" + px(x + 11) + "\" cy=\"" + px(y) + "\" r=\"4\" fill=\"" + c + "\"/>\n";
}

double legend_entry_width(const LegendEntry& e) { return 30 + kCharWidth * double(e.text.size()) + 18; }

void render_panel(std::string& o, const Panel& p, double ox, double oy, double w, double h) {
  o += "<g transform=\"translate(" + px(ox) + "," + px(oy) + ")\">\n";
  const double L = kMarginLeft, R = w - kMarginRight, T = kMarginTop, B = h - kMarginBottom;
  if (!p.title.empty())
    o += "<text x=\"" + px(L) + "\" y=\"16\" font-size=\"13\" font-weight=\"bold\">" + escape(p.title) + "</text>\n";

  // Data ranges over every drawable point of every series.
  const double inf = std::numeric_limits<double>::infinity();
  double xmin = inf, xmax = -inf, ymin = inf, ymax = -inf;
  std::vector<std::vector<Point>> pts;
  for (const Series& s : p.series) {
    pts.push_back(points_of(s, p));
    for (const Point& q : pts.back()) {
      xmin = std::min(xmin, q.x);
      xmax = std::max(xmax, q.x);
      ymin = std::min(ymin, q.y);
      ymax = std::max(ymax, q.y);
    }
  }
  const Ticks xt = axis_ticks(p.x, xmin, xmax), yt = axis_ticks(p.y, ymin, ymax);
  const Mapping X{xt.lo, xt.hi, L, R, p.x.scale}, Y{yt.lo, yt.hi, B, T, p.y.scale};

  for (double v : yt.values) {
    const double y = Y(v);
    o += "<line x1=\"" + px(L) + "\" y1=\"" + px(y) + "\" x2=\"" + px(R) + "\" y2=\"" + px(y) +
         "\" stroke=\"#ddd\"/>\n<text x=\"" + px(L - 6) + "\" y=\"" + px(y + 4) +
         "\" text-anchor=\"end\">" + escape(tick_label(v, yt.step, p.y.format)) + "</text>\n";
  }
  for (double v : xt.values) {
    const double x = X(v);
    o += "<line x1=\"" + px(x) + "\" y1=\"" + px(B) + "\" x2=\"" + px(x) + "\" y2=\"" + px(B + 4) +
         "\" stroke=\"black\"/>\n<text x=\"" + px(x) + "\" y=\"" + px(B + 17) +
         "\" text-anchor=\"middle\">" + escape(tick_label(v, xt.step, p.x.format)) + "</text>\n";
  }
  o += "<line x1=\"" + px(L) + "\" y1=\"" + px(B) + "\" x2=\"" + px(R) + "\" y2=\"" + px(B) +
       "\" stroke=\"black\"/>\n<line x1=\"" + px(L) + "\" y1=\"" + px(T) + "\" x2=\"" + px(L) +
       "\" y2=\"" + px(B) + "\" stroke=\"black\"/>\n";
  if (!p.x.label.empty())
    o += "<text x=\"" + px((L + R) / 2) + "\" y=\"" + px(B + 34) + "\" text-anchor=\"middle\">" +
         escape(p.x.label) + "</text>\n";
  if (!p.y.label.empty()) {
    const std::string cy = px((T + B) / 2);
    o += "<text x=\"14\" y=\"" + cy + "\" transform=\"rotate(-90 14 " + cy + ")\" text-anchor=\"middle\">" +
         escape(p.y.label) + "</text>\n";
  }

  bool any = false;
  for (size_t i = 0; i < p.series.size(); ++i) {
    const Series& s = p.series[i];
    const std::vector<Point>& q = pts[i];
    if (q.empty()) continue;
    any = true;
    const std::string c = escape(s.color), name = escape(s.name);
    if (s.line) {
      o += "<polyline points=\"";
      for (size_t k = 0; k < q.size(); ++k) {
        if (k) o += ' ';
        o += px(X(q[k].x));
        o += ',';
        o += px(Y(q[k].y));
      }
      o += "\" fill=\"none\" stroke=\"" + c + "\" stroke-width=\"1.5\" stroke-linejoin=\"round\"" +
           (s.dashed ? " stroke-dasharray=\"5 3\"" : "") + "><title>" + name + "</title></polyline>\n";
    }
    if (s.markers || q.size() == 1) {
      o += "<g fill=\"" + c + "\"><title>" + name + "</title>";
      for (const Point& r : q)
        o += "<circle cx=\"" + px(X(r.x)) + "\" cy=\"" + px(Y(r.y)) + "\" r=\"" + px(s.marker_radius) + "\"/>";
      o += "</g>\n";
    }
    if (!s.label.empty())
      o += "<text x=\"" + px(X(q.back().x)) + "\" y=\"" + px(Y(q.back().y) - s.label_dy) + "\" fill=\"" + c +
           "\" font-weight=\"bold\" text-anchor=\"middle\">" + escape(s.label) + "</text>\n";
  }
  if (!any && !p.empty_note.empty())
    o += "<text x=\"" + px((L + R) / 2) + "\" y=\"" + px((T + B) / 2) +
         "\" text-anchor=\"middle\" fill=\"#888\">" + escape(p.empty_note) + "</text>\n";
  o += "</g>\n";
}

}  // namespace

std::string render_svg(const Figure& f) {
  const int columns = std::max(1, f.columns);
  const int rows = int((f.panels.size() + size_t(columns) - 1) / size_t(columns));
  const double width = 2 * kPad + columns * f.panel_width;

  // Legend rows under the title: entries flow left to right and wrap.
  std::vector<std::vector<size_t>> legend_rows;
  if (!f.legend_below) {
    double x = 0;
    for (size_t i = 0; i < f.legend.size(); ++i) {
      const double ew = legend_entry_width(f.legend[i]);
      if (legend_rows.empty() || (x + ew > width - 2 * kPad && x > 0)) {
        legend_rows.emplace_back();
        x = 0;
      }
      legend_rows.back().push_back(i);
      x += ew;
    }
  }
  double y = 30;  // baseline of the title
  const double subtitle_y = y + 20;
  if (!f.subtitle.empty()) y = subtitle_y;
  const double legend_top = y + 12;
  const double panels_top = legend_top + kLegendRow * double(legend_rows.size()) + 6;
  const double panels_bottom = panels_top + rows * f.panel_height;
  const double below = f.legend_below ? kLegendRow * double(f.legend.size()) + 10 : 0;
  const double height = panels_bottom + below + kPad;

  std::string o;
  o += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fmt("%.0f", width) + "\" height=\"" +
       fmt("%.0f", height) + "\" viewBox=\"0 0 " + fmt("%.0f", width) + " " + fmt("%.0f", height) +
       "\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!f.title.empty())
    o += "<text x=\"" + px(kPad + kMarginLeft) + "\" y=\"30\" font-size=\"16\">" + escape(f.title) + "</text>\n";
  if (!f.subtitle.empty())
    o += "<text x=\"" + px(kPad + kMarginLeft) + "\" y=\"" + px(subtitle_y) + "\" fill=\"#555\">" +
         escape(f.subtitle) + "</text>\n";
  for (size_t r = 0; r < legend_rows.size(); ++r) {
    double x = kPad + kMarginLeft;
    const double ly = legend_top + kLegendRow * double(r) + kLegendRow / 2;
    for (size_t i : legend_rows[r]) {
      const LegendEntry& e = f.legend[i];
      legend_sample(o, e, x, ly - 4);
      o += "<text x=\"" + px(x + 28) + "\" y=\"" + px(ly) + "\">" + escape(e.text) + "</text>\n";
      x += legend_entry_width(e);
    }
  }
  for (size_t i = 0; i < f.panels.size(); ++i) {
    const double ox = kPad + double(i % size_t(columns)) * f.panel_width;
    const double oy = panels_top + double(i / size_t(columns)) * f.panel_height;
    render_panel(o, f.panels[i], ox, oy, f.panel_width, f.panel_height);
  }
  if (f.legend_below) {
    for (size_t i = 0; i < f.legend.size(); ++i) {
      const LegendEntry& e = f.legend[i];
      const double ly = panels_bottom + 10 + kLegendRow * double(i) + kLegendRow / 2;
      legend_sample(o, e, kPad + kMarginLeft, ly - 4);
      o += "<text x=\"" + px(kPad + kMarginLeft + 28) + "\" y=\"" + px(ly) + "\">" + escape(e.text) + "</text>\n";
    }
  }
  o += "</svg>\n";
  return o;
}

}  // namespace strata::chart
