// Data: the window contract of engine/data.h (with wrap-around and shuffling), llm.c token files
// v1/v2, raw text, the built-in tasks, and every bad-input error of issue 2 item 9.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>

#include "engine/data.h"
#include "tests/engine/test_util.h"

using namespace strata;
using strata::test::read_bytes;
using strata::test::scratch_dir;
using strata::test::write_bytes;

namespace {

std::vector<int32_t> iota_tokens(int n, int start = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

std::vector<int32_t> read_all(const TokenSource& s) {
  std::vector<int32_t> out(s.size());
  s.read(0, s.size(), out.data());
  return out;
}

// A token-file header: magic, version, count, then zeros.
std::string header(int32_t magic, int32_t version, int32_t count) {
  std::string h(1024, '\0');
  std::memcpy(h.data(), &magic, 4);
  std::memcpy(h.data() + 4, &version, 4);
  std::memcpy(h.data() + 8, &count, 4);
  return h;
}

// A source of `size` tokens 0, 1, 2, ... with no file.
class CountingSource : public TokenSource {
 public:
  explicit CountingSource(uint64_t n) : n_(n) {}
  uint64_t size() const override { return n_; }
  const std::string& name() const override { return name_; }
  void read(uint64_t start, uint64_t count, int32_t* out) const override {
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>((start + i) % n_);
  }

 private:
  uint64_t n_;
  std::string name_ = "counting";
};

}  // namespace

TEST(Data, WindowContractWithWrapAround) {
  const std::string path = scratch_dir() + "/tokens.bin";
  const int N = 100, T = 8;
  write_token_file(path, iota_tokens(N, 1000));
  auto src = open_tokens(path, 2000);
  ASSERT_EQ(src->size(), uint64_t(N));
  WindowSampler s(*src, T, /*shuffle=*/false, /*seed=*/42);
  EXPECT_EQ(s.windows_per_epoch(), uint64_t(N / T));  // 12
  std::vector<int32_t> in(T), tg(T);
  for (uint64_t w = 0; w < 40; ++w) {  // past the end of the stream several times
    EXPECT_EQ(s.stream_window(w), w);
    s.window(w, in.data(), tg.data());
    for (int i = 0; i < T; ++i) {
      ASSERT_EQ(in[i], 1000 + int32_t((w * T + i) % N)) << "w=" << w << " i=" << i;
      ASSERT_EQ(tg[i], 1000 + int32_t((w * T + i + 1) % N)) << "w=" << w << " i=" << i;
    }
  }
  // windows() is rows consecutive logical windows.
  const int rows = 5;
  std::vector<int32_t> ins(rows * T), tgs(rows * T);
  s.windows(10, rows, ins.data(), tgs.data());
  for (int r = 0; r < rows; ++r) {
    s.window(10 + r, in.data(), tg.data());
    EXPECT_TRUE(std::equal(in.begin(), in.end(), ins.begin() + r * T)) << r;
    EXPECT_TRUE(std::equal(tg.begin(), tg.end(), tgs.begin() + r * T)) << r;
  }
  // Window 12 (T = 8, N = 100) starts at token 96 and wraps: 96..99, 0..4.
  s.window(12, in.data(), tg.data());
  EXPECT_EQ(in[3], 1099);
  EXPECT_EQ(in[4], 1000);
  EXPECT_EQ(tg[7], 1004);
}

// The contract holds for any window index: w·T is taken modulo the stream exactly, even when
// w·T does not fit in 64 bits (2^62 + 3 windows of 8 tokens: 2^65 + 24, 256 modulo 1000).
TEST(Data, WindowPositionIsExactForHugeIndices) {
  CountingSource src(1000);
  WindowSampler s(src, 8, /*shuffle=*/false, /*seed=*/1);
  std::vector<int32_t> in(8), tg(8);
  for (uint64_t w : {(uint64_t(1) << 62) + 3, ~uint64_t(0), uint64_t(0x123456789abcdef)}) {
    const auto start = static_cast<uint64_t>(static_cast<unsigned __int128>(w) * 8 % 1000);
    s.window(w, in.data(), tg.data());
    EXPECT_EQ(in[0], int32_t(start)) << w;
    EXPECT_EQ(tg[7], int32_t((start + 8) % 1000)) << w;
  }
  s.window((uint64_t(1) << 62) + 3, in.data(), tg.data());
  EXPECT_EQ(in[0], 256);
}

// A source shorter than one window (seq_len + 1 tokens) is refused, naming it; one that long is
// one window.
TEST(Data, ASourceShorterThanOneWindowIsRefused) {
  CountingSource short_one(8);
  try {
    WindowSampler s(short_one, 8, false, 1);
    FAIL() << "8 tokens made windows of 8 + 1";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("holds 8 tokens, fewer than one window of seq_len + 1 = 9"), std::string::npos)
        << m;
  }
  CountingSource one(9);
  EXPECT_EQ(WindowSampler(one, 8, false, 1).windows_per_epoch(), 1u);
}

