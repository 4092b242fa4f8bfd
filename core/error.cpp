// core/error.cpp — formatting of Error messages and the slow paths of the check macros.
#include "core/error.h"

#include <cstring>

namespace strata {
namespace {

std::string compose(const std::string& where, const std::string& what,
                    const std::vector<std::string>& hints) {
  std::string out;
  out.reserve(where.size() + what.size() + 3);
  out.append("[").append(where).append("] ").append(what);
  for (const auto& h : hints) {
    if (!h.empty()) out.append("\nhint: ").append(h);
  }
  return out;
}

}  // namespace

Error::Error(std::string where, std::string what, std::vector<std::string> hints)
    : std::runtime_error(compose(where, what, hints)),
      where_(std::move(where)),
      what_(std::move(what)),
      hints_(std::move(hints)) {}

void fail(std::string where, std::string what, std::string hint) {
  std::vector<std::string> hints;
  if (!hint.empty()) hints.push_back(std::move(hint));
  throw Error(std::move(where), std::move(what), std::move(hints));
}

namespace detail {

void check_failed(const char* where, const char* cond, const char* file, int line,
                  const std::string& msg) {
  std::string what = msg.empty() ? std::string("check failed") : msg;
  what += str(" (check `", cond, "` at ", file, ":", line, ")");
  throw Error(where, std::move(what));
}

void api_failed(const char* api, const char* stmt, const char* file, int line, long code,
                const char* text) {
  throw Error(str(api, "::call"),
              str(stmt, " failed: ", text ? text : "unknown error", " (code ", code, ") at ",
                  file, ":", line));
}

const char* errno_text(int err) noexcept {
  // strerrordesc_np is thread-safe and returns a static string (glibc >= 2.32).
  const char* s = strerrordesc_np(err);
  return s ? s : "unknown errno";
}

}  // namespace detail
}  // namespace strata
