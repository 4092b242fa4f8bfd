// engine/safetensors.h — reading and writing Hugging Face safetensors, and config.json.
//
// Format: an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {...}}, then the data. Reading bounds-checks the
// header (its length against the file, every offset pair against the data size, begin <= end,
// end - begin == numel × element size, no overlaps, known dtypes) and reports a bad file as an
// Error naming the file and tensor. A directory is read through model.safetensors or
// model.safetensors.index.json (several shards). Writing goes to PATH.tmp, is fsynced, then
// renamed, so a half-written file never passes for a whole one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "engine/config.h"

namespace strata {

enum class StDType { f32, bf16, f16, i32, i64 };

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::f32;
  std::vector<int64_t> shape;
  int64_t numel() const;
};

class SafetensorsReader {
 public:
  // path: a .safetensors file, or a directory holding model.safetensors or
  // model.safetensors.index.json.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  bool has(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // Error naming the tensor if absent
  std::vector<std::string> names() const;                 // sorted
  const std::map<std::string, std::string>& metadata() const;  // "__metadata__" of the first file

  // Elements [offset, offset + count) of a float tensor (f32, bf16 or f16), converted to f32.
  void read_f32(const std::string& name, float* out, int64_t offset = 0, int64_t count = -1) const;
  // An integer tensor (i32 or i64), converted to int32 (Error when a value does not fit).
  void read_i32(const std::string& name, int32_t* out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Streams a safetensors file: the header is written from the full list of tensors first, then
// each tensor's data in that order; finish() fsyncs and renames PATH.tmp to PATH.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<TensorInfo>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // removes PATH.tmp when finish() was not reached
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Data of the next tensor in order, given as f32 and converted to the tensor's dtype.
  void write_f32(const std::string& name, const float* data, int64_t count);
  // Data of the next tensor in order, raw bytes of the tensor's dtype.
  void write_raw(const std::string& name, const void* data, uint64_t bytes);
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Hugging Face config.json for LlamaForCausalLM: reads hidden_size, intermediate_size,
// num_attention_heads, num_key_value_heads (default: num_attention_heads), num_hidden_layers,
// vocab_size, rms_norm_eps, tie_word_embeddings, max_position_embeddings and the rotary
// settings (transformers 5's rope_parameters, or transformers 4's top-level rope_theta and
// rope_scaling; rope types default, linear, llama3) into the model section; writes them back in
// transformers 5's layout (with architectures, model_type, hidden_act, torch_dtype).
ModelConfig read_hf_config(const std::string& dir);
void write_hf_config(const std::string& dir, const ModelConfig& model, DType dtype);

}  // namespace strata
