"""Run a child command in its own process group, log everything, kill it whole.

A probe launches servers that fork per GPU; killing only the shell would
leave GPU memory taken. Every exit path (normal end, timeout, Ctrl-C, an
exception in klbisect) goes through ``kill_tree``. If klbisect itself is
SIGKILLed, the pid file left in ``pid_dir`` lets the next command reap the
orphaned group (``reap_stale``).
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import psutil

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_MARK = "KLBISECT_PROBE_ID"
_subreaper = False
_ACTIVE: set[int] = set()  # process groups started by this process and not yet reaped


def kill_all_active() -> None:
    """Kill every probe or build this process is running (on Ctrl-C, worker
    threads never see the KeyboardInterrupt themselves)."""
    for pid in list(_ACTIVE):
        kill_tree(pid, grace=2.0)


@dataclass
class ProcResult:
    exit_code: int | None   # None when killed by us (timeout)
    timed_out: bool
    duration: float


def _child_setup() -> None:
    # New session = own process group; the terminal's Ctrl-C reaches klbisect,
    # which then kills the group itself. PDEATHSIG covers klbisect dying hard.
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def become_subreaper() -> None:
    """Orphans of our children (a server that double-forked or called
    setsid) are re-parented to us instead of init, so we can still find
    them once the probe itself has exited. The klbisect command calls this
    once at start; a library user decides for their own process."""
    global _subreaper
    if _subreaper:
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except OSError:
        pass
    _subreaper = True


def _kill_marked(mark: str) -> None:
    """Kill every descendant of ours that inherited this run's marker."""
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for p in kids:
        try:
            if p.environ().get(_MARK) == mark:
                kill_tree(p.pid, grace=2.0)
        except psutil.Error:
            continue


def kill_tree(pid: int, grace: float = 5.0) -> None:
    """SIGTERM the process group and every descendant, then SIGKILL survivors."""
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        procs = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace if sig == signal.SIGTERM else 2.0)
        procs = [p for p in alive if not _is_zombie(p)]
        if not procs and not _group_alive(pid):
            return


def _is_zombie(p: psutil.Process) -> bool:
    # An orphaned zombie waits for init to reap it; it holds no memory or GPU.
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and not _is_zombie(p):
                return True
        except (OSError, psutil.Error):
            continue
    return False


def reap_stale(pid_dir: Path) -> list[int]:
    """Kill process groups left behind by a klbisect that was killed hard."""
    reaped = []
    if not pid_dir.is_dir():
        return reaped
    for f in pid_dir.glob("*.pid"):
        try:
            owner, pgid = (int(x) for x in f.read_text().split())
        except (OSError, ValueError):
            f.unlink(missing_ok=True)
            continue
        if not psutil.pid_exists(owner) and _group_alive(pgid):
            kill_tree(pgid, grace=2.0)
            reaped.append(pgid)
        if not psutil.pid_exists(owner) or not _group_alive(pgid):
            f.unlink(missing_ok=True)
    return reaped


# klbisect's own secrets: a build, probe or server never needs them, and
# its log (kept under the git dir) must not be able to print them
PRIVATE_ENV = ("GITHUB_TOKEN",)


def child_environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: ``base`` (default: ours) less
    PRIVATE_ENV."""
    return {k: v for k, v in (os.environ if base is None else base).items() if k not in PRIVATE_ENV}


def run_logged(
    cmd: str | Sequence[str],
    cwd: Path,
    log_path: Path,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    pid_dir: Path | None = None,
    header: str | None = None,
) -> ProcResult:
    """Run ``cmd`` (a shell string the user wrote, or an argv list) to completion.

    Output (stdout and stderr together) goes to ``log_path``. Raises
    KeyboardInterrupt through after killing the group, so callers record
    nothing for an interrupted run.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = child_environ()
    if env:
        full_env.update(env)
    mark = full_env[_MARK] = uuid.uuid4().hex
    start = time.monotonic()
    with open(log_path, "wb") as log:
        if header:
            log.write(header.encode() + b"\n")
            log.flush()
        proc = subprocess.Popen(
            cmd,
            shell=isinstance(cmd, str),
            cwd=str(cwd),
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_child_setup,
        )
        _ACTIVE.add(proc.pid)
        pid_file = None
        if pid_dir is not None:
            pid_dir.mkdir(parents=True, exist_ok=True)
            pid_file = pid_dir / f"{proc.pid}.pid"
            pid_file.write_text(f"{os.getpid()} {proc.pid}\n")
        timed_out = False
        try:
            try:
                code: int | None = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                code = None
        finally:
            # Also after a normal exit: a server the probe started in the
            # background must not outlive the probe.
            kill_tree(proc.pid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            _kill_marked(mark)
            _ACTIVE.discard(proc.pid)
            if pid_file is not None:
                pid_file.unlink(missing_ok=True)
    return ProcResult(code, timed_out, time.monotonic() - start)


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
