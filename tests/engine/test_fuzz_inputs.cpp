// Every committed fuzz input replayed through its driver (tests/fuzz/fuzz_targets.h): the seeds
// of tests/fuzz/corpus/<target>/ and the crash inputs of tests/fuzz/regressions/<target>/ that
// scripts/fuzz.sh found. Each must be accepted, or refused with one strata::Error; any other
// exception (a broken invariant included) fails the test, and a crash fails the process. This is
// the g++ build without sanitizers: it keeps fixed bugs fixed, it does not look for new ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "tests/fuzz/fuzz_targets.h"

namespace fs = std::filesystem;
using strata::fuzz::Target;

namespace {

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> read_all(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Runs one input; a failure names the file.
void replay(const Target& t, const fs::path& file, int& accepted, int& refused) {
  const std::vector<uint8_t> bytes = read_all(file);
  try {
    t.drive(strata::fuzz::Bytes(bytes.data(), bytes.size()));
    ++accepted;
  } catch (const strata::Error&) {
    ++refused;
  } catch (const std::exception& e) {
    ADD_FAILURE() << file << ": threw a non-strata exception: " << e.what();
  } catch (...) {
    ADD_FAILURE() << file << ": threw something that is not an exception";
  }
}

class FuzzInputs : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzInputs, AcceptedOrRefusedWithOneError) {
  const Target& t = GetParam();
  const fs::path root = STRATA_FUZZ_DIR;
  const auto seeds = files_in(root / "corpus" / t.name);
  const auto crashes = files_in(root / "regressions" / t.name);
  ASSERT_FALSE(seeds.empty()) << "no seeds in " << root / "corpus" / t.name;
  int accepted = 0, refused = 0;
  for (const auto& f : seeds) replay(t, f, accepted, refused);
  for (const auto& f : crashes) replay(t, f, accepted, refused);
  // The seeds hold valid inputs as well as near-valid ones: both outcomes must occur.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(refused, 0);
  std::printf("%s: %zu seeds, %zu regressions: %d accepted, %d refused\n",
              std::string(t.name).c_str(), seeds.size(), crashes.size(), accepted, refused);
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzInputs, ::testing::ValuesIn(strata::fuzz::targets()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