TEST(Data, ShuffleIsADeterministicPermutationPerEpoch) {
  const int T = 4;
  for (uint64_t W : {1ull, 2ull, 3ull, 5ull, 7ull, 12ull, 100ull, 1000ull, 4097ull}) {
    CountingSource src(W * T + 3);  // a partial window at the end does not count
    WindowSampler a(src, T, true, 1234), b(src, T, true, 1234), c(src, T, true, 99);
    ASSERT_EQ(a.windows_per_epoch(), W);
    std::vector<std::vector<uint64_t>> perms;
    for (uint64_t e = 0; e < 3; ++e) {
      std::vector<uint64_t> perm(W), other_seed(W);
      for (uint64_t i = 0; i < W; ++i) {
        uint64_t sw = a.stream_window(e * W + i);
        ASSERT_EQ(sw, b.stream_window(e * W + i)) << "not deterministic";
        ASSERT_GE(sw, e * W);
        perm[i] = sw - e * W;
        other_seed[i] = c.stream_window(e * W + i) - e * W;
      }
      std::vector<uint64_t> sorted = perm;
      std::sort(sorted.begin(), sorted.end());
      for (uint64_t i = 0; i < W; ++i) ASSERT_EQ(sorted[i], i) << "W=" << W << " epoch " << e;
      if (W >= 12) {
        EXPECT_NE(perm, other_seed) << "the seed does not change the order, W=" << W;
      }
      perms.push_back(perm);
    }
    if (W >= 12) {
      EXPECT_NE(perms[0], perms[1]) << "epochs share an order, W=" << W;
      std::vector<uint64_t> identity(W);
      std::iota(identity.begin(), identity.end(), 0);
      EXPECT_NE(perms[0], identity);
    }
  }
  // The window's tokens follow its stream window.
  CountingSource src(64);
  WindowSampler s(src, 8, true, 5);
  std::vector<int32_t> in(8), tg(8);
  for (uint64_t w = 0; w < 16; ++w) {
    s.window(w, in.data(), tg.data());
    EXPECT_EQ(uint64_t(in[0]), (s.stream_window(w) * 8) % 64);
    EXPECT_EQ(tg[7], int32_t((s.stream_window(w) * 8 + 8) % 64));
  }
}

