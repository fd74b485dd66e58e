"""A probe's processes never outlive it: after a normal exit, on timeout,
and when they detached themselves with setsid or a double fork; a build or
probe that klbisect's own shutdown killed never reads as a finished one; and
what a klbisect killed hard left behind is reaped by the next one, but only
what carries its marker."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import PY, SEPARATED, child_env, klb_popen, processes_with, reaped, wait_gone
from klbisect.build import CommandBuilder
from klbisect.probe import Slot
from klbisect.proc import child_environ, kill_all_active, owner_marker, reap_stale, run_logged


def _alive(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if tag in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _running(tag: str) -> bool:
    """Whether a sleeper tagged ``tag`` itself runs (not just a shell whose
    command line is about to start it)."""
    for p in psutil.process_iter(["cmdline"]):
        try:
            if tag in (p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def _sleeper(tag: str) -> str:
    # a sleep whose command line carries a unique tag we can look for
    return f"{sys.executable} -c 'import time; time.sleep(300)' {tag}"


def _until(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _gone(tag: str, within: float = 30) -> bool:
    """Whether every process tagged ``tag`` has gone, waiting generously
    (a SIGTERM grace period, a loaded machine)."""
    deadline = time.monotonic() + within
    while _alive(tag):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_detached_children_are_killed_after_a_normal_exit(tmp_path):
    """As the klbisect command does it: a subreaper process (a separate one
    here, so pytest itself does not adopt orphans) running a probe whose
    children detach with setsid and with a double fork."""
    tag = uuid.uuid4().hex
    cmd = f"setsid {_sleeper(tag)} & ( {_sleeper(tag)} & ) ; echo avg_kl_div=0.004"
    script = ("import sys; from pathlib import Path; from klbisect.proc import become_subreaper, run_logged; "
              "become_subreaper(); "
              "r = run_logged(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[2]) / 'run.log'); "
              "print(r.exit_code)")
    out = subprocess.run([sys.executable, "-c", script, cmd, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "0", out.stderr
    assert "avg_kl_div=0.004" in (tmp_path / "run.log").read_text()
    assert _gone(tag)


def test_children_that_clear_their_environment_are_killed_too(tmp_path):
    """A daemon that drops klbisect's marker with its environment (``env -i
    setsid``, a double fork that clears it) is found as an orphan handed to
    the subreaper; a process of ours outside the run (a helper we started in
    our own group before it) is left alone."""
    tag, ours = uuid.uuid4().hex, uuid.uuid4().hex
    cmd = (f"env -i setsid {_sleeper(tag)} & ( env -i {_sleeper(tag)} & ) ; sleep 0.5; "
           "echo avg_kl_div=0.004")
    script = ("import subprocess, sys; from pathlib import Path; "
              "from klbisect.proc import become_subreaper, run_logged; "
              "become_subreaper(); "
              f"helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {ours!r}]); "
              "r = run_logged(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[2]) / 'run.log'); "
              "print(r.exit_code, helper.poll(), flush=True); helper.kill()")
    out = subprocess.run([sys.executable, "-c", script, cmd, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["0", "None"], out.stdout + out.stderr
    assert "avg_kl_div=0.004" in (tmp_path / "run.log").read_text()
    assert _gone(tag)


def test_orphans_that_exit_on_their_own_are_reaped(tmp_path):
    """A server's workers, orphaned mid-run and exiting on their own, become
    the subreaper's zombies: a tester's session piled up two per run."""
    cmd = "for i in 1 2 3; do ( setsid sh -c 'sleep 0.2' & ); done; sleep 1; echo avg_kl_div=0.004"
    script = ("import sys, psutil; from pathlib import Path; "
              "from klbisect.proc import become_subreaper, run_logged; "
              "become_subreaper(); "
              "r = run_logged(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[2]) / 'run.log'); "
              "z = [p for p in psutil.Process().children() if p.status() == psutil.STATUS_ZOMBIE]; "
              "print(r.exit_code, len(z))")
    out = subprocess.run([sys.executable, "-c", script, cmd, str(tmp_path)], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["0", "0"], out.stdout + out.stderr


def test_timeout_kills_the_whole_group(tmp_path):
    tag = uuid.uuid4().hex
    res = run_logged(f"{_sleeper(tag)} & {_sleeper(tag)}", tmp_path, tmp_path / "run.log", timeout=1.0)
    assert res.timed_out and res.exit_code is None
    assert _alive(tag) == []


# ---- klbisect's own shutdown (Ctrl-C, SIGTERM, SIGHUP) ------------------------------------------

def test_a_build_killed_by_shutdown_is_no_successful_build(tmp_path):
    """Ctrl-C while a worker thread builds: kill_all_active kills the build,
    and the build raises KeyboardInterrupt, never reads as exit 0 (psutil
    reaping our own child made Popen.wait see ECHILD, which it takes for 0)."""
    tag = uuid.uuid4().hex
    slot = Slot(0, tmp_path, {}, 0, tmp_path / "pids")
    result: dict = {}

    def work():
        try:
            result["build"] = CommandBuilder(_sleeper(tag)).build(tmp_path, tmp_path / "build.log", slot)
        except KeyboardInterrupt as e:
            result["interrupted"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    _until(lambda: _running(tag), "the build never started")
    kill_all_active()
    t.join(timeout=60)
    assert not t.is_alive()
    assert "build" not in result, f"a killed build was reported: {result.get('build')}"
    assert "interrupted" in result
    assert _alive(tag) == []
    assert not list((tmp_path / "pids").iterdir())


def test_shutdown_kills_every_slots_probe_at_once(tmp_path):
    """A reviewer's: Ctrl-C killed the slots' trees one after another, each
    given its grace and then the wait after SIGKILL: eight slots' servers
    that ignore SIGTERM took eight of each. Four such probes here go within
    about one grace (2 s), not four."""
    tags = [uuid.uuid4().hex for _ in range(4)]
    done: list = []

    def work(tag: str, k: int) -> None:
        cmd = f"trap '' TERM; {_sleeper(tag)} & trap '' TERM; wait"
        try:
            run_logged(cmd, tmp_path, tmp_path / f"run{k}.log")
        except KeyboardInterrupt:
            done.append(tag)

    threads = [threading.Thread(target=work, args=(t, k), daemon=True) for k, t in enumerate(tags)]
    for t in threads:
        t.start()
    _until(lambda: all(_running(t) for t in tags), "the probes never started")
    t0 = time.monotonic()
    kill_all_active()
    took = time.monotonic() - t0
    for t in threads:
        t.join(timeout=60)
    assert sorted(done) == sorted(tags) and all(_alive(t) == [] for t in tags)
    assert took < 5.0, f"{took:.1f} s: the trees were killed one after another"


def test_a_thread_caught_by_shutdown_between_runs_starts_no_probe(tmp_path):
    """A build that ends just as Ctrl-C arrives: its thread, past the build
    and not yet at the probe when kill_all_active runs, must not start the
    probe. Threads started later, and the main thread, run as usual."""
    probed = tmp_path / "probed"
    go = threading.Event()
    result: dict = {}

    def work():
        go.wait(60)
        try:
            result["run"] = run_logged(f"touch {probed}", tmp_path, tmp_path / "run.log")
        except KeyboardInterrupt:
            result["interrupted"] = True

    t = threading.Thread(target=work, daemon=True)
    t.start()
    kill_all_active()
    go.set()
    t.join(timeout=60)
    assert result == {"interrupted": True}
    assert not probed.exists()

    later = threading.Thread(target=lambda: result.update(later=run_logged("true", tmp_path, tmp_path / "l.log")))
    later.start()
    later.join(timeout=60)
    assert result["later"].exit_code == 0
    assert run_logged("true", tmp_path, tmp_path / "m.log").exit_code == 0


def test_ctrl_c_during_the_build_starts_no_probe(history, tmp_path):
    """The whole command: Ctrl-C while `--build-cmd` runs ends with 130 and
    the build killed, and the probe never starts on the half-built checkout."""
    h = history(n_commits=20, seed=6, merges=1, noise=SEPARATED)
    tok = f"{1000 + os.getpid() % 1000}.{uuid.uuid4().int % 10**6:06d}"
    probed = tmp_path / "probed"
    with reaped(klb_popen("run", "--good", h.good, "--bad", "main", "--build-cmd", f"sleep {tok}",
                          "--probe-cmd", f"touch {probed}; {PY} probe.py", cwd=h.path)) as proc:
        _until(lambda: proc.poll() is not None or [p for p in processes_with(tok) if p.name() == "sleep"],
               "the build never started", timeout=120)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not probed.exists(), "the probe started after the build was killed"
    assert wait_gone(tok) == []


def test_ctrl_c_pressed_three_times_still_kills_a_probe_that_ignores_it(history, tmp_path):
    """A probe that traps SIGINT and SIGTERM takes the grace period to die;
    a user who presses Ctrl-C again meanwhile must not cut the kill short
    (the second KeyboardInterrupt used to end it before its SIGKILL)."""
    h = history(n_commits=20, seed=6, merges=1, noise=SEPARATED)
    tok = f"{1000 + os.getpid() % 1000}.{uuid.uuid4().int % 10**6:06d}"
    with reaped(klb_popen("run", "--good", h.good, "--bad", "main",
                          "--probe-cmd", f"trap '' INT TERM; {PY} probe.py; sleep {tok}", cwd=h.path)) as proc:
        _until(lambda: proc.poll() is not None or [p for p in processes_with(tok) if p.name() == "sleep"],
               "the probe never reached its sleep", timeout=120)
        assert proc.poll() is None, proc.communicate()
        for _ in range(3):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert wait_gone(tok) == [], "the probe outlived klbisect"


# The command comes in the environment: in argv, its tag would make the
# process that runs it look like the probe.
_UNDER_STOP_SIGNALS = """
import os, sys
from pathlib import Path
from klbisect.proc import interrupt_on_stop_signals, run_logged
try:
    with interrupt_on_stop_signals():
        run_logged(os.environ["KLB_TEST_CMD"], Path(sys.argv[1]), Path(sys.argv[1]) / "run.log")
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)
"""


def _hup_default() -> None:
    """A terminal's child takes SIGHUP's default, even when these tests run
    under nohup (which the child would inherit as "ignored")."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_sighup_from_a_dropped_terminal_kills_the_probe_and_exits_130(tmp_path):
    """An ssh session dropped: the terminal is gone (every write to it fails
    with EIO) and SIGHUP arrives. The probe is killed and the exit is 130,
    as for Ctrl-C, not a traceback from writing to a dead terminal."""
    tag = uuid.uuid4().hex
    master, slave = os.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-c", _UNDER_STOP_SIGNALS, str(tmp_path)],
                             env=dict(os.environ, KLB_TEST_CMD=_sleeper(tag)),
                             stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, preexec_fn=_hup_default)
    finally:
        os.close(slave)
    try:
        _until(lambda: p.poll() is not None or _running(tag), "the probe never started")
        os.close(master)   # hangs the terminal up
        master = -1
        p.send_signal(signal.SIGHUP)
        assert p.wait(timeout=60) == 130
    finally:
        if master >= 0:
            os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    assert _gone(tag)


