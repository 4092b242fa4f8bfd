#!/usr/bin/env python3
"""Seed corpora for the strata fuzz targets (tests/fuzz/corpus/<target>/).

Small valid and near-valid inputs, one file each, in the input formats documented at the top of
each tests/fuzz/fuzz_<target>.cpp. libFuzzer mutates them; the g++ test suite also replays them
(tests/engine/test_fuzz_inputs.cpp). Plain Python 3, no packages. Rerun only when a format
changes; the files are committed:

    python3 tools/make_fuzz_seeds.py                 # rewrites tests/fuzz/corpus/
    python3 tools/make_fuzz_seeds.py --out-dir DIR
"""
import argparse
import json
import os
import shutil
import struct

MAGIC = 20240520
FILE_SEP = b"\n--file--\n"


def safetensors(tensors, metadata=None, pad_to=8, header_len=None):
    """tensors: list of (name, dtype, shape, data bytes) in data order."""
    header, offset, data = {}, 0, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad_to:
        text += b" " * ((-len(text)) % pad_to)
    n = len(text) if header_len is None else header_len
    return struct.pack("<Q", n) + text + data


def f32(*v):
    return struct.pack(f"<{len(v)}f", *v)


def bf16(*v):
    return b"".join(struct.pack("<f", x)[2:] for x in v)


def f16(*v):
    return struct.pack(f"<{len(v)}e", *v)


def i32(*v):
    return struct.pack(f"<{len(v)}i", *v)


def i64(*v):
    return struct.pack(f"<{len(v)}q", *v)


def seeds_safetensors():
    ok = [("w", "F32", [2, 2], f32(1, 2, 3, 4))]
    return {
        "f32.safetensors": safetensors(ok, {"format": "pt"}),
        "all_dtypes.safetensors": safetensors([
            ("a", "F32", [3], f32(1, -2, 0.5)),
            ("b", "BF16", [2, 2], bf16(1, 2, -3, 4)),
            ("c", "F16", [1, 3], f16(0.25, 8, -1)),
            ("d", "I32", [2], i32(7, -7)),
            ("e", "I64", [2], i64(1, -(1 << 40))),
        ]),
        "odd_header.safetensors": safetensors([("h", "BF16", [3], bf16(1, 2, 3))], pad_to=0),
        "empty.safetensors": safetensors([]),
        "zero_dim.safetensors": safetensors([("z", "F32", [0, 4], b""), ("s", "F32", [], f32(9))]),
        "truncated.safetensors": safetensors(ok)[:-3],
        "long_header_len.safetensors": safetensors(ok, header_len=1 << 40),
        "overlap.safetensors": struct.pack("<Q", 96) + json.dumps(
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
             "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
            separators=(",", ":")).encode().ljust(96) + f32(1, 2, 3),
        "big_shape.safetensors": safetensors(
            [("t", "F32", [4294967296, 4294967296], b"")]),
        "i64_wide.safetensors": safetensors([("t", "I64", [1], i64(1 << 40))]),
    }


def seeds_index():
    s1 = safetensors([("model.embed_tokens.weight", "F32", [2, 2], f32(1, 2, 3, 4))])
    s2 = safetensors([("lm_head.weight", "BF16", [2, 2], bf16(1, 2, 3, 4)),
                      ("model.norm.weight", "F32", [2], f32(1, 1))])
    index = {"metadata": {"total_size": 28},
             "weight_map": {"model.embed_tokens.weight": "1.safetensors",
                            "lm_head.weight": "2.safetensors",
                            "model.norm.weight": "2.safetensors"}}
    one = {"weight_map": {"w": "1.safetensors"}}
    return {
        "two_shards": json.dumps(index, indent=1).encode() + FILE_SEP + s1 + FILE_SEP + s2,
        "one_shard": json.dumps(one).encode() + FILE_SEP + safetensors(
            [("w", "F32", [1], f32(5))]),
        "missing_shard": json.dumps(index).encode() + FILE_SEP + s1,
        "wrong_shard": json.dumps({"weight_map": {"w": "2.safetensors"}}).encode() + FILE_SEP +
        safetensors([("w", "F32", [1], f32(5))]) + FILE_SEP + safetensors([]),
    }


