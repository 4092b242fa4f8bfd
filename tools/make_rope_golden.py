#!/usr/bin/env python3
"""Rotary-embedding golden fixtures from Hugging Face transformers, for tests/engine.

For each case it builds a tiny random LlamaForCausalLM with transformers 5 (float32, CPU), saves
it with save_pretrained (config.json + model.safetensors, exactly as transformers writes them),
and records in golden.json transformers' loss on fixed tokens, the rotary settings and
transformers' inv_freq. A C++ test loads each directory through strata's --init-from path and
compares. A second file, rope_inv_freq.json, holds transformers' inv_freq for more rope settings
and head sizes (Llama 3.1's own among them), which strata's host tables must reproduce bit for
bit. The cases:

  rope_theta500k  rope_type default, rope_theta 500000
  rope_llama3     rope_type llama3 (factor 8, low 1, high 4, original_max_position_embeddings 64),
                  evaluated at T = 96 > 64, with head dim 16 putting frequencies in all three
                  bands (kept, interpolated, divided by the factor)
  rope_linear     rope_type linear, factor 4

Run:  /work/venv/bin/python tools/make_rope_golden.py [--out-dir DIR]
(default DIR: tests/engine/data of this repository). See tools/README.md. The script checks
itself before writing: the fixture is computed twice and must give identical bytes; the loss must
move far more than the C++ tolerance (1e-6) when the rotary settings are dropped, so that the
test can fail; transformers' own float64 run bounds the float32 noise of the loss; the
transformers 4 layout of the same settings must give transformers the same frequencies; and
strata's float32 recipe for inv_freq (written out here in numpy) must equal transformers' bits.
"""

import argparse
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

GENERATOR = "tools/make_rope_golden.py"
SHAPE = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5,
             tie_word_embeddings=True, initializer_range=0.2)
BATCH = 2
CASES = [
    dict(name="rope_theta500k", seed=20250301, seq=64, max_positions=128,
         rope={"rope_type": "default", "rope_theta": 500000.0}),
    dict(name="rope_llama3", seed=20250302, seq=96, max_positions=256,
         rope={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}),
    dict(name="rope_linear", seed=20250303, seq=64, max_positions=128,
         rope={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
]
# Extra inv_freq checks: (rope_parameters, head_dim).
LLAMA31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
INV_FREQ_CASES = [
    ({"rope_type": "default", "rope_theta": 10000.0}, 128),
    ({"rope_type": "default", "rope_theta": 500000.0}, 64),
    ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}, 128),
    ({"rope_type": "linear", "rope_theta": 10000.0, "factor": 3.3}, 64),
    (LLAMA31, 128),
    (LLAMA31, 64),
    (dict(LLAMA31, factor=32.0), 128),
    ({"rope_type": "llama3", "rope_theta": 10000.0, "factor": 7.3, "low_freq_factor": 1.7,
      "high_freq_factor": 5.1, "original_max_position_embeddings": 64}, 64),
]
TOLERANCE = 1e-6  # the C++ test's relative tolerance on the loss


class CheckFailed(RuntimeError):
    pass


def check(cond, what):
    if not cond:
        raise CheckFailed(what)


def llama_config(rope, max_positions, head_dim=None):
    kw = dict(SHAPE)
    if head_dim is not None:  # inv_freq checks only: the shape around the head does not matter
        kw.update(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim)
    return LlamaConfig(**kw, max_position_embeddings=max_positions,
                       rope_parameters=dict(rope), attn_implementation="eager")


def transformers_inv_freq(config):
    rotary = LlamaRotaryEmbedding(config)
    check(rotary.attention_scaling == 1.0, "attention_scaling is not 1")
    return rotary.inv_freq.detach().numpy().astype(np.float32)


