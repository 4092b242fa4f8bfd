// engine/checkpoint_writer.h — saves checkpoints on a thread of its own, so training goes on
// while the files are written (docs/checkpoint.md, "Writing").
//
// The trainer hands over a save after a step's optimizer update; the writer streams this rank's
// master, m and v shards into ROOT/step_N.tmp/rank_R.bin through the I/O engine (io_uring,
// O_DIRECT; states in memory are written straight from where they live, states on NVMe are read
// chunk by chunk through the swapper into pinned staging), hashing each chunk in file order
// (xxHash64), fsyncs the file, gathers every rank's size and hash, and rank 0 commits
// (engine/checkpoint.h). The ordering rule: forward and backward never write master, m or v, so
// the next step computes while the save reads them; the next optimizer step waits until the
// save has read all of them (wait_reads: every write of this rank's file has completed; the
// fsync, the exchange of hashes and the commit run on behind it). Errors of a save are rethrown on the trainer's thread
// at its next call here; the previous checkpoint is left as it was.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/checkpoint.h"
#include "kernels/device.h"

namespace strata {

class Communicator;
class Device;
class FileIO;
class Stream;
struct TestHooks;

// Where the writer reads one rank's blocks from (implemented by the ZeRO engine).
class CheckpointSource {
 public:
  virtual ~CheckpointSource() = default;
  // Host-readable bytes of the block (block.bytes()), or null when the block lives on NVMe.
  virtual const void* block_memory(const CheckpointBlock& block) = 0;
  // NVMe blocks: starts reading bytes [offset, offset + bytes) of the block into `buffer`
  // (pinned, 4096-aligned; offset and bytes multiples of 4096); returns a ticket for wait_read.
  // Called from the writer's thread.
  virtual uint64_t read_block(const CheckpointBlock& block, uint64_t offset, void* buffer,
                              uint64_t bytes) = 0;
  virtual void wait_read(uint64_t ticket) = 0;
};

struct CheckpointWriterOptions {
  std::string root;                // checkpoint.dir
  int keep = 3;                    // checkpoint.keep
  uint64_t chunk_bytes = 8u << 20; // staging chunk for NVMe blocks and unaligned memory
  int depth = 4;                   // chunks in flight
  std::string io_backend = "auto";
  int io_queue_depth = 32;
  uint64_t io_block_size = 1u << 20;
  int io_submit_batch = kDefaultSubmitBatch;
  // Tests only (engine/test_hooks.h: faults in the file writes, a callback at each phase of a
  // save); null in a real run.
  std::shared_ptr<const TestHooks> test_hooks;
};

// What the writer measured of the last save that finished.
struct CheckpointStats {
  int64_t step = -1;
  uint64_t bytes = 0;      // this rank's file
  double write_ms = 0;     // first byte submitted to file fsynced (this rank)
  double commit_ms = 0;    // gather + manifest + renames (rank 0) and the final barrier
};

class CheckpointWriter {
 public:
  // comm: a communicator of every rank, ranked as the world (the writer's own: its collectives
  // run on its thread); rank r writes rank_r.bin, the file the manifest's pieces name for world
  // rank r.
  CheckpointWriter(Communicator& comm, CheckpointWriterOptions options);
  ~CheckpointWriter();  // waits for a save in progress; its error is logged
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Starts saving `manifest.step` (manifest without files: the writer adds them) from `source`,
  // after the previous save has finished (its error is rethrown here). The source and what it
  // points to must stay valid until wait_reads() has returned.
  void start(CheckpointManifest manifest, std::vector<CheckpointBlock> blocks, CheckpointSource& source);
  // Until the save in progress has read every block (before the next optimizer step may write
  // them). Rethrows the save's error.
  void wait_reads();
  // Until the save in progress is committed on every rank; rethrows its error.
  void wait();
  // Rethrows the error of a save that has failed; never blocks.
  void poll();
  bool busy();
  CheckpointStats last_stats();

 private:
  struct Job {
    CheckpointManifest manifest;
    std::vector<CheckpointBlock> blocks;
    CheckpointSource* source = nullptr;
  };
  void run();
  void save(Job& job);
  void write_file(Job& job, const std::string& path, uint64_t& bytes, uint64_t& hash);
  void rethrow_locked(std::unique_lock<std::mutex>& lock);

  Communicator& comm_;
  CheckpointWriterOptions opt_;
  std::unique_ptr<Device> cpu_;       // host memory and the stream the writer's collectives run on
  std::unique_ptr<Stream> stream_;
  Buffer staging_;                    // depth chunks of pinned memory (declared before fio_)
  std::unique_ptr<FileIO> fio_;       // the writer thread's queue to the checkpoint files

  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Job> job_;          // the save in progress (or queued)
  bool reads_done_ = true, done_ = true, stop_ = false;
  std::exception_ptr error_;
  CheckpointStats stats_;
  std::thread worker_;
};

}  // namespace strata
