#!/usr/bin/env bash
# The H200 rows of docs/demo.rst: the demo on CUDA with two slots and with
# one, then `klbisect start` + `git bisect run` in the first demo's
# repository. Logs go to $OUT (default: ./demo-logs); setup in device_env.sh.
set -u
. "$(dirname "$0")/device_env.sh"
d1=$(mktemp -d)/demo d2=$(mktemp -d)/demo

(time timeout 400 klbisect demo --device cuda --dir "$d1") > "$OUT/demo_cuda.log" 2>&1
tail -22 "$OUT/demo_cuda.log"

# the demo prints the exact `klbisect start` line for its repository
start=$(grep -o "klbisect start .*" "$OUT/demo_cuda.log" | sed 's/^klbisect start //')
eval "set -- $start"
(cd "$d1" && time (klbisect start "$@" && timeout 400 git bisect run klbisect probe; klbisect status; klbisect reset)) \
    > "$OUT/gitbisect.log" 2>&1
grep -E "first bad commit|^real|Confidence|Probe runs" "$OUT/gitbisect.log"

(time timeout 400 klbisect demo --device cuda --parallel 1 --dir "$d2") > "$OUT/demo_cuda_p1.log" 2>&1
tail -14 "$OUT/demo_cuda_p1.log"
