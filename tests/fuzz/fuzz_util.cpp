// tests/fuzz/fuzz_util.cpp — the target table, the scratch directory and the helpers the drivers
// share. Nothing here is fuzzed itself.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "engine/safetensors.h"
#include "tests/fuzz/fuzz_targets.h"

namespace strata::fuzz {
namespace {

// Owns the scratch directory; removes it when the process exits normally.
struct ScratchDir {
  std::string path;
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = str(tmp && *tmp ? tmp : "/tmp", "/strata-fuzz-XXXXXX");
    if (!::mkdtemp(pattern.data())) {
      std::perror("strata fuzz: mkdtemp");
      std::abort();
    }
    path = pattern;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace

void broken(const std::string& what) { throw InvariantBroken(what); }

const std::vector<Target>& targets() {
  static const std::vector<Target> kTargets = {
      {"safetensors", safetensors},
      {"safetensors_index", safetensors_index},
      {"hf_config", hf_config},
      {"config_toml", config_toml},
      {"token_file", token_file},
      {"checkpoint_manifest", checkpoint_manifest},
      {"metrics_jsonl", metrics_jsonl},
      {"rate_cache", rate_cache},
  };
  return kTargets;
}

int run_one(void (*drive)(Bytes), const uint8_t* data, size_t size) {
  try {
    drive(Bytes(data, size));
  } catch (const Error&) {
    // refused with a clean Error: the expected outcome for bad input
  }
  return 0;
}

const std::string& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

std::string fresh_dir(const std::string& name) {
  std::filesystem::path dir = std::filesystem::path(scratch_dir()) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, std::string_view bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t done = 0; ok && done < bytes.size();) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    ok = n > 0;
    done += ok ? size_t(n) : 0;
  }
  if (fd >= 0) ::close(fd);
  if (!ok) {
    std::perror(("strata fuzz: writing " + path).c_str());
    std::abort();  // the environment, not the parser: stop loudly
  }
}

std::vector<std::string_view> split(std::string_view input, std::string_view sep) {
  std::vector<std::string_view> parts;
  for (;;) {
    size_t at = input.find(sep);
    parts.push_back(input.substr(0, at));
    if (at == std::string_view::npos) return parts;
    input.remove_prefix(at + sep.size());
  }
}

std::string_view as_text(Bytes input) {
  return {reinterpret_cast<const char*>(input.data()), input.size()};
}

void read_all_tensors(const SafetensorsReader& reader, uint64_t input_bytes) {
  for (const std::string& name : reader.names()) {
    const TensorInfo& info = reader.info(name);
    const int64_t numel = info.numel();
    // Every accepted tensor is held in the files: at least 2 bytes per element.
    if (numel < 0 || uint64_t(numel) > input_bytes / 2)
      broken(str("tensor '", name, "' claims ", numel, " elements; the input has ", input_bytes,
                 " bytes"));
    const size_t n = size_t(numel);
    if (info.dtype == StDType::i32 || info.dtype == StDType::i64) {
      std::vector<int32_t> out(n);
      reader.read_i32(name, out.data());
      continue;
    }
    std::vector<float> full(n);
    reader.read_f32(name, full.data());
    if (n >= 2) {  // a part from the middle reads the same elements
      const int64_t offset = numel / 3, count = numel / 2;
      std::vector<float> part(static_cast<size_t>(count));
      reader.read_f32(name, part.data(), offset, count);
      if (std::memcmp(part.data(), full.data() + offset, size_t(count) * sizeof(float)) != 0)
        broken(str("tensor '", name, "': elements [", offset, ", ", offset + count,
                   ") read alone differ from the full read"));
    }
  }
  (void)reader.metadata();
}

}  // namespace strata::fuzz
