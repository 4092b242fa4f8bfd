#!/usr/bin/env python3
"""Golden reference fixtures for the strata engine tests.

An independent PyTorch (float32, CPU) implementation of a Llama decoder with Hugging Face
LlamaForCausalLM semantics and tensor names. For each fixture it draws weights and a batch from
a fixed seed, and stores in one safetensors file: the weights, the batch, the logits and loss of
the initial weights, the gradient of every weight, and the losses and weights of 5 AdamW steps on
that batch. The C++ tests read these files; they never run Python.

Run from anywhere:  /usr/bin/python3 tools/make_golden.py [--out-dir DIR]
(the default DIR is tests/engine/data of this repository). See tools/README.md.

The script checks itself before writing: the model against a second, einsum-based formulation
(per-head loop, pairwise rotary), the gradients against central finite differences in float64,
the float32 gradients against the float64 ones, each AdamW update against the update rule written
out by hand, that the fixture bytes are reproducible in-process, and that each written file parses
back (header layout, offsets, alignment) to the exact tensors it was written from.
"""

import argparse
import hashlib
import json
import math
import os
import struct
import sys
from collections import OrderedDict

import numpy as np
import torch
import torch.nn.functional as F

GENERATOR = "tools/make_golden.py"
ADAM = dict(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, steps=5)
INIT_STD = 0.1  # linear and embedding weights; norm weights are 1 + normal(0, INIT_STD)

FIXTURES = [
    dict(name="golden_gqa", seed=20240601, vocab=256, dim=64, n_layers=2, n_heads=4,
         n_kv_heads=2, ffn=96, theta=10000.0, eps=1e-5, tie=False, batch=2, seq=16),
    dict(name="golden_tied", seed=20240602, vocab=256, dim=32, n_layers=1, n_heads=2,
         n_kv_heads=2, ffn=64, theta=500000.0, eps=1e-6, tie=True, batch=3, seq=8),
]


class CheckFailed(RuntimeError):
    pass


def check(cond, what):
    if not cond:
        raise CheckFailed(what)


# ---------------------------------------------------------------------------------------------
# Parameters and batch

