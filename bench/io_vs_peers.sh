#!/usr/bin/env bash
# bench/io_vs_peers.sh — `strata bench io` against its peers with the same parameters on the same
# file system, in one run: fio (bench/peers/fio.sh with its fastest flags: io_uring, direct,
# fixedbufs, registerfiles, and iomem=mmaphuge where enough huge pages are free) and DeepSpeed's
# DeepNVMe (bench/peers/deepnvme.py: its aio handle, same block size and queue depth). Several
# rounds, the order rotating each round so that drift and background load hit all alike; prints
# each round, the medians, and strata's ratio to each peer, in one table. Targets: strata >= 0.95
# of fio and >= DeepNVMe, for write and read.
#
#   bench/io_vs_peers.sh --dir DIR [--size 4G] [--block 1M] [--qd 32] [--rounds 3]
#                        [--strata build/apps/strata/strata] [--python PY]
#                        [--reserve-huge-pages N] [--thp-always] [--fio-defaults] [--no-deepnvme]
#                        [--overwrite]
# --reserve-huge-pages N (root): raise /proc/sys/vm/nr_hugepages to N for the run and put the old
#   value back at the end, so that strata's staging and fio's buffers get explicit huge pages.
# --thp-always (root): transparent huge pages "always" for the run (the old mode back at the
#   end), so that DeepNVMe's page-locked buffer (posix_memalign + mlock, no madvise) lands on
#   huge pages too: its best configuration where 4K pages cost (on one VM 1.3 / 2.1 GB/s write /
#   read on 4K pages, 2.2 / 3.9 on huge pages). strata and fio use explicit huge pages either way.
# --python: the interpreter with torch and deepspeed for DeepNVMe (default $STRATA_PEER_PYTHON,
#   else python3). --fio-defaults adds fio on its default flags as a fourth row.
# --overwrite: every tool writes its file once untimed before the timed write (strata bench io
#   --pattern overwrite, fio.sh --overwrite, deepnvme.py --overwrite), so the timed write
#   overwrites blocks already written, as the engine's swap after its first step; on ext4 a first
#   write into a fresh extent also converts it (one virtio disk: half the rate of an overwrite).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dirs=() dir_args=()
size=4G block=1M qd=32 rounds=3 reserve=0 fio_defaults=0 deepnvme=1 thp_always=0 over=()
strata=${STRATA_BIN:-$here/../build/apps/strata/strata}
python=${STRATA_PEER_PYTHON:-python3}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dirs+=("$2"); dir_args+=(--dir "$2"); shift 2 ;;
    --size) size=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --strata) strata=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --reserve-huge-pages) reserve=$2; shift 2 ;;
    --thp-always) thp_always=1; shift ;;
    --fio-defaults) fio_defaults=1; shift ;;
    --overwrite) over=(--overwrite); shift ;;
    --no-deepnvme) deepnvme=0; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "io_vs_peers.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#dirs[@]} -gt 0 ]] || { echo "io_vs_peers.sh: pass --dir at least once" >&2; exit 2; }