def test_an_ignored_sighup_stays_ignored():
    """`nohup klbisect run ...` must keep running when the terminal closes."""
    script = ("import os, signal; from klbisect.proc import interrupt_on_stop_signals\n"
              "with interrupt_on_stop_signals():\n"
              "    os.kill(os.getpid(), signal.SIGHUP)\n"
              "    print('still running', flush=True)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert out.returncode == 0 and out.stdout == "still running\n", out.stderr



def test_a_ctrl_c_lost_in_the_fork_still_stops_the_probe(tmp_path):
    """A Ctrl-C that lands while Popen forks is raised in an at-fork hook,
    where Python prints "Exception ignored" and drops it: the probe it
    started must still be killed, the command still stop, and no traceback
    be printed."""
    marker = tmp_path / "finished"
    script = ("import os, signal, sys, time\n"
              "from pathlib import Path\n"
              "from klbisect.proc import interrupt_on_stop_signals, run_logged\n"
              "def lose_it():\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(0.2)   # the handler runs here, inside the hook\n"
              "    print('the hook ran on', flush=True)\n"
              "os.register_at_fork(after_in_parent=lose_it)\n"
              "with interrupt_on_stop_signals():\n"
              "    try:\n"
              "        run_logged([sys.executable, 'probe.py'], Path.cwd(), Path('run.log'))\n"
              "    except KeyboardInterrupt:\n"
              "        print('stopped', flush=True)\n"
              "        sys.exit(130)\n"
              "print('ran on', flush=True)\n")
    (tmp_path / "probe.py").write_text(f"import time, pathlib; time.sleep(2); pathlib.Path({str(marker)!r}).touch()")
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # the hook may run on: while Popen waits for the exec, the signal is noted and raised after it
    lines = out.stdout.splitlines()
    assert out.returncode == 130 and lines[-1:] == ["stopped"] and "ran on" not in lines, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr
    time.sleep(2.5)
    assert not marker.exists(), "the probe started in the lost Ctrl-C's fork ran on"

def _slow_spawn(where: Path, cmd: str, setup_s: float, signals: str) -> subprocess.CompletedProcess:
    """A klbisect-like process running ``cmd`` through run_logged, whose
    child takes ``setup_s`` before its exec (the window a stop signal may
    land in), with ``signals`` (Python) sending it stop signals. Prints
    "stopped after S s" and exits 130 when interrupted, "ran on" else."""
    script = ("import os, signal, sys, threading, time\n"
              "from pathlib import Path\n"
              "from klbisect import proc\n"
              "setup = proc._child_setup\n"
              f"proc._child_setup = lambda: (time.sleep({setup_s}), setup())\n"
              + signals +
              "t0 = time.monotonic()\n"
              "with proc.interrupt_on_stop_signals():\n"
              "    try:\n"
              "        proc.run_logged(os.environ['KLB_TEST_CMD'], Path.cwd(), Path('run.log'))\n"
              "    except KeyboardInterrupt:\n"
              "        print('stopped after %.1f s' % (time.monotonic() - t0), flush=True)\n"
              "        sys.exit(130)\n"
              "print('ran on', flush=True)\n")
    return subprocess.run([sys.executable, "-c", script], cwd=where, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, KLB_TEST_CMD=cmd))