def seeds_hf_config():
    tiny = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 2, "head_dim": 16, "vocab_size": 256,
            "max_position_embeddings": 128, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "rope_scaling": None, "tie_word_embeddings": False, "attention_bias": False,
            "mlp_bias": False, "initializer_range": 0.02, "torch_dtype": "bfloat16"}
    llama3 = {"architectures": ["LlamaForCausalLM"], "bos_token_id": 128000,
              "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
              "initializer_range": 0.02, "intermediate_size": 14336,
              "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 32,
              "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
              "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16",
              "transformers_version": "4.40.0.dev0", "use_cache": True, "vocab_size": 128256}
    minimal = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
               "num_hidden_layers": 1, "vocab_size": 256}
    return {
        "tiny.json": json.dumps(tiny, indent=2).encode(),
        "llama3_8b.json": json.dumps(llama3, indent=2).encode(),
        "minimal.json": json.dumps(minimal).encode(),
        "tied.json": json.dumps(dict(minimal, tie_word_embeddings=True, rope_theta=1e6,
                                     rms_norm_eps=1e-6)).encode(),
        "rope_scaling.json": json.dumps(dict(minimal, rope_scaling={"type": "linear",
                                                                    "factor": 2.0})).encode(),
        "bad_head_dim.json": json.dumps(dict(minimal, head_dim=8)).encode(),
        "gelu.json": json.dumps(dict(minimal, hidden_act="gelu")).encode(),
        "not_object.json": b"[1, 2, 3]",
    }


def seeds_config_toml():
    full = b"""[model]
dim = 512
n_layers = 8
n_heads = 8
n_kv_heads = 2
ffn_dim = 1536
vocab_size = 256
max_seq_len = 1024
rope_theta = 500000
norm_eps = 1e-5
tie_embeddings = true
init_std = 0.02

[data]
path = "tokens.bin"
seq_len = 256
micro_batch = 4
shuffle = true

[train]
steps = 100
lr = 1e-3
warmup_steps = 10
schedule = "cosine"
min_lr_ratio = 0.1
weight_decay = 0.1
decay_norms = false
beta1 = 0.9
beta2 = 0.95
eps = 1e-8
grad_clip = 1.0
grad_accum = 2
precision = "bf16"
seed = 7
device = "cpu"
threads = 0

[eval]
batches = 8
path = ""

[log]
every = 10
metrics = "m.jsonl"
trace = ""
peak_flops = 0

[offload]
params = "nvme"
grads = "host"
optimizer = "nvme"
device_mem_limit = "2G"
pinned_mem_limit = 4096
nvme_path = ["/mnt/a", "/mnt/b"]
prefetch = 2
optimizer_chunk = "64M"

[zero]
prefetch = 1
reshard_after_forward = true
activation_checkpointing = false

[parallel]
dp = 0
tp = 1
pp = 1

[io]
backend = "posix"
queue_depth = 32
submit_batch = 2
block_size = "64K"
stripe_size = "1M"
"""
    return {
        "full.toml": full,
        "empty.toml": b"",
        "overrides.toml": b"[model]\ndim = 128\n\n%%\nmodel.n_heads=4\ntrain.lr=3e-4\n"
                          b"offload.device_mem_limit=1.5G\noffload.nvme_path=/a,/b\n"
                          b"data.path='x.txt'\ntrain.schedule=constant\n",
        "only_overrides.toml": b"\n%%\nzero.prefetch=3\ntrain.grad_accum=4\neval.batches=2\n",
        "bad_shape.toml": b"[model]\ndim = 250\nn_heads = 8\n",
        "pp.toml": b"[model]\nn_layers = 2\n[parallel]\npp = 4\ntp = 2\n",
        "unknown.toml": b"[modle]\ndim = 3\n",
        "types.toml": b"[train]\nlr = \"fast\"\nseed = -1\n[offload]\ndevice_mem_limit = \"2X\"\n",
    }


