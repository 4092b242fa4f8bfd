#!/bin/bash
# issue 14, after the gradient-read prefetch fix: f32 auto, f32 auto forced ra0, compute alone, bench io
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
run f32-auto2 --set offload.optimizer=auto --set offload.grads=auto
$S bench io --dir $D --size 4G --json > /work/m27/io2.json 2>&1
run f32-compute2 --set train.steps=3 --set offload.overlap_optimizer=false
run bf16-compute --set train.optimizer_state_dtype=bf16 --set train.steps=3 --set offload.overlap_optimizer=false
run f32-ra0 --set offload.grads=nvme --set offload.optimizer_host_bytes=11907041356 --set offload.optimizer_read_ahead=0
run f32-auto3 --set offload.optimizer=auto --set offload.grads=auto --set log.trace=/work/m27/f32-auto3-trace.json
$S bench io --dir $D --size 4G --json > /work/m27/io3.json 2>&1
echo "=== end $(date -u +%T)"
