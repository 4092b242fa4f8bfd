// bench/io_bench.cpp — the I/O benchmark: a SwapSpace over the given directories, queue_depth
// staging buffers of block_bytes registered once, and a loop that keeps the queue full: refill
// every buffer as soon as its completion comes back, one submit per batch.
//
// Data check: every 4 KiB sector carries a 16-byte stamp (offset, seed, and which staging
// buffer's contents it holds) and after it that buffer's random bytes: each buffer is filled once
// with a piece of a 1 MiB random pattern xor a key of its own, so no two sectors hold the same
// bytes and nothing compresses, as with the optimizer's states (a virtio disk wrote a repeated
// pattern at ~0.75 of the rate of random bytes: fio --buffer_pattern against its default).
// Stamping costs two stores per sector on write, checking one pass over the block on read, both
// overlapped with the other requests in flight.
#include "bench/io_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>

#include "core/error.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "io/aligned_buffer.h"
#include "io/file_io.h"
#include "io/huge_pages.h"
#include "offload/swap_space.h"

namespace strata {
namespace {

constexpr uint64_t kSector = 4096;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The bytes of every 4 KiB sector: its stamp — word 0 the offset (below 2^48) with the contents'
// id above it, word 1 the seed — then, from byte 16, the contents: the pattern's piece at the
// sector's place in its block xor the id's key.
struct Pattern {
  static constexpr uint64_t kBytes = 1ull << 20;  // a multiple of kSector
  static constexpr uint64_t kWords = kSector / 8;
  static constexpr int kIdShift = 48;
  std::vector<uint64_t> words;
  uint64_t ids = 0;  // contents ids 0..ids-1 (the staging buffers)