def param_shapes(cfg):
    """(HF name, shape) of every weight, in the order they are drawn and stored."""
    C, V, F_, L = cfg["dim"], cfg["vocab"], cfg["ffn"], cfg["n_layers"]
    D = C // cfg["n_heads"]
    H, KVH = cfg["n_heads"], cfg["n_kv_heads"]
    out = [("model.embed_tokens.weight", (V, C))]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (C,)),
            (p + "self_attn.q_proj.weight", (H * D, C)),
            (p + "self_attn.k_proj.weight", (KVH * D, C)),
            (p + "self_attn.v_proj.weight", (KVH * D, C)),
            (p + "self_attn.o_proj.weight", (C, H * D)),
            (p + "post_attention_layernorm.weight", (C,)),
            (p + "mlp.gate_proj.weight", (F_, C)),
            (p + "mlp.up_proj.weight", (F_, C)),
            (p + "mlp.down_proj.weight", (C, F_)),
        ]
    out.append(("model.norm.weight", (C,)))
    if not cfg["tie"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def draw(cfg):
    """Weights (OrderedDict name -> float32 tensor), inputs and targets (int64), from the seed."""
    g = torch.Generator().manual_seed(cfg["seed"])
    params = OrderedDict()
    for name, shape in param_shapes(cfg):
        z = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith("layernorm.weight") or name == "model.norm.weight":
            params[name] = 1.0 + INIT_STD * z
        else:
            params[name] = INIT_STD * z
    B, T = cfg["batch"], cfg["seq"]
    stream = torch.randint(0, cfg["vocab"], (B, T + 1), generator=g, dtype=torch.int64)
    return params, stream[:, :T].contiguous(), stream[:, 1:].contiguous()


# ---------------------------------------------------------------------------------------------
# The model (main formulation: batched matmuls, repeat_interleave for GQA, masked softmax)

def rope_tables(T, D, theta, dtype):
    """cos, sin of shape (T, D): angles t * theta^(-2i/D), i < D/2, concatenated with themselves.
    Computed in float64 and rounded once to dtype."""
    i = torch.arange(D // 2, dtype=torch.float64)
    inv_freq = theta ** (-2.0 * i / D)
    t = torch.arange(T, dtype=torch.float64)
    ang = torch.outer(t, inv_freq)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rms_norm(x, w, eps):
    rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x * rstd) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def attention(x, P, pre, cfg, cos, sin):
    B, T, C = x.shape
    H, KVH = cfg["n_heads"], cfg["n_kv_heads"]
    D = C // H
    q = (x @ P[pre + "self_attn.q_proj.weight"].t()).view(B, T, H, D).transpose(1, 2)
    k = (x @ P[pre + "self_attn.k_proj.weight"].t()).view(B, T, KVH, D).transpose(1, 2)
    v = (x @ P[pre + "self_attn.v_proj.weight"].t()).view(B, T, KVH, D).transpose(1, 2)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k = k.repeat_interleave(H // KVH, dim=1)  # query head h reads kv head h // (H / KVH)
    v = v.repeat_interleave(H // KVH, dim=1)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))
    mask = torch.ones(T, T, dtype=torch.bool).triu(diagonal=1)
    s = s.masked_fill(mask, float("-inf"))
    a = torch.softmax(s, dim=-1)
    y = (a @ v).transpose(1, 2).reshape(B, T, H * D)
    return y @ P[pre + "self_attn.o_proj.weight"].t()


def forward(P, inputs, cfg):
    """Logits (B, T, V)."""
    dtype = P["model.embed_tokens.weight"].dtype
    T = inputs.shape[1]
    D = cfg["dim"] // cfg["n_heads"]
    cos, sin = rope_tables(T, D, cfg["theta"], dtype)
    x = P["model.embed_tokens.weight"][inputs]
    for i in range(cfg["n_layers"]):
        pre = f"model.layers.{i}."
        h = x + attention(rms_norm(x, P[pre + "input_layernorm.weight"], cfg["eps"]), P, pre,
                          cfg, cos, sin)
        n = rms_norm(h, P[pre + "post_attention_layernorm.weight"], cfg["eps"])
        gate = n @ P[pre + "mlp.gate_proj.weight"].t()
        up = n @ P[pre + "mlp.up_proj.weight"].t()
        x = h + (F.silu(gate) * up) @ P[pre + "mlp.down_proj.weight"].t()
    x = rms_norm(x, P["model.norm.weight"], cfg["eps"])
    head = P["model.embed_tokens.weight"] if cfg["tie"] else P["lm_head.weight"]
    return x @ head.t()


def loss_fn(logits, targets):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="mean")


# ---------------------------------------------------------------------------------------------
# Second formulation, for the self-check: per-head einsum loop, pairwise rotary, explicit
# causal mask by comparison, silu as x * sigmoid(x), log-sum-exp cross-entropy.

def ref_rotary(x, theta):
    """x (B, T, D): rotate each pair (x[i], x[i + D/2]) by the angle t * theta^(-2i/D)."""
    B, T, D = x.shape
    half = D // 2
    ang = torch.tensor([[t * theta ** (-2.0 * i / D) for i in range(half)] for t in range(T)],
                       dtype=torch.float64)
    c, s = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], dim=-1)


def ref_forward(P, inputs, cfg):
    C, H, KVH = cfg["dim"], cfg["n_heads"], cfg["n_kv_heads"]
    D = C // H
    group = H // KVH
    eps = cfg["eps"]
    T = inputs.shape[1]
    pos = torch.arange(T)
    causal = pos[:, None] >= pos[None, :]  # (t, s): query t may read key s

    def norm(x, w):
        return x / torch.sqrt(torch.einsum("btc,btc->bt", x, x)[..., None] / C + eps) * w

    def lin(x, w):
        return torch.einsum("btc,oc->bto", x, w)

    x = F.embedding(inputs, P["model.embed_tokens.weight"])
    for i in range(cfg["n_layers"]):
        pre = f"model.layers.{i}."
        n = norm(x, P[pre + "input_layernorm.weight"])
        q = lin(n, P[pre + "self_attn.q_proj.weight"])
        k = lin(n, P[pre + "self_attn.k_proj.weight"])
        v = lin(n, P[pre + "self_attn.v_proj.weight"])
        heads = []
        for h in range(H):
            kv = h // group
            qh = ref_rotary(q[..., h * D:(h + 1) * D], cfg["theta"])
            kh = ref_rotary(k[..., kv * D:(kv + 1) * D], cfg["theta"])
            vh = v[..., kv * D:(kv + 1) * D]
            s = torch.einsum("btd,bsd->bts", qh, kh) / math.sqrt(D)
            s = torch.where(causal, s, torch.full_like(s, -1e30))
            s = s - s.max(dim=-1, keepdim=True).values
            e = s.exp()
            a = e / e.sum(dim=-1, keepdim=True)
            heads.append(torch.einsum("bts,bsd->btd", a, vh))
        x = x + lin(torch.cat(heads, dim=-1), P[pre + "self_attn.o_proj.weight"])
        n = norm(x, P[pre + "post_attention_layernorm.weight"])
        g = lin(n, P[pre + "mlp.gate_proj.weight"])
        u = lin(n, P[pre + "mlp.up_proj.weight"])
        x = x + lin(g * torch.sigmoid(g) * u, P[pre + "mlp.down_proj.weight"])
    x = norm(x, P["model.norm.weight"])
    head = P["model.embed_tokens.weight"] if cfg["tie"] else P["lm_head.weight"]
    return lin(x, head)


