#!/bin/bash
# ON the GPU node after setup.sh, started detached (setsid): issue 29's measurements in one run.
#  1. the flash_attn shim (benchmarks/verl_h200/flash_attn_shim, its wheel carried in .shimwhl) against SDPA;
#  2. the job (run_tiny_grpo.sh) as it is (SDPA, no remove-padding) for 3 steps, step 3 under verl's torch profiler
#     (actor and ref: log-prob and update), the traces summarised on the node (summarize_trace.py);
#  3. the same job with remove-padding on through the shim (flash_attention_2): 2 steps, no profile (PLAIN_ON=0: 3 and
#     the profile, about 70 s more of the session's device time);
#  4. the job's rollout alone in vLLM, eager against CUDA graphs (vllm_eager.py);
#  6. (run first after 1) gpu/logprob_loop.py: whether verl's log-prob takes its per-token Python loop on this node
#     (flash-attn's Triton cross-entropy missing: utils/torch_functional.py:34-39, 95, 196-206) and its cost per token;
#  7. (after 6) the job with `model.use_fused_kernels=True` (verl's fused log-prob, impl_backend torch), which does not
#     call that function: 2 steps, no profile. The next session's run is `SKIP="2 3 5 4"` (1, 6, 7: about 8 minutes).
#  5. (issue 28, run before 4) `autotune train` for 2 steps on the shared study's exported best.yaml
#     (benchmarks/results/h200-2026-12-05-verl-shared/launch2): the export launched as a user launches it, and a
#     separate probe of the configuration the shared launch measured as its trial 4 (step 2 timed; step 2 of
#     launch 2 above is likewise a separate probe of the job, trial 0).
# The shim sits in /tmp/shim, on the path of the check and of step 3 only. Each launch's console is kept; step 2 is the timed step, step 1 is warm-up. Everything lands in $RES (/tmp/res),
# tarred by collect.sh. Env: SKIP (space-separated step numbers to skip).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=/tmp/repo; RES=${RES:-/tmp/res}; SKIP=${SKIP:-}
rm -rf "$REPO" && cp -r "$HERE/../../.." "$REPO" && rm -rf "$REPO/.carry"
mkdir -p "$RES"
source "$HERE/env.sh"
cd "$REPO"
stamp() { echo "=== $(date -u +%FT%TZ) $*" | tee -a "$RES/timeline.txt"; }
skip() { case " $SKIP " in *" $1 "*) return 0;; esac; return 1; }
{ nvidia-smi; python3 -c "import torch, vllm, verl, ray, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'verl', verl.__version__, 'ray', ray.__version__, 'transformers', transformers.__version__)"; } > "$RES/versions.txt" 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/shim .shimwhl/*.whl > "$RES/shim_install.txt" 2>&1
PROFILE=(global_profiler.tool=torch 'global_profiler.steps=[3]' global_profiler.save_path=/tmp/prof
         actor_rollout_ref.actor.profiler.enable=True actor_rollout_ref.actor.profiler.all_ranks=True
         'actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cuda]'
         actor_rollout_ref.ref.profiler.enable=True actor_rollout_ref.ref.profiler.all_ranks=True
         'actor_rollout_ref.ref.profiler.tool_config.torch.contents=[cuda]'
         trainer.total_training_steps=3)
launch() {  # name, extra overrides... (SHIM=1 in its environment: the flash_attn shim on the path; PLAIN=1: 2 steps,
            # no profile)
  local name=$1; shift
  local path=$PYTHONPATH; [ "${SHIM:-0}" = 1 ] && path=/tmp/shim:$PYTHONPATH
  stamp "$name start"
  rm -rf /tmp/prof /tmp/ckpt
  local extra=("${PROFILE[@]}"); [ "${PLAIN:-0}" = 1 ] && extra=(trainer.total_training_steps=2)
  PYTHONPATH=$path timeout 900 bash benchmarks/verl_h200/run_tiny_grpo.sh "${extra[@]}" "$@" > "$RES/$name.log" 2>&1
  echo "rc=$?" >> "$RES/$name.log"
  stamp "$name end"
  ls -la /tmp/prof > "$RES/${name}_traces.txt" 2>&1
  python3 benchmarks/verl_h200/gpu/summarize_trace.py $(ls /tmp/prof/*.json* 2>/dev/null) >> "$RES/${name}_traces.txt" 2>&1
  stamp "$name summarised"
  ray stop --force > /dev/null 2>&1; sleep 3
}
if ! skip 1; then stamp shim; PYTHONPATH=/tmp/shim:$PYTHONPATH python3 benchmarks/verl_h200/gpu/check_flash_shim.py > "$RES/shim_check.txt" 2>&1; echo "rc=$?" >> "$RES/shim_check.txt"; fi
if ! skip 6; then stamp logprob_loop; timeout 300 python3 benchmarks/verl_h200/gpu/logprob_loop.py > "$RES/logprob_loop.txt" 2>&1
  echo "rc=$?" >> "$RES/logprob_loop.txt"; fi
skip 7 || PLAIN=1 launch fused_logprob actor_rollout_ref.model.use_fused_kernels=True
skip 2 || launch rmpad_off
skip 3 || SHIM=1 PLAIN=${PLAIN_ON:-1} launch rmpad_on actor_rollout_ref.model.use_remove_padding=True \
    ++actor_rollout_ref.model.override_config.attn_implementation=flash_attention_2
if ! skip 5; then
  stamp train start
  PYTHONPATH=$REPO:$PYTHONPATH timeout 900 python3 -m autotune train \
      --config benchmarks/results/h200-2026-12-05-verl-shared/launch2/best.yaml trainer.total_training_steps=2 \
      > "$RES/train_best.txt" 2>&1
  echo "rc=$?" >> "$RES/train_best.txt"
  cp benchmarks/results/h200-2026-12-05-verl-shared/launch2/train.log "$RES/train_best.log" 2>/dev/null
  stamp train end
  ray stop --force > /dev/null 2>&1; sleep 3
fi
if ! skip 4; then
  for mode in graphs eager; do
    stamp "vllm $mode"; timeout 300 python3 benchmarks/verl_h200/gpu/vllm_eager.py /tmp/tiny-qwen2 $mode > "$RES/vllm_$mode.txt" 2>&1
    echo "rc=$?" >> "$RES/vllm_$mode.txt"
  done
fi
stamp ALL DONE
