// comm/mesh.h — the device mesh: world = pp × dp × tp ranks, tp fastest (tensor-parallel ranks
// adjacent, as on one NVLink node), then dp, then pp; one communicator per axis.
//
// World rank = (pp_index · dp + dp_index) · tp + tp_index. The dp communicator of a rank holds
// the ranks with its (pp, tp) coordinates, ordered by dp index; likewise for tp and pp.
// Building a mesh is collective over the world communicator (it calls split()).
#pragma once

#include <memory>

#include "comm/comm.h"

namespace strata {

struct Mesh {
  int pp = 1, dp = 1, tp = 1;
  int pp_index = 0, dp_index = 0, tp_index = 0;
  Communicator* world = nullptr;  // not owned
  std::unique_ptr<Communicator> dp_comm, tp_comm, pp_comm;
};

// dp = 0 means world.size() / (tp · pp). Errors when the sizes do not multiply to the world.
Mesh make_mesh(Communicator& world, int dp, int tp, int pp);

// How many ranks of `world` run on this machine (same host name), this one included:
// collective over world (an all-gather of host names enqueued on `s`, a stream of a CPU device,
// which it synchronizes). What the plan's host-memory and NVMe checks multiply by.
int ranks_on_this_node(Communicator& world, Stream& s);

}  // namespace strata
