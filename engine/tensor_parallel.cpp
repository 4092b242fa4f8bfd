// engine/tensor_parallel.cpp — assembling whole tensors from the tp ranks' slices.
#include "engine/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace strata {

void place_slice(const ParamView& v, const float* values, float* global) {
  if (v.split_dim != 1) {  // whole, or a block of rows: contiguous in the global tensor
    std::memcpy(global + v.global_index(0), values, v.numel * sizeof(float));
    return;
  }
  const size_t rows = size_t(v.shape[0]), cols = size_t(v.shape[1]);
  for (size_t r = 0; r < rows; ++r)
    std::memcpy(global + v.global_index(r * cols), values + r * cols, cols * sizeof(float));
}

std::vector<std::vector<float>> assemble_unit(Communicator* tp, Device& device, Stream& stream,
                                              const LlamaModel& model, int u,
                                              const std::vector<float>& local) {
  const FlatLayout& L = model.unit(u).layout;
  STRATA_CHECK(local.size() == L.numel(), "tp::assemble", "unit ", model.unit(u).name, " has ",
               L.numel(), " elements, got ", local.size());
  std::vector<std::vector<float>> out;
  const int size = tp ? tp->size() : 1;
  if (size == 1) {
    for (const auto& v : L.views())
      out.emplace_back(local.begin() + long(v.offset), local.begin() + long(v.offset + v.numel));
    return out;
  }
  // Every rank's layout of the unit (the slices of rank r), and the largest unit to gather.
  std::vector<LlamaModel> peers;
  size_t most = 0;
  for (int r = 0; r < size; ++r) {
    peers.emplace_back(model.config(), L.dp(), size, r, model.stage());  // this stage's units
    most = std::max(most, peers.back().unit(u).layout.numel());
  }
  Buffer send = device.alloc(most * 4, "tp assembly");
  Buffer recv = device.alloc(most * 4 * size_t(size), "tp assembly");
  std::vector<float> mine(most, 0.0f), all(most * size_t(size));
  std::copy(local.begin(), local.end(), mine.begin());
  stream.copy(send.data(), mine.data(), most * 4);
  tp->all_gather(stream, recv.data(), send.data(), most, CommType::f32);
  // Watched: on CUDA the copy into pageable memory below would block the host unwatched.
  stream.synchronize();
  stream.copy(all.data(), recv.data(), all.size() * 4);
  stream.synchronize();
  for (size_t i = 0; i < L.views().size(); ++i) {
    std::vector<float> global(L.views()[i].global_numel());
    for (int r = 0; r < size; ++r) {
      const ParamView& v = peers[size_t(r)].unit(u).layout.views()[i];
      place_slice(v, all.data() + size_t(r) * most + v.offset, global.data());
    }
    out.push_back(std::move(global));
  }
  return out;
}

}  // namespace strata
