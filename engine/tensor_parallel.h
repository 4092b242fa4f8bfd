// engine/tensor_parallel.h — whole tensors from tensor-parallel slices: every tp rank holds its
// slice of each view (engine/flat_param.h: global shape, split dimension, first row/column);
// these helpers put the slices of every rank of the tp group together in global coordinates.
//
// They move host values through device buffers (a communicator moves device memory) and are
// collective over the tp group; they are for export and inspection (`--out`, Trainer::parameter),
// not for the training step.
#pragma once

#include <string>
#include <vector>

#include "comm/comm.h"
#include "engine/model.h"
#include "kernels/device.h"

namespace strata {

// Copies a rank's slice `v` (values: its local elements, row-major in the slice's shape) into
// `global` (the whole tensor, row-major in v.global_shape).
void place_slice(const ParamView& v, const float* values, float* global);

// The tensors of unit u whole, one per view in layout order, from this rank's unpadded flat
// values of the unit (`local`). tp may be null (tp = 1): the views are then the tensors.
// Collective over tp: every rank of the group calls it for the same unit.
std::vector<std::vector<float>> assemble_unit(Communicator* tp, Device& device, Stream& stream,
                                              const LlamaModel& model, int u,
                                              const std::vector<float>& local);

}  // namespace strata
