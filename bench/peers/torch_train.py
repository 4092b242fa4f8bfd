#!/usr/bin/env python3
"""The peer of `strata bench gpu`'s training figure: the same Llama trained by PyTorch, configured
as well as PyTorch allows without extra packages.

Model: transformers' LlamaForCausalLM with strata's shape (byte vocabulary, untied head, GQA),
weights in f32 (the master copy, as strata keeps it), forward and backward under
torch.autocast(bfloat16) (bf16 GEMMs on the tensor cores, as train.precision = bf16 with
train.matmul_precision = bf16), attention through scaled_dot_product_attention (flash kernels),
torch.optim.AdamW(fused=True), global-norm clipping at 1.0, random tokens. Optionally
torch.compile as well. Each step is timed with CUDA events; the figure is the median after the
warm-up steps. MFU uses the FLOPs per token that strata reports (--flops-per-token), so both
sides count the same work.

Usage (on the GPU host, with torch and transformers):
  python3 bench/peers/torch_train.py --flops-per-token 6042943488 --peak-tflops 809 [--compile]
Prints one JSON line per variant (eager, then compiled when asked).
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--ffn", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=8, help="timed steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--flops-per-token", type=float, default=0.0)
    p.add_argument("--peak-tflops", type=float, default=0.0, help="bf16 GEMM peak for the MFU")
    p.add_argument("--compile", action="store_true", help="also run under torch.compile")
    p.add_argument("--device", default="cuda")
    a = p.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    dev = torch.device(a.device)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, intermediate_size=a.ffn,
                      num_hidden_layers=a.layers, num_attention_heads=a.heads,
                      num_key_value_heads=a.kv_heads, max_position_embeddings=a.seq,
                      tie_word_embeddings=False, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    variants = ["eager"] + (["compiled"] if a.compile else [])
    for variant in variants:
        with dev:
            model = LlamaForCausalLM(cfg)  # f32 master weights, made on the device
        params = sum(t.numel() for t in model.parameters())
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                weight_decay=0.1, fused=dev.type == "cuda")
        fwd = torch.compile(model) if variant == "compiled" else model
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev)
        inp, tgt = tokens[:, :-1], tokens[:, 1:]

        def step():
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                logits = fwd(input_ids=inp).logits
            loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), tgt.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        t0 = time.time()
        losses, ms = [], []
        for i in range(a.warmup + a.steps):
            if dev.type == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                loss = step()
                e.record()
                torch.cuda.synchronize()
                elapsed = s.elapsed_time(e)
            else:
                t = time.perf_counter()
                loss = step()
                elapsed = (time.perf_counter() - t) * 1e3
            losses.append(float(loss.detach()))
            if i >= a.warmup:
                ms.append(elapsed)
        step_ms = statistics.median(ms)
        tps = a.batch * a.seq / (step_ms / 1e3)
        out = {"peer": "torch", "variant": variant, "torch": torch.__version__,
               "attn_implementation": cfg._attn_implementation, "params": params,
               "tokens_per_step": a.batch * a.seq, "step_ms_median": step_ms, "tokens_per_s": tps,
               "loss_first": losses[0], "loss_last": losses[-1], "seconds": time.time() - t0}
        if dev.type == "cuda":
            out["device"] = torch.cuda.get_device_name(dev)
            out["max_memory_allocated"] = torch.cuda.max_memory_allocated(dev)
        if a.flops_per_token > 0:
            out["achieved_tflops"] = tps * a.flops_per_token / 1e12
            if a.peak_tflops > 0:
                out["mfu_vs_bf16_gemm"] = out["achieved_tflops"] / a.peak_tflops
        print(json.dumps(out), flush=True)
        del model, opt, fwd
        if dev.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(dev)
    return 0


if __name__ == "__main__":
    sys.exit(main())