def token_file(tokens, version=1, count=None, magic=MAGIC):
    header = [0] * 256
    header[0], header[1] = magic, version
    header[2] = len(tokens) if count is None else count
    fmt = "<%dH" if version == 1 else "<%dI"
    return struct.pack("<256i", *header) + struct.pack(fmt % len(tokens), *tokens)


def seeds_token_file():
    # The last byte is the option byte (see tests/fuzz/fuzz_token_file.cpp).
    BIN, TXT = 0, 1
    V256, V50257, V2_24 = 1 << 1, 2 << 1, 3 << 1
    T1, T5, T64, T1024 = 0 << 3, 3 << 3, 5 << 3, 7 << 3
    SHUF, SEED = 64, 128
    v1 = token_file([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255, 0])
    return {
        "v1_bytes_vocab": v1 + bytes([BIN | V256 | T5]),
        "v1_shuffled": v1 + bytes([BIN | V256 | T1 | SHUF | SEED]),
        "v1_long_window": v1 + bytes([BIN | V50257 | T1024]),
        "v2_wide": token_file([70000, 1, 16777215], version=2) + bytes([BIN | V2_24 | T1 | SHUF]),
        "v1_token_too_big": v1 + bytes([BIN | T5]),  # vocab 64 < 255
        "bad_version": token_file([1, 2], version=3) + bytes([BIN | V256]),
        "count_mismatch": token_file([1, 2, 3], count=5) + bytes([BIN | V256]),
        "bad_magic": token_file([1, 2], magic=1234) + bytes([BIN | V256]),
        "text": b"hello, strata\n" * 3 + bytes([TXT | V256 | T5 | SHUF]),
        "text_small_vocab": b"abc" + bytes([TXT | T1]),
        "empty_text": bytes([TXT | V256]),
    }


# ---- checkpoint manifests (engine/checkpoint.cpp: CheckpointManifest::to_json) ----

STATES = ["master", "m", "v"]
BLOCK = 4096  # a rank's file holds one block per state, each a multiple of 4 KiB


def manifest(tensors, pieces, files, version=2, state_dtypes=None, mesh=(1, 1, 1, 1), step=10,
             windows=40):
    """tensors: [(name, shape)]; pieces: {name: [piece dict]}; files: [(name, bytes, xxh64)]."""
    world, dp, tp, pp = mesh
    config = {"model": {"dim": 8, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "ffn_dim": 16,
                        "vocab_size": 16, "max_seq_len": 32, "tie_embeddings": False},
              "train": {"steps": 100, "lr": 0.001, "precision": "fp32", "seed": 7},
              "parallel": {"dp": dp, "tp": tp, "pp": pp}}
    m = {"format": "strata-checkpoint", "version": version, "strata_version": "0.9.0",
         "step": step, "windows_consumed": windows, "precision": "fp32",
         "mesh": {"world": world, "dp": dp, "tp": tp, "pp": pp}, "config": config,
         "config_toml": "[model]\ndim = 8\nn_layers = 1\n\n[train]\nsteps = 100\n",
         "states": STATES,
         "tensors": [{"name": n, "shape": s, "dtype": "f32", "pieces": pieces.get(n, [])}
                     for n, s in tensors],
         "files": [{"name": n, "bytes": b, "xxh64": h} for n, b, h in files]}
    if state_dtypes:
        m["state_dtypes"] = state_dtypes
    return m


