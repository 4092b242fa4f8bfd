// engine/info.cpp — io_info(): whether io_uring was built and whether this kernel lets this
// process use it, whether it registers buffers and files, how the working directory takes
// O_DIRECT, and which pages staging memory gets (io/huge_pages.h).
#include "engine/info.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <exception>
#include <vector>

#include "io/backend.h"
#include "io/huge_pages.h"

namespace strata {

nlohmann::json io_info() {
  nlohmann::json j;
  j["io_uring_built"] = uring_compiled();
  // Staging pages first: the probe below registers a 2 MiB buffer, as the engine's pool does.
  const HugePageSystem hp = huge_page_system();
  j["staging_pages"] = std::string(page_kind_name(hp.staging));
  if (!hp.staging_why.empty()) j["staging_pages_why"] = hp.staging_why;
  j["hugetlb_2m_pages"] = {{"total", hp.hugetlb_2m_total}, {"free", hp.hugetlb_2m_free}};
  j["thp"] = {{"enabled", hp.thp_enabled}, {"defrag", hp.thp_defrag}};
  if (hp.memlock_limit_bytes == UINT64_MAX) j["memlock_limit_bytes"] = "unlimited";
  else j["memlock_limit_bytes"] = hp.memlock_limit_bytes;
  j["cap_ipc_lock"] = hp.ipc_lock;
  if (uring_compiled()) {
    try {
      auto backend = make_uring_backend(4);
      j["io_uring_usable"] = true;
      // Whether this process may register staging memory (fixed buffers) and files: one 2 MiB
      // buffer, as the pinned pool's slab would be, and this directory's probe file.
      HugePageBuffer probe(HugePageBuffer::kHugePage);
      std::vector<iovec> one{iovec{probe.data(), probe.size()}};
      j["io_uring_registers_buffers"] = backend->register_buffers(one);
      backend->register_buffers({});
      int fd = ::open(".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
      if (fd >= 0) {
        const int file = backend->add_file(fd);
        j["io_uring_registers_files"] = backend->file_registered(file);
        backend->remove_file(file);
        ::close(fd);
      }
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
