// tests/fuzz/fuzz_checkpoint_manifest.cpp — fuzz target: a checkpoint's manifest.json
// (read_manifest, as `strata train --resume`, `strata checkpoint inspect` and `export` read it).
//
// Input: manifest.json; optionally "\n--file--\n" and then the text of manifest.xxh64. Without
// that part the driver writes the manifest's true checksum, so every input reaches the parser.
// An accepted manifest must be written as commit_checkpoint writes it (to_json, dump(1)) and read
// back to the same manifest. When its files are small, files of the listed sizes must then give
// every element of every small tensor's three states through CheckpointReader, in full and in a
// part that reads the same elements, without an Error: the pieces lie inside the files and cover
// each tensor exactly once. It does not check the data files' hashes (verify_checkpoint_files).
#include <xxhash.h>

#include <cstring>

#include "core/error.h"
#include "engine/checkpoint.h"
#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {
namespace {

constexpr uint64_t kMaxFileBytes = uint64_t(1) << 20;  // data files written: 1 MiB in all
constexpr uint64_t kMaxReadNumel = uint64_t(1) << 16;  // elements of one tensor read back
constexpr size_t kMaxNameBytes = 128;                  // a data file's name the driver writes

// Writes manifest.json and manifest.xxh64 (the true checksum unless `sum` is given) into dir,
// as commit_checkpoint writes them.
void write_manifest(const std::string& dir, std::string_view text, const std::string* sum) {
  write_file(dir + "/manifest.json", text);
  write_file(dir + "/manifest.xxh64",
             sum ? *sum : hash_hex(XXH64(text.data(), text.size(), 0)) + "  manifest.json\n");
}

bool same(const CheckpointPiece& a, const CheckpointPiece& b) {
  return a.tensor == b.tensor && a.state == b.state && a.file == b.file && a.offset == b.offset &&
         a.start == b.start && a.count == b.count && a.rows == b.rows &&
         a.row_stride == b.row_stride;
}

// The first field in which the manifest read back (b) differs from the one written (a), or "".
std::string difference(const CheckpointManifest& a, const CheckpointManifest& b) {
  if (b.version != a.written_version()) return "version";
  if (a.strata_version != b.strata_version || a.step != b.step) return "strata_version or step";
  if (a.windows_consumed != b.windows_consumed) return "windows_consumed";
  if (a.precision != b.precision || a.optimizer_state_dtype != b.optimizer_state_dtype)
    return "precision or state_dtypes";
  if (a.world != b.world || a.dp != b.dp || a.tp != b.tp || a.pp != b.pp) return "mesh";
  if (a.config != b.config || a.config_toml != b.config_toml) return "config or config_toml";
  if (a.tensors.size() != b.tensors.size()) return "the number of tensors";
  for (size_t i = 0; i < a.tensors.size(); ++i)
    if (a.tensors[i].name != b.tensors[i].name || a.tensors[i].shape != b.tensors[i].shape)
      return str("tensor ", i);
  if (a.pieces.size() != b.pieces.size()) return "the number of pieces";
  for (size_t i = 0; i < a.pieces.size(); ++i)
    if (!same(a.pieces[i], b.pieces[i])) return str("piece ", i);
  if (a.files.size() != b.files.size()) return "the number of files";
  for (size_t i = 0; i < a.files.size(); ++i)
    if (a.files[i].name != b.files[i].name || a.files[i].bytes != b.files[i].bytes ||
        a.files[i].xxh64 != b.files[i].xxh64)
      return str("file ", i);
  return "";
}

// Whether the driver writes the manifest's data files: small ones with names it can create.
bool small_files(const CheckpointManifest& m) {
  uint64_t total = 0;
  for (const CheckpointFile& f : m.files) {
    if (f.name.size() > kMaxNameBytes || f.name.find('\0') != std::string::npos) return false;
    if (f.bytes > kMaxFileBytes - total) return false;
    total += f.bytes;
  }
  return true;
}

// Every small tensor's every state, read in full and a middle part of it.
void read_tensors(const std::string& dir, const CheckpointManifest& m) {
  for (size_t i = 0; i < m.files.size(); ++i) {
    std::string bytes(m.files[i].bytes, '\0');
    for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = char((b * 131 + i * 29 + 17) % 251);
    write_file(dir + "/" + m.files[i].name, bytes);  // a repeated name: the last one counts
  }
  CheckpointReader reader(dir, m);
  for (const CheckpointTensor& listed : m.tensors) {
    const CheckpointTensor& t = reader.tensor(listed.name);  // a repeated name: the reader's one
    const uint64_t numel = t.numel();
    if (numel > kMaxReadNumel) continue;
    std::vector<float> full(numel), part(numel / 2);
    for (int s = 0; s < kCheckpointStates; ++s) {
      try {
        reader.read(t.name, s, 0, numel, full.data());
        reader.read(t.name, s, numel / 3, part.size(), part.data());
      } catch (const Error& e) {
        broken(str("tensor '", t.name, "' of an accepted manifest does not read: ", e.what()));
      }
      if (!part.empty() &&
          std::memcmp(part.data(), full.data() + numel / 3, part.size() * sizeof(float)) != 0)
        broken(str("tensor '", t.name, "' state ", checkpoint_state_name(s), ": elements [",
                   numel / 3, ", +", part.size(), ") read alone differ from the full read"));
    }
  }
}

}  // namespace

void checkpoint_manifest(Bytes input) {
  const std::vector<std::string_view> parts = split(as_text(input), kFileSeparator);
  const std::string sum(parts.size() > 1 ? parts[1] : std::string_view());
  const std::string in_dir = fresh_dir("manifest_in");
  write_manifest(in_dir, parts[0], parts.size() > 1 ? &sum : nullptr);
  const CheckpointManifest m = read_manifest(in_dir);

  const std::string out_dir = fresh_dir("manifest_out");
  CheckpointManifest again;
  try {
    write_manifest(out_dir, m.to_json().dump(1) + "\n", nullptr);
    again = read_manifest(out_dir);
  } catch (const Error& e) {
    broken(str("the manifest written from an accepted one is refused: ", e.what()));
  }
  if (const std::string d = difference(m, again); !d.empty())
    broken(str("the manifest does not read back as it was written: ", d, " differs"));

  if (small_files(m)) read_tensors(in_dir, m);
}

}  // namespace strata::fuzz
