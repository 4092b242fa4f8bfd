#!/usr/bin/env bash
# bench/peers/fio.sh — fio with the parameters of `strata bench io`, as its reference:
# ioengine=io_uring, direct=1, the same block size, queue depth and size, one file per --dir
# (fio spreads the blocks round-robin over them), a sequential write then (stonewall) a
# sequential read of the same bytes. Prints decimal GB/s (1e9 B/s) like strata.
# --tuned adds fio's io_uring options fixedbufs and registerfiles (registered buffers and files,
# as strata uses); without it fio runs on its defaults. --hugepages puts fio's buffers on explicit
# huge pages (iomem=mmaphuge: a file on the first hugetlbfs mount, else an anonymous MAP_HUGETLB
# mapping); it needs free reserved 2 MiB pages and stops with the reason when there are too few
# (fio 3.33 crashes instead of falling back when its huge-page mmap fails). --overwrite runs an
# untimed write job first, so the timed write overwrites blocks already written (strata bench io
# --pattern overwrite: the engine's swap after its first step).
#
#   bench/peers/fio.sh --dir DIR [--dir DIR2 ...] [--size 4G] [--block 1M] [--qd 32] [--tuned]
#                      [--hugepages] [--overwrite] [--json]
set -euo pipefail

dirs=()
size=4G block=1M qd=32 json=0 tuned=() hugepages=0 layout=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dir) dirs+=("$2"); shift 2 ;;
    --size) size=$2; shift 2 ;;
    --block) block=$2; shift 2 ;;
    --qd) qd=$2; shift 2 ;;
    --json) json=1; shift ;;
    --tuned) tuned=(--fixedbufs --registerfiles); shift ;;
    --hugepages) hugepages=1; shift ;;
    --overwrite) layout=(--name=layout --rw=write); shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "fio.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
if [[ ${#dirs[@]} -eq 0 ]]; then
  echo "fio.sh: pass --dir at least once" >&2; exit 2
fi
if ! command -v fio >/dev/null 2>&1; then
  echo "fio.sh: fio is not installed; install it with:" >&2
  echo "  apt-get install -y fio" >&2
  exit 2
fi

files=()
for d in "${dirs[@]}"; do
  [[ -d "$d" ]] || { echo "fio.sh: '$d' is not a directory" >&2; exit 2; }
  files+=("$d/strata-fio-$$.bin")
done
filename=$(IFS=:; echo "${files[*]}")

# --hugepages: fio maps iodepth x bs (+ one block of alignment slack) per job, rounded up to 2M;
# the jobs run one after the other, but count each (write, read, and --overwrite's layout) to be
# safe.
iomem=() iomem_desc=malloc files_huge=
if [[ $hugepages -eq 1 ]]; then
  to_bytes() { numfmt --from=iec "$1"; }
  per_job=$(( ( $(to_bytes "$block") * (qd + 1) + 2097151 ) / 2097152 ))
  jobs=2; [[ ${#layout[@]} -gt 0 ]] && jobs=3
  need=$(( jobs * per_job ))
  free_pages=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0)
  if (( free_pages < need )); then
    echo "fio.sh: --hugepages needs $need free 2 MiB huge pages, $free_pages are free;" \
         "reserve them as root with: echo $(( need + $(cat /proc/sys/vm/nr_hugepages) - free_pages ))" \
         "> /proc/sys/vm/nr_hugepages" >&2
    exit 3
  fi
  mnt=$(findmnt -n -t hugetlbfs -o TARGET 2>/dev/null | head -1 || true)
  if [[ -n "$mnt" && -w "$mnt" ]]; then
    iomem=(--iomem="mmaphuge:$mnt/strata-fio-$$.huge")
    iomem_desc="mmaphuge (hugetlbfs $mnt)"
    files_huge="$mnt/strata-fio-$$.huge"
  else
    iomem=(--iomem=mmaphuge)
    iomem_desc="mmaphuge (MAP_HUGETLB)"
  fi
fi
cleanup() { rm -f "${files[@]}" ${files_huge:+"$files_huge"}; }
trap cleanup EXIT

# terse v3: one line per job; field 7 = read KiB/s, field 48 = write KiB/s.
out=$(fio --output-format=terse --terse-version=3 \
          --ioengine=io_uring --direct=1 --bs="$block" --iodepth="$qd" --size="$size" \
          --filename="$filename" ${tuned[@]+"${tuned[@]}"} ${iomem[@]+"${iomem[@]}"} \
          ${layout[@]+"${layout[@]}"} --name=write --rw=write --stonewall \
          --name=read --rw=read --stonewall)
write_kib=$(awk -F';' '$3 == "write" { print $48 }' <<<"$out")
read_kib=$(awk -F';' '$3 == "read" { print $7 }' <<<"$out")
if [[ -z "$write_kib" || -z "$read_kib" ]]; then
  echo "fio.sh: could not read fio's output:" >&2; echo "$out" >&2; exit 1
fi
write_gbps=$(awk -v k="$write_kib" 'BEGIN { printf "%.3f", k * 1024 / 1e9 }')
read_gbps=$(awk -v k="$read_kib" 'BEGIN { printf "%.3f", k * 1024 / 1e9 }')
if [[ $json -eq 1 ]]; then
  printf '{"peer":"fio","fio_version":"%s","write_gbps":%s,"read_gbps":%s,"size":"%s","block":"%s","queue_depth":%s,"files":%d,"tuned":%s,"iomem":"%s","overwrite":%s}\n' \
    "$(fio --version)" "$write_gbps" "$read_gbps" "$size" "$block" "$qd" "${#files[@]}" \
    "$([[ ${#tuned[@]} -gt 0 ]] && echo true || echo false)" "$iomem_desc" \
    "$([[ ${#layout[@]} -gt 0 ]] && echo true || echo false)"
else
  echo "fio ($(fio --version)): io_uring, direct=1, bs $block, iodepth $qd, size $size, ${#files[@]} file(s)${tuned[@]+ ${tuned[*]}}, iomem $iomem_desc${layout[@]+, overwriting}"
  echo "  write $write_gbps GB/s"
  echo "  read  $read_gbps GB/s"
fi
