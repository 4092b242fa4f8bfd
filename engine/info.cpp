// engine/info.cpp — io_info(): whether io_uring was built and whether this kernel lets this
// process use it, and how the working directory takes O_DIRECT.
#include "engine/info.h"

#include <exception>

#include "io/backend.h"

namespace strata {

nlohmann::json io_info() {
  nlohmann::json j;
  j["io_uring_built"] = uring_compiled();
  if (uring_compiled()) {
    try {
      make_uring_backend(4);
      j["io_uring_usable"] = true;
    } catch (const std::exception& e) {
      j["io_uring_usable"] = false;
      j["io_uring_refused"] = e.what();
    }
  } else {
    j["io_uring_usable"] = false;
  }
  DirectProbe p = probe_direct_io(".");
  j["o_direct_here"] = p.ok;
  if (!p.ok) j["o_direct_refused"] = p.why;
  return j;
}

}  // namespace strata
