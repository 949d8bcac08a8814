#!/bin/bash
# Runs the behaviour baseline of issue 21 into DIR, from the repository root (or a copy of one commit of it):
#   git archive <commit> | tar -x -C /tmp/src && cd /tmp/src && benchmarks/results/issue21_behaviour/run.sh /tmp/out
# usage: run.sh DIR
D=$1; mkdir -p $D
export PYTHONPATH=$PWD
P=/work/venv15/bin/python
nice -n 10 $P benchmarks/fit_calibration.py --check > $D/fit_calibration.txt 2>&1
nice -n 10 $P benchmarks/sim_vs_torch_probe.py > $D/sim_vs_torch_probe.txt 2>&1
rm -rf $D/cli; ( time nice -n 10 $P -m autotune run --backend sim --model qwen2.5-7b --gpus 8 --trials 40 --seed 1 --out $D/cli ) > $D/cli_stdout.txt 2>&1
nice -n 10 $P benchmarks/search_efficiency.py --seeds 2 --budget 12 --jobs qwen2.5-7b-x8 --truths layout_sigma0.15 --methods tpe_rules autotune_cold autotune > $D/search_efficiency.txt 2>&1
echo done > $D/DONE
