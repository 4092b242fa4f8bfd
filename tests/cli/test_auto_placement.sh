#!/usr/bin/env bash
# offload.* = "auto" end to end: `strata train` takes the placement `strata plan --auto` chooses
# from the same rate cache (probed once, by the plan, then read), trains with it exactly as with
# that placement written out, follows the rates (NVMe rates edited down to 1 MB/s rule out every
# NVMe tier; host<->device copies at 1 MB/s too keep the params on the device), and stops with an
# error naming the limit when no placement fits.
# Usage: test_auto_placement.sh STRATA_BINARY WORK_DIR
set -u
strata=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

rates=$work/rates.json
# The tiny built-in model on one rank; 100M of device memory: the all-device placement (131M)
# does not fit, the placements with the optimizer off the device (87M with the params off it too,
# 94M with them on it) do.
common=(--set offload.nvme_path="$work/nvme" --set offload.device_mem_limit=100M --rates "$rates")
autos=(--set offload.params=auto --set offload.grads=auto --set offload.optimizer=auto)
train=(train --set train.steps=3 --set eval.batches=0)

chosen_by_plan() {  # the "chosen:" line of `strata plan --auto`, as "params=X grads=Y optimizer=Z"
  # (run in $( ): a failure prints nothing, and the caller fails on the empty choice)
  local out
  if ! out=$("$strata" plan --auto "${common[@]}" 2>&1); then
    echo "strata plan --auto failed: $out" >&2
    return
  fi
  sed -n 's/^chosen: \([^,]*\),.*/\1/p' <<<"$out"
}
chosen_by_train() {  # $1: log of `strata train` with "auto" keys
  sed -n 's/^auto placement: \([^,]*\),.*/\1/p' "$1"
}
losses() { grep -o '"loss":[^,]*' "$1"; }

# 1. The plan probes and caches; training with "auto" reads that cache and takes its choice.
plan_choice=$(chosen_by_plan)
[ -s "$rates" ] || fail "strata plan --auto wrote no rate cache at $rates"
"$strata" "${train[@]}" "${common[@]}" "${autos[@]}" --set log.metrics="$work/auto.jsonl" \
  >"$work/auto.log" 2>&1 || fail "strata train with auto placement failed: $(tail -n 3 "$work/auto.log")"
train_choice=$(chosen_by_train "$work/auto.log")
if grep -q "measuring them now" "$work/auto.log"; then fail "train probed again although $rates holds the rates"; fi
if [ -z "$plan_choice" ] || [ "$plan_choice" != "$train_choice" ]; then
  fail "train chose '$train_choice', the plan '$plan_choice' (same rates, same limits)"
else
  echo "ok: train and plan both chose $plan_choice"
fi
case $train_choice in
  *"optimizer=device"*) fail "the choice '$train_choice' keeps the optimizer on the device, which exceeds the 100M limit" ;;
esac

# 2. The run with "auto" is the run with its choice written out: the same losses, bit for bit.
explicit=()
for kv in $train_choice; do explicit+=(--set "offload.$kv"); done
"$strata" "${train[@]}" "${common[@]}" "${explicit[@]}" --set log.metrics="$work/explicit.jsonl" \
  >"$work/explicit.log" 2>&1 || fail "strata train with ${explicit[*]} failed: $(tail -n 3 "$work/explicit.log")"
if [ "$(losses "$work/auto.jsonl")" != "$(losses "$work/explicit.jsonl")" ] || [ -z "$(losses "$work/auto.jsonl")" ]; then
  fail "losses with auto differ from those with ${explicit[*]}: $(losses "$work/auto.jsonl" | tr '\n' ' ') vs $(losses "$work/explicit.jsonl" | tr '\n' ' ')"
else
  echo "ok: auto and ${explicit[*]} trained to the same losses"
fi

# 3. The choice follows the rates. With the disk at 1 MB/s only params=host grads=host
# optimizer=host, of the placements that fit in 90M, moves no NVMe byte; with host<->device
# copies at 1 MB/s as well and 100M of device memory, params=device grads=host optimizer=host
# copies least (the refreshed compute copy once per step, against every gather's copy with the
# params on the host).
# (idle and beside compute alike)
sed -E -i 's/"nvme_(read|write)(_busy)?_gbps": *[0-9.eE+-]+/"nvme_\1\2_gbps": 0.001/' "$rates"
grep -q '"nvme_read_busy_gbps": *0.001' "$rates" && grep -q '"nvme_read_gbps": *0.001' "$rates" ||
  fail "could not edit the NVMe rates of $rates: $(cat "$rates")"
"$strata" "${train[@]}" "${common[@]}" "${autos[@]}" --set train.steps=1 --set offload.device_mem_limit=90M \
  >"$work/slow_disk.log" 2>&1 ||
  fail "strata train with a slow disk failed: $(tail -n 3 "$work/slow_disk.log")"
slow_choice=$(chosen_by_train "$work/slow_disk.log")
if [ "$slow_choice" != "params=host grads=host optimizer=host" ]; then
  fail "with the disk at 1 MB/s train chose '$slow_choice' (want params=host grads=host optimizer=host)"
else
  echo "ok: with the disk at 1 MB/s the choice is $slow_choice"
fi
sed -E -i 's/"(h2d|d2h)_gbps": *[0-9.eE+-]+/"\1_gbps": 0.001/' "$rates"
"$strata" "${train[@]}" "${common[@]}" "${autos[@]}" --set train.steps=1 \
  >"$work/slow_copies.log" 2>&1 || fail "strata train with slow copies failed: $(tail -n 3 "$work/slow_copies.log")"
slow_choice=$(chosen_by_train "$work/slow_copies.log")
if [ "$slow_choice" != "params=device grads=host optimizer=host" ]; then
  fail "with the disk and copies at 1 MB/s train chose '$slow_choice' (want params=device grads=host optimizer=host)"
else
  echo "ok: with the disk and copies at 1 MB/s the choice is $slow_choice"
fi

# 4. Nothing fits: an error (exit 1) that names the limit, and no training.
out=$("$strata" "${train[@]}" "${common[@]}" "${autos[@]}" --set offload.device_mem_limit=20M 2>&1)
rc=$?
if [ $rc -ne 1 ] || ! grep -q "strata: error: \[" <<<"$out" || ! grep -q "offload.device_mem_limit" <<<"$out"; then
  fail "with 20M of device memory: exit $rc, output: $out"
elif grep -q "^step 1" <<<"$out"; then
  fail "with 20M of device memory a step ran: $out"
else
  echo "ok: nothing fits in 20M -> $(grep 'strata: error' <<<"$out" | head -n 1)"
fi

if [ $failures -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all cases passed"
