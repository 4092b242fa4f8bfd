#!/usr/bin/env python3
"""Tokenize text files into llm.c token files that `strata train` reads (data.path, eval.path).

Documents: a plain-text file is one document (its bytes decoded as UTF-8, kept exactly); a
.jsonl / .ndjson file holds one document per line, the string of its "text" field (blank lines
are skipped; any other line without a "text" string is an error naming the file and line).
Empty documents are skipped and counted. Each document is encoded with the model's own
tokenizer, without the special tokens its post-processor would add (no BOS), and followed by
the tokenizer's end-of-text token, so the file reads doc₀ EOT doc₁ EOT … docₙ EOT.

Output: llm.c's layout — a header of 256 little-endian int32 (magic 20240520, version, token
count, then zeros), then the tokens: version 1 = uint16 when every id of the vocabulary fits in
16 bits, else version 2 = uint32. Each file is written to a temporary name beside it, fsynced and
renamed, so a half-written file never passes for a whole one. With --val-out, whole documents go
to the validation file: a fraction of them chosen by --seed, at least one in each file.

It does not download anything (the tokenizer is a tokenizer.json or a local directory), shuffle
documents, pack or pad sequences: strata cuts windows out of the stream itself.

Run:  /work/venv/bin/python tools/prepare_data.py --tokenizer HF_DIR_OR_TOKENIZER_JSON \\
          --out train.bin [--val-out val.bin --val-fraction 0.01] FILES_OR_GLOBS...
See tools/README.md.
"""

import argparse
import glob
import hashlib
import heapq
import json
import os
import sys
import time
from array import array

MAGIC = 20240520
HEADER_INTS = 256
MAX_TOKENS = 2**31 - 1  # the header's count is an int32
JSONL_SUFFIXES = (".jsonl", ".ndjson")
# Special tokens taken as end-of-text when the tokenizer names no eos_token (a bare
# tokenizer.json has no such notion): GPT-2 / Qwen, Llama 3, Llama 2 / Mistral, Gemma.
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
BATCH_DOCS = 512
BATCH_CHARS = 8 << 20

assert array("H").itemsize == 2 and array("I").itemsize == 4


class DataError(Exception):
    """An input or setting the user can fix; printed as `prepare_data: error: ...`, exit 1."""


# ---------------------------------------------------------------------------------------------
# Tokenizer: a tokenizer.json through `tokenizers`, or a local directory through AutoTokenizer.


class Tokenizer:
    def __init__(self, spec, eot_id):
        if os.path.isdir(spec):
            self._load_auto(spec)
        elif os.path.isfile(spec):
            self._load_file(spec)
        else:
            raise DataError(f"--tokenizer {spec}: no such file or directory "
                            "(give a tokenizer.json or a local Hugging Face directory; "
                            "nothing is downloaded)")
        if eot_id is not None:
            if not 0 <= eot_id < self.vocab_bound:
                raise DataError(f"--eot-id {eot_id} is outside the vocabulary "
                                f"(ids 0..{self.vocab_bound - 1})")
            self.eot_id = eot_id
            self.eot_desc = f"--eot-id {eot_id} ({self._token(eot_id)!r})"
        else:
            self._find_eot(spec)

    def _load_file(self, path):
        try:
            from tokenizers import Tokenizer as RawTokenizer
        except ImportError as e:
            raise DataError(f"cannot import tokenizers ({e}); "
                            "pip install -r tools/requirements.txt") from e
        try:
            tok = RawTokenizer.from_file(path)
        except Exception as e:  # tokenizers raises a plain Exception on a bad file
            raise DataError(f"--tokenizer {path}: not a tokenizer.json ({e})") from e
        self.kind = "tokenizers"
        self._raw = tok
        vocab = tok.get_vocab(with_added_tokens=True)
        self.vocab_bound = max(tok.get_vocab_size(with_added_tokens=True), max(vocab.values()) + 1)
        self._eos = None
        self._special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
        self._token = lambda i: tok.id_to_token(i)

    def _load_auto(self, path):
        try:
            import transformers
            from transformers import AutoTokenizer
        except ImportError as e:
            raise DataError(f"cannot import transformers ({e}); "
                            "pip install -r tools/requirements.txt") from e
        transformers.logging.set_verbosity_error()  # "longer than model_max_length": not a model input
        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as e:
            raise DataError(f"--tokenizer {path}: AutoTokenizer cannot load it "
                            f"({type(e).__name__}: {e})") from e
        self.kind = f"transformers {type(tok).__name__}"
        self._auto = tok
        vocab = tok.get_vocab()
        self.vocab_bound = max(len(tok), max(vocab.values()) + 1)
        self._eos = (tok.eos_token, tok.eos_token_id) if tok.eos_token_id is not None else None
        self._special = {t.content: i for i, t in tok.added_tokens_decoder.items() if t.special}
        self._token = lambda i: tok.convert_ids_to_tokens(i)

    def _find_eot(self, spec):
        if self._eos is not None:
            self.eot_id = int(self._eos[1])
            self.eot_desc = f"eos_token {self._eos[0]!r} = {self.eot_id}"
            return
        for name in EOT_NAMES:
            if name in self._special:
                self.eot_id = self._special[name]
                self.eot_desc = f"special token {name!r} = {self.eot_id} (no eos_token is set)"
                return
        specials = ", ".join(f"{k!r} = {v}" for k, v in sorted(self._special.items(), key=lambda kv: kv[1]))
        raise DataError(f"--tokenizer {spec} has no end-of-text token: no eos_token and none of the "
                        f"special tokens {', '.join(EOT_NAMES)}\n"
                        f"hint: give the id that separates documents with --eot-id N"
                        + (f" (its special tokens: {specials})" if specials else ""))

    def encode(self, texts):
        if self.kind == "tokenizers":
            return [e.ids for e in self._raw.encode_batch(texts, add_special_tokens=False)]
        return self._auto(texts, add_special_tokens=False)["input_ids"]


