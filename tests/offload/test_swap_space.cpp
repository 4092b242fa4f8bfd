// tests/offload/test_swap_space.cpp — SwapSpace over real files under the build tree: extents
// round-trip across two striped directories; the extent map allocates, refuses and reuses; a
// space larger than the free space is refused before anything is written; the files are gone
// after a normal end and after a failed construction.
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/size.h"
#include "io/aligned_buffer.h"
#include "offload/swap_space.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using test::check_pattern;
using test::fill_pattern;

size_t swap_files_in(const std::string& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("strata-", 0) == 0) ++n;
  return n;
}

std::unique_ptr<FileIO> small_io(const std::vector<std::string>& dirs) {
  IoOptions o;
  o.queue_depth = 8;
  o.block_size = 64 * KiB;
  return make_file_io(o, dirs);
}

TEST(SwapSpace, ExtentsRoundTripAcrossTwoStripedDirectories) {
  std::vector<std::string> dirs{test::fresh_work_dir("nvme0"), test::fresh_work_dir("nvme1")};
  auto io = small_io(dirs);
  SwapSpace swap(*io, {dirs, 8 * MiB, 64 * KiB, "t"});
  EXPECT_GE(swap.capacity_bytes(), 8 * MiB);
  EXPECT_EQ(swap.paths().size(), 2u);
  for (const std::string& d : dirs) EXPECT_EQ(swap_files_in(d), 0u) << "unlinked once open";

  const std::pair<std::string, uint64_t> states[] = {
      {"unit0/params", 4096}, {"unit0/optimizer/m", 300 * KiB}, {"unit1/grads", 5000},
      {"unit1/optimizer/v", 1 * MiB + 64 * KiB}, {"head/params", 64 * KiB}};
  std::vector<AlignedBuffer> out, in;
  uint64_t seed = 100;
  for (const auto& [key, bytes] : states) {
    const SwapExtent& e = swap.allocate(key, bytes);
    EXPECT_GE(e.bytes, bytes);
    EXPECT_EQ(e.bytes % swap.granule(), 0u);
    if (bytes >= 64 * KiB) {
      EXPECT_EQ(e.offset % (64 * KiB), 0u) << key << " starts on a stripe";
    }
    out.emplace_back(e.bytes);
    fill_pattern(out.back().data(), e.bytes, seed++, 0);
  }
  // Extents do not overlap.
  std::vector<SwapExtent> sorted;
  for (const auto& [k, e] : swap.extents()) sorted.push_back(e);
  std::sort(sorted.begin(), sorted.end(),
            [](const SwapExtent& a, const SwapExtent& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < sorted.size(); ++i)
    EXPECT_LE(sorted[i - 1].offset + sorted[i - 1].bytes, sorted[i].offset);

  // All writes in flight together, then all reads.
  std::vector<IoRequest> writes, reads;
  for (size_t i = 0; i < std::size(states); ++i) {
    in.emplace_back(out[i].size());
    writes.push_back(swap.request(IoOp::write, states[i].first, out[i].data(), out[i].size()));
    reads.push_back(swap.request(IoOp::read, states[i].first, in[i].data(), in[i].size()));
  }
  io->run(writes);
  io->run(reads);
  for (size_t i = 0; i < std::size(states); ++i)
    EXPECT_EQ(check_pattern(in[i].data(), in[i].size(), 100 + i, 0), -1) << states[i].first;

  // Part of an extent, through the synchronous helpers.
  AlignedBuffer part(8192);
  swap.read("unit1/optimizer/v", part.data(), 8192, 64 * KiB);
  EXPECT_EQ(check_pattern(part.data(), 8192, 103, 64 * KiB), -1);
  fill_pattern(part.data(), 8192, 999, 0);
  swap.write("unit0/optimizer/m", part.data(), 8192, 4096);
  swap.read("unit0/optimizer/m", in[1].data(), in[1].size());
  EXPECT_EQ(check_pattern(in[1].data(), 4096, 101, 0), -1);
  EXPECT_EQ(check_pattern(in[1].data() + 4096, 8192, 999, 0), -1);
  EXPECT_EQ(check_pattern(in[1].data() + 12288, in[1].size() - 12288, 101, 12288), -1);
}

TEST(SwapSpace, ExtentMapAllocatesRefusesAndReuses) {
  std::vector<std::string> dirs{test::fresh_work_dir()};
  auto io = small_io(dirs);
  SwapSpace swap(*io, {dirs, 1 * MiB, 64 * KiB, "map"});
  const SwapExtent a = swap.allocate("a", 256 * KiB);
  swap.allocate("b", 512 * KiB);
  swap.allocate("c", 256 * KiB);
  EXPECT_EQ(swap.used_bytes(), 1 * MiB);
  EXPECT_THROW(swap.allocate("a", 4096), Error);  // the key exists
  try {
    swap.allocate("d", 4096);
    FAIL() << "allocated past the capacity";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no room for extent 'd'"), std::string::npos) << e.what();
  }
  try {
    swap.extent("nope");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
  AlignedBuffer buf(512 * KiB);
  EXPECT_THROW(swap.request(IoOp::read, "a", buf.data(), 8192, 256 * KiB - 4096), Error);
  swap.release("a");
  swap.release("c");
  EXPECT_EQ(swap.used_bytes(), 512 * KiB);
  EXPECT_FALSE(swap.contains("a"));
  EXPECT_EQ(swap.allocate("e", 200 * KiB).offset, a.offset) << "first fit reuses the hole";
  swap.release("b");
  swap.release("e");
  EXPECT_EQ(swap.allocate("whole", 1 * MiB).offset, 0u) << "freed ranges coalesce";
  EXPECT_THROW(swap.release("b"), Error);
}

TEST(SwapSpace, LargerThanTheFreeSpaceIsRefusedBeforeAnyWrite) {
  std::string dir = test::fresh_work_dir();
  std::vector<std::string> dirs{dir};
  auto io = small_io(dirs);
  struct statvfs v {};
  ASSERT_EQ(::statvfs(dir.c_str(), &v), 0);
  uint64_t available = uint64_t(v.f_bavail) * v.f_frsize;
  try {
    SwapSpace swap(*io, {dirs, available + 64 * GiB, 1 * MiB, "big"});
    FAIL() << "a swap space larger than the free space was created";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("not enough free space"), std::string::npos) << msg;
    EXPECT_NE(msg.find("needs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("available"), std::string::npos) << msg;
    EXPECT_NE(msg.find(dir), std::string::npos) << msg;
    EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  }
  EXPECT_TRUE(fs::is_empty(dir)) << "nothing was created";
  EXPECT_EQ(io->stats().requests, 0u) << "nothing was written";

  // Two directories on one file system count together.
  std::string other = test::fresh_work_dir("second");
  std::vector<std::string> both{dir, other};
  uint64_t half = available / 2 + 8 * GiB;
  EXPECT_THROW(SwapSpace(*io, {both, 2 * half, 1 * MiB, "pair"}), Error);
  EXPECT_EQ(swap_files_in(dir), 0u);
}

// The folders of offload.nvme_path grouped by file system: two folders of one disk and a folder
// not made yet under it share one entry and its free space; a folder where no file can be made
// (/proc: not on a disk as root, not writable otherwise) is an entry of its own, with no space.
TEST(SwapSpace, FoldersAreGroupedPerFileSystem) {
  const std::string dir = test::fresh_work_dir();
  const std::string other = test::fresh_work_dir("second");
  const auto fss = swap_file_systems({dir, "/proc/strata-none", other, dir + "/not/yet"});
  ASSERT_EQ(fss.size(), 2u);
  EXPECT_EQ(fss[0].files, 3u);
  EXPECT_EQ(fss[0].dirs, "'" + dir + "', '" + other + "', '" + dir + "/not/yet'");
  EXPECT_TRUE(fss[0].problem.empty()) << fss[0].problem;
  EXPECT_GT(fss[0].free_bytes, 0u);
  EXPECT_EQ(fss[1].dirs, "'/proc/strata-none'");
  EXPECT_EQ(fss[1].free_bytes, 0u);
  EXPECT_FALSE(fss[1].problem.empty());
}

TEST(SwapSpace, FilesAreRemovedAfterANormalEndAndAfterAFailure) {
  std::vector<std::string> dirs{test::fresh_work_dir("a"), test::fresh_work_dir("b")};
  auto io = small_io(dirs);
  {
    SwapSpace swap(*io, {dirs, 2 * MiB, 64 * KiB, "life"});
    swap.allocate("x", 1 * MiB);
    AlignedBuffer buf(1 * MiB);
    swap.write("x", buf.data(), buf.size());
    for (const std::string& p : swap.paths()) EXPECT_FALSE(fs::exists(p)) << p;
  }
  for (const std::string& d : dirs) EXPECT_TRUE(fs::is_empty(d)) << d;

  // The second file cannot be created (its name is taken): the first, already created and
  // preallocated, must not stay behind.
  std::string taken = dirs[1] + "/strata-" + std::to_string(::getpid()) + "-fail-1.swap";
  std::ofstream(taken) << "in the way";
  EXPECT_THROW(SwapSpace(*io, {dirs, 2 * MiB, 64 * KiB, "fail"}), Error);
  EXPECT_TRUE(fs::is_empty(dirs[0])) << "the first file was left behind";
  EXPECT_EQ(swap_files_in(dirs[1]), 1u);  // only the obstacle
  fs::remove(taken);

  EXPECT_THROW(SwapSpace(*io, {{dirs[0], dirs[0] + "/missing"}, 2 * MiB, 64 * KiB, "m"}), Error);
  EXPECT_TRUE(fs::is_empty(dirs[0]));
  EXPECT_EQ(io->pending(), 0u);
}

}  // namespace
}  // namespace strata
