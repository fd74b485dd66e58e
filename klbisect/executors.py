"""Where probes run. ``LocalExecutor``: P slots on this machine, each with its
own worktree, GPU subset and port range, as threads that start processes.
``ray_executor.RayExecutor`` (optional extra): one Ray task per probe.
Results come back as they finish, not in submission order.

Every submitted job yields exactly one result: an ``Outcome`` (a measurement,
or a build failure, for the caller to record) or a ``Failure`` (something
outside the commit went wrong: the caller may submit the commit again; a
``Failure`` is never evidence about the commit).
"""
from __future__ import annotations

import dataclasses
import os
import queue
import shutil
import socket
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from .errors import KlbisectError
from .measure import Outcome
# a slot's ports are the probe's (a Slot's port_base): the CLI checks --parallel against them
# without loading this module's GitPython
from .probe import PORT_HIGH, PORT_LOW, PORT_SPAN, SERVER_REACH, Slot
from .runs import CRASHED
from .proc import kill_all_active


# Exit statuses of a probe that was killed from outside (SIGKILL, SIGTERM),
# as Popen reports them (-N) or as a shell reports its killed child (128+N).
# Our own timeout kill is reported as status "timeout", not through these.
_KILLED_EXIT = {-9, -15, 137, 143}


@dataclass
class Failure:
    """An infrastructure failure (not a verdict): the job can be retried."""

    sha: str
    slot: int
    error: str
    outcome: Outcome | None = None   # a probe killed by a signal: its run, should the kills be its own
    errno: int | None = None         # an OSError's: a full disk or an unwritable log folder is not the repo's


class Executor(Protocol):
    slots: int

    def free(self) -> int: ...

    def submit(self, sha: str) -> None: ...

    def wait(self, timeout: float | None = None) -> list[Outcome | Failure]: ...

    def in_flight(self) -> list[str]: ...

    def close(self) -> None: ...


def infrastructure_failure(outcome: Outcome) -> str | None:
    """Why a finished measurement says nothing about its commit, or None.

    A probe that printed no value because something outside it killed it
    (SIGKILL/SIGTERM: an operator, the host's OOM killer, a preempted node) is
    not the commit's crash: recording it would push the commit towards
    untestable. A run that printed a value is a measurement whatever ended it.
    """
    r = outcome.run
    if r is not None and r.status in CRASHED and not r.values and r.exit_code in _KILLED_EXIT:
        sig = -r.exit_code if r.exit_code < 0 else r.exit_code - 128
        # --probe sglang reports its server's status: the probe itself was not the one killed
        return (f"probe (or its server) killed from outside by {signal.Signals(sig).name} (exit {r.exit_code}, "
                f"no value; log {r.log_path})")
    return None