[[ -x "$strata" ]] || { echo "io_vs_peers.sh: no strata binary at '$strata' (use --strata)" >&2; exit 2; }
if [[ $deepnvme -eq 1 && ${#dirs[@]} -gt 1 ]]; then
  echo "io_vs_peers.sh: DeepNVMe reads one file; with several --dir it runs in the first" >&2
fi

# What the run changes in the system, put back on every exit.
restore=()
put_back() { local c; for c in ${restore[@]+"${restore[@]}"}; do eval "$c"; done; }
trap put_back EXIT

nr=/proc/sys/vm/nr_hugepages
free_pages() { cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0; }
if (( reserve > 0 )); then
  [[ $EUID -eq 0 ]] || { echo "io_vs_peers.sh: --reserve-huge-pages needs root" >&2; exit 2; }
  old_nr=$(cat "$nr")
  if (( old_nr < reserve )); then
    restore+=("echo $old_nr > $nr")
    echo "$reserve" > "$nr"
  fi
  echo "huge pages: nr_hugepages $(cat "$nr") (was $old_nr), $(free_pages) free" \
       "(the kernel reserves fewer than asked when memory is fragmented)"
fi
thp=/sys/kernel/mm/transparent_hugepage/enabled
if (( thp_always )); then
  [[ $EUID -eq 0 ]] || { echo "io_vs_peers.sh: --thp-always needs root" >&2; exit 2; }
  [[ -w $thp ]] || { echo "io_vs_peers.sh: --thp-always: cannot write $thp" >&2; exit 2; }
  old_thp=$(grep -o '\[[a-z]*\]' "$thp" | tr -d '[]')
  restore+=("echo $old_thp > $thp")
  echo always > "$thp"
  echo "transparent huge pages: always for this run (was $old_thp)"
fi

field() { grep -o "\"$1\":[0-9.]*" <<<"$2" | head -1 | cut -d: -f2; }
sfield() { grep -o "\"$1\":\"[^\"]*\"" <<<"$2" | head -1 | cut -d'"' -f4; }
bfield() { grep -o "\"$1\":\(true\|false\)" <<<"$2" | head -1 | cut -d: -f2; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

declare -A W R DESC
tools=(strata fio)
[[ $fio_defaults -eq 1 ]] && tools+=(fio_defaults)
[[ $deepnvme -eq 1 ]] && tools+=(deepnvme)
fio_huge=(--hugepages)

run_strata() {
  local j
  j=$("$strata" bench io "${dir_args[@]}" --size "$size" --block "$block" --qd "$qd" --backend uring \
      ${over[@]+--pattern overwrite} --json)
  [[ $(field wrong "$j") == 0 ]] || { echo "strata read back wrong data: $j" >&2; exit 1; }
  W[strata]+=" $(field write_gbps "$j")"; R[strata]+=" $(field read_gbps "$j")"
  DESC[strata]="strata: io_uring, $(sfield pages "$j") pages, buffers registered $(bfield registered "$j"), files registered $(bfield files_registered "$j")"
}
run_fio() {  # $1: fio or fio_defaults
  local j rc=0 flags=()
  [[ $1 == fio ]] && flags=(--tuned ${fio_huge[@]+"${fio_huge[@]}"})
  j=$("$here/peers/fio.sh" "${dir_args[@]}" --size "$size" --block "$block" --qd "$qd" ${flags[@]+"${flags[@]}"} ${over[@]+"${over[@]}"} --json 2>/tmp/io_vs_peers.$$.err) || rc=$?
  if [[ $rc -eq 3 && $1 == fio ]]; then  # too few free huge pages: without them, said once
    echo "note: $(cat /tmp/io_vs_peers.$$.err); fio runs on 4K-page buffers" >&2
    fio_huge=()
    flags=(--tuned)
    j=$("$here/peers/fio.sh" "${dir_args[@]}" --size "$size" --block "$block" --qd "$qd" "${flags[@]}" ${over[@]+"${over[@]}"} --json)
  elif [[ $rc -ne 0 ]]; then
    cat /tmp/io_vs_peers.$$.err >&2; exit 1
  fi
  rm -f /tmp/io_vs_peers.$$.err
  W[$1]+=" $(field write_gbps "$j")"; R[$1]+=" $(field read_gbps "$j")"
  DESC[$1]="$(sfield fio_version "$j"): io_uring, direct${flags[@]+ ${flags[*]}}, iomem $(sfield iomem "$j")"
}
run_deepnvme() {
  local j rc=0
  j=$("$python" "$here/peers/deepnvme.py" --dir "${dirs[0]}" --size "$size" --block "$block" --qd "$qd" ${over[@]+"${over[@]}"} --json) || rc=$?
  if [[ -n "$(sfield error "$j")" ]]; then
    echo "DeepNVMe not run: $(sfield error "$j")" >&2
    deepnvme=0; tools=("${tools[@]/deepnvme}"); return
  fi
  [[ $rc -eq 0 ]] || { echo "DeepNVMe failed ($rc): $j" >&2; exit 1; }
  W[deepnvme]+=" $(field write_gbps "$j")"; R[deepnvme]+=" $(field read_gbps "$j")"
  DESC[deepnvme]="deepnvme (deepspeed $(sfield deepspeed_version "$j") aio): 1 thread, page-locked buffer of $(( $(field buffer_bytes "$j") >> 20 ))M, $(( $(field buffer_huge_bytes "$j" || echo 0) >> 20 ))M of it on huge pages"
}
run() { case $1 in strata) run_strata ;; fio|fio_defaults) run_fio "$1" ;; deepnvme) run_deepnvme ;; esac; }

echo "strata vs peers: size $size, block $block, depth $qd, dirs ${dirs[*]}, $rounds rounds${over[@]+, the timed write overwriting blocks written before}"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for ((i = 0; i < rounds; i++)); do
  order=()
  n=${#tools[@]}
  for ((k = 0; k < n; k++)); do order+=("${tools[(i + k) % n]}"); done
  for t in "${order[@]}"; do
    [[ -n "$t" ]] || continue
    [[ $t == deepnvme && $deepnvme -eq 0 ]] && continue
    run "$t"
    [[ -n "${W[$t]:-}" ]] || continue
    printf 'round %d  %-13s write %7s  read %7s GB/s\n' "$((i + 1))" "$t" \
      "$(awk '{ print $NF }' <<<"${W[$t]}")" "$(awk '{ print $NF }' <<<"${R[$t]}")"
  done
done
echo "load average at end:   $(cut -d' ' -f1-3 /proc/loadavg)"

med() { tr ' ' '\n' <<<"$1" | grep . | median; }
msw=$(med "${W[strata]}") msr=$(med "${R[strata]}")
echo
printf '%-13s %10s %10s %14s %14s   %s\n' tool write_GB/s read_GB/s strata/tool_w strata/tool_r how
for t in "${tools[@]}"; do
  [[ -n "$t" && -n "${W[$t]:-}" ]] || continue
  mw=$(med "${W[$t]}") mr=$(med "${R[$t]}")
  awk -v t="$t" -v mw="$mw" -v mr="$mr" -v sw="$msw" -v sr="$msr" -v d="${DESC[$t]}" \
    'BEGIN { printf "%-13s %10.3f %10.3f %14.3f %14.3f   %s\n", t, mw, mr, sw / mw, sr / mr, d }'
done
echo "(medians of $rounds rounds; targets: strata/fio >= 0.95, strata/deepnvme >= 1.00, write and read)"
