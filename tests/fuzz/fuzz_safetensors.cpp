// tests/fuzz/fuzz_safetensors.cpp — fuzz target: one .safetensors file.
//
// Input: the whole file (8-byte little-endian header length, JSON header, data). It is written
// to a scratch file and opened by SafetensorsReader; an accepted file has every tensor read in
// full and in part. Shard indexes are fuzz_safetensors_index.cpp's.
#include "core/error.h"
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {

void safetensors(Bytes input) {
  static const std::string path = scratch_dir() + "/fuzz.safetensors";
  write_file(path, as_text(input));
  SafetensorsReader reader(path);
  read_all_tensors(reader, input.size());
}

}  // namespace strata::fuzz
