#!/usr/bin/env bash
# tests/scripts/test_gpu_bundle.sh — the bundle of scripts/gpu-bundle.sh carries everything it
# needs but the base system (glibc, libstdc++, libgcc_s) and, in a CUDA bundle, the CUDA
# libraries the GPU host provides. It builds a CPU-only bundle (--cpu-only: the same packing as
# the CUDA bundle, without the hour nvcc takes on two cores) into WORK_DIR, or checks the one
# given with --bundle, restores its xz-compressed libraries (gpu-check.sh --unpack), then:
#   1. ldd of every bundled program, with no LD_LIBRARY_PATH: each library resolves into the
#      bundle's lib/, or is a base-system or CUDA library;
#   2. `strata info` and one CPU training step with LD_LIBRARY_PATH empty and LD_DEBUG=libs:
#      every library the process loads, dlopen'ed ones included, is the bundle's or base-system,
#      and every library the bundle lists (lib/SOURCES) is loaded from it;
#   3. the same two commands chrooted into a root that holds only the base-system libraries
#      (and the host's CUDA libraries for a CUDA bundle) — no Debian -dev package or anything
#      else of this machine visible. Needs a mount namespace (root, or unprivileged user
#      namespaces); where there is none, this step is reported as not run and 1–2 stand;
#   4. a control: the same checks on a copy missing libtbbmalloc (dlopen'ed) and then libtbb
#      must fail, so a check that cannot fail does not pass.
# Usage: test_gpu_bundle.sh SOURCE_DIR WORK_DIR [--bundle DIR]
# Exit status: 0 passed; 1 failed; 77 skipped (a tool this test needs is missing).
set -uo pipefail

root="$1"
work="$2"
shift 2
bundle=""
[ "${1:-}" = --bundle ] && bundle="$(readlink -f "$2")"

fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in ldd readlink; do
  command -v "$tool" >/dev/null || { echo "SKIPPED: $tool not found (it lists the libraries a program loads)"; exit 77; }
done
mkdir -p "$work"
work="$(readlink -f "$work")"

if [ -z "$bundle" ]; then
  echo "== building the CPU-only bundle (scripts/gpu-bundle.sh --cpu-only)"
  t0=$SECONDS
  bash "$root/scripts/gpu-bundle.sh" --cpu-only --jobs "${STRATA_TEST_JOBS:-2}" \
    --build-dir "$work/build" --out "$work/bundle" || fail "scripts/gpu-bundle.sh --cpu-only failed"
  echo "   built and packed in $((SECONDS - t0)) s"
  bundle="$work/bundle"
fi

# The base system: glibc, and the C++ runtime every distribution installs.
is_base() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|\
    libresolv.so.*|libutil.so.*|libmvec.so.*|libstdc++.so.*|libgcc_s.so.*) return 0 ;;
  esac
  return 1
}
is_cuda() {
  case "$1" in libcuda.so.*|libcudart.so.*|libcublas*.so.*|libnccl.so.*|libnvidia*) return 0 ;; esac
  return 1
}
in_lib() { [ "$(readlink -f "$(dirname "$1")")" = "$(readlink -f "$2/lib")" ]; }

