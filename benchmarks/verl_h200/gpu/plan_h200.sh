#!/bin/bash
# ON an H200 after setup.sh, started detached (setsid) from a copy of the tree: what issues 28 and 29 still need on an
# H200, most valuable first, so that collecting after any stage keeps what is done (2026-12-07, seventh session):
#   A. the 2026-12-05 shared study resumed into the H200's node profile (step 1), then its third launch
#      (tune_shared_3.yaml, step 3; dry run on CPU: one launch of 9): issue 28's three launches on the H200;
#   B. the other job's study from that profile (step 2): issue 29's first probe of a new job on the H200;
#   C. the job with remove-padding on through the flash_attn shim (explain_phases.sh step 3): issue 29 item 3.
# Each stage's "ALL DONE" is renamed, so `UNTIL="stage A done" collect.sh` returns at the end of that stage.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); RES=/tmp/res
mkdir -p "$RES"
done_as() { sed -i "s/ALL DONE/$1/" "$RES/timeline.txt"; }
SKIP="0 2 4 5 6" bash "$HERE/profile_then_launch.sh"; done_as "stage A done"
SKIP="0 1 3 4 5 6" bash "$HERE/profile_then_launch.sh"; done_as "stage B done"
SKIP="1 6 7 2 5 4" bash "$HERE/explain_phases.sh"
