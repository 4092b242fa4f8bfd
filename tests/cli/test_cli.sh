#!/usr/bin/env bash
# The command line on bad input: every case must exit with status 1 (an Error, not a crash or
# an abort) and print a one-line "strata: error: [component::op] ..." naming what is wrong. (One
# case at the end must succeed: bench checkpoint, which no other test runs.)
# Usage: test_cli.sh STRATA_BINARY WORK_DIR
set -u
strata=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
failures=0

expect_error() {  # expect_error "what it should mention" args...
  local want=$1
  shift
  local out rc
  out=$("$strata" "$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -ne 1 ]; then
    echo "FAIL: strata $* exited $rc (want 1): $out"
    failures=$((failures + 1))
  elif ! grep -q -- "strata: error: \[" <<<"$out" || ! grep -q -- "$want" <<<"$out"; then
    echo "FAIL: strata $* printed: $out (want it to mention '$want')"
    failures=$((failures + 1))
  else
    echo "ok: strata $* -> $(head -n 1 <<<"$out")"
  fi
}

printf 'not a token file at all, but long enough to be read as text' > "$work/text.txt"
printf '\x00\x01\x02\x03' > "$work/bad.bin"
head -c 1024 /dev/zero > "$work/empty_header.bin"
printf '[model]\ndim = "wide"\n' > "$work/wrong_type.toml"
printf '[model]\ndimm = 4\n' > "$work/unknown_key.toml"
printf '[model\n' > "$work/syntax.toml"

expect_error "model.dimm"         train --config "$work/unknown_key.toml"
expect_error "model.dim"          train --config "$work/wrong_type.toml"
expect_error "syntax"             train --config "$work/syntax.toml"
expect_error "nope.toml"          train --config "$work/nope.toml"
# A pseudo-file is read to its end, not to the size it reports (0): /proc/self/mem refuses the
# read (EIO), and was read as an empty config, training the defaults.
expect_error "/proc/self/mem: cannot read" train --config /proc/self/mem
# ... and not without end (/proc/self/pagemap reads on for the whole address space), nor is a
# FIFO with no writer waited on.
expect_error "not a file to read whole" train --config /proc/self/pagemap
mkfifo "$work/config.fifo"
expect_error "not a regular file" train --config "$work/config.fifo"
expect_error "train.stepz"        train --set train.stepz=3
expect_error "model.n_heads"      train --set model.n_heads=7
expect_error "model.n_kv_heads"   train --set model.n_kv_heads=3
expect_error "train.precision"    train --set train.precision=fp8
expect_error "missing.bin"        train --set data.path="$work/missing.bin"
expect_error "bad.bin"            train --set data.path="$work/bad.bin"
expect_error "empty_header.bin"   train --set data.path="$work/empty_header.bin"
expect_error "vocab"              train --set data.path="$work/text.txt" --set model.vocab_size=128
expect_error "device_mem_limit"   train --set offload.device_mem_limit=1M
# plan's verdict is its exit status too, in text and in JSON (scripts gate on it)
expect_error "does not fit"       plan --set offload.device_mem_limit=1M
expect_error "device_mem_limit"   plan --set offload.device_mem_limit=1M --json
expect_error "offload.params"     train --set offload.params=sideways
expect_error "config.json"        eval --init-from "$work"
expect_error "dtype"              train --set train.steps=1 --out "$work/out" --out-dtype int4
# "auto" placement: a rate cache that cannot be read is an error naming it and the fix (and
# nothing is probed: reading fails first).
: >"$work/a_file"
printf '{"version": 1, "machines": {' >"$work/rates.json"
expect_error "$work/rates.json"   plan --auto --rates "$work/rates.json"
expect_error "rm '$work/rates.json'" train --set offload.optimizer=auto --rates "$work/rates.json"
# A rate cache that cannot be written is found before the probe's seconds, not after.
expect_error "for the rate cache" plan --auto --rates "$work/a_file/no/such/rates.json"
expect_error "is a folder"        plan --auto --rates "$work"
# ... also where access() says yes but no file can be made (/proc, even as root).
expect_error "cannot write the rate cache '/proc/strata-rates.json'" plan --auto --rates /proc/strata-rates.json
# bench sweep checks --out before its minutes of training.
expect_error "--out"              bench sweep --out "$work/no/such/folder/p"
# ... and its placements: one listed twice, or NVMe ones whose rates --io-bytes cannot measure.
expect_error "listed twice"       bench sweep --placements host:host,device:device,host:host
expect_error "--io-bytes 0 skips" bench sweep --placements nvme:nvme --set offload.nvme_path="$work/nv" --io-bytes 0
expect_error "less than one io.block_size" bench sweep --placements host:nvme \
  --set offload.nvme_path="$work/nv" --io-bytes 4K
# The plan refuses what the engine would: a read-ahead below one chunk, an unusable NVMe folder.
expect_error "raise offload.optimizer_read_ahead" plan --set offload.optimizer=nvme \
  --set offload.nvme_path="$work/nv" --set offload.optimizer_read_ahead=1
expect_error "point offload.nvme_path at writable folders" plan --set offload.optimizer=nvme \
  --set offload.nvme_path="$work/a_file"
# Settings that cannot apply are said, not dropped in silence (the run goes on): a read-ahead
# with the optimizer on the device, --rates without an "auto" tier (and no rate file written).
out=$("$strata" train --set model.n_layers=1 --set train.steps=1 --set eval.batches=0 \
  --set log.metrics= --set offload.optimizer_read_ahead=1G --rates "$work/unused_rates.json" 2>&1)
rc=$?
if [ $rc -ne 0 ] || ! grep -q 'offload.optimizer_read_ahead = 1G is not used' <<<"$out" ||
   ! grep -q 'this run reads no rates' <<<"$out" || [ -e "$work/unused_rates.json" ]; then
  echo "FAIL: train with settings that cannot apply exited $rc or did not say so: $out"
  failures=$((failures + 1))
fi
# bench io moves whole blocks: a size that is not is refused, not cut short in silence.
expect_error "not a whole number of 2M blocks" bench io --dir "$work/io" --size 3M --block 2M
# The update and overwrite patterns are not swept (and nothing is written: the check comes first).
expect_error "drop --pattern update" bench io --dir "$work/io" --sweep --pattern update
expect_error "drop --pattern overwrite" bench io --dir "$work/io" --sweep --pattern overwrite
# bench comm checks its largest buffers against the memory before allocating them.
expect_error "lower --max"        bench comm --min 1K --max 1T
# bench io keeps the engine's rules for its settings.
expect_error "io.stripe_size"     bench io --dir "$work/io" --block 8K --stripe 4K
expect_error "twice"              bench io --dir "$work/io" --dir "$work/io"
# Outputs checked before any work, and never over an input (the input is left as it was).
cp "$work/text.txt" "$work/keep.txt"
expect_error "an input"           train --set data.path="$work/text.txt" --set log.metrics="$work/text.txt"
expect_error "an input"           train --set data.path="$work/text.txt" --set log.trace="$work/text.txt"
cmp -s "$work/text.txt" "$work/keep.txt" || { echo "FAIL: a refused run changed data.path"; failures=$((failures + 1)); }
expect_error "log.trace"          train --set log.trace="$work/no/such/folder/t.json"
expect_error "is a file, not a folder" train --out "$work/a_file"
printf '{"step": 1, "loss": 5.5}\n' >"$work/m.jsonl"
expect_error "an input"           report "$work/m.jsonl" --out "$work/m.jsonl"
expect_error "replace the chart"  report "$work/m.jsonl" --out "$work/r.svg" --csv "$work/./r.svg"
# A resume with nothing left to train (train.steps at or below the checkpoint's step).
"$strata" train --set train.steps=2 --set eval.batches=0 --set log.metrics= \
  --set checkpoint.dir="$work/ck" --set checkpoint.every=2 >/dev/null 2>&1 ||
  { echo "FAIL: the run to resume did not run"; failures=$((failures + 1)); }
expect_error "nothing is left to train" train --resume "$work/ck"
# Exported weights go to a folder of their own, not among a run's checkpoints.
expect_error "is a checkpoint folder" checkpoint export "$work/ck" --out "$work/ck"
expect_error "is a checkpoint folder" checkpoint export "$work/ck" --out "$work/ck/step_2"
expect_error "is checkpoint.dir"  train --set checkpoint.dir="$work/ck_new" --out "$work/./ck_new/"
# A resumed run goes on saving where it was resumed from: a copy of the folder, resumed from
# another working directory, gets the new step (not the original, not the working directory).
cp -r "$work/ck" "$work/ck_copy"
mkdir -p "$work/elsewhere"
(cd "$work/elsewhere" && "$strata" train --resume ../ck_copy --set train.steps=3 --set log.metrics= \
  >/dev/null 2>&1) || { echo "FAIL: the resume of a copied folder"; failures=$((failures + 1)); }
if [ -d "$work/ck_copy/step_3" ] && [ ! -e "$work/ck/step_3" ] && [ -z "$(ls "$work/elsewhere")" ]; then
  echo "ok: a resumed run saves into the folder it was resumed from"
else
  echo "FAIL: a resume of ck_copy saved elsewhere: $(ls "$work/ck" "$work/ck_copy" "$work/elsewhere")"
  failures=$((failures + 1))
fi
# eval writes none of a run's files: a training config's metrics file and checkpoint folder stay.
cp "$work/m.jsonl" "$work/m_keep.jsonl"
"$strata" eval --set eval.batches=1 --set log.metrics="$work/m.jsonl" --set checkpoint.dir="$work/ck" \
  >/dev/null 2>&1 || { echo "FAIL: eval with a training config's outputs"; failures=$((failures + 1)); }
cmp -s "$work/m.jsonl" "$work/m_keep.jsonl" || { echo "FAIL: eval changed log.metrics"; failures=$((failures + 1)); }
# --init-from gives the model, to plan as to train: a folder that is not there is an error, and a
# --set of a model key that contradicts its config.json is one too (it was dropped in silence).
"$strata" train --set train.steps=1 --set eval.batches=0 --set log.metrics= --out "$work/hf" \
  >/dev/null 2>&1 || { echo "FAIL: the run writing --out did not run"; failures=$((failures + 1)); }
expect_error "$work/nope"         plan --init-from "$work/nope"
expect_error "contradicts --init-from" plan --init-from "$work/hf" --set model.dim=96
expect_error "contradicts --init-from" train --init-from "$work/hf" --set model.n_layers=7
# Weights of another model than config.json says (4 layers in the file, 3 in the config): the
# tensors of layer 3 would be dropped in silence.
mkdir -p "$work/hf3"
cp "$work/hf/model.safetensors" "$work/hf3/"
sed 's/"num_hidden_layers": 4/"num_hidden_layers": 3/' "$work/hf/config.json" >"$work/hf3/config.json"
expect_error "model.layers.3."    train --init-from "$work/hf3" --set train.steps=1

# And one command that must succeed: bench checkpoint saves, then times a resume of what it saved
# (a resume with nothing left to train is refused, so it resumes with one step to go).
tiny=(--set model.dim=64 --set model.n_layers=2 --set model.ffn_dim=128 --set model.n_heads=4
      --set model.n_kv_heads=4)
if out=$("$strata" bench checkpoint --dir "$work/bench_ck" "${tiny[@]}" 2>&1); then
  echo "ok: strata bench checkpoint -> $(tail -n 1 <<<"$out")"
else
  echo "FAIL: strata bench checkpoint: $out"
  failures=$((failures + 1))
fi

if [ $failures -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all cases passed"
