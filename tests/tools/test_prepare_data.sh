#!/usr/bin/env bash
# tools/prepare_data.py and tools/check_export.py end to end (prepare_data_e2e.py says what is
# checked). Python-gated: the interpreter is ${STRATA_PYTHON:-python3}; when it cannot import
# tokenizers, transformers and torch (tools/requirements.txt) the test exits 77, which CTest
# reports as Skipped with this script's reason. The C++ build and the other tests never need Python.
# Usage: test_prepare_data.sh STRATA_BINARY REPO_ROOT WORK_DIR
set -u
strata=$1
repo=$2
work=$3
py=${STRATA_PYTHON:-python3}
hint="set STRATA_PYTHON to a Python that has tools/requirements.txt"

skip() {  # the reason, then the block `make test` repeats after CTest's summary
  echo "skipped: $1"
  echo "SKIPPED: all checks of test_prepare_data skipped (exit status 77, which CTest reports as Skipped), because:"
  echo "  $1"
  exit 77
}
command -v "$py" >/dev/null 2>&1 || skip "$py not found; $hint"
for pkg in tokenizers transformers torch; do
  "$py" -c "import $pkg" >/dev/null 2>&1 || skip "$pkg not importable by $py; $hint"
done

rm -rf "$work"
mkdir -p "$work"
exec "$py" "$repo/tests/tools/prepare_data_e2e.py" --strata "$strata" --repo "$repo" --work "$work"
