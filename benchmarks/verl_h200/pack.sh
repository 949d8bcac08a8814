#!/bin/bash
# Here (a machine with pip and the package index): the wheels for the offline GPU machine, slimmed and cut into
# parts of 48 MiB, each in its own ignored folder of the checkout (.carry/c0 ... c5), to be carried one per call.
# Usage: bash benchmarks/verl_h200/pack.sh [WORK_DIR]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd); W=${1:-/tmp/verl_h200_pack}
mkdir -p "$W/wheels" "$W/slim"
P=""; for n in 17 24 27 28 31 34 35 38 39; do P="$P --platform manylinux_2_${n}_x86_64"; done
grep -v -e '^#' -e '^antlr4' "$HERE/packages.txt" | while read -r pkg; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $P \
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$W/wheels" "$pkg"
done
python3 -m pip wheel -q --no-deps -w "$W/wheels" antlr4-python3-runtime==4.9.3   # sdist only on the index
# Members this run never loads (../shared/verl-on-h200/README.md says why each is safe to drop).
python3 "$HERE/slim_wheel.py" "$W"/wheels/vllm-*.whl "$W/slim" 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' \
    'vllm/vllm-rs' 'vllm/third_party/deep_gemm/' 'vllm/third_party/fmha_sm100/'
python3 "$HERE/slim_wheel.py" "$W"/wheels/ray-*.whl "$W/slim" 'ray/jars/' 'ray/dashboard/client/build/'
python3 "$HERE/slim_wheel.py" "$W"/wheels/xgrammar-*.whl "$W/slim" 'xgrammar/include/' 'xgrammar/lib/libxgrammar.a'
for f in "$W"/wheels/*.whl; do [ -f "$W/slim/$(basename "$f")" ] || cp "$f" "$W/slim/"; done
rm -rf "$W/parts" && mkdir "$W/parts"
tar -cf - -C "$W" slim | split -b 48M -d -a 1 - "$W/parts/wh.tar.part"
(cd "$W/parts" && sha256sum wh.tar.part* > SHA256SUMS)
grep -qx '/.carry/' "$ROOT/.git/info/exclude" 2>/dev/null || echo '/.carry/' >> "$ROOT/.git/info/exclude"
rm -rf "$ROOT/.carry"
for f in "$W"/parts/wh.tar.part*; do k=${f##*part}; mkdir -p "$ROOT/.carry/c$k"; cp "$f" "$ROOT/.carry/c$k/"; done
last=$(ls -d "$ROOT"/.carry/c* | sort | tail -n 1); cp "$W/parts/SHA256SUMS" "$last/"
du -sh "$W/slim"; ls "$ROOT/.carry"
