#!/usr/bin/env bash
# The README's fine-tuning example end to end, on a tiny model (label slow): make a model with its
# own tokenizer (tools/make_tiny_model.py), prepare train/val token files from the repository's
# docs (tools/prepare_data.py), fine-tune with examples/finetune.toml and eval.every, draw the
# report, export with --out and load the export in transformers (tools/check_export.py), whose
# loss must equal `strata eval`'s. Python-gated like test_prepare_data: exit 77 (Skipped) with
# the reason when ${STRATA_PYTHON:-python3} cannot import tools/requirements.txt.
# Usage: test_finetune_e2e.sh STRATA_BINARY REPO_ROOT WORK_DIR
set -u
strata=$1
repo=$2
work=$3
py=${STRATA_PYTHON:-python3}
hint="set STRATA_PYTHON to a Python that has tools/requirements.txt"

skip() {
  echo "skipped: $1"
  echo "SKIPPED: all checks of test_finetune_e2e skipped (exit status 77, which CTest reports as Skipped), because:"
  echo "  $1"
  exit 77
}
command -v "$py" >/dev/null 2>&1 || skip "$py not found; $hint"
for pkg in tokenizers transformers torch; do
  "$py" -c "import $pkg" >/dev/null 2>&1 || skip "$pkg not importable by $py; $hint"
done

fail() { echo "FAIL: $*"; exit 1; }
step() { echo "== $*"; }
rm -rf "$work"
mkdir -p "$work/finetune"
cd "$work" || fail "cannot enter $work"
# The example's relative paths (finetune/...) resolve under the work folder.
cp "$repo/examples/finetune.toml" finetune.toml

step "make a model with its own tokenizer"
"$py" "$repo/tools/make_tiny_model.py" --out finetune/tiny-llama --vocab 1024 --dim 64 --layers 2 \
  --ffn 176 "$repo"/docs/*.md "$repo/README.md" || fail "make_tiny_model.py"

step "prepare the data"
"$py" "$repo/tools/prepare_data.py" --tokenizer finetune/tiny-llama --out finetune/train.bin \
  --val-fraction 0.1 --val-out finetune/val.bin --no-progress "$repo/docs/*.md" "$repo/README.md" \
  || fail "prepare_data.py"

step "fine-tune (40 steps, eval every 10)"
"$strata" train --config finetune.toml --init-from finetune/tiny-llama --set train.steps=40 \
  --set train.warmup_steps=4 --set eval.every=10 --set checkpoint.every=20 --out finetune/tuned \
  > train.out 2> train.err || { cat train.out train.err; fail "strata train"; }
cat train.out
grep -q "best .* at step" train.out || fail "the summary has no best eval loss"
grep -q "(2 layers, dim 64," train.out || fail "the first line does not describe --init-from's model"
evals=$("$py" -c '
import json
rows = [json.loads(l) for l in open("finetune/metrics.jsonl")]
ev = [(r["step"], r["eval_loss"]) for r in rows if "eval_loss" in r]
print(" ".join(f"{s}:{e:.6f}" for s, e in ev))
steps = [s for s, _ in ev]
assert steps == [10, 20, 30, 40], f"eval_loss on steps {steps}, expected 10 20 30 40"
assert ev[-1][1] < ev[0][1], f"eval loss did not fall: {ev}"
') || fail "metrics: $evals"
echo "eval losses (step:loss): $evals"
[ -f finetune/checkpoints/latest ] || fail "no checkpoint written"

step "report"
"$strata" report finetune/metrics.jsonl --out finetune/report.svg --csv finetune/report.csv \
  || fail "strata report"
grep -q "</svg>" finetune/report.svg || fail "report.svg is not a whole SVG"
grep -q "eval" finetune/report.csv || fail "report.csv has no eval column"

step "export loads in transformers with strata's loss"
loss=$("$strata" eval --config finetune.toml --init-from finetune/tuned 2>/dev/null | tail -1 |
       "$py" -c 'import json, sys; print(json.load(sys.stdin)["eval_loss"])') || fail "strata eval"
batches=$(grep -E '^batches' finetune.toml | sed -E 's/[^0-9]*([0-9]+).*/\1/')
seq=$(grep -E '^seq_len' finetune.toml | sed -E 's/[^0-9]*([0-9]+).*/\1/')
mb=$(grep -E '^micro_batch' finetune.toml | sed -E 's/[^0-9]*([0-9]+).*/\1/')
"$py" "$repo/tools/check_export.py" finetune/tuned --tokens finetune/val.bin --seq-len "$seq" \
  --micro-batch "$mb" --batches "$batches" --expect-loss "$loss" --rtol 1e-6 || fail "check_export.py"
echo "PASS: fine-tuning example end to end"