def strata_inv_freq(rope, D):
    """kernels/rope_tables.cpp written out in numpy: float32 steps, pow correctly rounded."""
    f32 = np.float32
    theta = float(f32(rope["rope_theta"]))
    inv = np.array([f32(1.0) / f32(math.pow(theta, float(f32(2 * i) / f32(D))))
                    for i in range(D // 2)], dtype=np.float32)
    kind = rope["rope_type"]
    if kind == "linear":
        inv = (inv / f32(rope["factor"])).astype(np.float32)
    elif kind == "llama3":
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old = rope["original_max_position_embeddings"]
        wavelen = ((f32(1) / inv).astype(np.float32) * f32(2 * math.pi)).astype(np.float32)
        scaled = np.where(wavelen > f32(old / low), (inv / f32(factor)).astype(np.float32), inv)
        smooth = ((f32(1) / wavelen).astype(np.float32) * f32(old)).astype(np.float32)
        smooth = ((smooth - f32(low)).astype(np.float32) / f32(high - low)).astype(np.float32)
        a = (((f32(1) - smooth).astype(np.float32) * scaled).astype(np.float32) / f32(factor))
        smoothed = (a.astype(np.float32) + (smooth * scaled).astype(np.float32)).astype(np.float32)
        medium = ~(wavelen < f32(old / high)) & ~(wavelen > f32(old / low))
        inv = np.where(medium, smoothed, scaled).astype(np.float32)
    return inv


def v4_layout(rope):
    """The same settings as transformers 4 wrote them: top-level rope_theta + rope_scaling."""
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return rope["rope_theta"], (None if rope["rope_type"] == "default" else scaling)


def build(case):
    """The model (float32) and its batch, from the case's seed alone."""
    torch.manual_seed(case["seed"])
    config = llama_config(case["rope"], case["max_positions"])
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norm weights away from 1, so that reading them wrongly shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape))
    g = torch.Generator().manual_seed(case["seed"] + 1)
    stream = torch.randint(0, SHAPE["vocab_size"], (BATCH, case["seq"] + 1), generator=g)
    return model, stream[:, :-1].contiguous(), stream[:, 1:].contiguous()


def mean_loss(model, inputs, targets):
    """Mean cross-entropy over all B·T targets, summed in float64 from the model's logits."""
    with torch.no_grad():
        logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]),
                           targets.reshape(-1)).item()


