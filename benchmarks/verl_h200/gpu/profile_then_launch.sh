#!/bin/bash
# ON the GPU machine after setup.sh, started detached (setsid) so that it outlives one call; `.whl` (pytest and its
# light dependencies) carried. One planned run for issues 28 and 29 (2026-12-06), in the order of what each result
# needs, everything under /tmp/res (tarred by collect.sh; the stages in /tmp/res/timeline.txt):
#   0. (only where no study has run on this kind of node: SKIP="1 3 4") a fresh study of run_tiny_grpo.sh, one
#      launch of 4 configurations (tune_seed_node.yaml), that leaves its probes in this node's profile;
#   1. the 2026-12-05 shared study resumed with nothing left to measure: `autotune run` ends at once and leaves the
#      study's 18 measured probes in this node's profile, priced by this autotune's time model (node_prior.py);
#   2. a study of another job (run_other_grpo.sh: other lengths, no KL, dynamic batching) that starts from that
#      profile: one launch, the job and one token budget, each predicted before any probe of its study;
#   4. the torch backend's GPU tests (the fused log-prob path among them);
#   3. the shared study (step 1's copy, so its rows in the profile are replaced, not added twice) resumed for its
#      third launch (tune_shared_3.yaml: as many configurations as the member rule takes, up to 16; one launch),
#      last: collect before it where time is short;
#   5. (an H100 only: SKIP="0 1 2 3 4") issue 28's study on an H100: the H100 seed study of 2026-12-07 (step 0's,
#      one launch of 4) resumed for two more launches (tune_shared_h100.yaml: up to 16 configurations, then the
#      leaders probed again), about 1,300-1,450 s;
#   6. (an H100 only: SKIP="0 1 2 3 4 5") the same seed study resumed under the GPU-time member rule and the held-out
#      confirmation stage (tune_holdout_h100.yaml: dry run a launch of 4, then the stage in one launch), about 800 s.
# In this order because device time is short and H200s were scarce (2026-12-06): what needs the most of it last.
# Env: SKIP (step numbers to leave out): "0 3 4" on a kind of node with a profile source (the H200), "1 3 4" on one
# without (an H100: step 0 learns the profile that step 2 starts from)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../../.." && pwd)
RES=/tmp/res; SKIP=${SKIP:-}
DB=benchmarks/results/h200-2026-12-05-verl-shared/autotune.db
mkdir -p "$RES"
stamp() { echo "=== $(date -u +%FT%TZ) $*" | tee -a "$RES/timeline.txt"; }
skip() { case " $SKIP " in *" $1 "*) return 0;; esac; return 1; }
study() {  # name, then run_study.sh's env; each study in its own result and out folders
  local name=$1; shift
  stamp "$name start"
  env RES="$RES/$name" AT="/tmp/at_$name" TRAIN=0 TORCH=0 "$@" bash "$HERE/run_study.sh" > "$RES/$name.log" 2>&1
  stamp "$name end ($(grep '^rc=' "$RES/$name/study.txt" 2>/dev/null))"
}
skip 0 || study seed_node TUNE=benchmarks/verl_h200/tune_seed_node.yaml TRIALS=4 SEED=6
skip 1 || study seed RESUME_DB="$DB" TUNE=benchmarks/verl_h200/tune_shared_3.yaml TRIALS=18 SEED=6
skip 2 || study other JOB=benchmarks/verl_h200/run_other_grpo.sh TUNE=benchmarks/verl_h200/tune_other.yaml TRIALS=2 SEED=5
if ! skip 4; then
  stamp "gpu tests start"
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$ROOT"/.whl/*.whl > "$RES/gpu_tests.txt" 2>&1
  (source "$HERE/env.sh" && cd "$ROOT" && PYTHONPATH="/tmp/site:$ROOT" timeout 300 python3 -m pytest -m gpu -q \
      -p no:cacheprovider --durations=10 tests/backends/torch/test_torch_gpu.py tests/backends/test_gpu_monitor.py \
      >> "$RES/gpu_tests.txt" 2>&1; echo "rc=$?" >> "$RES/gpu_tests.txt")
  stamp "gpu tests end ($(tail -n 2 "$RES/gpu_tests.txt" | tr '\n' ' '))"
fi
skip 3 || study third AT=/tmp/at_seed TUNE=benchmarks/verl_h200/tune_shared_3.yaml TRIALS=34 SEED=7
skip 5 || study h100_shared RESUME_DB=benchmarks/results/h100-2026-12-07-verl-profile/seed_node/autotune.db \
    TUNE=benchmarks/verl_h200/tune_shared_h100.yaml TRIALS=23 SEED=7
skip 6 || study h100_holdout RESUME_DB=benchmarks/results/h100-2026-12-07-verl-profile/seed_node/autotune.db \
    TUNE=benchmarks/verl_h200/tune_holdout_h100.yaml TRIALS=12 SEED=7
cp -r "${AUTOTUNE_PROFILE_DIR:-$HOME/.cache/autotune/node-profiles}" "$RES/node-profiles" 2>/dev/null
stamp ALL DONE
