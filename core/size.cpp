// core/size.cpp — parse_bytes / format_bytes, and the error of the checked size arithmetic.
#include "core/size.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace strata {

uint64_t parse_bytes(std::string_view text, std::string_view what) {
  auto bad = [&](const char* why) -> uint64_t {
    fail("core::parse_bytes", str(what, " '", text, "' is not a size: ", why),
         "write a byte count with an optional binary suffix, e.g. 4096, 512K, 64M, 2G, 1.5T");
  };
  std::string_view s = text;
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  if (s.empty()) return bad("empty");
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return bad("no number");
  std::string number(s.substr(0, i));
  std::string_view suffix = s.substr(i);
  while (!suffix.empty() && suffix.front() == ' ') suffix.remove_prefix(1);
  std::string suf;
  for (char c : suffix) suf += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suf.size() >= 3 && suf.substr(suf.size() - 2) == "IB") suf.resize(suf.size() - 2);  // KiB
  else if (suf.size() >= 2 && suf.back() == 'B') suf.pop_back();
  else if (suf == "B") suf.clear();
  uint64_t mult = 1;
  if (suf.empty()) mult = 1;
  else if (suf == "K") mult = KiB;
  else if (suf == "M") mult = MiB;
  else if (suf == "G") mult = GiB;
  else if (suf == "T") mult = TiB;
  else return bad("unknown suffix");
  if (number.find('.') == std::string::npos) {
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (ec != std::errc() || p != number.data() + number.size()) return bad("bad number");
    if (v != 0 && mult > UINT64_MAX / v) return bad("too large");
    return v * mult;
  }
  char* end = nullptr;
  double d = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(d)) return bad("bad number");
  double bytes = d * static_cast<double>(mult);
  if (bytes >= 1.8e19) return bad("too large");
  if (bytes != std::floor(bytes)) return bad("not a whole number of bytes");
  return static_cast<uint64_t>(bytes);
}

std::string format_bytes(uint64_t bytes) {
  static const char* kSuffix[] = {"", "K", "M", "G", "T"};
  int k = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024.0 && k < 4) {
    v /= 1024.0;
    ++k;
  }
  if (k == 0) return std::to_string(bytes);
  char buf[32];
  if (v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f%s", v, kSuffix[k]);
  else if (v * 10 == std::floor(v * 10)) std::snprintf(buf, sizeof buf, "%.1f%s", v, kSuffix[k]);
  else std::snprintf(buf, sizeof buf, "%.2f%s", v, kSuffix[k]);
  return buf;
}

namespace detail {

void size_overflow(std::string_view what, std::string_view op, std::string a, std::string b,
                   bool is_signed, int bits) {
  fail("core::size",
       str(what, ": ", a, op, b, " does not fit in ", is_signed ? "int" : "uint", bits),
       "the shape or size is larger than strata supports; check the value for a typo");
}

}  // namespace detail
}  // namespace strata
