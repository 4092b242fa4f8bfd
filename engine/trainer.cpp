// engine/trainer.cpp — the training loop of engine/trainer.h.
#include "engine/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>

#include <tbb/global_control.h>

#include "core/cpu.h"
#include "core/error.h"
#include "core/log.h"
#include "core/size.h"
#include "core/trace.h"
#include "core/watchdog.h"
#include "engine/checkpoint_writer.h"
#include "engine/test_hooks.h"
#include "comm/comm_nccl.h"
#include "engine/data.h"
#include "comm/mesh.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "engine/safetensors.h"
#include "engine/tensor_parallel.h"
#include "engine/zero.h"
#include "kernels/device.h"
#include "optimizer/schedule.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Numbers of the progress line: "%.Nf", "%.2e", and a duration as 45s, 12m05s or 3h07m.
std::string fixed(double v, int digits) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}
std::string sci(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.2e", v);
  return b;
}
std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const int64_t s = int64_t(seconds + 0.5);
  char b[64];
  if (s < 60)
    std::snprintf(b, sizeof b, "%llds", (long long)s);
  else if (s < 3600)
    std::snprintf(b, sizeof b, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  else
    std::snprintf(b, sizeof b, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  return b;
}

// The rank's index among the ranks of its machine (Open MPI and PMIx say so; else the world rank).
int local_rank() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"})
    if (const char* e = std::getenv(v)) return std::atoi(e);
  return 0;
}

DeviceKind pick_device(const std::string& name) {
  if (name == "cpu") return DeviceKind::cpu;
  if (name == "cuda") return DeviceKind::cuda;
  return cuda_device_count() > 0 ? DeviceKind::cuda : DeviceKind::cpu;  // auto
}

// Host staging for one micro-batch: inputs and targets (B × T each) and the event that says the
// device has consumed them.
struct HostBatch {
  Buffer tokens;
  std::unique_ptr<Event> consumed;
};

}  // namespace

struct Trainer::Impl {
  Config cfg;
  TrainerOptions opt;
  Communicator& world;
  Mesh mesh;
  Communicator* dpc = nullptr;  // the data-parallel group: mesh.dp_comm, or NCCL on CUDA
  std::unique_ptr<Communicator> nccl_dp;       // the data-parallel group over NCCL (CUDA)
  Communicator* tpc = nullptr;  // the tensor-parallel group (tp > 1): mesh.tp_comm, or NCCL
  Communicator* kvc = nullptr;  // the ranks sharing this rank's kv head (tp > n_kv_heads)
  std::unique_ptr<Communicator> kv_mpi, nccl_tp, nccl_kv;
  std::unique_ptr<Device> host_device;         // for host-memory collectives over `world`
  std::unique_ptr<Stream> host_stream;
  std::unique_ptr<tbb::global_control> threads;
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> compute, comm, reduce;
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<ZeroEngine> zero;
  std::unique_ptr<TokenSource> train_src, eval_src;
  std::unique_ptr<WindowSampler> train_windows, eval_windows;
  HostBatch host[2];
  Buffer loss_host;  // grad_accum doubles
  std::ofstream metrics;
  int rank = 0, dp = 1;
  int64_t steps_done = 0;
  double last_eval_loss = -1;   // the latest evaluate() and the step it followed
  int64_t last_eval_step = -1;
  // Progress line: the end of this run, the latest eval loss, the clock of its ETA.
  int64_t progress_end = 0;
  double progress_eval_loss = -1;
  int64_t progress_eval_step = -1;
  int64_t progress_first_step = -1;
  Clock::time_point progress_t0;
  uint64_t windows_done = 0;  // logical data windows the completed steps read
  // Checkpoints: the resume source, and the writer (declared after `zero`, so it is destroyed —
  // and its save in progress finished — before the engine whose states it reads).
  std::string resume_dir;
  CheckpointManifest resume_manifest;
  std::unique_ptr<Communicator> ckpt_comm;
  std::unique_ptr<CheckpointWriter> writer;
  std::vector<CheckpointPiece> ckpt_pieces;  // rank 0: the manifest's pieces, built at the first save

