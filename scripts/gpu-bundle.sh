#!/usr/bin/env bash
# scripts/gpu-bundle.sh — builds, on this machine, what a bare GPU host runs: a Release tree with
# the CUDA backend for one architecture (sm_90 by default), then packs the `strata` binary, the
# gpu test binaries and every shared library they need that a bare host lacks into one folder:
#
#   bundle/bin/        strata and the gpu test binaries, stripped, RPATH $ORIGIN/../lib
#   bundle/lib/        oneTBB (+ libtbbmalloc, which it dlopens), OpenBLAS (+ libgfortran,
#                      libquadmath), liburing, toml++, xxHash — found with ldd, under their sonames
#   bundle/lib/cxx/    a spare libstdc++ and libgcc_s, outside the RPATH: gpu-check.sh puts it on
#                      LD_LIBRARY_PATH only when the host's libstdc++ is older than the bundle needs
#   bundle/gpu-check.sh, bundle/tests.tsv (the gpu test entries), bundle/bundle.env and
#   bundle/bundle.json (what was built, from which commit, and what the host must provide)
# Libraries over 8 MiB (OpenBLAS) are stored xz-compressed; `gpu-check.sh --unpack` restores them
# (every gpu-check.sh run does so first).
#
# What it leaves out: the base system — glibc (libc, libm, libpthread, libdl, librt, ld-linux:
# the host's own, ld.so must match libc), libstdc++ and libgcc_s (every distribution's base;
# Debian 12's libstdc++ needs glibc 2.36, which would shut out Ubuntu 22.04, hence the spare) —
# and the CUDA toolkit and driver libraries (libcuda, libcudart, libcublas, libcublasLt,
# libnccl, libnvidia-*), which gpu-check.sh finds on the GPU host. The bundle is built without
# MPI (STRATA_MPI=OFF): one GPU needs one rank, and Open MPI's run-time plugins are not something
# ldd sees or a folder carries reliably.
#
# Usage: scripts/gpu-bundle.sh [--out DIR] [--build-dir DIR] [--cuda-arch LIST] [--cpu-only]
#                              [--cpu-arch ARCH] [--jobs N] [--max-mib N]
#   --out DIR        the bundle (default: bundle/ in the repository; git-ignored); replaced whole
#   --build-dir DIR  the build tree (default: build-gpu-bundle/); kept, so a rebuild is incremental
#   --cuda-arch L    CMAKE_CUDA_ARCHITECTURES (default 90: H100/H200)
#   --cpu-only       STRATA_CUDA=OFF and no gpu tests: the same packing for a CPU build (the
#                    self-containment test, tests/scripts/test_gpu_bundle.sh, uses it)
#   --cpu-arch A     -march of the fast CPU kernels (default x86-64-v3: AVX2 + FMA, which any
#                    GPU host's CPU has; `native` would tie the bundle to this machine's CPU)
#   --max-mib N      fail when the bundle is larger (default 60: the GPU host takes 64 MiB)
# Exit status: 0 bundle written and checked; 1 build or check failed; 2 bad arguments.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$root/bundle"
build="$root/build-gpu-bundle"
cuda_arch=90
cuda=ON
cpu_arch=x86-64-v3
jobs="$(nproc 2>/dev/null || echo 2)"
max_mib=60
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --build-dir) build="$2"; shift 2 ;;
    --cuda-arch) cuda_arch="$2"; shift 2 ;;
    --cpu-only) cuda=OFF; shift ;;
    --cpu-arch) cpu_arch="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --max-mib) max_mib="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "gpu-bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "gpu-bundle: $*" >&2; }
die() { echo "gpu-bundle: error: $*" >&2; exit 1; }
[ "$cuda" = OFF ] || command -v python3 >/dev/null || die "python3 is needed to read CTest's list of gpu tests"
start=$SECONDS

