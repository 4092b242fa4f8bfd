// engine/data.cpp — token sources (built-in tasks, llm.c token files, raw bytes) and the window
// sampler of the contract in engine/data.h.
//
// Files are memory-mapped, never read whole; a token file is scanned once at open to check every
// token against the vocabulary. The shuffle permutation is a keyed Feistel network with cycle
// walking: a bijection on [0, W) computed in O(1) memory per lookup, so it needs no table even
// for billions of windows. It does not read ahead or cache: the OS page cache does that.
#include "engine/data.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <variant>

#include "core/error.h"
#include "core/size.h"
#include "engine/builtin_tasks.h"
#include "engine/file_util.h"

namespace strata {
namespace {

constexpr const char* kWhere = "data::open";
constexpr int32_t kMagic = 20240520;
constexpr uint64_t kHeaderBytes = 256 * sizeof(int32_t);

// Tokens of element type T (uint8_t bytes, uint16_t or uint32_t) held in memory or a mapping.
template <class T>
class ArraySource final : public TokenSource {
 public:
  ArraySource(std::string name, std::variant<std::vector<uint8_t>, fileutil::MappedFile> owner,
              uint64_t offset_bytes, uint64_t count)
      : name_(std::move(name)), owner_(std::move(owner)), count_(count) {
    const uint8_t* base = std::holds_alternative<std::vector<uint8_t>>(owner_)
                              ? std::get<std::vector<uint8_t>>(owner_).data()
                              : std::get<fileutil::MappedFile>(owner_).data();
    tokens_ = reinterpret_cast<const T*>(base + offset_bytes);  // page + 1024: aligned
  }
  uint64_t size() const override { return count_; }
  const std::string& name() const override { return name_; }
  void read(uint64_t start, uint64_t count, int32_t* out) const override {
    uint64_t pos = start % count_;
    while (count > 0) {
      uint64_t n = std::min(count, count_ - pos);
      for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(tokens_[pos + i]);
      out += n;
      count -= n;
      pos = 0;
    }
  }
  const T* tokens() const { return tokens_; }

 private:
  std::string name_;
  std::variant<std::vector<uint8_t>, fileutil::MappedFile> owner_;
  const T* tokens_ = nullptr;
  uint64_t count_ = 0;
};

[[noreturn]] void needs_byte_vocab(const std::string& what, int vocab_size) {
  fail(kWhere,
       str(what, " is byte-level (tokens 0..255) but model.vocab_size = ", vocab_size,
           "; allowed: model.vocab_size >= 256"),
       "set model.vocab_size = 256 (or more), or give an llm.c token file");
}

// Checks every token against the vocabulary; names the first that is out of range.
template <class T>
void check_tokens(const std::string& path, const T* tokens, uint64_t count, int vocab_size) {
  if (static_cast<uint64_t>(vocab_size) > std::numeric_limits<T>::max()) return;
  const T limit = static_cast<T>(vocab_size);
  for (uint64_t i = 0; i < count; ++i) {
    if (tokens[i] >= limit) [[unlikely]]
      fail(kWhere,
           str(path, ": token ", uint64_t(tokens[i]), " at index ", i,
               " is out of range; allowed: tokens < model.vocab_size = ", vocab_size),
           "set model.vocab_size to the tokenizer's vocabulary size (e.g. 50257 for GPT-2)");
  }
}

std::unique_ptr<TokenSource> open_token_file(const std::string& path, fileutil::MappedFile file,
                                             int vocab_size) {
  const uint64_t size = file.size();
  if (size < kHeaderBytes)
    fail(kWhere,
         str(path, ": truncated token file: ", size, " bytes, shorter than the ", kHeaderBytes,
             "-byte header"));
  int32_t header[3];
  std::memcpy(header, file.data(), sizeof header);
  const int32_t version = header[1];
  const int64_t count = header[2];
  if (version != 1 && version != 2)
    fail(kWhere,
         str(path, ": token file version ", version,
             " is not supported; allowed: 1 (uint16 tokens) or 2 (uint32 tokens)"));
  if (count <= 0)
    fail(kWhere, str(path, ": token file holds ", count, " tokens; allowed: at least 1"));
  const uint64_t width = version == 1 ? 2 : 4;
  const uint64_t expected = checked_add(
      kHeaderBytes, checked_mul(static_cast<uint64_t>(count), width, "token bytes"), "file bytes");
  if (size != expected)
    fail(kWhere,
         str(path, ": ", size < expected ? "truncated" : "oversized", " token file: header says ",
             count, " uint", width * 8, " tokens (", kHeaderBytes, " + ", count, " x ", width,
             " = ", expected, " bytes), file has ", size, " bytes"),
         size < expected ? "the file was probably cut short while copying or writing" : "");
  if (version == 1) {
    auto src = std::make_unique<ArraySource<uint16_t>>(path, std::move(file), kHeaderBytes, count);
    check_tokens(path, src->tokens(), src->size(), vocab_size);
    return src;
  }
  auto src = std::make_unique<ArraySource<uint32_t>>(path, std::move(file), kHeaderBytes, count);
  check_tokens(path, src->tokens(), src->size(), vocab_size);
  return src;
}

// splitmix64's finalizer: a bijective 64-bit mixer.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A permutation of [0, n) keyed by `key`: a balanced Feistel network on the smallest even number
// of bits covering n, applied repeatedly until the result is below n (cycle walking, at most
// ~4 rounds on average since the domain is < 4n). Any Feistel network is a bijection on its
// domain, and cycle walking restricts a bijection to [0, n).
class FeistelPermutation {
 public:
  static constexpr int kRounds = 6;

