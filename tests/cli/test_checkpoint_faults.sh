#!/usr/bin/env bash
# Checkpoints survive a crash: `strata train` killed (SIGKILL, through STRATA_FAULT) at every
# phase of a save — inside a rank file, before the manifest, before the rename, before `latest`
# moves — leaves the previous checkpoint loadable, `--resume ROOT` picks the newest complete one
# and finishes with the very losses of the uninterrupted run. Also: a flipped byte in a rank file
# is refused by `checkpoint inspect` and by `--resume`, naming the file and both hashes; ENOSPC
# while saving ends the run with exit 1 and leaves the previous checkpoint as it was; and the
# same kill in one rank of an mpirun job; a tp 2 checkpoint inspected, exported and resumed
# by one process; a run stopped by SIGTERM (one process) or SIGUSR1 (to mpirun) saves the step it
# ends after. Usage: test_checkpoint_faults.sh STRATA MPIEXEC WORK
set -u
strata=$1
mpiexec=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
unset STRATA_FAULT
small=(--set model.dim=64 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2
       --set model.ffn_dim=128 --set data.seq_len=32 --set data.micro_batch=2 --set train.steps=6
       --set data.shuffle=true --set log.peak_flops=1e11 --set eval.batches=0 --set log.every=1
       --set checkpoint.every=2)
# Sanitized builds: their options must reach every rank.
export_sanitizers=()
for v in ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS TSAN_OPTIONS; do
  [ -n "${!v:-}" ] && export_sanitizers+=(-x "$v")
done
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# The 2-rank cases need mpiexec: without it they cannot run, and that is a failure, not a pass.
if ! [ -x "$(command -v "$mpiexec")" ]; then
  fail "no mpiexec ('$mpiexec'): kill_shard_mpi2, the tensor-parallel and the SIGUSR1 2-rank" \
       "cases cannot run; install Open MPI (scripts/install-deps.sh) and configure again"
fi

# "step loss" per metrics line, sorted by step.
losses() { grep -o '"loss":[^,}]*\|"step":[0-9]*' "$1" | paste -d' ' - - | \
           sed 's/"loss":\([^ ]*\) "step":\(.*\)/\2 \1/; s/"step":\([0-9]*\) "loss":\(.*\)/\1 \2/' | sort -n; }

# The uninterrupted run: its losses are what every resumed run must reproduce.
timeout 300 "$strata" train "${small[@]}" --set "checkpoint.dir=$work/straight" \
  --set "log.metrics=$work/straight.jsonl" >"$work/straight.log" 2>&1 || fail "the uninterrupted run failed"
losses "$work/straight.jsonl" >"$work/straight.losses"
[ "$(wc -l <"$work/straight.losses")" -eq 6 ] || fail "the uninterrupted run logged $(wc -l <"$work/straight.losses") steps"

# One folder, one run: a fresh run into the straight run's folder, and a resume of its step_4
# that would save beside its step_6, are refused before a step (exit 1, naming the folder and
# the steps), and leave the folder as it was.
claim_case() {
  local root="$work/straight" before after
  before=$(cd "$root" && find . -type f ! -name .lock -exec md5sum {} + | sort)
  timeout 120 "$strata" train "${small[@]}" --set "checkpoint.dir=$root" --set log.metrics= \
    >"$work/claim_fresh.log" 2>&1
  local rc=$?
  [ $rc -eq 1 ] && grep -q "holds the checkpoints of another run (step_2, step_4, step_6)" \
    "$work/claim_fresh.log" || { fail "a fresh run into a used checkpoint.dir: exit $rc"; cat "$work/claim_fresh.log"; return; }
  timeout 120 "$strata" train --resume "$root/step_4" --set log.metrics= >"$work/claim_resume.log" 2>&1
  rc=$?
  [ $rc -eq 1 ] && grep -q "holds checkpoints past step 4, where this run resumes (step_6)" \
    "$work/claim_resume.log" || { fail "a resume of step_4 beside step_6: exit $rc"; cat "$work/claim_resume.log"; return; }
  after=$(cd "$root" && find . -type f ! -name .lock -exec md5sum {} + | sort)
  [ "$before" = "$after" ] || { fail "a refused run changed '$root'"; return; }
  echo "ok: a fresh run and a resume of an older step into a used checkpoint.dir are refused"
}
claim_case

