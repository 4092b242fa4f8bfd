#!/usr/bin/env bash
# One rank's failure ends the job: `mpirun -np 2 strata train` where one rank fails must exit
# non-zero, promptly, with the failing rank's message — never hang. The cases:
#   1. an Error on rank 0 only: a metrics file in a directory that does not exist (only rank 0
#      writes metrics);
#   2. an Error on rank 1 only: an NVMe read error injected into rank 1's swap file
#      (STRATA_FAULT=rank=1,fault=nvme_read_error);
#   3. rank 1 stops responding before step 2 (STRATA_FAULT=rank=1,step=2,fault=hang): rank 0's
#      watchdog must end the job after parallel.timeout (3 s here), naming the collective, the
#      step and rank 1 as the rank that did not arrive;
#   4. a configuration that differs on rank 1 (a --set given to it alone), or weights that differ
#      (--init-from another folder): refused at start-up on every rank, naming both values;
#   5, 6. cases 2 and 3 with two pipeline stages (parallel.pp = 2), where the ranks also meet in
#      point-to-point transfers: rank 1's read error must name rank 1's own swap file, and rank
#      0's watchdog the transfer with rank 1 it waits in;
#   7. rank 1 stops responding at exit, after its last step (STRATA_FAULT=rank=1,
#      fault=hang_at_exit): rank 0 waits for it in MPI_Finalize, and its watchdog must end the job
#      after parallel.timeout, naming that wait (before it was watched, the job never ended).
# Bounds: the error cases must end within 10 s of the error; the hang case within 10 s after
# the timeout. Each case's run is bounded by `timeout` (a hang is a failure, not a stuck CI),
# and its time from launch to exit is printed. Usage: test_failures.sh STRATA MPIEXEC WORK_DIR
set -u
strata=$1
mpiexec=$2
work=$3
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# A sanitized build's options (in this test's CTest environment) go to every rank.
export_sanitizers=()
for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS; do
  [ -n "${!v:-}" ] && export_sanitizers+=(-x "$v")
done
small=(--set model.dim=64 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2
       --set model.ffn_dim=128 --set data.seq_len=32 --set data.micro_batch=2 --set train.steps=4
       --set log.peak_flops=1e11 --set eval.batches=0)
failures=0

