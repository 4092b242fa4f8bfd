#!/usr/bin/env bash
# scripts/gpu-check.sh — the proof on a GPU, run from the bundle of scripts/gpu-bundle.sh on a
# host that has the NVIDIA driver and the CUDA libraries (a CUDA toolkit, or the nvidia-* Python
# packages) but none of strata's build dependencies: nothing is built there. It
#   1. finds libcudart, libcublas(Lt) and libnccl on the host — $STRATA_CUDA_LIB_DIRS, the
#      toolkit (CUDA_HOME, nvcc's, /usr/local/cuda), python3's nvidia/*/lib folders, the ld.so
#      cache, in that order — sets LD_LIBRARY_PATH to their folders and prints which it used;
#   2. checks the host's glibc and libstdc++ against what the bundle needs;
#   3. runs `strata info --json`, every gpu test entry the bundle lists (tests.tsv), `strata
#      bench gpu --json` and, when python3 imports torch, torch.matmul at the same GEMM shapes;
#   4. writes everything — and for whatever could not run, why — into one JSON file:
#      <results>/<gpu>-<date>.json (the test logs beside it, in <gpu>-<date>-logs/).
# Each phase has its own time limit inside an overall budget (default 470 s: under the 8 minutes
# one H200 allows).
#
# Usage:
#   bundle/gpu-check.sh [--results DIR] [--out FILE] [--nvme-path DIR] [--budget S]
#   bundle/gpu-check.sh --unpack      # only restore the xz-compressed libraries, then exit
#   scripts/gpu-check.sh [--bundle DIR] [--build] [...]   # from a checkout: the bundle at
#       bundle/ (--bundle DIR: another); --build makes it first with scripts/gpu-bundle.sh
# Exit status: 0 everything ran and passed; 1 something failed or could not run (see the JSON: a
# gpu test entry reported Skipped on a GPU is a failure); 2 no NVIDIA GPU was found (the JSON
# says so too, after the library discovery and `strata info`, which run anyway).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bundle=""
build=0
results=""
out=""
nvme=""
budget=470
unpack_only=0
python="${STRATA_PYTHON:-python3}"
while [ $# -gt 0 ]; do
  case "$1" in
    --bundle) bundle="$2"; shift 2 ;;
    --build) build=1; shift ;;
    --results) results="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --nvme-path) nvme="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --unpack) unpack_only=1; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

# The figures `strata bench gpu` measures (bench/gpu_bench.h), set here so that they can be tuned
# on the GPU host without rebuilding the bundle. Training: a ≈1B-parameter Llama (974M: dim 2048,
# 16 layers, 32 heads / 8 KV heads, FFN 8192, byte vocabulary) in bf16, micro-batches of
# 8 × 1024 tokens, all on the device (36.7 GiB planned; goal: MFU ≥ 45 % of the bf16 peak); then
# the optimizer and gradients on host with offload.device_mem_limit a quarter of the all-device
# run's state bytes (16.3 GiB -> 4.1 GiB), which fits with activation checkpointing and
# micro-batches of 2 × 1024 (`strata plan`: 3.99 GiB). Tokens/s and MFU of both side by side.
# lr 3e-4 (the default 3e-3 with 2 warm-up steps made the 1B model's loss climb from 6.1 to 8.1 in
# six steps on the first H200 run); the all-device run is repeated with f32 GEMMs beside it.
bench_args=(
  --adam-steps 5
  --train-steps 6
  --train-set model.dim=2048 --train-set model.n_layers=16 --train-set model.n_heads=32
  --train-set model.n_kv_heads=8 --train-set model.ffn_dim=8192 --train-set model.max_seq_len=1024
  --train-set data.seq_len=1024 --train-set data.micro_batch=8 --train-set train.precision=bf16
  --train-set train.lr=3e-4
  --offload-set offload.optimizer=host --offload-set offload.grads=host
  --offload-set zero.activation_checkpointing=true --offload-set data.micro_batch=2
  --offload-limit 0.25
)
# Seconds each phase may take at most, inside the overall budget.
tests_seconds=150
bench_seconds=330  # the H200 run of 2026-12-04 took 211 s
torch_seconds=45