def ref_loss(logits, targets):
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, targets[..., None]).squeeze(-1)
    return (lse - picked).mean()


# ---------------------------------------------------------------------------------------------
# Computing a fixture

def leaf_params(params, dtype):
    return OrderedDict((k, v.detach().clone().to(dtype).requires_grad_(True))
                       for k, v in params.items())


def loss_and_grads(P, inputs, targets, cfg, fwd=forward, lossf=loss_fn):
    for p in P.values():
        p.grad = None
    logits = fwd(P, inputs, cfg)
    loss = lossf(logits, targets)
    loss.backward()
    return logits.detach(), loss.detach(), OrderedDict((k, p.grad.detach().clone())
                                                       for k, p in P.items())


def compute(cfg):
    """Everything stored in the fixture, as an OrderedDict name -> tensor, in file order."""
    params, inputs, targets = draw(cfg)
    P = leaf_params(params, torch.float32)
    logits, loss, grads = loss_and_grads(P, inputs, targets, cfg)

    opt = torch.optim.AdamW(list(P.values()), lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]),
                            eps=ADAM["eps"], weight_decay=ADAM["weight_decay"])
    adam_losses = []
    for step in range(ADAM["steps"]):
        opt.zero_grad(set_to_none=True)
        l = loss_fn(forward(P, inputs, cfg), targets)
        l.backward()
        adam_losses.append(l.detach().clone())
        opt.step()

    out = OrderedDict()
    for k, v in params.items():
        out[k] = v
    out["inputs"] = inputs.to(torch.int32)
    out["targets"] = targets.to(torch.int32)
    out["logits"] = logits
    out["loss"] = loss.reshape(1)
    for k, v in grads.items():
        out["grad." + k] = v
    out["adam_losses"] = torch.stack(adam_losses)
    for k, p in P.items():
        out["final." + k] = p.detach().clone()
    return out


def metadata(cfg):
    return OrderedDict([
        ("dim", str(cfg["dim"])),
        ("n_layers", str(cfg["n_layers"])),
        ("n_heads", str(cfg["n_heads"])),
        ("n_kv_heads", str(cfg["n_kv_heads"])),
        ("ffn_dim", str(cfg["ffn"])),
        ("vocab_size", str(cfg["vocab"])),
        ("rope_theta", repr(float(cfg["theta"]))),
        ("norm_eps", repr(float(cfg["eps"]))),
        ("tie_embeddings", "true" if cfg["tie"] else "false"),
        ("batch", str(cfg["batch"])),
        ("seq_len", str(cfg["seq"])),
        ("lr", repr(ADAM["lr"])),
        ("beta1", repr(ADAM["beta1"])),
        ("beta2", repr(ADAM["beta2"])),
        ("eps", repr(ADAM["eps"])),
        ("weight_decay", repr(ADAM["weight_decay"])),
        ("steps", str(ADAM["steps"])),
        ("seed", str(cfg["seed"])),
        ("init_std", repr(INIT_STD)),
        ("torch_version", torch.__version__),
        ("generator", GENERATOR),
    ])


# ---------------------------------------------------------------------------------------------
# safetensors, written and read by hand

DTYPES = {torch.float32: ("F32", "<f4", 4), torch.int32: ("I32", "<i4", 4)}
NP_OF = {"F32": "<f4", "I32": "<i4"}
SIZE_OF = {"F32": 4, "I32": 4}


