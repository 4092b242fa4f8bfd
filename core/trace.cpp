// core/trace.cpp — the span store behind core/trace.h.
#include "core/trace.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "core/error.h"

namespace strata {
namespace {

struct Span {
  int track;
  std::string name;
  int64_t start_us;
  int64_t dur_us;
  int64_t bytes;  // -1: none
};

struct Store {
  std::mutex m;
  std::map<std::string, int, std::less<>> tracks;
  std::vector<Span> spans;
};

std::atomic<bool> g_on{false};
Store& store() {
  static Store s;
  return s;
}

void json_escape(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
}

}  // namespace

bool trace_enabled() { return g_on.load(std::memory_order_relaxed); }
void trace_enable(bool on) { g_on.store(on); }

int64_t trace_now_us() {
  using namespace std::chrono;
  return duration_cast<microseconds>(steady_clock::now().time_since_epoch()).count();
}

namespace {

void record(std::string_view track, std::string_view name, int64_t start_us, int64_t dur_us,
            int64_t bytes) {
  if (!trace_enabled()) return;
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.m);
  auto it = s.tracks.find(track);
  if (it == s.tracks.end()) it = s.tracks.emplace(std::string(track), int(s.tracks.size()) + 1).first;
  s.spans.push_back(Span{it->second, std::string(name), start_us, dur_us, bytes});
}

}  // namespace

void trace_span(std::string_view track, std::string_view name, int64_t start_us, int64_t dur_us) {
  record(track, name, start_us, dur_us, -1);
}

void trace_span(std::string_view track, std::string_view name, int64_t start_us, int64_t dur_us,
                uint64_t bytes) {
  record(track, name, start_us, dur_us, int64_t(bytes));
}

void trace_clear() {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.m);
  s.spans.clear();
}

void trace_write(const std::string& path, int pid) {
  Store& s = store();
  std::string out = "{\"traceEvents\":[\n";
  {
    std::lock_guard<std::mutex> lock(s.m);
    std::vector<const Span*> order;
    for (auto& sp : s.spans) order.push_back(&sp);
    std::sort(order.begin(), order.end(),
              [](const Span* a, const Span* b) { return a->start_us < b->start_us; });
    int64_t t0 = order.empty() ? 0 : order.front()->start_us;
    bool first = true;
    for (auto& [name, tid] : s.tracks) {
      out += first ? "" : ",\n";
      first = false;
      out += str("{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", pid, ",\"tid\":", tid,
                 ",\"args\":{\"name\":\"");
      json_escape(out, name);
      out += "\"}}";
    }
    for (const Span* sp : order) {
      out += first ? "" : ",\n";
      first = false;
      out += str("{\"ph\":\"X\",\"pid\":", pid, ",\"tid\":", sp->track, ",\"ts\":", sp->start_us - t0,
                 ",\"dur\":", sp->dur_us, ",\"name\":\"");
      json_escape(out, sp->name);
      out += sp->bytes >= 0 ? str("\",\"args\":{\"bytes\":", sp->bytes, "}}") : std::string("\"}");
    }
  }
  out += "\n]}\n";
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) fail("trace::write", str("cannot open '", tmp, "' for writing: ", detail::errno_text(errno)));
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("trace::write", str("cannot write trace '", path, "': ", detail::errno_text(errno)));
}

}  // namespace strata
