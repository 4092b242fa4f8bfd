// tests/fuzz/fuzz_targets.h — the fuzz drivers of the parsers of user files, and what they share.
//
// A driver feeds one input to one parser (safetensors file, shard index, config.json, TOML config
// with --set overrides, llm.c token file, checkpoint manifest, metrics JSONL, rate cache) and
// exercises what it accepted. Contract: it returns when
// the parser accepted the input, throws strata::Error when the parser refused it, and anything
// else — a crash, a sanitizer report, another exception type, or a broken invariant (thrown as
// InvariantBroken) — is a bug. The same drivers run under libFuzzer (fuzz_main.cpp, clang) and in
// the g++ unit test that replays every committed input (tests/engine/test_fuzz_inputs.cpp).
// Parsers that read paths get their input through files in one scratch directory per process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata {
class SafetensorsReader;
}

namespace strata::fuzz {

using Bytes = std::span<const uint8_t>;

// A property the parser promises was violated by an input it accepted.
class InvariantBroken : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};
[[noreturn]] void broken(const std::string& what);

// The drivers; each file tests/fuzz/fuzz_<name>.cpp documents its input format.
void safetensors(Bytes input);          // one .safetensors file
void safetensors_index(Bytes input);    // model.safetensors.index.json + shard files
void hf_config(Bytes input);            // config.json
void config_toml(Bytes input);          // TOML config, then --set overrides
void token_file(Bytes input);           // a data file (llm.c tokens or raw bytes) + one option byte
void checkpoint_manifest(Bytes input);  // a checkpoint's manifest.json [+ manifest.xxh64]
void metrics_jsonl(Bytes input);        // the metrics JSONL of `strata report`
void rate_cache(Bytes input);           // a machine key line + the rate cache file

struct Target {
  std::string_view name;  // the corpus folder: tests/fuzz/corpus/<name>, regressions/<name>
  void (*drive)(Bytes);
};
const std::vector<Target>& targets();

// Runs a driver as libFuzzer wants it: a refused input (strata::Error) is a normal outcome.
int run_one(void (*drive)(Bytes), const uint8_t* data, size_t size);

// ---- shared by the drivers ------------------------------------------------------------------

// This process's scratch directory (created on first use, removed at exit).
const std::string& scratch_dir();
// A fresh, empty directory scratch_dir()/name.
std::string fresh_dir(const std::string& name);
// Writes bytes to path (replacing it); a failure here is an environment error, not a finding.
void write_file(const std::string& path, std::string_view bytes);
// Splits input at every occurrence of sep.
std::vector<std::string_view> split(std::string_view input, std::string_view sep);
std::string_view as_text(Bytes input);
// Reads every tensor of an opened reader in full and in part; the element counts it reports must
// fit in the `input_bytes` the files hold (so nothing is read past them).
void read_all_tensors(const SafetensorsReader& reader, uint64_t input_bytes);

// Separator between the files of a multi-file input (safetensors_index, checkpoint_manifest).
inline constexpr std::string_view kFileSeparator = "\n--file--\n";

}  // namespace strata::fuzz