# The uninterrupted 2-rank run (its sums are rounded in another order than one rank's).
if [ -x "$(command -v "$mpiexec")" ]; then
  timeout 300 "$mpiexec" --oversubscribe --mca btl self,vader "${export_sanitizers[@]}" -np 2 "$strata" train "${small[@]}" \
    --set data.micro_batch=1 --set "checkpoint.dir=$work/straight2" \
    --set "log.metrics=$work/straight2.jsonl" >"$work/straight2.log" 2>&1 || fail "the uninterrupted 2-rank run failed"
  losses "$work/straight2.jsonl" >"$work/straight2.losses"
fi

# kill_case NAME PHASE WANT_STEP [RANKS]: kill at PHASE of the save of step 4; the newest complete
# checkpoint must then be WANT_STEP, and a resume must end with the uninterrupted losses.
kill_case() {
  local name=$1 phase=$2 want=$3 ranks=${4:-1}
  local straight="$work/straight.losses"
  [ "$ranks" -gt 1 ] && straight="$work/straight2.losses"
  local root="$work/$name" launch=()
  [ "$ranks" -gt 1 ] && launch=("$mpiexec" --oversubscribe --mca btl self,vader "${export_sanitizers[@]}" -x STRATA_FAULT -np "$ranks")
  local micro=2
  [ "$ranks" -gt 1 ] && micro=1   # the same global batch of 2 windows
  STRATA_FAULT="rank=$((ranks - 1)),fault=kill,phase=$phase,step=4" timeout 300 "${launch[@]}" \
    "$strata" train "${small[@]}" --set data.micro_batch=$micro --set "checkpoint.dir=$root" \
    --set "log.metrics=$root.jsonl" >"$root.kill.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] || { fail "$name: the killed run exited 0"; return; }
  grep -q "killed at phase '$phase'" "$root.kill.log" || { fail "$name: the hook did not fire"; cat "$root.kill.log"; return; }
  local got
  got=$("$strata" checkpoint inspect "$root" --json 2>"$root.inspect.err" | grep -o '"step": *[0-9]*' | grep -o '[0-9]*$')
  [ "$got" = "$want" ] || { fail "$name: newest complete checkpoint is '$got', want $want"; cat "$root.inspect.err"; return; }
  timeout 300 "${launch[@]}" "$strata" train --resume "$root" >"$root.resume.log" 2>&1 || {
    fail "$name: the resumed run failed"; cat "$root.resume.log"; return; }
  # The metrics file holds the killed run's steps and then the resumed run's, with true step
  # numbers; the resumed ones must equal the uninterrupted run's exactly.
  losses "$root.jsonl" | awk -v w="$want" '$1 > w' | sort -n -u >"$root.resumed"
  grep -F -x -f "$root.resumed" "$straight" | wc -l | {
    read -r same
    n=$(wc -l <"$root.resumed")
    if [ "$n" -ne $((6 - want)) ] || [ "$same" -ne "$n" ]; then
      echo "FAIL: $name: resumed losses differ from the uninterrupted run"
      paste "$root.resumed" "$straight"
      exit 1
    fi
  } || { failures=$((failures + 1)); return; }
  # Each step is logged once, in order: the resumed run drops the killed run's lines past its
  # checkpoint before appending (the step the checkpoint holds may lack its line: killed between
  # the save and the line, which the resumed run then warns about).
  local steps
  steps=$(grep -o '"step":[0-9]*' "$root.jsonl" | grep -o '[0-9]*$' | tr '\n' ' ')
  awk -v s="$steps" 'BEGIN { n = split(s, a, " "); for (i = 2; i <= n; i++) if (a[i] <= a[i-1]) exit 1 }' || {
    fail "$name: metrics steps not once each in order: $steps"; return; }
  if [ "$want" = 4 ] && ! grep -q '"step":4[,}]' "$root.jsonl"; then
    grep -q "has no line for step 4" "$root.resume.log" || { fail "$name: step 4 has no line and no warning"; return; }
  fi
  echo "ok: $name: killed at '$phase', resumed from step $want, steps $((want + 1))-6 bit-identical, logged once each"
}

kill_case kill_shard shard 2
kill_case kill_manifest manifest 2
kill_case kill_rename rename 2
kill_case kill_latest latest 4       # step_4 is complete; only the pointer lagged
if [ -x "$(command -v "$mpiexec")" ]; then
  kill_case kill_shard_mpi2 shard 2 2
