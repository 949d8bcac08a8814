#!/bin/bash
# ON the GPU machine: what the study has written so far, as one tarball under $OUT (the device tool's folder).
RES=${RES:-/tmp/res}; AT=/tmp/atout
mkdir -p "$RES"
tail -n 3 "$RES/timeline.txt" 2>/dev/null; tail -n 4 "$RES/study.txt" 2>/dev/null
nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
tar -czf "${OUT:-/tmp}/verl_h200_results.tgz" -C / tmp/res $(cd / && ls -d tmp/atout/runs tmp/atout/result.json tmp/atout/best.yaml tmp/atout/autotune.db tmp/attorch/runs tmp/attorch/autotune.db 2>/dev/null) 2>/dev/null
ls -la "${OUT:-/tmp}/verl_h200_results.tgz"