# ---------------------------------------------------------------------------------------------
# Inputs: files from names and globs; documents from plain text and JSONL.


def expand_inputs(patterns):
    files, seen = [], set()
    for p in patterns:
        if glob.has_magic(p):
            matches = sorted(m for m in glob.glob(p, recursive=True) if os.path.isfile(m))
            if not matches:
                raise DataError(f"{p}: the pattern matches no file")
        elif os.path.isdir(p):
            raise DataError(f"{p} is a directory; give files or a glob such as '{p}/*.txt'")
        elif not os.path.isfile(p):
            raise DataError(f"{p}: no such file")
        else:
            matches = [p]
        for m in matches:
            key = os.path.realpath(m)
            if key not in seen:
                seen.add(key)
                files.append(m)
    return files


def is_jsonl(path):
    return path.lower().endswith(JSONL_SUFFIXES)


def decode_utf8(data, where):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not UTF-8 text (byte {e.start}: {e.reason})") from e


def json_type(value):
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def read_documents(path):
    """Yields (text, bytes read since the previous yield) for each document of `path` — text is
    "" for an empty one — and (None, n) for a blank JSONL line. Errors name the file and line."""
    with open(path, "rb") as f:
        if not is_jsonl(path):
            data = f.read()
            yield decode_utf8(data, path), len(data)
            return
        for lineno, line in enumerate(f, 1):
            where = f"{path}:{lineno}"
            if not line.strip():
                yield None, len(line)
                continue
            try:
                obj = json.loads(decode_utf8(line, where).rstrip("\r\n"))
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not a JSON line ({e.msg} at column {e.pos + 1})") from e
            if not isinstance(obj, dict) or "text" not in obj:
                got = (f"an object with keys {sorted(obj)[:8]}" if isinstance(obj, dict)
                       else f"a JSON {json_type(obj)}")
                raise DataError(f'{where}: no "text" field (got {got}); every line of a JSONL '
                                'file must be an object with a "text" string')
            if not isinstance(obj["text"], str):
                raise DataError(f'{where}: "text" is a JSON {json_type(obj["text"])}, not a string')
            yield obj["text"], len(line)


def count_documents(files):
    """First pass, before any time is spent tokenizing: reads and checks every file. Returns the
    non-empty documents of each file, the number of empty ones and the total bytes."""
    counts, empty, total = [], 0, 0
    for path in files:
        n = 0
        for text, size in read_documents(path):
            total += size
            if text is not None:
                n += bool(text)
                empty += not text
        counts.append(n)
    return counts, empty, total


