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