def visible_gpus(env: dict | None = None) -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set (ids or
    UUIDs, in the declared order), else every GPU nvidia-smi (or torch) sees."""
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [g.strip() for g in cvd.split(",") if g.strip()]
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30)
            if out.returncode == 0:
                return [line.strip() for line in out.stdout.splitlines() if line.strip()]
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import torch  # noqa: PLC0415 - optional; counting GPUs only
        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []


def gpu_groups(parallel: int, gpus_per_probe: int, gpus: Sequence[str]) -> list[list[str]]:
    """Split the visible GPUs into one disjoint group per slot."""
    if gpus_per_probe <= 0:
        return [[] for _ in range(parallel)]
    need = parallel * gpus_per_probe
    if need > len(gpus):
        from .errors import EXIT_USAGE, KlbisectError
        raise KlbisectError(f"--parallel {parallel} x --gpus-per-probe {gpus_per_probe} needs {need} GPUs, "
                            f"{len(gpus)} visible ({','.join(gpus) or 'none'}); lower one of them", EXIT_USAGE)
    return [list(gpus[i * gpus_per_probe:(i + 1) * gpus_per_probe]) for i in range(parallel)]


def _range_free(base: int, span: int) -> bool:
    for port in range(base, base + span):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def port_bases(count: int, span: int = PORT_SPAN, taken: Sequence[int] = (),
               start: int | None = None, apart: int = SERVER_REACH) -> list[int]:
    """``count`` disjoint ranges of ``span`` ports, each free right now (a
    server's launch still checks its own port), ``apart`` ports apart where
    that many fit (else ``span``). The search starts at block ``start``
    (default: from the pid, so two klbisects on one machine usually get
    different ranges)."""
    blocks = (PORT_HIGH - PORT_LOW) // span
    start = (os.getpid() if start is None else start) % blocks
    out: list[int] = []
    for gap in dict.fromkeys((max(apart, span), span)):
        busy = set(taken)
        out = []
        for j in range(blocks):
            base = PORT_LOW + ((start + j) % blocks) * span
            if any(abs(base - t) < gap for t in busy):
                continue
            if _range_free(base, span):
                out.append(base)
                busy.add(base)
                if len(out) == count:
                    return out
    out += [0] * (count - len(out))   # 0: no port range (the probe picks its own)
    return out


def make_slots(root: Path, parallel: int, gpus_per_probe: int = 0, gpus: Sequence[str] | None = None,
               pid_dir: Path | None = None) -> list[Slot]:
    if gpus_per_probe > 0:
        groups = gpu_groups(parallel, gpus_per_probe, visible_gpus() if gpus is None else gpus)
    else:
        groups = [[] for _ in range(parallel)]
    bases = port_bases(parallel)
    slots = []
    for i in range(parallel):
        env = {"CUDA_VISIBLE_DEVICES": ",".join(groups[i])} if gpus_per_probe > 0 else {}
        slots.append(Slot(i, root / f"slot-{i}", env, bases[i], pid_dir))
    return slots


class LocalExecutor:
    """One thread per busy slot; each job puts exactly one result on a queue.

    With ``spare_checkouts`` the slots (GPUs, ports) run in a pool of
    checkouts that many larger than the slots: a commit goes to a free
    checkout that last had it (checked out and built), else to a new one,
    else to the one idle longest. A search revisits a few commits (the
    endpoints, the two beside the boundary) from whichever slot is free:
    a checkout per slot rebuilt them again and again (a tester's
    --parallel 2 built one commit six times in one run)."""

    def __init__(self, slots: list[Slot], measure: Callable[[str, Slot], Outcome], spare_checkouts: int = 0):
        if not slots:
            raise ValueError("LocalExecutor needs at least one slot")
        self._slots = {s.index: s for s in slots}
        self.slots = len(slots)
        self._measure = measure
        self._idle: list[int] = sorted(self._slots)
        self._busy: dict[int, str] = {}
        self._pooled = spare_checkouts > 0
        root = slots[0].checkout.parent
        self._pool = [s.checkout for s in slots] + [root / f"slot-{len(slots) + k}" for k in range(spare_checkouts)]
        self._last: dict[Path, str] = {}         # checkout -> the commit last given to it
        self._used: dict[Path, int] = {}         # checkout -> when it was last given a job
        self._in_use: dict[int, Path] = {}       # busy slot -> its checkout
        self._slot_at: dict[Path, int] = {}      # checkout -> the slot that last ran in it
        self._jobs = 0
        self._done: "queue.Queue[Outcome | Failure]" = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def free(self) -> int:
        return len(self._idle)

    def in_flight(self) -> list[str]:
        return list(self._busy.values())

    def checkouts(self) -> list[Path]:
        """Every checkout a job may have used (to remove at the end)."""
        return list(self._pool)

    def _free_checkouts(self) -> list[Path]:
        if not self._pooled:
            return [self._slots[i].checkout for i in self._idle]
        busy = set(self._in_use.values())
        return [c for c in self._pool if c not in busy]

    def warm(self, sha: str) -> bool:
        """Whether a free checkout last had ``sha`` (checked out and built)."""
        return bool(self._idle) and any(self._last.get(c) == sha for c in self._free_checkouts())

    def submit(self, sha: str) -> None:
        if not self._idle:
            raise RuntimeError("no free slot: call wait() first")
        # A checkout that last had this commit has it built (and the slot that
        # ran there, for server probes, may still have its server up).
        free = self._free_checkouts()
        checkout = next((c for c in free if self._last.get(c) == sha), None)
        if checkout is None and self._pooled:
            # one that needs no build for it (its packaging is the same), else a fresh one,
            # which keeps every other checkout's build, else the one idle longest; but where
            # builds from nothing have cost far more than builds in place (an in-tree C++
            # build), the one idle longest before a fresh one
            meter = self._meter()
            would_build = getattr(meter, "would_build", None)
            used = [c for c in free if c in self._last]
            ready = [c for c in used if would_build is not None and not would_build(c, sha)]
            fresh = [c for c in free if c not in self._last]
            dear = bool(used) and bool(getattr(meter, "fresh_costs_more", lambda: False)())
            checkout = (max(ready, key=lambda c: self._used[c]) if ready
                        else fresh[0] if fresh and not dear
                        else min(used, key=lambda c: self._used[c]) if used else fresh[0])
        elif checkout is None:
            checkout = self._slots[self._idle[0]].checkout
        if self._pooled:
            was = self._slot_at.get(checkout)
            index = was if was in self._idle else self._idle[0]
            if was is not None and was != index:
                # the slot that ran here may still hold a server started from this checkout
                release = getattr(getattr(self._meter(), "probe", None), "release_checkout", None)
                if release is not None:
                    release(was, checkout)
        else:
            index = next(i for i in self._idle if self._slots[i].checkout == checkout)
        self._idle.remove(index)
        self._jobs += 1
        self._last[checkout], self._used[checkout] = sha, self._jobs
        self._in_use[index], self._slot_at[checkout] = checkout, index
        self._busy[index] = sha
        slot = dataclasses.replace(self._slots[index], checkout=checkout)
        t = threading.Thread(target=self._work, args=(sha, slot), name=f"klbisect-slot-{index}", daemon=True)
        t.start()   # before it is listed: close() on a signal in between joins only started threads
        self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _meter(self):
        """The Measurer whose ``measure`` this runs, when it is one: what it
        knows of builds and probes steers where a commit goes."""
        return getattr(self._measure, "__self__", None)

    def _forget_build(self, slot: Slot) -> None:
        # After a failure mid-job the checkout may hold a half-finished
        # build: make its next commit rebuild.
        last = getattr(self._meter(), "last_built", None)
        if isinstance(last, dict):
            last[str(slot.checkout)] = None

    def _work(self, sha: str, slot: Slot) -> None:
        result: Outcome | Failure = Failure(sha, slot.index, "worker ended without a result")
        try:
            out = self._measure(sha, slot)
            why = infrastructure_failure(out) if isinstance(out, Outcome) else "measure returned no Outcome"
            if why:
                self._forget_build(slot)
                result = Failure(sha, slot.index, why, out)
            else:
                result = out
        except BaseException as e:  # noqa: BLE001 - infrastructure, reported, never a verdict
            self._forget_build(slot)
            # klbisect's own line without its advice (the caller says what to do), else the exception
            why = e.message.split("; ")[0] if isinstance(e, KlbisectError) else f"{type(e).__name__}: {e}"
            result = Failure(sha, slot.index, why, errno=getattr(e, "errno", None))
        finally:
            self._done.put(result)   # exactly one result per job, whatever happened

    def wait(self, timeout: float | None = None) -> list[Outcome | Failure]:
        """Every result finished so far, blocking until there is at least one
        (polling, so Ctrl-C reaches us). Returns [] at once when nothing is in
        flight, or after ``timeout`` seconds."""
        out: list[Outcome | Failure] = []
        waited = 0.0
        while not out:
            if not self._busy and self._done.empty():
                return out
            try:
                out.append(self._done.get(timeout=0.2))
            except queue.Empty:
                waited += 0.2
                if timeout is not None and waited >= timeout:
                    return out
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        for r in out:
            if self._busy.pop(r.slot, None) is not None:
                self._idle.append(r.slot)
                self._in_use.pop(r.slot, None)
        self._idle.sort()
        return out

    def close(self) -> None:
        kill_all_active()
        for t in self._threads:
            t.join(timeout=10)
