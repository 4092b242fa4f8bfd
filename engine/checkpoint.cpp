// engine/checkpoint.cpp — the checkpoint format: the manifest, each rank's file layout, the
// pieces table, finding the checkpoint to resume, the commit protocol and verification.
#include "engine/checkpoint.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <queue>
#include <string_view>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/watchdog.h"
#include "core/log.h"
#include "engine/file_util.h"
#include "engine/model.h"
#include "engine/safetensors.h"
#include "engine/test_hooks.h"
#include "core/dtype.h"

namespace strata {
namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kManifestSum = "manifest.xxh64";  // "<hash>  manifest.json", xxhsum's format
constexpr const char* kLatest = "latest";
constexpr const char* kFormat = "strata-checkpoint";

// fsync of a directory, so a rename or a new entry in it is durable.
void sync_dir(const std::string& dir, const char* where) {
  WatchedWait w(str("fsync of folder '", dir, "'"), WaitKind::io, watchdog_context());
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(where, str("cannot open folder '", dir, "' to fsync it: ", std::strerror(errno)));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) fail(where, str("fsync of folder '", dir, "' failed: ", std::strerror(err)));
}

// step_N → N; -1 for any other name (step_N.tmp included).
int64_t step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5) return -1;
  int64_t v = -1;
  const char* b = name.data() + 5;
  const char* e = name.data() + name.size();
  auto [p, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || p != e || v < 0) return -1;
  return v;
}

int64_t tmp_step_of(const std::string& name) {
  const std::string suffix = ".tmp";
  if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  return step_of(name.substr(0, name.size() - suffix.size()));
}

[[noreturn]] void bad_manifest(const std::string& where, const std::string& what) {
  fail("checkpoint::manifest", str(where, ": ", what),
       "the manifest was not written by this version of strata, or it was edited; checkpoints "
       "are written by `strata train` with checkpoint.dir set");
}

// v as a T: a float, or an integer T cannot hold, is refused (get<T>() would convert a float out
// of T's range with undefined behaviour, and wrap an integer). `name` names v in the message.
template <class T>
T whole(const nlohmann::json& v, std::string_view name, const std::string& where) {
  if (v.is_number_unsigned() && std::in_range<T>(v.get<uint64_t>())) return T(v.get<uint64_t>());
  if (v.is_number_integer() && !v.is_number_unsigned() && std::in_range<T>(v.get<int64_t>()))
    return T(v.get<int64_t>());
  bad_manifest(where, str(name, " is ", v.dump(), ", not an integer from ",
                          std::numeric_limits<T>::min(), " to ", std::numeric_limits<T>::max()));
}

}  // namespace

const char* checkpoint_state_name(int state) {
  static const char* names[kCheckpointStates] = {"master", "m", "v"};
  return state >= 0 && state < kCheckpointStates ? names[state] : "?";
}

uint64_t CheckpointTensor::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= uint64_t(d);
  return n;
}

