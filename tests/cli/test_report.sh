#!/usr/bin/env bash
# `strata report` end to end: a small training writes its metrics (eval_loss every 2 steps); the
# report of that run beside a hand-written one (with eval_loss and a line to skip) writes the SVG
# and the CSV whole, with one row per run × step; bad input exits 1 with a message and leaves no
# output behind.
# `strata bench sweep --render` re-renders the sweep saved in bench/results through the same
# chart code; a live sweep with --both-orders runs a placement in both optimizer orders. Usage: test_report.sh STRATA SOURCE_DIR WORK_DIR
set -u
strata=$1
src=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
unset STRATA_FAULT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

timeout 300 "$strata" train --set model.dim=64 --set model.n_layers=2 --set model.n_heads=4 \
  --set model.n_kv_heads=2 --set model.ffn_dim=128 --set data.seq_len=32 --set data.micro_batch=2 \
  --set train.steps=4 --set eval.batches=1 --set eval.every=2 --set log.every=1 \
  --set "log.metrics=$work/trained.jsonl" >"$work/train.log" 2>&1 || fail "the training run failed: $(tail -n 3 "$work/train.log")"

cat >"$work/hand.jsonl" <<'JSONL'
{"step":1,"loss":3.0,"tokens_per_s":100,"step_ms":50,"time":{"compute_ms":40,"wait_comm_ms":2,"optimizer_ms":10},"io":{"wait_ms":1},"mem":{"device_peak_bytes":1073741824,"pinned_bytes":0,"host_state_bytes":0,"nvme_bytes":0}}
this line is not JSON
{"step":2,"loss":2.5,"eval_loss":2.75,"tokens_per_s":110}
JSONL

out=$("$strata" report "$work/trained.jsonl" "$work/hand.jsonl" --label trained --label "by hand" \
      --out "$work/report.svg" --csv "$work/report.csv" 2>"$work/report.err")
rc=$?
[ $rc -eq 0 ] || fail "report exited $rc: $(cat "$work/report.err")"
grep -q "wrote $work/report.svg and $work/report.csv: 2 run(s), 6 step(s)" <<<"$out" || fail "report printed: $out"
grep -q "hand.jsonl: 1 of 3 line(s) skipped" "$work/report.err" || fail "no note of the skipped line: $(cat "$work/report.err")"
[ "$(wc -l <"$work/report.csv")" -eq 7 ] || fail "report.csv has $(wc -l <"$work/report.csv") lines, want 1 + 4 + 2"
head -n 1 "$work/report.csv" | grep -qx "run,step,loss,eval_loss,tokens_per_s,step_ms,compute_ms,comm_ms,optimizer_ms,io_wait_ms,device_peak_bytes,pinned_bytes,host_state_bytes,nvme_bytes,process_cores,steal_share" \
  || fail "CSV header: $(head -n 1 "$work/report.csv")"
grep -q "^by hand,2,2.5,2.75,110,,,,,,,,,,,$" "$work/report.csv" || fail "the hand-written step 2 row is missing"
[ "$(grep -c '^trained,[13],[0-9.]*,,[0-9.e+]*,[0-9.e+]*,' "$work/report.csv")" -eq 2 ] || fail "trained rows: $(grep '^trained' "$work/report.csv")"
[ "$(grep -c '^trained,[24],[0-9.]*,[0-9.]\+,[0-9.e+]*,[0-9.e+]*,' "$work/report.csv")" -eq 2 ] || fail "trained rows with eval.every=2: $(grep '^trained' "$work/report.csv")"
# The trained run's CPU columns: this process kept some share of a core busy; the steal share
# (empty off Linux) lies in [0, 1].
awk -F, '$1 == "trained" && !($15 > 0 && ($16 == "" || ($16 >= 0 && $16 <= 1))) { bad = 1 }
         END { exit bad }' "$work/report.csv" || fail "trained CPU columns: $(grep '^trained' "$work/report.csv")"