start=$(date +%s)
elapsed() { echo $(( $(date +%s) - start )); }
remaining() { echo $(( budget - $(elapsed) )); }
# A phase's limit: its own share, but never past the overall budget (keeping 10 s to write up).
limit() { local r=$(( $(remaining) - 10 )); [ "$1" -lt "$r" ] && echo "$1" || echo $(( r > 1 ? r : 1 )); }
log() { echo "gpu-check [$(elapsed)s]: $*" >&2; }

# JSON string escaping for reasons and log tails.
jstr() {
  local s="$1"
  s="${s//\\/\\\\}"; s="${s//\"/\\\"}"; s="${s//$'\n'/\\n}"; s="${s//$'\r'/}"; s="${s//$'\t'/ }"
  printf '"%s"' "$s"
}
tail_of() { tail -c 1500 "$1" 2>/dev/null | tr -d '\000'; }
not_run() { printf '{"ran": false, "reason": %s}' "$(jstr "$1")"; }
workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
failures=()  # one line per failure, for the summary and the exit status

# ---- the GPU ---------------------------------------------------------------------------------
gpu_name="unknown-gpu"; gpu_cc=""; gpu_mem=""; driver=""; line=""
if command -v nvidia-smi >/dev/null 2>&1 &&
   line="$(nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)" &&
   [ -n "$line" ]; then
  IFS=',' read -r gpu_name gpu_cc gpu_mem driver <<<"$line"
  gpu_name="$(echo "$gpu_name" | xargs)"; gpu_cc="$(echo "$gpu_cc" | xargs)"
  gpu_mem="$(echo "$gpu_mem" | xargs)"; driver="$(echo "$driver" | xargs)"
fi
have_gpu=0
[ "$gpu_name" != "unknown-gpu" ] && have_gpu=1
slug="$(echo "$gpu_name" | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9]\+/-/g; s/^-//; s/-$//')"
[ -z "$slug" ] && slug="unknown-gpu"
[ "$unpack_only" = 1 ] || log "GPU: ${gpu_name} (compute capability ${gpu_cc:-?}, ${gpu_mem:-?}, driver ${driver:-?})"

# ---- the bundle ------------------------------------------------------------------------------
# Run from inside a bundle, it is that bundle; run from a checkout's scripts/, bundle/ (or
# --bundle), made first with --build.
if [ -z "$bundle" ] && [ -x "$here/bin/strata" ] && [ -f "$here/bundle.env" ]; then
  bundle="$here"
elif [ -z "$bundle" ]; then
  bundle="$(cd "$here/.." && pwd)/bundle"
fi
if [ "$build" = 1 ]; then
  [ -x "$here/gpu-bundle.sh" ] || { echo "gpu-check: --build needs a checkout (scripts/gpu-bundle.sh)" >&2; exit 1; }
  arch=90
  [ -n "$gpu_cc" ] && arch="$(echo "$gpu_cc" | tr -d '.')"
  log "building the bundle: scripts/gpu-bundle.sh --out $bundle --cuda-arch $arch"
  "$here/gpu-bundle.sh" --out "$bundle" --cuda-arch "$arch" || { echo "gpu-check: building the bundle failed" >&2; exit 1; }
fi
if [ ! -x "$bundle/bin/strata" ] || [ ! -f "$bundle/bundle.env" ]; then
  echo "gpu-check: no bundle at $bundle" >&2
  echo "hint: make one with scripts/gpu-bundle.sh (on a machine with the build dependencies), or pass --build or --bundle DIR" >&2
  exit 1
