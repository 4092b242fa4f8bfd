#!/usr/bin/env python3
"""Check a model that `strata train --out` (or `strata checkpoint export`) wrote, with transformers.

It loads HF_DIR with `LlamaForCausalLM.from_pretrained` (float32, CPU, eager attention) and
computes the mean next-token cross-entropy on exactly the windows `strata eval` reads, so the two
numbers can be compared: with T = --seq-len and B = --micro-batch, eval batch i (i < --batches)
reads windows i·B … i·B + B − 1, not shuffled, and window w is tokens [w·T, w·T + T + 1) of the
file, wrapping around at its end; inputs are its first T tokens, targets its last T
(engine/data.h, Trainer::evaluate). The defaults are strata's: data.seq_len 128,
data.micro_batch 8, eval.batches 8. Per-token losses are float32, summed in float64.

With --expect-loss X (strata eval's eval_loss) it exits 1 when |loss − X| / |X| > --rtol
(default 1e-4). The last line on stdout is a JSON object. It does not evaluate the built-in tasks
(builtin:NAME): give the file strata read.

Run:  /work/venv/bin/python tools/check_export.py HF_DIR --tokens FILE [--seq-len T --batches N
          --micro-batch B] [--expect-loss X --rtol R]
See tools/README.md.
"""

import argparse
import json
import os
import sys
from array import array

MAGIC = 20240520
HEADER_BYTES = 256 * 4


class CheckError(Exception):
    """An input the user can fix; printed as `check_export: error: ...`, exit 2."""