TEST(Data, TokenFilesV1AndV2) {
  const std::string dir = scratch_dir();
  std::vector<int32_t> small = {0, 1, 65535, 7, 50256};
  write_token_file(dir + "/v1.bin", small);
  std::string bytes = read_bytes(dir + "/v1.bin");
  ASSERT_EQ(bytes.size(), 1024 + small.size() * 2);
  int32_t h[3];
  std::memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(h[0], 20240520);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 5);
  EXPECT_EQ(read_all(*open_tokens(dir + "/v1.bin", 65536)), small);

  std::vector<int32_t> big = {3, 65536, 200000, 0};
  write_token_file(dir + "/v2.bin", big);
  bytes = read_bytes(dir + "/v2.bin");
  ASSERT_EQ(bytes.size(), 1024 + big.size() * 4);
  std::memcpy(h, bytes.data(), sizeof h);
  EXPECT_EQ(h[1], 2);
  auto v2 = open_tokens(dir + "/v2.bin", 200001);
  EXPECT_EQ(read_all(*v2), big);
  EXPECT_EQ(v2->name(), dir + "/v2.bin");
  // Reads wrap around the end.
  std::vector<int32_t> wrap(6);
  v2->read(2, 6, wrap.data());
  EXPECT_EQ(wrap, (std::vector<int32_t>{200000, 0, 3, 65536, 200000, 0}));
  // The write is atomic: no temporary is left behind.
  EXPECT_FALSE(std::filesystem::exists(dir + "/v2.bin.tmp"));
  EXPECT_ERROR_HAS(write_token_file(dir + "/neg.bin", {1, -2}), "neg.bin", "-2");
  EXPECT_ERROR_HAS(write_token_file(dir + "/none.bin", {}), "none.bin");
}

TEST(Data, MissingTruncatedAndMalformedFilesNameTheFile) {
  const std::string dir = scratch_dir();
  EXPECT_ERROR_HAS(open_tokens(dir + "/missing.bin", 256), "missing.bin", "cannot open");

  write_token_file(dir + "/ok.bin", iota_tokens(100));
  std::string good = read_bytes(dir + "/ok.bin");
  write_bytes(dir + "/cut.bin", good.substr(0, good.size() - 2));
  EXPECT_ERROR_HAS(open_tokens(dir + "/cut.bin", 256), "cut.bin", "truncated", "100 uint16 tokens",
                   "1224 bytes", "1222 bytes");
  write_bytes(dir + "/long.bin", good + "xx");
  EXPECT_ERROR_HAS(open_tokens(dir + "/long.bin", 256), "long.bin", "oversized");
  write_bytes(dir + "/short_header.bin", good.substr(0, 100));
  EXPECT_ERROR_HAS(open_tokens(dir + "/short_header.bin", 256), "short_header.bin", "truncated",
                   "1024");

  write_bytes(dir + "/magic.bin", header(12345, 1, 4) + std::string(8, '\0'));
  EXPECT_ERROR_HAS(open_tokens(dir + "/magic.bin", 256), "magic.bin", "bad magic 12345",
                   "allowed: 20240520");
  write_bytes(dir + "/swapped.bin", header(int32_t(__builtin_bswap32(20240520)), 1, 4));
  EXPECT_ERROR_HAS(open_tokens(dir + "/swapped.bin", 256), "swapped.bin", "other byte order");
  write_bytes(dir + "/version.bin", header(20240520, 3, 4) + std::string(8, '\0'));
  EXPECT_ERROR_HAS(open_tokens(dir + "/version.bin", 256), "version.bin", "version 3",
                   "allowed: 1 (uint16 tokens) or 2 (uint32 tokens)");
  write_bytes(dir + "/zero.bin", header(20240520, 1, 0));
  EXPECT_ERROR_HAS(open_tokens(dir + "/zero.bin", 256), "zero.bin", "0 tokens");
  write_bytes(dir + "/empty.txt", "");
  EXPECT_ERROR_HAS(open_tokens(dir + "/empty.txt", 256), "empty.txt", "empty");
  EXPECT_ERROR_HAS(open_tokens(dir, 256), dir, "not a regular file");
  EXPECT_ERROR_HAS(open_tokens("", 256), "data.path is empty");
}

