#!/bin/bash
# usage: ab.sh label... ; each label is old|new; runs the 8-layer nvme:nvme slice 4 steps
for b in "$@"; do
  n=$((n+1))
  ./strata-$b train --config /work/main/examples/oversize.toml --set model.n_layers=8 --set train.steps=4 \
    --set log.metrics=/work/meas17/ab-$b-$n.jsonl --set offload.nvme_path=/work/bench/nv > /dev/null 2>&1
  python3 - "$b" "/work/meas17/ab-$b-$n.jsonl" <<'PY'
import json,sys
rs=[json.loads(l) for l in open(sys.argv[2])]
s=[round(r['step_ms']) for r in rs[1:]]
print(sys.argv[1], *s, 'mean', round(sum(s)/len(s)), 'read_GB', round(rs[-1]['io']['read_bytes']/1e9,2), 'busy', [round(r['io']['busy_ms']) for r in rs[1:]], 'uw', [round(r['time']['update_wait_ms']) for r in rs[1:]], flush=True)
PY
done
