#!/bin/bash
# usage: full.sh label... ; the full examples/oversize.toml, 4 steps, then bench io
for b in "$@"; do
  n=$((n+1))
  ./strata-$b train --config /work/main/examples/oversize.toml --set offload.nvme_path=/work/bench/nv --set train.steps=4 \
    --set log.metrics=./full-$b-$n.jsonl > ./full-$b-$n.log 2>&1
  io=$(./strata-alias bench io --dir /work/bench/nv --size 4G --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['read_gbps'], d['write_gbps'])")
  python3 - "$b" "./full-$b-$n.jsonl" "$io" <<'PY'
import json,sys
rs=[json.loads(l) for l in open(sys.argv[2])]
s=[round(r['step_ms']) for r in rs[1:]]
print(sys.argv[1], *s, 'loss', [r['loss'] for r in rs[1:]], 'd2h_GB', round(rs[-1]['links']['d2h_bytes']/1e9,2), 'rss', round(rs[-1]['mem']['host_rss_bytes']/1e9,2), 'io', sys.argv[3], flush=True)
PY
done
