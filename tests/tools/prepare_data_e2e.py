"""tools/prepare_data.py and tools/check_export.py end to end (run by test_prepare_data.sh, which
skips when this Python lacks tokenizers, transformers or torch).

It trains a byte-level BPE tokenizer (vocabulary 2000, <|endoftext|>) on the repository's own
docs/*.md — nothing is downloaded — then tokenizes docs/*.md (plain text: a document per file)
and a JSONL file made here, with a validation split, and checks: the header and width of each
file; that splitting each file at the end-of-text id and decoding gives back exactly the
documents, train and validation together in their original order; determinism; uint32 files
(--dtype uint32, and a tokenizer whose ids pass 65535); the HF-directory path (AutoTokenizer)
giving the same bytes; the errors (a JSONL line without "text", no end-of-text token, a split of
one document) leaving no file behind; that strata trains on the files it writes and refuses a
vocabulary too small for them; and that check_export.py's transformers loss matches `strata eval`
on an exported model, on windows that wrap around the end of the file.

Usage: python prepare_data_e2e.py --strata BIN --repo ROOT --work DIR
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
from array import array

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def run(cmd, want_rc=0, what=None):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    label = what or " ".join(os.path.basename(str(c)) if i < 2 else str(c) for i, c in enumerate(cmd))
    if not check(p.returncode == want_rc, f"{label} exits {want_rc} (got {p.returncode})"):
        print(p.stdout[-3000:], p.stderr[-3000:], sep="\n")
    return p


def read_token_file(path):
    data = open(path, "rb").read()
    header = array("i", data[:1024])
    width = {1: 2, 2: 4}.get(header[1])
    tokens = array("H" if width == 2 else "I", data[1024:]) if width else array("I")
    return header[0], header[1], header[2], len(data), tokens


def split_docs(tokens, eot):
    docs, cur = [], []
    for t in tokens:
        if t == eot:
            docs.append(cur)
            cur = []
        else:
            cur.append(t)
    return docs, cur


def train_tokenizer(docs_glob, out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(sorted(glob.glob(docs_glob)), trainer)
    os.makedirs(out_dir)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    return path


def shifted_tokenizer(src, out_dir, offset):
    """The same tokenizer with every id moved up by `offset` (ids below it are unused filler
    entries), so its vocabulary passes 65535 and files must be uint32."""
    j = json.load(open(src))
    j["model"]["vocab"] = {**{f"<unused_{i}>": i for i in range(offset)},
                           **{k: v + offset for k, v in j["model"]["vocab"].items()}}
    for t in j["added_tokens"]:
        t["id"] += offset
    os.makedirs(out_dir)
    path = os.path.join(out_dir, "tokenizer.json")
    json.dump(j, open(path, "w"))
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    from tokenizers import Tokenizer

    py = sys.executable
    prep = os.path.join(a.repo, "tools", "prepare_data.py")
    check_export = os.path.join(a.repo, "tools", "check_export.py")
    w = a.work
    docs_glob = os.path.join(a.repo, "docs", "*.md")

    tok_path = train_tokenizer(docs_glob, os.path.join(w, "tok"))
    tok = Tokenizer.from_file(tok_path)
    eot = tok.token_to_id("<|endoftext|>")
    check(tok.get_vocab_size() == 2000 and eot == 0, f"tokenizer: vocabulary 2000, eot id {eot}")

    # The documents, in the order prepare_data reads them: the sorted glob, then the JSONL lines.
    md_files = sorted(glob.glob(docs_glob))
    docs = [open(f, encoding="utf-8", newline="").read() for f in md_files]
    readme = open(os.path.join(a.repo, "README.md"), encoding="utf-8", newline="").read()
    jsonl_docs = [p for p in readme.split("\n\n") if p.strip()][:20]
    jsonl_docs += ["caf\u00e9 \U0001f600 tabs\there\r\nand a \"quote\"", "  leading and trailing  \n"]
    jsonl = os.path.join(w, "extra.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for i, d in enumerate(jsonl_docs):
            f.write(json.dumps({"id": i, "text": d}) + "\n")
            if i == 3:
                f.write("\n")                                  # a blank line: skipped
                f.write(json.dumps({"text": ""}) + "\n")       # an empty document: skipped
    docs += jsonl_docs
    n = len(docs)

    # Plain text + JSONL, with a validation split.
    os.makedirs(os.path.join(w, "a"))
    train_a, val_a = os.path.join(w, "a", "train.bin"), os.path.join(w, "a", "val.bin")
    p = run([py, prep, "--tokenizer", tok_path, "--out", train_a, "--val-out", val_a,
             "--val-fraction", "0.2", "--seed", "7", docs_glob, jsonl], what="prepare_data (split)")
    print(p.stdout, end="")
    check(f"{n} documents (1 empty skipped)" in p.stdout, f"summary counts {n} documents")
    check("uint16 (version 1)" in p.stdout, "summary names the dtype")

    def verify(path, eot_id, tokenizer, version, label):
        magic, ver, count, size, tokens = read_token_file(path)
        width = 2 if version == 1 else 4
        check(magic == 20240520 and ver == version and count == len(tokens)
              and size == 1024 + count * width,
              f"{label}: header magic {magic}, version {ver}, count {count}, {size} bytes")
        pieces, tail = split_docs(tokens, eot_id)
        check(tail == [] and tokens[-1] == eot_id, f"{label}: ends with the end-of-text id")
        return [tokenizer.decode(ids, skip_special_tokens=False) for ids in pieces], tokens

    train_docs, train_tokens = verify(train_a, eot, tok, 1, "train.bin")
    val_docs, _ = verify(val_a, eot, tok, 1, "val.bin")
    want_val = round(0.2 * n)
    check(len(val_docs) == want_val and len(train_docs) == n - want_val,
          f"split: {len(train_docs)} train + {len(val_docs)} val documents (want {n - want_val} + {want_val})")
    # Interleave back: each document is the next of train or of val, in the original order.
    ti = vi = 0
    merged = True
    for d in docs:
        if ti < len(train_docs) and train_docs[ti] == d:
            ti += 1
        elif vi < len(val_docs) and val_docs[vi] == d:
            vi += 1
        else:
            merged = False
            break
    check(merged and ti == len(train_docs) and vi == len(val_docs),
          "round trip: decoding train and val gives back every document's exact text, in order")
    check(not [f for f in os.listdir(os.path.join(w, "a")) if f.endswith(".tmp")],
          "no temporary file left behind")

    # Deterministic: the same run writes the same bytes.
    os.makedirs(os.path.join(w, "b"))
    run([py, prep, "--tokenizer", tok_path, "--out", os.path.join(w, "b", "train.bin"), "--val-out",
         os.path.join(w, "b", "val.bin"), "--val-fraction", "0.2", "--seed", "7", docs_glob, jsonl],
        what="prepare_data (again)")
    same = all(open(os.path.join(w, d, f), "rb").read() == open(os.path.join(w, "a", f), "rb").read()
               for d in ["b"] for f in ["train.bin", "val.bin"])
    check(same, "the same inputs and seed give identical files")

    # uint32 on request: version 2, the same ids.
    wide = os.path.join(w, "wide.bin")
    p = run([py, prep, "--tokenizer", tok_path, "--out", wide, "--dtype", "uint32", docs_glob, jsonl],
            what="prepare_data --dtype uint32")
    wide_docs, wide_tokens = verify(wide, eot, tok, 2, "wide.bin")
    check(wide_docs == docs, "uint32 round trip: every document, no split")

    # A vocabulary past 65535: uint32 chosen by itself.
    offset = 66000
    big_path = shifted_tokenizer(tok_path, os.path.join(w, "bigtok"), offset)
    big = Tokenizer.from_file(big_path)
    big_bin = os.path.join(w, "big.bin")
    p = run([py, prep, "--tokenizer", big_path, "--out", big_bin, docs_glob, jsonl],
            what="prepare_data (vocabulary 68000)")
    check("uint32 (version 2)" in p.stdout, "a vocabulary past 65535 writes uint32")
    big_docs, big_tokens = verify(big_bin, eot + offset, big, 2, "big.bin")
    check(big_docs == docs and list(big_tokens) == [t + offset for t in wide_tokens],
          "vocabulary 68000: the same documents, every id moved by the offset")

    # A Hugging Face directory (AutoTokenizer) with an eos_token gives the same file.
    hf_tok = os.path.join(w, "hf_tok")
    shutil.copytree(os.path.join(w, "tok"), hf_tok)
    json.dump({"eos_token": "<|endoftext|>"}, open(os.path.join(hf_tok, "tokenizer_config.json"), "w"))
    hf_bin = os.path.join(w, "hf.bin")
    p = run([py, prep, "--tokenizer", hf_tok, "--out", hf_bin, docs_glob, jsonl],
            what="prepare_data --tokenizer HF_DIR")
    check("eos_token '<|endoftext|>' = 0" in p.stdout, "the directory's eos_token ends documents")
    check(os.path.exists(hf_bin) and read_token_file(hf_bin)[4] == wide_tokens,
          "AutoTokenizer on the directory writes the same tokens as the tokenizer.json")

    # Errors: clear, exit 1, and no output file (nor temporary) left behind.
    err = os.path.join(w, "err")
    os.makedirs(err)
    bad = os.path.join(w, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "no text"}) + "\n")
    p = run([py, prep, "--tokenizer", tok_path, "--out", os.path.join(err, "x.bin"), bad], 1,
            what="prepare_data on a line without text")
    check(f"{bad}:2" in p.stderr and '"text"' in p.stderr, f"names the file and line: {p.stderr.strip()}")

    no_eot = json.load(open(tok_path))
    no_eot["added_tokens"] = []
    no_eot_path = os.path.join(w, "no_eot.json")
    json.dump(no_eot, open(no_eot_path, "w"))
    p = run([py, prep, "--tokenizer", no_eot_path, "--out", os.path.join(err, "x.bin"), docs_glob], 1,
            what="prepare_data with a tokenizer without end-of-text")
    check("no end-of-text token" in p.stderr and "--eot-id" in p.stderr,
          f"says so and hints --eot-id: {p.stderr.strip().splitlines()[0] if p.stderr else ''}")
    one = os.path.join(w, "one.bin")
    run([py, prep, "--tokenizer", no_eot_path, "--eot-id", "5", "--out", one, md_files[0]],
        what="prepare_data --eot-id 5")
    check(os.path.exists(one) and read_token_file(one)[4][-1] == 5, "--eot-id 5 ends the document with 5")
    p = run([py, prep, "--tokenizer", tok_path, "--out", os.path.join(err, "x.bin"), "--val-out",
             os.path.join(err, "y.bin"), md_files[0]], 1, what="a validation split of one document")
    check("at least 2 documents" in p.stderr, f"says why: {p.stderr.strip()}")
    check(os.listdir(err) == [], f"failed runs leave nothing in {err}")

    # strata reads the files: a few steps on train.bin, evaluated on val.bin, exported. The model
    # is small but not trivial: grouped-query attention (4 heads / 2 kv), 2 layers, and weights
    # drawn with std 0.3 so that its logits are far from uniform (loss ~10, not ln 2000 = 7.6)
    # and depend on every position of the window.
    tiny = ["--set", "model.dim=64", "--set", "model.n_layers=2", "--set", "model.n_heads=4",
            "--set", "model.n_kv_heads=2", "--set", "model.ffn_dim=128", "--set", "data.seq_len=64",
            "--set", "data.micro_batch=4", "--set", "log.peak_flops=1e9", "--set", "train.warmup_steps=0"]
    export = os.path.join(w, "export")
    run([a.strata, "train", *tiny, "--set", f"data.path={train_a}", "--set", f"eval.path={val_a}",
         "--set", "model.vocab_size=2000", "--set", "model.init_std=0.3", "--set", "train.steps=3",
         "--set", "eval.batches=2", "--out", export],
        what="strata train on prepare_data's uint16 files, --out")
    run([a.strata, "train", *tiny, "--set", f"data.path={big_bin}", "--set", "model.vocab_size=68000",
         "--set", "model.dim=16", "--set", "model.n_layers=1", "--set", "train.steps=1",
         "--set", "eval.batches=1"], what="strata train on a uint32 file, vocabulary 68000")
    p = run([a.strata, "eval", *tiny, "--set", f"data.path={big_bin}", "--set", "model.vocab_size=66000"],
            1, what="strata eval with a vocabulary smaller than the file's ids")
    check("out of range" in p.stderr and "model.vocab_size = 66000" in p.stderr,
          f"names the token: {p.stderr.strip().splitlines()[0] if p.stderr else ''}")

    # check_export: transformers on the exported model, on the windows of strata eval, enough
    # batches of 4 × 64 that they run past the end of val.bin and wrap around.
    n_val = read_token_file(val_a)[2]
    batches = (n_val + 1) // (4 * 64) + 2
    p = run([a.strata, "eval", "--init-from", export, "--set", f"data.path={train_a}",
             "--set", f"eval.path={val_a}", "--set", "data.seq_len=64", "--set", "data.micro_batch=4",
             "--set", f"eval.batches={batches}"], what=f"strata eval --init-from the export ({batches} batches)")
    strata_loss = json.loads(p.stdout.strip().splitlines()[-1])["eval_loss"] if p.returncode == 0 else 1.0
    check(strata_loss > 8.5, f"the model is far from uniform: eval loss {strata_loss:.4f} (ln 2000 = 7.60)")
    # Tolerance: the two sum the same float32 per-token losses in float64 and differ only in
    # GEMM and softmax rounding (measured ~2e-9 relative); 1e-6 leaves room for other BLAS
    # builds and is tight enough to see one batch too many or too few (~1e-4 here).
    args = [py, check_export, export, "--tokens", val_a, "--seq-len", "64", "--micro-batch", "4",
            "--rtol", "1e-6", "--expect-loss", repr(strata_loss)]
    p = run(args + ["--batches", str(batches)], what="check_export --expect-loss (strata eval's)")
    print(p.stdout, end="")
    rel = json.loads(p.stdout.strip().splitlines()[-1]).get("rel_diff") if p.returncode == 0 else None
    check(rel is not None and rel <= 1e-6, f"transformers and strata eval agree: relative difference {rel}")
    p = run(args + ["--batches", str(batches - 1)], 1, what="check_export on one batch fewer fails")
    print(p.stdout.strip().splitlines()[-2] if p.stdout.strip() else "", flush=True)

    if failures:
        print(f"{len(failures)} check(s) failed:", *failures, sep="\n  ")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