fi
bundle="$(cd "$bundle" && pwd)"
BUNDLE_COMMIT=unknown; BUNDLE_DIRTY=false; BUNDLE_CUDA=OFF; BUNDLE_CUDA_ARCH=""; BUNDLE_GLIBC=""
BUNDLE_GLIBCXX=""; BUNDLE_CXXABI=""; BUNDLE_CXX_GLIBC=""; BUNDLE_HOST_LIBS=""; BUNDLE_PACKED=""
# shellcheck disable=SC1091
. "$bundle/bundle.env"
# The libraries stored xz-compressed (gpu-bundle.sh: OpenBLAS) are restored in place, once.
for f in $BUNDLE_PACKED; do
  [ -e "$bundle/$f" ] && continue
  if command -v xz >/dev/null 2>&1; then
    xz -dc "$bundle/$f.xz" >"$bundle/$f.tmp"
  else
    "$python" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
      "$bundle/$f.xz" "$bundle/$f.tmp"
  fi && mv "$bundle/$f.tmp" "$bundle/$f" || {
    rm -f "$bundle/$f.tmp"
    echo "gpu-check: cannot unpack $f.xz (needs xz or $python, and a writable bundle)" >&2
    exit 1
  }
  echo "gpu-check: unpacked $f" >&2
done
[ "$unpack_only" = 1 ] && exit 0
[ -z "$results" ] && results="$bundle/results"
[ -z "$out" ] && out="$results/$slug-$(date +%Y-%m-%d).json"
mkdir -p "$(dirname "$out")"
logs="${out%.json}-logs"
mkdir -p "$logs"
log "bundle: $bundle (commit $BUNDLE_COMMIT, CUDA $BUNDLE_CUDA ${BUNDLE_CUDA_ARCH:+sm_$BUNDLE_CUDA_ARCH}); results -> $out"
[ "$BUNDLE_CUDA" = ON ] || failures+=("the bundle was built without CUDA (gpu-bundle.sh --cpu-only)")
if [ "$have_gpu" = 1 ] && [ -n "$BUNDLE_CUDA_ARCH" ] && [ -n "$gpu_cc" ] &&
   [ "$(echo "$gpu_cc" | tr -d '.')" != "$BUNDLE_CUDA_ARCH" ]; then
  failures+=("the bundle has code for sm_$BUNDLE_CUDA_ARCH, this GPU is compute capability $gpu_cc")
fi