# ---------------------------------------------------------------------------------------------
# Output: an llm.c token file written under a temporary name and renamed when complete.


class TokenFileWriter:
    def __init__(self, path, dtype):
        self.path = path
        self.dtype = dtype
        self.typecode = "H" if dtype == "uint16" else "I"
        self.limit = 1 << (16 if dtype == "uint16" else 32)
        self.count = 0
        self.docs = 0
        self.max_id = -1
        d = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(d):
            raise DataError(f"{path}: the directory {d} does not exist")
        self.tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
        self.f = open(self.tmp, "wb")
        self.f.write(bytes(4 * HEADER_INTS))

    def write(self, ids):
        if not ids:
            return
        top = max(ids)
        if top >= self.limit:
            raise DataError(f"{self.path}: token id {top} does not fit in {self.dtype}")
        self.max_id = max(self.max_id, top)
        self.count += len(ids)
        if self.count > MAX_TOKENS:
            raise DataError(f"{self.path}: more than {MAX_TOKENS} tokens, the most an llm.c header's "
                            "int32 count can say\nhint: split the input into several files")
        a = array(self.typecode, ids)
        if sys.byteorder != "little":
            a.byteswap()
        a.tofile(self.f)

    def commit(self):
        header = array("i", [0] * HEADER_INTS)
        header[0], header[1], header[2] = MAGIC, 1 if self.dtype == "uint16" else 2, self.count
        if sys.byteorder != "little":
            header.byteswap()
        self.f.seek(0)
        header.tofile(self.f)
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        os.replace(self.tmp, self.path)
        dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self.bytes = os.path.getsize(self.path)

    def abort(self):
        try:
            self.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.unlink(self.tmp)


# ---------------------------------------------------------------------------------------------
# Progress: tqdm when it is installed, else a plain bar; nothing when stderr is not a terminal.


def fmt_bytes(n):
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


class Progress:
    def __init__(self, total_bytes, enabled):
        self.total, self.done, self.bar, self.last = max(total_bytes, 1), 0, None, 0.0
        self.enabled = enabled and sys.stderr.isatty()
        if self.enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, desc="tokenizing",
                                file=sys.stderr)
            except ImportError:
                pass

    def update(self, n):
        if not self.enabled:
            return
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.last < 0.2 and self.done < self.total:
            return
        self.last = now
        frac = min(1.0, self.done / self.total)
        width = 30
        sys.stderr.write(f"\rtokenizing [{'#' * int(frac * width):<{width}}] {frac:4.0%} "
                         f"{fmt_bytes(self.done)}/{fmt_bytes(self.total)}")
        sys.stderr.flush()

    def close(self):
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        else:
            sys.stderr.write("\n")


# ---------------------------------------------------------------------------------------------
# The split and the run.


def choose_validation(n_docs, fraction, seed):
    """The indices of the validation documents: the round(fraction · n) (at least 1, at most
    n − 1) whose keyed BLAKE2b hash of (seed, index) is smallest — a pure function of
    (n, fraction, seed), the same on every Python version and machine."""
    if n_docs < 2:
        raise DataError(f"a validation split needs at least 2 documents; the inputs hold {n_docs}")
    n_val = min(n_docs - 1, max(1, round(fraction * n_docs)))
    key = str(seed).encode()

    def rank(i):
        return hashlib.blake2b(i.to_bytes(8, "little"), key=key[:64], digest_size=8).digest()

    return set(heapq.nsmallest(n_val, range(n_docs), key=rank))


def fmt_docs(n):
    return f"{n} document{'s' if n != 1 else ''}"


