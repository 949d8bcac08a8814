#!/bin/bash
# Run from anywhere after extracting both commits to /tmp/i21/base_src and /tmp/i21/final_src (git archive).
# interleaved A/B of the 40-trial sim CLI run: base (5cc32f0) vs final (issue 21 HEAD), same load
for i in 1 2; do
  for v in base final; do
    d=/tmp/i21/ab_$v$i; rm -rf $d
    cd /tmp/i21/${v}_src
    s=$( { /usr/bin/time -f "%e s wall %U s user" env PYTHONPATH=/tmp/i21/${v}_src nice -n 10 /work/venv15/bin/python -m autotune run --backend sim --model qwen2.5-7b --gpus 8 --trials 40 --seed 1 --out $d --quiet > /dev/null; } 2>&1 | tail -1)
    echo "$(date -u +%H:%M:%S) $v run $i: $s"
  done
done