# ---- the host's C library and C++ runtime ----------------------------------------------------
older() { [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" = "$1" ]; }
host_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
[ -z "$host_glibc" ] && host_glibc="$(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
# ldconfig lives in /sbin on some hosts, outside a user's PATH.
ldconfig_p() { { command -v ldconfig >/dev/null 2>&1 && ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null; }
cache_lookup() { ldconfig_p | awk -v s="$1" '$1 == s && /x86-64/ {print $NF; exit}'; }
host_libstdcxx="$(cache_lookup libstdc++.so.6)"
for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /usr/lib64 /lib64; do
  [ -z "$host_libstdcxx" ] && [ -e "$d/libstdc++.so.6" ] && host_libstdcxx="$d/libstdc++.so.6"
done
cxx_dirs=""
cxx_note="the host's $host_libstdcxx"
if [ -n "$BUNDLE_GLIBC" ] && [ -n "$host_glibc" ] && older "$host_glibc" "$BUNDLE_GLIBC"; then
  failures+=("this host's glibc $host_glibc is older than the $BUNDLE_GLIBC the bundle needs (it was built on a newer distribution)")
fi
if [ -n "$BUNDLE_GLIBCXX" ] && { [ -z "$host_libstdcxx" ] ||
     ! grep -aq "GLIBCXX_$BUNDLE_GLIBCXX" "$host_libstdcxx" || ! grep -aq "CXXABI_$BUNDLE_CXXABI" "$host_libstdcxx"; }; then
  if [ -n "$host_glibc" ] && ! older "$host_glibc" "$BUNDLE_CXX_GLIBC" && [ -d "$bundle/lib/cxx" ]; then
    cxx_dirs="$bundle/lib/cxx"
    cxx_note="the bundle's lib/cxx (the host's libstdc++ ${host_libstdcxx:-(none found)} lacks GLIBCXX_$BUNDLE_GLIBCXX or CXXABI_$BUNDLE_CXXABI)"
  else
    failures+=("this host's libstdc++ (${host_libstdcxx:-none}) lacks GLIBCXX_$BUNDLE_GLIBCXX or CXXABI_$BUNDLE_CXXABI, and its glibc $host_glibc is older than the $BUNDLE_CXX_GLIBC the bundle's spare libstdc++ needs")
  fi
fi
log "glibc $host_glibc (bundle needs $BUNDLE_GLIBC); C++ runtime: $cxx_note"

# ---- the CUDA libraries ----------------------------------------------------------------------
# Candidate folders, in order, each with the name of where it came from.
cand_dirs=(); cand_from=()
add_dirs() {  # add_dirs FROM DIR...
  local from=$1 d
  shift
  for d in "$@"; do
    [ -d "$d" ] || continue
    cand_dirs+=("$(cd "$d" && pwd -P)"); cand_from+=("$from")
  done
}
IFS=':' read -r -a user_dirs <<<"${STRATA_CUDA_LIB_DIRS:-}"
add_dirs "STRATA_CUDA_LIB_DIRS" "${user_dirs[@]}"
toolkits=()
for t in "${CUDA_HOME:-}" "${CUDA_PATH:-}" "$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")")" /usr/local/cuda; do
  [ -n "$t" ] && [ -d "$t" ] && toolkits+=("$t")
done
for t in "${toolkits[@]}"; do add_dirs "CUDA toolkit $t" "$t/lib64" "$t/lib" "$t/targets/x86_64-linux/lib"; done
if command -v "$python" >/dev/null 2>&1; then
  mapfile -t py_dirs < <("$python" -c '
import os
try:
    import nvidia
except ImportError:
    raise SystemExit(0)
for p in nvidia.__path__:
    for d in sorted(os.listdir(p)):
        if os.path.isdir(os.path.join(p, d, "lib")):
            print(os.path.join(p, d, "lib"))
' 2>/dev/null)
  add_dirs "python nvidia packages ($python)" "${py_dirs[@]}"
fi
declare -A lib_dir=() lib_from=()
lib_json=""
ld_dirs=()
for so in $BUNDLE_HOST_LIBS; do
  for i in "${!cand_dirs[@]}"; do
    if [ -e "${cand_dirs[$i]}/$so" ]; then lib_dir[$so]="${cand_dirs[$i]}"; lib_from[$so]="${cand_from[$i]}"; break; fi
  done
  if [ -z "${lib_dir[$so]:-}" ]; then
    p="$(cache_lookup "$so")"
    [ -n "$p" ] && { lib_dir[$so]="$(dirname "$p")"; lib_from[$so]="system (ld.so cache)"; }
  fi
  if [ -z "${lib_dir[$so]:-}" ]; then
    failures+=("$so was not found on this host (looked in: ${cand_dirs[*]:-no toolkit or python nvidia folder} and the ld.so cache); set STRATA_CUDA_LIB_DIRS")
    lib_json+="${lib_json:+, }$(jstr "$so"): {\"found\": false}"
    continue
  fi
  log "  $so: ${lib_dir[$so]} (${lib_from[$so]})"
  lib_json+="${lib_json:+, }$(jstr "$so"): {\"found\": true, \"dir\": $(jstr "${lib_dir[$so]}"), \"from\": $(jstr "${lib_from[$so]}")}"
  [ "${lib_from[$so]}" = "system (ld.so cache)" ] && continue
  case " ${ld_dirs[*]} " in *" ${lib_dir[$so]} "*) ;; *) ld_dirs+=("${lib_dir[$so]}") ;; esac
done
# The driver's libcuda.so.1, which libcudart dlopens: the ld.so cache, the usual driver folders,
# or the folders of the LD_LIBRARY_PATH this script was started with (kept, after ours: a
# container may point it at the driver).
host_ld_path="${LD_LIBRARY_PATH:-}"
driver_lib="$(cache_lookup libcuda.so.1)"
IFS=':' read -r -a host_ld_dirs <<<"$host_ld_path"
for d in "${host_ld_dirs[@]}" /usr/lib64/nvidia /usr/local/nvidia/lib64 /usr/lib/x86_64-linux-gnu /usr/lib64; do
  [ -z "$driver_lib" ] && [ -n "$d" ] && [ -e "$d/libcuda.so.1" ] && driver_lib="$d/libcuda.so.1"
done
if [ "$BUNDLE_CUDA" = ON ]; then
  log "  libcuda.so.1 (the driver): ${driver_lib:-not found}"
  [ "$have_gpu" = 1 ] && [ -z "$driver_lib" ] &&
    failures+=("the driver's libcuda.so.1 was not found (ld.so cache, the usual driver folders, LD_LIBRARY_PATH); set STRATA_CUDA_LIB_DIRS")
  case "$driver_lib" in
    "") ;;
    "$(cache_lookup libcuda.so.1)") ;;
    *) ld_dirs+=("$(dirname "$driver_lib")") ;;
  esac
