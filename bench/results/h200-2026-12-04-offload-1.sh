#!/usr/bin/env bash
# What ran on the H200 in the second device session of 2026-12-04 (bench/results/
# h200-2026-12-04-offload.md), from the repository root with the bundle of scripts/gpu-bundle.sh
# carried (device tool: carry bundle). Offload on a GPU host, which had never run there:
#   1. the gpu test binaries (CudaTrainer now trains every placement with NVMe in it);
#   2. `strata bench io` on the host's disk (4G, 1M blocks, depth 32);
#   3. `strata bench sweep` of the 155M model (examples/sweep_1024x12.toml at 8 x 1024 tokens, bf16)
#      over device:device, host:host, host:nvme, nvme:nvme, with the step model's predictions;
#   4. the same sweep of the 974M model of `strata bench gpu` (device:device, host:host, nvme:nvme);
#   5. `strata plan --auto` for that model under a 12 GiB device limit (its ranking and predictions).
# Everything goes to one log and the JSON files under $OUT (8 files at most come back).
# Usage: bash bench/results/h200-2026-12-04-offload-1.sh   [DEV=cpu SMALL=1: a dry run of the flags]
set -uo pipefail
O="${OUT:-/tmp/h200-offload}"
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

if [ "$dev" = cuda ]; then
  for t in bundle/bin/test_gpu_*; do
    step "$t"
    timeout -k 5 45 "$t" --gtest_brief=1; echo "rc=$?"
  done
fi

step "bench io"
timeout -k 5 40 "$S" bench io --dir "$D" --size 4G --block 1M --qd 32 --json > "$O/io.json"
echo "rc=$?"; cat "$O/io.json"

small=()
[ -n "${SMALL:-}" ] && small=(--set model.n_layers=2 --set data.micro_batch=1 --set data.seq_len=128)
step "sweep 155M"
timeout -k 5 110 "$S" bench sweep --config examples/sweep_1024x12.toml \
  --set train.device="$dev" --set train.threads="$(nproc)" --set train.precision=bf16 \
  --set model.max_seq_len=1024 --set data.seq_len=1024 --set data.micro_batch=8 \
  --set train.steps=5 --set offload.nvme_path="$D/s155" "${small[@]}" \
  --placements device:device,host:host,host:nvme,nvme:nvme --io-bytes 2G --out "$O/sweep155"
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
  --placements device:device,host:host,nvme:nvme --io-bytes 2G --out "$O/sweep1b"
echo "rc=$?"

step "plan --auto 974M, device limit 12G"
timeout -k 5 40 "$S" plan --auto "${m1b[@]}" --set offload.nvme_path="$D/plan" \
  --set offload.device_mem_limit=12G --rates "$D/rates.json"
echo "rc=$?"
rm -rf "$D"
step done
ls -la "$O"