tail -n 1 "$work/report.svg" | grep -qx "</svg>" || fail "report.svg does not end with </svg>"
grep -q "<title>trained: loss</title></polyline>" "$work/report.svg" || fail "no loss curve of the trained run"
grep -q "<title>by hand: eval loss</title>" "$work/report.svg" || fail "no eval loss of the hand-written run"
grep -q "<title>trained: eval loss</title></polyline>" "$work/report.svg" || fail "no eval loss curve of the trained run"
ls "$work"/*.tmp >/dev/null 2>&1 && fail "a .tmp file was left behind"

# Bad input: exit 1, "strata: error: [component::op] ..." naming the problem, nothing written.
expect_error() {  # expect_error "what it should mention" args...
  local want=$1
  shift
  local msg rc
  msg=$("$strata" "$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -ne 1 ]; then
    fail "strata $* exited $rc (want 1): $msg"
  elif ! grep -q -- "strata: error: \[" <<<"$msg" || ! grep -q -- "$want" <<<"$msg"; then
    fail "strata $* printed: $msg (want it to mention '$want')"
  else
    echo "ok: strata $* -> $(head -n 1 <<<"$msg")"
  fi
}
printf 'garbage\n[1,2]\n{"loss":1}\n' >"$work/junk.jsonl"
: >"$work/empty.jsonl"
expect_error "missing.jsonl"      report "$work/missing.jsonl" --out "$work/bad.svg"
expect_error "no metrics line"    report "$work/hand.jsonl" "$work/junk.jsonl" --out "$work/bad.svg"
expect_error "it is empty"        report "$work/empty.jsonl" --out "$work/bad.svg"
expect_error "is a folder"        report "$work" --out "$work/bad.svg"
expect_error "does not exist"     report "$work/hand.jsonl" --out "$work/no_such_dir/bad.svg"
expect_error "--csv"              report "$work/hand.jsonl" --out "$work/bad.svg" --csv "$work/no_such_dir/t.csv"
expect_error "one --label per file" report "$work/hand.jsonl" "$work/trained.jsonl" --label one --out "$work/bad.svg"
[ -e "$work/bad.svg" ] && fail "bad.svg was written although its report failed"

# The sweep chart, re-rendered from the saved sweep.
"$strata" bench sweep --render "$src/bench/results/cpu-epyc-2core-2026-11-29-sweep_1024x12-2ranks.json" \
  --out "$work/sweep" >"$work/sweep.log" 2>&1 || fail "bench sweep --render failed: $(cat "$work/sweep.log")"
grep -q "device:device (params:optimizer)" "$work/sweep.svg" 2>/dev/null || fail "sweep.svg lacks its legend"
tail -n 1 "$work/sweep.svg" 2>/dev/null | grep -qx "</svg>" || fail "sweep.svg does not end with </svg>"
[ -s "$work/sweep.csv" ] || fail "sweep.csv is missing"
expect_error "not the JSON of a sweep" bench sweep --render "$work/hand.jsonl" --out "$work/sweep2"

# A live sweep of the small model with --both-orders: the placement whose optimizer is off the
# device runs overlapped and serial, the all-device one once; every row says its order, and all
# three end at the same loss to the bit (the engine's contract: same numbers in either order and
# on any tier).
timeout 300 "$strata" bench sweep --set model.dim=64 --set model.n_layers=2 --set model.n_heads=4 \
  --set model.n_kv_heads=2 --set model.ffn_dim=128 --set data.seq_len=32 --set data.micro_batch=2 \
  --set train.steps=3 --placements device:device,host:host --both-orders --io-bytes 0 \
  --out "$work/live" >"$work/live.log" 2>&1 || fail "bench sweep --both-orders failed: $(tail -n 3 "$work/live.log")"
cut -d, -f1 "$work/live.csv" 2>/dev/null | tr '\n' '|' | grep -qx "placement|device:device|host:host|host:host serial|" \
  || fail "sweep rows: $(cut -d, -f1 "$work/live.csv" 2>/dev/null | tr '\n' '|')"
head -n 1 "$work/live.csv" | grep -q ',overlap_optimizer,process_cores,steal_share$' || fail "no overlap_optimizer and CPU columns: $(head -n 1 "$work/live.csv")"
grep -q '^host:host,.*,true,[0-9.e+-]\+,[0-9.e+-]*$' "$work/live.csv" || fail "the host:host row is not overlapped"
grep -q '^host:host serial,.*,false,[0-9.e+-]\+,[0-9.e+-]*$' "$work/live.csv" || fail "the host:host serial row is not serial"
losses=$(grep -o '"loss_last": [-0-9.e+]*' "$work/live.json" | sort -u)
[ "$(grep -c . <<<"$losses")" -eq 1 ] || fail "the rows end at different losses: $losses"
[ "$(grep -c '"loss_last"' "$work/live.json")" -eq 3 ] || fail "live.json does not have 3 rows"

if [ $failures -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