  Pattern(uint64_t pattern_seed, uint64_t ids) : words(kBytes / 8), ids(ids) {
    std::mt19937_64 rng(pattern_seed);
    for (uint64_t& w : words) w = rng();
  }
  static uint64_t key(uint64_t id) {  // splitmix64's finalizer
    uint64_t z = (id + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static int64_t id_of(uint32_t buffer) { return buffer & 0xffff; }  // 16 bits above the offset
  const uint64_t* piece(uint64_t at) const { return words.data() + (at % kBytes) / 8; }
  // Contents `id` into a staging buffer, once.
  void fill(std::byte* buf, uint64_t bytes, uint64_t id) const {
    const uint64_t k = key(id);
    for (uint64_t at = 0; at < bytes; at += kSector) {
      auto* w = reinterpret_cast<uint64_t*>(buf + at);
      const uint64_t* p = piece(at);
      for (uint64_t i = 2; i < kWords; ++i) w[i] = p[i] ^ k;
    }
  }
  // The stamps of a block written at `offset`; id < 0 keeps the id each sector holds (a block
  // read back and rewritten).
  static void stamp(std::byte* buf, uint64_t bytes, uint64_t offset, uint64_t seed, int64_t id) {
    for (uint64_t at = 0; at < bytes; at += kSector) {
      auto* w = reinterpret_cast<uint64_t*>(buf + at);
      const uint64_t held = id >= 0 ? uint64_t(id) : w[0] >> kIdShift;
      w[0] = (offset + at) | held << kIdShift;
      w[1] = seed;
    }
  }
  uint64_t count_wrong(const std::byte* buf, uint64_t bytes, uint64_t offset, uint64_t seed) const {
    uint64_t wrong = 0;
    for (uint64_t at = 0; at < bytes; at += kSector) {
      const auto* w = reinterpret_cast<const uint64_t*>(buf + at);
      const uint64_t id = w[0] >> kIdShift;
      if ((w[0] & ((1ull << kIdShift) - 1)) != offset + at || w[1] != seed || id >= ids) {
        ++wrong;
        continue;
      }
      const uint64_t k = key(id);
      const uint64_t* p = piece(at);
      uint64_t diff = 0;
      for (uint64_t i = 2; i < kWords; ++i) diff |= w[i] ^ p[i] ^ k;
      wrong += diff != 0;
    }
    return wrong;
  }
};

// write: stamp and write every block; read: read and check every block; update: read and check
// every block, then write it back in place stamped anew (the optimizer's traffic over its states).
enum class Pass { write, read, update };

struct Phase {
  uint64_t bytes_read = 0, bytes_written = 0, requests = 0;
  double seconds = 0;
  uint64_t wrong = 0;
  uint64_t bytes() const { return bytes_read + bytes_written; }
};

// A request's tag: its block, whether it writes, and its buffer (fewer than 2^20: at most
// 2 x 65535).
constexpr int kWriteBit = 20, kBlockShift = 21;
constexpr uint64_t kBufferMask = (uint64_t{1} << kWriteBit) - 1;

// Moves blocks [0, nblocks) of the extent (or fewer if o.max_seconds runs out), keeping
// o.queue_depth requests of o.block_bytes in flight. Reads are checked against `seed_in`, writes
// stamped with `seed_out`. There are spare buffers beyond the depth: completed reads are
// replaced first and checked after, and each checked buffer goes straight back out, so checking
// never leaves the queue short (sequential neighbours often complete together, merged). An
// update's write-backs go out before new reads.
Phase run_phase(FileIO& io, const SwapSpace& space, Pass pass, uint64_t nblocks,
                std::vector<std::byte*>& buffers, const Pattern& pattern, uint64_t seed_in,
                uint64_t seed_out, const IoBenchOptions& o) {
  const uint64_t block = o.block_bytes;
  const int depth = o.queue_depth;
  const double max_seconds = o.max_seconds;
  const SwapExtent& extent = space.extent("bench");
  STRATA_CHECK(buffers.size() <= kBufferMask, "bench::io", buffers.size(), " staging buffers");
  Phase phase;
  std::vector<uint32_t> free_buffers;
  std::vector<std::pair<uint32_t, uint64_t>> to_write;  // update: (buffer, block) read, restamped
  for (uint32_t i = 0; i < buffers.size(); ++i) free_buffers.push_back(uint32_t(buffers.size()) - 1 - i);
  std::vector<IoRequest> batch;
  std::vector<IoCompletion> done;
  uint64_t next = 0;
  bool out_of_time = false;
  auto request = [&](IoOp op, uint32_t b, uint64_t blk) {
    const uint64_t tag = (blk << kBlockShift) | (uint64_t(op == IoOp::write) << kWriteBit) | b;
    batch.push_back(IoRequest{op, space.file(), extent.offset + blk * block, buffers[b], block, tag});
  };
  auto refill = [&] {
    batch.clear();
    auto room = [&] { return io.pending() + batch.size() < size_t(depth); };
    while (!to_write.empty() && room()) {
      request(IoOp::write, to_write.back().first, to_write.back().second);
      to_write.pop_back();
    }
    while (!free_buffers.empty() && room() && next < nblocks && !out_of_time) {
      uint32_t b = free_buffers.back();
      free_buffers.pop_back();
      if (pass == Pass::write)
        Pattern::stamp(buffers[b], block, next * block, seed_out, Pattern::id_of(b));
      request(pass == Pass::write ? IoOp::write : IoOp::read, b, next);
      ++next;
    }
    if (!batch.empty()) io.submit(batch);
  };
  const char* what = pass == Pass::write ? "write" : pass == Pass::read ? "read" : "update";
  const std::string waiting = str("strata bench io: ", pass == Pass::update ? "an " : "a ", what,
                                  " of ", format_bytes(block), " blocks");
  auto t0 = std::chrono::steady_clock::now();
  while (next < nblocks || io.pending() || !to_write.empty()) {
    refill();
    done.clear();
    {
      WatchedWait w(waiting, WaitKind::io);  // a disk that stops answering ends the bench
      io.wait(1, done);
    }
    refill();
    for (const IoCompletion& c : done) {
      const auto b = uint32_t(c.tag & kBufferMask);
      const uint64_t blk = c.tag >> kBlockShift;
      if ((c.tag >> kWriteBit) & 1) {
        phase.bytes_written += c.bytes;
        free_buffers.push_back(b);
      } else {
        if (pass == Pass::read && blk == o.test_corrupt_block)
          buffers[b][o.test_corrupt_byte % block] ^= std::byte{1};
        phase.wrong += pattern.count_wrong(buffers[b], block, blk * block, seed_in);
        phase.bytes_read += c.bytes;
        if (pass == Pass::update) {
          Pattern::stamp(buffers[b], block, blk * block, seed_out, -1);
          to_write.emplace_back(b, blk);
        } else {
          free_buffers.push_back(b);
        }
      }
      ++phase.requests;
      if (io.pending() < size_t(depth)) refill();
    }
    if (max_seconds > 0 && !out_of_time && seconds_since(t0) > max_seconds) out_of_time = true;
    if (out_of_time && !io.pending() && to_write.empty()) break;
  }
  phase.seconds = seconds_since(t0);
  return phase;
}

double gbps(uint64_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e9 : 0; }
double round3(double v) { return std::round(v * 1000) / 1000; }

}  // namespace

nlohmann::json run_io_bench(const IoBenchOptions& o) {
  if (o.dirs.empty()) fail("bench::io", "no directory", "pass --dir at least once");
  if (o.queue_depth < 1 || o.queue_depth > 65535)
    fail("bench::io", str("queue depth ", o.queue_depth, " is out of range 1..65535"));
  if (o.block_bytes < kSector || o.block_bytes % kSector)
    fail("bench::io", str("block size ", o.block_bytes, " is not a multiple of 4K"));
  const uint64_t nblocks = o.size_bytes / o.block_bytes;
  const char* kSizeHint =
      "give a whole number of blocks (bench io: --size and --block; bench sweep: --io-bytes and "
      "io.block_size)";
  if (nblocks == 0)
    fail("bench::io", str("size ", format_bytes(o.size_bytes), " is smaller than one block of ",
                          format_bytes(o.block_bytes)), kSizeHint);
  if (o.size_bytes >= 1ull << 48)  // the stamps hold offsets below 2^48
    fail("bench::io", str("size ", format_bytes(o.size_bytes), " is 256T or more"), kSizeHint);
  if (o.size_bytes % o.block_bytes)  // a rate of fewer bytes than asked would pass for it
    fail("bench::io", str("size ", format_bytes(o.size_bytes), " is not a whole number of ",
                          format_bytes(o.block_bytes), " blocks"), kSizeHint);
  PageRequest pages = PageRequest::best;
  if (o.pages == "thp") pages = PageRequest::thp;
  else if (o.pages == "none") pages = PageRequest::none;
  else if (o.pages != "auto")
    fail("bench::io", str("unknown staging pages '", o.pages, "'"), "use auto, thp or none");

  IoOptions io_options;
  io_options.backend = o.backend;
  io_options.queue_depth = o.queue_depth;
  io_options.block_size = o.block_bytes;
  io_options.submit_batch = o.submit_batch;
  io_options.name = "bench";
  auto io = make_file_io(io_options, o.dirs);
  SwapSpace space(*io, SwapSpaceOptions{o.dirs, nblocks * o.block_bytes, o.stripe_bytes, "bench"});
  space.allocate("bench", nblocks * o.block_bytes);
  Alignment align = io->alignment(space.file());

  // Staging: one allocation, as the engine's pinned pool makes it (2 MiB-aligned, so aligned
  // for O_DIRECT), registered once, cut into queue_depth + spare buffers (up to another
  // queue_depth, at most 256M of spares).
  const int spares = int(std::clamp<uint64_t>((256ull << 20) / o.block_bytes, 1, o.queue_depth));
  const int nbuffers = o.queue_depth + spares;
  HugePageBuffer staging(uint64_t(nbuffers) * o.block_bytes, pages);
  STRATA_CHECK(reinterpret_cast<uintptr_t>(staging.data()) % std::max<uint32_t>(align.memory, 1) == 0,
               "bench::io", "staging memory is not aligned for O_DIRECT");
  std::vector<std::byte*> buffers;
  for (int i = 0; i < nbuffers; ++i) buffers.push_back(staging.data() + i * o.block_bytes);
  if (o.register_buffers) {
    std::vector<std::span<std::byte>> regions{staging.span()};
    io->register_buffers(regions);
  }

  const uint64_t seed =
      std::random_device{}() ^ uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  const Pattern pattern(seed, std::min<uint64_t>(buffers.size(), 1u << 16));
  for (uint32_t b = 0; b < buffers.size(); ++b)
    pattern.fill(buffers[b], o.block_bytes, uint64_t(Pattern::id_of(b)));
  const uint64_t updated_seed = ~seed;  // what the update pass stamps, the read checks after it
  if (o.overwrite) run_phase(*io, space, Pass::write, nblocks, buffers, pattern, 0, seed ^ 1, o);
  Phase w = run_phase(*io, space, Pass::write, nblocks, buffers, pattern, 0, seed, o);
  Phase u;
  if (o.update)
    u = run_phase(*io, space, Pass::update, w.requests, buffers, pattern, seed, updated_seed, o);
  Phase r = run_phase(*io, space, Pass::read, w.requests, buffers, pattern,
                      o.update ? updated_seed : seed, 0, o);
  const IoStats& s = io->stats();

  nlohmann::json j;
  j["bench"] = "io";
  j["backend"] = std::string(io->backend_name());
  j["direct"] = io->file_direct(space.file());
  j["dirs"] = o.dirs;
  j["size_bytes"] = nblocks * o.block_bytes;
  j["block_bytes"] = o.block_bytes;
  j["queue_depth"] = o.queue_depth;
  j["submit_batch"] = o.submit_batch;
  j["stripe_bytes"] = o.stripe_bytes;
  j["alignment"] = {{"memory", align.memory}, {"offset", align.offset}};
  j["buffers"] = {{"pages", std::string(page_kind_name(staging.pages()))},
                  {"pages_why", staging.why()},
                  {"huge_bytes", staging.huge_bytes()},
                  {"bytes", staging.size()},
                  {"count", nbuffers},
                  {"registered", io->buffers_registered()},
                  {"files_registered", io->file_registered(space.file())},
                  {"fixed_chunks", s.fixed_chunks},
                  {"chunks", s.chunks}};
  j["pattern"] = o.update ? "update" : o.overwrite ? "overwrite" : "sequential";
  j["bytes_written"] = w.bytes_written;
  j["bytes_read"] = r.bytes_read;
  j["write_seconds"] = round3(w.seconds);
  j["read_seconds"] = round3(r.seconds);
  j["write_gbps"] = round3(gbps(w.bytes_written, w.seconds));
  j["read_gbps"] = round3(gbps(r.bytes_read, r.seconds));
  j["write_iops"] = std::round(w.requests / std::max(w.seconds, 1e-9));
  j["read_iops"] = std::round(r.requests / std::max(r.seconds, 1e-9));
  if (o.update)
    j["update"] = {{"bytes_read", u.bytes_read},
                   {"bytes_written", u.bytes_written},
                   {"seconds", round3(u.seconds)},
                   {"gbps", round3(gbps(u.bytes(), u.seconds))},
                   {"read_gbps", round3(gbps(u.bytes_read, u.seconds))},
                   {"write_gbps", round3(gbps(u.bytes_written, u.seconds))}};
  j["wrong"] = u.wrong + r.wrong;
  j["requeued"] = s.requeued;
  j["resubmitted"] = s.resubmitted;
  return j;
}

nlohmann::json run_io_sweep(const IoSweepOptions& o) {
  nlohmann::json points = nlohmann::json::array();
  nlohmann::json best, recommended;
  double best_score = -1;
  uint64_t wrong = 0;
  for (uint64_t block : o.blocks) {
    for (int depth : o.depths) {
      IoBenchOptions p = o.base;
      p.block_bytes = block;
      p.size_bytes = o.base.size_bytes / block * block;  // a cap: whole blocks under it
      p.queue_depth = depth;
      p.max_seconds = o.seconds_per_phase;
      nlohmann::json r = run_io_bench(p);
      double w = r["write_gbps"], rd = r["read_gbps"];
      double score = (w > 0 && rd > 0) ? 2 / (1 / w + 1 / rd) : 0;
      nlohmann::json point = {{"block_bytes", block}, {"queue_depth", depth},
                              {"write_gbps", w}, {"read_gbps", rd},
                              {"write_iops", r["write_iops"]}, {"read_iops", r["read_iops"]},
                              {"score_gbps", round3(score)}, {"wrong", r["wrong"]},
                              {"backend", r["backend"]}, {"direct", r["direct"]}};
      wrong += r["wrong"].get<uint64_t>();
      points.push_back(point);
      if (score > best_score) {
        best_score = score;
        best = point;
      }
    }
  }
  // Recommendation, robust to single lucky samples: the reference is the median of the five
  // best scores; a block size qualifies from the smallest depth at which it and every deeper
  // point score at least 90% of that (the plateau); of those, the least staging memory.
  std::vector<double> scores;
  for (const auto& p : points) scores.push_back(p["score_gbps"].get<double>());
  std::sort(scores.rbegin(), scores.rend());
  double reference = scores.empty() ? 0 : scores[std::min<size_t>(2, (scores.size() - 1) / 2)];
  uint64_t least_memory = UINT64_MAX;
  for (uint64_t block : o.blocks) {
    const nlohmann::json* start = nullptr;
    for (auto it = o.depths.rbegin(); it != o.depths.rend(); ++it) {
      const nlohmann::json* p = nullptr;
      for (const auto& q : points)
        if (q["block_bytes"] == block && q["queue_depth"] == *it) p = &q;
      if (!p || p->at("score_gbps").get<double>() < 0.9 * reference) break;
      start = p;
    }
    if (!start) continue;
    uint64_t mem = block * start->at("queue_depth").get<uint64_t>();
    if (mem < least_memory) {
      least_memory = mem;
      recommended = *start;
    }
  }
  if (recommended.is_null() && !best.is_null()) {
    recommended = best;
    least_memory = best["block_bytes"].get<uint64_t>() * best["queue_depth"].get<uint64_t>();
  }
  nlohmann::json j;
  j["bench"] = "io_sweep";
  j["dirs"] = o.base.dirs;
  j["size_cap_bytes"] = o.base.size_bytes;
  j["seconds_per_phase"] = o.seconds_per_phase;
  j["stripe_bytes"] = o.base.stripe_bytes;
  j["points"] = points;
  j["best"] = best;
  j["recommended"] = recommended;
  j["reference_gbps"] = round3(reference);
  j["recommended"]["staging_bytes"] = least_memory;
  j["wrong"] = wrong;
  return j;
}

std::string format_io_bench(const nlohmann::json& j) {
  std::string out;
  if (j["bench"] == "io") {
    const auto& b = j["buffers"];
    out += str("strata bench io: backend ", j["backend"].get<std::string>(), ", O_DIRECT ",
               j["direct"].get<bool>() ? "on" : "off", "\n");
    out += str("  staging ", b["count"].get<int>(), " x ", format_bytes(j["block_bytes"]), " on ",
               b["pages"].get<std::string>(), " pages (", format_bytes(b["huge_bytes"]),
               " on huge pages)", ", buffers ",
               b["registered"].get<bool>() ? "registered" : "not registered", ", files ",
               b["files_registered"].get<bool>() ? "registered" : "not registered", "\n");
    if (!b["pages_why"].get<std::string>().empty())
      out += str("  not hugetlb: ", b["pages_why"].get<std::string>(), "\n");
    out += "  dirs:";
    for (const auto& d : j["dirs"]) out += " " + d.get<std::string>();
    out += str("\n  size ", format_bytes(j["size_bytes"]), ", block ",
               format_bytes(j["block_bytes"]), ", queue depth ", j["queue_depth"].get<int>(),
               ", submit batch ", j.value("submit_batch", 0), ", stripe ",
               format_bytes(j["stripe_bytes"]), ", alignment ", j["alignment"]["offset"].get<int>(),
               "\n");
    char line[256];
    std::snprintf(line, sizeof line, "  write %8.3f GB/s %9.0f IOPS  (%s in %.2f s%s)\n",
                  j["write_gbps"].get<double>(), j["write_iops"].get<double>(),
                  format_bytes(j["bytes_written"]).c_str(), j["write_seconds"].get<double>(),
                  j.value("pattern", "") == "overwrite" ? ", over blocks written before" : "");
    out += line;
    if (j.contains("update")) {
      const auto& u = j["update"];
      std::snprintf(line, sizeof line,
                    "  update %7.3f GB/s read and written (%s read, %s written in %.2f s: "
                    "read %.3f, write %.3f GB/s)\n",
                    u["gbps"].get<double>(), format_bytes(u["bytes_read"]).c_str(),
                    format_bytes(u["bytes_written"]).c_str(), u["seconds"].get<double>(),
                    u["read_gbps"].get<double>(), u["write_gbps"].get<double>());
      out += line;
    }
    std::snprintf(line, sizeof line, "  read  %8.3f GB/s %9.0f IOPS  (%s in %.2f s)\n",
                  j["read_gbps"].get<double>(), j["read_iops"].get<double>(),
                  format_bytes(j["bytes_read"]).c_str(), j["read_seconds"].get<double>());
    out += line;
    out += str("  wrong sectors: ", j["wrong"].get<uint64_t>(), ", requeued ",
               j["requeued"].get<uint64_t>(), ", short transfers resubmitted ",
               j["resubmitted"].get<uint64_t>(), "\n");
    if (!j["direct"].get<bool>())
      out += "  note: O_DIRECT was refused, so reads may come from the page cache; these are "
             "not the device's figures\n";
    return out;
  }
  // Sweep: rows are block sizes, columns depths, cells "write/read" GB/s.
  std::vector<uint64_t> blocks;
  std::vector<int> depths;
  for (const auto& p : j["points"]) {
    uint64_t b = p["block_bytes"];
    int d = p["queue_depth"];
    if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
    if (std::find(depths.begin(), depths.end(), d) == depths.end()) depths.push_back(d);
  }
  out += str("strata bench io --sweep: write/read GB/s, at most ",
             format_bytes(j["size_cap_bytes"]), " or ", j["seconds_per_phase"].get<double>(),
             " s per phase\n");
  char cell[64];
  out += "  block \\ qd";
  for (int d : depths) {
    std::snprintf(cell, sizeof cell, " %11d", d);
    out += cell;
  }
  out += "\n";
  for (uint64_t b : blocks) {
    std::snprintf(cell, sizeof cell, "  %-10s", format_bytes(b).c_str());
    out += cell;
    for (int d : depths) {
      for (const auto& p : j["points"])
        if (p["block_bytes"] == b && p["queue_depth"] == d) {
          std::snprintf(cell, sizeof cell, " %5.2f/%5.2f", p["write_gbps"].get<double>(),
                        p["read_gbps"].get<double>());
          out += cell;
        }
    }
    out += "\n";
  }
  const auto& best = j["best"];
  const auto& rec = j["recommended"];
  out += str("  best: block ", format_bytes(best["block_bytes"]), ", depth ",
             best["queue_depth"].get<int>(), ": write ", best["write_gbps"].get<double>(),
             " GB/s, read ", best["read_gbps"].get<double>(), " GB/s\n");
  out += str("  recommended (least staging memory on the plateau: this depth and all deeper ones "
             "within 10% of the best): io.block_size = ",
             format_bytes(rec["block_bytes"]), ", io.queue_depth = ",
             rec["queue_depth"].get<int>(), " (", format_bytes(rec["staging_bytes"]),
             " staging): write ", rec["write_gbps"].get<double>(), " GB/s, read ",
             rec["read_gbps"].get<double>(), " GB/s\n");
  out += str("  wrong sectors: ", j["wrong"].get<uint64_t>(), "\n");
  return out;
}

}  // namespace strata
