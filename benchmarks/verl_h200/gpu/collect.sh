#!/bin/bash
# ON the GPU machine: what the study has written so far, as one tarball under $OUT (the device tool's folder).
# WAIT_S (default 0): first wait up to that long, returning at once when the timeline says ALL DONE or the study
# has failed every probe so far (device time is the budget: a fixed sleep spent 7 minutes on a study that had failed
# in 49 s, 2026-12-05). UNTIL (default "ALL DONE"): the timeline line to return at (a stage of a longer plan).
RES=${RES:-/tmp/res}; AT=/tmp/atout; WAIT_S=${WAIT_S:-0}; UNTIL=${UNTIL:-ALL DONE}
mkdir -p "$RES"
end=$((SECONDS + WAIT_S))
while [ "$SECONDS" -lt "$end" ]; do
  grep -q -e "$UNTIL" -e "ALL DONE" "$RES/timeline.txt" 2>/dev/null && break
  grep -q "^rc=" "$RES/study.txt" 2>/dev/null && break
  sleep 10
done
tail -n 3 "$RES/timeline.txt" 2>/dev/null; tail -n 4 "$RES/study.txt" 2>/dev/null
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
tar -czf "${OUT:-/tmp}/verl_h200_results.tgz" -C / tmp/res $(cd / && ls -d tmp/atout/runs tmp/atout/result.json tmp/atout/best.yaml tmp/atout/autotune.db tmp/at_*/runs tmp/at_*/result.json tmp/at_*/best.yaml tmp/at_*/autotune.db tmp/attorch/runs tmp/attorch/autotune.db root/.cache/autotune/node-profiles 2>/dev/null) 2>/dev/null
ls -la "${OUT:-/tmp}/verl_h200_results.tgz"