def piece(state, file, offset, start, count, rows=1, row_stride=0):
    p = {"state": STATES[state], "file": file, "offset": offset, "start": start, "count": count}
    if rows > 1:
        p["rows"], p["row_stride"] = rows, row_stride
    return p


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def sharded(tensors, dp, elem_bytes=(4, 4, 4)):
    """Pieces and files of tensors laid end to end and split in dp equal shards (tp 1)."""
    total = sum(numel(s) for _, s in tensors)
    shard = -(-total // dp)
    pieces, files = {}, []
    for rank in range(dp):
        name = "rank_%05d.bin" % rank
        lo, hi = rank * shard, min(total, (rank + 1) * shard)
        at = 0
        for s in range(3):
            base = at
            flat = 0
            for t, shape in tensors:
                a, b = max(lo, flat), min(hi, flat + numel(shape))
                if a < b:
                    pieces.setdefault(t, []).append(
                        piece(s, name, base + (a - lo) * elem_bytes[s], a - flat, b - a))
                flat += numel(shape)
            at += -(-shard * elem_bytes[s] // BLOCK) * BLOCK
        files.append((name, at, "%016x" % (0x9e3779b97f4a7c15 * (rank + 1) % (1 << 64))))
    return pieces, files


def dump_manifest(m):
    return json.dumps(m, indent=1, sort_keys=True).encode() + b"\n"


def seeds_checkpoint_manifest():
    tiny = [("model.embed_tokens.weight", [16, 8]),
            ("model.layers.0.self_attn.q_proj.weight", [8, 8]),
            ("model.norm.weight", [8])]
    one = manifest(tiny, *sharded(tiny, 1))
    dp2 = manifest(tiny, *sharded(tiny, 2), mesh=(2, 2, 1, 1))
    bf16 = manifest(tiny, *sharded(tiny, 1, (4, 2, 2)), version=3,
                    state_dtypes=["f32", "bf16", "bf16"])
    # A (4, 8) tensor stored as two column halves in two files (tp 2), and an (8) one whole.
    w_pieces, n_pieces = [], []
    for s in range(3):
        w_pieces += [piece(s, "rank_00000.bin", s * 96, 0, 4, 4, 8),
                     piece(s, "rank_00001.bin", s * 96, 4, 4, 4, 8)]
        n_pieces.append(piece(s, "rank_00000.bin", s * 96 + 64, 0, 8))
    tp2 = manifest([("w", [4, 8]), ("n", [8])], {"w": w_pieces, "n": n_pieces},
                   [("rank_00000.bin", 288, "0000000000000001"),
                    ("rank_00001.bin", 288, "00000000000000ff")], mesh=(2, 1, 2, 1))
    v1 = manifest([("w", [4, 8]), ("n", [8])],
                  {"w": [piece(s, "rank_00000.bin", s * 128, 0, 32) for s in range(3)],
                   "n": [piece(s, "rank_00001.bin", s * 32, 0, 8) for s in range(3)]},
                  [("rank_00000.bin", 384, "0123456789abcdef"),
                   ("rank_00001.bin", 96, "fedcba9876543210")], version=1)

    def edit(m, f):
        m = json.loads(json.dumps(m))
        f(m)
        return dump_manifest(m)

    def first_piece(m):
        return m["tensors"][0]["pieces"][0]

    sum_sep = FILE_SEP
    return {
        "one_rank.json": dump_manifest(one),
        "dp2.json": dump_manifest(dp2),
        "bf16_states.json": dump_manifest(bf16),
        "tp2_column_pieces.json": dump_manifest(tp2),
        "version1.json": dump_manifest(v1),
        "gap.json": edit(one, lambda m: first_piece(m).update(count=127)),
        "overlap.json": edit(tp2, lambda m: m["tensors"][0]["pieces"][1].update(start=3)),
        "rows_overlap.json": edit(tp2, lambda m: first_piece(m).update(row_stride=3)),
        "past_file.json": edit(one, lambda m: first_piece(m).update(offset=12000)),
        "unknown_state.json": edit(one, lambda m: first_piece(m).update(state="adam")),
        "unlisted_file.json": edit(dp2, lambda m: first_piece(m).update(file="rank_00002.bin")),
        "bad_hash.json": edit(one, lambda m: m["files"][0].update(xxh64="xyz")),
        "path_name.json": edit(one, lambda m: m["files"][0].update(name="../rank_00000.bin")),
        "version4.json": edit(one, lambda m: m.update(version=4)),
        "version1_tp2.json": edit(tp2, lambda m: m.update(version=1)),
        "version1_rows.json": edit(tp2, lambda m: m.update(
            version=1, mesh={"world": 1, "dp": 1, "tp": 1, "pp": 1})),
        "state_dtypes_v2.json": edit(bf16, lambda m: m.update(version=2)),
        "negative_step.json": edit(one, lambda m: m.update(step=-1)),
        "bad_mesh.json": edit(dp2, lambda m: m["mesh"].update(world=3)),
        "impossible_shape.json": edit(one, lambda m: m["tensors"][0].update(
            shape=[1 << 21, 1 << 21])),
        "not_a_manifest.json": edit(one, lambda m: m.update(format="safetensors")),
        "missing_files.json": edit(one, lambda m: m.pop("files")),
        "truncated.json": dump_manifest(one)[:300],
        "wrong_sum": dump_manifest(tp2) + sum_sep + b"0000000000000000  manifest.json\n",
        "short_sum": dump_manifest(tp2) + sum_sep + b"abc",
    }


# ---- metrics JSONL (engine/trainer.cpp writes one object per logged step) ----

def metrics_line(step, loss=2.5, eval_loss=None, tps=1000.0, step_ms=12.5, nvme=0, cpu=True):
    j = {"step": step, "loss": loss, "lr": 0.001, "grad_norm": 1.5, "tokens_per_s": tps,
         "mfu": 0.25, "step_ms": step_ms, "params": 100,
         "time": {"compute_ms": step_ms * 0.8, "wait_comm_ms": 1.25, "optimizer_ms": 2.5,
                  "update_wait_ms": 0},
         "comm_bytes": 0, "tp_comm_bytes": 0, "gathers": 4,
         "mesh": {"dp": 1, "tp": 1, "pp": 1}, "pipeline": None, "ranks": 1,
         "mem": {"device_peak_bytes": 1073741824, "host_rss_bytes": 2147483648,
                 "pinned_bytes": 268435456, "host_state_bytes": 4294967296,
                 "nvme_bytes": nvme},
         "io": {"read_bytes": 0, "write_bytes": 0, "read_gbps": 0, "write_gbps": 0,
                "busy_ms": 0, "wait_ms": 0.5, "read_ahead_bytes": 0, "forwarded_bytes": 0},
         "links": {"h2d_bytes": 0, "d2h_bytes": 0}}
    if cpu:
        j["cpu"] = {"busy_share": 0.75, "idle_share": 0.125, "process_cores": 1.5,
                    "steal_share": 0.125}
    if eval_loss is not None:
        j["eval_loss"] = eval_loss
    return json.dumps(j, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def seeds_metrics_jsonl():
    three = (metrics_line(1) + metrics_line(2, 2.25, eval_loss=2.375) +
             metrics_line(3, 2.0, eval_loss=2.125, nvme=17179869184))
    return {
        "three_steps.jsonl": three,
        "one_step.jsonl": metrics_line(1, cpu=False),
        "resumed.jsonl": metrics_line(10, 3.5) + metrics_line(20, 3.25) + metrics_line(
            10, 3.4) + b'{"step":20,"eval_loss":3.0}\n',
        "mixed.jsonl": b"not json at all\n{\"loss\":3}\n[1,2,3]\n\n{\"step\":\"4\",\"loss\":3}\n" +
        metrics_line(10, None) + b'{"step":2.5}\n{"step":30.0,"loss":3.1,"mem":'
        b'{"nvme_bytes":1.5e9,"pinned_bytes":-1}}\n{"step":50,"loss":2.9,"ste',
        "crlf.jsonl": b'{"step":1,"loss":2.5}\r\n  \t\r\n{"step":2,"loss":1e-3}\r\n',
        "minimal.jsonl": b'{"step":0}',
        "empty.jsonl": b"",
        "blank.jsonl": b"\n \n\t\r\n",
        "no_step.jsonl": b'{"loss":2.5}\n{"step":null}\n{"step":1.5}\n',
    }


# ---- the rate cache (engine/rate_cache.cpp: store_rates) ----
# An input is the machine key, a newline, then the file; without a newline there is no file
# (tests/fuzz/fuzz_rate_cache.cpp).

CPU_KEY = "device=cpu nvme=none"
GPU_KEY = "device=NVIDIA H100 80GB HBM3 nvme=259:0 /mnt/nvme (ext4)"


def rate_entry(device="cpu", nvme="", comm=0.0):
    e = {"device": device, "nvme": nvme, "gemm_flops": 150000000000.0,
         "attention_flops": 40000000000.0, "adam_gbps": 18.5, "device_mem_gbps": 18.5,
         "h2d_gbps": 12.25, "d2h_gbps": 12.0, "cpu_threads": 16,
         "measured_at": "2025-03-01T12:00:00Z"}
    if comm > 0:
        e["comm_gbps"] = comm
    if nvme:
        e.update(nvme_read_gbps=6.5, nvme_write_gbps=4.25, nvme_read_busy_gbps=5.5,
                 nvme_write_busy_gbps=3.75, nvme_steal_s_per_gb=0.0625)
    return e


def rate_file(machines, version=1):
    return json.dumps({"version": version, "machines": machines}, indent=2,
                      sort_keys=True).encode() + b"\n"


def seeds_rate_cache():
    cpu = rate_entry()
    gpu = rate_entry("NVIDIA H100 80GB HBM3", "259:0 /mnt/nvme (ext4)", comm=80.0)
    both = {CPU_KEY: cpu, GPU_KEY: gpu}

    def with_key(key, text):
        return key.encode() + b"\n" + text

    def entry(**change):
        e = dict(cpu, **change)
        return rate_file({CPU_KEY: {k: v for k, v in e.items() if v is not None}})

    old_nvme = {k: v for k, v in gpu.items() if k not in ("nvme_read_busy_gbps",
                                                          "nvme_steal_s_per_gb")}
    return {
        "cpu": with_key(CPU_KEY, rate_file({CPU_KEY: cpu})),
        "gpu_nvme": with_key(GPU_KEY, rate_file(both)),
        "other_machine": with_key("device=cpu nvme=8:1 / (ext4)", rate_file(both)),
        "no_file": CPU_KEY.encode(),
        "empty_file": with_key(CPU_KEY, b""),
        "older_entry": with_key(CPU_KEY, entry(attention_flops=None)),
        "older_nvme_entry": with_key(GPU_KEY, rate_file({GPU_KEY: old_nvme})),
        "zero_rate": with_key(CPU_KEY, entry(gemm_flops=0)),
        "string_rate": with_key(CPU_KEY, entry(h2d_gbps="fast")),
        "no_cpu_threads": with_key(CPU_KEY, entry(cpu_threads=None)),
        "no_measured_at": with_key(CPU_KEY, entry(measured_at=None)),
        "negative_steal": with_key(GPU_KEY, rate_file({GPU_KEY: dict(
            gpu, nvme_steal_s_per_gb=-1)})),
        "entry_not_object": with_key(CPU_KEY, rate_file({CPU_KEY: [1, 2]})),
        "version2": with_key(CPU_KEY, rate_file({CPU_KEY: cpu}, version=2)),
        "no_machines": with_key(CPU_KEY, b'{"version": 1}\n'),
        "not_json": with_key(CPU_KEY, b"gemm_flops = 1e12\n"),
        "no_key_line": rate_file({CPU_KEY: cpu}),
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default=os.path.join(here, "..", "tests", "fuzz", "corpus"))
    args = parser.parse_args()
    corpora = {
        "safetensors": seeds_safetensors(),
        "safetensors_index": seeds_index(),
        "hf_config": seeds_hf_config(),
        "config_toml": seeds_config_toml(),
        "token_file": seeds_token_file(),
        "checkpoint_manifest": seeds_checkpoint_manifest(),
        "metrics_jsonl": seeds_metrics_jsonl(),
        "rate_cache": seeds_rate_cache(),
    }
    for target, files in corpora.items():
        d = os.path.join(args.out_dir, target)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for name, data in files.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{d}: {len(files)} seeds, {sum(len(v) for v in files.values())} bytes")


if __name__ == "__main__":
    main()
