#!/usr/bin/env bash
# `klbisect calibrate` on a GPU: the demo engine's KL probe N times (default
# 40) at its good endpoint and at its bad one, the table of docs/demo.rst's
# "Calibrating the probe". DEVICE=cpu runs it here. Log: $OUT/calibrate.log.
set -u
. "$(dirname "$0")/device_env.sh"
N=${N:-40} DEVICE=${DEVICE:-cuda}
d=$(mktemp -d)/demo
mapfile -t demo < <(python3 -c '
import sys
from klbisect.demo import create_demo_repo
r = create_demo_repo(sys.argv[1], device=sys.argv[2])
print(r.good, r.bad, r.probe_cmd, sep="\n")' "$d" "$DEVICE") || exit 1
cd "$d" || exit 1
(time timeout 560 klbisect calibrate --rev "${demo[0]}" --bad-rev "${demo[1]}" --runs "$N" \
    --thresholds 0.005,0.007,0.01 --probe-cmd "${demo[2]}") > "$OUT/calibrate.log" 2>&1
cat "$OUT/calibrate.log"
