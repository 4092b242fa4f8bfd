// engine/checkpoint.h — strata's checkpoint format and its commit protocol (docs/checkpoint.md).
//
// A checkpoint is a folder ROOT/step_N holding one data file per world rank (rank_00000.bin,
// ...) and manifest.json, written last. Tensors are stored by Hugging Face name and global
// element ranges of the row-major tensor ("pieces"; a column slice of tensor parallelism is a
// 2-D piece: rows of a few columns each), so the format does not depend on the mesh: any mesh
// (dp × tp) can load it, each rank reading the ranges it holds. The manifest lists every file
// with its size and xxHash64. Commit: write into step_N.tmp/, fsync each file, write and fsync
// the manifest, fsync the folder, rename it to step_N/, fsync ROOT, then atomically replace
// ROOT/latest. This file does no device or engine work; the ZeRO engine fills the files and
// the trainer drives the protocol (engine/checkpoint_writer.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "engine/pipeline.h"

namespace strata {

class LlamaModel;
struct ModelConfig;
struct TestHooks;

// Version 3: m and v may be stored in bf16 ("state_dtypes"; train.optimizer_state_dtype = bf16).
// Version 2: 2-D pieces (rows, row_stride), files per world rank, tensor parallelism. Version 1
// (no 2-D pieces, written before tensor-parallel checkpoints) is still read. A save writes the
// lowest version that describes it: 2 when every state is f32 (readable by older builds), 3
// when m and v are bf16.
inline constexpr int kCheckpointVersion = 3;
inline constexpr int kCheckpointStates = 3;  // master (f32), m, v (f32 or bf16)
const char* checkpoint_state_name(int state);  // "master", "m", "v"

// `rows` runs of `count` elements of tensor `tensor`'s state `state` (row-major flat indices):
// run i holds elements [start + i·row_stride, start + i·row_stride + count). The runs are
// stored one after another as rows × count elements (f32, or bf16 for m and v of a checkpoint
// whose optimizer_state_dtype is bf16) at byte `offset` of `file`. rows = 1 is the
// plain range [start, start + count); rows > 1 (a column slice: a few columns of many rows)
// needs row_stride ≥ count.
struct CheckpointPiece {
  std::string tensor;
  int state = 0;
  std::string file;
  uint64_t offset = 0;
  uint64_t start = 0;
  uint64_t count = 0;
  uint64_t rows = 1;
  uint64_t row_stride = 0;  // 0 when rows == 1
  uint64_t numel() const { return rows * count; }
  // One past the last element it holds.
  uint64_t end() const { return start + (rows - 1) * row_stride + count; }
};

struct CheckpointFile {
  std::string name;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t numel() const;
};

struct CheckpointManifest {
  int version = kCheckpointVersion;
  std::string strata_version;
  int64_t step = 0;                 // steps completed; the run resumes at step + 1
  uint64_t windows_consumed = 0;    // logical data windows the completed steps read
  std::string precision;            // "fp32" | "bf16": the compute copy (rebuilt from master)
  // How m and v are stored: f32, or bf16 (the bits the engine held; master is always f32).
  DType optimizer_state_dtype = DType::f32;
  int world = 1, dp = 1, tp = 1, pp = 1;
  nlohmann::json config;            // the effective config (strata config --json)
  std::string config_toml;          // the same as TOML: what `--resume` starts from
  std::vector<CheckpointTensor> tensors;
  std::vector<CheckpointPiece> pieces;
  std::vector<CheckpointFile> files;

  // Bytes of one stored element of state `state` (0 master, 1 m, 2 v).
  uint64_t state_elem_bytes(int state) const {
    return state == 0 ? 4 : dtype_bytes(optimizer_state_dtype);
  }
  // The format version this manifest is written as: 2, or 3 when m and v are bf16.
  int written_version() const { return optimizer_state_dtype == DType::f32 ? 2 : 3; }

