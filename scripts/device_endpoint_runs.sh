#!/usr/bin/env bash
# docs/demo.rst, "Starting on two runs a side", on CUDA: the demo's history,
# then `klbisect run` in fresh clones of it with the default and with
# --endpoint-runs 2 (ROUNDS clones each, default 2). Setup in device_env.sh.
set -u
. "$(dirname "$0")/device_env.sh"
d=$(mktemp -d)/demo
timeout 400 klbisect demo --device cuda --dir "$d" > "$OUT/demo_cuda.log" 2>&1
start=$(grep -o "klbisect start .*" "$OUT/demo_cuda.log" | sed 's/^klbisect start //')
eval "set -- $start"
for r in $(seq 1 "${ROUNDS:-2}"); do
    for k in 6 2; do
        c=$(mktemp -d)/clone; git clone -q "$d" "$c"
        (cd "$c" && time timeout 400 klbisect run "$@" --endpoint-runs "$k") > "$OUT/run_ep${k}_$r.log" 2>&1
        echo "endpoint-runs $k round $r: $(grep -E '^First bad commit|^Confidence|^Probe runs|^real' \
            "$OUT/run_ep${k}_$r.log" | tr '\n' ' ')"
    done
done
