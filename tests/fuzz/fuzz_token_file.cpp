// tests/fuzz/fuzz_token_file.cpp — fuzz target: a training data file (open_tokens) and the
// windows read from it.
//
// Input: the file's bytes, then one option byte (the last byte; absent for an empty input):
//   bit 0     file name ends in .bin (0) or .txt (1)
//   bits 1-2  vocab_size: 64, 256, 50257, 16777216
//   bits 3-5  seq_len: 1, 2, 3, 5, 8, 64, 255, 1024
//   bit 6     shuffle
//   bit 7     seed: 0 or 0x5eed
// An accepted file has windows read at the start, across the end of the stream and far beyond
// it; every token must be below vocab_size, and with shuffle on, one epoch's windows must be a
// permutation.
#include <algorithm>

#include "core/error.h"
#include "engine/data.h"
#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {

void token_file(Bytes input) {
  const uint8_t opt = input.empty() ? 0 : input.back();
  if (!input.empty()) input = input.first(input.size() - 1);
  constexpr int kVocab[] = {64, 256, 50257, 16777216};
  constexpr int kSeqLen[] = {1, 2, 3, 5, 8, 64, 255, 1024};
  const int vocab = kVocab[(opt >> 1) & 3];
  const int T = kSeqLen[(opt >> 3) & 7];
  const bool shuffle = opt & 64;
  const uint64_t seed = opt & 128 ? 0x5eed : 0;
  static const std::string bin = scratch_dir() + "/tokens.bin";
  static const std::string txt = scratch_dir() + "/tokens.txt";
  const std::string& path = opt & 1 ? txt : bin;
  write_file(path, as_text(input));

  const auto source = open_tokens(path, vocab);
  if (source->size() == 0 || source->size() > input.size())
    broken(str("open_tokens reports ", source->size(), " tokens in ", input.size(), " bytes"));
  WindowSampler sampler(*source, T, shuffle, seed);
  const uint64_t W = sampler.windows_per_epoch();
  std::vector<int32_t> in(size_t(T) * 4), tgt(size_t(T) * 4);
  for (uint64_t first : {uint64_t(0), W - 1, W * 3 + 1, (uint64_t(1) << 40) + 7}) {
    sampler.windows(first, 4, in.data(), tgt.data());
    for (size_t i = 0; i < in.size(); ++i)
      if (in[i] < 0 || in[i] >= vocab || tgt[i] < 0 || tgt[i] >= vocab)
        broken(str("window token ", in[i], " / ", tgt[i], " is outside [0, ", vocab, ")"));
  }
  if (shuffle && W <= 4096) {
    for (uint64_t epoch : {uint64_t(0), uint64_t(5)}) {
      std::vector<bool> seen(W);
      for (uint64_t w = 0; w < W; ++w) {
        uint64_t s = sampler.stream_window(epoch * W + w);
        if (s < epoch * W || s >= (epoch + 1) * W || seen[s - epoch * W])
          broken(str("shuffle of epoch ", epoch, " is not a permutation of its ", W, " windows"));
        seen[s - epoch * W] = true;
      }
    }
  }
}

}  // namespace strata::fuzz