def safetensors_bytes(tensors, meta):
    header = OrderedDict()
    header["__metadata__"] = meta
    blobs = []
    offset = 0
    for name, t in tensors.items():
        code, npdt, _ = DTYPES[t.dtype]
        blob = t.detach().contiguous().numpy().astype(npdt, copy=False).tobytes()
        header[name] = OrderedDict([("dtype", code), ("shape", list(t.shape)),
                                    ("data_offsets", [offset, offset + len(blob)])])
        blobs.append(blob)
        offset += len(blob)
    hjson = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    hjson += b" " * ((-len(hjson)) % 8)  # data starts at 8 + len, a multiple of 8
    return struct.pack("<Q", len(hjson)) + hjson + b"".join(blobs)


def read_safetensors(path):
    """Parses and validates a file; returns (OrderedDict name -> numpy array, metadata)."""
    with open(path, "rb") as f:
        raw = f.read()
    check(len(raw) >= 8, f"{path}: shorter than 8 bytes")
    (n,) = struct.unpack("<Q", raw[:8])
    check(8 + n <= len(raw), f"{path}: header length {n} past the end")
    check((8 + n) % 8 == 0, f"{path}: data section not 8-byte aligned")
    header = json.loads(raw[8:8 + n].decode("ascii"), object_pairs_hook=OrderedDict)
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    check(all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()),
          f"{path}: metadata values must be strings")
    out = OrderedDict()
    expect = 0
    for name, e in header.items():
        check(set(e) == {"dtype", "shape", "data_offsets"}, f"{path}: {name}: keys {set(e)}")
        check(e["dtype"] in NP_OF, f"{path}: {name}: dtype {e['dtype']}")
        b, end = e["data_offsets"]
        numel = int(np.prod(e["shape"])) if e["shape"] else 1
        check(b == expect, f"{path}: {name}: begins at {b}, expected {expect} (header order)")
        check(end - b == numel * SIZE_OF[e["dtype"]], f"{path}: {name}: size mismatch")
        expect = end
        out[name] = np.frombuffer(data[b:end], dtype=NP_OF[e["dtype"]]).reshape(e["shape"])
    check(expect == len(data), f"{path}: {len(data) - expect} trailing bytes after the data")
    return out, meta


# ---------------------------------------------------------------------------------------------
# Self-checks