  Impl(const Config& c, Communicator& w, TrainerOptions o) : cfg(c), opt(std::move(o)), world(w) {
    validate(cfg);
    if (cfg.parallel.pp != 1)
      fail("train::init", "pipeline parallelism is not available yet", "set parallel.pp = 1");
    watchdog_set_timeout(cfg.parallel.timeout);
    watchdog_set_step(-1);
    watchdog_set_phase("setup");
    // Files this run writes are opened first, so that a bad path fails before any collective
    // (and, on another rank, ends the job through the caller: see apps/strata/main.cpp).
    if (!opt.resume.empty()) {
      resume_dir = resolve_checkpoint(opt.resume);
      resume_manifest = read_manifest(resume_dir);
    }
    if (world.rank() == 0 && !cfg.log.metrics.empty()) {
      // A resumed run appends: its lines carry the true step numbers after the earlier ones.
      metrics.open(cfg.log.metrics, std::ios::out | (resume_dir.empty() ? std::ios::trunc : std::ios::app));
      if (!metrics)
        fail("train::metrics", str("cannot open metrics file '", cfg.log.metrics, "' for writing"),
             "check that the directory exists and is writable (log.metrics)");
    }
    mesh = make_mesh(world, cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp);
    dpc = mesh.dp_comm.get();
    rank = mesh.dp_index;
    dp = mesh.dp;
    if (world.size() > 1) set_log_rank(world.rank());
    if (cfg.train.threads > 0)
      threads = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism,
                                                      size_t(cfg.train.threads));
    if (!opt.init_from.empty() && opt.resume.empty()) {
      const int loss_chunk = cfg.model.loss_chunk;  // a run setting, not the architecture's
      cfg.model = read_hf_config(opt.init_from);
      cfg.model.loss_chunk = loss_chunk;
    }
    validate(cfg);
    const TpShard shard = tp_shard(cfg.model, mesh.tp, mesh.tp_index);
    if (mesh.tp > 1) {
      tpc = mesh.tp_comm.get();
      tpc->set_name("tp");
      if (shard.kv_replicas > 1) {
        kv_mpi = mesh.tp_comm->split(mesh.tp_index / shard.kv_replicas, mesh.tp_index);
        kv_mpi->set_name("tp (kv heads)");
        kvc = kv_mpi.get();
      }
    }

    DeviceOptions dopt;
    dopt.mem_limit_bytes = cfg.offload.device_mem_limit;
    dopt.cpu_ops = opt.cpu_ops;
    const DeviceKind kind = pick_device(cfg.train.device);
    if (kind == DeviceKind::cuda) {
      const int gpus = cuda_device_count();
      if (gpus == 0)
        fail("train::device", "train.device = cuda but no CUDA device is present",
             "use train.device = cpu or auto");
      dopt.ordinal = local_rank() % gpus;  // one GPU per rank on each machine
    }
    device = make_device(kind, dopt);
    // World-level host collectives (metrics) run on a CPU stream: MPI moves host memory.
    host_device = kind == DeviceKind::cpu ? nullptr : make_device(DeviceKind::cpu);
    if (host_device) host_stream = host_device->make_stream("host-comm");
    if (kind == DeviceKind::cuda && dp > 1) {
      if (!nccl_built())
        fail("train::comm", "data-parallel training on CUDA needs NCCL, and this strata was built without it",
             "install NCCL with the CUDA toolkit and rebuild");
      nccl_dp = make_nccl_communicator(*mesh.dp_comm, dopt.ordinal);
      nccl_dp->set_name("dp");
      dpc = nccl_dp.get();
    }
    if (kind == DeviceKind::cuda && mesh.tp > 1) {
      if (!nccl_built())
        fail("train::comm", "tensor-parallel training on CUDA needs NCCL, and this strata was built without it",
             "install NCCL with the CUDA toolkit and rebuild");
      nccl_tp = make_nccl_communicator(*mesh.tp_comm, dopt.ordinal);
      nccl_tp->set_name("tp");
      tpc = nccl_tp.get();
      if (kv_mpi) {
        nccl_kv = make_nccl_communicator(*kv_mpi, dopt.ordinal);
        nccl_kv->set_name("tp (kv heads)");
        kvc = nccl_kv.get();
      }
    }

