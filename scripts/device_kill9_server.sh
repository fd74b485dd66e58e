#!/usr/bin/env bash
# The "kill -9 with a server on the GPU" rows of docs/demo.rst: a probe that
# starts a detached CUDA process (setsid, as a server's workers may) and
# waits; klbisect is killed with SIGKILL once that process is on the GPU,
# and nvidia-smi's compute processes are counted 0, 2 and 10 s later:
# with klbisect's watchdog, and with it off (KLBISECT_NO_WATCHDOG=1, the
# behaviour before it: the next klbisect command reaps). Setup in device_env.sh.
set -u
. "$(dirname "$0")/device_env.sh"
d=$(mktemp -d)/demo
read -r good < <(python3 -c "
import sys
from pathlib import Path
from klbisect.demo import create_demo_repo
print(create_demo_repo(Path(sys.argv[1]), device='cuda').good)" "$d")
apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c .; }
holder="setsid python3 -c 'import torch, time; x = torch.ones(1 << 28, device=\"cuda\"); time.sleep(900)' & sleep 900"
for mode in watchdog off; do
    if [ $mode = off ]; then export KLBISECT_NO_WATCHDOG=1; fi
    klbisect calibrate --repo "$d" --rev "$good" --runs 1 --fresh --probe-cmd "$holder" > "$OUT/kill9_$mode.log" 2>&1 &
    k=$!
    for _ in $(seq 240); do [ "$(apps)" -gt 0 ] && break; sleep 0.5; done
    sleep 1
    kill -KILL "$k"; wait "$k" 2>/dev/null
    a=$(apps); sleep 2; b=$(apps); sleep 8; c=$(apps)
    echo "$mode: compute processes 0/2/10 s after kill -9: $a $b $c"
    klbisect status --repo "$d" > /dev/null 2>&1; sleep 2
    echo "$mode: after klbisect status: $(apps)"
    unset KLBISECT_NO_WATCHDOG
done
