// tests/io/test_huge_pages.cpp — HugePageBuffer: explicit huge pages where the system has them
// reserved, else a clean fallback to transparent huge pages or 4 KiB pages that says why; the
// memory is aligned, zeroed, writable, and unmapped by its owner. The refusal of MAP_HUGETLB is
// reproduced for real in a child process (a seccomp filter answers ENOMEM, as the kernel does
// when no reserved page is free), so the fallback is tested on machines with pages reserved too.
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "core/size.h"
#include "io/huge_pages.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

bool mapped(const void* p, size_t n) {
  std::vector<unsigned char> vec((n + 4095) / 4096);
  return ::mincore(const_cast<void*>(p), n, vec.data()) == 0;
}

bool all_zero_and_writable(std::byte* p, size_t n) {
  for (size_t at = 0; at < n; at += 4096)
    if (p[at] != std::byte{0}) return false;
  test::fill_pattern(p, n, 5, 0);
  return test::check_pattern(p, n, 5, 0) == -1;
}

std::string thp_setting() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  auto a = line.find('['), b = line.find(']');
  return a == std::string::npos ? "" : line.substr(a + 1, b - a - 1);
}

// mmap with MAP_HUGETLB fails with ENOMEM from now on (what the kernel answers when no reserved
// huge page is free). Permanent: for a child process.
bool refuse_hugetlb() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_mmap, 0, 3),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[3])),  // flags, low word
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, MAP_HUGETLB, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOMEM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{sizeof(filter) / sizeof(filter[0]), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

TEST(HugePages, BestTakesReservedPagesOrSaysWhyNot) {
  const HugePageSystem sys = huge_page_system();
  HugePageBuffer b(3 * MiB);  // rounds up to two huge pages
  ASSERT_NE(b.data(), nullptr);
  EXPECT_EQ(b.size(), 3 * MiB);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % HugePageBuffer::kHugePage, 0u);
  if (b.pages() == PageKind::hugetlb) {
    EXPECT_EQ(b.mapped_bytes(), 4 * MiB);
    EXPECT_EQ(b.huge_bytes(), 4 * MiB);
    EXPECT_TRUE(b.why().empty());
  } else {
    EXPECT_LT(sys.hugetlb_2m_free, 2u) << "free reserved pages, yet MAP_HUGETLB was not used: "
                                       << b.why();
    EXPECT_NE(b.why().find("MAP_HUGETLB refused"), std::string::npos) << b.why();
  }
  EXPECT_TRUE(all_zero_and_writable(b.data(), b.mapped_bytes()));
}

TEST(HugePages, FourKilobytePagesWhenAskedFor) {
  HugePageBuffer b(10000, PageRequest::none);
  EXPECT_EQ(b.pages(), PageKind::none);
  EXPECT_EQ(b.mapped_bytes(), 12288u);
  EXPECT_EQ(b.huge_bytes(), 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 4096, 0u);
  EXPECT_TRUE(all_zero_and_writable(b.data(), b.mapped_bytes()));
}

TEST(HugePages, TransparentHugePagesWhereTheKernelOffersThem) {
  HugePageBuffer b(4 * MiB, PageRequest::thp);
  const std::string thp = thp_setting();
  if (thp.empty() || thp == "never") {
    EXPECT_EQ(b.pages(), PageKind::none);
    EXPECT_NE(b.why().find("transparent huge pages"), std::string::npos) << b.why();
  } else {
    EXPECT_EQ(b.pages(), PageKind::thp);
    EXPECT_LE(b.huge_bytes(), b.mapped_bytes());  // the kernel may give fewer when fragmented
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % HugePageBuffer::kHugePage, 0u);
  EXPECT_TRUE(all_zero_and_writable(b.data(), b.mapped_bytes()));
}

TEST(HugePages, OwnerMovesAndUnmaps) {
  HugePageBuffer a(2 * MiB, PageRequest::thp);
  std::byte* p = a.data();
  const size_t n = a.mapped_bytes();
  HugePageBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), p);
  HugePageBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_TRUE(mapped(p, n));
  c = HugePageBuffer();
  EXPECT_FALSE(mapped(p, n)) << "the owner unmaps its memory";
}

TEST(HugePagesDeathTest, HugetlbRefusedFallsBackCleanly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const std::string thp = thp_setting();
  const bool thp_on = !thp.empty() && thp != "never";
  EXPECT_EXIT(
      {
        if (!refuse_hugetlb()) std::_Exit(20);
        HugePageBuffer b(5 * MiB);
        if (b.pages() != (thp_on ? PageKind::thp : PageKind::none)) std::_Exit(10);
        if (b.why().find("MAP_HUGETLB refused (Cannot allocate memory (ENOMEM)") == std::string::npos)
          std::_Exit(11);
        if (reinterpret_cast<uintptr_t>(b.data()) % HugePageBuffer::kHugePage) std::_Exit(12);
        if (!all_zero_and_writable(b.data(), b.mapped_bytes())) std::_Exit(13);
        if (huge_page_system().staging == PageKind::hugetlb) std::_Exit(14);
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace strata