# ---- build -----------------------------------------------------------------------------------
# RPATH $ORIGIN/../lib, written as DT_RPATH (--disable-new-dtags), not DT_RUNPATH: DT_RPATH is
# searched for every library of the process (libopenblas's libgfortran, libtbb's dlopen of
# libtbbmalloc) and before LD_LIBRARY_PATH, so the bundle's copies win on any host.
generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake_args=(-S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
  -DSTRATA_CUDA="$cuda" -DSTRATA_MPI=OFF -DSTRATA_CPU_ARCH="$cpu_arch"
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON '-DCMAKE_INSTALL_RPATH=$ORIGIN/../lib'
  -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags)
[ "$cuda" = ON ] && cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$cuda_arch")
log "configuring $build (CUDA $cuda${cuda_arch:+, sm_$cuda_arch}, no MPI, cpu arch $cpu_arch)"
mkdir -p "$build"
cmake "${cmake_args[@]}" >"$build/strata-configure.log" 2>&1 ||
  { tail -30 "$build/strata-configure.log" >&2; die "configure failed (log: $build/strata-configure.log)"; }
targets=(strata)
[ "$cuda" = ON ] && targets+=(strata_tests_gpu)
log "building ${targets[*]} with $jobs jobs"
cmake --build "$build" -j "$jobs" --target "${targets[@]}" || die "build failed"
build_seconds=$((SECONDS - start))

# ---- the gpu test entries --------------------------------------------------------------------
# CTest's own list (name, program, arguments) of label gpu, so the bundle runs exactly what
# `ctest -L gpu` would. Entries run under mpirun need MPI, which the bundle leaves out: they are
# listed as left out, with the reason.
tests_tsv="$(mktemp)"
trap 'rm -f "$tests_tsv"' EXIT
if [ "$cuda" = ON ]; then
  ctest --test-dir "$build" -L gpu --show-only=json-v1 | python3 -c '
import json, os, sys
for t in json.load(sys.stdin)["tests"]:
    name, cmd = t["name"], t.get("command") or []
    prog = os.path.basename(cmd[0]) if cmd else "nothing"
    if prog.startswith("test_"):
        print(name, cmd[0], " ".join(cmd[1:]), sep="\t")
    else:
        print(name, "-", "left out: it runs " + prog + " (more than one rank; the bundle has no MPI)", sep="\t")
' >"$tests_tsv"
fi

# ---- pack ------------------------------------------------------------------------------------
# Not bundled: glibc, whose libraries are the host's own (ld.so must match libc); libstdc++ and
# libgcc_s (copied to lib/cxx/ only, see above); CUDA and driver libraries, the GPU host's.
is_glibc() {
  case "$1" in
    linux-vdso.so.*|ld-linux*.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|\
    libresolv.so.*|libutil.so.*|libanl.so.*|libmvec.so.*) return 0 ;;
  esac
  return 1
}
is_cxx_runtime() { case "$1" in libstdc++.so.*|libgcc_s.so.*) return 0 ;; esac; return 1; }
is_host_cuda() {
  case "$1" in
    libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libnvidia*|\
    libnvrtc*|libnvJitLink*|libcufft*|libcurand*|libcusolver*|libcusparse*|libcupti*) return 0 ;;
  esac
  return 1
}

log "packing $out"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/cxx"
programs=("$build/apps/strata/strata")
if [ -s "$tests_tsv" ]; then
  while IFS=$'\t' read -r name prog args; do
    [ "$prog" = - ] && continue
    [ -x "$prog" ] || die "gpu test $name: program $prog was not built"
    programs+=("$prog")
  done <"$tests_tsv"
