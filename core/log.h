// core/log.h — leveled logging to stderr, thread-safe, one line per message.
//
// The level comes from STRATA_LOG (error|warn|info|debug; default info) or set_log_level().
// log_warn_once(key, ...) prints a warning the first time `key` is seen (e.g. a backend fallback).
// Logging never throws.
#pragma once

#include <string>
#include <string_view>

#include "core/error.h"

namespace strata {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);
void set_log_rank(int rank);  // prefixes lines with the rank in multi-process runs (-1: none)
void log_line(LogLevel level, std::string_view component, const std::string& msg) noexcept;
bool log_enabled(LogLevel level);

template <class... A>
void log_error(std::string_view component, const A&... a) {
  if (log_enabled(LogLevel::error)) log_line(LogLevel::error, component, str(a...));
}
template <class... A>
void log_warn(std::string_view component, const A&... a) {
  if (log_enabled(LogLevel::warn)) log_line(LogLevel::warn, component, str(a...));
}
template <class... A>
void log_info(std::string_view component, const A&... a) {
  if (log_enabled(LogLevel::info)) log_line(LogLevel::info, component, str(a...));
}
template <class... A>
void log_debug(std::string_view component, const A&... a) {
  if (log_enabled(LogLevel::debug)) log_line(LogLevel::debug, component, str(a...));
}

bool first_time(std::string_view key);  // true exactly once per key per process
template <class... A>
void log_warn_once(std::string_view key, std::string_view component, const A&... a) {
  if (first_time(key)) log_warn(component, a...);
}

}  // namespace strata