  FeistelPermutation(uint64_t n, uint64_t key) : n_(n) {
    int bits = 1;
    while (bits < 64 && (uint64_t(1) << bits) < n) ++bits;
    half_ = (bits + 1) / 2;
    mask_ = half_ >= 32 ? 0xffffffffull : (uint64_t(1) << half_) - 1;
    for (int r = 0; r < kRounds; ++r) keys_[r] = mix64(key + 0x9e3779b97f4a7c15ull * (r + 1));
  }

  uint64_t operator()(uint64_t x) const {
    if (n_ <= 1) return 0;
    do {
      x = encrypt(x);
    } while (x >= n_);
    return x;
  }

 private:
  uint64_t encrypt(uint64_t x) const {
    uint64_t left = x >> half_;
    uint64_t right = x & mask_;
    for (int r = 0; r < kRounds; ++r) {
      uint64_t next = left ^ (mix64(right ^ keys_[r]) & mask_);
      left = right;
      right = next;
    }
    return (left << half_) | right;
  }

  uint64_t n_;
  int half_ = 1;
  uint64_t mask_ = 1;
  uint64_t keys_[kRounds] = {};
};

}  // namespace

std::unique_ptr<TokenSource> open_tokens(const std::string& path, int vocab_size) {
  if (path.starts_with("builtin:")) {
    std::vector<uint8_t> bytes = make_builtin_task(std::string_view(path).substr(8));
    if (vocab_size < 256) needs_byte_vocab(path, vocab_size);
    uint64_t n = bytes.size();
    return std::make_unique<ArraySource<uint8_t>>(path, std::move(bytes), 0, n);
  }
  if (path.empty())
    fail(kWhere, "data.path is empty",
         "give a text file, an llm.c token file (.bin) or builtin:words");
  fileutil::MappedFile file(path, kWhere);
  int32_t magic = 0;
  if (file.size() >= sizeof magic) std::memcpy(&magic, file.data(), sizeof magic);
  if (magic == kMagic) return open_token_file(path, std::move(file), vocab_size);
  if (std::filesystem::path(path).extension() == ".bin") {
    if (file.size() < sizeof magic)
      fail(kWhere, str(path, ": truncated token file: ", file.size(), " bytes, no header"));
    bool swapped = static_cast<int32_t>(__builtin_bswap32(static_cast<uint32_t>(magic))) == kMagic;
    fail(kWhere,
         str(path, ": bad magic ", magic, " in token file; allowed: ", kMagic,
             swapped ? " (this file has the other byte order)" : ""),
         "a .bin data file must be an llm.c token file; raw text is read as bytes from other "
         "extensions (e.g. .txt)");
  }
  if (file.size() == 0) fail(kWhere, str(path, ": the file is empty; allowed: at least 1 byte"));
  if (vocab_size < 256) needs_byte_vocab(str(path, " (raw text)"), vocab_size);
  uint64_t n = file.size();
  return std::make_unique<ArraySource<uint8_t>>(path, std::move(file), 0, n);
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens) {
  constexpr const char* kWrite = "data::write_token_file";
  if (tokens.empty()) fail(kWrite, str(path, ": no tokens to write; a token file holds at least 1"));
  if (tokens.size() > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    fail(kWrite, str(path, ": ", tokens.size(), " tokens exceed the header's int32 count"));
  int32_t max_token = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0)
      fail(kWrite, str(path, ": token ", tokens[i], " at index ", i, " is negative"));
    max_token = std::max(max_token, tokens[i]);
  }
  const int32_t version = max_token < 65536 ? 1 : 2;
  int32_t header[256] = {};
  header[0] = kMagic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  fileutil::AtomicFile out(path, kWrite);
  out.write(header, sizeof header);
  if (version == 2) {
    out.write(tokens.data(), tokens.size() * sizeof(int32_t));
  } else {
    std::vector<uint16_t> chunk;
    constexpr size_t kChunk = 1 << 16;
    for (size_t i = 0; i < tokens.size(); i += kChunk) {
      size_t n = std::min(kChunk, tokens.size() - i);
      chunk.assign(tokens.begin() + static_cast<ptrdiff_t>(i),
                   tokens.begin() + static_cast<ptrdiff_t>(i + n));
      out.write(chunk.data(), n * sizeof(uint16_t));
    }
  }
  out.commit();
}

