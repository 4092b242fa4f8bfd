// tests/fuzz/fuzz_safetensors_index.cpp — fuzz target: a sharded checkpoint directory
// (model.safetensors.index.json and its shards).
//
// Input: files joined by kFileSeparator ("\n--file--\n"): first the index JSON, then up to 8
// shard files, written as 1.safetensors, 2.safetensors, ... beside it in a fresh directory.
// The directory is opened by SafetensorsReader as --init-from opens one; an accepted checkpoint
// has every tensor read in full and in part.
#include "core/error.h"
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {

void safetensors_index(Bytes input) {
  constexpr size_t kMaxShards = 8;
  const std::vector<std::string_view> files = split(as_text(input), kFileSeparator);
  const std::string dir = fresh_dir("index");
  write_file(dir + "/model.safetensors.index.json", files[0]);
  for (size_t i = 1; i < files.size() && i <= kMaxShards; ++i)
    write_file(str(dir, "/", i, ".safetensors"), files[i]);
  SafetensorsReader reader(dir);
  read_all_tensors(reader, input.size());
}

}  // namespace strata::fuzz
