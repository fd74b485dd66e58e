#!/usr/bin/env bash
# The "Interrupted on a GPU" rows of docs/demo.rst: `klbisect run` on the
# demo's repository with CUDA probes, stopped in the middle of a probe
# (1) by Ctrl-C pressed three times, the probe ignoring SIGINT and SIGTERM,
# (2) by SIGKILL of klbisect itself; after each, how many CUDA compute
# processes are left (nvidia-smi), then (3) the same command again, to the
# answer. Logs go to $OUT (default: ./demo-logs); setup in device_env.sh.
set -u
. "$(dirname "$0")/device_env.sh"
d=$(mktemp -d)/demo
read -r good culprit pr probe < <(python3 -c "
import sys
from pathlib import Path
from klbisect.demo import create_demo_repo
r = create_demo_repo(Path(sys.argv[1]), device='cuda')
print(r.good, r.culprit, r.culprit_pr, r.probe_cmd)" "$d")
apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c .; }
wait_app() {   # until a CUDA probe is on the GPU (at most 120 s)
    for _ in $(seq 240); do [ "$(apps)" -gt 0 ] && return 0; sleep 0.5; done; return 1; }
left_after() {   # compute processes left 0, 2 and 10 s after klbisect exited
    local a=$(apps); sleep 2; local b=$(apps); sleep 8; echo "$a $b $(apps)"; }

# A background job of a script starts with SIGINT ignored, and Python keeps
# it ignored: give klbisect the default disposition a terminal would.
with_sigint() { exec python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' "$@"; }

# (1) Ctrl-C x3, 0.3 s apart, while a probe that traps INT/TERM holds the GPU
with_sigint klbisect run --repo "$d" --good "$good" --bad main \
    --probe-cmd "trap '' INT TERM; $probe" > "$OUT/int3.log" 2>&1 &
k=$!
wait_app || echo "no CUDA process seen"
t0=$(date +%s.%N)
for _ in 1 2 3; do kill -INT "$k"; sleep 0.3; done
wait "$k"; rc=$?
t=$(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$t0")
echo "(1) Ctrl-C x3: exit $rc after ${t} s; compute processes left at 0/2/10 s: $(left_after)"

# (2) SIGKILL of klbisect mid-probe; then `klbisect status` (which reaps)
with_sigint klbisect run --repo "$d" --good "$good" --bad main --probe-cmd "$probe" > "$OUT/kill9.log" 2>&1 &
k=$!
wait_app || echo "no CUDA process seen"
kill -KILL "$k"; wait "$k"; rc=$?
echo "(2) SIGKILL: exit $rc; compute processes left at 0/2/10 s: $(left_after)"
klbisect status --repo "$d" > "$OUT/status_after_kill.log" 2>&1
head -1 "$OUT/status_after_kill.log"
sleep 2; echo "    after klbisect status: $(apps) compute processes"

# (3) the same command again: resumes and answers
s=$(date +%s.%N)
klbisect run --repo "$d" --good "$good" --bad main --probe-cmd "$probe" --json > "$OUT/resume.log" 2>&1
rc=$?
python3 - "$OUT/resume.log" "$rc" "$s" "$culprit" "$pr" <<'PY'
import json, sys, time
log, rc, s, culprit, pr = sys.argv[1:]
text = open(log).read()
r = json.loads(text.strip().splitlines()[-1])
resumed = [l for l in text.splitlines() if "resuming session" in l or "reusing" in l]
right = "right" if r.get("culprit") == culprit else f"WRONG (planted {culprit[:12]})"
print(f"(3) rerun: exit {rc}, {time.time() - float(s):.0f} s, #{r.get('pr')} ({right}), confidence "
      f"{r.get('confidence', 0):.4f}, {r.get('probe_runs')} new probe runs; {resumed[:2]}")
PY
echo "compute processes at the end: $(apps)"