std::string hash_hex(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

nlohmann::json CheckpointManifest::to_json() const {
  nlohmann::json j;
  j["format"] = kFormat;
  j["version"] = written_version();
  j["strata_version"] = strata_version;
  j["step"] = step;
  j["windows_consumed"] = windows_consumed;
  j["precision"] = precision;
  j["mesh"] = {{"world", world}, {"dp", dp}, {"tp", tp}, {"pp", pp}};
  j["config"] = config;
  j["config_toml"] = config_toml;
  j["states"] = nlohmann::json::array();
  for (int s = 0; s < kCheckpointStates; ++s) j["states"].push_back(checkpoint_state_name(s));
  if (written_version() >= 3) {
    const std::string_view mv = dtype_name(optimizer_state_dtype);
    j["state_dtypes"] = {"f32", mv, mv};
  }
  nlohmann::json ts = nlohmann::json::array();
  std::map<std::string, size_t> index;
  for (const auto& t : tensors) {
    index[t.name] = ts.size();
    ts.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", "f32"}, {"pieces", nlohmann::json::array()}});
  }
  for (const auto& p : pieces) {
    auto it = index.find(p.tensor);
    STRATA_CHECK(it != index.end(), "checkpoint::manifest", "piece of unknown tensor ", p.tensor);
    nlohmann::json jp = {{"state", checkpoint_state_name(p.state)}, {"file", p.file},
                         {"offset", p.offset}, {"start", p.start}, {"count", p.count}};
    if (p.rows > 1) {
      jp["rows"] = p.rows;
      jp["row_stride"] = p.row_stride;
    }
    ts[it->second]["pieces"].push_back(std::move(jp));
  }
  j["tensors"] = std::move(ts);
  nlohmann::json fs_ = nlohmann::json::array();
  for (const auto& f : files) fs_.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh64", hash_hex(f.xxh64)}});
  j["files"] = std::move(fs_);
  return j;
}

CheckpointManifest CheckpointManifest::from_json(const nlohmann::json& j, const std::string& where) {
  CheckpointManifest m;
  try {
    if (!j.is_object() || j.value("format", std::string()) != kFormat)
      bad_manifest(where, str("not a strata checkpoint manifest (\"format\" is not \"", kFormat, "\")"));
    m.version = whole<int>(j.at("version"), "\"version\"", where);
    if (m.version < 1 || m.version > kCheckpointVersion)
      bad_manifest(where, str("format version ", m.version, "; this strata reads versions 1 to ", kCheckpointVersion));
    m.strata_version = j.at("strata_version").get<std::string>();
    m.step = whole<int64_t>(j.at("step"), "\"step\"", where);
    m.windows_consumed = whole<uint64_t>(j.at("windows_consumed"), "\"windows_consumed\"", where);
    m.precision = j.at("precision").get<std::string>();
    const auto& mesh = j.at("mesh");
    m.world = whole<int>(mesh.at("world"), "\"world\"", where);
    m.dp = whole<int>(mesh.at("dp"), "\"dp\"", where);
    m.tp = whole<int>(mesh.at("tp"), "\"tp\"", where);
    m.pp = whole<int>(mesh.at("pp"), "\"pp\"", where);
    if (m.world < 1 || m.dp < 1 || m.tp < 1 || m.pp < 1)
      bad_manifest(where, str("mesh sizes world ", m.world, ", dp ", m.dp, ", tp ", m.tp, ", pp ",
                              m.pp, ": each is at least 1"));
    if (int64_t(m.dp) * m.tp * m.pp != m.world)
      bad_manifest(where, str("mesh world ", m.world, " is not dp ", m.dp, " x tp ", m.tp, " x pp ",
                              m.pp));
    // Version 1 stored each rank's tensor-parallel slice in local coordinates: with tp > 1 its
    // pieces do not describe the tensors.
    if (m.version == 1 && m.tp > 1)
      bad_manifest(where, str("format version 1 with tp ", m.tp, ": written before tensor-parallel "
                              "checkpoints stored global coordinates, its pieces are wrong"));
    if (j.contains("state_dtypes")) {
      if (m.version < 3)
        bad_manifest(where, str("\"state_dtypes\" in format version ", m.version, " (introduced in version 3)"));
      const auto d = j.at("state_dtypes").get<std::vector<std::string>>();
      if (d.size() != size_t(kCheckpointStates) || d[0] != "f32" || d[1] != d[2] || (d[1] != "f32" && d[1] != "bf16"))
        bad_manifest(where, "\"state_dtypes\" must be [\"f32\", X, X] with X \"f32\" or \"bf16\" (master, m, v)");
      m.optimizer_state_dtype = d[1] == "bf16" ? DType::bf16 : DType::f32;
    }
    m.config = j.at("config");
    m.config_toml = j.at("config_toml").get<std::string>();
    if (m.step < 0) bad_manifest(where, str("step ", m.step, " is negative"));
    std::map<std::string, uint64_t> file_bytes;
    for (const auto& f : j.at("files")) {
      CheckpointFile cf;
      cf.name = f.at("name").get<std::string>();
      cf.bytes = whole<uint64_t>(f.at("bytes"), "\"bytes\"", where);
      const std::string hex = f.at("xxh64").get<std::string>();
      auto [p, ec] = std::from_chars(hex.data(), hex.data() + hex.size(), cf.xxh64, 16);
      if (ec != std::errc() || p != hex.data() + hex.size() || hex.size() != 16)
        bad_manifest(where, str("file '", cf.name, "': xxh64 '", hex, "' is not 16 hex digits"));
      if (cf.name.empty() || cf.name.find('/') != std::string::npos || cf.name[0] == '.')
        bad_manifest(where, str("file name '", cf.name, "' is not a plain name inside the folder"));
      file_bytes[cf.name] = cf.bytes;
      m.files.push_back(cf);
    }
    for (const auto& t : j.at("tensors")) {
      CheckpointTensor ct;
      ct.name = t.at("name").get<std::string>();
      const auto& shape = t.at("shape");
      if (!shape.is_array())
        bad_manifest(where, str("tensor '", ct.name, "': \"shape\" is not a list"));
      for (const auto& d : shape)
        ct.shape.push_back(whole<int64_t>(d, str("a dimension of tensor '", ct.name, "'"), where));
      uint64_t numel = 1;
      for (int64_t d : ct.shape) {
        if (d < 1 || uint64_t(d) > (uint64_t(1) << 40) / numel)
          bad_manifest(where, str("tensor '", ct.name, "' has an impossible shape"));
        numel *= uint64_t(d);
      }
      for (const auto& p : t.at("pieces")) {
        CheckpointPiece cp;
        cp.tensor = ct.name;
        const std::string state = p.at("state").get<std::string>();
        cp.state = -1;
        for (int s = 0; s < kCheckpointStates; ++s)
          if (state == checkpoint_state_name(s)) cp.state = s;
        if (cp.state < 0) bad_manifest(where, str("tensor '", ct.name, "': unknown state '", state, "'"));
        cp.file = p.at("file").get<std::string>();
        cp.offset = whole<uint64_t>(p.at("offset"), "\"offset\"", where);
        cp.start = whole<uint64_t>(p.at("start"), "\"start\"", where);
        cp.count = whole<uint64_t>(p.at("count"), "\"count\"", where);
        if (p.contains("rows") || p.contains("row_stride")) {
          if (m.version < 2)
            bad_manifest(where, str("tensor '", ct.name, "': a 2-D piece (rows, row_stride) in format version ", m.version));
          cp.rows = whole<uint64_t>(p.at("rows"), "\"rows\"", where);
          cp.row_stride =
              cp.rows > 1 ? whole<uint64_t>(p.at("row_stride"), "\"row_stride\"", where) : 0;
        }
        const std::string what = cp.rows > 1 ? str(cp.rows, " rows of [", cp.start, ", +", cp.count, ") every ",
                                                   cp.row_stride, " elements")
                                             : str("[", cp.start, ", +", cp.count, ")");
        auto f = file_bytes.find(cp.file);
        if (f == file_bytes.end())
          bad_manifest(where, str("tensor '", ct.name, "': piece in unlisted file '", cp.file, "'"));
        if (cp.rows == 0)
          bad_manifest(where, str("tensor '", ct.name, "': piece [", cp.start, ", +", cp.count, ") has 0 rows"));
        if (cp.rows > 1 && cp.row_stride < cp.count)
          bad_manifest(where, str("tensor '", ct.name, "': piece of ", what, ": row_stride ", cp.row_stride,
                                  " is less than count ", cp.count, " (its rows would overlap)"));
        // The last run ends inside the tensor; the rows × count values lie inside the file.
        if (cp.count == 0 || cp.start > numel || cp.count > numel - cp.start ||
            (cp.rows > 1 && cp.rows - 1 > (numel - cp.start - cp.count) / cp.row_stride) ||
            cp.offset > f->second || cp.count > (f->second - cp.offset) / m.state_elem_bytes(cp.state) / cp.rows)
          bad_manifest(where, str("tensor '", ct.name, "': piece of ", what, " at offset ", cp.offset,
                                  " of '", cp.file, "' lies outside the tensor or the file"));
        m.pieces.push_back(cp);
      }
      m.tensors.push_back(std::move(ct));
    }
  } catch (const nlohmann::json::exception& e) {
    bad_manifest(where, str("malformed: ", e.what()));
  }
  // Every element of every tensor's every state is covered exactly once: the runs of the
  // pieces of one (tensor, state), taken in order of their start (a heap holding each piece's
  // next run: O(runs · log pieces), memory O(pieces)), follow one another without a gap or an
  // overlap. 2-D pieces that split the same rows into column blocks — what tensor parallelism
  // writes — tile a band of whole rows, checked once as one run; other 2-D pieces go row by row,
  // at most kMaxRuns runs per (tensor, state), so that a manifest claiming huge tensors cannot
  // hold the reader for hours.
  constexpr uint64_t kMaxRuns = uint64_t{1} << 24;  // strata writes at most rows × tp per tensor
  std::map<std::pair<std::string, int>, std::vector<const CheckpointPiece*>> cover;
  for (const auto& p : m.pieces) cover[{p.tensor, p.state}].push_back(&p);
  struct Run {
    uint64_t start;
    uint64_t count;                   // elements of this run
    const CheckpointPiece* piece;     // its next runs, row by row; nullptr: a band or a 1-D piece
    uint64_t row;
    bool operator>(const Run& o) const { return start > o.start; }
  };
  for (const auto& t : m.tensors)
    for (int s = 0; s < kCheckpointStates; ++s) {
      std::vector<Run> heap;
      // 2-D pieces by (row_stride, rows, first row's start): a group whose blocks tile that row
      // tiles the band of rows × row_stride elements.
      std::map<std::tuple<uint64_t, uint64_t, uint64_t>, std::vector<const CheckpointPiece*>> bands;
      for (const CheckpointPiece* p : cover[{t.name, s}]) {
        if (p->rows == 1) heap.push_back(Run{p->start, p->count, nullptr, 0});
        else bands[{p->row_stride, p->rows, p->start - p->start % p->row_stride}].push_back(p);
      }
      for (auto& [key, pieces] : bands) {
        const auto [stride, rows, first] = key;
        std::sort(pieces.begin(), pieces.end(),
                  [](const CheckpointPiece* x, const CheckpointPiece* y) { return x->start < y->start; });
        uint64_t at = first;
        for (const CheckpointPiece* p : pieces) at = p->start == at ? at + p->count : ~uint64_t{0};
        if (at == first + stride) heap.push_back(Run{first, rows * stride, nullptr, 0});
        else
          for (const CheckpointPiece* p : pieces) heap.push_back(Run{p->start, p->count, p, 0});
      }
      std::priority_queue<Run, std::vector<Run>, std::greater<Run>> runs(std::greater<Run>(), std::move(heap));
      uint64_t at = 0, taken = 0;
      while (!runs.empty()) {
        Run r = runs.top();
        runs.pop();
        if (++taken > kMaxRuns)
          bad_manifest(where, str("tensor '", t.name, "' state ", checkpoint_state_name(s),
                                  ": its pieces make more than ", kMaxRuns,
                                  " runs of elements, too many to check"));
        if (r.start != at)
          bad_manifest(where, str("tensor '", t.name, "' state ", checkpoint_state_name(s), ": elements from ",
                                  std::min(r.start, at), " are ", r.start > at ? "missing" : "stored twice"));
        at = r.start + r.count;
        if (r.piece && ++r.row < r.piece->rows) {
          r.start += r.piece->row_stride;
          runs.push(r);
        }
      }
      if (at != t.numel())
        bad_manifest(where, str("tensor '", t.name, "' state ", checkpoint_state_name(s), ": ",
                                t.numel() - at, " elements at the end are missing"));
    }
  return m;
}

// ---- data files ----

std::string checkpoint_rank_file(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank_%05d.bin", rank);
  return buf;
}

std::vector<CheckpointBlock> checkpoint_blocks(const LlamaModel& model, int dp_rank, DType state_dtype) {
  STRATA_CHECK(state_dtype == DType::f32 || state_dtype == DType::bf16, "checkpoint::blocks",
               "m and v in ", dtype_name(state_dtype));
  std::vector<CheckpointBlock> blocks;
  uint64_t at = 0;
  for (int u = 0; u < model.num_units(); ++u) {
    const FlatLayout& L = model.unit(u).layout;
    const uint64_t n = L.shard_numel();
    for (int s = 0; s < kCheckpointStates; ++s) {
      const uint64_t esz = s == 0 ? 4 : dtype_bytes(state_dtype);
      blocks.push_back(CheckpointBlock{u, s, at, uint64_t(dp_rank) * n, n, esz});
      at += n * esz;  // a multiple of 4 KiB: shards are multiples of kShardAlignElems
    }
  }
  return blocks;
}

uint64_t checkpoint_file_bytes(const LlamaModel& model, int dp_rank, DType state_dtype) {
  uint64_t b = 0;
  for (const auto& blk : checkpoint_blocks(model, dp_rank, state_dtype)) b += blk.bytes();
  return b;
}

std::vector<CheckpointPiece> checkpoint_pieces(const ModelConfig& config, int dp, int tp,
                                               DType state_dtype, const std::vector<StageUnits>& stages) {
  std::vector<CheckpointPiece> pieces;
  const std::vector<StageUnits> whole = {StageUnits{}};
  const std::vector<StageUnits>& st = stages.empty() ? whole : stages;
  for (int p = 0; p < int(st.size()); ++p)
  for (int t = 0; t < tp; ++t) {
    const LlamaModel model(config, dp, tp, t, st[size_t(p)]);
    for (int d = 0; d < dp; ++d) {
      // world rank = (pp_index · dp + dp_index) · tp + tp_index (comm/mesh.h)
      const std::string file = checkpoint_rank_file((p * dp + d) * tp + t);
      for (const auto& blk : checkpoint_blocks(model, d, state_dtype)) {
        const FlatLayout& L = model.unit(blk.unit).layout;
        const uint64_t lo = blk.shard_begin, hi = blk.shard_begin + blk.shard_numel;
        for (const auto& v : L.views()) {
          if (!v.primary) continue;  // a replica: its primary's pieces hold the same elements
          const uint64_t a = std::max<uint64_t>(lo, v.offset), b = std::min<uint64_t>(hi, v.offset + v.numel);
          if (a >= b) continue;
          for (const GlobalRuns& r : v.global_runs(a - v.offset, b - v.offset))
            pieces.push_back(CheckpointPiece{v.name, blk.state, file,
                                             blk.file_offset + (v.offset + r.local - lo) * blk.elem_bytes, r.start,
                                             r.count, r.rows, r.row_stride});
        }
      }
    }
  }
  return pieces;
}

std::vector<CheckpointTensor> checkpoint_tensors(const LlamaModel& model) {
  std::vector<CheckpointTensor> out;
  for (const auto& u : model.all_units())
    for (const auto& v : u.layout.views()) out.push_back(CheckpointTensor{v.name, v.global_shape});
  return out;
}

// ---- folders ----

std::string checkpoint_step_name(int64_t step) { return str("step_", step); }

std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t s = step_of(name);
    if (s >= 0 && fs::is_regular_file(e.path() / kManifest, ec)) out.push_back({s, e.path().string()});
  }
  std::sort(out.begin(), out.end());
  return out;
}

