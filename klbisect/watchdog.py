"""Reap what a klbisect process left running the moment it dies, kill -9 included.

``python -m klbisect.watchdog MARKER``, started by ``klbisect.proc`` with its
first child (``proc.watch``). Its stdin is a pipe whose write end only that
owner holds, so EOF means the owner has exited, however it died; each line
before it is a pid dir the owner writes pid files in. The probe's shell dies
with its owner (PDEATHSIG), its server and test did not: they held the GPU
until the next klbisect command's sweep. The watchdog runs that sweep as soon
as the owner is gone, and kills only what the sweep would: what carries the
dead owner's marker, and what its pid files noted. After a normal exit
nothing is left, and it exits at once.
"""
from __future__ import annotations

import os
import sys
import time

# s from EOF until the owner must read as gone: its exit is under way, though closing its last files
# (a GPU's) can take a while; after this it is taken to live on (an exec), and nothing is reaped
GONE_WAIT = 300.0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m klbisect.watchdog OWNER_MARKER", file=sys.stderr)
        return 2
    # away from the owner at once (it waits for this fork): no child of its own for it to wait
    # for, and none that its checks for leftover children (and a test's) would see
    try:
        if os.fork():
            os._exit(0)
    except OSError:
        return 1
    from pathlib import Path   # noqa: PLC0415   (after the fork: the owner waits for it)

    from . import proc  # noqa: PLC0415
    proc._is_watchdog = True
    marker = argv[0]
    dirs: dict[Path, None] = {}
    for line in sys.stdin.buffer:
        d = line.rstrip(b"\n")
        if d:
            dirs[Path(os.fsdecode(d))] = None
    start = time.monotonic()
    while proc.marker_alive(marker):   # a zombie already reads as gone
        waited = time.monotonic() - start
        if waited > GONE_WAIT:
            return 0   # it closed the pipe and lives on (an exec): not gone, nothing to reap
        time.sleep(0.02 if waited < 5 else 0.5)
    for d in dirs:
        proc.reap_stale(d)   # its groups, its marked and its noted processes, in one kill
    proc.reap_orphans_of(marker)   # what no pid file named: a run it was starting when it died
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