    PlanMachine machine;
    machine.device_is_host_memory = device->kind() == DeviceKind::cpu;
    machine.device_capacity = device->memory().limit_bytes;
    {  // the host-memory and NVMe checks count the ranks of this machine, not of the job
      Device& cpu = host_device ? *host_device : *device;
      auto node_stream = cpu.make_stream("ranks per node");
      machine.ranks_here = ranks_on_this_node(world, *node_stream);
    }
    MemoryPlan plan = plan_memory(cfg, dp, machine);
    if (!plan.fits()) {
      std::string failed;
      for (const auto& ck : plan.checks)
        if (!ck.ok())
          failed += str(failed.empty() ? "" : "; ", ck.what, " needs ", format_bytes(ck.need),
                        " but ", ck.limit_name, " allows ", format_bytes(ck.limit));
      fail("train::plan", str("the run does not fit: ", failed, "\n", plan.table()),
           "offload states (offload.params / optimizer = host or nvme), raise "
           "offload.device_mem_limit or offload.pinned_mem_limit, shrink the model or "
           "data.micro_batch, turn on zero.activation_checkpointing, or use more ranks "
           "(`strata plan` prints this table)");
    }
    compute = device->make_stream("compute");
    comm = device->make_stream("comm");
    reduce = device->make_stream("reduce");
    model = std::make_unique<LlamaModel>(cfg.model, dp, mesh.tp, mesh.tp_index);
    runner = std::make_unique<ModelRunner>(*model, *device, cfg.data.micro_batch, cfg.data.seq_len,
                                           cfg.zero.activation_checkpointing, cfg.train.grad_accum,
                                           TpOptions{tpc, kvc, cfg.parallel.sequence_parallel});
    ZeroOptions zo = zero_options(cfg);
    zo.test_hooks = opt.test_hooks;
    zero = std::make_unique<ZeroEngine>(*model, *device, *dpc, *compute, *comm, *reduce, zo, tpc);
    if (!resume_dir.empty()) {
      resume_from_checkpoint();
    } else if (opt.init_from.empty()) {
      zero->init_from_seed(cfg.train.seed);
    } else {
      SafetensorsReader reader(opt.init_from);
      zero->init_from(reader);
    }
    if (!cfg.checkpoint.dir.empty()) {
      ckpt_comm = world.split(0, world.rank());
      ckpt_comm->set_name("checkpoint");
      CheckpointWriterOptions wo;
      wo.root = cfg.checkpoint.dir;
      wo.keep = cfg.checkpoint.keep;
      wo.io_backend = cfg.io.backend;
      wo.io_queue_depth = cfg.io.queue_depth;
      wo.io_block_size = cfg.io.block_size;
      wo.test_hooks = opt.test_hooks;
      writer = std::make_unique<CheckpointWriter>(*ckpt_comm, wo);
    }

