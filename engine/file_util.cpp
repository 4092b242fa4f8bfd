// engine/file_util.cpp — MappedFile, AtomicFile and shortest float text.
#include "engine/file_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <utility>

#include "core/error.h"
#include "core/size.h"
#include "core/watchdog.h"

namespace strata::fileutil {
namespace {

std::string errno_string(int err) { return detail::errno_text(err); }

// Closes fd if open (destructor path: errors are not reportable there).
void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// A file system call can block for good (a dead NFS server, a FIFO that nobody reads): each is
// a watched wait (core/watchdog.h), reported with its file.
WatchedWait fs_wait(const std::string& call, const std::string& path) {
  return WatchedWait(str(call, " of '", path, "'"), WaitKind::io, watchdog_context());
}

void fsync_dir_of(const std::string& path) noexcept {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  WatchedWait w = fs_wait("fsync", dir.string());
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself already succeeded
  ::fsync(fd);
  ::close(fd);
}

// path opened for reading, with its stat in st; an Error unless it is a regular file. Opened
// without blocking: a FIFO with no writer would otherwise hold open() for good (it is refused
// below, as not a regular file); reads of a regular file ignore the flag.
int open_regular(const std::string& path, std::string_view where, struct stat& st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    fail(std::string(where), str(path, ": cannot open: ", errno_string(err)),
         err == ENOENT ? "check the path (relative paths start at the working directory)" : "");
  }
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    fail(std::string(where), str(path, ": cannot stat: ", errno_string(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(std::string(where), str(path, ": not a regular file"));
  }
  return fd;
}

}  // namespace

MappedFile::MappedFile(const std::string& path, std::string_view where) : path_(path) {
  struct stat st {};
  int fd = open_regular(path, where, st);
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      fail(std::string(where), str(path, ": cannot mmap ", size_, " bytes: ", errno_string(err)));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping stays valid
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

AtomicFile::AtomicFile(const std::string& path, std::string_view where)
    : path_(path), tmp_path_(path + ".tmp"), where_(where) {
  WatchedWait w = fs_wait("open", tmp_path_);
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    int err = errno;
    fail(where_, str(tmp_path_, ": cannot create: ", errno_string(err)),
         err == ENOENT ? "the directory must exist" : "");
  }
}

AtomicFile::~AtomicFile() {
  close_fd(fd_);
  if (!committed_) ::unlink(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  STRATA_CHECK(fd_ >= 0 && !committed_, "fileutil::write", "write after commit of ", path_);
  const char* p = static_cast<const char*>(data);
  WatchedWait w = fs_wait(str("write of ", bytes, " bytes"), tmp_path_);
  while (bytes > 0) {
    ssize_t n = ::write(fd_, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      fail(where_, str(tmp_path_, ": write of ", bytes, " bytes failed: ", errno_string(err)),
           err == ENOSPC ? "the file system is full" : "");
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  STRATA_CHECK(fd_ >= 0 && !committed_, "fileutil::commit", "commit twice of ", path_);
  WatchedWait w = fs_wait("fsync, close and rename", tmp_path_);
  if (::fsync(fd_) != 0) {
    int err = errno;
    fail(where_, str(tmp_path_, ": fsync failed: ", errno_string(err)));
  }
  int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    int err = errno;
    fail(where_, str(tmp_path_, ": close failed: ", errno_string(err)));
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    fail(where_, str("rename ", tmp_path_, " -> ", path_, " failed: ", errno_string(err)));
  }
  committed_ = true;
  fsync_dir_of(path_);
}

void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view where) {
  AtomicFile f(path, where);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

void check_output_file(const std::string& path, std::string_view key, std::string_view where) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(path).parent_path();
  std::error_code ec;
  if (!dir.empty() && !fs::is_directory(dir, ec))
    fail(std::string(where),
         str("the folder '", dir.string(), "' of ", key, " '", path, "' does not exist"),
         str("create it first (mkdir -p ", dir.string(), ") or choose another ", key));
  if (fs::is_directory(path, ec))
    fail(std::string(where), str(key, " '", path, "' is a folder"), "name a file to write");
  const std::string d = dir.empty() ? "." : dir.string();
  if (::access(d.c_str(), W_OK) != 0)
    fail(std::string(where),
         str("cannot write ", key, " '", path, "': the folder '", d, "' is not writable (",
             errno_string(errno), ")"),
         str("write ", key, " in a writable folder"));
  // access() answers yes to root where no file can be made (/proc, a read-only mount): a file
  // created and removed says so before the work whose result it would hold.
  const std::string probe = str(d, "/.strata-write-check-", ::getpid());
  WatchedWait w = fs_wait("write check (create, remove)", probe);  // a dead NFS server
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno != EEXIST)
    fail(std::string(where),
         str("cannot write ", key, " '", path, "': no file can be created in '", d, "' (",
             errno_string(errno), ")"),
         str("write ", key, " on a writable file system"));
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
}

void check_not_an_input(const std::string& out, std::string_view out_key, const std::string& in,
                        std::string_view in_key, std::string_view where) {
  std::error_code ec;
  if (out.empty() || in.empty() || !std::filesystem::equivalent(out, in, ec) || ec) return;
  fail(std::string(where),
       str(out_key, " '", out, "' is ", in_key, " '", in, "', an input: writing it would destroy "
           "it"),
       str("give ", out_key, " another path"));
}

bool same_folder(const std::string& a, const std::string& b) {
  namespace fs = std::filesystem;
  if (a.empty() || b.empty()) return false;
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  auto absolute = [](const std::string& p) {
    std::error_code e;
    const fs::path c = fs::weakly_canonical(p, e);
    if (e) return fs::path();
    return c.has_filename() ? c : c.parent_path();  // "dir/" and "dir" alike
  };
  const fs::path x = absolute(a);
  return !x.empty() && x == absolute(b);
}

std::string read_file(const std::string& path, std::string_view where) {
  // To the end of the file, not st_size bytes: a pseudo-file reports size 0 and has content
  // (/proc/cpuinfo), or refuses to be read (/proc/self/mem: EIO); neither reads as empty. Nor
  // does one read on without end (/proc/self/pagemap): past the larger of its size and 16 MiB, a
  // file is refused.
  struct stat st {};
  int fd = open_regular(path, where, st);
  const uint64_t limit = std::max<uint64_t>(uint64_t(st.st_size), uint64_t{16} << 20);
  std::string text;
  text.reserve(size_t(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      ::close(fd);
      fail(std::string(where), str(path, ": cannot read: ", errno_string(err)));
    }
    text.append(buf, size_t(n));
    if (text.size() > limit) {
      ::close(fd);
      fail(std::string(where),
           str(path, ": reads past ", format_bytes(limit), " (its size says ",
               format_bytes(uint64_t(st.st_size)), "): not a file to read whole"));
    }
  }
  ::close(fd);
  return text;
}

std::string float_text(float v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
  return std::string(buf, ec == std::errc() ? end : buf);
}

std::string double_text(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);
  return std::string(buf, ec == std::errc() ? end : buf);
}

double float_as_decimal(float v) {
  std::string s = float_text(v);
  double d = static_cast<double>(v);
  std::from_chars(s.data(), s.data() + s.size(), d);  // inf/nan parse too; else keep the cast
  return d;
}

}  // namespace strata::fileutil
