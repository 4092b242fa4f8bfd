// engine/builtin_tasks.cpp — built-in synthetic tasks that need no file.
//
//   words   a byte-level "language": 48 pseudo-words joined by a sparse Markov chain (each word
//           has three possible successors), in capitalized sentences with commas, full stops and
//           line breaks. Spelling and word order are learnable, so a small model's loss falls
//           from ln 256 = 5.5 to well under 2 within a few hundred steps. The default task.
//   count   "1 2 3 ... " in decimal: nearly deterministic once a number has been seen.
//   random  uniform random bytes: unlearnable (loss stays at ln 256), a control.
// All use a fixed seed and integer arithmetic only (no <random> distributions, whose output
// differs between standard libraries), so the bytes are the same everywhere.
#include "engine/builtin_tasks.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "core/error.h"
#include "engine/data.h"

namespace strata {
namespace {

constexpr uint64_t kTaskSeed = 0x5354524154410001ull;  // "STRATA" 0x0001

struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return static_cast<uint32_t>(next() % n); }  // bias < 2^-32
};

std::vector<uint8_t> words_task() {
  constexpr int kWords = 48;
  constexpr int kSuccessors = 3;
  const char* consonants = "bdfghklmnprstvz";
  const char* vowels = "aeiou";
  SplitMix64 rng{kTaskSeed};

  std::vector<std::string> vocab;
  while (static_cast<int>(vocab.size()) < kWords) {
    std::string w;
    int syllables = 1 + static_cast<int>(rng.below(3));
    for (int s = 0; s < syllables; ++s) {
      w += consonants[rng.below(15)];
      w += vowels[rng.below(5)];
      if (rng.below(10) < 3) w += consonants[rng.below(15)];
    }
    if (std::find(vocab.begin(), vocab.end(), w) == vocab.end()) vocab.push_back(w);
  }
  // successors[i]: three distinct next words, taken with probability 6/10, 3/10, 1/10.
  std::vector<std::array<int, kSuccessors>> successors(kWords);
  for (auto& next : successors) {
    for (int j = 0; j < kSuccessors; ++j) {
      int cand;
      do {
        cand = static_cast<int>(rng.below(kWords));
      } while (std::find(next.begin(), next.begin() + j, cand) != next.begin() + j);
      next[j] = cand;
    }
  }

  std::string text;
  text.reserve(kBuiltinTaskBytes + 64);
  int word = 0;
  int sentences = 0;
  while (text.size() < kBuiltinTaskBytes) {
    int length = 4 + static_cast<int>(rng.below(9));  // words per sentence: 4..12
    for (int i = 0; i < length; ++i) {
      std::string w = vocab[word];
      if (i == 0) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
      text += w;
      if (i + 1 < length) text += rng.below(10) == 0 ? ", " : " ";
      uint32_t r = rng.below(10);
      word = successors[word][r < 6 ? 0 : r < 9 ? 1 : 2];
    }
    text += (++sentences % 6 == 0) ? ".\n" : ". ";
  }
  return std::vector<uint8_t>(text.begin(), text.begin() + kBuiltinTaskBytes);
}

std::vector<uint8_t> count_task() {
  std::string text;
  text.reserve(kBuiltinTaskBytes + 16);
  for (uint64_t n = 1; text.size() < kBuiltinTaskBytes; ++n) {
    text += std::to_string(n);
    text += ' ';
  }
  return std::vector<uint8_t>(text.begin(), text.begin() + kBuiltinTaskBytes);
}

std::vector<uint8_t> random_task() {
  SplitMix64 rng{kTaskSeed ^ 0x72616e646f6dull};  // "random"
  std::vector<uint8_t> bytes(kBuiltinTaskBytes);
  for (size_t i = 0; i < bytes.size(); i += 8) {
    uint64_t r = rng.next();
    for (size_t j = 0; j < 8 && i + j < bytes.size(); ++j) bytes[i + j] = static_cast<uint8_t>(r >> (8 * j));
  }
  return bytes;
}

}  // namespace

std::vector<std::string> builtin_task_names() { return {"words", "count", "random"}; }

std::vector<uint8_t> make_builtin_task(std::string_view name) {
  if (name == "words") return words_task();
  if (name == "count") return count_task();
  if (name == "random") return random_task();
  std::string names;
  for (const auto& n : builtin_task_names()) names += (names.empty() ? "builtin:" : ", builtin:") + n;
  fail("data::open", str("unknown built-in task 'builtin:", name, "'"), str("built-in tasks: ", names));
}

}  // namespace strata