fi
ld_path="$(IFS=:; echo "${cxx_dirs:+$cxx_dirs:}${ld_dirs[*]}")"
export LD_LIBRARY_PATH="$ld_path${host_ld_path:+:$host_ld_path}"
log "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
# Every library of every bundled program must now resolve.
missing=""
for p in "$bundle"/bin/*; do
  m="$(ldd "$p" 2>&1 | awk '/not found/ {print $1}' | paste -sd' ' -)"
  [ -n "$m" ] && missing+="$(basename "$p"): $m; "
done
[ -n "$missing" ] && failures+=("libraries not found: $missing")
ldd "$bundle/bin/strata" >"$logs/ldd-strata.txt" 2>&1
resolved_json="$(awk '$2 == "=>" {printf "%s\"%s\": \"%s\"", (n++ ? ", " : ""), $1, ($3 == "not" ? "not found" : $3)}' "$logs/ldd-strata.txt")"
libraries_json="{\"ld_library_path\": $(jstr "$LD_LIBRARY_PATH"), \"ld_library_path_before\": $(jstr "$host_ld_path"), \"cxx_runtime\": $(jstr "$cxx_note"), \"host_libraries\": {$lib_json}, \"driver\": $(jstr "${driver_lib:-not found}"), \"strata_resolves\": {$resolved_json}}"

# ---- strata info -----------------------------------------------------------------------------
info_json="$(not_run "strata info failed")"
if timeout "$(limit 30)" "$bundle/bin/strata" info --json >"$workdir/info.json" 2>"$workdir/info.err" &&
   [ -s "$workdir/info.json" ]; then
  info_json="$(cat "$workdir/info.json")"
  log "strata info: $(grep -o '"describe": *"[^"]*"' "$workdir/info.json" | head -1)"
else
  info_json="$(not_run "strata info failed: $(tail_of "$workdir/info.err")")"
  failures+=("strata info failed: $(tail -c 300 "$workdir/info.err")")
fi

# ---- the gpu tests ---------------------------------------------------------------------------
rel_errors() {  # rel_errors GTEST_JSON: {"Suite.Case": {"op": error, ...}, ...}; empty without python3
  [ -s "$1" ] && command -v "$python" >/dev/null 2>&1 || return 0
  LD_LIBRARY_PATH="$host_ld_path" "$python" - "$1" <<'EOF' 2>/dev/null
import json, math, sys
out = {}
for suite in json.load(open(sys.argv[1])).get("testsuites", []):
    for case in suite.get("testsuite", []):
        errs = {}
        for key, value in case.items():
            if key.startswith("max_rel_err."):
                v = float(value)
                errs[key[len("max_rel_err."):]] = v if math.isfinite(v) else str(v)
        if errs:
            out[suite["name"] + "." + case["name"]] = errs
print(json.dumps(out))
EOF
}
# Every entry of tests.tsv (CTest's label gpu, from the bundle's build tree) must pass: an entry
# whose tests all skipped exits 77, and on a GPU that is a failure. Entries the bundle cannot run
# (under mpirun: it has no MPI) are listed as left out, with the reason.
tests_json="$(not_run "no NVIDIA GPU found (nvidia-smi absent or silent)")"
if [ "$have_gpu" = 1 ]; then
  t0=$(date +%s)
  entries=""
  n_pass=0; n_fail=0; n_skip=0; n_out=0
  while IFS=$'\t' read -r name prog args; do
    [ -n "$name" ] || continue
    if [ "$prog" = - ]; then
      entries+="${entries:+, }{\"name\": $(jstr "$name"), \"result\": \"left out\", \"reason\": $(jstr "$args")}"
      n_out=$((n_out + 1)); continue
    fi
    tl="$logs/$name.log"
    t1=$(date +%s)
    left=$(( tests_seconds - (t1 - t0) ))
    # shellcheck disable=SC2086
    (cd "$workdir" && timeout -k 5 "$(limit $(( left > 1 ? left : 1 )))" "$bundle/bin/$prog" $args --gtest_color=no \
       --gtest_output="json:$logs/$name.gtest.json") >"$tl" 2>&1
    rc=$?
    case "$rc" in
      0) result=passed; n_pass=$((n_pass + 1)) ;;
      77) result=skipped; n_skip=$((n_skip + 1)) ;;
      124|137) result="timed out"; n_fail=$((n_fail + 1)) ;;
      *) result=failed; n_fail=$((n_fail + 1)) ;;
    esac
    # Per-case lines end in "(N ms)"; the summary's lists of names do not.
    ok=$(grep -cE '^\[       OK \] .* \([0-9]+ ms\)$' "$tl"); sk=$(grep -cE '^\[  SKIPPED \] .* \([0-9]+ ms\)$' "$tl")
    fl=$(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$tl")
    e="{\"name\": $(jstr "$name"), \"result\": \"$result\", \"exit_status\": $rc, \"cases_passed\": $ok, \"cases_skipped\": $sk, \"cases_failed\": $fl, \"seconds\": $(( $(date +%s) - t1 ))"
    [ "$result" != passed ] && e+=", \"log_tail\": $(jstr "$({ grep -E 'FAILED|Failure|SKIPPED|error' "$tl"; tail -5 "$tl"; } | tail -c 1500)")"
    # The largest relative error of each op against the CPU reference, per test case, as the
    # tests record them (max_rel_err.<op> properties of test_gpu_ops; gtest's JSON report).
    errs="$(rel_errors "$logs/$name.gtest.json")"
    [ -n "$errs" ] && [ "$errs" != "{}" ] && e+=", \"max_rel_err\": $errs"
    entries+="${entries:+, }$e}"
    log "  $name: $result ($ok cases passed, $sk skipped, $fl failed)"
    [ "$result" != passed ] && failures+=("gpu test $name $result (log: $tl)")
  done <"$bundle/tests.tsv"
  [ $((n_pass + n_fail + n_skip)) = 0 ] && failures+=("the bundle lists no gpu test")
  tests_json="{\"ran\": true, \"passed\": $n_pass, \"failed\": $n_fail, \"skipped\": $n_skip, \"left_out\": $n_out, \"seconds\": $(( $(date +%s) - t0 )), \"entries\": [$entries]}"
  log "tests: $n_pass passed, $n_fail failed, $n_skip skipped, $n_out left out"
fi

# ---- the benchmark ---------------------------------------------------------------------------
bench_json="$(not_run "no NVIDIA GPU found (nvidia-smi absent or silent)")"
if [ "$have_gpu" = 1 ]; then
  nvme_arg=()
  [ -n "$nvme" ] && nvme_arg=(--nvme-path "$nvme")
  log "strata bench gpu ${bench_args[*]} ${nvme_arg[*]}"
  if (cd "$workdir" && timeout -k 5 "$(limit "$bench_seconds")" "$bundle/bin/strata" bench gpu --json "${bench_args[@]}" \
        "${nvme_arg[@]}") \
       >"$workdir/bench.json" 2>"$logs/bench.err" && [ -s "$workdir/bench.json" ]; then
    bench_json="$(cat "$workdir/bench.json")"
    # A section that could not run is a failure, but for the NVMe placement without --nvme-path.
    while read -r reason; do
      [ -n "$reason" ] && failures+=("strata bench gpu: a section did not run: $reason")
    done < <(grep -o '"ran": *false, *"reason": *"\([^"\\]\|\\.\)*"' "$workdir/bench.json" |
             sed 's/.*"reason": *//' | grep -v 'no --nvme-path given')
  else
    bench_json="$(not_run "strata bench gpu failed or timed out: $(tail_of "$logs/bench.err")")"
    failures+=("strata bench gpu failed or timed out (log: $logs/bench.err)")
  fi
  log "bench done"