void check_not_a_checkpoint_folder(const std::string& dir, const std::string& what,
                                   const char* where) {
  std::error_code ec;
  std::string found;
  if (fs::exists(fs::path(dir) / kManifest, ec)) found = kManifest;
  for (const char* name : {kLatest, ".lock"})
    if (found.empty() && fs::exists(fs::path(dir) / name, ec)) found = name;
  if (found.empty() && fs::is_directory(dir, ec))
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (step_of(name) >= 0 || tmp_step_of(name) >= 0) {
        found = name;
        break;
      }
    }
  if (!found.empty())
    fail(where, str(what, " '", dir, "' is a checkpoint folder (it holds ", found, ")"),
         "write the weights to a folder of their own: there they would sit among the "
         "checkpoints");
}

std::string resolve_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / kManifest, ec)) return dir;
  if (!fs::is_directory(dir, ec))
    fail("checkpoint::resume", str("'", dir, "' is not a folder"),
         "pass the checkpoint root (checkpoint.dir) or one of its step_N folders");
  auto all = complete_checkpoints(dir);
  if (all.empty())
    fail("checkpoint::resume",
         str("'", dir, "' holds no complete checkpoint (no step_N folder with a manifest.json)"),
         "a checkpoint is complete once its manifest is written; step_N.tmp folders are "
         "unfinished saves and are never loaded");
  const std::string newest = all.back().second;
  // `latest` names the newest commit; a newer complete folder (the pointer not yet moved when
  // the writer stopped) wins, and a pointer to a folder that is gone is ignored.
  const fs::path latest = fs::path(dir) / kLatest;
  if (fs::is_regular_file(latest, ec)) {
    std::string name = fileutil::read_file(latest.string(), "checkpoint::resume");
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    const int64_t s = step_of(name);
    if (s > all.back().first && !fs::is_regular_file(fs::path(dir) / name / kManifest, ec))
      log_warn("checkpoint", "'", latest.string(), "' names ", name, ", which is not complete; using ", newest);
  }
  return newest;
}

