#!/bin/bash
# ON a multi-GPU node (issue 22; docs/multi-gpu.md), in one device call with `.whl` carried (optuna and its light
# dependencies, Hydra/OmegaConf): NCCL collectives at every world size 2..N, then the torch backend under torchrun
# (FSDP2 across the GPUs) on Qwen2.5-1.5B and 7B shapes at each world size, each against the sim. Results in $OUT.
# Env: WORLDS (default "2 4 8", cut at the GPUs present), MODELS (default "qwen2.5-1.5b qwen2.5-7b"), TRIALS (3)
set -uo pipefail
OUT=${OUT:-/tmp/out}; TRIALS=${TRIALS:-3}; MODELS=${MODELS:-qwen2.5-1.5b qwen2.5-7b}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1   # this workplace's rule
GPUS=$(nvidia-smi -L | wc -l)
WORLDS=${WORLDS:-2 4 8}
{ nvidia-smi; nvidia-smi topo -m; python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"; } > "$OUT/node.txt" 2>&1
for N in $WORLDS; do
  [ "$N" -le "$GPUS" ] || continue
  torchrun --standalone --nproc-per-node "$N" benchmarks/multi_gpu/collectives.py --out "$OUT/collectives_$N.json" \
      > "$OUT/collectives_$N.txt" 2>&1
done
python3 benchmarks/multi_gpu/fit_comm.py "$OUT"/collectives_*.json --gpu H200 > "$OUT/fit_comm.txt" 2>&1
for M in $MODELS; do
  for N in $WORLDS; do
    [ "$N" -le "$GPUS" ] || continue
    python3 -m autotune run --backend torch --model "$M" --gpus "$N" --trials "$TRIALS" --seed 1 \
        --out "/tmp/at_${M}_$N" > "$OUT/torch_${M}_$N.txt" 2>&1
    echo "rc=$?" >> "$OUT/torch_${M}_$N.txt"
    cp "/tmp/at_${M}_$N/result.json" "$OUT/torch_${M}_${N}_result.json" 2>/dev/null
  done
done
