#!/bin/bash
# ON the GPU machine, once every part is in $PARTS: check, reassemble, install, pre-flight, make model + data.
# Env: PARTS (/tmp/parts) W (/tmp/whx) SITE (/tmp/site) MODEL (/tmp/tiny-qwen2) DATA (/tmp/data/gsm8k)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PARTS=${PARTS:-/tmp/parts}; W=${W:-/tmp/whx}; SITE=${SITE:-/tmp/site}
MODEL=${MODEL:-/tmp/tiny-qwen2}; DATA=${DATA:-/tmp/data/gsm8k}
t0=$(date +%s)
(cd "$PARTS" && sha256sum -c --quiet SHA256SUMS) && echo "parts ok"
[ -d "$W/slim" ] || { mkdir -p "$W" && cat "$PARTS"/wh.tar.part* | tar -xf - -C "$W"; }
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$W"/slim/*.whl
echo "installed $(ls "$W"/slim | wc -l) wheels into $SITE in $(( $(date +%s) - t0 ))s"
source "$HERE/env.sh"
python3 "$HERE/preflight.py"
# Qwen2.5-1.5B shapes (its config.json: hidden 1536, 28 layers, 12 heads, 2 KV heads, intermediate 8960, tied)
[ -f "$MODEL/model.safetensors" ] || python3 "$HERE/make_tiny_model.py" --out "$MODEL" --device cuda --check \
    --hidden 1536 --layers 28 --heads 12 --kv-heads 2 --intermediate 8960
[ -f "$DATA/train.parquet" ] || python3 "$HERE/make_gsm8k_synth.py" --out "$DATA"
echo "SETUP OK in $(( $(date +%s) - t0 ))s"
