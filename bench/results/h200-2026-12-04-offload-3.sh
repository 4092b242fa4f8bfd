#!/usr/bin/env bash
# The third call of the second device session of 2026-12-04 (bench/results/
# h200-2026-12-04-offload.md): host-memory gradients on CUDA without single-threaded passes
# (the commit after ec6d83a): test_gpu_trainer (placements with one and two micro-batches a step),
# then the sweeps of the 155M and 974M models, device:device and host:host, as in the second call.
# Usage: bash bench/results/h200-2026-12-04-offload-3.sh   [DEV=cpu SMALL=1: a dry run of the flags]
set -uo pipefail
O="${OUT:-/tmp/h200-offload3}"
mkdir -p "$O"
exec > >(tee "$O/log.txt") 2>&1
dev="${DEV:-cuda}"
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/local/nvidia/lib64:/usr/local/nvidia/lib
S=bundle/bin/strata
[ "$dev" = cuda ] && bash bundle/gpu-check.sh --unpack > /dev/null
[ "$dev" = cuda ] || S=build/apps/strata/strata
D="$PWD/nvme-scratch"   # on the host's disk (the repository root), not a tmpfs: O_DIRECT
rm -rf "$D" && mkdir -p "$D"
t0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - t0 ))s] $*"; }
step host
nproc; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
if [ "$dev" = cuda ]; then
  step test_gpu_trainer
  timeout -k 5 40 bundle/bin/test_gpu_trainer --gtest_brief=1; echo "rc=$?"
fi

small=()
[ -n "${SMALL:-}" ] && small=(--set model.n_layers=2 --set data.micro_batch=1 --set data.seq_len=128)
step "sweep 155M"
timeout -k 5 45 "$S" bench sweep --config examples/sweep_1024x12.toml \
  --set train.device="$dev" --set train.threads="$(nproc)" --set train.precision=bf16 \
  --set model.max_seq_len=1024 --set data.seq_len=1024 --set data.micro_batch=8 \
  --set train.steps=5 --set offload.nvme_path="$D/s155" "${small[@]}" \
  --placements device:device,host:host --io-bytes 0 --out "$O/sweep155"
echo "rc=$?"

m1b=(--set model.dim=2048 --set model.n_layers=16 --set model.n_heads=32 --set model.n_kv_heads=8
     --set model.ffn_dim=8192 --set model.max_seq_len=1024 --set model.vocab_size=256
     --set data.seq_len=1024 --set data.micro_batch=8 --set train.precision=bf16
     --set train.lr=3e-4 --set train.warmup_steps=1 --set eval.batches=0
     --set train.device="$dev" --set train.threads="$(nproc)")
[ -n "${SMALL:-}" ] && m1b+=(--set model.n_layers=1 --set model.dim=256 --set model.ffn_dim=512 \
  --set data.micro_batch=1 --set data.seq_len=128)
step "sweep 974M"
timeout -k 5 140 "$S" bench sweep "${m1b[@]}" --set train.steps=4 --set offload.nvme_path="$D/s1b" \
  --placements device:device,host:host --io-bytes 0 --out "$O/sweep1b"
echo "rc=$?"

rm -f "$O"/*.csv
rm -rf "$D"
step done
ls -la "$O"
