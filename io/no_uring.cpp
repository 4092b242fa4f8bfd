// io/no_uring.cpp — the io_uring backend's stand-in when liburing was not found at build time.
// make_uring_backend() throws "not built with io_uring"; io.backend=auto then picks POSIX.
#include "core/error.h"
#include "io/backend.h"

namespace strata {

bool uring_compiled() { return false; }

std::unique_ptr<IoBackend> make_uring_backend(int, int) {
  fail("io::uring", "not built with io_uring",
       "install liburing-dev (apt-get install -y liburing-dev) and rebuild, or use io.backend=posix");
}

}  // namespace strata
