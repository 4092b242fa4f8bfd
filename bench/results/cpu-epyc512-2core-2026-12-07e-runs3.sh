#!/bin/bash
# issue 14: the example as shipped at f955bd7 (auto), then compute alone, then bench io
S=/work/main/build/apps/strata/strata
D=/work/bench/nv
cd /work/main
run() { name=$1; shift
  echo "=== $name $(date -u +%T)"
  /usr/bin/time -v $S train --config examples/oversize.toml --set offload.nvme_path=$D --set train.steps=4 \
    --set log.metrics=/work/m27/$name-metrics.jsonl --rates /root/.cache/strata/rates.json "$@" \
    > /work/m27/$name.log 2>&1
  echo "rc=$? $(date -u +%T)"
  grep -E "Maximum resident|auto placement" /work/m27/$name.log
}
run f32-shipped-new
run f32-compute3 --set train.steps=3 --set offload.overlap_optimizer=false --set offload.optimizer=nvme --set offload.grads=host
$S bench io --dir $D --size 4G --json > /work/m27/io4.json 2>&1
echo "=== end $(date -u +%T)"