CheckpointDirClaim::CheckpointDirClaim(const std::string& root, int64_t start_step,
                                       bool hold_lock) {
  constexpr const char* where = "checkpoint::dir";
  WatchedWait w(str("the claim of checkpoint.dir '", root, "'"), WaitKind::io, watchdog_context());
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec)
    fail(where, str("cannot create checkpoint.dir '", root, "': ", ec.message()),
         "set checkpoint.dir to a writable folder (on a fast local disk)");
  std::vector<std::string> later;
  for (const auto& [step, path] : complete_checkpoints(root))
    if (step > start_step) later.push_back(fs::path(path).filename().string());
  if (!later.empty()) {
    std::string list = later.front();
    if (later.size() > 4)
      list += str(", ... ", later.back(), " (", later.size(), " checkpoints)");
    else
      for (size_t i = 1; i < later.size(); ++i) list += ", " + later[i];
    if (start_step == 0)
      fail(where, str("checkpoint.dir '", root, "' holds the checkpoints of another run (", list,
                      "); this run starts at step 0 and would save beside them"),
           str("resume that run (--resume ", root, "), or give this one an empty folder"));
    fail(where, str("checkpoint.dir '", root, "' holds checkpoints past step ", start_step,
                    ", where this run resumes (", list, "): the continuation abandoned by "
                    "resuming an earlier step, or another run's; saving beside them would mix "
                    "the two, and a later --resume would pick theirs"),
         "move them out of the folder (they are whole runs' states), or set checkpoint.dir to "
         "another folder");
  }
  if (!hold_lock) return;
  const std::string lock = (fs::path(root) / ".lock").string();
  fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    fail(where, str("cannot open '", lock, "': ", std::strerror(errno)),
         "set checkpoint.dir to a writable folder");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd_, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? size_t(n) : 0);
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK)
      fail(where, str("another run is saving checkpoints into '", root, "' (",
                      holder.empty() ? std::string("its lock: ") + lock : holder, ")"),
           "two runs in one checkpoint.dir overwrite each other's step_N: give this run "
           "another folder, or stop the other run");
    // A file system without locks (NFSv3 without lockd: ENOLCK) can still hold checkpoints.
    log_warn("checkpoint", "cannot lock '", lock, "' (", std::strerror(err), "): a second run "
             "saving into '", root, "' would not be noticed");
    return;
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = str("pid ", ::getpid(), " on ", host, "\n");
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0)
    log_warn("checkpoint", "cannot write the holder into '", lock, "': ", std::strerror(errno));
}

