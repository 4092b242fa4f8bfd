// offload/swap_space.cpp — SwapSpace: the free-space check, the preallocated striped files, and
// first-fit extents over one logical space.
#include "offload/swap_space.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/watchdog.h"

namespace strata {
namespace {

std::string errno_text_of(int err) { return detail::errno_text(err); }

// Removes the files created so far if construction fails before they are open and unlinked.
struct CreatedFiles {
  std::vector<std::string> paths;
  ~CreatedFiles() {
    for (const std::string& p : paths) ::unlink(p.c_str());
  }
};

// The file system a swap file under `dir` lands on (its nearest existing ancestor's); `problem`
// says why none can be made there.
struct FolderFs {
  dev_t dev = 0;
  uint64_t free_bytes = 0;
  std::string problem;
  bool in_memory = false;
};
FolderFs folder_fs(const std::string& dir) {
  FolderFs f;
  std::error_code ec;
  std::filesystem::path p(dir);
  // Up to the nearest existing folder; a path that cannot be looked up (a symbolic link loop, a
  // name too long) is the problem, not a folder to be made.
  while (!p.empty() && !std::filesystem::exists(p, ec)) {
    if (ec) {
      f.problem = str("'", p.string(), "' cannot be looked up: ", ec.message());
      return f;
    }
    p = p.parent_path();
  }
  const std::string at = p.empty() ? "." : p.string();
  struct stat sb {};
  struct statvfs vfs {};
  if (!std::filesystem::is_directory(at, ec)) f.problem = str("'", at, "' is not a folder");
  else if (::stat(at.c_str(), &sb) != 0)
    f.problem = str("stat('", at, "') failed: ", errno_text_of(errno));
  else if (::statvfs(at.c_str(), &vfs) != 0)
    f.problem = str("statvfs('", at, "') failed: ", errno_text_of(errno));
  else if (vfs.f_flag & ST_RDONLY) f.problem = "a read-only file system";
  else if (vfs.f_blocks == 0) f.problem = "not on a disk";
  else if (::access(at.c_str(), W_OK) != 0) f.problem = str("'", at, "' is not writable");
  else {
    f.dev = sb.st_dev;
    f.free_bytes = uint64_t(vfs.f_bavail) * vfs.f_frsize;
    struct statfs fs {};
    f.in_memory = ::statfs(at.c_str(), &fs) == 0 &&
                  (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
  }
  return f;
}

}  // namespace

std::vector<SwapFileSystem> swap_file_systems(const std::vector<std::string>& dirs) {
  std::vector<SwapFileSystem> out;
  std::vector<dev_t> devs;  // out[i]'s device; none for an entry with a problem
  for (const std::string& dir : dirs) {
    const FolderFs f = folder_fs(dir);
    if (!f.problem.empty()) {
      out.push_back({str("'", dir, "'"), 1, 0, f.problem});
      devs.push_back(dev_t(-1));
      continue;
    }
    size_t i = 0;
    while (i < out.size() && !(out[i].problem.empty() && devs[i] == f.dev)) ++i;
    if (i == out.size()) {
      out.push_back({str("'", dir, "'"), 1, f.free_bytes, "", f.in_memory});
      devs.push_back(f.dev);
    } else {
      out[i].dirs += str(", '", dir, "'");
      ++out[i].files;
    }
  }
  return out;
}

uint64_t swap_capacity(uint64_t bytes, uint64_t extents, size_t dirs, uint64_t stripe_bytes) {
  const uint64_t slack = dirs > 1 ? stripe_bytes : uint64_t{1} << 20;
  return checked_add(bytes, checked_mul(extents, slack, "swap capacity"), "swap capacity");
}

uint64_t swap_file_share(uint64_t capacity, size_t dirs, uint64_t stripe_bytes) {
  if (dirs <= 1) return round_up(capacity, 4096);
  return round_up(capacity, checked_mul(stripe_bytes, dirs, "swap share")) / dirs;
}

SwapSpace::SwapSpace(FileIO& io, SwapSpaceOptions options) : io_(io), options_(std::move(options)) {
  const auto& dirs = options_.dirs;
  if (dirs.empty())
    fail("offload::swap_space", "no directory for the NVMe tier",
         "set offload.nvme_path to one directory per NVMe device");
  if (options_.capacity_bytes == 0) fail("offload::swap_space", "capacity is 0");
  if (options_.stripe_bytes < 4096 || options_.stripe_bytes % 4096)
    fail("offload::swap_space",
         str("stripe size ", options_.stripe_bytes, " is not a positive multiple of 4096"),
         "set io.stripe_size to e.g. 1M");
  const uint64_t n = dirs.size();
  const uint64_t share = swap_file_share(options_.capacity_bytes, n, options_.stripe_bytes);

  for (const std::string& dir : dirs) {
    struct stat sb {};
    if (::stat(dir.c_str(), &sb) != 0 || !S_ISDIR(sb.st_mode))
      fail("offload::swap_space", str("'", dir, "' is not a directory"),
           "create it, or fix offload.nvme_path");
  }
  // Free space, per file system (several directories may share one).
  for (const SwapFileSystem& f : swap_file_systems(dirs)) {
    if (!f.problem.empty())
      fail("offload::swap_space", str("no swap file can be made in ", f.dirs, ": ", f.problem),
           "point offload.nvme_path at writable folders on a disk");
    const uint64_t needed = checked_mul(share, f.files, "swap share");
    if (needed > f.free_bytes)
      throw Error("offload::swap_space",
                  str("not enough free space for the NVMe swap space in ", f.dirs, ": needs ",
                      format_bytes(needed), " (", needed, " bytes), ",
                      format_bytes(f.free_bytes), " (", f.free_bytes, " bytes) available"),
                  {"free space there, add directories on other devices to offload.nvme_path, "
                   "or place less state on nvme (offload.params / grads / optimizer = host)"});
  }

  // Create and preallocate, then open through the FileIO and unlink.
  CreatedFiles created;
  for (uint64_t i = 0; i < n; ++i) {
    std::string path = str(dirs[i], "/strata-", ::getpid(), "-", options_.name, "-", i, ".swap");
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
      fail("offload::swap_space", str("cannot create '", path, "': ", errno_text_of(errno)),
           "check the directory's permissions");
    created.paths.push_back(path);
    int rc = ::fallocate(fd, 0, 0, off_t(share));
    int err = rc == 0 ? 0 : errno;
    if (rc != 0 && (err == EOPNOTSUPP || err == ENOSYS)) {
      log_warn_once("swap.no_fallocate", "offload",
                    "fallocate is not supported in '", dirs[i],
                    "': the swap files are sparse and may run out of space later");
      rc = ::ftruncate(fd, off_t(share));
      err = rc == 0 ? 0 : errno;
    }
    ::close(fd);
    if (rc != 0)
      throw Error("offload::swap_space",
                  str("cannot preallocate ", format_bytes(share), " in '", path,
                      "': ", errno_text_of(err)),
                  {err == ENOSPC ? "free space there or lower the amount of state placed on nvme"
                                 : "check the file system"});
    paths_.push_back(path);
  }
  file_ = io_.open(FileSpec{paths_, options_.stripe_bytes, false});
  for (const std::string& p : paths_) ::unlink(p.c_str());
  created.paths.clear();

  Alignment a = io_.alignment(file_);
  granule_ = std::max<uint64_t>(4096, a.offset);
  capacity_ = share * n;
  free_.emplace(0, capacity_);
  log_debug("offload", "swap space of ", format_bytes(capacity_), " over ", n,
            " file(s), stripe ", format_bytes(options_.stripe_bytes), ", granule ", granule_);
}

SwapSpace::~SwapSpace() {
  if (file_ < 0) return;
  try {
    WatchedWait w(str("the swap space over ", paths_.size(), " file(s) drains its I/O at shutdown"),
                  WaitKind::io, watchdog_context());
    io_.drain();
  } catch (const std::exception& e) {
    log_error("offload", "swap space: error while draining at shutdown: ", e.what());
  }
  try {
    io_.close(file_);
  } catch (const std::exception& e) {
    log_error("offload", "swap space: error while closing: ", e.what());
  }
}

const SwapExtent& SwapSpace::allocate(const std::string& key, uint64_t bytes) {
  if (bytes == 0) fail("offload::swap_space", str("extent '", key, "' of 0 bytes"));
  if (extents_.count(key))
    fail("offload::swap_space", str("extent '", key, "' is already allocated"));
  uint64_t size = round_up(bytes, granule_);
  uint64_t align = (options_.dirs.size() > 1 && size >= options_.stripe_bytes)
                       ? options_.stripe_bytes : granule_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    uint64_t start = round_up(it->first, align), end = it->first + it->second;
    if (start + size > end) continue;
    uint64_t before = start - it->first, after = end - (start + size);
    uint64_t free_start = it->first;
    free_.erase(it);
    if (before) free_.emplace(free_start, before);
    if (after) free_.emplace(start + size, after);
    used_ += size;
    return extents_.emplace(key, SwapExtent{start, size}).first->second;
  }
  uint64_t largest = 0;
  for (const auto& [off, len] : free_) largest = std::max(largest, len);
  throw Error("offload::swap_space",
              str("no room for extent '", key, "' of ", format_bytes(size), ": ",
                  format_bytes(capacity_ - used_), " free of ", format_bytes(capacity_),
                  ", largest free range ", format_bytes(largest)),
              {"the swap space is sized from the plan; a larger model needs a larger one"});
}

void SwapSpace::release(const std::string& key) {
  auto it = extents_.find(key);
  if (it == extents_.end()) fail("offload::swap_space", str("no extent '", key, "' to release"));
  uint64_t off = it->second.offset, len = it->second.bytes;
  extents_.erase(it);
  used_ -= len;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_.emplace(off, len);
}

const SwapExtent& SwapSpace::extent(const std::string& key) const {
  auto it = extents_.find(key);
  if (it == extents_.end())
    fail("offload::swap_space", str("no extent '", key, "' in the swap space"),
         "allocate() it before reading or writing");
  return it->second;
}

IoRequest SwapSpace::request(IoOp op, const std::string& key, void* buffer, uint64_t length,
                             uint64_t offset, uint64_t tag) const {
  const SwapExtent& e = extent(key);
  if (offset > e.bytes || length > e.bytes - offset)
    fail("offload::swap_space",
         str(io_op_name(op), " of ", length, " bytes at offset ", offset, " runs past extent '",
             key, "' of ", e.bytes, " bytes"));
  return IoRequest{op, file_, e.offset + offset, buffer, length, tag};
}

void SwapSpace::write(const std::string& key, const void* buffer, uint64_t length,
                      uint64_t offset) {
  IoRequest r = request(IoOp::write, key, const_cast<void*>(buffer), length, offset);
  io_.run({&r, 1});
}

void SwapSpace::read(const std::string& key, void* buffer, uint64_t length, uint64_t offset) {
  IoRequest r = request(IoOp::read, key, buffer, length, offset);
  io_.run({&r, 1});
}

}  // namespace strata