fi

# ---- torch.matmul beside it (optional) -------------------------------------------------------
torch_json="$(not_run "no NVIDIA GPU found (nvidia-smi absent or silent)")"
if [ "$have_gpu" = 1 ]; then
  # torch runs with the LD_LIBRARY_PATH this script was started with: it brings its own CUDA.
  if ! command -v "$python" >/dev/null 2>&1 ||
     ! LD_LIBRARY_PATH="$host_ld_path" "$python" -c 'import torch' >/dev/null 2>&1; then
    torch_json="$(not_run "optional: $python cannot import torch")"
  elif LD_LIBRARY_PATH="$host_ld_path" timeout -k 5 "$(limit "$torch_seconds")" "$python" - >"$workdir/torch.json" \
         2>"$logs/torch.err" <<'EOF' && [ -s "$workdir/torch.json" ]; then
import json, torch
# torch.matmul at strata's GEMM shapes: best of 5 batches of CUDA-event-timed calls. f32 with
# TF32 off (torch's default for matmul), so it is the same arithmetic as strata's f32 path.
torch.backends.cuda.matmul.allow_tf32 = False
out = {"ran": True, "torch": torch.__version__, "cuda": torch.version.cuda,
       "device": torch.cuda.get_device_name(0), "allow_tf32": False, "gemm": []}
