"""Run a child command in its own process group, log everything, kill it whole.

A probe launches servers that fork per GPU; killing only the shell would
leave GPU memory taken. Every exit path (normal end, timeout, Ctrl-C,
SIGTERM, SIGHUP, an exception in klbisect) goes through ``kill_tree``. If
klbisect itself is SIGKILLed, its watchdog (``klbisect.watchdog``, started
with its first child) reaps what it left at once, and the pid file left in
``pid_dir`` lets the next command do it too (``reap_stale``): every child
carries its owner's marker in its environment (``child_environ``), and only
processes with the marker of an owner that is gone are killed.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import psutil

from .errors import shown
from .redact import redact

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
MARK = "KLBISECT_PROBE_ID"   # one run_logged call (or server): its detached children are killed with it
_OWNER = "KLBISECT_OWNER"     # the klbisect process that started a child, as "pid:start ticks"
_subreaper = False
_ACTIVE: set[int] = set()  # process groups started by this process and not yet reaped
_STOPPED: set[int] = set()  # of those, the ones kill_all_active killed
_HALTED: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()  # threads that may start nothing more


_hurry = threading.Event()   # set by a second stop signal while a tree is being killed
_shield_depth = 0


@contextmanager
def _unkillable_cleanup() -> Iterator[None]:
    """Ctrl-C (or SIGTERM) pressed again while trees are being killed: a
    KeyboardInterrupt raised in the middle of the kill used to end it
    before its SIGKILL, leaving the group running behind an exit 130. Here
    a repeated signal turns the wait into SIGKILL at once, and the
    interrupt is raised when the outermost cleanup is done."""
    global _shield_depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def handler(signum, frame):
        got.append(signum)
        _hurry.set()
        _sigkill_active()

    old = {}
    if _shield_depth == 0:
        for s in (signal.SIGINT, *STOP_SIGNALS):
            h = signal.getsignal(s)
            if h not in (signal.SIG_IGN, None):
                old[s] = signal.signal(s, handler)
    _shield_depth += 1
    try:
        yield
    finally:
        _shield_depth -= 1
        for s, h in old.items():
            signal.signal(s, h)
        if _shield_depth == 0:
            _hurry.clear()
        if got:
            raise KeyboardInterrupt


@atexit.register   # the last net: klbisect exiting with a run's group still registered
def _sigkill_active() -> None:
    for pgid in list(_ACTIVE):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_all_active() -> None:
    """Kill every probe or build this process is running (on Ctrl-C, worker
    threads never see the KeyboardInterrupt themselves).

    A run killed here ends in KeyboardInterrupt, never in an exit status (a
    killed build is no successful build), and the threads that run them may
    start no process after this: a build that ends just now is not followed
    by its probe.
    """
    me, main = threading.current_thread(), threading.main_thread()
    _HALTED.update(t for t in threading.enumerate() if t is not me and t is not main)
    with _unkillable_cleanup():
        # every tree signalled before one wait: one at a time, eight slots' servers
        # took eight graces and KILL_WAITs in turn (a reviewer's)
        pids = list(_ACTIVE)
        _STOPPED.update(pids)
        kill_tree(*pids, grace=2.0)


def _halted() -> bool:
    return threading.current_thread() in _HALTED


def _children() -> set[int]:
    try:
        return {c.pid for c in psutil.Process().children()}
    except psutil.Error:
        return set()


def refuse_if_stopping() -> None:
    """Raise KeyboardInterrupt where no new process may start: in a thread
    ``kill_all_active`` halted, or after a stop signal."""
    if _halted():
        raise KeyboardInterrupt("klbisect is stopping: no new process")
    raise_if_signalled()


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def interrupt_on_stop_signals() -> Iterator[None]:
    """SIGTERM (a CI job cancelled, a `kill`) and SIGHUP (the terminal
    closed, an ssh session dropped) unwind like Ctrl-C, so probes are killed,
    state stays consistent and klbisect exits 130. A signal that is ignored
    (``nohup``) stays ignored."""
    ttys = [fd for fd in (1, 2) if os.isatty(fd)]   # a hung-up terminal no longer says it is one

    def handler(signum, frame):
        if _settled.is_set():
            return
        again = _signalled.is_set()
        _signalled.set()
        if signum == signal.SIGHUP:
            _leave_terminal(ttys)
        # while Popen waits for the exec, raised once the child is registered (``_run_marked``);
        # a second signal there is someone waiting on a spawn that hangs (a cwd on a dead mount)
        if not _spawning or again:
            raise KeyboardInterrupt

    ours = [s for s in STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        ours.append(signal.SIGINT)
    try:
        old = {s: signal.signal(s, handler) for s in ours}
    except ValueError:  # not the main thread
        yield
        return
    old_hook = sys.unraisablehook

    def unraisable(info):
        if not isinstance(info.exc_value, KeyboardInterrupt):
            old_hook(info)   # a lost Ctrl-C is no traceback: the next process start raises it again

    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        sys.unraisablehook = old_hook
        for s, h in old.items():
            signal.signal(s, signal.SIG_IGN if _settled.is_set() else signal.SIG_DFL if h is None else h)
        _signalled.clear()


# A stop signal whose KeyboardInterrupt Python swallowed: one that lands in
# an at-fork hook while Popen forks (logging's lock release) or in a
# finalizer is printed as "Exception ignored" and lost, and the command ran
# on to its end and exit 0 after a Ctrl-C. Every new process checks this.
_signalled = threading.Event()
_settled = threading.Event()


def settle() -> None:
    """The command's answer is printed and its exit code chosen: a stop
    signal from now on (during the interpreter's teardown) must change
    neither. A tester's TERM a moment after `run` printed its JSON with
    exit code 0 made the process exit 143, and one after `start` had
    begun git bisect made `start && git bisect run ...` stop there. Only
    the command-line entry point calls it: the process ends next."""
    _settled.set()
    for s in (*STOP_SIGNALS, signal.SIGINT):
        try:
            signal.signal(s, signal.SIG_IGN)
        except ValueError:   # not the main thread
            pass

# The main thread is inside Popen: a KeyboardInterrupt raised there (while
# it waits for the child's exec) would leave the child running with its pid
# known to nobody, so nothing kills it (a reviewer's: a probe's background
# server outlived klbisect's exit 130). The stop handler only notes the
# signal then; ``_run_marked`` raises it once the pid is registered.
_spawning = False


def raise_if_signalled() -> None:
    if _signalled.is_set():
        raise KeyboardInterrupt


@contextmanager
def despite_a_stop() -> Iterator[None]:
    """Cleanup that must start processes after the stop signal it unwinds
    from (pip putting the user's interpreter back): the signal already
    taken up does not refuse them, a new one still stops them, and the
    note of it stands again after (a tester's one Ctrl-C left the venv on a
    deleted worktree: the restore's first pip was refused as "stopping")."""
    was = _signalled.is_set()
    unwinding = sys.exc_info()[1] is not None    # called from a `finally` the stop runs through
    _signalled.clear()
    try:
        yield
    finally:
        if was:
            _signalled.set()
    if was and not unwinding:
        # a stop Python swallowed, noted and nothing unwinding from it: once the cleanup is
        # done, it stops the command (a reviewer's: it exited 0 after the restore)
        raise KeyboardInterrupt


def _leave_terminal(fds: Sequence[int]) -> None:
    # After a hangup every write to the terminal fails with EIO: the
    # "interrupted" line, and the flush at exit, would turn exit 130 into a
    # traceback. What is left to say goes to /dev/null instead.
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(null, fd)
    finally:
        os.close(null)


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


def kill_marked(mark: str) -> None:
    """Kill every descendant of ours that inherited this run's marker."""
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    found = []
    for p in kids:
        try:
            if p.environ().get(MARK) == mark:
                found.append(p)
        except psutil.Error:
            continue
    if found:
        # one that called setsid leads a group of its own
        _terminate([p.pid for p in found], _with_descendants(found), grace=2.0)


def _boot_ticks() -> int:
    """Now, in the clock ticks since boot that /proc gives a process's start in."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


# run_logged calls in flight in this process, and when the first of them began
_running_lock = threading.Lock()
_running = 0
_running_since = 0


def _adopted() -> list[psutil.Process]:
    """Children of ours that we did not start, as far as can be told: as
    subreaper we become the parent of our probes' orphans. Not a Popen we
    wait for (``_ACTIVE``), not in our own process group (git and our other
    helpers are, and their callers wait for them)."""
    if not _subreaper:
        return []
    try:
        mine = os.getpgid(0)
        kids = psutil.Process().children()
    except (OSError, psutil.Error):
        return []
    out = []
    for p in kids:
        try:
            if p.pid not in _ACTIVE and os.getpgid(p.pid) != mine:
                out.append(p)
        except OSError:
            continue
    return out


def _kill_unmarked_orphans(since: int) -> None:
    """Kill what a probe left that carries no marker: a daemon that cleared
    its environment (``env -i setsid server &``, a double fork that calls
    ``clearenv``) escapes ``kill_marked``."""
    found = _unmarked_orphans(since)
    if found:
        _terminate([], _with_descendants(found), grace=2.0)


def _unmarked_orphans(since: int) -> list[psutil.Process]:
    """Our adopted children started after ``since`` (clock ticks) with
    neither of klbisect's variables (servers and runs carry ours): they can
    only be what a probe left and hid from the marker."""
    found = []
    try:
        ours = psutil.Process().cmdline()
    except psutil.Error:
        ours = None
    for p in _adopted():
        try:
            if (_start_ticks(p.pid) or 0) < since:
                continue
            # a child another thread is starting right now, forked but not yet exec'd, shows
            # our own command line and environment (a tester's parallel probes got SIGTERM)
            if ours is not None and p.cmdline() == ours:
                continue
            env = p.environ()
        except (OSError, psutil.Error):
            continue
        # a watchdog (ours, or a forked child's, handed to us as subreaper) is at work
        if MARK not in env and _OWNER not in env and _WATCHDOG not in env:
            found.append(p)
    return found


def _reap_adopted_zombies() -> None:
    """Wait for the adopted children that have exited (a server's workers,
    orphaned when a test's tearDown killed the server): nobody else will,
    and a long session would pile up thousands."""
    for p in _adopted():
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)
        except (OSError, psutil.Error):
            continue


def kill_tree(*pids: int, grace: float = 5.0) -> None:
    """SIGTERM each process group and every descendant, then SIGKILL
    survivors; several trees are signalled before one wait."""
    roots = []
    for pid in pids:
        try:
            roots.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _terminate(list(pids), _with_descendants(roots), grace)


def _with_descendants(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    out: dict[int, psutil.Process] = {}
    for p in procs:
        out.setdefault(p.pid, p)
        try:
            for c in p.children(recursive=True):
                out.setdefault(c.pid, c)
        except psutil.Error:
            continue
    return list(out.values())


# After SIGKILL: a CUDA process tears its contexts down before it is gone (seconds
# for a TP-4 server's workers), and the next launch on its GPUs needs their memory
KILL_WAIT = 10.0


def _terminate(pgids: Sequence[int], procs: list[psutil.Process], grace: float) -> None:
    """SIGTERM the groups and processes, wait up to ``grace`` s, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pgid in pgids:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in procs:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        procs = _wait_exited(procs, grace if sig == signal.SIGTERM else KILL_WAIT)
        if not procs and not any(_group_alive(g) for g in pgids):
            return


def _wait_exited(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes still running after at most ``timeout`` s.

    Unlike psutil.wait_procs this never reaps a child that a Popen of ours
    waits for (``_ACTIVE``): reaped behind its back, Popen.wait gets ECHILD
    and reports exit 0, and a killed build would read as a successful one.
    """
    deadline = time.monotonic() + timeout
    while True:
        procs = [p for p in procs if not _exited(p)]
        if not procs or time.monotonic() >= deadline or _hurry.is_set():
            return procs
        time.sleep(0.05)


def _exited(p: psutil.Process) -> bool:
    try:
        if not p.is_running():
            return True
        if p.status() != psutil.STATUS_ZOMBIE:
            return False
    except psutil.Error:
        return True
    if p.pid not in _ACTIVE:
        # an orphan handed to us as subreaper: nobody else will wait for it
        try:
            os.waitpid(p.pid, os.WNOHANG)
        except ChildProcessError:
            pass   # another's zombie: its parent (or init) reaps it
    return True


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


# ---- what a klbisect killed with SIGKILL left behind ---------------------------------------------

def _start_ticks(pid: int) -> int | None:
    """When the process started, in clock ticks since boot: unlike a wall-clock
    create_time, exact and unmoved by clock steps, so (pid, start) names one
    process for good."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        # a zombie no longer runs: a klbisect killed with SIGKILL whose parent has not
        # waited for it yet (or a container's init that never does) must read as gone
        return None if fields[0] in (b"Z", b"X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


@lru_cache(maxsize=None)
def _marker_of(pid: int) -> str:
    return f"{pid}:{_start_ticks(pid)}"


def owner_marker() -> str:
    """This process's marker, as its children carry it in ``KLBISECT_OWNER``."""
    return _marker_of(os.getpid())   # per pid: a forked process is another owner


def marker_alive(marker: str | None) -> bool:
    """Is the process this marker names (``owner_marker``) still running?"""
    parsed = _parse_marker(marker)
    return parsed is not None and _start_ticks(parsed[0]) == parsed[1]


def _parse_marker(marker: str | None) -> tuple[int, int] | None:
    try:
        pid, ticks = (marker or "").split(":")
        return int(pid), int(ticks)
    except ValueError:
        return None


def _orphan_of(marker: str | None, owner: int) -> bool:
    """Whether a process carrying ``marker`` was started by the klbisect
    ``owner`` (a pid) and that process no longer runs."""
    parsed = _parse_marker(marker)
    return parsed is not None and parsed[0] == owner and _start_ticks(owner) != parsed[1]


def write_pid_file(pid_dir: Path, pgid: int) -> Path:
    """Record a process group we started, for ``reap_stale`` should we be
    killed hard: "owner pgid owner-marker" (older files lack the marker)."""
    watch(pid_dir)
    pid_dir.mkdir(parents=True, exist_ok=True)
    path = pid_dir / f"{pgid}.pid"
    tmp = pid_dir / f"{pgid}.pid.tmp"
    try:
        # whole or not at all: a sweep (every watchdog's, at every exit) that read it empty, half
        # written, unlinked it, and the run's notes then began a file with no owner line
        tmp.write_text(f"{os.getpid()} {pgid} {owner_marker()}\n")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        raise
    return path


NOTE_EVERY = 1.0   # seconds between looks at a run's descendants (``note_descendants``)


def _wait_noting(proc: subprocess.Popen, timeout: float | None, pid_file: Path | None) -> tuple[int | None, bool]:
    """Wait for ``proc`` (exit code, timed out), noting its descendants in
    its pid file every NOTE_EVERY s."""
    if pid_file is None:
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            return None, True
    deadline = None if timeout is None else time.monotonic() + timeout
    noted: set[int] = set()
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        try:
            return proc.wait(timeout=NOTE_EVERY if left is None else max(0.0, min(NOTE_EVERY, left))), False
        except subprocess.TimeoutExpired:
            if left is not None and left <= NOTE_EVERY:
                return None, True
        note_descendants(pid_file, proc.pid, noted)


def note_descendants(pid_file: Path, pid: int, noted: set[int]) -> None:
    """Add the run's descendants not yet in ``noted`` (pid and start) to its
    pid file. One that cleared its environment and left the group (``env -i
    setsid``) carries no marker: after the run ends it is init's, and when
    klbisect was killed hard this is how the next command finds it (a
    tester's daemon outlived every later command). A daemon of a double
    fork is no longer the run's descendant once its middle process exits: it
    is ours (the subreaper's), so our unmarked adopted children that began
    after the run are noted too (another tester's outlived a SIGKILL)."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    since = _start_ticks(pid)
    if since is not None:
        for p in _unmarked_orphans(since):
            try:
                kids += [p, *p.children(recursive=True)]
            except psutil.Error:
                continue
    lines = []
    for k in kids:
        ticks = _start_ticks(k.pid) if k.pid not in noted else None
        if ticks is not None:
            noted.add(k.pid)
            lines.append(f"{k.pid} {ticks}\n")
    if lines:
        try:
            with open(pid_file, "a") as f:
                f.write("".join(lines))
        except OSError:
            pass   # a full disk: the marker still finds the rest


def _noted_alive(path: Path) -> list[psutil.Process]:
    """The processes a pid file noted that still run (the same pid and start)."""
    try:
        lines = path.read_text().splitlines()[1:]
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            pid, ticks = map(int, line.split())
            if _start_ticks(pid) == ticks:
                out.append(psutil.Process(pid))
        except (ValueError, psutil.Error):
            continue
    return out


def _read_pid_file(path: Path) -> tuple[int, int, str | None] | None:
    try:
        owner, pgid, *rest = path.read_text().split()
        return int(owner), int(pgid), (rest[0] if rest else None)
    except (OSError, ValueError):
        return None


def _owner_gone(path: Path, owner: int, marker: str | None) -> bool:
    if marker is not None:
        parsed = _parse_marker(marker)
        return parsed is not None and _start_ticks(owner) != parsed[1]
    # an old-format file: the pid may since have gone to a process started after the file
    try:
        return psutil.Process(owner).create_time() > path.stat().st_mtime + 1.0
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):
        return False


def _marked_processes() -> list[tuple[psutil.Process, str]]:
    """Every process we can read that carries an owner marker, but not
    ourselves or our ancestors (a klbisect run by a probe)."""
    try:
        me = psutil.Process()
        skip = {me.pid} | {p.pid for p in me.parents()}
    except psutil.Error:
        skip = {os.getpid()}
    out = []
    for p in psutil.process_iter(["pid"]):
        if p.pid in skip:
            continue
        try:
            marker = p.environ().get(_OWNER)
            if marker and not _is_zombie(p):
                out.append((p, marker))
        except psutil.Error:
            continue
    return out


def _reap_owner(owner: int, pgid: int, marked: list[tuple[psutil.Process, str]],
                noted: Sequence[psutil.Process] = ()) -> bool:
    """Kill what the dead klbisect ``owner`` left: every process with its
    marker, wherever it went (setsid, a double fork), those its pid file
    noted, and the recorded group when one of its members is ours (a group
    id is not handed out again while the group has members). Returns whether
    anything was left."""
    victims = [p for p, m in marked if _orphan_of(m, owner)] + list(noted)
    if not victims:
        return False
    ours = any(_pgid(p) == pgid for p in victims)
    _terminate([pgid] if ours else [], _with_descendants(victims), grace=2.0)
    return True


def _pgid(p: psutil.Process) -> int | None:
    try:
        return os.getpgid(p.pid)
    except OSError:
        return None


def reap_orphans_of(marker: str | None) -> bool:
    """Kill what a klbisect killed hard left running, found by its marker
    alone: a run it was starting when it died has no pid file yet.
    Nothing happens while that klbisect still runs."""
    if _parse_marker(marker) is None or marker_alive(marker):
        return False
    victims = [p for p, m in _marked_processes() if m == marker]
    if victims:
        _terminate([], _with_descendants(victims), grace=2.0)
    return bool(victims)


def reap_stale(pid_dir: Path) -> list[int]:
    """Kill what a klbisect that was killed hard left running: only processes
    that carry its marker, so a process group id (or owner pid) that has
    since gone to an unrelated process is left alone. Returns the recorded
    groups something was reaped for."""
    reaped: list[int] = []
    if not pid_dir.is_dir():
        return reaped
    for f in pid_dir.glob("*.pid.tmp"):
        # a klbisect killed between writing its pid file and naming it: what it started is its
        # marker's, which the sweep below (or reap_orphans_of) finds without the file
        rec = _read_pid_file(f)
        if rec is None or _owner_gone(f, rec[0], rec[2]):
            f.unlink(missing_ok=True)
    marked: list[tuple[psutil.Process, str]] | None = None
    for f in pid_dir.glob("*.pid"):
        rec = _read_pid_file(f)
        if rec is None:
            f.unlink(missing_ok=True)
            continue
        owner, pgid, marker = rec
        if not _owner_gone(f, owner, marker):
            if not _group_alive(pgid):
                f.unlink(missing_ok=True)
            continue
        if marked is None:
            marked = _marked_processes()   # one look at every process, only when an owner is gone
        if _reap_owner(owner, pgid, marked, _noted_alive(f)):
            reaped.append(pgid)
        f.unlink(missing_ok=True)
    return reaped


# klbisect's own secrets: a build, probe or server never needs them, and
# its log (kept under the git dir) must not be able to print them
PRIVATE_ENV = ("GITHUB_TOKEN",)


def child_environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: ``base`` (default: ours) less
    PRIVATE_ENV, plus our marker, which the child's own children inherit
    (even those that leave its process group) for ``reap_stale``."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in PRIVATE_ENV}
    env[_OWNER] = owner_marker()
    return env


# ---- the watchdog: what a klbisect killed hard left is reaped at once, not by the next command ----

_WATCHDOG = "KLBISECT_WATCHDOG"        # a watchdog's own (its owner's marker): no sweep takes it for an orphan
# A test hook only: the tests of the next command's sweep (reap_stale) set it, so that
# what a killed owner left is still there for the sweep to find.
_NO_WATCHDOG = "KLBISECT_NO_WATCHDOG"


@dataclass
class _Watchdog:
    owner: int          # the pid it watches: a forked child is another owner, with its own
    fd: int             # the write end of its stdin (-1: it could not be started)
    dirs: set[str]      # the pid dirs it was told of


_watchdog: _Watchdog | None = None
_pending_fd = -1        # the pipe's write end while its watchdog starts: a fork then must close it too
_watchdog_lock = threading.Lock()
_is_watchdog = False    # set in the watchdog itself: it watches nothing of its own


def watch(pid_dir: Path | None = None) -> None:
    """Have this process's watchdog (started here the first time) reap,
    the moment we die, what carries our marker and what the pid files in
    ``pid_dir`` noted: the probe's shell dies with us (PDEATHSIG), but its
    server and test ran on, holding the GPU, until the next command."""
    global _watchdog
    if _is_watchdog or os.environ.get(_NO_WATCHDOG):
        return
    with _watchdog_lock:
        w = _watchdog
        if w is None or w.owner != os.getpid():
            w = _watchdog = _start_watchdog()
        if pid_dir is None or w.fd < 0:
            return
        d = os.path.abspath(pid_dir)
        line = os.fsencode(d) + b"\n"
        if d in w.dirs or b"\n" in line[:-1]:   # a newline in it: not told (the next command still reaps)
            return
        w.dirs.add(d)
        try:
            os.write(w.fd, line)
        except OSError:    # it died: EPIPE (Python ignores SIGPIPE)
            pass


def _start_watchdog() -> _Watchdog:
    """``python -m klbisect.watchdog MARKER`` in a session of its own, its
    stdin a pipe whose write end only we hold (non-inheritable: no child of
    ours keeps it open), so it reads EOF when we exit, however we die. It
    forks away at once (we wait for that), so it is no child of ours to
    wait for, and holds neither our stdout nor stderr: whoever reads ours
    (a terminal, ``subprocess.run(capture_output=True)``) is not kept waiting."""
    global _pending_fd
    me, marker = os.getpid(), owner_marker()
    none = _Watchdog(me, -1, set())
    if _parse_marker(marker) is None:   # no /proc: it could never tell when we are gone
        return none
    try:
        r, w = os.pipe()
    except OSError:
        return none
    # a thread that forks (no exec) while we wait for the starter must not carry the write end
    # off: its watchdog would see no EOF while that child lived (a reviewer's race)
    _pending_fd = w
    try:
        starter = subprocess.Popen([sys.executable, "-m", "klbisect.watchdog", marker], stdin=r,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/",
                                   env=_watchdog_environ(marker), start_new_session=True)
        try:
            code = starter.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = 0    # slow to fork away (a loaded machine): it runs, reading the pipe
    except (OSError, ValueError, subprocess.SubprocessError):
        os.close(w)
        return none
    except BaseException:
        os.close(w)    # EOF while we live: it finds us alive and exits
        raise
    finally:
        os.close(r)
        _pending_fd = -1
    if code != 0:
        os.close(w)
        return none
    return _Watchdog(me, w, set())


def _watchdog_environ(marker: str) -> dict[str, str]:
    """Ours without klbisect's markers (no sweep may take the watchdog for
    a probe's leftover) or secrets, and with this klbisect importable."""
    env = {k: v for k, v in os.environ.items() if k not in (MARK, _OWNER, *PRIVATE_ENV)}
    env[_WATCHDOG] = marker
    # a klbisect used from a source tree must be the one the watchdog (started in /) imports; a
    # site-packages dir is left where it is: put first, it could shadow the standard library
    root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    if root not in _site_dirs():
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def _site_dirs() -> set[str]:
    import site   # noqa: PLC0415   (only when a watchdog starts)
    try:
        dirs = [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:   # an old virtualenv's site module
        dirs = []
    return {os.path.realpath(d) for d in dirs}


def _forget_watchdog_in_child() -> None:
    # A forked child holds a copy of the pipe's write end: while it lived, our watchdog would
    # see no EOF when we died. The child is another owner; it starts its own when it needs one.
    global _watchdog_lock, _pending_fd
    _watchdog_lock = threading.Lock()   # another thread may have held it when we forked
    if _pending_fd >= 0:
        try:
            os.close(_pending_fd)
        except OSError:
            pass
        _pending_fd = -1
    w = _watchdog
    if w is not None and w.owner != os.getpid() and w.fd >= 0:
        try:
            os.close(w.fd)
        except OSError:
            pass
        w.fd = -1


os.register_at_fork(after_in_child=_forget_watchdog_in_child)


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
    nothing for an interrupted run; so it does for a run that
    ``kill_all_active`` killed, and in a thread that may start nothing more.
    """
    refuse_if_stopping()
    watch(pid_dir)   # before the run starts: a kill -9 from then on is covered
    refuse_if_stopping()   # a Ctrl-C while the watchdog started (it may take a while on a loaded machine)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = child_environ()
    if env:
        full_env.update(env)
    mark = full_env[MARK] = uuid.uuid4().hex
    start = time.monotonic()
    begin_running()
    try:
        return _run_marked(cmd, cwd, log_path, timeout, full_env, mark, pid_dir, header, start)
    finally:
        end_running()


def begin_running() -> None:
    """A probe run or a server starts: what the last of them to end finds
    adopted and unmarked since the first began is theirs to kill."""
    global _running, _running_since
    with _running_lock:
        if _running == 0:
            _running_since = _boot_ticks() - 1   # a tick early: /proc rounds a start down
        _running += 1


def end_running() -> None:
    global _running
    with _unkillable_cleanup():
        with _running_lock:
            _running -= 1
            # with other runs in flight an orphan may be theirs (still in use): the last one
            # sweeps, and no run starts until it has (its child would be taken for an orphan)
            if _running == 0:
                _kill_unmarked_orphans(_running_since)
        _reap_adopted_zombies()


def _run_marked(cmd: str | Sequence[str], cwd: Path, log_path: Path, timeout: float | None,
                full_env: dict[str, str], mark: str, pid_dir: Path | None, header: str | None,
                start: float) -> ProcResult:
    with private_log(log_path) as log:
        if header:
            log.write(redact(header).encode() + b"\n")
            log.flush()
        global _spawning
        main = threading.current_thread() is threading.main_thread()
        _spawning = main
        kids = _children() if main else set()
        try:
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
        except BaseException:
            _spawning = False
            if main:
                # a second stop signal raised inside Popen: its child (forked, perhaps stuck before
                # its exec on a dead mount) is ours and new, and nothing else would ever kill it
                for pid in _children() - kids:
                    kill_tree(pid, grace=0.0)
                raise_if_signalled()
            raise
        _STOPPED.discard(proc.pid)   # left by an earlier process with this pid
        _ACTIVE.add(proc.pid)
        pid_file = None
        timed_out = False
        code: int | None = None
        try:
            _spawning = False
            # inside the try: a pid file that cannot be written (a full disk) must not
            # leave the probe running with no timeout until klbisect exits
            pid_file = write_pid_file(pid_dir, proc.pid) if pid_dir is not None else None
            if main:
                raise_if_signalled()   # a stop signal during the fork
            if _halted():   # kill_all_active ran while we forked
                _STOPPED.add(proc.pid)
            else:
                code, timed_out = _wait_noting(proc, timeout, pid_file)
        finally:
            # Also after a normal exit: a server the probe started in the
            # background must not outlive the probe.
            with _unkillable_cleanup():
                kill_tree(proc.pid)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
                kill_marked(mark)
                stopped = proc.pid in _STOPPED
                _STOPPED.discard(proc.pid)
                _ACTIVE.discard(proc.pid)
                if pid_file is not None:
                    pid_file.unlink(missing_ok=True)
    if stopped:
        raise KeyboardInterrupt(f"klbisect is stopping: killed {cmd if isinstance(cmd, str) else ' '.join(cmd)}")
    return ProcResult(code, timed_out, time.monotonic() - start)


def _private(path: str, flags: int) -> int:
    return os.open(path, flags, 0o600)


def private_log(path: str | Path, mode: str = "wb"):
    """A log only its user can read: a probe or server writes what it
    writes (SGLang logs its ServerArgs, --api-key included), kept as
    written, and a GPU box is often shared. An existing file keeps its mode."""
    return open(path, mode, opener=_private)


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    got = text.splitlines()
    if size > 16384 and got:
        # the first line starts mid-line: a secret whose name was cut off
        # would pass redaction, and half a line explains nothing
        got = got[1:]
    # a probe's escape sequences (a title, a clear screen, binary junk) are
    # shown, not played on the user's terminal
    return shown("\n".join(got[-lines:]))
