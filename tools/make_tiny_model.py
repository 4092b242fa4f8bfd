#!/usr/bin/env python3
"""A small Hugging Face Llama directory to fine-tune, with a tokenizer of its own — no download.

It trains a byte-level BPE tokenizer (Hugging Face `tokenizers`) on the given text files, then
builds a randomly initialized LlamaForCausalLM (transformers, float32) whose vocabulary is that
tokenizer's, and saves both with save_pretrained: config.json, model.safetensors, tokenizer.json
and tokenizer_config.json — the layout of any Hugging Face Llama checkpoint, so `strata train
--init-from DIR` and `tools/prepare_data.py --tokenizer DIR` take it as they take a real one.

    python tools/make_tiny_model.py --out tiny-llama docs/*.md README.md
    python tools/make_tiny_model.py --out tiny-llama --vocab 2048 --dim 128 --layers 4 FILES...

The end-of-text token is `<|endoftext|>` (also the model's bos/eos). The output folder is written
under a temporary name and renamed when complete.
"""

import argparse
import glob
import os
import shutil
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder to write (must not exist, or --force)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument("--vocab", type=int, default=2048, help="BPE vocabulary size (default 2048)")
    p.add_argument("--dim", type=int, default=128, help="hidden size (default 128)")
    p.add_argument("--layers", type=int, default=4, help="decoder blocks (default 4)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads (default 2)")
    p.add_argument("--ffn", type=int, default=352, help="MLP width (default 352)")
    p.add_argument("--max-seq-len", type=int, default=512, help="max positions (default 512)")
    p.add_argument("--seed", type=int, default=0, help="initialization seed (default 0)")
    p.add_argument("files", nargs="+", help="text files (or globs) to train the tokenizer on")
    return p.parse_args()


def expand(patterns):
    files = []
    for pat in patterns:
        hits = sorted(glob.glob(pat)) if any(c in pat for c in "*?[") else [pat]
        if not hits:
            sys.exit(f"make_tiny_model: no file matches '{pat}'")
        for f in hits:
            if not os.path.isfile(f):
                sys.exit(f"make_tiny_model: '{f}' is not a readable file")
            files.append(f)
    return files


def main():
    a = parse_args()
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    except ImportError as e:
        sys.exit(f"make_tiny_model: {e}; install tools/requirements.txt (pip install -r tools/requirements.txt)")
    files = expand(a.files)
    if os.path.exists(a.out) and not a.force:
        sys.exit(f"make_tiny_model: '{a.out}' exists; pass --force to replace it")
    if a.vocab < 260:
        sys.exit("make_tiny_model: --vocab must be at least 260 (256 bytes + special tokens)")

    eot = "<|endoftext|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=[eot],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=eot, eos_token=eot,
                                   unk_token=None, model_max_length=a.max_seq_len)
    eot_id = tok.token_to_id(eot)
    vocab = tok.get_vocab_size()

    torch.manual_seed(a.seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=a.dim, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.max_seq_len,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=eot_id,
                      eos_token_id=eot_id, initializer_range=0.02)
    model = LlamaForCausalLM(cfg).to(torch.float32)

    tmp = a.out.rstrip("/") + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    fast.save_pretrained(tmp)
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.replace(tmp, a.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"make_tiny_model: {a.out}: {n:,} parameters ({a.layers} layers, dim {a.dim}), "
          f"vocabulary {vocab} (end of text {eot!r} = {eot_id}), tokenizer trained on {len(files)} file(s)")


if __name__ == "__main__":
    main()
