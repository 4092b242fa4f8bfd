// core/cpu.cpp — cpuid/xgetbv feature detection and /proc readings.
#include "core/cpu.h"

#include <sched.h>
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
  if (__get_cpuid_max(0x80000000, nullptr) >= 0x80000004) {
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

uint64_t meminfo_kb(const char* key) {
  std::ifstream in("/proc/meminfo");
  std::string line;
  size_t n = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
      return std::stoull(line.substr(n + 1));
    }
  }
  return 0;
}

uint64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
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
    if (on) s += (s.empty() ? "" : " ") + std::string(name);
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

uint64_t physical_memory_bytes() { return meminfo_kb("MemTotal") * 1024; }
uint64_t available_memory_bytes() { return meminfo_kb("MemAvailable") * 1024; }
uint64_t current_rss_bytes() { return status_kb("VmRSS") * 1024; }
uint64_t peak_rss_bytes() { return status_kb("VmHWM") * 1024; }

}  // namespace strata