    train_src = open_tokens(cfg.data.path, cfg.model.vocab_size);
    train_windows = std::make_unique<WindowSampler>(*train_src, cfg.data.seq_len, cfg.data.shuffle,
                                                    cfg.train.seed);
    size_t n = size_t(cfg.data.micro_batch) * cfg.data.seq_len;
    for (auto& h : host) {
      h.tokens = device->alloc_host(2 * n * 4, true, "token staging");
      h.consumed = device->make_event();
    }
    loss_host = device->alloc_host(size_t(cfg.train.grad_accum) * 8, true, "loss readback");
  }

  // Fills host staging buffer `slot` (fill(inputs, targets)) and enqueues its copy.
  template <class Fill>
  void load(int slot, Fill fill) {
    HostBatch& h = host[slot];
    h.consumed->synchronize();  // the device has read the previous contents
    const size_t n = size_t(cfg.data.micro_batch) * cfg.data.seq_len;
    int32_t* in = h.tokens.as<int32_t>();
    fill(in, in + n);
    runner->load_batch(*compute, in, in + n);
    compute->record(*h.consumed);
  }
  void load(WindowSampler& windows, uint64_t first, int slot) {
    load(slot, [&](int32_t* in, int32_t* tgt) { windows.windows(first, cfg.data.micro_batch, in, tgt); });
  }

  std::vector<int> forward_order, backward_order;

  // keep: the units stay held for the backward that follows (zero.reshard_after_forward =
  // false); otherwise each is released after its forward (the tied embedding after the step).
  void forward_all(bool keep = false) {
    const int U = model->num_units();
    const bool tied = model->tied();
    if (forward_order.empty())
      for (int u = 0; u < U; ++u) forward_order.push_back(u);
    watchdog_set_phase("forward");
    zero->begin_pass(forward_order);
    const float* emb = tied ? zero->acquire(0) : nullptr;
    const int ahead = std::min(cfg.zero.prefetch, U);
    for (int u = 0; u < U; ++u) {
      const float* p = zero->acquire(u);
      for (int k = 1; k <= ahead; ++k) zero->prefetch(u + k);
      runner->forward(*compute, u, p, emb);
      if (!keep && !(tied && u == 0)) zero->release(u);
    }
  }

  void backward_all(float dloss) {
    const int U = model->num_units();
    const bool tied = model->tied();
    if (backward_order.empty())
      for (int u = U - 1; u >= 0; --u) backward_order.push_back(u);
    watchdog_set_phase("backward");
    zero->begin_pass(backward_order);
    const float* emb = tied ? zero->acquire(0) : nullptr;
    float* emb_grad = nullptr;
    const int ahead = std::min(cfg.zero.prefetch, U);
    for (int u = U - 1; u >= 0; --u) {
      const float* p = zero->acquire(u);
      for (int k = 1; k <= ahead; ++k) zero->prefetch(u - k);
      float* g = zero->acquire_grad(u);
      // Tied embeddings: the head's backward also accumulates into unit 0's gradient, which
      // stays held until unit 0's own backward has run and it is reduced like any other.
      if (tied && u == U - 1) emb_grad = zero->acquire_grad(0);
      runner->backward(*compute, u, p, g, dloss, emb, emb_grad);
      zero->release(u);
      zero->reduce_grad(u);
    }
  }

  double mean_loss(int micro_batches, uint64_t tokens_per_rank) {
    runner->copy_losses(*compute, loss_host.as<double>());
    compute->synchronize();
    double local = 0;
    for (int i = 0; i < micro_batches; ++i) local += loss_host.as<double>()[i];
    double* h = loss_host.as<double>();
    h[0] = local;
    if (dp > 1) {
      dpc->all_reduce(*comm, h, 1, CommType::f64, ReduceOp::sum);
      comm->synchronize();
    }
    return h[0] / double(tokens_per_rank * uint64_t(dp));
  }

  StepRecord step(const LrSchedule& lr) {
    const int B = cfg.data.micro_batch, T = cfg.data.seq_len, A = cfg.train.grad_accum;
    const uint64_t G = uint64_t(B) * A * dp;  // windows per step
    const uint64_t tokens_per_rank = uint64_t(B) * T * A;
    const float dloss = float(1.0 / double(G * T));
    StepRecord r;
    r.step = steps_done + 1;
    watchdog_set_step(r.step);
    if (writer) writer->poll();  // a save that failed ends the run here
    if (opt.test_hooks && opt.test_hooks->before_step) opt.test_hooks->before_step(r.step);
    auto t0 = Clock::now();
    const double waited0 = compute->waited_ms();
    runner->reset_loss();
    for (int a = 0; a < A; ++a) {
      if (opt.batch_source)
        load(a % 2, [&](int32_t* in, int32_t* tgt) { opt.batch_source(steps_done, a, rank, in, tgt); });
      else
        load(*train_windows, windows_done + (uint64_t(a) * dp + rank) * B, a % 2);
      forward_all(!cfg.zero.reshard_after_forward);
      backward_all(dloss);
    }
    watchdog_set_phase("loss");
    r.loss = mean_loss(A, tokens_per_rank);
    comm->synchronize();
    reduce->synchronize();
    r.compute_ms = ms_since(t0);
    r.wait_comm_ms = compute->waited_ms() - waited0;
    r.traffic = zero->take_traffic();
    r.tp_comm_bytes = runner->take_tp_bytes();
    r.comm_bytes = r.traffic.comm_bytes + r.tp_comm_bytes;
    if (opt.on_gradients) opt.on_gradients(r.step);
    auto t1 = Clock::now();
    watchdog_set_phase("optimizer");
    r.grad_norm = zero->grad_norm();
    if (!std::isfinite(r.grad_norm) || !std::isfinite(r.loss))
      fail("train::step", str("step ", r.step, ": loss ", r.loss, ", gradient norm ", r.grad_norm,
                              " — training diverged"),
           "lower train.lr, raise train.warmup_steps, or set train.grad_clip");
    r.lr = lr.at(steps_done);
    AdamWHyper h;
    h.lr = float(r.lr);
    h.beta1 = cfg.train.beta1;
    h.beta2 = cfg.train.beta2;
    h.eps = cfg.train.eps;
    h.weight_decay = cfg.train.weight_decay;
    if (writer) {  // a save in progress must have read master, m and v before they change
      auto tw = Clock::now();
      writer->wait_reads();
      r.checkpoint_stall_ms += ms_since(tw);
    }
    zero->optimizer_step(h, r.step, clip_coefficient(r.grad_norm, cfg.train.grad_clip),
                         cfg.train.decay_norms);
    zero->zero_grads();
    compute->synchronize();
    r.optimizer_ms = ms_since(t1);
    ZeroTraffic opt_traffic = zero->take_traffic();  // the optimizer's NVMe reads and writes
    r.traffic.nvme_read_bytes += opt_traffic.nvme_read_bytes;
    r.traffic.nvme_write_bytes += opt_traffic.nvme_write_bytes;
    r.traffic.nvme_busy_ms += opt_traffic.nvme_busy_ms;
    r.traffic.nvme_wait_ms += opt_traffic.nvme_wait_ms;
    r.traffic.h2d_bytes += opt_traffic.h2d_bytes;
    r.traffic.d2h_bytes += opt_traffic.d2h_bytes;
    r.step_ms = ms_since(t0);
    r.tokens_per_s = double(G * T) / (r.step_ms / 1000.0);
    if (opt.peak_flops > 0)
      r.mfu = r.tokens_per_s * model->train_flops_per_token(T) / (opt.peak_flops * world.size());
    ++steps_done;
    windows_done += G;
    const bool last = r.step == cfg.train.steps || r.step == opt.stop_after;
    if (writer && (r.step % cfg.checkpoint.every == 0 || last)) {
      auto tc = Clock::now();
      save_checkpoint(r.step);
      r.checkpoint_stall_ms += ms_since(tc);
      r.checkpoint_saved = r.step;
    }
    return r;
  }

  // Hands this step's states to the writer (synchronously when checkpoint.async = false).
  void save_checkpoint(int64_t step) {
    watchdog_set_phase("checkpoint");
    CheckpointManifest m;
    m.strata_version = STRATA_VERSION;
    m.step = step;
    m.windows_consumed = windows_done;
    m.precision = std::string(precision_name(cfg.train.precision));
    m.optimizer_state_dtype = cfg.train.optimizer_state_dtype;
    m.world = world.size();
    m.dp = dp;
    m.tp = mesh.tp;
    m.pp = mesh.pp;
    m.config = config_to_json(cfg);
    m.config_toml = config_to_toml(cfg);
    m.tensors = checkpoint_tensors(*model);
    // Rank 0 lists every rank's pieces (the same table for every save of the run); each rank
    // writes its own blocks into the file of its world rank (the writer's communicator).
    if (world.rank() == 0) {
      if (ckpt_pieces.empty())
        ckpt_pieces = checkpoint_pieces(model->config(), dp, mesh.tp, cfg.train.optimizer_state_dtype);
      m.pieces = ckpt_pieces;
    }
    CheckpointSource& source = zero->checkpoint_source();
    writer->start(std::move(m), checkpoint_blocks(*model, rank, cfg.train.optimizer_state_dtype), source);
    if (!cfg.checkpoint.async) writer->wait();
  }

  // Verifies the checkpoint's files (each rank a share; nobody starts until all are checked),
  // then loads this rank's shards from it, whatever mesh wrote it.
  void resume_from_checkpoint() {
    watchdog_set_phase("resume");
    const CheckpointManifest& m = resume_manifest;
    verify_checkpoint_files(resume_dir, m, world.rank(), world.size());
    double* h = loss_host ? loss_host.as<double>() : nullptr;
    Buffer flag;
    if (!h) {
      flag = device->alloc_host(8, true, "resume barrier");
      h = flag.as<double>();
    }
    h[0] = 1;
    if (world.size() > 1) {
      Stream& hs = host_stream ? *host_stream : *comm;
      world.all_reduce(hs, h, 1, CommType::f64, ReduceOp::sum);  // every rank has verified
      hs.synchronize();
    }
    zero->load_checkpoint(resume_dir, m);
    steps_done = m.step;
    windows_done = m.windows_consumed;
    if (world.rank() == 0)
      log_info("checkpoint", "resuming from ", resume_dir, " (step ", m.step, ", written by ", m.world,
               " rank(s): dp ", m.dp, " x tp ", m.tp, "); training continues to step ", cfg.train.steps);
  }

  bool logged_step(const StepRecord& r) const {
    return (r.step % cfg.log.every == 0) || r.step == cfg.train.steps || r.step == 1 || r.eval_loss >= 0;
  }

  // Largest device peak over all ranks (collective: every rank calls it on logged steps).
  uint64_t device_peak_over_ranks() {
    double* h = loss_host.as<double>();
    h[0] = double(device->memory().peak_bytes);
    if (world.size() > 1) {
      Stream& hs = host_stream ? *host_stream : *comm;
      world.all_reduce(hs, h, 1, CommType::f64, ReduceOp::max);
      hs.synchronize();
    }
    return uint64_t(h[0]);
  }

  // Tracing covers steps 2..4 (after the warm-up step); the file is written after step 4 or at
  // the last step. Rank r > 0 writes PATH.rank<r>.
  void trace_step_begin(int64_t step) {
    if (cfg.log.trace.empty()) return;
    if (step == std::min<int64_t>(2, cfg.train.steps)) {
      trace_clear();
      trace_enable(true);
    }
  }
  void trace_step_end(int64_t step) {
    if (cfg.log.trace.empty() || !trace_enabled()) return;
    if (step >= 4 || step == cfg.train.steps) {
      trace_enable(false);
      compute->synchronize();
      comm->synchronize();
      std::string path = cfg.log.trace;
      if (world.rank() > 0) path += str(".rank", world.rank());
      trace_write(path, world.rank());
    }
  }

  void log_step(StepRecord& r) {
    bool logged = logged_step(r);
    if (logged) r.device_peak_bytes = device_peak_over_ranks();
    if (world.rank() != 0) return;
    if (metrics.is_open() && logged) {
      const ZeroMemory zmem = zero->memory();
      // GB/s over the time the swapper had I/O in flight (reads and writes share it).
      auto rate = [](uint64_t bytes, double ms) { return ms > 0 ? double(bytes) / (ms * 1e6) : 0.0; };
      nlohmann::json j = {
          {"step", r.step},
          {"loss", r.loss},
          {"lr", r.lr},
          {"grad_norm", r.grad_norm},
          {"tokens_per_s", r.tokens_per_s},
          {"mfu", r.mfu},
          {"step_ms", r.step_ms},
          {"params", model->num_params()},
          {"time", {{"compute_ms", r.compute_ms}, {"wait_comm_ms", r.wait_comm_ms}, {"optimizer_ms", r.optimizer_ms}}},
          {"comm_bytes", r.comm_bytes},
          {"tp_comm_bytes", r.tp_comm_bytes},
          {"mesh", {{"dp", dp}, {"tp", mesh.tp}, {"pp", mesh.pp}}},
          {"ranks", world.size()},
          {"mem",
           {{"device_peak_bytes", r.device_peak_bytes},
            {"host_rss_bytes", current_rss_bytes()},
            {"pinned_bytes", zmem.pinned_bytes},
            {"host_state_bytes", zmem.host_bytes},
            {"nvme_bytes", zmem.nvme_bytes}}},
          {"io",
           {{"read_bytes", r.traffic.nvme_read_bytes},
            {"write_bytes", r.traffic.nvme_write_bytes},
            {"read_gbps", rate(r.traffic.nvme_read_bytes, r.traffic.nvme_busy_ms)},
            {"write_gbps", rate(r.traffic.nvme_write_bytes, r.traffic.nvme_busy_ms)},
            {"busy_ms", r.traffic.nvme_busy_ms},
            {"wait_ms", r.traffic.nvme_wait_ms}}},
          {"links", {{"h2d_bytes", r.traffic.h2d_bytes}, {"d2h_bytes", r.traffic.d2h_bytes}}},
      };
      if (writer) {
        const CheckpointStats cs = writer->last_stats();
        j["checkpoint"] = {{"stall_ms", r.checkpoint_stall_ms},
                           {"saved_step", r.checkpoint_saved},
                           {"last_step", cs.step},
                           {"last_bytes", cs.bytes},
                           {"last_write_ms", cs.write_ms},
                           {"last_write_gbps", cs.write_ms > 0 ? double(cs.bytes) / (cs.write_ms * 1e6) : 0.0},
                           {"last_commit_ms", cs.commit_ms}};
      }
      if (r.eval_loss >= 0) j["eval_loss"] = r.eval_loss;
      metrics << j.dump() << '\n';
      metrics.flush();
    }
    if (!opt.progress) return;
    std::string line = progress_line(r);
    if (isatty(STDERR_FILENO)) {
      std::fprintf(stderr, "\r%s\x1b[K%s", line.c_str(), r.step == progress_end ? "\n" : "");
      std::fflush(stderr);
    } else if (logged) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  }

  // step, loss, the latest eval loss, tokens/s, ETA, and this rank's state bytes per tier.
  std::string progress_line(const StepRecord& r) {
    if (r.eval_loss >= 0) {
      progress_eval_loss = r.eval_loss;
      progress_eval_step = r.step;
    }
    // ETA from the wall time since this run's first step ended (evaluations and saves included);
    // after the first step only, from that step's time.
    const auto now = Clock::now();
    double per_step_ms = r.step_ms;
    if (progress_first_step < 0) {
      progress_first_step = r.step;
      progress_t0 = now;
    } else {
      per_step_ms = ms_since(progress_t0) / double(r.step - progress_first_step);
    }
    const double eta_s = per_step_ms * double(std::max<int64_t>(0, progress_end - r.step)) / 1000.0;
    std::string line = str("step ", r.step, "/", progress_end, " | loss ", fixed(r.loss, 4));
    if (progress_eval_step >= 0)
      line += str(" | eval ", fixed(progress_eval_loss, 4), r.eval_loss >= 0 ? "" : str(" @", progress_eval_step));
    line += str(" | lr ", sci(r.lr), " | ", fixed(r.tokens_per_s, 0), " tok/s | ", fixed(r.step_ms, 0),
                " ms | ETA ", format_duration(eta_s));
    const ZeroMemory z = zero->memory();
    line += str(" | states dev ", format_bytes(z.shard_bytes + z.gathered_bytes));
    if (z.pinned_bytes) line += str(" pin ", format_bytes(z.pinned_bytes));
    if (z.host_bytes) line += str(" host ", format_bytes(z.host_bytes));
    if (z.nvme_bytes) line += str(" nvme ", format_bytes(z.nvme_bytes));
    return line;
  }

  double evaluate() {
    if (cfg.eval.batches <= 0)
      fail("eval::run", "eval.batches = 0: nothing to evaluate", "set eval.batches to 1 or more");
    if (!eval_src) {
      const std::string& path = cfg.eval.path.empty() ? cfg.data.path : cfg.eval.path;
      eval_src = open_tokens(path, cfg.model.vocab_size);
      eval_windows = std::make_unique<WindowSampler>(*eval_src, cfg.data.seq_len, false, cfg.train.seed);
    }
    const int B = cfg.data.micro_batch, T = cfg.data.seq_len;
    double total = 0;
    // Eval batch i reads windows i·B … i·B + B − 1; rank r takes batches r, r + dp, ... Every
    // gather is collective, so all ranks run the same number of forwards: a rank without a
    // batch in the last round runs batch 0 again and discards its loss.
    const int64_t batches = cfg.eval.batches;
    const int64_t rounds = (batches + dp - 1) / dp;  // 64-bit: no overflow near INT_MAX
    watchdog_set_phase("eval");
    for (int64_t k = 0; k < rounds; ++k) {
      const int64_t i = k * dp + rank;
      const bool mine = i < batches;
      runner->reset_loss();
      load(*eval_windows, uint64_t(mine ? i : 0) * B, 0);
      forward_all_eval();
      runner->copy_losses(*compute, loss_host.as<double>());
      compute->synchronize();
      if (mine) total += loss_host.as<double>()[0];
    }
    double* h = loss_host.as<double>();
    h[0] = total;
    if (dp > 1) {
      dpc->all_reduce(*comm, h, 1, CommType::f64, ReduceOp::sum);
      comm->synchronize();
    }
    last_eval_loss = h[0] / (double(cfg.eval.batches) * B * T);
    last_eval_step = steps_done;
    return last_eval_loss;
  }

  void forward_all_eval() {
    forward_all();
    if (model->tied()) zero->release(0);
  }
};