  nlohmann::json to_json() const;
  // Checks the structure (version, types, pieces inside their tensors and files); `where` names
  // the manifest's path in errors.
  static CheckpointManifest from_json(const nlohmann::json& j, const std::string& where);
};

// ---- one rank's data file ----

// One (unit, state) shard of a rank in its data file: elements [shard_begin, shard_begin +
// shard_numel) of the unit's flat layout (padding included), of elem_bytes each (master f32; m
// and v f32 or bf16, as the engine holds them), at `file_offset` (a multiple of 4096; blocks
// follow one another, unit by unit, master, m, v).
struct CheckpointBlock {
  int unit = 0;
  int state = 0;
  uint64_t file_offset = 0;
  uint64_t shard_begin = 0;
  uint64_t shard_numel = 0;
  uint64_t elem_bytes = 4;
  uint64_t bytes() const { return shard_numel * elem_bytes; }
};
// The file of world rank `rank` ("rank_00003.bin"); world rank = (pp_index · dp + dp_index) ·
// tp + tp_index (comm/mesh.h).
std::string checkpoint_rank_file(int rank);
// The blocks of the rank with data-parallel index `dp_rank` (its tp slice is `model`'s), m and v
// in `state_dtype` (f32 or bf16).
std::vector<CheckpointBlock> checkpoint_blocks(const LlamaModel& model, int dp_rank,
                                               DType state_dtype = DType::f32);
uint64_t checkpoint_file_bytes(const LlamaModel& model, int dp_rank, DType state_dtype = DType::f32);
// Every tensor's pieces for the mesh dp × tp (the manifest's table): the blocks of every rank,
// each tp rank's layout built from `config`, in global coordinates. Only primary views are
// stored (a replica — norm weights on every tp rank, a kv head on several — is read back from
// its primary's piece); a column slice's fragment of a block is at most three pieces.
// With pipeline stages (`stages`, engine/pipeline.h; empty = one stage) each stage's ranks list
// their own units' blocks.
std::vector<CheckpointPiece> checkpoint_pieces(const ModelConfig& config, int dp, int tp,
                                               DType state_dtype = DType::f32,
                                               const std::vector<StageUnits>& stages = {});
// Every tensor of the whole model (all stages) by name and global shape.
std::vector<CheckpointTensor> checkpoint_tensors(const LlamaModel& model);

// ---- folders ----

std::string checkpoint_step_name(int64_t step);  // "step_12"
// The checkpoint to load from `dir`: dir itself when it holds manifest.json, else the newest
// complete step_N in it (`latest` is only a hint: a complete newer folder wins, a pointer to a
// missing folder is ignored). Error naming dir when there is none.
std::string resolve_checkpoint(const std::string& dir);
// Complete checkpoints (step_N with a manifest) in root, oldest first.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& root);
CheckpointManifest read_manifest(const std::string& step_dir);
// Error unless `dir` (an output folder for exported weights, named by `what`, e.g. "--out") is
// neither a checkpoint root (`latest`, `.lock` or step_N folders in it) nor a step_N folder (a
// manifest.json): weights written there would sit among a run's checkpoints.
void check_not_a_checkpoint_folder(const std::string& dir, const std::string& what,
                                   const char* where);

// A run's claim on its checkpoint.dir, from before its first step to its end. Errors, before
// anything is trained:
// - ROOT holds complete checkpoints past start_step (0 for a fresh run, the step a resumed run
//   starts from): another run's, or the abandoned continuation of the run resumed. Saving beside
//   them would interleave two runs' steps, and a later --resume ROOT would pick theirs;
// - hold_lock (rank 0 of the job) and another process holds ROOT/.lock: two runs saving into one
//   folder overwrite each other's step_N. The lock (flock) goes with the process, a crashed
//   run's too; .lock names the holder's pid and host. A file system without locks (ENOLCK) only
//   gets a warning.
// Creates ROOT when missing.
class CheckpointDirClaim {
 public:
  CheckpointDirClaim(const std::string& root, int64_t start_step, bool hold_lock);
  ~CheckpointDirClaim();
  CheckpointDirClaim(const CheckpointDirClaim&) = delete;
  CheckpointDirClaim& operator=(const CheckpointDirClaim&) = delete;

