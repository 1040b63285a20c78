#!/bin/bash
# The GPU check: the CUDA tests, then the charlm example's GPT-2-small body (86M parameters) on 4
# ranks sharing one GPU, p2plearn (--sync partitioned) against torch's local SGD
# (experiments/torch_charlm.py: PeriodicModelAverager over gloo), same model, data, period and steps.
#
#     OUT=results-dir [STEPS=96] [EXTRA="--compress int4"] [TESTS=0] bash experiments/gpu_charlm.sh
#
# Writes OUT/p2plearn.json and OUT/localsgd.json (the examples' --json: wall_s, history of
# (seconds, validation loss), averaged_loss, bytes_sent), the jobs' logs and OUT/tests.txt; prints
# both results last. The ranks talk over loopback: one host, no network between them.
set -u
OUT=${OUT:?set OUT to a directory}; mkdir -p "$OUT"
PY=${PY:-python3}; STEPS=${STEPS:-96}; PORT=${PORT:-29533}
MODEL=${MODEL:---layers 12 --dim 768 --heads 12 --context 1024}
export PYTHONUNBUFFERED=1
$PY -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" | tee "$OUT/env.txt"
if [ "${TESTS:-1}" = 1 ]; then
  timeout 300 $PY -m pytest -q -p no:cacheprovider tests/train/test_gpu.py tests/train/test_staging.py 2>&1 \
    | tee "$OUT/tests.txt" | tail -5
fi
COMMON="$MODEL --device cuda --steps $STEPS --period 16 --eval-every 20 --log-every 10 --seed 0"
echo "== p2plearn --sync partitioned ${EXTRA:-}"
timeout 600 $PY -m p2plearn.launch -np 4 -- $PY -m p2plearn.examples.charlm $COMMON --sync partitioned ${EXTRA:-} \
  --json "$OUT/p2plearn.json" > "$OUT/p2plearn.txt" 2>&1
tail -4 "$OUT/p2plearn.txt"
echo "== torch local SGD (gloo)"
pids=()
for r in 0 1 2 3; do
  RANK=$r WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT OMP_NUM_THREADS=1 timeout 600 $PY experiments/torch_charlm.py $COMMON \
    --json "$OUT/localsgd.json" > "$OUT/localsgd_$r.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || echo "a local SGD rank failed: see $OUT/localsgd_*.txt"; done
for name in p2plearn localsgd; do
  $PY -c "import json, sys; r = json.load(open(sys.argv[1])); print(sys.argv[2], {k: r[k] for k in
    ('wall_s', 'averaged_loss', 'own_loss', 'bytes_sent', 'history')})" "$OUT/$name.json" $name
done