fi

# A kill while an old checkpoint is removed (keep = 1: step_2 goes at step 4's save) leaves it as
# step_2.tmp, never a step_2 with files missing; the resume takes step_4, and its own saves
# remove the leftover.
prune_case() {
  local root="$work/kill_prune" rc got
  STRATA_FAULT="rank=0,fault=kill,phase=prune,step=4" timeout 300 "$strata" train "${small[@]}" \
    --set checkpoint.keep=1 --set "checkpoint.dir=$root" --set log.metrics= >"$root.kill.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] || { fail "kill_prune: the killed run exited 0"; return; }
  grep -q "killed at phase 'prune'" "$root.kill.log" || { fail "kill_prune: the hook did not fire"; cat "$root.kill.log"; return; }
  [ -d "$root/step_2.tmp" ] && [ ! -e "$root/step_2" ] || {
    fail "kill_prune: want step_2.tmp and no step_2, found: $(ls -a "$root")"; return; }
  got=$("$strata" checkpoint inspect "$root" --json 2>"$root.inspect.err" | grep -o '"step": *[0-9]*' | grep -o '[0-9]*$')
  [ "$got" = 4 ] || { fail "kill_prune: newest complete checkpoint is '$got', want 4"; cat "$root.inspect.err"; return; }
  timeout 300 "$strata" train --resume "$root" --set log.metrics= >"$root.resume.log" 2>&1 || {
    fail "kill_prune: the resumed run failed"; cat "$root.resume.log"; return; }
  [ "$(cd "$root" && echo step_*)" = "step_6" ] || { fail "kill_prune: after the resume: $(ls -a "$root")"; return; }
  echo "ok: kill_prune: killed while step_2 was removed, left step_2.tmp; resumed from step 4; only step_6 is left"
}
prune_case

# Tensor parallelism from the command line: a tp 2 run (mpirun -np 2) saves every 2 steps and
# writes --out; `checkpoint inspect` shows its mesh and verifies it, `checkpoint export` of step 6
# writes the very safetensors file --out wrote (whole tensors), and one process resumes step_4
# with --set parallel.tp=1: steps 5-6 within 1e-5 relative of the uninterrupted 1-rank run.
tp_case() {
  local root="$work/tp2"
  timeout 300 "$mpiexec" --oversubscribe --mca btl self,vader "${export_sanitizers[@]}" -np 2 "$strata" train \
    "${small[@]}" --set parallel.tp=2 --set "checkpoint.dir=$root" --set "log.metrics=$root.jsonl" \
    --out "$work/tp2_out" >"$root.log" 2>&1 || { fail "tp 2: the run failed"; cat "$root.log"; return; }
  "$strata" checkpoint inspect "$root" >"$root.inspect" 2>&1 || { fail "tp 2: inspect failed"; cat "$root.inspect"; return; }
  grep -q "mesh: 2 rank(s) = dp 1 x tp 2 x pp 1" "$root.inspect" && grep -q "every file verified" "$root.inspect" ||
    { fail "tp 2: inspect does not show the mesh or the verification"; cat "$root.inspect"; return; }
  "$strata" checkpoint export "$root" --out "$work/tp2_hf" >"$root.export" 2>&1 || { fail "tp 2: export failed"; cat "$root.export"; return; }
  cmp -s "$work/tp2_hf/model.safetensors" "$work/tp2_out/model.safetensors" ||
    { fail "tp 2: the export of step 6 differs from the run's --out"; return; }
  # Its own checkpoint.dir: step_6 of the tp 2 run is kept (the root's is refused, test below).
  timeout 300 "$strata" train --resume "$root/step_4" --set parallel.tp=1 --set "log.metrics=$root.resume.jsonl" \
    --set "checkpoint.dir=$root.resume" \
    >"$root.resume.log" 2>&1 || { fail "tp 2 -> tp 1: the resumed run failed"; cat "$root.resume.log"; return; }
  losses "$root.resume.jsonl" >"$root.resumed"
  join "$root.resumed" "$work/straight.losses" | awk '
    { d = $2 - $3; if (d < 0) d = -d; r = d / ($3 < 0 ? -$3 : $3); if (r > worst) worst = r; n++ }
    END { printf "%d %.2e\n", n, worst; exit !(n == 2 && worst <= 1e-5) }' >"$root.compare" ||
    { fail "tp 2 -> tp 1: steps 5-6 are not within 1e-5 of the uninterrupted run: $(cat "$root.compare")";
      paste "$root.resumed" "$work/straight.losses"; return; }
  echo "ok: tp 2: inspect shows dp 1 x tp 2, export equals --out, resumed as tp 1: steps 5-6 within $(cut -d' ' -f2 "$root.compare") of one rank"
}
if [ -x "$(command -v "$mpiexec")" ]; then
  tp_case