def max_rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def self_check(cfg, stored):
    report = []
    params, inputs, targets = draw(cfg)
    inputs64 = inputs.long()

    # 1. Main formulation vs the einsum / per-head / pairwise-rotary one, float32 and float64.
    for dtype, tol in ((torch.float32, 2e-5), (torch.float64, 1e-12)):
        A = leaf_params(params, dtype)
        la, lossa, ga = loss_and_grads(A, inputs64, targets, cfg)
        R = leaf_params(params, dtype)
        lr_, lossr, gr = loss_and_grads(R, inputs64, targets, cfg, fwd=ref_forward,
                                        lossf=ref_loss)
        e_logits = max_rel(la, lr_)
        e_loss = abs(lossa.item() - lossr.item()) / abs(lossr.item())
        e_grad = max(max_rel(ga[k], gr[k]) for k in ga)
        check(e_logits < tol and e_loss < tol and e_grad < tol * 10,
              f"{cfg['name']}: main vs einsum formulation ({dtype}): logits {e_logits:.2e}, "
              f"loss {e_loss:.2e}, grads {e_grad:.2e}")
        report.append(f"main vs einsum formulation, {str(dtype)[6:]}: max rel err logits "
                      f"{e_logits:.1e}, loss {e_loss:.1e}, grads {e_grad:.1e}")
        if dtype == torch.float64:
            g64 = ga

    # rotate_half(cos/sin tables) on its own vs the pairwise rotation, on random data.
    D = cfg["dim"] // cfg["n_heads"]
    xr = torch.randn(2, cfg["seq"], D, generator=torch.Generator().manual_seed(7),
                     dtype=torch.float64)
    cos, sin = rope_tables(cfg["seq"], D, cfg["theta"], torch.float64)
    e_rope = (xr * cos + rotate_half(xr) * sin - ref_rotary(xr, cfg["theta"])).abs().max().item()
    check(e_rope < 1e-12, f"{cfg['name']}: rotary formulations differ by {e_rope:.2e}")
    report.append(f"rotate_half rotary vs pairwise rotation (float64): max abs err {e_rope:.1e}")

    # 2. Stored float32 values vs an independent recomputation / the float64 model.
    check(torch.equal(stored["loss"][0], stored["adam_losses"][0]),
          f"{cfg['name']}: adam_losses[0] != loss")
    e_g32 = max(max_rel(stored["grad." + k], g64[k]) for k in g64)
    check(e_g32 < 1e-4, f"{cfg['name']}: float32 grads vs float64 grads: {e_g32:.2e}")
    report.append(f"stored float32 grads vs float64 grads: max rel err (per tensor) {e_g32:.1e}")

    # 3. Central finite differences in float64 on a few entries of several tensors.
    names = [n for n in ("model.layers.0.self_attn.k_proj.weight",
                         "model.layers.0.self_attn.q_proj.weight",
                         "model.layers.0.input_layernorm.weight",
                         f"model.layers.{cfg['n_layers'] - 1}.mlp.down_proj.weight",
                         "model.norm.weight",
                         "model.embed_tokens.weight",
                         "lm_head.weight") if n in params]
    P64 = OrderedDict((k, v.detach().clone().double()) for k, v in params.items())
    gsel = torch.Generator().manual_seed(11)
    h = 1e-5
    worst = 0.0
    n_checked = 0
    with torch.no_grad():
        for name in names:
            w = P64[name].view(-1)
            g = g64[name].reshape(-1)
            idx = [int(g.abs().argmax())]
            if name == "model.embed_tokens.weight":
                # An entry of a row that appears in the inputs (embedding path and, when tied,
                # the head) and of a row that does not (head only, or exactly zero when untied).
                used = sorted(set(inputs.view(-1).tolist()))
                unused = [r for r in range(cfg["vocab"]) if r not in used]
                idx += [used[0] * cfg["dim"] + 3, unused[0] * cfg["dim"] + 5]
            idx += torch.randint(0, w.numel(), (2,), generator=gsel).tolist()
            for j in idx:
                old = w[j].item()
                w[j] = old + h
                lp = loss_fn(forward(P64, inputs64, cfg), targets).item()
                w[j] = old - h
                lm = loss_fn(forward(P64, inputs64, cfg), targets).item()
                w[j] = old
                fd = (lp - lm) / (2 * h)
                an = g[j].item()
                err = abs(fd - an) / max(abs(an), 1e-6)
                check(abs(fd - an) <= 1e-9 + 1e-6 * abs(an),
                      f"{cfg['name']}: finite difference {name}[{j}]: fd {fd:.10e} vs "
                      f"autograd {an:.10e}")
                worst = max(worst, err)
                n_checked += 1
    report.append(f"finite differences (float64, h={h}): {n_checked} entries of {len(names)} "
                  f"tensors, worst rel err {worst:.1e}")

    # 4. AdamW: torch's step vs the decoupled-weight-decay update rule written out in float64.
    P = leaf_params(params, torch.float32)
    opt = torch.optim.AdamW(list(P.values()), lr=ADAM["lr"], betas=(ADAM["beta1"], ADAM["beta2"]),
                            eps=ADAM["eps"], weight_decay=ADAM["weight_decay"])
    m = {k: torch.zeros_like(p, dtype=torch.float64) for k, p in P.items()}
    v = {k: torch.zeros_like(p, dtype=torch.float64) for k, p in P.items()}
    b1, b2, lr, eps, wd = (ADAM[k] for k in ("beta1", "beta2", "lr", "eps", "weight_decay"))
    worst = 0.0
    losses = []
    for t in range(1, ADAM["steps"] + 1):
        opt.zero_grad(set_to_none=True)
        l = loss_fn(forward(P, inputs64, cfg), targets)
        l.backward()
        losses.append(l.item())
        expect = {}
        for k, p in P.items():
            g = p.grad.double()
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            mhat = m[k] / (1 - b1 ** t)
            vhat = v[k] / (1 - b2 ** t)
            expect[k] = p.detach().double() * (1 - lr * wd) - lr * mhat / (vhat.sqrt() + eps)
        opt.step()
        worst = max(worst, max((P[k].detach().double() - expect[k]).abs().max().item()
                               for k in P))
    check(worst < 1e-6, f"{cfg['name']}: AdamW update differs from the rule by {worst:.2e}")
    check(losses == stored["adam_losses"].tolist(), f"{cfg['name']}: adam losses not reproduced")
    check(all(torch.equal(P[k].detach(), stored["final." + k]) for k in P),
          f"{cfg['name']}: final weights not reproduced")
    check(all(b < a for a, b in zip(losses, losses[1:])),
          f"{cfg['name']}: loss does not decrease over the AdamW steps: {losses}")
    report.append(f"AdamW step vs the update rule (float64): max abs err {worst:.1e}; "
                  f"losses decrease")

    # 5. How far float32 rounding can move the stored results: the same 5 AdamW steps in
    # float64. Adam's step is about lr * sign(g) where |g| is tiny, so a few entries of the final
    # weights are sensitive to the order of float32 sums; README.md gives the numbers.
    P64 = leaf_params(params, torch.float64)
    opt = torch.optim.AdamW(list(P64.values()), lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    losses64 = []
    for t in range(ADAM["steps"]):
        opt.zero_grad(set_to_none=True)
        l = loss_fn(forward(P64, inputs64, cfg), targets)
        l.backward()
        losses64.append(l.item())
        opt.step()
    e_l = max(abs(a - b) for a, b in zip(losses, losses64))
    diffs = torch.cat([(stored["final." + k].double() - P64[k].detach()).abs().view(-1)
                       for k in P64])
    e_w = diffs.max().item()
    n_5 = int((diffs > 1e-5).sum())
    check(e_l < 1e-5 and e_w < 5e-3, f"{cfg['name']}: float32 vs float64 training: losses "
          f"{e_l:.2e}, final weights {e_w:.2e}")
    report.append(f"float32 vs float64 AdamW run: losses max abs diff {e_l:.1e}; final weights "
                  f"max abs diff {e_w:.1e}, {n_5} of {diffs.numel()} entries over 1e-5")

    # 6. Sanity of the fixture as a test: logits not uniform, gradients not tiny.
    spread = stored["logits"].std().item()
    gmin = min(stored["grad." + k].abs().max().item() for k in params)
    check(spread > 0.1, f"{cfg['name']}: logits nearly uniform (std {spread})")
    check(gmin > 1e-4, f"{cfg['name']}: a gradient is nearly zero (max |g| {gmin})")
    report.append(f"logits std {spread:.3f}; smallest per-tensor max |grad| {gmin:.2e}")
    return report


# ---------------------------------------------------------------------------------------------

def main():
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(repo, "tests", "engine", "data"),
                    help="where the .safetensors files go (default: tests/engine/data)")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)

    os.makedirs(args.out_dir, exist_ok=True)
    failed = False
    for cfg in FIXTURES:
        print(f"== {cfg['name']}: V={cfg['vocab']} C={cfg['dim']} L={cfg['n_layers']} "
              f"H={cfg['n_heads']} KVH={cfg['n_kv_heads']} F={cfg['ffn']} theta={cfg['theta']} "
              f"eps={cfg['eps']} tied={cfg['tie']} B={cfg['batch']} T={cfg['seq']}")
        stored = compute(cfg)
        meta = metadata(cfg)
        blob = safetensors_bytes(stored, meta)
        try:
            again = safetensors_bytes(compute(cfg), meta)
            check(again == blob, f"{cfg['name']}: a second in-process run gave different bytes")
            report = self_check(cfg, stored)
            report.append("second in-process computation: identical bytes")
        except CheckFailed as e:
            print(f"  SELF-CHECK FAILED: {e}")
            failed = True
            continue

        path = os.path.join(args.out_dir, cfg["name"] + ".safetensors")
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

        try:
            back, meta_back = read_safetensors(path)
            check(list(back) == list(stored), f"{path}: tensor names/order differ")
            check(dict(meta_back) == dict(meta), f"{path}: metadata differs")
            for k, t in stored.items():
                check(tuple(back[k].shape) == tuple(t.shape), f"{path}: {k}: shape")
                check(np.array_equal(back[k], t.numpy()), f"{path}: {k}: values")
            report.append(f"re-read {os.path.basename(path)}: {len(back)} tensors, header, "
                          f"offsets, alignment and values match")
        except CheckFailed as e:
            print(f"  SELF-CHECK FAILED: {e}")
            failed = True
            continue

        for line in report:
            print("  ok:", line)
        print(f"  wrote {path}: {len(blob)} bytes, {len(stored)} tensors, "
              f"sha256 {hashlib.sha256(blob).hexdigest()[:16]}")
        print(f"  loss {stored['loss'].item():.7f}; adam_losses "
              + " ".join(f"{x:.7f}" for x in stored["adam_losses"].tolist()))
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
