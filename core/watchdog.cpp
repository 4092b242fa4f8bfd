// core/watchdog.cpp — the registry of waits in progress and the monitor thread that ends the job
// when one outlasts the timeout.
//
// The state is leaked on purpose: the monitor thread is detached and may run while static
// destructors do; a heap object that is never freed is safe for both.
#include "core/watchdog.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace strata {

using Clock = std::chrono::steady_clock;

struct WatchedWait::Entry {
  std::string what;
  WaitKind kind;
  std::string context;
  std::shared_ptr<std::function<std::string()>> diagnose;  // shared: a report may outlive the wait
  Clock::time_point since;
};

namespace {

constexpr double kDiagnoseBound_s = 5.0;  // a diagnose hook that blocks longer is given up on

void default_handler(const std::string& report) {
  std::fprintf(stderr, "%s\n", report.c_str());
  std::fflush(stderr);
  std::abort();
}

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::list<WatchedWait::Entry> waits;
  double timeout_s = 600;
  bool monitor_started = false;
  bool fired = false;
  WatchdogHandler handler = &default_handler;
  // context
  std::mutex ctx_mu;
  int64_t step = -1;
  std::string phase, unit;
};

State& state() {
  static State* s = new State;
  return *s;
}

const char* kind_name(WaitKind k) {
  switch (k) {
    case WaitKind::collective: return "collective";
    case WaitKind::stream: return "stream";
    case WaitKind::io: return "io";
    case WaitKind::host: return "host";
  }
  return "?";
}

// Runs a diagnose hook on a thread of its own, giving up after kDiagnoseBound_s (the hook may
// block on the very peer that stopped responding).
std::string bounded_diagnose(const std::shared_ptr<std::function<std::string()>>& fn) {
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> f = result->get_future();
  std::thread([fn, result] {
    try {
      result->set_value((*fn)());
    } catch (const std::exception& e) {
      result->set_value(str("(diagnosis failed: ", e.what(), ")"));
    }
  }).detach();
  if (f.wait_for(std::chrono::duration<double>(kDiagnoseBound_s)) != std::future_status::ready)
    return str("(no answer from the other ranks within ", kDiagnoseBound_s, " s)");
  return f.get();
}

std::string build_report(double older_than_s) {
  State& st = state();
  struct Copy {
    std::string what, context;
    WaitKind kind;
    std::shared_ptr<std::function<std::string()>> diagnose;
    double age_s;
  };
  std::vector<Copy> waits;
  const auto now = Clock::now();
  double oldest = 0, timeout = 0;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    timeout = st.timeout_s;
    for (const auto& e : st.waits) {
      double age = std::chrono::duration<double>(now - e.since).count();
      oldest = std::max(oldest, age);
      waits.push_back(Copy{e.what, e.context, e.kind, e.diagnose, age});
    }
  }
  if (waits.empty() || oldest < older_than_s) return {};
  std::stable_sort(waits.begin(), waits.end(), [](const Copy& a, const Copy& b) {
    if (a.kind != b.kind) return int(a.kind) < int(b.kind);
    return a.age_s > b.age_s;
  });
  std::string r = str("[watchdog] no progress for ", int(oldest), " s (parallel.timeout = ", timeout,
                      " s); ", waits.size(), " wait(s) in progress:");
  size_t shown = 0;
  for (const auto& w : waits) {
    if (++shown > 8) {
      r += str("\n  ... and ", waits.size() - 8, " more");
      break;
    }
    r += str("\n  ", kind_name(w.kind), ": ", w.what);
    if (!w.context.empty()) r += str(" (", w.context, ")");
    r += str(", waiting for ", int(w.age_s), " s");
    if (w.diagnose) r += str("; ", bounded_diagnose(w.diagnose));
  }
  r += "\nhint: a rank stopped responding, or failed without ending the job; if an operation "
       "really takes this long, raise parallel.timeout";
  return r;
}

void monitor() {
  State& st = state();
  std::unique_lock<std::mutex> lock(st.mu);
  for (;;) {
    const double period = std::clamp(st.timeout_s / 4, 0.01, 1.0);
    st.cv.wait_for(lock, std::chrono::duration<double>(period));
    if (st.fired || st.waits.empty()) continue;
    const auto now = Clock::now();
    bool expired = false;
    for (const auto& e : st.waits)
      if (std::chrono::duration<double>(now - e.since).count() > st.timeout_s) expired = true;
    if (!expired) continue;
    st.fired = true;
    const double timeout = st.timeout_s;
    WatchdogHandler handler = st.handler;
    lock.unlock();
    std::string report = build_report(timeout);
    if (report.empty()) report = "[watchdog] a wait outlasted parallel.timeout (it ended while reported)";
    handler(report);
    std::abort();  // a handler must not return
  }
}

}  // namespace

WatchedWait::WatchedWait(std::string what, WaitKind kind, std::string context,
                         std::function<std::string()> diagnose) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.monitor_started) {
    std::thread(monitor).detach();
    st.monitor_started = true;
  }
  st.waits.push_front(Entry{std::move(what), kind, std::move(context),
                            diagnose ? std::make_shared<std::function<std::string()>>(std::move(diagnose))
                                     : nullptr,
                            Clock::now()});
  it_ = st.waits.begin();
}

WatchedWait::~WatchedWait() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.waits.erase(it_);
}

void watchdog_set_timeout(double seconds) {
  if (!(seconds > 0))
    fail("watchdog::set_timeout", str("timeout ", seconds, " s is not positive"),
         "set parallel.timeout to a number of seconds, e.g. 600");
  State& st = state();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.timeout_s = seconds;
  }
  st.cv.notify_all();
}

double watchdog_timeout() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.timeout_s;
}

void watchdog_set_step(int64_t step) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.ctx_mu);
  st.step = step;
}

void watchdog_set_phase(std::string_view phase) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.ctx_mu);
  st.phase.assign(phase);
}

void watchdog_set_unit(std::string_view unit) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.ctx_mu);
  st.unit.assign(unit);
}

std::string watchdog_context() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.ctx_mu);
  std::string c;
  if (st.step >= 0) c = str("step ", st.step);
  if (!st.phase.empty()) c += str(c.empty() ? "" : ", ", st.phase);
  if (!st.unit.empty()) c += str(c.empty() ? "" : ", ", "unit ", st.unit);
  return c;
}

void watchdog_set_handler(WatchdogHandler handler) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.handler = handler ? handler : &default_handler;
}

std::string watchdog_report_now(double older_than_s) { return build_report(older_than_s); }

}  // namespace strata