def test_a_stop_signal_while_popen_waits_for_the_exec_still_stops_the_probe(tmp_path):
    """A reviewer's: SIGTERM landing while the main thread is inside Popen
    (it waits for the child's exec) raised KeyboardInterrupt out of Popen
    itself. The child was running but registered nowhere, so nothing
    killed it, and its background server outlived the exit 130. The window
    is a few milliseconds; a slow ``_child_setup`` widens it here."""
    tag = uuid.uuid4().hex
    out = _slow_spawn(tmp_path, f"{_sleeper(tag)} & wait", setup_s=0.5,
                      signals="threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()\n")
    assert out.returncode == 130 and out.stdout.startswith("stopped after"), out.stdout + out.stderr
    time.sleep(1.0)    # long enough for a shell left running to start its server
    assert _gone(tag), "the probe's server outlived klbisect"


def test_a_second_stop_signal_during_a_hung_spawn_stops_klbisect_and_its_child(tmp_path):
    """A spawn that hangs before its exec (a cwd on a dead mount) must not
    need kill -9: a second Ctrl-C stops klbisect. A reviewer's: raised
    inside Popen, it left the forked child running, known to nobody; its
    probe ran later as an orphan."""
    tag = uuid.uuid4().hex
    out = _slow_spawn(tmp_path, f"exec {_sleeper(tag)}", setup_s=3,
                      signals=("def twice():\n"
                               "    time.sleep(0.5); os.kill(os.getpid(), signal.SIGINT)\n"
                               "    time.sleep(0.5); os.kill(os.getpid(), signal.SIGINT)\n"
                               "threading.Thread(target=twice, daemon=True).start()\n"))
    assert out.returncode == 130 and out.stdout.startswith("stopped after"), out.stdout + out.stderr
    assert float(out.stdout.split()[2]) < 2.5, out.stdout          # at the second signal, not the spawn's end
    time.sleep(3.5)                                                  # when the hung child would have exec'd
    assert _gone(tag), "the child of the interrupted spawn ran on"


# ---- what a klbisect killed with SIGKILL left ---------------------------------------------------

# A klbisect at work: a probe through run_logged, as a build or probe runs ...
_OWNER_RUN_LOGGED = """
import os, sys
from pathlib import Path
from klbisect.proc import run_logged
run_logged(os.environ["KLB_TEST_CMD"], Path(sys.argv[1]), Path(sys.argv[1]) / "run.log", pid_dir=Path(sys.argv[2]))
"""
# ... or a server launched as SGLangServer launches it: a plain Popen with
# child_environ and a pid file in the older "owner pgid" format
_OWNER_SERVER = """
import os, subprocess, sys, time
from pathlib import Path
from klbisect import proc
srv = subprocess.Popen(os.environ["KLB_TEST_CMD"], shell=True, env=proc.child_environ(),
                       preexec_fn=proc._child_setup)
Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
(Path(sys.argv[2]) / f"{srv.pid}.pid").write_text(f"{os.getpid()} {srv.pid}\\n")
time.sleep(300)
"""


def _owner_env(cmd: str, watchdog: bool) -> dict[str, str]:
    env = dict(os.environ, KLB_TEST_CMD=cmd)
    env.pop("KLBISECT_NO_WATCHDOG", None)
    if not watchdog:
        # what the killed owner left stays for the next command's sweep, the one tested
        env["KLBISECT_NO_WATCHDOG"] = "1"
    return env


