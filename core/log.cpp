// core/log.cpp — the logger behind core/log.h.
#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

namespace strata {
namespace {

LogLevel level_from_env() {
  const char* e = std::getenv("STRATA_LOG");
  if (!e) return LogLevel::info;
  if (!std::strcmp(e, "error")) return LogLevel::error;
  if (!std::strcmp(e, "warn")) return LogLevel::warn;
  if (!std::strcmp(e, "debug")) return LogLevel::debug;
  return LogLevel::info;
}

std::atomic<int>& level_ref() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}
std::atomic<int> g_rank{-1};
std::mutex g_mutex;

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_ref().load()); }
void set_log_level(LogLevel l) { level_ref().store(static_cast<int>(l)); }
void set_log_rank(int rank) { g_rank.store(rank); }
bool log_enabled(LogLevel l) { return static_cast<int>(l) <= level_ref().load(); }

void log_line(LogLevel level, std::string_view component, const std::string& msg) noexcept {
  static const char kTag[] = {'E', 'W', 'I', 'D'};
  try {
    std::lock_guard<std::mutex> lock(g_mutex);
    int rank = g_rank.load();
    if (rank >= 0)
      std::fprintf(stderr, "[strata %c r%d] %.*s: %s\n", kTag[static_cast<int>(level)], rank,
                   static_cast<int>(component.size()), component.data(), msg.c_str());
    else
      std::fprintf(stderr, "[strata %c] %.*s: %s\n", kTag[static_cast<int>(level)],
                   static_cast<int>(component.size()), component.data(), msg.c_str());
  } catch (...) {
  }
}

bool first_time(std::string_view key) {
  static std::mutex m;
  static std::set<std::string, std::less<>> seen;
  std::lock_guard<std::mutex> lock(m);
  return seen.emplace(key).second;
}

}  // namespace strata
