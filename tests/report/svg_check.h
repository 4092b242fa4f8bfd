// tests/report/svg_check.h — just enough SVG reading for the chart tests: is the markup
// well-formed (tags balanced and nested, attribute quotes paired, every '&' an entity), and which
// polylines it holds (tooltip text → number of points).
#pragma once

#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace strata::test {

// "" when well-formed, else what is wrong and where.
inline std::string svg_problem(const std::string& svg) {
  std::vector<std::string> open;
  size_t i = 0;
  while ((i = svg.find_first_of("<&", i)) != std::string::npos) {
    if (svg[i] == '&') {
      static const std::regex entity("&(amp|lt|gt|quot|apos|#[0-9]+);");
      std::smatch m;
      std::string rest = svg.substr(i, 8);
      if (!std::regex_search(rest, m, entity) || m.position(0) != 0) return "bare & at " + std::to_string(i);
      ++i;
      continue;
    }
    size_t end = svg.find('>', i);
    if (end == std::string::npos) return "unclosed tag at " + std::to_string(i);
    std::string tag = svg.substr(i + 1, end - i - 1);
    if (tag.find('<') != std::string::npos) return "'<' inside a tag at " + std::to_string(i);
    size_t quotes = 0;
    for (char c : tag) quotes += c == '"';
    if (quotes % 2) return "odd quotes in <" + tag + ">";
    if (tag.starts_with("?") || tag.starts_with("!")) {
    } else if (tag.starts_with("/")) {
      std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return "</" + name + "> closes " + (open.empty() ? "nothing" : open.back());
      open.pop_back();
    } else if (!tag.ends_with("/")) {
      open.push_back(tag.substr(0, tag.find_first_of(" \n\t")));
    }
    i = end + 1;
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  return "";
}

// Tooltip → points of each <polyline points="..."><title>TOOLTIP</title></polyline>; a tooltip
// that occurs twice is counted as -1 (a test wants one polyline per run per series).
inline std::map<std::string, int> polylines(const std::string& svg) {
  static const std::regex re("<polyline points=\"([^\"]*)\"[^>]*><title>([^<]*)</title></polyline>");
  std::map<std::string, int> out;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    std::istringstream points((*it)[1].str());
    int n = 0;
    for (std::string p; points >> p;) ++n;
    auto [at, fresh] = out.emplace((*it)[2].str(), n);
    if (!fresh) at->second = -1;
  }
  return out;
}

inline int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t i = text.find(what); i != std::string::npos; i = text.find(what, i + what.size())) ++n;
  return n;
}

}  // namespace strata::test