Trainer::Trainer(const Config& config, Communicator& world, TrainerOptions options)
    : impl_(std::make_unique<Impl>(config, world, std::move(options))) {}

Trainer::~Trainer() = default;

int64_t Trainer::num_params() const { return impl_->model->num_params(); }

const Config& Trainer::config() const { return impl_->cfg; }

std::vector<std::string> Trainer::parameter_names() const {
  std::vector<std::string> names;
  for (const auto& u : impl_->model->units())
    for (const auto& v : u.layout.views()) names.push_back(v.name);
  return names;
}

ZeroMemory Trainer::state_memory() const { return impl_->zero->memory(); }

TrainSummary Trainer::train() {
  Impl& m = *impl_;
  TrainSummary s;
  s.params = m.model->num_params();
  LrSchedule lr;
  lr.shape = m.cfg.train.schedule == Schedule::cosine ? LrShape::cosine : LrShape::constant;
  lr.lr = m.cfg.train.lr;
  lr.warmup_steps = m.cfg.train.warmup_steps;
  lr.total_steps = m.cfg.train.steps;
  lr.min_ratio = m.cfg.train.min_lr_ratio;
  auto t0 = Clock::now();
  double timed_ms = 0, timed_tokens = 0;
  const int64_t first = m.steps_done;  // > 0 when resumed
  const int64_t end = m.opt.stop_after > 0 ? std::min<int64_t>(m.opt.stop_after, m.cfg.train.steps)
                                           : m.cfg.train.steps;
  m.progress_end = end;
  m.progress_first_step = -1;
  while (m.steps_done < end) {
    const int64_t i = m.steps_done - first;
    m.trace_step_begin(m.steps_done + 1);
    StepRecord r = m.step(lr);
    m.trace_step_end(r.step);
    s.losses.push_back(r.loss);
    // Validation on the fixed eval windows: it reads only the compute copy, so training (and a
    // save reading master, m and v behind it) goes on exactly as without it.
    if (m.cfg.eval.every > 0 && (r.step % m.cfg.eval.every == 0 || r.step == end)) {
      r.eval_loss = m.evaluate();
      if (s.best_eval_step < 0 || r.eval_loss < s.best_eval_loss) {
        s.best_eval_loss = r.eval_loss;
        s.best_eval_step = r.step;
      }
    }
    if (i > 0 || end - first == 1) {
      timed_ms += r.step_ms;
      timed_tokens += r.tokens_per_s * r.step_ms / 1000.0;
    }
    m.log_step(r);
    if (m.opt.on_step) m.opt.on_step(r);
  }
  if (m.writer) m.writer->wait();  // every save is committed before the run reports
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  s.tokens_per_s = timed_ms > 0 ? timed_tokens / (timed_ms / 1000.0) : 0;
  if (m.opt.peak_flops > 0)
    s.mfu = s.tokens_per_s * m.model->train_flops_per_token(m.cfg.data.seq_len) /
            (m.opt.peak_flops * m.world.size());
  s.device_peak_bytes = m.device_peak_over_ranks();
  if (m.cfg.eval.batches > 0) s.eval_loss = m.last_eval_step == m.steps_done ? m.last_eval_loss : m.evaluate();
  if (s.eval_loss >= 0 && (s.best_eval_step < 0 || s.eval_loss < s.best_eval_loss)) {
    s.best_eval_loss = s.eval_loss;
    s.best_eval_step = m.steps_done;
  }
  s.host_peak_rss_bytes = peak_rss_bytes();
  return s;
}