fi

# What inspect says of the states' dtypes and the format: f32 m and v are format 2, bf16 ones 3.
inspect_dtypes() {
  local name=$1 dtype=$2 version=$3 root="$work/$1"
  "$strata" checkpoint inspect "$root" >"$root.inspect" 2>&1 ||
    { fail "$name: inspect failed"; cat "$root.inspect"; return; }
  "$strata" checkpoint inspect "$root" --json >"$root.inspect.json" 2>&1 ||
    { fail "$name: inspect --json failed"; cat "$root.inspect.json"; return; }
  local json
  json=$(tr -d ' \n' <"$root.inspect.json")
  grep -q "master in f32, m and v in $dtype (format version $version)" "$root.inspect" &&
    [[ "$json" == *"\"format_version\":$version,"* ]] &&
    [[ "$json" == *"\"state_dtypes\":{\"m\":\"$dtype\",\"master\":\"f32\",\"v\":\"$dtype\"}"* ]] ||
    { fail "$name: inspect does not say m and v in $dtype, format $version"; cat "$root.inspect" "$root.inspect.json"; return; }
  echo "ok: $name: inspect says master f32, m and v $dtype, format version $version (text and --json)"
}
inspect_dtypes straight f32 2
timeout 300 "$strata" train "${small[@]}" --set train.steps=2 --set train.optimizer_state_dtype=bf16 \
  --set "checkpoint.dir=$work/bf16" >"$work/bf16.log" 2>&1 || { fail "bf16 states: the run failed"; cat "$work/bf16.log"; }
inspect_dtypes bf16 bf16 3

# A flipped byte: refused by inspect and by --resume, naming the file and both hashes.
root="$work/straight"
file="$root/step_6/rank_00000.bin"
printf '\x5a' | dd of="$file" bs=1 seek=4100 conv=notrunc status=none
if "$strata" checkpoint inspect "$root" >"$work/flip.inspect" 2>&1; then
  fail "inspect accepted a flipped byte"
elif ! grep -q "rank_00000.bin" "$work/flip.inspect" || ! grep -q "damaged: xxHash64 [0-9a-f]\{16\}, the manifest recorded [0-9a-f]\{16\}" "$work/flip.inspect"; then
  fail "inspect did not name the file and both hashes"; cat "$work/flip.inspect"
else
  echo "ok: flipped byte: inspect refuses it: $(grep -m1 rank_00000 "$work/flip.inspect" | sed 's/^ *//')"
fi
if "$strata" train --resume "$root" --set train.steps=8 >"$work/flip.resume" 2>&1; then
  fail "--resume started from a damaged checkpoint"
elif ! grep -q "rank_00000.bin' is damaged: its xxHash64 is [0-9a-f]\{16\} but the manifest recorded [0-9a-f]\{16\}" "$work/flip.resume"; then
  fail "--resume did not name the file and both hashes"; cat "$work/flip.resume"
else
  echo "ok: flipped byte: --resume refuses it"
fi

# ENOSPC or EIO while saving step 4: exit 1 with the error; step_2 intact, no step_4.
io_error_case() {
  local fault=$1 want=$2 root="$work/$1"
  STRATA_FAULT="fault=$fault,skip=12" timeout 300 "$strata" train "${small[@]}" \
    --set "checkpoint.dir=$root" >"$root.log" 2>&1
  local rc=$?
  if [ $rc -ne 1 ]; then
    fail "$fault: exit $rc, want 1"; cat "$root.log"
  elif ! grep -q "$want" "$root.log"; then
    fail "$fault: the error does not say '$want'"; cat "$root.log"
  elif [ -e "$root/step_4" ] || ! "$strata" checkpoint inspect "$root/step_2" >/dev/null 2>&1; then
    fail "$fault: step_4 exists or step_2 does not verify"; ls "$root"
  else
    echo "ok: $fault while saving: exit 1 ($(grep -m1 -o "$want" "$root.log")), step_2 intact, no step_4"
  fi
}
io_error_case checkpoint_enospc "No space left on device"
io_error_case checkpoint_eio "Input/output error"