# 1. Static: ldd of each program. Prints the offending libraries; non-zero when there are any.
check_ldd() {
  local b=$1 bad=0 p soname arrow path
  for p in "$b"/bin/*; do
    while read -r soname arrow path _; do
      [ "$arrow" = "=>" ] || { path="$soname"; soname="$(basename "$soname")"; }
      if [ "$path" = not ]; then
        is_cuda "$soname" && continue  # a CUDA bundle on a machine without the toolkit
        echo "   $(basename "$p"): $soname not found"; bad=1
      elif ! in_lib "$path" "$b" && ! is_base "$soname" && ! is_cuda "$soname"; then
        echo "   $(basename "$p"): $soname resolves to $path, outside the bundle"; bad=1
      fi
    done < <(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH= ldd "$p" | sed 's/ (0x[0-9a-f]*)$//')
  done
  return $bad
}

# 2. At run time: the libraries strata info and a training step load (LD_DEBUG=libs).
run_strata() {  # run_strata BUNDLE LOG: info, then one training step, in WORK_DIR
  local b=$1 log=$2
  (cd "$work" &&
    env -i PATH=/usr/bin:/bin HOME="$work" LD_LIBRARY_PATH= LD_DEBUG=libs "$b/bin/strata" info >"$log.info" 2>"$log" &&
    env -i PATH=/usr/bin:/bin HOME="$work" LD_LIBRARY_PATH= LD_DEBUG=libs "$b/bin/strata" train \
      --set train.steps=1 --set eval.batches=0 >"$log.train" 2>>"$log")
}
check_runtime() {
  local b=$1 bad=0 path
  if ! run_strata "$b" "$work/runtime.log"; then
    echo "   strata info or the training step failed:"
    grep -v '^ *[0-9]*:' "$work/runtime.log" | tail -5 | sed 's/^/     /'
    return 1
  fi
  local loaded
  loaded="$(grep 'calling init: ' "$work/runtime.log" | sed 's/.*calling init: //' | sort -u)"
  while read -r path; do
    in_lib "$path" "$b" || is_base "$(basename "$path")" || is_cuda "$(basename "$path")" ||
      { echo "   loaded $path, outside the bundle"; bad=1; }
  done <<<"$loaded"
  # Each library the bundle lists (lib/SOURCES) was loaded from it: one that libtbb dlopens
  # (libtbbmalloc) and cannot find is skipped silently, not loaded from elsewhere.
  while read -r path; do
    grep -qx "$(readlink -f "$b/lib")/$(basename "$path")" <<<"$(xargs -n1 readlink -f <<<"$loaded")" ||
      { echo "   $path (listed in lib/SOURCES) was not loaded from the bundle"; bad=1; }
  done < <(awk '$1 ~ /^lib\/[^/]+$/ {print $1}' "$b/lib/SOURCES")
  return $bad
}

# 3. In a root with only the base system (and the host's CUDA libraries, bind-mounted).
# The namespace must allow what step 3 does: bind mounts, a tmpfs and chroot. chroot(1) exits 127
# when it changed root but found no command there (the probe root is empty), 125 when it could
# not change root.
namespace=()
namespace_note="tried"
probe="$work/probe"
if command -v unshare >/dev/null && command -v chroot >/dev/null; then
  # Propagation private (unshare's default, said explicitly): the bind mounts never reach this
  # machine's mount table, so removing the root afterwards removes only its own files.
  for ns in "unshare --mount --propagation private --fork" \
            "unshare --user --map-root-user --mount --propagation private --fork"; do
    rm -rf "$probe"
    mkdir -p "$probe/proc" "$probe/dev" "$probe/sys" "$probe/tmp"
    # shellcheck disable=SC2086
    $ns bash -c "mount --rbind /proc '$probe/proc' && mount --rbind /dev '$probe/dev' &&
                 mount --rbind /sys '$probe/sys' && mount -t tmpfs none '$probe/tmp' &&
                 exec $(command -v chroot) '$probe' /none" >/dev/null 2>&1
    rc=$?
    if [ $rc = 127 ]; then read -r -a namespace <<<"$ns"; break; fi
    namespace_note+="; $ns: the mounts or chroot failed (exit $rc)"
  done
else
  namespace_note="no unshare or chroot here"
fi
rm -rf "$probe"
check_minimal_root() {
  local b=$1 r="$work/root" soname arrow path libs=() cuda=()
  rm -rf "$r"
  mkdir -p "$r/lib64" "$r/lib/x86_64-linux-gnu" "$r/proc" "$r/dev" "$r/sys" "$r/tmp" "$r/bundle" "$r/host-cuda"
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || { path="$soname"; soname="$(basename "$soname")"; }
    [ "$path" = not ] && continue
    case "$soname" in linux-vdso*) continue ;; esac
    if is_base "$soname"; then
      case "$soname" in
        ld-linux*) cp -L "$path" "$r/lib64/$soname" ;;
        *) cp -L "$path" "$r/lib/x86_64-linux-gnu/$soname" ;;
      esac
      libs+=("$soname")
    elif is_cuda "$soname"; then
      touch "$r/host-cuda/$soname"
      cuda+=("$path")
    fi
  done < <(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH= ldd "$b/bin/strata" | sed 's/ (0x[0-9a-f]*)$//')
  local mounts="mount --rbind /proc '$r/proc' && mount --rbind /dev '$r/dev' && mount --rbind /sys '$r/sys'"
  mounts+=" && mount -t tmpfs none '$r/tmp' && mount --bind '$b' '$r/bundle'"
  for path in "${cuda[@]}"; do mounts+=" && mount --bind '$(readlink -f "$path")' '$r/host-cuda/$(basename "$path")'"; done
  local chroot_bin
  chroot_bin="$(command -v chroot)" || { echo "   chroot not found"; return 1; }
  local run="env -i PATH=/bundle/bin HOME=/tmp LD_LIBRARY_PATH=/host-cuda $chroot_bin '$r'"
  local extra=""
  [ ${#cuda[@]} -gt 0 ] && extra=" + ${#cuda[@]} CUDA libraries of this machine"
  echo "   root: ${libs[*]}$extra"
  "${namespace[@]}" bash -c "$mounts && $run /bundle/bin/strata info && $run /bundle/bin/strata train \
      --set train.steps=1 --set eval.batches=0" >"$work/root.log" 2>&1 || {
    echo "   strata failed in the minimal root:"; tail -5 "$work/root.log" | sed 's/^/     /'; return 1; }
}

echo "== bundle $bundle ($(du -sh "$bundle" | cut -f1) as carried)"
for f in bin/strata lib/SOURCES gpu-check.sh bundle.env bundle.json tests.tsv; do
  [ -e "$bundle/$f" ] || fail "the bundle has no $f"
done
# The large libraries travel xz-compressed; the bundle's own script restores them.
bash "$bundle/gpu-check.sh" --unpack || fail "gpu-check.sh --unpack failed"
echo "== 1. ldd of $(ls "$bundle/bin" | paste -sd' ' -) with no LD_LIBRARY_PATH"
check_ldd "$bundle" || fail "a library resolves outside the bundle (above)"
echo "== 2. strata info and one training step, LD_LIBRARY_PATH empty, LD_DEBUG=libs"
check_runtime "$bundle" || fail "the process loaded a library from outside the bundle (above)"
sed -n '1,2p' "$work/runtime.log.info" | sed 's/^/   /'
grep -q 'mpi OFF' "$work/runtime.log.info" || fail "the bundled strata was built with MPI (strata info: $(sed -n 2p "$work/runtime.log.info"))"
grep '^done:' "$work/runtime.log.train" | sed 's/^/   /'
echo "   loaded from the bundle: $(grep 'calling init: ' "$work/runtime.log" | sed 's/.*calling init: //' | sort -u |
  while read -r p; do in_lib "$p" "$bundle" && basename "$p"; done | paste -sd' ' -)"
if [ ${#namespace[@]} -gt 0 ]; then
  echo "== 3. the same in a root with only the base system (${namespace[*]} + chroot)"
  check_minimal_root "$bundle" || fail "strata does not run from the bundle on a bare base system"
  grep '^done:' "$work/root.log" | sed 's/^/   /'
else
  echo "== 3. not run: no namespace here allows the bind mounts and chroot ($namespace_note)"
fi

echo "== 4. control: the checks fail on a bundle missing a library"
broken="$work/broken"
rm -rf "$broken"
cp -al "$bundle" "$broken"  # hard links: a cheap copy whose lib/ can lose files
rm -f "$broken/lib/libtbbmalloc.so.2"
check_runtime "$broken" >/dev/null && fail "the run-time check passed without libtbbmalloc (dlopen'ed by libtbb)"
echo "   without libtbbmalloc.so.2: the run-time check fails (libtbb's dlopen finds nothing and it falls back to malloc)"
rm -f "$broken/lib/libtbb.so.12"
check_ldd "$broken" >/dev/null && fail "the ldd check passed without libtbb"
echo "   without libtbb.so.12: the ldd check fails"
if [ ${#namespace[@]} -gt 0 ]; then
  check_minimal_root "$broken" >/dev/null && fail "strata ran in the minimal root without libtbb"
  echo "   without libtbb.so.12: strata does not start in the minimal root"
fi
rm -rf "$broken" "$work/root"
echo "PASS: the bundle is self-contained"
