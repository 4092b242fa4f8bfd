#!/usr/bin/env bash
# The second call of the second device session of 2026-12-04 (bench/results/
# h200-2026-12-04-offload.md), after the first (h200-2026-12-04-offload-1.sh) found the step
# model's compute 8-12x too fast on the GPU, and with the attention rate in the probe (ec6d83a):
#   1. `strata bench sweep` of the 155M and the 974M models, device:device and host:host, with
#      the new predictions;
#   2. a traced host:host run of the 155M model (tools/trace_summary.py), where the first call
#      measured 551 ms a step against 181 ms all on the device;
#   3. the 974M model with params and optimizer on NVMe, 3 steps (log every step), and
#      `strata plan --auto` for it under a 24 GiB device limit.
# Usage: bash bench/results/h200-2026-12-04-offload-2.sh   [DEV=cpu SMALL=1: a dry run of the flags]
set -uo pipefail
O="${OUT:-/tmp/h200-offload2}"
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
nproc; free -g; df -h "$D"; findmnt -T "$D"; lsblk -d -o NAME,ROTA,SIZE,MODEL 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
"$S" info

small=()
[ -n "${SMALL:-}" ] && small=(--set model.n_layers=2 --set data.micro_batch=1 --set data.seq_len=128)
step "sweep 155M"
timeout -k 5 110 "$S" bench sweep --config examples/sweep_1024x12.toml \
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
timeout -k 5 170 "$S" bench sweep "${m1b[@]}" --set train.steps=4 --set offload.nvme_path="$D/s1b" \
  --placements device:device,host:host --io-bytes 0 --out "$O/sweep1b"
echo "rc=$?"

step "trace host:host 155M"
timeout -k 5 60 "$S" train --config examples/sweep_1024x12.toml \
  --set train.device="$dev" --set train.threads="$(nproc)" --set train.precision=bf16 \
  --set model.max_seq_len=1024 --set data.seq_len=1024 --set data.micro_batch=8 \
  --set train.steps=4 --set log.every=1 "${small[@]}" --set offload.params=host \
  --set offload.grads=host --set offload.optimizer=host --set log.trace="$D/trace.json"
echo "rc=$?"
py=python3; [ -x /opt/torch/.venv/bin/python3 ] && py=/opt/torch/.venv/bin/python3
"$py" tools/trace_summary.py "$D/trace.json" > "$O/trace-summary.txt" 2>&1; echo "rc=$?"
head -c 6000 "$O/trace-summary.txt"

step "974M, params and optimizer on NVMe"
timeout -k 5 120 "$S" train "${m1b[@]}" --set train.steps=3 --set log.every=1 \
  --set offload.params=nvme --set offload.optimizer=nvme --set offload.grads=host \
  --set offload.nvme_path="$D/t1b"
echo "rc=$?"

step "plan --auto 974M, device limit 24G"
timeout -k 5 40 "$S" plan --auto "${m1b[@]}" --set offload.nvme_path="$D/plan" \
  --set offload.device_mem_limit=24G --rates "$D/rates.json"
echo "rc=$?"
rm -f "$O"/*.csv
rm -rf "$D"
step done
ls -la "$O"