def make_case(case, out_root, report):
    model, inputs, targets = build(case)
    loss = mean_loss(model, inputs, targets)

    # float32 noise floor: the same model in float64
    loss64 = mean_loss(model.to(torch.float64), inputs, targets)
    model.to(torch.float32)
    noise = abs(loss - loss64) / loss64
    check(noise < TOLERANCE / 4, f"{case['name']}: float32 vs float64 loss differ by {noise:.2e}")

    # sensitivity: the same weights with plain rotary at theta 10000 (what strata computed before
    # it read rope_parameters) must move the loss by far more than the tolerance
    plain = llama_config({"rope_type": "default", "rope_theta": 10000.0}, case["max_positions"])
    wrong = LlamaForCausalLM(plain).eval()
    wrong.load_state_dict(model.state_dict())
    loss_plain = mean_loss(wrong, inputs, targets)
    moved = abs(loss_plain - loss) / loss
    check(moved > 100 * TOLERANCE, f"{case['name']}: plain rope moves the loss by only {moved:.2e}")

    # for the scaled types, dropping only the scaling (same theta) must move it as much
    moved_scaling = None
    if case["rope"]["rope_type"] != "default":
        unscaled = llama_config({"rope_type": "default", "rope_theta": case["rope"]["rope_theta"]},
                                case["max_positions"])
        wrong = LlamaForCausalLM(unscaled).eval()
        wrong.load_state_dict(model.state_dict())
        loss_unscaled = mean_loss(wrong, inputs, targets)
        moved_scaling = abs(loss_unscaled - loss) / loss
        check(moved_scaling > 100 * TOLERANCE,
              f"{case['name']}: dropping the scaling moves the loss by only {moved_scaling:.2e}")

    # the transformers 4 layout of the same settings means the same to transformers 5
    theta, scaling = v4_layout(case["rope"])
    old = LlamaConfig(**SHAPE, max_position_embeddings=case["max_positions"], rope_theta=theta,
                      rope_scaling=scaling)
    inv = transformers_inv_freq(model.config)
    check(np.array_equal(transformers_inv_freq(old), inv), f"{case['name']}: v4 layout differs")
    D = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    if case["rope"]["rope_type"] == "llama3":  # one frequency at least in every band
        r = case["rope"]
        base = transformers_inv_freq(llama_config({"rope_type": "default", "rope_theta": r["rope_theta"]},
                                                  case["max_positions"]))
        wavelen = 2 * math.pi / base.astype(np.float64)
        old_len = r["original_max_position_embeddings"]
        kept = int(np.sum(wavelen < old_len / r["high_freq_factor"]))
        divided = int(np.sum(wavelen > old_len / r["low_freq_factor"]))
        check(kept >= 1 and divided >= 1 and kept + divided < len(base),
              f"{case['name']}: bands kept {kept}, divided {divided} of {len(base)}")
        check(case["seq"] > old_len, f"{case['name']}: T must exceed the original context")
    check(np.array_equal(strata_inv_freq(case["rope"], D).view(np.int32), inv.view(np.int32)),
          f"{case['name']}: strata's inv_freq recipe differs from transformers'")

    # save exactly as transformers does, then keep only what --init-from reads
    tmp = tempfile.mkdtemp()
    try:
        model.save_pretrained(tmp)
        files = {n: open(os.path.join(tmp, n), "rb").read() for n in ("config.json", "model.safetensors")}
    finally:
        shutil.rmtree(tmp)
    saved = json.loads(files["config.json"])
    check(saved.get("rope_parameters") == case["rope"], f"{case['name']}: saved rope_parameters differ")
    check("rope_theta" not in saved and "rope_scaling" not in saved,
          f"{case['name']}: transformers wrote a top-level rope key")

    golden = {
        "generator": GENERATOR,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "rope": case["rope"],
        "batch": BATCH,
        "seq_len": case["seq"],
        "inputs": inputs.tolist(),
        "targets": targets.tolist(),
        "loss": loss,
        "loss_float64_model": loss64,
        "loss_plain_rope_theta_10000": loss_plain,
        "loss_unscaled_same_theta": None if moved_scaling is None else loss_unscaled,
        "inv_freq": [float(x) for x in inv],
    }
    files["golden.json"] = (json.dumps(golden, indent=1) + "\n").encode()
    report.append(f"{case['name']}: loss {loss:.9f}  float64 model {loss64:.9f} (rel {noise:.1e})"
                  f"  plain rope {loss_plain:.9f} (rel {moved:.2e})"
                  + ("" if moved_scaling is None else f"  unscaled (rel {moved_scaling:.2e})"))
    return files


def inv_freq_table(report):
    rows = []
    for rope, D in INV_FREQ_CASES:
        inv = transformers_inv_freq(llama_config(rope, 131072, head_dim=D))
        mine = strata_inv_freq(rope, D)
        check(np.array_equal(mine.view(np.int32), inv.view(np.int32)),
              f"inv_freq {rope} D={D}: strata's recipe differs from transformers'")
        rows.append({"rope": rope, "head_dim": D, "inv_freq": [float(x) for x in inv]})
    report.append(f"rope_inv_freq.json: {len(rows)} settings, all equal to strata's recipe bit for bit")
    return {"generator": GENERATOR, "transformers_version": transformers.__version__,
            "torch_version": torch.__version__, "cases": rows}


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir", default=os.path.join(here, "..", "tests", "engine", "data"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    report = []
    try:
        outputs = {}
        for case in CASES:
            first = make_case(case, args.out_dir, report)
            again = make_case(case, args.out_dir, [])
            check(first == again, f"{case['name']}: two runs gave different bytes")
            outputs[case["name"]] = first
        table = (json.dumps(inv_freq_table(report), indent=1) + "\n").encode()
    except CheckFailed as e:
        print(f"self-check failed: {e}", file=sys.stderr)
        return 1
    for name, files in outputs.items():
        d = os.path.normpath(os.path.join(args.out_dir, name))
        os.makedirs(d, exist_ok=True)
        for fname, data in files.items():
            with open(os.path.join(d, fname), "wb") as f:
                f.write(data)
        report.append(f"wrote {d}: " + ", ".join(f"{n} {len(b):,} B" for n, b in sorted(files.items())))
    with open(os.path.join(args.out_dir, "rope_inv_freq.json"), "wb") as f:
        f.write(table)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
