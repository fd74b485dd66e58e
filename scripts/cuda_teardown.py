#!/usr/bin/env python3
"""How long a killed CUDA process takes to be gone, and its GPU memory to
come back: what ``proc.KILL_WAIT`` must cover before a slot launches the
next server on the same GPU.

Starts ``--procs`` processes (one group, as a probe's server and its
workers), each holding ``--gib`` GiB on the GPU and running kernels, then
kills them through ``proc.kill_tree`` (SIGTERM, the grace, SIGKILL) or with
``--sigkill`` at once, and reports the seconds until every process is gone
and until ``nvidia-smi`` shows the memory free again. With ``--nccl`` the
processes are a tensor-parallel group as an SGLang TP server's workers are:
process k on GPU k (of those visible), joined by NCCL, all-reducing in a
loop when killed. Needs a GPU (``--nccl``: ``--procs`` of them).

    python scripts/cuda_teardown.py --procs 4 --gib 12 --trials 3
    python scripts/cuda_teardown.py --procs 4 --gib 60 --trials 3 --nccl
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from klbisect import proc  # noqa: E402

WORKER = """
import sys, time, torch
gib, rank, world, port = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if world:
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    import datetime
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
a = torch.randn(4096, 4096, device="cuda")
if world:
    dist.all_reduce(a)
torch.cuda.synchronize()
print("ready", flush=True)
while True:
    a = (a @ a).clamp_(-1, 1)
    if world:
        dist.all_reduce(a)
"""


START_TIMEOUT = 120.0   # seconds for every worker to hold its memory (and join NCCL)


def used_mib() -> int:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(v) for v in out.split())


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(procs: int, gib: float, sigkill: bool, worker: str, nccl: bool) -> tuple[float, float, int]:
    base = used_mib()
    port = _free_port()
    each = [f"{shlex.quote(sys.executable)} {shlex.quote(worker)} {gib} {k} {procs if nccl else 0} {port}"
            for k in range(procs)]
    leader = subprocess.Popen(
        ["bash", "-c", " & ".join(each) + " & wait"],
        stdout=subprocess.PIPE, text=True, preexec_fn=proc._child_setup)
    # a worker that failed (out of memory) while the others hold stdout open would leave
    # readline waiting for good: the whole start has a deadline
    timer = threading.Timer(START_TIMEOUT, proc.kill_tree, (leader.pid,), {"grace": 1.0})
    timer.start()
    try:
        for _ in range(procs):
            line = leader.stdout.readline().strip()
            if line != "ready":   # one failed to start: stop the rest, say so
                proc.kill_tree(leader.pid, grace=1.0)
                raise SystemExit(f"a worker did not start within {START_TIMEOUT:.0f} s "
                                 f"({line or 'no output'}): lower --procs or --gib")
    finally:
        timer.cancel()
    held = used_mib() - base
    root = psutil.Process(leader.pid)
    tree = [root] + root.children(recursive=True)
    t0 = time.monotonic()
    if sigkill:
        os.killpg(leader.pid, signal.SIGKILL)
    else:
        proc.kill_tree(leader.pid, grace=5.0)
    leader.wait()
    gone = None
    while True:
        alive = [p for p in tree if _running(p)]
        if not alive and gone is None:
            gone = time.monotonic() - t0
        if gone is not None and used_mib() - base < 0.05 * held:
            return gone, time.monotonic() - t0, held
        if time.monotonic() - t0 > 120:
            return gone or float("nan"), float("nan"), held
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--gib", type=float, default=12.0,
                    help="per process; all of them must fit on the GPU (with --nccl: each on its own GPU)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--sigkill", action="store_true", help="SIGKILL at once (klbisect's last resort)")
    ap.add_argument("--nccl", action="store_true", help="one process a GPU, an NCCL group all-reducing (TP)")
    args = ap.parse_args()
    if args.nccl:
        import torch  # noqa: PLC0415
        if torch.cuda.device_count() < args.procs:
            raise SystemExit(f"--nccl puts one process on each GPU: {args.procs} processes, "
                             f"{torch.cuda.device_count()} GPUs visible")
    how = "SIGKILL" if args.sigkill else "kill_tree"
    worker = os.path.join(tempfile.mkdtemp(), "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    for k in range(args.trials):
        gone, free, held = trial(args.procs, args.gib, args.sigkill, worker, args.nccl)
        print(f"{how}: {args.procs} processes{' (NCCL, one a GPU)' if args.nccl else ''} holding {held} MiB: gone after {gone:.2f} s, "
              f"memory free after {free:.2f} s (trial {k + 1})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
