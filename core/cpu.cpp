// core/cpu.cpp — cpuid/xgetbv feature detection and /proc readings.
#include "core/cpu.h"

#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace strata {
namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  f.sse42 = c & bit_SSE4_2;
  bool osxsave = c & bit_OSXSAVE;
  bool cpu_avx = c & bit_AVX;
  f.fma = c & bit_FMA;
  f.f16c = c & bit_F16C;
  uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  bool os_avx = (xcr0 & 0x6) == 0x6;           // XMM and YMM state
  bool os_avx512 = (xcr0 & 0xe6) == 0xe6;      // plus opmask, ZMM_Hi256, Hi16_ZMM
  f.avx = cpu_avx && os_avx;
  f.fma = f.fma && f.avx;
  f.f16c = f.f16c && f.avx;
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = f.avx && (b & bit_AVX2);
    f.avx512f = os_avx512 && (b & bit_AVX512F);
    f.avx512dq = f.avx512f && (b & bit_AVX512DQ);
    f.avx512bw = f.avx512f && (b & bit_AVX512BW);
    f.avx512vl = f.avx512f && (b & bit_AVX512VL);
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = f.avx512f && (a & (1u << 5));
  }
  char brand[49] = {0};
  if (unsigned(__get_cpuid_max(0x80000000, nullptr)) >= 0x80000004u) {  // (int in clang)
    for (unsigned i = 0; i < 3; ++i) {
      __get_cpuid(0x80000002 + i, &a, &b, &c, &d);
      std::memcpy(brand + 16 * i + 0, &a, 4);
      std::memcpy(brand + 16 * i + 4, &b, 4);
      std::memcpy(brand + 16 * i + 8, &c, 4);
      std::memcpy(brand + 16 * i + 12, &d, 4);
    }
  }
  f.model = brand;
  while (!f.model.empty() && f.model.back() == ' ') f.model.pop_back();
  while (!f.model.empty() && f.model.front() == ' ') f.model.erase(f.model.begin());
#endif
  return f;
}

// The number on the line "key: N kB" of a /proc file (/proc/meminfo, /proc/self/status); 0 when
// the file or the line is missing.
uint64_t proc_kb(const char* file, const char* key) {
  std::ifstream in(file);
  std::string line;
  size_t n = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
      return std::stoull(line.substr(n + 1));
    }
  }
  return 0;
}

}  // namespace

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(sse42, "sse4.2");
  add(avx, "avx");
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512dq, "avx512dq");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512bf16, "avx512bf16");
  return s.empty() ? "baseline" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

int hardware_threads() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

uint64_t physical_memory_bytes() { return proc_kb("/proc/meminfo", "MemTotal") * 1024; }
uint64_t available_memory_bytes() { return proc_kb("/proc/meminfo", "MemAvailable") * 1024; }
uint64_t current_rss_bytes() { return proc_kb("/proc/self/status", "VmRSS") * 1024; }
uint64_t peak_rss_bytes() { return proc_kb("/proc/self/status", "VmHWM") * 1024; }

CpuTimes CpuTimes::operator-(const CpuTimes& e) const {
  CpuTimes d;
  d.busy_s = busy_s - e.busy_s;
  d.idle_s = idle_s - e.idle_s;
  d.steal_s = steal_s - e.steal_s;
  d.process_s = process_s - e.process_s;
  d.machine = machine && e.machine;
  return d;
}

CpuTimes parse_proc_stat(const std::string& text) {
  CpuTimes t;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu ", 0) != 0) continue;
    // user nice system idle iowait irq softirq steal [guest guest_nice: already in user, nice]
    std::istringstream f(line.substr(4));
    double v[8] = {};
    int n = 0;
    while (n < 8 && (f >> v[n])) ++n;
    if (n < 4) return t;  // not the format documented in proc(5)
    static const double hz = [] {
      const long h = sysconf(_SC_CLK_TCK);
      return h > 0 ? double(h) : 100.0;
    }();
    t.busy_s = (v[0] + v[1] + v[2] + v[5] + v[6]) / hz;
    t.idle_s = (v[3] + v[4]) / hz;
    t.steal_s = v[7] / hz;
    t.machine = true;
    return t;
  }
  return t;
}

CpuTimes cpu_times() {
  CpuTimes t;
  std::ifstream f("/proc/stat");
  if (f) {
    std::string first;
    std::getline(f, first);
    t = parse_proc_stat(first);
  }
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0)
    t.process_s = double(u.ru_utime.tv_sec) + double(u.ru_stime.tv_sec) +
                  1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  return t;
}

}  // namespace strata