def read_tokens(path):
    """The token stream strata's open_tokens reads from `path`: an llm.c token file (recognized
    by its magic; version 1 = uint16, 2 = uint32) or, for any other file, its bytes."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise CheckError(f"--tokens {path}: {e.strerror}") from e
    magic = int.from_bytes(data[:4], "little", signed=True) if len(data) >= 4 else None
    if magic != MAGIC:
        if path.endswith(".bin"):
            raise CheckError(f"{path}: bad magic {magic}; a .bin file must be an llm.c token file "
                             f"(magic {MAGIC}), as strata requires")
        if not data:
            raise CheckError(f"{path}: the file is empty")
        return list(data), "bytes"
    if len(data) < HEADER_BYTES:
        raise CheckError(f"{path}: truncated token file ({len(data)} bytes, header is {HEADER_BYTES})")
    header = array("i", data[:12])
    if sys.byteorder != "little":
        header.byteswap()
    _, version, count = header
    if version not in (1, 2):
        raise CheckError(f"{path}: token file version {version}; allowed: 1 (uint16) or 2 (uint32)")
    width = 2 if version == 1 else 4
    if count <= 0 or len(data) != HEADER_BYTES + count * width:
        raise CheckError(f"{path}: header says {count} uint{8 * width} tokens, the file has "
                         f"{len(data)} bytes (want {HEADER_BYTES + max(count, 0) * width})")
    tokens = array("H" if version == 1 else "I", data[HEADER_BYTES:])
    if sys.byteorder != "little":
        tokens.byteswap()
    return tokens, f"uint{8 * width}"


def eval_windows(n_tokens, seq_len, micro_batch, batches):
    """Per eval batch, the start token of each of its rows (strata's WindowSampler with shuffle
    off): batch i, row r reads window i·B + r, which starts at token (i·B + r)·T mod size."""
    return [[((i * micro_batch + r) * seq_len) % n_tokens for r in range(micro_batch)]
            for i in range(batches)]


def window_tokens(tokens, start, length):
    """tokens[start : start + length], wrapping around the end (start < len(tokens))."""
    n = len(tokens)
    out = []
    while length > 0:
        take = min(length, n - start)
        out.extend(tokens[start:start + take])
        length -= take
        start = 0
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Mean next-token loss of a strata-exported model under transformers, on the "
                    "windows `strata eval` reads.")
    ap.add_argument("hf_dir", metavar="HF_DIR", help="what `strata train --out` wrote")
    ap.add_argument("--tokens", required=True, metavar="FILE",
                    help="the data strata evaluated (eval.path, else data.path)")
    ap.add_argument("--seq-len", type=int, default=128, help="data.seq_len (default 128)")
    ap.add_argument("--micro-batch", type=int, default=8, help="data.micro_batch (default 8)")
    ap.add_argument("--batches", type=int, default=8, help="eval.batches (default 8)")
    ap.add_argument("--expect-loss", type=float, help="strata eval's eval_loss, to compare with")
    ap.add_argument("--rtol", type=float, default=1e-4,
                    help="largest relative difference from --expect-loss that passes (default 1e-4)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = ap.parse_args(argv)
    try:
        return run(args)
    except CheckError as e:
        print(f"check_export: error: {e}", file=sys.stderr)
        return 2


def run(args):
    for name in ("seq_len", "micro_batch", "batches"):
        if getattr(args, name) < 1:
            raise CheckError(f"--{name.replace('_', '-')} {getattr(args, name)}: allowed: >= 1")
    if not os.path.isfile(os.path.join(args.hf_dir, "config.json")):
        raise CheckError(f"{args.hf_dir}: no config.json (give the directory `strata train --out` "
                         "or `strata checkpoint export` wrote)")
    tokens, dtype = read_tokens(args.tokens)

    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()  # "Loading weights"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, info = LlamaForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32,
                                                   attn_implementation="eager",
                                                   output_loading_info=True)
    missing = [k for k in info.get("missing_keys", [])
               if not (k == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or info.get("unexpected_keys") or info.get("mismatched_keys"):
        raise CheckError(f"{args.hf_dir}: transformers did not load it cleanly: missing "
                         f"{missing}, unexpected {info.get('unexpected_keys')}, mismatched "
                         f"{info.get('mismatched_keys')}")
    model.eval()
    vocab = model.config.vocab_size
    top = max(tokens)
    if top >= vocab:
        raise CheckError(f"{args.tokens}: token {top} at index {list(tokens).index(top)} is out of "
                         f"range of the model's vocab_size {vocab}")
    if args.seq_len > model.config.max_position_embeddings:
        raise CheckError(f"--seq-len {args.seq_len} exceeds the model's max_position_embeddings "
                         f"{model.config.max_position_embeddings} (strata refuses it too)")

    T, B = args.seq_len, args.micro_batch
    total, count = 0.0, 0
    with torch.inference_mode():
        for starts in eval_windows(len(tokens), T, B, args.batches):
            rows = torch.tensor([window_tokens(tokens, s, T + 1) for s in starts], dtype=torch.long)
            logits = model(input_ids=rows[:, :T]).logits  # (B, T, V) float32
            losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                                     reduction="none")  # (B·T) float32
            total += losses.double().sum().item()
            count += losses.numel()
    loss = total / count

    print(f"check_export: {args.hf_dir}: loss {loss:.9g} over {args.batches} batches x {B} x {T} "
          f"tokens of {args.tokens} ({len(tokens)} {dtype} tokens; transformers "
          f"{transformers.__version__}, torch {torch.__version__}, float32, CPU)")
    result = {"loss": loss, "batches": args.batches, "micro_batch": B, "seq_len": T,
              "tokens": args.tokens}
    status = 0
    if args.expect_loss is not None:
        rel = abs(loss - args.expect_loss) / max(abs(args.expect_loss), 1e-30)
        ok = rel <= args.rtol
        print(f"check_export: expected {args.expect_loss:.9g}: relative difference {rel:.3g} "
              f"{'<=' if ok else '>'} rtol {args.rtol:g}: {'ok' if ok else 'MISMATCH'}")
        result.update(expect_loss=args.expect_loss, rel_diff=rel, rtol=args.rtol, ok=ok)
        status = 0 if ok else 1
    print(json.dumps(result))
    return status


if __name__ == "__main__":
    sys.exit(main())
