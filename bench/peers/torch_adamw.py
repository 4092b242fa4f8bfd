#!/usr/bin/env python3
"""bench/peers/torch_adamw.py — torch.optim.AdamW on the CPU, the peer of `strata bench adam`.

Times optimizer.step() of torch.optim.AdamW(foreach=True) over one flat f32 parameter of
--numel elements (the layout of a strata shard) with the same hyperparameters, on --threads
threads (torch.set_num_threads), after one untimed warm-up step; reports the best of --repeats
steps (minimum time) and the median, as JSON with --json. Rates count parameters per second,
like strata's params_per_s, so the two divide directly.

Needs a Python with torch (on Debian: /usr/bin/python3 with python3-torch). Without torch it
prints why and exits with status 77 (the "skipped" convention of the tests).
"""
import argparse
import json
import statistics
import sys
import time


def parse_numel(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--numel", default="64M", help="parameters (64M = 67108864)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--repeats", type=int, default=5, help="timed steps; the best is reported")
    ap.add_argument("--foreach", choices=["true", "false"], default="true")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print(f"torch_adamw.py: PyTorch is not installed for {sys.executable}; run this script "
              "with a Python that has torch (on Debian: apt-get install python3-torch, then "
              "/usr/bin/python3 bench/peers/torch_adamw.py)", file=sys.stderr)
        return 77

    numel = parse_numel(args.numel)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    # The same hyperparameters as strata bench adam.
    lr, betas, eps, wd = 1e-3, (0.9, 0.999), 1e-8, 0.01
    param = torch.nn.Parameter(torch.empty(numel, dtype=torch.float32).uniform_(-1, 1))
    param.grad = torch.empty(numel, dtype=torch.float32).uniform_(-1e-2, 1e-2)
    opt = torch.optim.AdamW([param], lr=lr, betas=betas, eps=eps, weight_decay=wd,
                            foreach=args.foreach == "true")
    opt.step()  # warm-up: allocates and first-touches m and v

    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)

    best, median = min(times), statistics.median(times)
    out = {
        "bench": "torch_adamw",
        "impl": "torch.optim.AdamW",
        "torch": torch.__version__,
        "foreach": args.foreach == "true",
        "numel": numel,
        "threads": torch.get_num_threads(),
        "repeats": args.repeats,
        "statistic": "best of repeats (minimum time); median in params_per_s_median",
        "hyper": {"lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": eps, "weight_decay": wd},
        "seconds": best,
        "params_per_s": numel / best,
        "params_per_s_median": numel / median,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"torch.optim.AdamW (torch {out['torch']}, foreach={out['foreach']}): numel {numel}, "
              f"threads {out['threads']}, best of {args.repeats}: {best * 1e3:.1f} ms, "
              f"{out['params_per_s'] / 1e6:.1f} Mparam/s (median {out['params_per_s_median'] / 1e6:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
