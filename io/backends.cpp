// io/backends.cpp — the registry of the file I/O seam: picks the backend for io.backend, probes
// each directory for O_DIRECT, and reads a file's O_DIRECT alignment from the file system.
//
// The only file of io/ that may test for build or kernel features. Where io_uring or O_DIRECT is
// refused, "auto" falls back to POSIX with one warning that says what was refused.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "io/backend.h"

namespace strata {
namespace {

uint32_t sysfs_logical_block_size(dev_t dev) {
  // A partition's queue/ lives in its parent disk's directory.
  for (const char* rel : {"/queue/logical_block_size", "/../queue/logical_block_size"}) {
    std::ifstream in(str("/sys/dev/block/", major(dev), ":", minor(dev), rel));
    uint32_t v = 0;
    if (in >> v && v >= 512 && (v & (v - 1)) == 0) return v;
  }
  return 0;
}

}  // namespace

std::string errno_string(int err) {
  const char* name = strerrorname_np(err);
  return name ? str(detail::errno_text(err), " (", name, ")")
              : str(detail::errno_text(err), " (errno ", err, ")");
}

Alignment direct_alignment(int fd) {
#ifdef STATX_DIOALIGN
  struct statx sx {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
      sx.stx_dio_offset_align > 0) {
    return Alignment{std::max<uint32_t>(sx.stx_dio_mem_align, 1), sx.stx_dio_offset_align};
  }
#endif
  struct stat sb {};
  if (::fstat(fd, &sb) == 0) {
    if (uint32_t lbs = sysfs_logical_block_size(sb.st_dev)) return Alignment{lbs, lbs};
  }
  return Alignment{4096, 4096};
}

DirectProbe probe_direct_io(const std::string& dir) {
  struct stat sb {};
  if (::stat(dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
    fail("io::probe", str("'", dir, "' is not a directory"),
         "create it first, or check offload.nvme_path / --dir");
  static std::atomic<int> counter{0};
  std::string path = str(dir, "/.strata-probe-", ::getpid(), "-", counter++);
  DirectProbe probe;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0) {
    int err = errno;
    if (err != EINVAL)
      fail("io::probe", str("cannot create a file in '", dir, "': ", errno_string(err)),
           "check the directory's permissions and free space");
    probe.why = str("O_DIRECT open refused: ", errno_string(err));
    return probe;
  }
  ::unlink(path.c_str());
  probe.alignment = direct_alignment(fd);
  size_t n = std::max<size_t>(4096, probe.alignment.offset);
  size_t align = std::max<size_t>(4096, probe.alignment.memory);
  void* buf = std::aligned_alloc(align, (n + align - 1) / align * align);
  std::memset(buf, 0x5a, n);
  ssize_t w = ::pwrite(fd, buf, n, 0);
  int werr = errno;
  ssize_t r = w == ssize_t(n) ? ::pread(fd, buf, n, 0) : -1;
  int rerr = errno;
  std::free(buf);
  ::close(fd);
  if (w != ssize_t(n))
    probe.why = str("O_DIRECT write of ", n, " bytes ", w < 0 ? errno_string(werr) : "was short");
  else if (r != ssize_t(n))
    probe.why = str("O_DIRECT read of ", n, " bytes ", r < 0 ? errno_string(rerr) : "was short");
  else
    probe.ok = true;
  return probe;
}

std::unique_ptr<FileIO> make_file_io(const IoOptions& options, std::span<const std::string> dirs) {
  const std::string& kind = options.backend;
  if (kind != "auto" && kind != "uring" && kind != "posix")
    fail("io::make_file_io", str("unknown io.backend '", kind, "'"),
         "io.backend is one of: auto, uring, posix");
  IoOptions opts = options;
  std::string refused;  // why O_DIRECT cannot be used, naming the directory
  if (opts.direct) {
    for (const std::string& dir : dirs) {
      DirectProbe p = probe_direct_io(dir);
      if (!p.ok) {
        refused = str("'", dir, "': ", p.why);
        break;
      }
    }
  }
  std::unique_ptr<IoBackend> backend;
  if (kind == "uring") {
    backend = make_uring_backend(opts.queue_depth, opts.submit_batch);
    if (!refused.empty()) {
      log_warn_once("io.fallback", "io", "O_DIRECT refused in ", refused,
                    ": io_uring goes through the page cache");
      opts.direct = false;
    }
  } else if (kind == "posix" || !refused.empty()) {
    if (!refused.empty()) {
      log_warn_once("io.fallback", "io", "O_DIRECT refused in ", refused,
                    ": using the POSIX backend through the page cache");
      opts.direct = false;
    }
    backend = make_posix_backend(opts.queue_depth);
  } else {
    try {
      backend = make_uring_backend(opts.queue_depth, opts.submit_batch);
    } catch (const Error& e) {
      log_warn_once("io.fallback", "io", "io_uring unavailable (", e.what_failed(),
                    "): using the POSIX backend");
      backend = make_posix_backend(opts.queue_depth);
    }
  }
  log_debug("io", "backend ", backend->name(), ", O_DIRECT ", opts.direct ? "on" : "off",
            ", queue depth ", opts.queue_depth, ", block ", opts.block_size, ", submit batch ",
            opts.submit_batch);
  return std::make_unique<FileIO>(std::move(backend), std::move(opts));
}

}  // namespace strata
