#!/bin/bash
# ON the GPU machine after setup.sh, started detached (setsid) so that it outlives one call: the autotune study
# of run_tiny_grpo.sh with real verl, then `autotune train` on its best.yaml for 2 steps, then the torch
# backend on the same job (TORCH=0 skips it). Everything lands in $RES (/tmp/res), tarred by collect.sh.
# Env: SEED (default 1), TUNE (default benchmarks/verl_h200/tune.yaml), TRIALS (default 12), TORCH (default 1),
# TRAIN (default 1; 0 skips autotune train), RESUME_DB (a study's autotune.db from an earlier session, committed
# under benchmarks/results: the study goes on from it, as `autotune run` resumes any stored study), JOB (the launch
# script the study imports; default benchmarks/verl_h200/run_tiny_grpo.sh), AT (autotune's --out; default /tmp/atout)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=/tmp/repo; RES=${RES:-/tmp/res}; AT=${AT:-/tmp/atout}; JOB=${JOB:-benchmarks/verl_h200/run_tiny_grpo.sh}; SEED=${SEED:-1}; TUNE=${TUNE:-benchmarks/verl_h200/tune.yaml}; TRIALS=${TRIALS:-12}; TORCH=${TORCH:-1}; TRAIN=${TRAIN:-1}
rm -rf "$REPO" && cp -r "$HERE/../../.." "$REPO" && rm -rf "$REPO/.carry"
mkdir -p "$RES" "$AT"
[ -n "${RESUME_DB:-}" ] && cp "$REPO/$RESUME_DB" "$AT/autotune.db"
source "$HERE/env.sh"
export PYTHONPATH="$REPO:$PYTHONPATH"
cd "$REPO"
stamp() { echo "=== $(date -u +%FT%TZ) $*" | tee -a "$RES/timeline.txt"; }
{ nvidia-smi; python3 -c "import torch, vllm, verl, ray, transformers, optuna; print('torch', torch.__version__, 'vllm', vllm.__version__, 'verl', verl.__version__, 'ray', ray.__version__, 'transformers', transformers.__version__, 'optuna', optuna.__version__)"; } > "$RES/versions.txt" 2>&1
stamp study start
python3 -m autotune run --backend verl --from "$JOB" --model qwen2.5-1.5b --gpus 1 \
    --config "$TUNE" --out "$AT" --seed "$SEED" --trials "$TRIALS" > "$RES/study.txt" 2>&1
echo "rc=$?" >> "$RES/study.txt"
python3 -m autotune show --out "$AT" > "$RES/show.txt" 2>&1
cp "$AT/best.yaml" "$AT/result.json" "$RES/" 2>/dev/null
stamp study end
if [ "$TRAIN" = 1 ]; then
stamp train start
python3 -m autotune train --config "$AT/best.yaml" trainer.total_training_steps=2 > "$RES/train.txt" 2>&1
echo "rc=$?" >> "$RES/train.txt"
stamp train end
fi
if [ "$TORCH" = 1 ]; then
stamp torch start
python3 -m autotune run --backend torch --from "$JOB" --model qwen2.5-1.5b --gpus 1 \
    --config "$TUNE" --out /tmp/attorch --seed "$SEED" --trials 2 > "$RES/torch_study.txt" 2>&1
echo "rc=$?" >> "$RES/torch_study.txt"
python3 -m autotune show --out /tmp/attorch > "$RES/torch_show.txt" 2>&1
stamp torch end
fi
stamp ALL DONE