# run_case NAME BOUND_S WANT... -- ARGS...: runs mpirun -np 2 strata ARGS; the job must exit
# non-zero, in under BOUND_S seconds from launch, and its output must hold every WANT. ARGS of the
# form A... : B... give rank 0 the arguments A and rank 1 the arguments B.
run_case() {
  local name=$1 bound=$2
  shift 2
  local want=()
  while [ "$1" != "--" ]; do want+=("$1"); shift; done
  shift
  local launch=(-np 2 "$strata" "$@") k
  for ((k = 1; k <= $#; k++)); do
    if [ "${!k}" = ":" ]; then
      launch=(-np 1 "$strata" "${@:1:k-1}" : -np 1 "$strata" "${@:k+1}")
    fi
  done
  local out="$work/$name.log" t0 t1 rc
  t0=$(date +%s.%N)
  timeout -k 5 $((bound + 30)) "$mpiexec" --oversubscribe --mca btl self,vader -x STRATA_FAULT \
    "${export_sanitizers[@]}" "${launch[@]}" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  local ok=1
  if [ $rc -eq 0 ]; then
    echo "FAIL: $name: the job exited 0"; ok=0
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "FAIL: $name: the job did not end by itself (killed after $((bound + 30)) s)"; ok=0
  fi
  if awk -v s="$secs" -v b="$bound" 'BEGIN { exit !(s > b) }'; then
    echo "FAIL: $name: took ${secs} s (bound ${bound} s)"; ok=0
  fi
  for w in "${want[@]}"; do
    if ! grep -q -- "$w" "$out"; then echo "FAIL: $name: output lacks '$w'"; ok=0; fi
  done
  if [ $ok -eq 1 ]; then
    echo "ok: $name: exit $rc after ${secs} s"
  else
    failures=$((failures + 1))
    echo "---- output of $name ----"; cat "$out"; echo "----"
  fi
}

# Start-up (MPI, the model, the first step) takes a few seconds here; each bound adds 10 s to
# what the case needs before its failure happens.
unset STRATA_FAULT
run_case error_on_rank0 20 "error on rank 0 of 2" "cannot open metrics file" -- \
  train "${small[@]}" --set log.metrics=/nonexistent/dir/m.jsonl

export STRATA_FAULT=rank=1,fault=nvme_read_error,skip=3
run_case nvme_error_on_rank1 25 "error on rank 1 of 2" "Input/output error" -- \
  train "${small[@]}" --set offload.optimizer=nvme --set "offload.nvme_path=$work/nvme"

export STRATA_FAULT=rank=1,step=2,fault=hang
run_case rank1_stops_responding 30 "rank 0 of 2: \[watchdog\]" "step 2" \
  "ranks that did not arrive: 1" -- \
  train "${small[@]}" --set parallel.timeout=3

# A configuration that differs on one rank (a --set given to rank 1 only) ends the job at start-up
# on every rank, naming the key and both values, instead of a hang or replicas that drift apart.
unset STRATA_FAULT
run_case config_differs_on_rank1 20 "\[train::config\] rank 1 of 2 runs with a configuration" \
  "train.lr = 0.001 (rank 0: 0.003)" -- \
  train "${small[@]}" : train "${small[@]}" --set train.lr=1e-3

# Weights that differ on rank 1 (--init-from another export of the same shapes) are refused at
# start-up the same way: its shard would be another model's.
"$strata" train "${small[@]}" --set train.steps=1 --set log.metrics= --out "$work/hf_a" >/dev/null 2>&1
"$strata" train "${small[@]}" --set train.steps=1 --set log.metrics= --set train.seed=7 \
  --out "$work/hf_b" >/dev/null 2>&1
run_case init_from_differs_on_rank1 20 "\[train::config\] rank 1 of 2" "\--init-from = weights" -- \
  train "${small[@]}" --init-from "$work/hf_a" : train "${small[@]}" --init-from "$work/hf_b"
# A benchmark point the engine would refuse ends the bench before its first point runs.
run_case pipeline_bench_micro_below_pp 20 "1f1b with --micro 1" "drop 1 from --micro" -- \
  bench pipeline --micro 4,1 --schedules 1f1b

# Only rank 0 writes --out: a rank given another folder is refused before training.
run_case out_differs_on_rank1 20 "\[train::config\] rank 1 of 2" "\--out = $work/out_b" -- \
  train "${small[@]}" --out "$work/out_a" : train "${small[@]}" --out "$work/out_b"

# Two stages, one rank each, four micro-batches a step (the 1F1B schedule has sends and receives
# in flight both ways).
pp=(--set parallel.pp=2 --set train.grad_accum=4)
export STRATA_FAULT=rank=1,fault=nvme_read_error,skip=3
run_case pp2_nvme_error_on_rank1 25 "error on rank 1 of 2" "Input/output error" "rank1-0.swap" -- \
  train "${small[@]}" "${pp[@]}" --set offload.optimizer=nvme --set "offload.nvme_path=$work/nvme_pp"

export STRATA_FAULT=rank=1,step=2,fault=hang
run_case pp2_rank1_stops_responding 30 "rank 0 of 2: \[watchdog\]" "step 2" \
  "with rank 1 on 'pp " -- \
  train "${small[@]}" "${pp[@]}" --set parallel.timeout=3

export STRATA_FAULT=rank=1,fault=hang_at_exit
run_case rank1_hangs_at_exit 30 "rank 0 of 2: \[watchdog\]" "MPI_Finalize at exit" -- \
  train "${small[@]}" --set parallel.timeout=3

if [ $failures -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all cases ended the job as they should"