for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "f32")):
    for n in (4096, 8192):
        a = torch.randn(n, n, device="cuda", dtype=dtype)
        b = torch.randn(n, n, device="cuda", dtype=dtype)
        for _ in range(3):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        best = float("inf")
        calls = 10 if n == 4096 else 3
        for _ in range(5):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(calls):
                torch.matmul(a, b)
            e.record()
            torch.cuda.synchronize()
            best = min(best, s.elapsed_time(e) / 1e3 / calls)
        out["gemm"].append({"dtype": name, "m": n, "n": n, "k": n, "tflops": 2 * n**3 / best / 1e12})
        del a, b
print(json.dumps(out))
EOF
    torch_json="$(cat "$workdir/torch.json")"
  else
    torch_json="$(not_run "torch.matmul failed or timed out: $(tail_of "$logs/torch.err")")"
  fi
  log "torch: $(echo "$torch_json" | head -c 200)"
fi

# ---- the results file ------------------------------------------------------------------------
[ "$have_gpu" = 1 ] || failures+=("no NVIDIA GPU found (nvidia-smi absent or silent)")
fail_json=""
for f in "${failures[@]}"; do fail_json+="${fail_json:+, }$(jstr "$f")"; done
{
  printf '{\n'
  printf '  "gpu": %s,\n  "compute_capability": %s,\n  "memory": %s,\n  "driver": %s,\n' \
    "$(jstr "$gpu_name")" "$(jstr "$gpu_cc")" "$(jstr "$gpu_mem")" "$(jstr "$driver")"
  printf '  "date": %s,\n  "host": {"name": %s, "glibc": %s, "cpu": %s, "cpus": %s},\n' \
    "$(jstr "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" "$(jstr "$(hostname)")" "$(jstr "$host_glibc")" \
    "$(jstr "$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')")" "$(nproc 2>/dev/null || echo 0)"
  printf '  "bundle": %s,\n' "$(cat "$bundle/bundle.json" 2>/dev/null || not_run "no bundle.json")"
  printf '  "commit": %s,\n  "uncommitted_changes": %s,\n' "$(jstr "$BUNDLE_COMMIT")" "$BUNDLE_DIRTY"
  printf '  "libraries": %s,\n  "info": %s,\n  "tests": %s,\n  "bench": %s,\n  "torch": %s,\n' \
    "$libraries_json" "$info_json" "$tests_json" "$bench_json" "$torch_json"
  printf '  "failures": [%s],\n  "seconds": %s\n}\n' "$fail_json" "$(elapsed)"
} >"$out"
log "wrote $out"
for f in "${failures[@]}"; do log "FAILED: $f"; done

[ "$have_gpu" = 1 ] || exit 2
[ ${#failures[@]} = 0 ] && exit 0
exit 1
