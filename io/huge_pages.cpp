// io/huge_pages.cpp — HugePageBuffer (hugetlb → thp → 4 KiB pages) and huge_page_system().
//
// Every kind is an anonymous private mapping, so the destructor is one munmap whatever was
// obtained. MADV_DONTFORK: a child process (fork) gets none of it, so a write in the parent
// never has to copy a page that the device or io_uring holds pinned (as RDMA stacks do). Pages are faulted in at allocation (MAP_POPULATE for hugetlb, MADV_POPULATE_WRITE
// or a touch per page otherwise): the first transfer and the io_uring registration then find
// them present, and a THP mapping gets its huge pages before anything else fragments memory.
#include "io/huge_pages.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/size.h"
#include "io/backend.h"

#ifndef MAP_HUGE_SHIFT
#define MAP_HUGE_SHIFT 26
#endif
#ifndef MAP_HUGE_2MB
#define MAP_HUGE_2MB (21 << MAP_HUGE_SHIFT)
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace strata {
namespace {

constexpr size_t kSmallPage = 4096;

uint64_t read_u64(const std::string& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  return in >> v ? v : 0;
}

// "always [madvise] never" -> "madvise"; "" when the file is absent (no THP in this kernel).
std::string bracketed(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return {};
  auto a = line.find('['), b = line.find(']');
  return a != std::string::npos && b != std::string::npos && b > a ? line.substr(a + 1, b - a - 1)
                                                                   : std::string{};
}

void fault_in(std::byte* p, size_t n) {
  if (::madvise(p, n, MADV_POPULATE_WRITE) == 0) return;
  for (size_t at = 0; at < n; at += kSmallPage) *reinterpret_cast<volatile char*>(p + at) = 0;
}

// AnonHugePages of the mappings that overlap [p, p + n), each capped at its overlap.
size_t anon_huge_bytes(const std::byte* p, size_t n) {
  std::ifstream in("/proc/self/smaps");
  const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + n;
  std::string line;
  size_t total = 0, overlap = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const size_t dash = line.find('-');
    const size_t sp = line.find(' ');
    if (dash != std::string::npos && sp != std::string::npos && dash < sp &&
        std::isxdigit(static_cast<unsigned char>(line[0]))) {
      uintptr_t start = std::strtoull(line.substr(0, dash).c_str(), nullptr, 16);
      uintptr_t end = std::strtoull(line.substr(dash + 1, sp - dash - 1).c_str(), nullptr, 16);
      overlap = start < hi && lo < end ? std::min(hi, end) - std::max(lo, start) : 0;
      continue;
    }
    if (overlap && line.rfind("AnonHugePages:", 0) == 0) {
      std::istringstream fields(line.substr(14));
      size_t kib = 0;
      fields >> kib;
      total += std::min(kib * 1024, overlap);
    }
  }
  return std::min(total, n);
}

std::string hugetlb_refusal(int err) {
  const std::string base = "/sys/kernel/mm/hugepages/hugepages-2048kB/";
  const uint64_t total = read_u64(base + "nr_hugepages"), free = read_u64(base + "free_hugepages");
  return str("MAP_HUGETLB refused (", errno_string(err), "; ", free, " of ", total,
             " reserved 2 MiB pages free)");
}

}  // namespace

std::string_view page_kind_name(PageKind kind) {
  switch (kind) {
    case PageKind::hugetlb: return "hugetlb";
    case PageKind::thp: return "thp";
    case PageKind::none: return "none";
  }
  return "?";
}