CheckpointDirClaim::~CheckpointDirClaim() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

CheckpointManifest read_manifest(const std::string& step_dir) {
  const std::string path = (fs::path(step_dir) / kManifest).string();
  const std::string text = fileutil::read_file(path, "checkpoint::manifest");
  // manifest.xxh64 holds the manifest's hash (in xxhsum's format: `xxhsum -c manifest.xxh64`).
  const std::string sum_path = (fs::path(step_dir) / kManifestSum).string();
  const std::string sum = fileutil::read_file(sum_path, "checkpoint::manifest");
  const std::string want = sum.substr(0, std::min<size_t>(16, sum.size()));
  const std::string got = hash_hex(XXH64(text.data(), text.size(), 0));
  if (sum.size() < 16 || want != got)
    fail("checkpoint::verify",
         str("'", path, "' is damaged: its xxHash64 is ", got, " but '", sum_path, "' recorded '", want, "'"),
         "the manifest changed after the save; resume from an earlier step_N folder, which the run "
         "will not do by itself");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint::manifest", str(path, ": not valid JSON: ", e.what()),
         "the manifest is written last and atomically; a damaged one means the folder was "
         "changed after the save");
  }
  return CheckpointManifest::from_json(j, path);
}

void commit_checkpoint(const std::string& root, const CheckpointManifest& manifest, int keep,
                       const TestHooks* hooks) {
  constexpr const char* where = "checkpoint::commit";
  const std::string name = checkpoint_step_name(manifest.step);
  const std::string tmp = (fs::path(root) / (name + ".tmp")).string();
  const std::string final_dir = (fs::path(root) / name).string();
  run_checkpoint_hook(hooks, "manifest", manifest.step);
  const std::string text = manifest.to_json().dump(1) + "\n";
  // The manifest's own checksum goes first: a folder counts as complete once manifest.json is
  // there, and a complete folder always has both.
  fileutil::write_file_atomic((fs::path(tmp) / kManifestSum).string(),
                              hash_hex(XXH64(text.data(), text.size(), 0)) + "  " + kManifest + "\n", where);
  fileutil::write_file_atomic((fs::path(tmp) / kManifest).string(), text, where);
  sync_dir(tmp, where);
  run_checkpoint_hook(hooks, "rename", manifest.step);
  std::error_code ec;
  {
    WatchedWait w(str("rename of '", tmp, "' to '", final_dir, "'"), WaitKind::io,
                  watchdog_context());
    if (fs::exists(final_dir, ec)) fs::remove_all(final_dir, ec);  // a step saved again (resumed)
    fs::rename(tmp, final_dir, ec);
  }
  if (ec) fail(where, str("cannot rename '", tmp, "' to '", final_dir, "': ", ec.message()));
  sync_dir(root, where);
  run_checkpoint_hook(hooks, "latest", manifest.step);
  fileutil::write_file_atomic((fs::path(root) / kLatest).string(), name + "\n", where);
  // Prune: the newest `keep` complete checkpoints stay; so does every folder being written
  // (a .tmp of a later step); stale .tmp folders of earlier steps are leftovers of a crash.
  WatchedWait w(str("removal of old checkpoints in '", root, "'"), WaitKind::io,
                watchdog_context());
  auto all = complete_checkpoints(root);
  const size_t kept = size_t(std::max(keep, 1));
  for (size_t i = 0; i + kept < all.size(); ++i) {
    if (all[i].first >= manifest.step) continue;
    // Incomplete at once and for good: a removal cut short leaves a step_K.tmp, not a step_K.
    const std::string doomed = all[i].second + ".tmp";
    fs::remove_all(doomed, ec);
    fs::rename(all[i].second, doomed, ec);
    if (!ec) run_checkpoint_hook(hooks, "prune", manifest.step);
    if (!ec) fs::remove_all(doomed, ec);
    if (ec) log_warn("checkpoint", "cannot remove old checkpoint '", all[i].second, "': ", ec.message());
  }
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t s = tmp_step_of(e.path().filename().string());
    if (s >= 0 && s < manifest.step) fs::remove_all(e.path(), ec);
  }
  sync_dir(root, where);
}

