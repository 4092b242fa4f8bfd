// engine/file_util.h — small file helpers shared by config, data and safetensors (not public API).
//
// MappedFile: a read-only memory map of a whole file (empty files map to nothing). AtomicFile:
// writes PATH.tmp, and commit() fsyncs it, renames it to PATH and fsyncs the directory; a
// destroyed AtomicFile that was never committed removes PATH.tmp. Every failure is an Error
// naming the path and the system's reason, with `where` as its component::op.
// Also: the shortest decimal text of a float, so 3e-3f prints as 0.003 in TOML and JSON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::fileutil {

class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const std::string& path, std::string_view where);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

class AtomicFile {
 public:
  AtomicFile(const std::string& path, std::string_view where);
  ~AtomicFile();  // removes PATH.tmp unless committed; never throws
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);  // all of it, or an Error
  void commit();                               // fsync, rename PATH.tmp → PATH, fsync the dir
  const std::string& tmp_path() const { return tmp_path_; }

 private:
  std::string path_;
  std::string tmp_path_;
  std::string where_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `bytes` to `path` through an AtomicFile.
void write_file_atomic(const std::string& path, std::string_view bytes, std::string_view where);
// An output file that a run or a command writes after its work, checked before that work: Error
// naming `key` when the file's folder is missing or not writable (a file is created there and
// removed: root passes access() on /proc), or when `path` is a folder.
void check_output_file(const std::string& path, std::string_view key, std::string_view where);
// Whether paths `a` and `b` name one folder (or file): the same inode when both exist, else the
// same absolute path once ".", "..", symbolic links and a trailing "/" are resolved.
bool same_folder(const std::string& a, const std::string& b);
// Error when output `out` is the very file of input `in` (the same path, a symbolic or a hard
// link): writing it would destroy the input. Nothing to check when either does not exist.
void check_not_an_input(const std::string& out, std::string_view out_key, const std::string& in,
                        std::string_view in_key, std::string_view where);

// The whole file as a string (Error naming the file when it cannot be read).
std::string read_file(const std::string& path, std::string_view where);

// Shortest decimal (printf %g style) that reads back as the same float ("0.003", "1e-05", "10000").
std::string float_text(float v);
std::string double_text(double v);
// The double nearest to float_text(v): what JSON and TOML writers should store for a float.
double float_as_decimal(float v);

}  // namespace strata::fileutil
