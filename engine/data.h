// engine/data.h — token streams and the window contract.
//
// A TokenSource is a finite stream of token ids: a raw text file read as bytes (vocabulary 256),
// an llm.c token file (header of 256 int32: magic 20240520, version 1 = uint16 tokens or
// 2 = uint32 tokens, token count; then the tokens), or a built-in synthetic task
// ("builtin:NAME") that needs no file.
//
// Window contract (other tools rely on it): window w covers tokens [w·T, w·T + T + 1) of the
// stream, wrapping around at the end; its inputs are the first T tokens, its targets the last T.
// With shuffle off, logical window w is stream window w. With shuffle on, logical window w of
// epoch e = w / W (W = windows per epoch = max(1, size / T)) is stream window
// e·W + perm_e(w mod W), perm_e a permutation that is a pure function of (seed, e).
// The trainer's step s, micro-batch a, data-parallel rank r, row i reads logical window
// s·G + (a·dp + r)·B + i, G = B · grad_accum · dp; eval batch i reads windows i·B … i·B + B − 1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace strata {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual uint64_t size() const = 0;           // number of tokens
  virtual const std::string& name() const = 0; // path or builtin:NAME
  // out[i] = token (start + i) mod size(), for i < count.
  virtual void read(uint64_t start, uint64_t count, int32_t* out) const = 0;
};

// Opens `path`: "builtin:NAME", an llm.c token file (recognized by its magic), or raw bytes.
// Every token is checked against vocab_size; a missing, truncated or malformed file, or a token
// out of range, is an Error naming the file and what is wrong.
std::unique_ptr<TokenSource> open_tokens(const std::string& path, int vocab_size);

// Names of the built-in tasks, for help and error messages.
std::vector<std::string> builtin_task_names();

// Writes an llm.c token file (version 1 when every token < 65536, else 2), atomically.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens);

class WindowSampler {
 public:
  WindowSampler(const TokenSource& source, int seq_len, bool shuffle, uint64_t seed);
  uint64_t windows_per_epoch() const { return windows_per_epoch_; }
  // Stream window index of logical window w (identity when shuffle is off).
  uint64_t stream_window(uint64_t w) const;
  // inputs (T) and targets (T) of logical window w.
  void window(uint64_t w, int32_t* inputs, int32_t* targets) const;
  // rows consecutive logical windows starting at `first`: inputs, targets (rows, T).
  void windows(uint64_t first, int rows, int32_t* inputs, int32_t* targets) const;

 private:
  const TokenSource& source_;
  int seq_len_;
  bool shuffle_;
  uint64_t seed_;
  uint64_t windows_per_epoch_;
};

}  // namespace strata
