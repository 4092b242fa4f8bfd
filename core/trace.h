// core/trace.h — a process-wide timeline recorder written as Chrome-trace / Perfetto JSON.
//
// Off by default and then nearly free (one relaxed atomic load). When on, streams and I/O
// queues record spans ("X" events) on named tracks (one per stream / queue); write_trace()
// emits {"traceEvents": [...]} with one thread id per track, ordered by start time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace strata {

bool trace_enabled();
void trace_enable(bool on);
int64_t trace_now_us();  // microseconds on a monotonic clock
void trace_span(std::string_view track, std::string_view name, int64_t start_us, int64_t dur_us);
// A span that moved `bytes` (an NVMe job): written as its "args": {"bytes": N}, for tools.
void trace_span(std::string_view track, std::string_view name, int64_t start_us, int64_t dur_us,
                uint64_t bytes);
// Writes the recorded spans (atomically: to PATH.tmp, then renamed) and keeps recording.
void trace_write(const std::string& path, int pid = 0);
void trace_clear();

}  // namespace strata
