#!/usr/bin/env bash
# The multi-GPU rows of docs/parallel.rst: `klbisect run --parallel P
# --gpus-per-probe 1` on the demo's repository (CUDA probes), P = 1, 2 and 4,
# each in a fresh copy of the history so no run is reused, while nvidia-smi
# is sampled to show which GPU each probe process ran on. Needs P GPUs.
# DEVICE=cpu with CUDA_VISIBLE_DEVICES=0,1,2,3 and a stub nvidia-smi tries it
# without GPUs. Logs go to $OUT (default: ./demo-logs); setup in device_env.sh.
set -u
. "$(dirname "$0")/device_env.sh"
ngpu=$(nvidia-smi -L | wc -l)
for p in ${PARALLEL:-4 2 1}; do
    [ "$p" -le "$ngpu" ] || { echo "skip --parallel $p: $ngpu GPU(s)"; continue; }
    d=$(mktemp -d)/demo
    read -r good culprit pr probe < <(python3 -c "
import sys
from pathlib import Path
from klbisect.demo import create_demo_repo
r = create_demo_repo(Path(sys.argv[1]), device=sys.argv[2])
print(r.good, r.culprit, r.culprit_pr, r.probe_cmd)" "$d" "${DEVICE:-cuda}")
    # which GPU each compute process is on, twice a second, while the bisect runs
    (while :; do nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader; sleep 0.5; done) \
        > "$OUT/apps_p$p.csv" 2>/dev/null &
    sampler=$!
    start=$(date +%s.%N)
    timeout 500 klbisect run --repo "$d" --good "$good" --bad main --probe-cmd "$probe" \
        --parallel "$p" --gpus-per-probe 1 --json > "$OUT/run_p$p.log" 2>&1
    rc=$?
    wall=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.0f}')" "$start")
    kill "$sampler"; wait "$sampler" 2>/dev/null
    gpus=$(cut -d, -f2 "$OUT/apps_p$p.csv" | sort -u | grep -c .)
    pids=$(cut -d, -f1 "$OUT/apps_p$p.csv" | sort -u | grep -c .)
    python3 - "$OUT/run_p$p.log" "$p" "$rc" "$wall" "$gpus" "$pids" "$culprit" "$pr" <<'PY'
import json, sys
log, p, rc, wall, gpus, pids, culprit, pr = sys.argv[1:]
try:
    r = json.loads(open(log).read().strip().splitlines()[-1])
except (ValueError, IndexError):
    r = {}
right = "right" if r.get("culprit") == culprit else f"WRONG (planted {culprit[:12]} #{pr})"
print(f"--parallel {p}: exit {rc}, {wall} s, named {str(r.get('culprit'))[:12]} #{r.get('pr')} ({right}), "
      f"confidence {r.get('confidence', 0):.4f}, {r.get('probe_runs')} probe runs; "
      f"{pids} probe processes seen on {gpus} distinct GPU(s)")
PY
done
nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c . | sed 's/^/compute processes left: /'
