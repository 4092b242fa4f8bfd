// core/cpu.h — what the CPU this process runs on can execute, read once with cpuid/xgetbv.
//
// An ISA counts as present only when both the CPU reports it and the OS saves its register state
// (XCR0), so a kernel chosen from these flags never faults. Also: the model name, the number of
// hardware threads, the machine's RAM, and where the machine's CPU time went (/proc/stat).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace strata {

struct CpuFeatures {
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512bf16 = false;
  std::string model;

  bool has_avx2_fma() const { return avx2 && fma; }
  bool has_avx512() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  std::string describe() const;  // "avx2 fma avx512f ..."
};

const CpuFeatures& cpu_features();
int hardware_threads();            // logical CPUs this process may run on (sched affinity)
uint64_t physical_memory_bytes();  // MemTotal
uint64_t available_memory_bytes(); // MemAvailable
uint64_t current_rss_bytes();      // this process's resident set
uint64_t peak_rss_bytes();         // this process's peak resident set (VmHWM)

// CPU time in seconds since boot: the machine's, summed over all its CPUs by kind (the first
// line of /proc/stat), and this process's own (user + system, getrusage). Two readings bound a
// span of wall time; their difference says where the machine's CPU time went in it. Steal is
// time a hypervisor ran something else on a virtual CPU that was ready to run (on a VM: other
// guests, or the host's own work such as emulating this guest's disk).
struct CpuTimes {
  double busy_s = 0;     // user + nice + system + irq + softirq
  double idle_s = 0;     // idle + iowait
  double steal_s = 0;
  double process_s = 0;  // this process, user + system
  bool machine = false;  // the machine's fields were read (Linux /proc/stat)

  double total_s() const { return busy_s + idle_s + steal_s; }
  // This process's CPU seconds per second of wall_s (a difference's): the cores it kept busy.
  double process_cores(double wall_s) const { return wall_s > 0 ? process_s / wall_s : 0.0; }
  // part_s (busy_s, idle_s or steal_s of a difference) as a share of the machine's time;
  // nullopt when the machine's fields were not read or no time passed.
  std::optional<double> share(double part_s) const {
    if (!machine || !(total_s() > 0)) return std::nullopt;
    return part_s / total_s();
  }
  CpuTimes operator-(const CpuTimes& earlier) const;
};
CpuTimes cpu_times();
// The machine's fields from /proc/stat's text (its "cpu " line; USER_HZ ticks); for tests.
CpuTimes parse_proc_stat(const std::string& text);

}  // namespace strata