WindowSampler::WindowSampler(const TokenSource& source, int seq_len, bool shuffle, uint64_t seed)
    : source_(source), seq_len_(seq_len), shuffle_(shuffle), seed_(seed) {
  if (seq_len < 1) fail("data::windows", str("seq_len = ", seq_len, "; allowed: >= 1"));
  STRATA_CHECK(source.size() > 0, "data::windows", "empty token source ", source.name());
  // A window reads seq_len + 1 tokens (the targets are the inputs shifted by one). Fewer would
  // repeat the data inside every window (a 2-token file trained as "hihihi...").
  if (source.size() < uint64_t(seq_len) + 1)
    fail("data::windows",
         str(source.name(), " holds ", source.size(),
             " tokens, fewer than one window of seq_len + 1 = ", seq_len + 1),
         "give more data, or a smaller data.seq_len");
  windows_per_epoch_ = std::max<uint64_t>(1, source.size() / static_cast<uint64_t>(seq_len));
}

uint64_t WindowSampler::stream_window(uint64_t w) const {
  if (!shuffle_) return w;
  const uint64_t W = windows_per_epoch_;
  const uint64_t epoch = w / W;
  const uint64_t key = mix64(seed_ ^ mix64(epoch + 0x632be59bd9b4e019ull));
  return epoch * W + FeistelPermutation(W, key)(w % W);
}

void WindowSampler::window(uint64_t w, int32_t* inputs, int32_t* targets) const {
  windows(w, 1, inputs, targets);
}

void WindowSampler::windows(uint64_t first, int rows, int32_t* inputs, int32_t* targets) const {
  const uint64_t T = static_cast<uint64_t>(seq_len_);
  std::vector<int32_t> buf(T + 1);
  for (int r = 0; r < rows; ++r) {
    // Token w·T of the stream, wrapping around: exact in 128 bits for any window index.
    using u128 = unsigned __int128;
    const u128 at = static_cast<u128>(stream_window(first + uint64_t(r))) * T;
    source_.read(static_cast<uint64_t>(at % source_.size()), T + 1, buf.data());
    std::memcpy(inputs + r * T, buf.data(), T * sizeof(int32_t));
    std::memcpy(targets + r * T, buf.data() + 1, T * sizeof(int32_t));
  }
}

}  // namespace strata
