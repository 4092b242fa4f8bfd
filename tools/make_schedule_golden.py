#!/usr/bin/env python3
"""tools/make_schedule_golden.py — PyTorch's values for strata's LR schedules and clipping.

Writes two small JSON fixtures that tests/optimizer/test_lr_schedule.cpp compares against:

  tests/optimizer/data/schedule_golden.json  the learning rate of every step of several
      (shape, lr, warmup, total, min_ratio) cases, from torch.optim.lr_scheduler driving a real
      optimizer: SequentialLR of LinearLR (warmup) and CosineAnnealingLR (eta_min = min_ratio·lr)
      or ConstantLR.
  tests/optimizer/data/clip_golden.json  gradient sets, torch.nn.utils.clip_grad_norm_'s total
      norm and clipped gradients (float32, as training runs it), and the same in float64.

strata's definition (optimizer/schedule.h), with 0-based step s and W warmup steps:
  s < W:  lr·(s+1)/W                      == LinearLR(start_factor=1/W, end_factor=1,
                                                      total_iters=W-1), W >= 2 (W = 1: lr)
  s >= W: floor + (lr-floor)·(1+cos(π·(s-W)/(total-1-W)))/2, floor = min_ratio·lr
                                          == CosineAnnealingLR(T_max=total-1-W, eta_min=floor)
          (the floor is reached at the last step, s = total-1); constant: lr.
The script checks torch's values against that closed form (to 1e-12 relative) so that a quirk of
a torch scheduler cannot slip into the fixture unnoticed, and it is deterministic (fixed seeds,
values written with 9 significant digits, enough to round-trip a float32).

Usage: /work/venv/bin/python tools/make_schedule_golden.py [--out-dir DIR]
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from torch.optim import lr_scheduler as sched


def f32(x):
    """The float32 nearest x, as a Python float (strata holds lr and min_ratio in float)."""
    return float(np.float32(x))


def g9(x):
    """A float32 value written with 9 significant digits: parses back to the same float32."""
    return float("%.9g" % float(np.float32(x)))


# (shape, lr, warmup, total, min_ratio): the defaults of engine/config.h first, then the edges.
SCHEDULE_CASES = [
    ("cosine", 3e-3, 20, 300, 0.1),   # the config defaults
    ("cosine", 1e-3, 0, 10, 0.1),     # no warmup
    ("cosine", 1e-3, 10, 10, 0.1),    # warmup == total: never reaches the cosine
    ("cosine", 1e-3, 0, 1, 0.1),      # one step
    ("cosine", 1e-3, 1, 1, 0.1),      # one step, one warmup step
    ("cosine", 2e-4, 4, 5, 0.1),      # warmup == total - 1: one cosine step, at lr
    ("cosine", 5e-3, 1, 8, 0.25),     # one warmup step
    ("cosine", 5e-3, 3, 12, 0.0),     # decays to zero
    ("cosine", 5e-3, 2, 9, 1.0),      # min_ratio 1: flat after warmup
    ("cosine", 1e-2, 8, 5, 0.1),      # warmup longer than the run
    ("cosine", 6e-4, 7, 57, 0.05),
    ("constant", 1e-3, 5, 12, 0.1),
    ("constant", 3e-3, 0, 4, 0.1),
]


def torch_lrs(shape, lr, warmup, total, min_ratio):
    """lr of each step 0 … total-1 as torch's schedulers set it before optimizer.step()."""
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=lr)
    parts, milestones = [], []
    if warmup >= 2:
        parts.append(sched.LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0,
                                    total_iters=warmup - 1))
        milestones.append(warmup)
    elif warmup == 1:  # lr·1/1: the peak from the first step
        parts.append(sched.ConstantLR(opt, factor=1.0, total_iters=0))
        milestones.append(1)
    if shape == "cosine":
        # T_max < 1 only when the cosine gets a single step (or none), where it gives lr anyway;
        # torch's closed form would divide by T_max = 0.
        parts.append(sched.CosineAnnealingLR(opt, T_max=max(1, total - 1 - warmup),
                                             eta_min=min_ratio * lr))
    else:
        parts.append(sched.ConstantLR(opt, factor=1.0, total_iters=0))
    s = parts[0] if len(parts) == 1 else sched.SequentialLR(opt, parts, milestones=milestones)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