def run(args):
    if args.val_fraction is not None and not args.val_out:
        raise DataError("--val-fraction needs --val-out (the file the validation documents go to)")
    fraction = 0.01 if args.val_fraction is None else args.val_fraction
    if args.val_out and not 0.0 < fraction < 1.0:
        raise DataError(f"--val-fraction {fraction}: allowed: 0 < fraction < 1")
    if args.val_out and os.path.abspath(args.val_out) == os.path.abspath(args.out):
        raise DataError("--out and --val-out name the same file")

    files = expand_inputs(args.inputs)
    tok = Tokenizer(args.tokenizer, args.eot_id)
    counts, empty, total_bytes = count_documents(files)
    n_docs = sum(counts)
    if n_docs == 0:
        raise DataError(f"the {len(files)} input file(s) hold no non-empty document")
    val = choose_validation(n_docs, fraction, args.seed) if args.val_out else set()

    dtype = args.dtype
    if dtype == "auto":
        dtype = "uint16" if tok.vocab_bound <= 1 << 16 else "uint32"
    elif dtype == "uint16" and tok.vocab_bound > 1 << 16:
        raise DataError(f"--dtype uint16: the vocabulary has ids up to {tok.vocab_bound - 1}, "
                        "more than 16 bits hold; use --dtype uint32 (or auto)")

    train = TokenFileWriter(args.out, dtype)
    writers = [train]
    try:
        valw = TokenFileWriter(args.val_out, dtype) if args.val_out else None
        if valw:
            writers.append(valw)
        progress = Progress(total_bytes, not args.no_progress)
        batch, chars, pending = [], 0, 0
        index = 0

        def flush():
            nonlocal batch, chars, pending
            if batch:
                out = {id(train): [], id(valw): []}
                for (text, w), ids in zip(batch, tok.encode([t for t, _ in batch])):
                    out[id(w)].extend(ids)
                    out[id(w)].append(tok.eot_id)
                    w.docs += 1
                for w in writers:
                    w.write(out[id(w)])
            progress.update(pending)
            batch, chars, pending = [], 0, 0

        for path, expected in zip(files, counts):
            found = 0
            for text, size in read_documents(path):
                pending += size
                if text:
                    batch.append((text, valw if index in val else train))
                    chars += len(text)
                    index += 1
                    found += 1
                if len(batch) >= BATCH_DOCS or chars >= BATCH_CHARS:
                    flush()
            if found != expected:
                raise DataError(f"{path} changed while it was read: {expected} documents at first, "
                                f"{found} now")
        flush()
        progress.close()
        for w in writers:
            w.commit()
    except BaseException:
        for w in writers:
            w.abort()
        raise

    version = 1 if dtype == "uint16" else 2
    print(f"prepare_data: tokenizer {args.tokenizer} ({tok.kind}, vocabulary {tok.vocab_bound}); "
          f"documents end with {tok.eot_desc}")
    print(f"prepare_data: {len(files)} file{'s' if len(files) != 1 else ''}, {fmt_docs(n_docs)}"
          + (f" ({empty} empty skipped)" if empty else "") + f", {total_bytes} bytes of text")
    width = max(len(w.path) for w in writers)
    for w in writers:
        print(f"  {w.path:<{width}}  {fmt_docs(w.docs):>15}  {w.count:>12} tokens  "
              f"{dtype} (version {version})  {w.bytes} bytes")
    sets = f"--set data.path={args.out}" + (f" --set eval.path={args.val_out}" if valw else "")
    print(f"strata: {sets} with model.vocab_size >= {tok.vocab_bound} (the largest id written is "
          f"{max(w.max_id for w in writers)})")


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Tokenize text files (plain text: one document per file; .jsonl/.ndjson: one "
                    "per line, its \"text\" field) into llm.c token files for strata.")
    ap.add_argument("inputs", nargs="+", metavar="FILES_OR_GLOBS",
                    help="files or quoted globs ('data/**/*.jsonl'), read in the order given, "
                         "each glob's matches sorted")
    ap.add_argument("--tokenizer", required=True, metavar="HF_DIR_OR_FILE",
                    help="a tokenizer.json, or a local Hugging Face directory (AutoTokenizer)")
    ap.add_argument("--out", required=True, help="token file of the training documents")
    ap.add_argument("--val-out", help="token file of the validation documents")
    ap.add_argument("--val-fraction", type=float,
                    help="fraction of the documents that go to --val-out (default 0.01; at least "
                         "one document in each file)")
    ap.add_argument("--seed", type=int, default=0, help="chooses the validation documents (default 0)")
    ap.add_argument("--eot-id", type=int,
                    help="token id that ends each document (default: the tokenizer's eos token)")
    ap.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto",
                    help="token width: auto = uint16 (version 1) when the vocabulary fits in 16 "
                         "bits, else uint32 (version 2)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar on a terminal")
    args = ap.parse_args(argv)
    try:
        run(args)
    except DataError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"prepare_data: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