uint64_t checkpoint_file_hash(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("checkpoint::verify", str("cannot open '", path, "': ", std::strerror(errno)));
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> st(XXH64_createState(), &XXH64_freeState);
  XXH64_reset(st.get(), 0);
  std::vector<char> buf(8u << 20);
  for (;;) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      fail("checkpoint::verify", str("read of '", path, "' failed: ", std::strerror(err)));
    }
    if (n == 0) break;
    XXH64_update(st.get(), buf.data(), size_t(n));
  }
  ::close(fd);
  return XXH64_digest(st.get());
}

void verify_checkpoint_files(const std::string& step_dir, const CheckpointManifest& manifest,
                             int rank, int ranks) {
  for (size_t i = 0; i < manifest.files.size(); ++i) {
    if (int(i % size_t(ranks)) != rank) continue;
    const CheckpointFile& f = manifest.files[i];
    const std::string path = (fs::path(step_dir) / f.name).string();
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec)
      fail("checkpoint::verify", str("'", path, "' listed in the manifest cannot be read: ", ec.message()),
           "the checkpoint folder is incomplete; resume from an earlier step_N folder");
    if (size != f.bytes)
      fail("checkpoint::verify", str("'", path, "' holds ", size, " bytes; the manifest says ", f.bytes),
           "the file was truncated or changed after the save; resume from an earlier step_N folder");
    const uint64_t h = checkpoint_file_hash(path);
    if (h != f.xxh64)
      fail("checkpoint::verify",
           str("'", path, "' is damaged: its xxHash64 is ", hash_hex(h), " but the manifest recorded ",
               hash_hex(f.xxh64)),
           "the file changed after the save (disk or copy error); resume from an earlier step_N "
           "folder, which the run will not do by itself");
  }
}

