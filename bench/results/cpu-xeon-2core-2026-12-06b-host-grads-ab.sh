#!/bin/bash
# usage: ab.sh PLACEMENT label... ; PLACEMENT host|nvme (params:optimizer); each label base|alias;
# runs the 8-layer slice of examples/oversize.toml for 4 steps and prints steps 2-4
pl=$1; shift
for b in "$@"; do
  n=$((n+1))
  ./strata-$b train --config /work/main/examples/oversize.toml --set model.n_layers=8 --set train.steps=4 \
    --set offload.params=$pl --set offload.optimizer=$pl \
    --set log.metrics=./ab-$pl-$b-$n.jsonl --set offload.nvme_path=/work/bench/nv > ./ab-$pl-$b-$n.log 2>&1
  python3 - "$b" "./ab-$pl-$b-$n.jsonl" <<'PY'
import json,sys
rs=[json.loads(l) for l in open(sys.argv[2])]
s=[round(r['step_ms']) for r in rs[1:]]
print(sys.argv[1], *s, 'mean', round(sum(s)/len(s)), 'loss', rs[-1]['loss'], 'd2h_GB', round(rs[-1]['links']['d2h_bytes']/1e9,2), 'rss_GB', round(rs[-1]['mem']['host_rss_bytes']/1e9,2), 'compute', [round(r['time']['compute_ms']) for r in rs[1:]], flush=True)
PY
done