def _kill_9(script: str, cmd: str, tags: list[str], work: Path, pids: Path,
            zombie: list | None = None, watchdog: bool = False) -> None:
    """Run ``cmd`` under a klbisect-like owner (with its watchdog or not)
    and SIGKILL the owner once every tagged process runs. With ``zombie``
    (a list), the owner is not waited for: it stays a zombie, as under a
    parent (git bisect run's shell, a container's init) that has not reaped
    it; the Popen goes into the list for the caller to wait."""
    owner = subprocess.Popen([sys.executable, "-c", script, str(work), str(pids)], env=_owner_env(cmd, watchdog))
    try:
        _until(lambda: owner.poll() is not None or all(_running(t) for t in tags), "the probe never started")
        assert owner.poll() is None
    finally:
        owner.kill()
        if zombie is None:
            owner.wait()
        else:
            zombie.append(owner)
            _until(lambda: psutil.Process(owner.pid).status() == psutil.STATUS_ZOMBIE, "no zombie")


def _killed_owner(script: str, cmd: str, tags: list[str], work: Path, pids: Path,
                  zombie: list | None = None) -> int:
    """``_kill_9`` with no watchdog: the group id the owner recorded."""
    _kill_9(script, cmd, tags, work, pids, zombie)
    files = list(pids.glob("*.pid"))
    assert len(files) == 1
    return int(files[0].stem)


@pytest.mark.parametrize("owner", [_OWNER_RUN_LOGGED, _OWNER_SERVER], ids=["run_logged", "server"])
def test_what_a_killed_klbisect_left_is_reaped_wherever_it_went(tmp_path, owner):
    """Its group, and a child that left the group with setsid (a server's
    helper): both carry the dead owner's marker in their environment."""
    in_group, detached = uuid.uuid4().hex, uuid.uuid4().hex
    pids = tmp_path / "pids"
    pgid = _killed_owner(owner, f"setsid {_sleeper(detached)} & {_sleeper(in_group)} & wait",
                         [in_group, detached], tmp_path, pids)
    try:
        assert reap_stale(pids) == [pgid]
        assert _gone(in_group) and _gone(detached)
        assert not list(pids.iterdir())
    finally:
        for p in _alive(in_group) + _alive(detached):
            p.kill()


def _kill_9_after_its_daemon_started(tmp_path, tag: str, cmd: str, owner_src: str = _OWNER_RUN_LOGGED,
                                     adopted: bool = False, watchdog: bool = False) -> Path:
    """Run ``cmd`` under an owner's run_logged (with its watchdog or not),
    kill -9 the owner once the run has looked at the daemon ``tag`` (and,
    ``adopted``, once the daemon is the owner's child), and wait until the
    daemon is orphaned (or gone); the pid dir."""
    pids = tmp_path / "pids"
    owner = subprocess.Popen([sys.executable, "-c", owner_src, str(tmp_path), str(pids)],
                             env=_owner_env(cmd, watchdog))
    try:
        try:
            _until(lambda: owner.poll() is not None or _running(tag), "the probe never started its daemon")
            if adopted:
                _until(lambda: all(p.ppid() == owner.pid for p in _alive(tag)), "the daemon never went to the owner")
            time.sleep(1.5)                         # the run has looked at its descendants at least once
            assert owner.poll() is None
        finally:
            owner.kill()
            owner.wait()
        _until(lambda: all(p.ppid() != owner.pid for p in _alive(tag)), "the daemon was never orphaned")
    except BaseException:
        for p in _alive(tag):
            p.kill()
        raise
    return pids


def _assert_the_sweep_reaps(pids: Path, tag: str) -> None:
    try:
        assert _alive(tag), "the daemon went with the probe: nothing to find"
        files = list(pids.glob("*.pid"))
        assert reap_stale(pids) == [int(files[0].stem)] and _gone(tag)
    finally:
        for p in _alive(tag):
            p.kill()


def test_a_daemon_that_cleared_its_environment_is_reaped_after_a_kill_9(tmp_path):
    """A tester's: a probe's daemon started with `env -i setsid` carries no
    marker; klbisect killed with -9, the probe died with it and the daemon
    went to init, where the next command's sweep could not tell it from any
    other process. The run notes its descendants in its pid file as it
    waits, and the sweep kills those still running (same pid, same start)."""
    tag = uuid.uuid4().hex
    pids = _kill_9_after_its_daemon_started(tmp_path, tag, f"env -i setsid {_sleeper(tag)} & sleep 300")
    _assert_the_sweep_reaps(pids, tag)


_DOUBLE_FORK = ("import os, sys\n"
                "if os.fork() == 0:\n"
                "    os.setsid()\n"
                "    if os.fork() == 0:\n"
                "        os.execvp(sys.executable, [sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]])\n"
                "    os._exit(0)\n")


def test_a_double_forked_daemon_is_noted_though_it_left_the_run_s_tree(tmp_path):
    """A tester's: a daemon of a double fork under `env -i` (its middle
    process exits at once) is the subreaper's child, not the run's
    descendant, so the run's notes missed it and it outlived a kill -9 of
    klbisect and every later command."""
    tag = uuid.uuid4().hex
    script = tmp_path / "daemon.py"
    script.write_text(_DOUBLE_FORK)
    owner_src = "from klbisect.proc import become_subreaper\nbecome_subreaper()\n" + _OWNER_RUN_LOGGED
    pids = _kill_9_after_its_daemon_started(tmp_path, tag, f"env -i {sys.executable} {script} {tag}; sleep 300",
                                            owner_src, adopted=True)
    _assert_the_sweep_reaps(pids, tag)


def test_an_owner_killed_but_not_yet_waited_for_is_gone(tmp_path):
    """A klbisect probe SIGKILLed under git bisect run stays a zombie until
    its parent waits: its /proc entry, start time and all, is still there.
    `status` right after it left the probe running (a tester's)."""
    tag, zombie = uuid.uuid4().hex, []
    pids = tmp_path / "pids"
    try:
        pgid = _killed_owner(_OWNER_RUN_LOGGED, f"{_sleeper(tag)} & wait", [tag], tmp_path, pids, zombie)
        assert reap_stale(pids) == [pgid] and _gone(tag)
    finally:
        for p in _alive(tag):
            p.kill()
        for z in zombie:
            z.wait()


# ---- the watchdog: what a klbisect killed with SIGKILL left, reaped with no next command ---------