double Trainer::evaluate() { return impl_->evaluate(); }

CheckpointStats Trainer::checkpoint_stats() const {
  return impl_->writer ? impl_->writer->last_stats() : CheckpointStats{};
}

void Trainer::save(const std::string& dir, const std::string& dtype) {
  impl_->zero->save(dir, parse_dtype(dtype));
}

namespace {
// The unit holding parameter `name` and its view there; Error naming `where` when absent.
std::pair<int, const ParamView*> locate(const LlamaModel& model, const std::string& name,
                                        const char* where) {
  for (int u = 0; u < model.num_units(); ++u)
    if (const ParamView* v = model.unit(u).layout.find(name)) return {u, v};
  fail(where, str("no parameter named '", name, "'"));
}

// The whole tensor of view v of unit u from the unit's gathered values on this rank (every rank
// calls it: collective over the tp group).
std::vector<float> whole(Communicator* tp, Device& device, Stream& stream, const LlamaModel& model,
                         int u, const ParamView& v, const std::vector<float>& unit) {
  const auto& views = model.unit(u).layout.views();
  const size_t i = size_t(&v - views.data());
  return std::move(assemble_unit(tp, device, stream, model, u, unit)[i]);
}
}  // namespace

std::vector<float> Trainer::parameter(const std::string& name) {
  auto [u, v] = locate(*impl_->model, name, "train::parameter");
  Impl& m = *impl_;
  return whole(m.tpc, *m.device, *m.comm, *m.model, u, *v, m.zero->gather_unit_to_host(u));
}

