"""Where probes run. ``LocalExecutor``: P slots on this machine, each with its
own worktree, GPU subset and port range, as threads that start processes.
Results come back as they finish, not in submission order.
"""
from __future__ import annotations

import os
import queue
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from .measure import Outcome
from .probe import Slot
from .proc import kill_all_active

PORT_SPAN = 100


@dataclass
class Failure:
    """An infrastructure failure (not a verdict): the job can be retried."""

    sha: str
    slot: int
    error: str


class Executor(Protocol):
    slots: int

    def free(self) -> int: ...

    def submit(self, sha: str) -> None: ...

    def wait(self, timeout: float | None = None) -> list[Outcome | Failure]: ...

    def in_flight(self) -> list[str]: ...

    def close(self) -> None: ...


def visible_gpus(env: dict | None = None) -> list[str]:
    env = os.environ if env is None else env
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return [g for g in cvd.split(",") if g.strip()]
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


def free_port_base(index: int) -> int:
    """A port range for a slot; its first port is free now (a server's launch
    still checks its own port)."""
    base = 30000 + (os.getpid() % 200) * 20 + index * PORT_SPAN // 20
    for cand in range(base, base + 2000, 7):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", cand))
                return cand
            except OSError:
                continue
    return 0


def make_slots(root: Path, parallel: int, gpus_per_probe: int = 0, gpus: Sequence[str] | None = None,
               pid_dir: Path | None = None) -> list[Slot]:
    groups = gpu_groups(parallel, gpus_per_probe, visible_gpus() if gpus is None else gpus)
    slots = []
    for i in range(parallel):
        env = {"CUDA_VISIBLE_DEVICES": ",".join(groups[i])} if gpus_per_probe > 0 else {}
        slots.append(Slot(i, root / f"slot-{i}", env, free_port_base(i), pid_dir))
    return slots


class LocalExecutor:
    def __init__(self, slots: list[Slot], measure: Callable[[str, Slot], Outcome]):
        self._slots = slots
        self.slots = len(slots)
        self._measure = measure
        self._idle: list[Slot] = list(slots)
        self._busy: dict[int, str] = {}
        self._done: "queue.Queue[Outcome | Failure]" = queue.Queue()
        self._threads: list[threading.Thread] = []

    def free(self) -> int:
        return len(self._idle)

    def in_flight(self) -> list[str]:
        return list(self._busy.values())

    def submit(self, sha: str) -> None:
        slot = self._idle.pop(0)
        self._busy[slot.index] = sha
        t = threading.Thread(target=self._work, args=(sha, slot), daemon=True)
        self._threads.append(t)
        t.start()

    def _work(self, sha: str, slot: Slot) -> None:
        try:
            result: Outcome | Failure = self._measure(sha, slot)
        except Exception as e:  # an infrastructure failure, reported, never a verdict
            result = Failure(sha, slot.index, f"{type(e).__name__}: {e}")
        self._done.put(result)

    def wait(self, timeout: float | None = None) -> list[Outcome | Failure]:
        """Block until at least one result (polling, so Ctrl-C reaches us)."""
        out: list[Outcome | Failure] = []
        waited = 0.0
        while not out:
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
            slot = next(s for s in self._slots if s.index == r.slot)
            self._busy.pop(slot.index, None)
            self._idle.append(slot)
        self._idle.sort(key=lambda s: s.index)
        return out

    def close(self) -> None:
        kill_all_active()
        for t in self._threads:
            t.join(timeout=10)
