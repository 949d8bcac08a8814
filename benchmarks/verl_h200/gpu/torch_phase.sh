#!/bin/bash
# ON the GPU machine, in one call with `.whl` carried (optuna and its light dependencies, Hydra/OmegaConf for
# --from; the node's own torch and transformers are used): the GPU tests of the torch backend, then the torch
# backend on the same job as the verl study (run_tiny_grpo.sh, Qwen2.5-1.5B shapes). Results in $OUT.
# Env: GPU_TESTS (pytest -k expression; default: all gpu tests), TRIALS (default 2), SEED (default 5)
set -uo pipefail
OUT=${OUT:-/tmp/out}; TRIALS=${TRIALS:-2}; SEED=${SEED:-5}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
stamp() { echo "=== $(date -u +%FT%TZ) $*" | tee -a "$OUT/timeline.txt"; }
{ nvidia-smi; python3 -c "import torch, transformers, optuna; print('torch', torch.__version__, 'transformers', transformers.__version__, 'optuna', optuna.__version__)"; } > "$OUT/versions.txt" 2>&1
stamp gpu tests start
python3 -m pytest -m gpu -q -p no:cacheprovider --durations=10 ${GPU_TESTS:+-k "$GPU_TESTS"} \
    tests/backends/torch/test_torch_gpu.py tests/backends/test_gpu_monitor.py > "$OUT/gpu_tests.txt" 2>&1
echo "rc=$?" >> "$OUT/gpu_tests.txt"; tail -n 3 "$OUT/gpu_tests.txt"
stamp torch study start
# the job's model folder, as the verl study had it (config.json is what --from reads)
python3 benchmarks/verl_h200/gpu/make_tiny_model.py --out /tmp/tiny-qwen2 --device cuda \
    --hidden 1536 --layers 28 --heads 12 --kv-heads 2 --intermediate 8960 > "$OUT/model.txt" 2>&1
python3 -m autotune run --backend torch --from benchmarks/verl_h200/run_tiny_grpo.sh --model qwen2.5-1.5b --gpus 1 \
    --config benchmarks/verl_h200/tune.yaml --out /tmp/attorch --seed "$SEED" --trials "$TRIALS" > "$OUT/torch_study.txt" 2>&1
echo "rc=$?" >> "$OUT/torch_study.txt"; tail -n 12 "$OUT/torch_study.txt"
python3 -m autotune show --out /tmp/attorch > "$OUT/torch_show.txt" 2>&1
cp /tmp/attorch/result.json "$OUT/torch_result.json" 2>/dev/null
stamp ALL DONE