// ---- reading ----

CheckpointReader::CheckpointReader(std::string step_dir, const CheckpointManifest& manifest)
    : dir_(std::move(step_dir)), manifest_(manifest) {
  for (size_t i = 0; i < manifest_.tensors.size(); ++i) tensors_[manifest_.tensors[i].name] = i;
  index_.resize(manifest_.tensors.size() * kCheckpointStates);
  for (const auto& p : manifest_.pieces) {
    auto it = tensors_.find(p.tensor);
    STRATA_CHECK(it != tensors_.end() && p.state >= 0 && p.state < kCheckpointStates, "checkpoint::read",
                 "piece of unknown tensor ", p.tensor);
    index_[it->second * kCheckpointStates + size_t(p.state)].pieces.push_back(&p);
  }
  for (Index& ix : index_) {
    std::sort(ix.pieces.begin(), ix.pieces.end(),
              [](const CheckpointPiece* a, const CheckpointPiece* b) { return a->start < b->start; });
    uint64_t reach = 0;
    for (const CheckpointPiece* p : ix.pieces) ix.reach.push_back(reach = std::max(reach, p->end()));
  }
}

CheckpointReader::~CheckpointReader() {
  for (auto& [name, f] : fds_) ::close(f);
}

const CheckpointTensor& CheckpointReader::tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    fail("checkpoint::read", str("the checkpoint in '", dir_, "' has no tensor '", name, "'"),
         "it was written for another model; compare `strata checkpoint inspect` with the config");
  return manifest_.tensors[it->second];
}

int CheckpointReader::fd(const std::string& file) {
  auto it = fds_.find(file);
  if (it != fds_.end()) return it->second;
  const std::string path = (fs::path(dir_) / file).string();
  int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f < 0) fail("checkpoint::read", str("cannot open '", path, "': ", std::strerror(errno)));
  fds_[file] = f;
  return f;
}

