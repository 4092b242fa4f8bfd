#!/usr/bin/env bash
# bench/io_vs_fio.sh — `strata bench io` against fio (bench/peers/fio.sh) with the same
# parameters on the same file system, back to back, for several rounds (alternating which runs
# first, so drift and background load hit both alike). fio runs twice per round: on its
# defaults, and tuned (fixedbufs + registerfiles, what strata does); strata is compared with the
# better median of the two. Prints each round, the medians and the ratios strata / fio. The
# target is a ratio of at least 0.95 for both write and read.
#
#   bench/io_vs_fio.sh --dir DIR [--dir DIR2 ...] [--size 4G] [--block 1M] [--qd 32]
#                      [--rounds 3] [--strata build/apps/strata/strata] [--no-huge-pages]
# --no-huge-pages gives strata 4K-page staging buffers, like fio's, to compare the engines alone.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dirs=() dir_args=()
size=4G block=1M qd=32 rounds=3 extra=()
strata=${STRATA_BIN:-$here/../build/apps/strata/strata}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dirs+=("$2"); dir_args+=(--dir "$2"); shift 2 ;;
    --size) size=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --strata) strata=$2; shift 2 ;;
    --no-huge-pages) extra+=(--no-huge-pages); shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "io_vs_fio.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ ${#dirs[@]} -gt 0 ]] || { echo "io_vs_fio.sh: pass --dir at least once" >&2; exit 2; }
[[ -x "$strata" ]] || { echo "io_vs_fio.sh: no strata binary at '$strata' (use --strata)" >&2; exit 2; }

field() { grep -o "\"$1\":[0-9.]*" <<<"$2" | head -1 | cut -d: -f2; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

sw=() sr=() fw=() fr=() tw=() tr=()
run_strata() {
  local j
  j=$("$strata" bench io "${dir_args[@]}" --size "$size" --block "$block" --qd "$qd" --backend uring --json ${extra[@]+"${extra[@]}"})
  [[ $(field wrong "$j") == 0 ]] || { echo "strata read back wrong data: $j" >&2; exit 1; }
  sw+=("$(field write_gbps "$j")"); sr+=("$(field read_gbps "$j")")
}
run_fio() {
  local j
  j=$("$here/peers/fio.sh" "${dir_args[@]}" --size "$size" --block "$block" --qd "$qd" --json)
  fw+=("$(field write_gbps "$j")"); fr+=("$(field read_gbps "$j")")
  j=$("$here/peers/fio.sh" "${dir_args[@]}" --size "$size" --block "$block" --qd "$qd" --tuned --json)
  tw+=("$(field write_gbps "$j")"); tr+=("$(field read_gbps "$j")")
}

echo "strata vs fio: size $size, block $block, depth $qd, dirs ${dirs[*]}, $rounds rounds${extra[@]+, strata ${extra[*]}}"
row='%-7s %13s %10s %10s %13s %10s %10s\n'
printf "$row" round strata_write fio_write fio_tuned strata_read fio_read fio_tuned
for ((i = 0; i < rounds; i++)); do
  if ((i % 2 == 0)); then run_strata; run_fio; else run_fio; run_strata; fi
  printf "$row" "$((i + 1))" "${sw[i]}" "${fw[i]}" "${tw[i]}" "${sr[i]}" "${fr[i]}" "${tr[i]}"
done
med() { printf '%s\n' "$@" | median; }
msw=$(med "${sw[@]}") mfw=$(med "${fw[@]}") mtw=$(med "${tw[@]}")
msr=$(med "${sr[@]}") mfr=$(med "${fr[@]}") mtr=$(med "${tr[@]}")
printf "$row" median "$msw" "$mfw" "$mtw" "$msr" "$mfr" "$mtr"
awk -v sw="$msw" -v fw="$mfw" -v tw="$mtw" -v sr="$msr" -v fr="$mfr" -v tr="$mtr" 'BEGIN {
  bw = fw > tw ? fw : tw; br = fr > tr ? fr : tr
  printf "ratio strata / best fio: write %.3f, read %.3f (target >= 0.95)\n", sw / bw, sr / br }'