TEST(Data, TokenOutOfVocabularyNamesTokenAndIndex) {
  const std::string dir = scratch_dir();
  std::vector<int32_t> t = iota_tokens(10);
  t[7] = 300;
  write_token_file(dir + "/t.bin", t);
  EXPECT_ERROR_HAS(open_tokens(dir + "/t.bin", 256), "t.bin", "token 300 at index 7",
                   "model.vocab_size = 256");
  EXPECT_NO_THROW(open_tokens(dir + "/t.bin", 301));
  t[7] = 70000;  // v2 file
  write_token_file(dir + "/t2.bin", t);
  EXPECT_ERROR_HAS(open_tokens(dir + "/t2.bin", 65536), "token 70000 at index 7");
}

TEST(Data, RawTextIsBytes) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/a.txt", "hi\xff\n");
  auto src = open_tokens(dir + "/a.txt", 256);
  EXPECT_EQ(read_all(*src), (std::vector<int32_t>{'h', 'i', 255, '\n'}));
  EXPECT_ERROR_HAS(open_tokens(dir + "/a.txt", 100), "a.txt", "model.vocab_size = 100",
                   "allowed: model.vocab_size >= 256");
  // A file that starts with the magic is a token file whatever its extension.
  write_token_file(dir + "/tokens.dat", {1, 2, 3});
  EXPECT_EQ(open_tokens(dir + "/tokens.dat", 4)->size(), 3u);
}

namespace {

// Empirical entropy (nats) of the next byte given the previous `context` bytes.
double conditional_entropy(const std::vector<int32_t>& t, int context) {
  std::map<std::vector<int32_t>, std::map<int32_t, int>> counts;
  for (size_t i = static_cast<size_t>(context); i < t.size(); ++i)
    counts[std::vector<int32_t>(t.begin() + static_cast<ptrdiff_t>(i) - context,
                                t.begin() + static_cast<ptrdiff_t>(i))][t[i]]++;
  double h = 0, total = static_cast<double>(t.size() - context);
  for (auto& [ctx, next] : counts) {
    double n = 0;
    for (auto& [tok, c] : next) n += c;
    for (auto& [tok, c] : next) h -= c / total * std::log(c / n);
  }
  return h;
}

}  // namespace

TEST(Data, BuiltinTasksAreDeterministicAndShaped) {
  for (const std::string& name : builtin_task_names()) {
    auto a = open_tokens("builtin:" + name, 256);
    auto b = open_tokens("builtin:" + name, 256);
    EXPECT_EQ(a->name(), "builtin:" + name);
    EXPECT_GE(a->size(), 1000000u) << name;
    EXPECT_EQ(read_all(*a), read_all(*b)) << name;
    EXPECT_ERROR_HAS(open_tokens("builtin:" + name, 128), "builtin:" + name, ">= 256");
  }
  std::vector<int32_t> words = read_all(*open_tokens("builtin:words", 256));
  std::vector<int32_t> count = read_all(*open_tokens("builtin:count", 256));
  std::vector<int32_t> random = read_all(*open_tokens("builtin:random", 256));
  EXPECT_EQ(std::string(count.begin(), count.begin() + 12), "1 2 3 4 5 6 ");
  std::string head(words.begin(), words.begin() + 200);
  EXPECT_NE(head.find(' '), std::string::npos) << head;
  EXPECT_NE(head.find(". "), std::string::npos) << head;

  // Learnable vs not: with two bytes of context, words is nearly predictable; random is not.
  std::vector<int32_t> words_sample(words.begin(), words.begin() + 200000);
  std::vector<int32_t> random_sample(random.begin(), random.begin() + 200000);
  double h_words = conditional_entropy(words_sample, 2);
  double h_random = conditional_entropy(random_sample, 0);
  std::printf("entropy of the next byte: builtin:words %.3f nats (2 bytes of context), "
              "builtin:random %.3f nats\n", h_words, h_random);
  EXPECT_LT(h_words, 1.2) << "builtin:words should be learnable far below ln 256";
  EXPECT_GT(h_random, 5.5) << "builtin:random should be uniform bytes";
  EXPECT_ERROR_HAS(open_tokens("builtin:nope", 256), "builtin:nope", "builtin:words",
                   "builtin:count", "builtin:random");
}