std::vector<float> Trainer::gradient(const std::string& name) {
  auto [u, v] = locate(*impl_->model, name, "train::gradient");
  Impl& m = *impl_;
  return whole(m.tpc, *m.device, *m.comm, *m.model, u, *v, m.zero->gather_grad_to_host(u));
}

void Trainer::set_parameter(const std::string& name, const std::vector<float>& values) {
  auto [u, v] = locate(*impl_->model, name, "train::set_parameter");
  if (values.size() != v->global_numel())
    fail("train::set_parameter",
         str("'", name, "' has ", v->global_numel(), " elements, got ", values.size()));
  // This rank's slice of the whole tensor, in the slice's row-major order.
  std::vector<float> mine(v->numel);
  for (size_t i = 0; i < v->numel; ++i) mine[i] = values[v->global_index(i)];
  impl_->zero->set_values(u, v->offset, mine);
}

double Trainer::forward_logits(const int32_t* inputs, const int32_t* targets,
                               std::vector<float>* logits) {
  Impl& m = *impl_;
  const size_t n = size_t(m.cfg.data.micro_batch) * m.cfg.data.seq_len;
  m.runner->reset_loss();
  m.load(0, [&](int32_t* in, int32_t* tgt) {
    std::copy(inputs, inputs + n, in);
    std::copy(targets, targets + n, tgt);
  });
  m.forward_all_eval();
  if (logits) {
    logits->resize(n * size_t(m.cfg.model.vocab_size));
    m.runner->copy_logits(*m.compute, logits->data());
  }
  m.runner->copy_losses(*m.compute, m.loss_host.as<double>());
  m.compute->synchronize();
  return m.loss_host.as<double>()[0] / double(n);
}

}  // namespace strata