HugePageBuffer::HugePageBuffer(size_t bytes, PageRequest request) : bytes_(bytes) {
  STRATA_CHECK(bytes > 0, "io::huge_pages", "a buffer of 0 bytes");
  const size_t huge = round_up(bytes, kHugePage);
  if (request == PageRequest::best) {
    void* p = ::mmap(nullptr, huge, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB | MAP_HUGE_2MB | MAP_POPULATE, -1, 0);
    if (p != MAP_FAILED) {
      data_ = static_cast<std::byte*>(p);
      mapped_ = huge_bytes_ = huge;
      kind_ = PageKind::hugetlb;
      ::madvise(data_, mapped_, MADV_DONTFORK);
      return;
    }
    why_ = hugetlb_refusal(errno);
  } else {
    why_ = request == PageRequest::thp ? "hugetlb not asked for" : "4 KiB pages asked for";
  }

  const std::string thp = bracketed("/sys/kernel/mm/transparent_hugepage/enabled");
  const bool try_thp = request != PageRequest::none && !thp.empty() && thp != "never";
  if (request != PageRequest::none && !try_thp)
    why_ += thp.empty() ? "; no transparent huge pages in this kernel"
                        : "; transparent huge pages are disabled (transparent_hugepage/enabled = never)";
  // An anonymous mapping with 2 MiB of slack, trimmed to a 2 MiB-aligned run (4 KiB pages need
  // no slack).
  const size_t align = try_thp ? kHugePage : kSmallPage;
  const size_t want = try_thp ? huge : round_up(bytes, kSmallPage);
  const size_t span = want + (align > kSmallPage ? align : 0);
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    fail("io::huge_pages", str("mmap of ", span, " bytes failed: ", errno_string(errno)),
         "the machine is out of memory or address space");
  auto* base = static_cast<std::byte*>(raw);
  auto* start = reinterpret_cast<std::byte*>(round_up(reinterpret_cast<uintptr_t>(base), align));
  if (start > base) ::munmap(base, size_t(start - base));
  if (std::byte* end = start + want; end < base + span) ::munmap(end, size_t(base + span - end));
  data_ = start;
  mapped_ = want;
  if (try_thp && ::madvise(data_, mapped_, MADV_HUGEPAGE) == 0) {
    kind_ = PageKind::thp;
  } else {
    if (try_thp) why_ += str("; madvise(MADV_HUGEPAGE) refused: ", errno_string(errno));
    if (request == PageRequest::none || thp == "always") ::madvise(data_, mapped_, MADV_NOHUGEPAGE);
    kind_ = PageKind::none;
  }
  ::madvise(data_, mapped_, MADV_DONTFORK);
  fault_in(data_, mapped_);
  if (kind_ == PageKind::thp) huge_bytes_ = anon_huge_bytes(data_, mapped_);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& o) noexcept { *this = std::move(o); }

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& o) noexcept {
  if (this != &o) {
    release();
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    kind_ = std::exchange(o.kind_, PageKind::none);
    why_ = std::move(o.why_);
    huge_bytes_ = std::exchange(o.huge_bytes_, 0);
  }
  return *this;
}

HugePageBuffer::~HugePageBuffer() { release(); }

void HugePageBuffer::release() noexcept {
  if (data_) ::munmap(data_, mapped_);
  data_ = nullptr;
  mapped_ = 0;
}

HugePageSystem huge_page_system() {
  HugePageSystem s;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    uint64_t value = 0;
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      if (fields >> key >> value && key == "Hugepagesize:") s.hugetlb_page_bytes = value * 1024;
    }
  }
  const std::string base = "/sys/kernel/mm/hugepages/hugepages-2048kB/";
  s.hugetlb_2m_total = read_u64(base + "nr_hugepages");
  s.hugetlb_2m_free = read_u64(base + "free_hugepages");
  s.thp_enabled = bracketed("/sys/kernel/mm/transparent_hugepage/enabled");
  s.thp_defrag = bracketed("/sys/kernel/mm/transparent_hugepage/defrag");
  rlimit rl{};
  if (::getrlimit(RLIMIT_MEMLOCK, &rl) == 0)
    s.memlock_limit_bytes = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : uint64_t(rl.rlim_cur);
  {
    std::ifstream in("/proc/self/status");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("CapEff:", 0) == 0) {
        const uint64_t caps = std::strtoull(line.substr(7).c_str(), nullptr, 16);
        s.ipc_lock = (caps >> 14) & 1;  // CAP_IPC_LOCK
      }
  }
  HugePageBuffer probe(HugePageBuffer::kHugePage);
  s.staging = probe.pages();
  s.staging_why = probe.why();
  return s;
}

}  // namespace strata
