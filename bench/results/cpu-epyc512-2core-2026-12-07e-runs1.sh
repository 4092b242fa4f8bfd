#!/bin/bash
# issue 14: gradients on NVMe, the oversize example; one run after another
S=/work/main/build/apps/strata/strata
D=/work/bench/nv
cd /work/main
run() { name=$1; shift
  echo "=== $name $(date -u +%T)"
  /usr/bin/time -v $S train --config examples/oversize.toml --set offload.nvme_path=$D --set train.steps=4 \
    --set log.metrics=/work/m27/$name-metrics.jsonl --rates /root/.cache/strata/rates.json "$@" \
    > /work/m27/$name.log 2>&1
  echo "rc=$? $(date -u +%T)"
  grep -E "Maximum resident" /work/m27/$name.log
}
run f32-auto --set offload.optimizer=auto --set offload.grads=auto
run f32-shipped
run f32-compute --set train.steps=3 --set offload.overlap_optimizer=false
run bf16-gradsnvme --set train.optimizer_state_dtype=bf16 --set offload.grads=nvme --set offload.optimizer_host_bytes=10718254489 --set offload.optimizer_read_ahead=0
run bf16-auto --set train.optimizer_state_dtype=bf16 --set offload.optimizer=auto
$S bench io --dir $D --size 4G --json > /work/m27/io.json 2>&1
echo "=== end $(date -u +%T)"