void CheckpointReader::pread_all(const CheckpointPiece& p, void* dst, uint64_t bytes, uint64_t offset) {
  const int f = fd(p.file);
  char* d = static_cast<char*>(dst);
  while (bytes > 0) {
    ssize_t r = ::pread(f, d, bytes, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail("checkpoint::read", str("read of ", bytes, " bytes at offset ", offset, " of '", dir_, "/", p.file,
                                   "' failed: ", r < 0 ? std::strerror(errno) : "end of file"));
    d += r;
    bytes -= uint64_t(r);
    offset += uint64_t(r);
  }
}

void CheckpointReader::read_elems(const CheckpointPiece& p, uint64_t first, uint64_t count, float* out) {
  const uint64_t esz = manifest_.state_elem_bytes(p.state);
  if (esz == 4) return pread_all(p, out, count * 4, p.offset + first * 4);
  scratch16_.resize(size_t(count));
  pread_all(p, scratch16_.data(), count * 2, p.offset + first * 2);
  for (uint64_t i = 0; i < count; ++i) out[i] = bf16_bits_to_f32(scratch16_[size_t(i)]);
}

uint64_t CheckpointReader::read_piece(const CheckpointPiece& p, uint64_t a, uint64_t b, float* out) {
  if (p.rows == 1) {
    const uint64_t lo = std::max(a, p.start), hi = std::min(b, p.start + p.count);
    if (lo >= hi) return 0;
    read_elems(p, lo - p.start, hi - lo, out + (lo - a));
    return hi - lo;
  }
  // Runs i with start + i·stride < b and start + i·stride + count > a.
  const uint64_t S = p.row_stride;
  if (b <= p.start) return 0;
  const uint64_t first = a >= p.start + p.count ? (a - p.start - p.count) / S + 1 : 0;
  const uint64_t last = std::min(p.rows - 1, (b - 1 - p.start) / S);
  if (first > last) return 0;
  uint64_t got = 0;
  auto overlap = [&](uint64_t i, uint64_t& lo, uint64_t& hi) {
    const uint64_t s = p.start + i * S;
    lo = std::max(a, s);
    hi = std::min(b, s + p.count);
    return lo < hi;
  };
  if (first == last) {  // one run (a row-by-row reader): straight into out
    uint64_t lo, hi;
    if (!overlap(first, lo, hi)) return 0;
    read_elems(p, first * p.count + (lo - p.start - first * S), hi - lo, out + (lo - a));
    return hi - lo;
  }
  // Several runs: they are consecutive in the file; read up to 8 MiB of them at a time.
  const uint64_t batch = std::max<uint64_t>(1, (uint64_t(2) << 20) / p.count);
  for (uint64_t i0 = first; i0 <= last; i0 += batch) {
    const uint64_t n = std::min(batch, last - i0 + 1);
    scratch_.resize(size_t(n * p.count));
    read_elems(p, i0 * p.count, n * p.count, scratch_.data());
    for (uint64_t i = i0; i < i0 + n; ++i) {
      uint64_t lo, hi;
      if (!overlap(i, lo, hi)) continue;
      const float* src = scratch_.data() + (i - i0) * p.count + (lo - p.start - i * S);
      std::memcpy(out + (lo - a), src, (hi - lo) * 4);
      got += hi - lo;
    }
  }
  return got;
}

void CheckpointReader::read(const std::string& name, int state, uint64_t start, uint64_t count, float* out) {
  const CheckpointTensor& t = tensor(name);
  if (start > t.numel() || count > t.numel() - start || state < 0 || state >= kCheckpointStates)
    fail("checkpoint::read", str("elements [", start, ", +", count, ") of '", name, "' (state ", state,
                                 ") are outside its ", t.numel()));
  if (count == 0) return;
  const Index& ix = index_[tensors_.at(name) * kCheckpointStates + size_t(state)];
  const uint64_t end = start + count;
  // The pieces starting before `end`, back to the last one whose prefix reach passes `start`
  // (the manifest was validated: pieces do not overlap, so the counts add up).
  size_t i = size_t(std::upper_bound(ix.pieces.begin(), ix.pieces.end(), end - 1,
                                     [](uint64_t x, const CheckpointPiece* p) { return x < p->start; }) -
                    ix.pieces.begin());
  uint64_t got = 0;
  for (; i > 0 && ix.reach[i - 1] > start; --i) got += read_piece(*ix.pieces[i - 1], start, end, out);
  if (got != count)
    fail("checkpoint::read", str(count - got, " of elements [", start, ", +", count, ") of '", name, "' (",
                                 checkpoint_state_name(state), ") are in no piece of the manifest"));
}

void export_checkpoint(const std::string& step_dir, const CheckpointManifest& manifest,
                       const ModelConfig& model_config, const std::string& out_dir, DType dtype) {
  verify_checkpoint_files(step_dir, manifest, 0, 1);
  LlamaModel model(model_config, 1);
  CheckpointReader reader(step_dir, manifest);
  std::vector<TensorInfo> infos;
  const StDType st = dtype == DType::bf16 ? StDType::bf16 : dtype == DType::f16 ? StDType::f16 : StDType::f32;
  size_t views = 0;
  for (const auto& unit : model.units())
    for (const auto& v : unit.layout.views()) {
      ++views;
      if (reader.tensor(v.name).shape != v.shape)
        fail("checkpoint::export", str("tensor '", v.name, "' has another shape in the checkpoint than the "
                                       "model of its config"));
      infos.push_back(TensorInfo{v.name, st, v.shape});
    }
  if (views != manifest.tensors.size())
    fail("checkpoint::export", str("the checkpoint holds ", manifest.tensors.size(), " tensors; its config's model has ", views));
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) fail("checkpoint::export", str("cannot create '", out_dir, "': ", ec.message()));
  SafetensorsWriter writer((fs::path(out_dir) / "model.safetensors").string(), infos,
                           std::map<std::string, std::string>{{"format", "pt"}});
  std::vector<float> values;
  for (const auto& unit : model.units())
    for (const auto& v : unit.layout.views()) {
      values.resize(v.numel);
      reader.read(v.name, 0, 0, v.numel, values.data());
      writer.write_f32(v.name, values.data(), int64_t(v.numel));
    }
  writer.finish();
  // config.json last: a folder that has one holds whole weights (an export cut short, none).
  write_hf_config(out_dir, model_config, dtype);
}

}  // namespace strata