 private:
  int fd_ = -1;
};

// Rank 0, once every rank's file is written and fsynced: writes and fsyncs the manifest in
// ROOT/step_N.tmp, fsyncs the folder, renames it to step_N, fsyncs ROOT, replaces ROOT/latest,
// then removes complete checkpoints older than the newest `keep` and stale step_K.tmp folders
// with K < N (never the newest complete one, never one being written). A checkpoint is renamed
// to step_K.tmp before it is removed, so a removal cut short leaves a folder that is never
// loaded and that the next commit removes. hooks: tests only
// (engine/test_hooks.h: a callback at each phase).
void commit_checkpoint(const std::string& root, const CheckpointManifest& manifest, int keep,
                       const TestHooks* hooks = nullptr);

// xxHash64 (seed 0) of a whole file, read in large pieces.
uint64_t checkpoint_file_hash(const std::string& path);
// Checks size and xxHash64 of the manifest's files i with i % ranks == rank (each rank a share);
// Error naming the file and both hashes on a mismatch.
void verify_checkpoint_files(const std::string& step_dir, const CheckpointManifest& manifest,
                             int rank, int ranks);
std::string hash_hex(uint64_t h);

// Reads global element ranges of a checkpoint's tensors, whatever mesh wrote them (the loader
// of every rank and `strata checkpoint export` use it). Files are opened once and read with
// pread; memory stays what the caller asks for.
class CheckpointReader {
 public:
  CheckpointReader(std::string step_dir, const CheckpointManifest& manifest);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const CheckpointTensor& tensor(const std::string& name) const;  // Error when absent
  // out[0, count) = elements [start, start + count) of the tensor's state, as f32 (bf16 m and v
  // are widened, which is exact). Finds the pieces in
  // O(log pieces + pieces whose span [start, end()) meets the range); a 2-D piece's runs are
  // read with one pread per run it shares with the range, or per 8 MiB of consecutive runs.
  void read(const std::string& tensor, int state, uint64_t start, uint64_t count, float* out);

 private:
  // One (tensor, state): its pieces sorted by start, and reach[i], the largest end() of
  // pieces[0..i] (2-D pieces' spans overlap: a range's pieces are the ones before it whose
  // reach passes its start).
  struct Index {
    std::vector<const CheckpointPiece*> pieces;
    std::vector<uint64_t> reach;
  };
  int fd(const std::string& file);
  void pread_all(const CheckpointPiece& p, void* dst, uint64_t bytes, uint64_t offset);
  // out[0, count) = the piece's stored elements [first, first + count) (runs laid end to end),
  // widened to f32.
  void read_elems(const CheckpointPiece& p, uint64_t first, uint64_t count, float* out);
  // Copies what piece p holds of elements [a, b) into out (out[0] is element a); returns how many.
  uint64_t read_piece(const CheckpointPiece& p, uint64_t a, uint64_t b, float* out);
  std::string dir_;
  const CheckpointManifest& manifest_;
  std::map<std::string, size_t> tensors_;  // name → index
  std::vector<Index> index_;               // tensor index · kCheckpointStates + state
  std::map<std::string, int> fds_;
  std::vector<float> scratch_;             // consecutive runs of a 2-D piece
  std::vector<uint16_t> scratch16_;        // bf16 elements before widening
};

// Writes the checkpoint's master weights as Hugging Face safetensors + config.json in out_dir
// (the model described by `model`, which must match the checkpoint's tensors), one tensor in
// memory at a time. The files are verified first.
void export_checkpoint(const std::string& step_dir, const CheckpointManifest& manifest,
                       const ModelConfig& model, const std::string& out_dir, DType dtype);

}  // namespace strata
