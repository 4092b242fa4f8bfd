#!/bin/bash
# issue 14, 2026-12-08: S=binary, then run names; each run the shipped example (auto), 4 steps
D=/work/bench/nv
cd /work/main
run() { S=$1; name=$2; shift 2
  echo "=== $name $(date -u +%T)"
  /usr/bin/time -v $S train --config examples/oversize.toml --set offload.nvme_path=$D --set train.steps=4 \
    --set log.metrics=/work/m28/$name-metrics.jsonl --rates /root/.cache/strata/rates.json "$@" \
    > /work/m28/$name.log 2>&1
  echo "rc=$? $(date -u +%T)"
  grep -E "Maximum resident|auto placement" /work/m28/$name.log
}
run /work/m28/strata-base base-shipped1
run /work/m28/strata-base base-compute1 --set train.steps=3 --set offload.overlap_optimizer=false --set offload.optimizer=nvme --set offload.grads=host
echo "=== end $(date -u +%T)"