# A run stopped from outside: `strata train` (or mpirun, which forwards SIGUSR1 to its ranks)
# gets SIG once it has logged a few steps; it must end after the step in progress within 30 s,
# exit 128 + SIG, say so, and save that step though checkpoint.every is far off; `latest` then names
# it, it verifies, and a resume starts at the step after it. (Bit-exactness of such a resume:
# tests/engine/test_checkpoint.cpp, AStopAskedOnOneRank....)
# signal_case NAME SIG CODE [RANKS]
signal_case() {
  local name=$1 sig=$2 code=$3 ranks=${4:-1}
  local root="$work/$name" launch=()
  [ "$ranks" -gt 1 ] && launch=("$mpiexec" --oversubscribe --mca btl self,vader "${export_sanitizers[@]}" -np "$ranks")
  local long=("${small[@]}" --set train.steps=1000000 --set checkpoint.every=1000000)
  "${launch[@]}" "$strata" train "${long[@]}" --set "checkpoint.dir=$root" --set "log.metrics=$root.jsonl" \
    >"$root.log" 2>&1 &
  local pid=$! waited=0
  until [ -s "$root.jsonl" ] && [ "$(wc -l <"$root.jsonl")" -ge 3 ]; do
    sleep 0.1; waited=$((waited + 1))
    if [ $waited -ge 600 ] || ! kill -0 $pid 2>/dev/null; then
      kill -9 $pid 2>/dev/null; fail "$name: the run did not log 3 steps in 60 s"; cat "$root.log"; return
    fi
  done
  kill -"$sig" $pid
  waited=0
  while kill -0 $pid 2>/dev/null; do
    sleep 0.1; waited=$((waited + 1))
    if [ $waited -ge 300 ]; then
      kill -9 $pid; fail "$name: still running 30 s after SIG$sig"; cat "$root.log"; return
    fi
  done
  wait $pid
  local rc=$?
  [ $rc -eq "$code" ] || { fail "$name: exit $rc, want $code"; cat "$root.log"; return; }
  local step
  step=$(grep -o "stopped by SIG$sig after step [0-9]*" "$root.log" | grep -o '[0-9]*$')
  [ -n "$step" ] || { fail "$name: the run does not say it stopped"; cat "$root.log"; return; }
  [ "$(cat "$root/latest" 2>/dev/null)" = "step_$step" ] ||
    { fail "$name: latest is '$(cat "$root/latest" 2>/dev/null)', want step_$step"; ls "$root"; return; }
  "$strata" checkpoint inspect "$root" >"$root.inspect" 2>&1 || { fail "$name: inspect failed"; cat "$root.inspect"; return; }
  # Resume, then stop it the same way: its first step is the one after the saved step.
  local before
  before=$(wc -l <"$root.jsonl")
  "${launch[@]}" "$strata" train --resume "$root" >"$root.resume.log" 2>&1 &
  pid=$!
  waited=0
  until [ "$(wc -l <"$root.jsonl")" -gt "$before" ]; do
    sleep 0.1; waited=$((waited + 1))
    if [ $waited -ge 600 ] || ! kill -0 $pid 2>/dev/null; then
      kill -9 $pid 2>/dev/null; fail "$name: the resumed run logged no step in 60 s"; cat "$root.resume.log"; return
    fi
  done
  kill -"$sig" $pid
  wait $pid
  local first
  first=$(sed -n "$((before + 1))p" "$root.jsonl" | grep -o '"step":[0-9]*' | grep -o '[0-9]*$')
  [ "$first" = "$((step + 1))" ] || { fail "$name: the resumed run began at step '$first', want $((step + 1))"; return; }
  echo "ok: $name: SIG$sig ended the run after step $step with exit $rc; step_$step saved, resumed at $first"
}
signal_case sigterm TERM 143
if [ -x "$(command -v "$mpiexec")" ]; then
  signal_case sigusr1_mpi2 USR1 138 2
fi

if [ $failures -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "every crash left a loadable checkpoint and every damage was caught"
