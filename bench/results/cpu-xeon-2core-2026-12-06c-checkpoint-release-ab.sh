#!/bin/bash
# A/B of the async checkpoint stall: old = aa05354 (states released after the rank file's fsync),
# new = this session's main (released once its writes complete). 1024x12 model (155M params,
# 1.86 GB per save), tiny batches so that a save outlasts a step.
M="--set model.dim=1024 --set model.n_layers=12 --set model.ffn_dim=2816 --set model.n_heads=16 --set model.n_kv_heads=16 --set model.max_seq_len=256 --set data.seq_len=16 --set data.micro_batch=1"
# ./cpu-xeon-2core-2026-12-06c-checkpoint-release-ab.sh old-a new-a old-b new-b old-c new-c (binaries
# copied to ./strata-old, ./strata-new), 17:03-17:05 UTC, nothing else running.
for i in "$@"; do
  b=${i%%-*}
  ./strata-$b bench checkpoint --dir /work/bench/ck $M --steps 6 --json > ck-$i.json 2>ck-$i.log
  python3 -c "
import json;d=json.load(open('ck-$i.json'));print('$i', 'plain step ms', round(d['step_ms_median']), 'stalls ms', [round(s['stall_ms']) for s in d['stalls']], 'write ms', [round(s['write_ms']) for s in d['saves']], 'commit ms', [round(s['commit_ms']) for s in d['saves']], 'disk write GB/s', d['disk_write_gbps'])"
done