def closed_form(shape, lr, warmup, total, min_ratio, step):
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    if shape == "constant" or total - 1 - warmup <= 0:
        return lr
    floor = lr * min_ratio
    progress = (step - warmup) / (total - 1 - warmup)
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def schedule_fixture():
    cases = []
    for shape, lr, warmup, total, min_ratio in SCHEDULE_CASES:
        lr, min_ratio = f32(lr), f32(min_ratio)
        lrs = torch_lrs(shape, lr, warmup, total, min_ratio)
        for step, got in enumerate(lrs):
            want = closed_form(shape, lr, warmup, total, min_ratio, step)
            if abs(got - want) > 1e-12 * abs(want):
                sys.exit(f"torch's schedule differs from the closed form: {shape} lr={lr} "
                         f"warmup={warmup} total={total} min_ratio={min_ratio} step {step}: "
                         f"{got!r} vs {want!r}")
        cases.append({"shape": shape, "lr": lr, "warmup_steps": warmup, "total_steps": total,
                      "min_ratio": min_ratio, "lrs": lrs})
    return {"generator": "tools/make_schedule_golden.py", "torch_version": torch.__version__,
            "definition": "lrs[s] = optimizer lr at step s (0-based) under SequentialLR(LinearLR("
                          "1/W, 1, W-1), CosineAnnealingLR(total-1-W, min_ratio*lr) or ConstantLR)",
            "cases": cases}


# name: (tensor sizes, scale of the N(0,1) values, max_norm)
CLIP_SETS = [
    ("below_max_norm", [7, 33, 1, 130], 1e-2, 1.0),   # norm ~0.12: clipping does not apply
    ("above_max_norm", [7, 33, 1, 130], 1.0, 1.0),    # norm ~13: scaled by ~0.08
    ("just_above", [300, 17], None, 0.5),             # norm = 1.001 · max_norm
    ("huge_norm", [64, 5, 257], 1e12, 0.25),          # norm ~1.7e13: scaled by ~1.5e-14
    ("zero_gradient", [16, 3], 0.0, 1.0),             # norm 0: nothing to clip, no 0/0
    ("single_element", [1], None, 2.0),               # one value, -3: scaled by 2/3
]


def clip_fixture():
    gen = torch.Generator().manual_seed(20240521)
    sets = []
    for name, sizes, scale, max_norm in CLIP_SETS:
        if name == "single_element":
            grads = [torch.tensor([-3.0])]
        else:
            grads = [torch.randn(n, generator=gen, dtype=torch.float64) for n in sizes]
            if name == "just_above":
                norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
                grads = [g * (1.001 * max_norm / norm) for g in grads]
            else:
                grads = [g * scale for g in grads]
        grads = [g.to(torch.float32) for g in grads]  # the gradients are float32, as in training

        def clip(dtype):
            params = [torch.nn.Parameter(torch.zeros(g.shape, dtype=dtype)) for g in grads]
            for p, g in zip(params, grads):
                p.grad = g.to(dtype).clone()
            total = torch.nn.utils.clip_grad_norm_(params, max_norm)
            return float(total), [p.grad for p in params]

        norm32, clipped32 = clip(torch.float32)
        norm64, clipped64 = clip(torch.float64)
        # The factor torch applied (float64 run), read off the largest gradient element.
        flat = torch.cat([g.to(torch.float64) for g in grads])
        flat_clipped = torch.cat(clipped64)
        k = int(torch.argmax(flat.abs()))
        applied = float(flat_clipped[k] / flat[k]) if flat[k] != 0 else 1.0
        sets.append({"name": name, "max_norm": max_norm,
                     "grads": [[g9(x) for x in g.tolist()] for g in grads],
                     "norm_f32": norm32, "norm_f64": norm64, "coefficient_f64": applied,
                     "clipped_f32": [[g9(x) for x in c.tolist()] for c in clipped32]})
    return {"generator": "tools/make_schedule_golden.py", "torch_version": torch.__version__,
            "definition": "torch.nn.utils.clip_grad_norm_(params, max_norm) with norm_type 2 on "
                          "float32 gradients (norm_f32, clipped_f32) and on their float64 copies "
                          "(norm_f64; coefficient_f64 = clipped / grad at the largest element)",
            "sets": sets}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out-dir", default=os.path.join(here, "..", "tests", "optimizer", "data"))
    args = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out_dir, exist_ok=True)
    for name, data in (("schedule_golden.json", schedule_fixture()),
                       ("clip_golden.json", clip_fixture())):
        path = os.path.join(args.out_dir, name)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