fi
declare -A seen=()
host_libs=()
tbb_dir=""
for p in "${programs[@]}"; do
  b="$(basename "$p")"
  [ -n "${seen[bin/$b]:-}" ] && continue
  seen[bin/$b]=1
  cp "$p" "$out/bin/$b"
  strip --strip-all "$out/bin/$b"
  # ldd of the program lists every library of the process, transitive ones included.
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || { path="$soname"; soname="$(basename "$soname")"; }
    is_glibc "$soname" && continue
    if is_host_cuda "$soname"; then
      [ -n "${seen[host/$soname]:-}" ] || { seen[host/$soname]=1; host_libs+=("$soname"); }
      continue
    fi
    [ "$path" = "not" ] && die "$b needs $soname, which this machine does not have"
    [ -n "${seen[lib/$soname]:-}" ] && continue
    seen[lib/$soname]=1
    dest="$out/lib/$soname"
    is_cxx_runtime "$soname" && dest="$out/lib/cxx/$soname"
    cp -L "$path" "$dest"
    [ "$soname" = libtbb.so.12 ] && tbb_dir="$(dirname "$(readlink -f "$path")")"
    echo "${dest#"$out/"} <- $(readlink -f "$path")" >>"$out/lib/SOURCES"
  done < <(env -u LD_LIBRARY_PATH ldd "$p" | sed 's/ (0x[0-9a-f]*)$//')
done
# Loaded with dlopen, so invisible to ldd: oneTBB's scalable allocator, which libtbb looks for
# in its own folder only (and falls back to malloc without it, silently).
if [ -n "$tbb_dir" ]; then
  tbbmalloc="$tbb_dir/libtbbmalloc.so.2"
  [ -e "$tbbmalloc" ] || die "libtbb is bundled but libtbbmalloc.so.2 (which it loads) is not beside it in $tbb_dir"
  cp -L "$tbbmalloc" "$out/lib/libtbbmalloc.so.2"
  echo "lib/libtbbmalloc.so.2 <- $(readlink -f "$tbbmalloc") (dlopen by libtbb)" >>"$out/lib/SOURCES"
