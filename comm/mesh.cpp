// comm/mesh.cpp — make_mesh.
#include "comm/mesh.h"

#include <unistd.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/device.h"

namespace strata {

Mesh make_mesh(Communicator& world, int dp, int tp, int pp) {
  const int n = world.size();
  if (tp < 1 || pp < 1 || dp < 0)
    fail("mesh::make", str("parallel sizes must be positive: dp ", dp, ", tp ", tp, ", pp ", pp));
  const int64_t tp_pp = int64_t(tp) * pp;  // 64-bit: the config allows products beyond int
  if (dp == 0) {
    if (n % tp_pp != 0)
      fail("mesh::make", str(n, " ranks are not divisible by tp × pp = ", tp_pp),
           "launch a multiple of parallel.tp × parallel.pp ranks");
    dp = static_cast<int>(n / tp_pp);
  }
  if (dp * tp_pp != n)
    fail("mesh::make", str("parallel.dp × tp × pp = ", dp, " × ", tp, " × ", pp, " = ", dp * tp_pp,
                           " but the run has ", n, " ranks"),
         "set parallel.dp = 0 to use every rank, or launch dp × tp × pp ranks");
  Mesh m;
  m.pp = pp;
  m.dp = dp;
  m.tp = tp;
  m.world = &world;
  const int r = world.rank();
  m.tp_index = r % tp;
  m.dp_index = (r / tp) % dp;
  m.pp_index = r / (tp * dp);
  m.dp_comm = world.split(m.pp_index * tp + m.tp_index, m.dp_index);
  m.tp_comm = world.split(m.pp_index * dp + m.dp_index, m.tp_index);
  m.pp_comm = world.split(m.dp_index * tp + m.tp_index, m.pp_index);
  m.dp_comm->set_name("dp");
  m.tp_comm->set_name("tp");
  m.pp_comm->set_name("pp");
  return m;
}

int ranks_on_this_node(Communicator& world, Stream& s) {
  constexpr size_t kName = 256;  // HOST_NAME_MAX + 1 on Linux is 65; room for longer ones
  std::vector<char> mine(kName, 0), all(kName * size_t(world.size()), 0);
  if (gethostname(mine.data(), kName - 1) != 0)
    fail("mesh::node", str("gethostname failed: ", std::strerror(errno)));
  if (world.size() == 1) return 1;
  world.all_gather(s, all.data(), mine.data(), kName, CommType::u8);
  s.synchronize();
  int n = 0;
  for (int r = 0; r < world.size(); ++r)
    n += std::memcmp(all.data() + size_t(r) * kName, mine.data(), kName) == 0;
  return n;
}

}  // namespace strata
