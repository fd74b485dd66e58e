# Sourced by the scripts/device_*.sh scripts: make klbisect runnable from this
# checkout on a GPU machine without network access. Wheels for what its image
# lacks (GitPython, gitdb, smmap) can be carried in .whl/; with a normal
# environment `pip install -e .` is all it takes.
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