fi
chmod u+w "$out"/lib/*.so* "$out"/lib/cxx/*.so*
strip --strip-unneeded "$out"/lib/*.so* "$out"/lib/cxx/*.so*
cp "$root/scripts/gpu-check.sh" "$out/gpu-check.sh"
chmod +x "$out/gpu-check.sh"
awk -F'\t' -v OFS='\t' '{ n = split($2, part, "/"); $2 = part[n]; print }' "$tests_tsv" >"$out/tests.tsv"

# ---- check -----------------------------------------------------------------------------------
# Every library a bundled program resolves (no LD_LIBRARY_PATH) is in lib/, glibc, or CUDA.
libdir="$(readlink -f "$out/lib")"
for p in "$out"/bin/*; do
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    is_glibc "$soname" || is_cxx_runtime "$soname" || is_host_cuda "$soname" && continue
    [ "$(readlink -f "$(dirname "$path")")" = "$libdir" ] ||
      die "$(basename "$p") resolves $soname to $path, outside the bundle"
  done < <(env -u LD_LIBRARY_PATH ldd "$p" | sed 's/ (0x[0-9a-f]*)$//')
done
# The newest symbol versions the bundle needs (from each file's version references): gpu-check.sh
# compares them with the host's glibc and libstdc++ before it runs anything.
newest() {  # newest PREFIX FILE...: e.g. newest GLIBC bin/* -> 2.34
  local prefix=$1
  shift
  objdump -p "$@" 2>/dev/null | awk -v p="^${prefix}_" '$1 ~ /^0x/ && $4 ~ p { sub(/^[A-Z]+_/, "", $4); print $4 }' |
    sort -uV | tail -1
}
glibc="$(newest GLIBC "$out"/bin/* "$out"/lib/*.so*)"
glibcxx="$(newest GLIBCXX "$out"/bin/* "$out"/lib/*.so*)"
cxxabi="$(newest CXXABI "$out"/bin/* "$out"/lib/*.so*)"
cxx_glibc="$(newest GLIBC "$out"/lib/cxx/*.so*)"

# Libraries over 8 MiB travel xz-compressed: OpenBLAS carries kernels for every x86 generation
# (DYNAMIC_ARCH, 36 MiB; 4 MiB as .xz), half of an uncompressed bundle. gpu-check.sh --unpack
# (and every gpu-check.sh run) restores them in place, with xz or python3's lzma.
command -v xz >/dev/null || die "xz is needed to compress the large libraries (apt-get install xz-utils)"
unpacked_bytes="$(du -sb "$out" | cut -f1)"
packed=()
for f in "$out"/lib/*.so*; do
  [ "$(stat -c %s "$f")" -gt $((8 << 20)) ] || continue
  xz -T"$jobs" -9 -c "$f" >"$f.xz"
  rm "$f"
  packed+=("lib/$(basename "$f")")
done
bytes="$(du -sb "$out" | cut -f1)"
mib=$(( (bytes + 1048575) / 1048576 ))

commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
dirty="$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo true || echo false)"
built="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
{
  echo "# written by scripts/gpu-bundle.sh; read by gpu-check.sh"
  echo "BUNDLE_COMMIT=$commit"
  echo "BUNDLE_DIRTY=$dirty"
  echo "BUNDLE_BUILT=$built"
  echo "BUNDLE_CUDA=$cuda"
  echo "BUNDLE_CUDA_ARCH=$([ "$cuda" = ON ] && echo "$cuda_arch")"
  echo "BUNDLE_GLIBC=$glibc"
  echo "BUNDLE_GLIBCXX=$glibcxx"
  echo "BUNDLE_CXXABI=$cxxabi"
  echo "BUNDLE_CXX_GLIBC=$cxx_glibc"
  echo "BUNDLE_HOST_LIBS=\"${host_libs[*]}\""
  echo "BUNDLE_PACKED=\"${packed[*]}\""
} >"$out/bundle.env"
jlist() {  # jlist WORD...: a JSON array of strings (the words need no escaping)
  local first=1
  printf '['
  for w in "$@"; do [ $first = 1 ] || printf ', '; first=0; printf '"%s"' "$w"; done
  printf ']'
}
{
  printf '{\n  "commit": "%s",\n  "uncommitted_changes": %s,\n  "built": "%s",\n' "$commit" "$dirty" "$built"
  printf '  "cuda": %s,\n  "cuda_architectures": "%s",\n  "cpu_arch": "%s",\n  "mpi": false,\n' \
    "$([ "$cuda" = ON ] && echo true || echo false)" "$([ "$cuda" = ON ] && echo "$cuda_arch")" "$cpu_arch"
  printf '  "needs": {"glibc": "%s", "glibcxx": "%s", "cxxabi": "%s", "glibc_for_spare_libstdcxx": "%s"},\n' \
    "$glibc" "$glibcxx" "$cxxabi" "$cxx_glibc"
  printf '  "build_seconds": %s,\n  "bytes": %s,\n  "bytes_unpacked": %s,\n' "$build_seconds" "$bytes" "$unpacked_bytes"
  printf '  "xz_compressed": %s,\n' "$(jlist "${packed[@]}")"
  printf '  "programs": %s,\n' "$(jlist $(ls "$out/bin"))"
  printf '  "bundled_libraries": %s,\n' "$(jlist $(cut -d' ' -f1 "$out/lib/SOURCES" | sort))"
  printf '  "host_libraries": %s,\n' "$(jlist "${host_libs[@]}")"
  printf '  "gpu_tests": %s\n}\n' "$(jlist $(cut -f1 "$out/tests.tsv"))"
} >"$out/bundle.json"
log "bundle: $out, $mib MiB (limit $max_mib; $(( (unpacked_bytes + 1048575) / 1048576 )) MiB unpacked), build $build_seconds s"
log "  needs glibc >= $glibc, libstdc++ >= $glibcxx (the spare in lib/cxx: glibc >= $cxx_glibc)"
log "  bin: $(ls "$out/bin" | paste -sd' ' -)"
log "  lib: $(cut -d' ' -f1 "$out/lib/SOURCES" | sed 's#^lib/##' | sort | paste -sd' ' -)"
log "  xz-compressed (gpu-check.sh --unpack restores them): ${packed[*]:-none}"
log "  from the GPU host: ${host_libs[*]:-nothing}"
[ "$mib" -le "$max_mib" ] || die "the bundle is $mib MiB, over the $max_mib MiB limit"
