#!/usr/bin/env bash
# scripts/fuzz.sh — builds the libFuzzer targets of tests/fuzz (clang 14, AddressSanitizer with
# its leak checker, UndefinedBehaviorSanitizer) in their own build directory, runs each target
# for N seconds, prints the executions per target, and exits non-zero on any crash, leak, timeout
# or out-of-memory, naming the file that reproduces it.
#
#   bash scripts/fuzz.sh [--seconds N] [--timeout S] [--jobs J] [--build DIR] [TARGET...]
#
# N: seconds per target (default 60). S: seconds one input may take before it counts as a hang
# (default 10). J: targets fuzzed at once, each one process on one core (default: the number of
# CPUs). DIR: the build directory (default build-fuzz). TARGETs: some of safetensors,
# safetensors_index, hf_config, config_toml, token_file, checkpoint_manifest, metrics_jsonl,
# rate_cache (default all).
# Each target starts from its committed seeds (tests/fuzz/corpus/<t>) and crash inputs
# (tests/fuzz/regressions/<t>), copied into DIR/fuzz/corpus/<t>: libFuzzer adds what it finds
# there, never to the committed corpus. A crash file is written to DIR/fuzz/artifacts/<t>/;
# reproduce it with `DIR/tests/fuzz/fuzz_<t> FILE`, then commit it under
# tests/fuzz/regressions/<t>/ so the unit test replays it. It does not minimize or merge corpora.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds=60
timeout=10
jobs=$(nproc)
build="$root/build-fuzz"
all_targets=(safetensors safetensors_index hf_config config_toml token_file checkpoint_manifest
  metrics_jsonl rate_cache)
targets=()

usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="${2:?--seconds needs a value}"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    --timeout) timeout="${2:?--timeout needs a value}"; shift 2 ;;
    --timeout=*) timeout="${1#*=}"; shift ;;
    --build) build="${2:?--build needs a directory}"; shift 2 ;;
    --jobs) jobs="${2:?--jobs needs a value}"; shift 2 ;;
    --jobs=*) jobs="${1#*=}"; shift ;;
    --build=*) build="${1#*=}"; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
for v in "$seconds" "$timeout" "$jobs"; do
  if ! [[ "$v" =~ ^[1-9][0-9]*$ ]]; then
    echo "fuzz.sh: '$v' is not a whole number >= 1 (--seconds, --timeout, --jobs)" >&2; exit 2
  fi
done
[ ${#targets[@]} -eq 0 ] && targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  if [[ ! " ${all_targets[*]} " =~ " $t " ]]; then
    echo "fuzz.sh: unknown target '$t'; targets: ${all_targets[*]}" >&2; exit 2
  fi
done

bash "$root/scripts/install-deps.sh" --fuzz || exit 1

echo "== configure and build $build (clang-14, ASan + UBSan + libFuzzer)"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DSTRATA_CUDA=OFF -DSTRATA_BUILD_TESTS=OFF -DSTRATA_BUILD_BENCH=OFF -DSTRATA_FUZZ=ON \
  > "$build/configure.log" 2>&1 || { cat "$build/configure.log" >&2; exit 1; }
cmake --build "$build" -j"$(nproc)" --target strata_fuzz || exit 1

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-$(command -v llvm-symbolizer-14 || true)}"

# fuzz_one T: runs target T for $seconds from its corpus; its exit status goes to $log.rc.
fuzz_one() {
  local t=$1 corpus="$build/fuzz/corpus/$1" artifacts="$build/fuzz/artifacts/$1"
  local log="$build/fuzz/logs/$1.log" dict=()
  [ -f "$root/tests/fuzz/dict/$t.dict" ] && dict=("-dict=$root/tests/fuzz/dict/$t.dict")
  "$build/tests/fuzz/fuzz_$t" "$corpus" "${dict[@]}" \
    -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" > "$log" 2>&1
  echo $? > "$log.rc"
}

# Each target is one single-threaded process: up to $jobs of them run at once, each for the whole
# $seconds (parallel runs shorten the stage, not a target's fuzzing).
for t in "${targets[@]}"; do
  corpus="$build/fuzz/corpus/$t"
  mkdir -p "$corpus" "$build/fuzz/artifacts/$t" "$build/fuzz/logs"
  rm -f "$build/fuzz/logs/$t.log.rc"
  for src in "$root/tests/fuzz/corpus/$t" "$root/tests/fuzz/regressions/$t"; do
    [ -d "$src" ] && cp -f "$src"/* "$corpus"/ 2>/dev/null
  done
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  echo "== fuzz_$t: ${seconds}s (log: $build/fuzz/logs/$t.log)"
  fuzz_one "$t" &
done
wait

failed=0
summary=()
for t in "${targets[@]}"; do
  corpus="$build/fuzz/corpus/$t"
  log="$build/fuzz/logs/$t.log"
  rc=$(cat "$log.rc" 2>/dev/null || echo "no exit status")
  execs="$(awk '/stat::number_of_executed_units:/ {print $2}' "$log" | tail -1)"
  per_s="$(awk '/stat::average_exec_per_sec:/ {print $2}' "$log" | tail -1)"
  units="$(wc -l < <(ls "$corpus"))"
  artifact="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
  if [ "$rc" = 0 ] && [ -z "$artifact" ]; then
    result="ok"
  else
    failed=1
    kind="$(grep -o -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer): [a-z-]+|runtime error|deadly signal|timeout|out-of-memory' "$log" | head -1)"
    result="FAILED (exit $rc${kind:+; $kind})"
    echo "-- fuzz_$t failed; the end of its log:" >&2
    tail -n 40 "$log" >&2
    [ -n "$artifact" ] && echo "-- crash input: $artifact" >&2 &&
      echo "   reproduce: $build/tests/fuzz/fuzz_$t $artifact" >&2
  fi
  summary+=("$(printf '%-19s %12s execs %8s/s %6s corpus  %s%s' "$t" "${execs:-?}" "${per_s:-?}" \
    "$units" "$result" "${artifact:+  crash: $artifact}")")
done

echo "== fuzz summary (${seconds}s per target)"
printf '%s\n' "${summary[@]}"
exit $failed
