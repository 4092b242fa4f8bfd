// io/huge_pages.h — host memory for I/O staging on 2 MiB pages, and what the system offers.
//
// HugePageBuffer tries, in order: explicit huge pages (mmap MAP_HUGETLB | MAP_HUGE_2MB, which
// succeeds only when the administrator reserved pages in /proc/sys/vm/nr_hugepages and enough
// are free), transparent huge pages (an anonymous mapping aligned to 2 MiB and madvise'd
// MADV_HUGEPAGE before its first touch), and plain 4 KiB pages. It says which it got (`pages()`)
// and why not a better kind (`why()`). With 2 MiB pages a 1 MiB O_DIRECT transfer is one
// physically contiguous segment, so the block layer sends the device large requests instead of
// splitting them at its segment limit (docs/io.md measures the difference).
// It does not pin the memory (io_uring's buffer registration and the device's pin_host do) and
// does not grow, share or reserve huge pages itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace strata {

enum class PageKind : uint8_t { none, thp, hugetlb };
std::string_view page_kind_name(PageKind kind);  // "none", "thp", "hugetlb"

// What to try: `best` is hugetlb, then thp, then none; `thp` skips hugetlb; `none` asks for 4 KiB
// pages (MADV_NOHUGEPAGE, so that THP "always" does not give huge pages anyway).
enum class PageRequest : uint8_t { best, thp, none };

class HugePageBuffer {
 public:
  static constexpr size_t kHugePage = size_t(2) << 20;

  HugePageBuffer() = default;
  // At least `bytes` (> 0), zero-filled and faulted in, aligned to 2 MiB (4 KiB for 4 KiB
  // pages). Throws strata::Error only when not even 4 KiB pages can be mapped.
  explicit HugePageBuffer(size_t bytes, PageRequest request = PageRequest::best);
  HugePageBuffer(HugePageBuffer&& o) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& o) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;
  ~HugePageBuffer();  // munmap; never throws

  std::byte* data() const { return data_; }
  size_t size() const { return bytes_; }           // as asked
  size_t mapped_bytes() const { return mapped_; }  // rounded up to the page size
  std::span<std::byte> span() const { return {data_, bytes_}; }
  PageKind pages() const { return kind_; }
  // Why not hugetlb (or, for 4 KiB pages, why not thp either); empty for hugetlb.
  const std::string& why() const { return why_; }
  // Bytes of the mapping backed by huge pages right after allocation: all of it for hugetlb; for
  // thp the kernel's AnonHugePages count of the mapping (/proc/self/smaps; it may have given
  // fewer under memory fragmentation); 0 for none.
  size_t huge_bytes() const { return huge_bytes_; }

 private:
  void release() noexcept;

  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;
  PageKind kind_ = PageKind::none;
  std::string why_;
  size_t huge_bytes_ = 0;
};

// The machine's huge pages, for `strata info` and the benchmarks' reports.
struct HugePageSystem {
  uint64_t hugetlb_page_bytes = 0;   // Hugepagesize in /proc/meminfo (the default size)
  uint64_t hugetlb_2m_total = 0;     // reserved 2 MiB pages (/sys/kernel/mm/hugepages/...)
  uint64_t hugetlb_2m_free = 0;      // of which free
  std::string thp_enabled;           // "always", "madvise" or "never" (the bracketed choice)
  std::string thp_defrag;
  uint64_t memlock_limit_bytes = 0;  // RLIMIT_MEMLOCK soft limit; UINT64_MAX when unlimited
  bool ipc_lock = false;             // CAP_IPC_LOCK: the limit does not apply to registrations
  PageKind staging = PageKind::none; // what a HugePageBuffer of 2 MiB gets now
  std::string staging_why;           // its why()
};
HugePageSystem huge_page_system();

}  // namespace strata
