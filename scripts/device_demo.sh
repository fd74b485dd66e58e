#!/usr/bin/env bash
# The H200 rows of docs/demo.rst: the demo on CUDA with two slots and with
# one, then `klbisect start` + `git bisect run` in the first demo's
# repository. Logs go to $OUT (default: ./demo-logs). For a GPU machine
# without network access, wheels for what its image lacks (GitPython, gitdb,
# smmap) can be carried in .whl/; with a normal environment
# `pip install -e . && klbisect demo --device cuda` is all it takes.
set -u
OUT=${OUT:-$PWD/demo-logs}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PYTHONPATH || exit 1
fi
if ! command -v klbisect >/dev/null; then
    bin=$(mktemp -d); printf '#!/bin/sh\nexec python3 -m klbisect "$@"\n' > "$bin/klbisect"
    chmod +x "$bin/klbisect"; export PATH=$bin:$PATH
fi
nvidia-smi -L; python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
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