def _watchdogs_of(marker: str) -> list[psutil.Process]:
    """The running watchdogs of the owner with this marker."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if (p.info["cmdline"] or [])[-2:] == ["klbisect.watchdog", marker] and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


@pytest.mark.parametrize("waited", [True, False], ids=["waited-for", "zombie"])
def test_a_killed_klbisects_watchdog_reaps_what_it_left_at_once(tmp_path, waited):
    """No server outlives the probe that started it, kill -9 of klbisect
    included: the probe's shell died with klbisect (PDEATHSIG), but its
    server (setsid'ed) and its test (in the background) held the GPU until
    the next klbisect command. Its watchdog reaps them as soon as it is gone
    (a zombie not yet waited for is gone too), with no next command."""
    in_group, detached, zombie = uuid.uuid4().hex, uuid.uuid4().hex, []
    pids = tmp_path / "pids"
    try:
        _kill_9(_OWNER_RUN_LOGGED, f"setsid {_sleeper(detached)} & {_sleeper(in_group)} & wait",
                [in_group, detached], tmp_path, pids, None if waited else zombie, watchdog=True)
        assert _gone(in_group, within=10) and _gone(detached, within=10), "the probe's processes outlived it"
        _until(lambda: not list(pids.glob("*.pid")), "its pid file was left", timeout=10)
    finally:
        for p in _alive(in_group) + _alive(detached):
            p.kill()
        for z in zombie:
            z.wait()


@pytest.mark.parametrize("daemon", ["env -i setsid", "double fork"])
def test_a_killed_klbisects_watchdog_reaps_the_unmarked_daemons_its_run_noted(tmp_path, daemon):
    """A daemon that cleared its environment carries no marker: the
    watchdog finds it where the next command would, in the pid file the run
    noted it in (a double fork's daemon was the subreaper owner's child, as
    the owner's watchdog is: the run must note the one, not the other)."""
    tag = uuid.uuid4().hex
    if daemon == "env -i setsid":
        pids = _kill_9_after_its_daemon_started(tmp_path, tag, f"env -i setsid {_sleeper(tag)} & sleep 300",
                                                watchdog=True)
    else:
        script = tmp_path / "daemon.py"
        script.write_text(_DOUBLE_FORK)
        owner_src = "from klbisect.proc import become_subreaper\nbecome_subreaper()\n" + _OWNER_RUN_LOGGED
        pids = _kill_9_after_its_daemon_started(tmp_path, tag, f"env -i {sys.executable} {script} {tag}; sleep 300",
                                                owner_src, adopted=True, watchdog=True)
    try:
        assert _gone(tag, within=10), "the daemon outlived the killed klbisect"
        _until(lambda: not list(pids.glob("*.pid")), "its pid file was left", timeout=10)
    finally:
        for p in _alive(tag):
            p.kill()


_OWNER_TELLS_OF_ITS_WATCHDOG = _OWNER_RUN_LOGGED + """
import json, psutil
from klbisect.proc import owner_marker
me = owner_marker()
[w] = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[-2:] == ["klbisect.watchdog", me]]
env = w.environ()
print(json.dumps({"marker": me, "fds": [os.readlink(f"/proc/{w.pid}/fd/{n}") for n in os.listdir(f"/proc/{w.pid}/fd")],
                  "ours": [os.readlink(f"/proc/self/fd/{n}") for n in (1, 2)], "cwd": w.cwd(),
                  "marked": [k for k in ("KLBISECT_OWNER", "KLBISECT_PROBE_ID") if k in env]}))
"""


def test_an_owner_that_exits_normally_leaves_no_watchdog(tmp_path):
    """The watchdog holds none of its owner's output (stdout and stderr are
    /dev/null), carries no marker, keeps no directory busy, and after a
    normal exit finds nothing to reap and exits too."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _OWNER_TELLS_OF_ITS_WATCHDOG, str(tmp_path), str(tmp_path / "pids")],
                         capture_output=True, text=True, timeout=60, env=_owner_env("echo done", watchdog=True))
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["fds"].count("/dev/null") == 2 and not set(seen["fds"]) & set(seen["ours"]), seen
    assert seen["marked"] == [] and seen["cwd"] == "/", seen
    assert took < 20, f"{took:.1f} s"
    _until(lambda: not _watchdogs_of(seen["marker"]), "the watchdog outlived its owner's normal exit", timeout=5)


_OWNER_KILLED_WITH_A_STUBBORN_LEFTOVER = """
import os, signal, sys, threading, time, psutil
from pathlib import Path
from klbisect.proc import owner_marker, run_logged
work, tag = Path(sys.argv[1]), os.environ["KLB_TEST_TAG"]
threading.Thread(target=run_logged, args=(os.environ["KLB_TEST_CMD"], work, work / "run.log"),
                 kwargs={"pid_dir": Path(sys.argv[2])}, daemon=True).start()
while not any(tag in (p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])):
    time.sleep(0.05)
print(owner_marker(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_watchdog_keeps_nobody_waiting_for_its_owners_output(tmp_path):
    """`subprocess.run(klbisect, capture_output=True)` (a test suite, a CI
    step) returns when klbisect exits, not when its watchdog does: here the
    watchdog is still at work (its owner's leftover ignores SIGTERM: a grace
    period, then SIGKILL) when the owner's output ends."""
    tag = uuid.uuid4().hex
    env = dict(_owner_env(f"trap '' TERM; {_sleeper(tag)} & wait", watchdog=True), KLB_TEST_TAG=tag)
    try:
        out = subprocess.run([sys.executable, "-c", _OWNER_KILLED_WITH_A_STUBBORN_LEFTOVER, str(tmp_path),
                              str(tmp_path / "pids")], capture_output=True, text=True, timeout=60, env=env)
        at_work = _watchdogs_of(out.stdout.strip())
        assert out.returncode == -signal.SIGKILL, out.stderr
        assert at_work, "no watchdog was at work when its owner's output ended"
        assert _gone(tag, within=20), "the leftover outlived the killed klbisect"
    finally:
        for p in _alive(tag):
            p.kill()


_FORKING_OWNER = """
import os, sys
from pathlib import Path
from klbisect.proc import owner_marker, run_logged
work = Path(sys.argv[1])
run_logged("true", work, work / "first.log", pid_dir=work / "pids")   # the parent's watchdog starts before the fork
who = "child" if os.fork() == 0 else "parent"
os.write(1, f"{who} {os.getpid()} {owner_marker()}\\n".encode())   # one write: the two lines must not mix
run_logged(os.environ["KLB_" + who.upper() + "_CMD"], work, work / f"{who}.log", pid_dir=work / f"{who}-pids")
"""


def test_a_forked_owner_has_a_watchdog_of_its_own(tmp_path):
    """A forked klbisect process is another owner: what it starts carries
    its marker, and its parent's watchdog neither waits for it (a fork
    holds a copy of its parent's pipe) nor reaps what it started."""
    tags = {"parent": uuid.uuid4().hex, "child": uuid.uuid4().hex}
    env = dict(_owner_env("", watchdog=True), **{f"KLB_{who.upper()}_CMD": f"setsid {_sleeper(t)} & wait"
                                                 for who, t in tags.items()})
    owner = subprocess.Popen([sys.executable, "-c", _FORKING_OWNER, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                             text=True)
    said: dict[str, tuple[int, str]] = {}
    try:
        for _ in range(2):
            who, pid, marker = owner.stdout.readline().split()
            said[who] = int(pid), marker
        _until(lambda: all(_running(t) for t in tags.values()), "the probes never started")
        assert _watchdogs_of(said["parent"][1]) and _watchdogs_of(said["child"][1])
        owner.kill()
        owner.wait()
        assert _gone(tags["parent"], within=10), "the parent's watchdog waited for its forked child"
        assert _running(tags["child"]), "the parent's watchdog reaped what its forked child started"
        os.kill(said["child"][0], signal.SIGKILL)
        assert _gone(tags["child"], within=10), "the forked child's leftover outlived it"
        _until(lambda: not any(_watchdogs_of(m) for _, m in said.values()), "a watchdog stayed", timeout=10)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if "child" in said:
            try:
                os.kill(said["child"][0], signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in _alive(tags["parent"]) + _alive(tags["child"]):
            p.kill()


def test_the_orphan_sweep_spares_a_watchdog(monkeypatch):
    """A watchdog carries none of the markers, lest a sweep take it for a
    probe's leftover; the sweep for unmarked orphans, which takes exactly
    those, must spare it by its own variable (a subreaper's watchdog is its
    child, and so is a forked child's once that child died)."""
    from klbisect import proc
    monkeypatch.setattr(proc, "_subreaper", True)
    since = proc._boot_ticks() - 100
    env = {k: v for k, v in os.environ.items() if not k.startswith("KLBISECT_")}
    code = "import time; time.sleep(300)"
    kids = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True, env=e)
            for e in (env, {**env, "KLBISECT_WATCHDOG": "1:2"})]
    try:
        _until(lambda: all(psutil.Process(k.pid).cmdline()[-1:] == [code] for k in kids), "never started")
        found = {p.pid for p in proc._unmarked_orphans(since)}
        assert kids[0].pid in found and kids[1].pid not in found
    finally:
        for k in kids:
            k.kill()
            k.wait()


def test_a_group_id_that_went_to_an_unrelated_process_is_not_reaped(tmp_path):
    """Pid files of dead owners, in both formats, name group ids that now
    belong to other process groups (pid reuse): one with no marker, one
    with the marker of a klbisect that still runs (this test). Both survive,
    and the stale files go."""
    plain, other = uuid.uuid4().hex, uuid.uuid4().hex
    groups = [subprocess.Popen(["sh", "-c", _sleeper(plain)], start_new_session=True),
              subprocess.Popen(["sh", "-c", _sleeper(other)], start_new_session=True, env=child_environ())]
    try:
        _until(lambda: _running(plain) and _running(other), "the sleepers never started")
        dead = subprocess.Popen(["true"])
        dead.wait()
        old, new = tmp_path / "old", tmp_path / "new"
        old.mkdir()
        for g in groups:
            (old / f"{g.pid}.pid").write_text(f"{dead.pid} {g.pid}\n")
        assert reap_stale(old) == []
        for g in groups:
            # written by a klbisect process that then exits
            subprocess.run([sys.executable, "-c", "import sys; from pathlib import Path; "
                            "from klbisect.proc import write_pid_file; write_pid_file(Path(sys.argv[1]), "
                            "int(sys.argv[2]))", str(new), str(g.pid)], check=True, timeout=60)
        assert reap_stale(new) == []
        assert all(g.poll() is None for g in groups)
        assert _running(plain) and _running(other)
        assert not list(old.iterdir()) and not list(new.iterdir())
    finally:
        for g in groups:
            try:
                os.killpg(g.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            g.wait()


def test_a_live_owners_groups_are_left_alone(tmp_path):
    tag = uuid.uuid4().hex
    child = subprocess.Popen(["sh", "-c", _sleeper(tag)], start_new_session=True, env=child_environ())
    try:
        _until(lambda: _running(tag), "the sleeper never started")
        pids = tmp_path / "pids"
        pids.mkdir()
        (pids / f"{child.pid}.pid").write_text(f"{os.getpid()} {child.pid}\n")
        (pids / "new.pid").write_text(f"{os.getpid()} {child.pid} {owner_marker()}\n")
        assert reap_stale(pids) == []
        assert _running(tag)
        assert len(list(pids.iterdir())) == 2
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def test_klbisect_status_reaps_what_a_killed_klbisect_left(tmp_path):
    """Not only `run`: any command, `status` included, opens the workspace
    and reaps first (here `status` then exits 150: there is no session)."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    in_group, detached = uuid.uuid4().hex, uuid.uuid4().hex
    pids = repo / ".git" / "klbisect" / "pids"
    _killed_owner(_OWNER_RUN_LOGGED, f"setsid {_sleeper(detached)} & {_sleeper(in_group)} & wait",
                  [in_group, detached], tmp_path, pids)
    try:
        p = subprocess.run([sys.executable, "-m", "klbisect", "status", "--repo", str(repo)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 150, p.stderr
        assert _gone(in_group) and _gone(detached)
    finally:
        for q in _alive(in_group) + _alive(detached):
            q.kill()


def test_a_run_started_as_klbisect_was_killed_is_reaped_without_a_pid_file(tmp_path):
    """SIGKILL between starting a probe and writing its pid file: the
    probe's processes carry the dead owner's marker, which the lock holder
    left beside the lock, and the next command kills them by it alone."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    state = repo / ".git" / "klbisect"
    state.mkdir()
    dead = "999999:12345"               # no process has this pid and start time
    (state / "owner").write_text(dead + "\n")
    tag = uuid.uuid4().hex
    env = {**os.environ, "KLBISECT_OWNER": dead}
    orphan = subprocess.Popen(_sleeper(tag), shell=True, env=env, start_new_session=True)
    try:
        _until(lambda: processes_with(tag), "the orphan never started")
        p = subprocess.run([sys.executable, "-m", "klbisect", "status", "--repo", str(repo)],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 150, p.stderr
        assert _gone(tag), "the dead klbisect's probe outlived the next command"
        # a live owner's processes are left alone
        live_tag = uuid.uuid4().hex
        (state / "owner").write_text(owner_marker() + "\n")
        live = subprocess.Popen(_sleeper(live_tag), shell=True, start_new_session=True,
                                env={**os.environ, "KLBISECT_OWNER": owner_marker()})
        try:
            _until(lambda: processes_with(live_tag), "the live one never started")
            subprocess.run([sys.executable, "-m", "klbisect", "status", "--repo", str(repo)],
                           capture_output=True, text=True, timeout=60)
            assert processes_with(live_tag)
        finally:
            os.killpg(live.pid, signal.SIGKILL)
            live.wait()
    finally:
        if orphan.poll() is None:
            os.killpg(orphan.pid, signal.SIGKILL)
        orphan.wait()


SLOW_IMPORT = """
import builtins, sys, time
MODULE = sys.argv[1] if len(sys.argv) > 1 else "cli"
real = builtins.__import__
def slow(name, *a, **k):
    if name == MODULE or name.endswith("." + MODULE):
        print("loading", flush=True)
        time.sleep(30)
    return real(name, *a, **k)
builtins.__import__ = slow
from klbisect.__main__ import run
sys.argv = ["klbisect", "status"]
run()
"""


def _stopped_at(script: str, cwd: Path, ready: str, sig: int, *args: str) -> tuple[int, str, str]:
    """Run a klbisect entry-point script (with ``args``), send ``sig`` once
    it prints ``ready``: its exit status, stdout and stderr."""
    p = subprocess.Popen([sys.executable, "-c", script, *args], cwd=cwd, env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_hup_default)
    try:
        assert p.stdout.readline().strip() == ready
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
    return p.returncode, out, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("module", ["cli", "redact"])
def test_a_signal_while_the_modules_load_is_one_line(tmp_path, sig, module):
    """The first half second of every command is numpy's and click's import:
    a stop there was a traceback (Ctrl-C) or a silent exit 143 (SIGTERM).
    A tester's Ctrl-C 30 ms into `klbisect probe`, while the output's
    redaction loaded, was a traceback too."""
    code, _, err = _stopped_at(SLOW_IMPORT, tmp_path, "loading", sig, module)
    assert code == 130, err
    assert err.strip() == "klbisect: interrupted before it started; nothing was recorded"


def test_a_signal_while_the_modules_load_keeps_the_json_promise(tmp_path):
    """--json promises stdout ends with one object, even for a stop that came
    before the command could parse its options."""
    script = SLOW_IMPORT.replace('["klbisect", "status"]', '["klbisect", "nightly", "--json"]')
    code, out, err = _stopped_at(script, tmp_path, "loading", signal.SIGTERM)
    assert code == 130, err
    obj = json.loads(out.strip().splitlines()[-1])
    assert obj["verdict"] == "error" and obj["exit_code"] == 130 and "interrupted" in obj["error"]


def test_modules_that_no_longer_load_abort_git_bisect_not_mark_the_commit_bad(tmp_path):
    """A reviewer's: a --build that pip-installs into klbisect's own
    interpreter can leave numpy broken between probes; `klbisect probe`
    then printed a traceback and exited 1, which git bisect records as bad."""
    broken = tmp_path / "broken" / "numpy"
    broken.mkdir(parents=True)
    # numpy's own message runs over several lines
    (broken / "__init__.py").write_text("raise ImportError('numpy half-installed\\n\\nIMPORTANT: READ THIS')\n")
    env = {**child_env(), "PYTHONPATH": str(broken.parent)}
    for argv in (["probe"], ["nightly", "--json"]):
        p = subprocess.run([sys.executable, "-m", "klbisect", *argv], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 159, p.stderr
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "cannot load its own modules" in p.stderr and "numpy half-installed" in p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1])["verdict"] == "error"


SLOW_COMMAND = """
import sys, time
import klbisect.cli
def working(*a, **k):
    print("working", flush=True)
    time.sleep(30)
klbisect.cli.main = working
from klbisect.__main__ import run
sys.argv = ["klbisect", "status", "--json"]
run()
"""


def test_a_sigterm_after_the_modules_loaded_is_one_line_not_a_silent_death(tmp_path):
    """Between the imports and a session's own handlers SIGTERM had its
    default: exit -15, nothing said (a tester's early `kill`)."""
    code, out, err = _stopped_at(SLOW_COMMAND, tmp_path, "working", signal.SIGTERM)
    assert code == 130, err
    assert err.strip() == "klbisect: interrupted; finished runs are saved, rerun to resume"
    assert json.loads(out.strip().splitlines()[-1])["exit_code"] == 130


SETTLED_COMMAND = """
import atexit, sys, time
import klbisect.cli
def answered(*a, **k):
    print('{"culprit": "abc", "exit_code": 0}', flush=True)
    sys.exit(0)
klbisect.cli.main = answered
def teardown():
    print("exiting", flush=True)
    time.sleep(3)
atexit.register(teardown)
from klbisect.__main__ import run
sys.argv = ["klbisect", "run", "--json"]
run()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_after_the_answer_leaves_its_exit_code(tmp_path, sig):
    """A tester's: a TERM a moment after `run` printed its JSON (exit code 0)
    made the process exit 143, and one at the end of `start` broke
    `start && git bisect run klbisect probe` after git bisect had begun."""
    p = subprocess.Popen([sys.executable, "-c", SETTLED_COMMAND], cwd=tmp_path, env=child_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_hup_default)
    try:
        assert json.loads(p.stdout.readline())["exit_code"] == 0
        assert p.stdout.readline().strip() == "exiting"
        p.send_signal(sig)
        out, err = p.communicate(timeout=20)
    finally:
        p.kill()
    # (SIGINT's own handler raised in the teardown: a traceback, where the exit code held)
    assert p.returncode == 0 and "interrupted" not in err and "Traceback" not in err, (p.returncode, err)


def test_a_log_tail_cut_mid_line_leaves_the_cut_line_out(tmp_path):
    """The tail of a long log starts mid-line: what was left of a line whose
    start held ``HF_TOKEN=`` would reach the error line without the name
    that redaction looks for."""
    from klbisect.proc import log_tail
    log = tmp_path / "run.log"
    log.write_text("HF_TOKEN=" + "s" * 20000 + "\nTraceback (most recent call last):\nValueError: boom\n")
    assert log_tail(log) == "Traceback (most recent call last):\nValueError: boom"
    short = tmp_path / "short.log"
    short.write_text("first\nsecond\n")
    assert log_tail(short) == "first\nsecond"


def test_a_probes_escape_sequences_are_shown_not_played(history):
    """A probe that printed no value but a terminal title and a clear-screen:
    the error's log tail sent them raw to the user's terminal (a tester's;
    `head -c 3000 /dev/urandom` as the probe filled it with binary)."""
    from conftest import error_line, klb  # noqa: PLC0415
    h = history(n_commits=10, seed=35)
    # ... and a right-to-left override (U+202E, UTF-8 e2 80 ae), which reorders what is shown
    noise = "printf '\\033]0;PWNED\\007\\033[2Jno metric here \\342\\200\\256desrever\\n'"
    p = klb("run", "--good", h.good, "--bad", h.bad, "--probe-cmd", noise, cwd=h.path)
    assert "no metric here" in p.stderr and "\\x1b]0;PWNED\\x07" in p.stderr, p.stderr
    assert "\\u202edesrever" in p.stderr
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr and "\u202e" not in p.stderr
    error_line(p, 154)


def test_a_pid_file_the_full_disk_refuses_does_not_leave_the_probe_running(small_disk, tmp_path):
    """The pid file was written after the probe started and outside the
    cleanup: on a full disk its error left the probe running with no
    --timeout until klbisect exited, holding its slot's GPU."""
    pids = small_disk(2, 0).parent / "pids"
    tag = uuid.uuid4().hex
    with pytest.raises(OSError):
        run_logged(_sleeper(tag), cwd=tmp_path, log_path=tmp_path / "run.log", timeout=60, pid_dir=pids)
    assert not wait_gone(tag)
    assert not list(pids.glob("*.pid"))


def test_the_orphan_sweep_spares_a_child_another_thread_is_still_starting(monkeypatch):
    """A tester's --parallel 3 had its own probes killed from outside (exit
    -15, retried) three times in 2,000 runs: one slot's sweep for orphans
    without klbisect's marker ran while another slot forked its probe,
    whose environment is ours until it execs. A fork that has not exec'd
    shows our command line: it is spared."""
    import os

    from klbisect import proc
    monkeypatch.setattr(proc, "_subreaper", True)
    monkeypatch.delenv("KLBISECT_OWNER", raising=False)
    monkeypatch.delenv("KLBISECT_PROBE_ID", raising=False)
    since = proc._boot_ticks() - 100
    pid = os.fork()
    if pid == 0:                     # as subprocess's child is before exec: setsid, then waiting
        os.setsid()
        time.sleep(3)
        os._exit(0)
    try:
        time.sleep(0.3)
        proc._kill_unmarked_orphans(since)
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the starting child was killed"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_cleanup_after_a_stop_may_start_processes_and_a_swallowed_stop_still_stops(tmp_path):
    """After one Ctrl-C the noted stop refused every new process, the pip
    that puts the user's interpreter back among them (a tester's venv was
    left on a deleted worktree). The cleanup runs; a stop that Python
    swallowed (nothing unwinding from it) still stops the command after."""
    from klbisect import proc
    proc._signalled.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            proc.run_logged("true", cwd=tmp_path, log_path=tmp_path / "refused.log", timeout=30)
        # unwinding from the stop (a `finally` it runs through): the cleanup runs, nothing more is raised
        try:
            try:
                raise KeyboardInterrupt
            finally:
                with proc.despite_a_stop():
                    ran = proc.run_logged("echo put back", cwd=tmp_path, log_path=tmp_path / "a.log", timeout=30)
        except KeyboardInterrupt:
            pass
        assert ran.exit_code == 0 and proc._signalled.is_set()
        # swallowed: nothing unwinds, so once the cleanup is done the stop is raised
        with pytest.raises(KeyboardInterrupt):
            with proc.despite_a_stop():
                ran = proc.run_logged("echo put back", cwd=tmp_path, log_path=tmp_path / "b.log", timeout=30)
        assert ran.exit_code == 0 and proc._signalled.is_set()
    finally:
        proc._signalled.clear()
    # with no stop noted, it is a plain block
    with proc.despite_a_stop():
        pass


def test_a_pid_file_a_killed_klbisect_never_named_is_cleared(tmp_path):
    """Pid files are written whole, then named (a sweep read one empty and
    unlinked it); one left by a klbisect killed between the two goes at
    the next sweep once its owner is gone, and stays while it lives."""
    pids = tmp_path / "pids"
    pids.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (pids / "111.pid.tmp").write_text(f"{gone.pid} 111 {gone.pid}:1\n")     # a start that no process has
    (pids / "222.pid.tmp").write_text(f"{os.getpid()} 222 {owner_marker()}\n")
    assert reap_stale(pids) == []
    assert sorted(p.name for p in pids.iterdir()) == ["222.pid.tmp"]
