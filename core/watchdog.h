// core/watchdog.h — every wait in strata has a bound. Code about to block on work another
// thread, stream or rank must finish (a collective inside MPI, a stream waiting for an event, the
// host waiting for a stream) holds a WatchedWait while it blocks; a monitor thread checks them,
// and when one has waited longer than the timeout (`parallel.timeout`) it writes one report — the
// waits in progress with what each is, where the engine was when it was issued (step, phase,
// unit) and, for collectives, which ranks never arrived — and ends the job through the installed
// handler (the communication layer installs MPI_Abort, with ncclCommAbort first): the role NCCL's
// watchdog plays in PyTorch. It does not interrupt or recover the blocked work; nothing can,
// safely. A WatchedWait costs a mutex and a list insertion: hold one only when about to block.
//
// Example:
//   WatchedWait w("all_gather of 4M f32 on 'dp'", WaitKind::collective, watchdog_context(),
//                 [=] { return who_did_not_arrive(); });
//   MPI_Allgather(...);  // if this never returns, the monitor reports w after the timeout
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <string_view>

namespace strata {

// Collectives are reported first: a stream or the host waiting on one is a consequence.
enum class WaitKind : uint8_t { collective, stream, io, host };

class WatchedWait {
 public:
  // what: the operation ("all_gather of 12K f32 on 'dp'"); context: where the engine was when it
  // was issued (watchdog_context() at enqueue time); diagnose: optional, called from the
  // monitor thread when the report is written (bounded in time there; it may block).
  WatchedWait(std::string what, WaitKind kind, std::string context = {},
              std::function<std::string()> diagnose = {});
  ~WatchedWait();
  WatchedWait(const WatchedWait&) = delete;
  WatchedWait& operator=(const WatchedWait&) = delete;

  struct Entry;

 private:
  std::list<Entry>::iterator it_;
};

// Seconds a wait may last before the job is ended (default 600). > 0.
void watchdog_set_timeout(double seconds);
double watchdog_timeout();

// Where the engine is, for the reports: "step 5, backward, unit block.2". The trainer sets the
// step and phase, the ZeRO engine the unit; each is cheap to set.
void watchdog_set_step(int64_t step);          // < 0: none
void watchdog_set_phase(std::string_view phase);
void watchdog_set_unit(std::string_view unit);
std::string watchdog_context();

// Ends the job with a report. Must not return; the default prints the report to stderr and
// calls std::abort().
using WatchdogHandler = void (*)(const std::string& report);
void watchdog_set_handler(WatchdogHandler handler);

// For tests: the report the monitor would write now if `older_than_s` were the timeout ("" when
// no wait is that old). Runs the diagnose hooks.
std::string watchdog_report_now(double older_than_s);

}  // namespace strata
