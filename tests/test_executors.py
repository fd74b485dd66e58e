"""Executors: local slots (worktrees, GPU subsets, ports), failures of a worker
mid-probe, and Ray tasks on a local CPU cluster with declared GPUs."""
from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import db_query
from klbisect.errors import KlbisectError
from klbisect.executors import (Failure, LocalExecutor, gpu_groups, infrastructure_failure,
                                make_slots, port_bases, visible_gpus)
from klbisect.histgen import NoiseModel, make_history
from klbisect.measure import Outcome
from klbisect.probe import PORT_SPAN, CommandProbe, RunResult, Slot
from klbisect.config import BisectConfig
from klbisect.session import run_bisect
from klbisect.workspace import Workspace

N_COMMITS = 50
CULPRIT = 31
METRIC = "prefill_cache_hit"

# The probe wrapper: records what each run saw (GPUs, port range, cwd, times)
# and appends a ledger line only after the real probe printed its values.
# With KLB_KILL_AT=n its n-th invocation (0-based) writes its pid and waits to
# be killed from outside; with KLB_KILL_WORKER its first invocation kills the
# Ray worker process running it. A second argument holds each run open that
# many seconds, so that runs dispatched together overlap however loaded the
# machine is.
WRAPPER = r'''
import fcntl, json, os, subprocess, sys, time
state = sys.argv[1]
hold = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
with open(os.path.join(state, "count"), "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    n = len(f.read().splitlines())
    f.write("x\n")
start = time.time()
if os.environ.get("KLB_KILL_AT") and n == int(os.environ["KLB_KILL_AT"]):
    with open(os.path.join(state, "victim.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(state, "victim.tmp"), os.path.join(state, "victim.pid"))
    time.sleep(120)
if os.environ.get("KLB_KILL_WORKER") and n == 0:
    import psutil
    for p in psutil.Process().parents():
        cmd = " ".join(p.cmdline())
        if "ray::" in cmd or "default_worker" in cmd:
            p.kill()
            break
    time.sleep(120)
p = subprocess.run([sys.executable, "probe.py"], capture_output=True, text=True)
sys.stdout.write(p.stdout)
sys.stderr.write(p.stderr)
sys.stdout.flush()
time.sleep(max(0.0, start + hold - time.time()))
rec = {"n": n, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "port": os.environ.get("KLBISECT_PORT_BASE"),
       "cwd": os.getcwd(), "start": start, "end": time.time()}
with open(os.path.join(state, "ledger"), "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.write(json.dumps(rec) + "\n")
sys.exit(p.returncode)
'''


def _ledger(state: Path) -> list[dict]:
    import json
    f = state / "ledger"
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


@pytest.fixture
def history(tmp_path):
    return make_history(tmp_path / "repo", n_commits=N_COMMITS, culprit_index=CULPRIT, seed=3, merges=2)


@pytest.fixture
def state(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    (d / "wrapper.py").write_text(WRAPPER)
    return d


def _cfg(h, state: Path, hold: float = 0.0, **kw) -> BisectConfig:
    return BisectConfig(good=h.good, bad=h.bad, metric=METRIC,
                        probe_cmd=f"{sys.executable} {state / 'wrapper.py'} {state} {hold}", **kw)


def _session_runs(h):
    ws = Workspace(h.path)
    try:
        sess = ws.store.latest_session(("run",))
        return ws.store.session_runs(sess.id)
    finally:
        ws.close()


def _overlapping(recs: list[dict]):
    for a, b in itertools.combinations(recs, 2):
        if a["start"] < b["end"] and b["start"] < a["end"]:
            yield a, b


# ---- slots: GPUs and ports --------------------------------------------------------

def test_declared_gpu_list_is_split_into_disjoint_groups(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert visible_gpus() == ["0", "1", "2", "3"]
    slots = make_slots(tmp_path, 2, gpus_per_probe=2)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in slots] == ["0,1", "2,3"]
    assert len({s.checkout for s in slots}) == 2
    a, b = sorted(s.port_base for s in slots)
    assert a > 0 and b - a >= PORT_SPAN               # port ranges do not overlap
    # a reviewer's: SGLang's NCCL port, 100-1000 above its server's, landed in the next slot's range
    bases = sorted(s.port_base for s in make_slots(tmp_path, 4, gpus_per_probe=0))
    assert all(b - a >= 1100 for a, b in zip(bases, bases[1:])), bases
    assert len(set(port_bases(40, start=0))) == 40    # more slots than fit that far apart: as close as before
    # the declared order and names are honoured (a scheduler's GPU list)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7,GPU-abc")
    assert gpu_groups(3, 1, visible_gpus()) == [["5"], ["7"], ["GPU-abc"]]
    with pytest.raises(KlbisectError, match="needs 4 GPUs, 3 visible"):
        make_slots(tmp_path, 2, gpus_per_probe=2)
    # 0 GPUs per probe: no assignment, the probe inherits the environment
    assert all(s.env == {} for s in make_slots(tmp_path, 4, gpus_per_probe=0))


def test_results_are_taken_as_they_arrive(tmp_path):
    release = threading.Event()

    def measure(sha, slot):
        if sha == "slow":
            release.wait(30)
        return Outcome(sha, slot.index, time.time(), run=RunResult({"x": 1.0}, 0, "ok", 0.0, ""))

    ex = LocalExecutor([Slot(0, tmp_path / "a"), Slot(1, tmp_path / "b")], measure)
    try:
        ex.submit("slow")
        ex.submit("fast")
        got = ex.wait(timeout=10)
        assert [r.sha for r in got] == ["fast"] and ex.in_flight() == ["slow"] and ex.free() == 1
        ex.submit("fast2")                       # the freed slot is reused at once
        assert [r.sha for r in ex.wait(timeout=10)] == ["fast2"]
        release.set()
        assert [r.sha for r in ex.wait(timeout=10)] == ["slow"]
        assert ex.wait() == [] and ex.free() == 2   # nothing in flight: no blocking
    finally:
        release.set()
        ex.close()


def test_killed_probe_is_an_infrastructure_failure():
    def out(code, values, status):
        return Outcome("s", 0, 0.0, run=RunResult(values, code, status, 1.0, "log"))
    assert infrastructure_failure(out(-9, {}, "crash"))
    assert infrastructure_failure(out(137, {}, "crash"))
    assert infrastructure_failure(out(1, {}, "crash")) is None        # the commit's own crash
    assert infrastructure_failure(out(-9, {"a": 1.0}, "ok")) is None  # it measured before dying
    assert infrastructure_failure(out(None, {}, "timeout")) is None


# ---- the local executor end to end -----------------------------------------------

def test_local_parallel_with_declared_gpus_finds_culprit(history, state, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    res = run_bisect(history.path, _cfg(history, state, hold=0.5, parallel=2, gpus_per_probe=2),
                     progress=lambda m: None)
    assert res.complete and res.culprit == history.culprit
    recs = _ledger(state)
    assert len(recs) == len(_session_runs(history)) == res.probe_runs
    # each slot: one GPU pair and one port range for all its runs; the slots run in a pool of
    # worktrees (a commit goes back to the one that has it built), never two runs in one at once
    pairs = {(r["cvd"], r["port"]) for r in recs}
    assert sorted(cvd for cvd, _ in pairs) == ["0,1", "2,3"], pairs
    ports = [int(port) for _, port in pairs]
    assert abs(ports[0] - ports[1]) >= PORT_SPAN
    assert {Path(r["cwd"]).name for r in recs} <= {f"slot-{i}" for i in range(5)}
    overlaps = list(_overlapping(recs))
    assert overlaps, "the two slots never probed at the same time"
    assert all(set(a["cvd"].split(",")).isdisjoint(b["cvd"].split(",")) and a["cwd"] != b["cwd"]
               for a, b in overlaps)


def test_worker_dying_mid_probe_loses_and_doubles_nothing(history, state, monkeypatch):
    """One probe SIGKILLed from outside, one measure call raising: both are
    retried, every finished run is recorded exactly once, and the bisect
    still finds the culprit."""
    monkeypatch.setenv("KLB_KILL_AT", "3")   # during endpoint calibration

    def killer():
        victim = state / "victim.pid"
        for _ in range(1200):
            if victim.exists():
                os.kill(int(victim.read_text()), signal.SIGKILL)
                return
            time.sleep(0.05)
    threading.Thread(target=killer, daemon=True).start()

    calls = itertools.count()

    def factory(cfg, slots, measurer, ws):
        def measure(sha, slot):
            if next(calls) == 8:                 # during the search
                raise OSError("simulated worker failure (disk full)")
            return measurer.measure(sha, slot)
        return LocalExecutor(slots, measure)

    msgs: list[str] = []
    res = run_bisect(history.path, _cfg(history, state, parallel=2), progress=msgs.append,
                     executor_factory=factory)
    assert res.complete and res.culprit == history.culprit
    fails = [m for m in msgs if m.startswith("infrastructure failure")]
    assert len(fails) == 2, msgs
    assert any("killed from outside by SIGKILL (exit -9" in m or "killed from outside by SIGKILL (exit 137" in m
               for m in fails) and any("disk full" in m for m in fails), fails
    runs = _session_runs(history)
    recs = _ledger(state)
    # every probe that finished is stored once; the killed one is not stored at all
    assert len(runs) == len(recs) == res.probe_runs
    assert len({r.log_path for r in runs}) == len(runs)
    assert all(r.value is not None for r in runs)
    assert 3 not in {r["n"] for r in recs}


def test_a_second_ctrl_c_while_worktrees_go_still_puts_the_interpreter_back(tmp_path, monkeypatch):
    """Ctrl-C, then another while the session removed its worktrees: the
    second one skipped what came after, the --build sglang interpreter's
    restore, and left the venv on a deleted worktree."""
    from klbisect import nightly, session
    h = make_history(tmp_path / "repo", n_commits=12, merges=0, culprit_index=6, seed=5)
    closed = []
    monkeypatch.setattr(session, "close_builder", lambda *a, **kw: closed.append("run"))
    monkeypatch.setattr(nightly, "close_builder", lambda *a, **kw: closed.append("nightly"))

    def second_ctrl_c(repo, path):
        raise KeyboardInterrupt
    monkeypatch.setattr(session.gitrepo, "worktree_remove", second_ctrl_c)
    calls = itertools.count()

    def first_ctrl_c(cfg, slots, measurer, ws):
        def measure(sha, slot):
            if next(calls) == 2:
                raise KeyboardInterrupt
            return measurer.measure(sha, slot)
        return LocalExecutor(slots, measure)

    cfg = BisectConfig(good=h.good, bad=h.bad, probe_cmd=f"{sys.executable} probe.py")
    with pytest.raises(KeyboardInterrupt):
        run_bisect(h.path, cfg, progress=lambda m: None, executor_factory=first_ctrl_c)
    assert closed == ["run"]
    meter = nightly._Meter(Workspace(h.path), 1, probe=None, builder=None, progress=lambda m: None)
    meter.slot = Slot(0, h.path / ".git" / "klbisect" / "worktrees" / "gone")
    meter.slot.checkout.mkdir(parents=True)
    try:
        with pytest.raises(KeyboardInterrupt):
            meter.close()
    finally:
        meter.ws.close()
    assert closed == ["run", "nightly"]


# ---- Ray ---------------------------------------------------------------------------

@pytest.fixture
def ray_cluster():
    """A cluster for one test: one kept for the module was found by a later
    test's `--ray-address auto`, which looks for any running cluster."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, num_gpus=4, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()


def test_ray_bisect_each_task_gets_its_own_gpus(ray_cluster, history, state, tmp_path, monkeypatch):
    monkeypatch.setenv("KLBISECT_RAY_CACHE", str(tmp_path / "node-cache"))
    res = run_bisect(history.path, _cfg(history, state, hold=1.5, parallel=2, gpus_per_probe=2, executor="ray"),
                     progress=lambda m: None)
    assert res.complete and res.culprit == history.culprit
    recs = _ledger(state)
    runs = _session_runs(history)
    assert len(recs) == len(runs) == res.probe_runs
    for r in recs:
        ids = r["cvd"].split(",")
        assert len(ids) == 2 and len(set(ids)) == 2 and set(ids) <= {"0", "1", "2", "3"}, r
        # probes ran in the node's own clone, not in the bisected repository
        assert Path(r["cwd"]).is_relative_to(tmp_path / "node-cache"), r
    overlaps = list(_overlapping(recs))
    assert overlaps, "the two tasks never ran at the same time"
    assert all(set(a["cvd"].split(",")).isdisjoint(b["cvd"].split(",")) for a, b in overlaps)
    # logs came back to the driver
    assert all(Path(r.log_path).is_file() and "avg_kl_div" in Path(r.log_path).read_text() for r in runs)


@pytest.mark.parametrize("take_turns", [False, True])
def test_ray_tasks_on_one_node_take_turns_when_they_share_its_pinned_wheels(ray_cluster, history, state,
                                                                            tmp_path, take_turns):
    """--build sglang installs a commit's pinned kernel wheels into the
    node's one Python: where the range's pins change, two tasks on a node
    at once could each probe with the other's wheel (the local executor
    keeps to one slot; a node's tasks take turns, nodes stay parallel)."""
    from klbisect.ray_executor import RayExecutor
    probe = CommandProbe(f"{sys.executable} {state / 'wrapper.py'} {state} 1.5")
    ex = RayExecutor(2, 1, str(history.path), tmp_path / "logs", probe=probe, probe_key=probe.key,
                     cache_dir=str(tmp_path / "node-cache"), take_turns=take_turns)
    try:
        for sha in (history.shas[10], history.shas[40]):
            ex.submit(sha)
        got = []
        while ex.in_flight():
            got += ex.wait(timeout=120)
        assert len(got) == 2 and all(isinstance(o, Outcome) and o.run.values for o in got), got
    finally:
        ex.close()
    recs = _ledger(state)
    assert len(recs) == 2
    assert bool(list(_overlapping(recs))) is not take_turns, recs


def test_a_node_s_worktree_builds_again_after_another_installed_into_its_python(tmp_path):
    """A reviewer's: with tasks taking turns, a worktree that had built its
    commit before skipped the build and probed with the wheel another
    worktree had installed since (A probed with B's pin). A worktree's
    build stands only while it was the last to install into the node's
    Python. run_task directly, two tasks at a time, as Ray runs them."""
    from dataclasses import dataclass

    from klbisect.measure import BuildResult
    from klbisect.ray_executor import TaskSpec, run_task
    repo, python = tmp_path / "repo", tmp_path / "installed-pin"
    repo.mkdir()
    shas = []
    for pin, note in (("1", "a"), ("2", "b"), ("2", "b2")):
        (repo / "pin").write_text(pin)
        (repo / "note").write_text(note)
        for args in (("init", "-q", "-b", "main"),) if not shas else ():
            subprocess.run(["git", *args], cwd=repo, check=True)
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-qm", note], cwd=repo,
                       check=True)
        shas.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                   check=True).stdout.strip())

    @dataclass
    class PinInstaller:                 # --build sglang's part that matters: the pin goes into one Python
        key: str = "pin-installer"

        def needs_build(self, changed):
            return changed is None or "pin" in changed

        def build(self, checkout, log, slot):
            time.sleep(0.3)
            python.write_text((Path(checkout) / "pin").read_text())
            Path(log).parent.mkdir(parents=True, exist_ok=True)
            Path(log).write_text("installed\n")
            return BuildResult(True, 0.3, str(log), "")
    probe = CommandProbe(f'sleep 0.5; if [ "$(cat pin)" = "$(cat {python})" ]; then echo "kl: 0.001"; '
                         'else echo "kl: 9"; fi', metric_regex=r"kl: ([0-9.]+)")
    seen: list[tuple[str, dict]] = []

    def task(sha: str) -> None:
        spec = TaskSpec(sha, str(repo), str(tmp_path / "cache"), 0, probe, PinInstaller(), {}, probe.key,
                        "pin-installer", take_turns=True)
        seen.append((sha, run_task(spec)["outcome"].run.values))
    for wave in ((shas[0], shas[1]), (shas[0], shas[2]), (shas[0], shas[2])):
        threads = [threading.Thread(target=task, args=(sha,)) for sha in wave]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(seen) == 6 and all(values == {"value": 0.001} for _, values in seen), seen


def test_ray_worker_death_is_retried_and_counted_once(ray_cluster, history, state, tmp_path, monkeypatch):
    from klbisect.ray_executor import RayExecutor
    probe = CommandProbe(f"KLB_KILL_WORKER=1 {sys.executable} {state / 'wrapper.py'} {state}")
    ex = RayExecutor(1, 1, str(history.path), tmp_path / "logs", probe=probe, probe_key=probe.key,
                     cache_dir=str(tmp_path / "node-cache"))
    try:
        ex.submit(history.shas[40])
        got = ex.wait(timeout=120)
        assert len(got) == 1 and isinstance(got[0], Outcome), got
        assert got[0].run.values and got[0].slot == 0
        assert len(_ledger(state)) == 1            # the killed attempt printed nothing; Ray retried it
        assert (state / "count").read_text().count("x") == 2
        # a commit no node can fetch: an infrastructure failure, not a verdict
        ex.submit("0" * 40)
        bad = ex.wait(timeout=120)
        assert len(bad) == 1 and isinstance(bad[0], Failure) and "not reachable" in bad[0].error
        assert ex.wait() == [] and ex.free() == 1
    finally:
        ex.close()


def test_sigterm_to_a_ray_bisect_exits_130_with_its_json(history, tmp_path):
    """A cancelled CI job sends SIGTERM: ray.init had replaced klbisect's
    handler with its own (a C++ stack dump, then abort), so the job ended
    on -6 or 15 with no line saying what was saved and no JSON."""
    pytest.importorskip("ray")
    from conftest import child_env, klbisect_script  # noqa: PLC0415
    err = tmp_path / "err"
    cmd = klbisect_script() + ["run", "--good", history.good, "--bad", history.bad,
                               "--probe-cmd", f"sleep 1; {sys.executable} probe.py", "--executor", "ray",
                               "--parallel", "2", "--json"]
    with open(err, "w") as errf:
        p = subprocess.Popen(cmd, cwd=history.path, env=child_env(), stdout=subprocess.PIPE, stderr=errf,
                             text=True)
        try:
            deadline = time.monotonic() + 240
            while "probing " not in err.read_text():
                assert p.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.2)
            p.send_signal(signal.SIGTERM)
            out, _ = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    said = err.read_text()
    assert p.returncode == 130, said[-2000:]
    assert "SIGTERM received" not in said and "klbisect: interrupted" in said, said[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["exit_code"] == 130


def test_ctrl_c_of_a_ray_bisect_leaves_no_probe_running(history, tmp_path):
    """A tester's: Ctrl-C cancelled the Ray tasks with force, killing their
    workers, and each probe (a process group of its own) and the server it
    started went on running under init."""
    pytest.importorskip("ray")
    import uuid  # noqa: PLC0415

    import psutil  # noqa: PLC0415
    from conftest import child_env, klbisect_script  # noqa: PLC0415
    tag = uuid.uuid4().hex
    server = f"{sys.executable} -c 'import time; time.sleep(600)' {tag}"
    err = tmp_path / "err"

    def alive() -> list:
        # the server itself (its last argument), not klbisect, whose --probe-cmd names it
        return [q for q in psutil.process_iter(["cmdline"]) if (q.info["cmdline"] or [""])[-1] == tag]
    cmd = klbisect_script() + ["run", "--good", history.good, "--bad", history.bad,
                               "--probe-cmd", f"{server} & sleep 3; {sys.executable} probe.py",
                               "--executor", "ray", "--parallel", "2"]
    with open(err, "w") as errf:
        p = subprocess.Popen(cmd, cwd=history.path, env=child_env(), stdout=subprocess.PIPE, stderr=errf,
                             text=True)
        try:
            deadline = time.monotonic() + 240
            while not alive():
                assert p.poll() is None and time.monotonic() < deadline, err.read_text()
                time.sleep(0.2)
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    try:
        assert p.returncode == 130, err.read_text()[-2000:]
        gone = time.monotonic() + 10
        while alive() and time.monotonic() < gone:
            time.sleep(0.2)
        assert alive() == [], err.read_text()[-2000:]
    finally:
        for q in alive():
            q.kill()


@pytest.mark.parametrize("address,words", [
    ("127.0.0.1:1", "--ray-address 127.0.0.1:1: nothing answers at 127.0.0.1:1"),
    ("bogus", "--ray-address bogus: give HOST:PORT"),
    (None, "RAY_ADDRESS=127.0.0.1:1: nothing answers at 127.0.0.1:1"),
])
def test_a_ray_address_where_no_cluster_answers_is_one_line_before_any_session(history, address, words):
    """A tester's --ray-address of nothing listening hung in ray.init for
    good, deaf to Ctrl-C and SIGTERM; a malformed one was an internal
    error (159); and each left a session "not running now"."""
    pytest.importorskip("ray")
    from conftest import child_env, klbisect_script  # noqa: PLC0415
    # no --ray-address: a stale RAY_ADDRESS, which ray.init takes then
    where = ["--ray-address", address] if address else []
    p = subprocess.run(klbisect_script() + ["run", "--good", history.good, "--bad", history.bad, "--probe-cmd",
                                            f"{sys.executable} probe.py", "--executor", "ray", *where],
                       cwd=history.path, env=child_env({"RAY_ADDRESS": "127.0.0.1:1"} if not address else None),
                       capture_output=True, text=True, timeout=60)
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("klbisect: error:")]
    assert p.returncode == 150 and len(said) == 1 and words in said[0], p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert db_query(history.path, "SELECT COUNT(*) FROM sessions")[0][0] == 0


def test_a_ray_address_where_another_server_answers_is_one_line(tmp_path):
    """A tester's --ray-address of the dashboard's port (or any HTTP server)
    passed the port check and hung in ray.init for good, deaf to Ctrl-C and
    SIGTERM; http://HOST:8265 passed Ray's own text through, newlines escaped."""
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer  # noqa: PLC0415
    from klbisect.errors import EXIT_USAGE, KlbisectError  # noqa: PLC0415
    from klbisect.ray_executor import _check_address  # noqa: PLC0415
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    try:
        for address, words in ((f"127.0.0.1:{port}", "is not a Ray cluster (no gRPC there"),
                               (f"ray://127.0.0.1:{port}", "is not a Ray cluster (no gRPC there"),
                               (f"http://127.0.0.1:{port}", "give HOST:PORT")):
            with pytest.raises(KlbisectError) as e:
                _check_address(address)
            assert e.value.code == EXIT_USAGE and words in str(e.value), str(e.value)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_sigterm_while_ray_starts_its_cluster_is_klbisects_stop(monkeypatch):
    """A tester's SIGTERM in the seconds ray.init starts a local cluster met
    Ray's handler, sys.exit(15): exit 15 and no line. It is klbisect's stop
    (KeyboardInterrupt: exit 130 with what was saved); another exit passes."""
    import types  # noqa: PLC0415
    from klbisect.ray_executor import RayExecutor  # noqa: PLC0415
    shut = []

    def init(**kw):
        raise SystemExit(code)
    fake = types.SimpleNamespace(is_initialized=lambda: False, init=init, shutdown=lambda: shut.append(1))
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = types.SimpleNamespace(ray_address=None)
    code = signal.SIGTERM
    with pytest.raises(KeyboardInterrupt):
        RayExecutor.from_config(cfg, None, None)
    assert shut == [1]
    code = 3
    with pytest.raises(SystemExit):
        RayExecutor.from_config(cfg, None, None)


def test_ray_address_auto_with_no_cluster_is_one_line_not_an_internal_error(history):
    """A tester's `--ray-address auto` with no cluster running was ray.init's
    ConnectionError as "internal error" (159)."""
    pytest.importorskip("ray")
    from conftest import child_env, klbisect_script  # noqa: PLC0415
    import psutil  # noqa: PLC0415
    # as `auto` finds one: the address file, or any GCS server running here
    from klbisect.ray_executor import RAY_CURRENT_CLUSTER  # noqa: PLC0415
    if os.environ.get("RAY_ADDRESS") or Path(RAY_CURRENT_CLUSTER).exists() or any(
            "gcs_server" in (q.info["name"] or "") for q in psutil.process_iter(["name"])):
        pytest.skip("a Ray cluster runs on this machine")
    p = subprocess.run(klbisect_script() + ["run", "--good", history.good, "--bad", history.bad, "--probe-cmd",
                                            f"{sys.executable} probe.py", "--executor", "ray", "--ray-address", "auto"],
                       cwd=history.path, env=child_env(), capture_output=True, text=True, timeout=120)
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("klbisect: error:")]
    assert p.returncode == 150 and len(said) == 1 and "cannot connect to --ray-address auto" in said[0], p.stderr
    assert "Traceback" not in p.stderr and "`ray start --head` starts one" in said[0]


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_gpus_this_machine_lacks_are_refused_before_a_session_is_recorded(history, executor):
    """A tester's: with no GPU, `--executor ray --gpus-per-probe 1` on the
    Ray cluster klbisect started itself waited forever for GPUs it could
    never gain (the local executor refuses at once); and the local refusal
    left a session that every later run "resumed" with 0 runs."""
    if executor == "ray":
        pytest.importorskip("ray")
    from conftest import child_env, klbisect_script  # noqa: PLC0415
    env = {**child_env(), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run(klbisect_script() + ["run", "--good", history.good, "--bad", history.bad, "--probe-cmd",
                                            f"{sys.executable} probe.py", "--executor", executor, "--parallel", "2",
                                            "--gpus-per-probe", "1"],
                       cwd=history.path, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 150, p.stderr[-2000:]
    said = [ln for ln in p.stderr.splitlines() if ln.startswith("klbisect: error:")]
    assert len(said) == 1 and ("0 visible" in said[0] if executor == "local" else "has 0 GPUs" in said[0]), said
    assert db_query(history.path, "SELECT COUNT(*) FROM sessions")[0][0] == 0


def test_a_repeat_run_goes_back_to_the_slot_that_has_the_commit(tmp_path):
    """The slot that last probed a commit has it checked out and built (and,
    for server probes, its server up): a repeat run of it goes there."""
    seen: list[tuple[str, int]] = []

    def measure(sha: str, slot: Slot) -> Outcome:
        seen.append((sha, slot.index))
        return Outcome(sha, slot.index, time.time())

    ex = LocalExecutor([Slot(i, tmp_path / f"slot-{i}") for i in range(3)], measure)
    try:
        for sha in ("a", "b", "c"):
            ex.submit(sha)
        while ex.in_flight():
            ex.wait(timeout=5)
        ex.submit("c")
        ex.submit("a")
        while ex.in_flight():
            ex.wait(timeout=5)
    finally:
        ex.close()
    first = {sha: idx for sha, idx in seen[:3]}
    assert dict(seen[3:]) == {"c": first["c"], "a": first["a"]}


def test_three_slots_keep_the_endpoint_they_built(tmp_path):
    """Two endpoints, three slots: a free slot takes a queued run of the
    endpoint it already built, so twelve endpoint runs cost a build per slot
    and one switch each for the slots that finish their side first (5; 6 when a
    loaded machine reorders the last runs), not a rebuild whenever the queue's
    next entry is the other endpoint (6-9)."""
    h = make_history(tmp_path / "repo", n_commits=60, seed=6, probe_requires_build=True,
                     noise=NoiseModel(good=(0.003, 0.004), bad=(0.012, 0.014)))
    marker = tmp_path / "builds.log"
    cfg = BisectConfig(good=h.good, bad=h.bad, metric=METRIC, parallel=3,
                       probe_cmd=f"{sys.executable} probe.py",
                       build_cmd=f"echo built >> {marker} && {sys.executable} build.py")
    res = run_bisect(h.path, cfg, progress=lambda m: None)
    assert res.culprit == h.culprit
    ws = Workspace(h.path)
    try:
        sess = ws.store.latest_session(("run",))
        ends = [r for r in ws.store.session_runs(sess.id) if r.sha in (h.good, h.bad)]
        builds = ws.store.db.execute("SELECT sha FROM builds").fetchall()
    finally:
        ws.close()
    assert len(ends) >= 12
    # 5 as the runs usually finish; on a loaded machine one slot's last run can finish
    # after the queue moved on, and that slot switches once more (seen 1 in 5 under load)
    assert sum(b[0] in (h.good, h.bad) for b in builds) <= 6


def _packaging_commits(repo: Path, name: str, text: str) -> list[str]:
    """Three commits x, y, z whose file ``name`` (read as packaging) differs:
    each needs its own build."""
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    shas = []
    for tag in ("x", "y", "z"):
        (repo / name).write_text(text.format(tag))
        subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
        subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-qm", tag], cwd=repo,
                       check=True)
        shas.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                   check=True).stdout.strip())
    return shas


class _RecordingBuilder:
    """Builds whenever the packaging changed (every commit here); records
    (commit, checkout) and reports ``seconds(fresh)`` as its duration."""
    key = "recording"

    def __init__(self, seconds):
        self.seconds, self.builds = seconds, []

    def needs_build(self, changed):
        return changed is None or bool(changed)

    def build(self, checkout, log, slot):
        from klbisect.measure import BuildResult
        fresh = all(str(checkout) != where for _, where in self.builds)
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True).stdout
        self.builds.append((sha.strip(), str(checkout)))
        return BuildResult(True, self.seconds(fresh), str(log), "")


def _pool_rounds(repo: Path, builder, worktrees: Path, rounds) -> None:
    """Two slots in a pool of five checkouts: each round's commits submitted
    together and waited for; the pool removed at the end."""
    import git as gitpython

    from klbisect import repo as gitrepo
    from klbisect.measure import Measurer
    measurer = Measurer(gitpython.Repo(repo), CommandProbe("echo kl: 1", metric_regex=r"kl: (\d+)"), builder,
                        worktrees.parent / "logs")
    ex = LocalExecutor(make_slots(worktrees, 2), measurer.measure, spare_checkouts=3)
    try:
        for batch in rounds:
            for sha in batch:
                ex.submit(sha)
            while ex.in_flight():
                ex.wait()
    finally:
        ex.close()
        for c in ex.checkouts():
            if c.exists():
                gitrepo.worktree_remove(gitpython.Repo(repo), c)


def test_parallel_slots_keep_revisited_commits_built_in_a_pool_of_checkouts(tmp_path):
    """A tester's --parallel 2 built one commit six times in one run: each
    slot had one checkout, and the commits a search revisits (endpoints,
    the pair beside the boundary), sent to whichever slot was free, were
    rebuilt there (41 builds, 16 of one commit, on a 60-commit overlapping
    history; 8 with the pool). Two slots, three commits: X and Y, then Z,
    then X again while Z runs: X goes back to the checkout that built it."""
    x, y, z = _packaging_commits(tmp_path / "repo", "pyproject.toml", "name = {!r}\n")
    builder = _RecordingBuilder(lambda fresh: 0.0)
    _pool_rounds(tmp_path / "repo", builder, tmp_path / "worktrees", ((x, y), (z, x)))
    built = [sha for sha, _ in builder.builds]
    assert sorted(built) == sorted([x, y, z]), built          # X once: its second run needed no build


def test_where_builds_from_nothing_take_minutes_the_pool_rebuilds_in_place(tmp_path):
    """A reviewer's: the pool sent a commit that needed a build to an unused
    checkout, a build from scratch, before an idle one that would build on
    what it had (an in-tree C++ build: minutes against hours). Once fresh
    builds have taken minutes, the idle one is used."""
    x, y, z = _packaging_commits(tmp_path / "repo", "CMakeLists.txt", "project({})\n")
    builder = _RecordingBuilder(lambda fresh: 1800.0 if fresh else 60.0)     # as such a build would report
    _pool_rounds(tmp_path / "repo", builder, tmp_path / "worktrees", ((x, y), (z,), (x,)))
    where = [checkout for _, checkout in builder.builds]
    assert sorted({Path(w).name for w in where}) == ["slot-0", "slot-1"], where     # no third build from scratch


def test_a_checkout_handed_to_another_slot_stops_the_server_started_from_it(tmp_path):
    """A reviewer's: slot 0's server, started from a pool checkout, kept
    running while slot 1 checked out and built another commit there, and
    would have been reused had slot 0 come back to it at the same commit."""
    released: list[tuple[int, Path]] = []

    class Probe:
        def release_checkout(self, slot_index, checkout):
            released.append((slot_index, checkout))

    class Meter:
        probe = Probe()

        def measure(self, sha, slot):
            time.sleep(0.2 if sha == "long" else 0.05)
            return Outcome(sha, slot.index, time.time(), run=RunResult({"kl": 1.0}, 0, "ok", 0.05, ""),
                           checkout=str(slot.checkout))
    ex = LocalExecutor([Slot(0, tmp_path / "slot-0"), Slot(1, tmp_path / "slot-1")], Meter().measure,
                       spare_checkouts=1)
    ex.submit("a")                      # slot 0, in slot-0
    ex.wait()
    ex.submit("long")                   # slot 0 again, in an unused checkout (slot-1)
    ex.submit("a")                      # back to slot-0, which has it: slot 1 runs there now
    done = []
    while ex.in_flight():
        done += ex.wait()
    ex.close()
    assert sorted((r.sha, r.slot, Path(r.checkout).name) for r in done) == [("a", 1, "slot-0"), ("long", 0, "slot-1")]
    assert released == [(0, tmp_path / "slot-0")]


def test_a_run_removes_the_pool_worktrees_a_killed_run_left(history, state):
    """A reviewer's: a run of three slots killed with -9 left its pool of
    worktrees (each may hold a build) under the git dir, and a later
    complete run of one slot removed only its own."""
    left = history.path / ".git" / "klbisect" / "worktrees" / "slot-6"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(left), history.good], cwd=history.path,
                   check=True)
    res = run_bisect(history.path, _cfg(history, state), progress=lambda m: None)
    assert res.complete and res.culprit == history.culprit
    assert not left.exists()
    listed = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=history.path, capture_output=True,
                            text=True, check=True).stdout
    assert listed.count("worktree ") == 1, listed


def test_a_slot_whose_clock_lags_does_not_rebuild_a_broken_commit_without_end(tmp_path):
    """A reviewer's: with a Ray node an hour behind, each build that failed
    now looked older than the command, so it was 'built once more', failed,
    and was built again, 1,683 times in a minute. This command's builds are
    told by the store's order, not by the clock."""
    h = make_history(tmp_path / "repo", n_commits=20, merges=0, culprit_index=10, seed=3)
    broken = h.shas[9]
    cfg = BisectConfig(good=h.good, bad=h.bad, probe_cmd=f"{sys.executable} probe.py",
                       build_cmd=f'test "$(git rev-parse HEAD)" != {broken}', build_paths=("*",),
                       threshold=0.0065, max_total_runs=60)
    calls = itertools.count()

    def lagging(cfg, slots, measurer, ws):
        def measure(sha, slot):
            if next(calls) > 200:
                raise AssertionError("still measuring after 200 builds and runs")
            out = measurer.measure(sha, slot)
            out.started -= 3600
            return out
        return LocalExecutor(slots, measure)

    res = run_bisect(h.path, cfg, progress=lambda m: None, executor_factory=lagging)
    assert res.complete and res.candidates == [broken, h.culprit], res.reason
    assert [r["sha"] for r in db_query(h.path, "SELECT sha FROM builds WHERE ok=0")] == [broken]


ONE_FULL_ONE_BROKEN_BUILD = '''import os, subprocess, sys
head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
if os.path.exists(sys.argv[1]) and head not in sys.argv[2:]:
    try:      # the first build to get here meets the full disk; the others fail as builds do
        os.close(os.open(sys.argv[1] + ".first", os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        raise SystemExit("error: undefined symbol: kv_cache_fp8_scale")
    raise SystemExit("OSError: [Errno 28] No space left on device: 'build/lib/kvserve/_C.so'")
'''


class _WholeBatches:
    """A LocalExecutor that hands back results only once every slot is done,
    so the builds of one batch land together, as two slots finishing in the
    same poll do."""

    def __init__(self, inner: LocalExecutor):
        self.inner, self.slots = inner, inner.slots

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def wait(self, timeout=None):
        out = self.inner.wait(timeout)
        while out and self.inner.in_flight():
            out += self.inner.wait()
        return out


def test_beside_a_full_disk_the_batchs_other_failed_build_is_not_its_commits(tmp_path, monkeypatch):
    """--parallel 2: one slot's build stops on the full disk, the other's fails
    in the same batch. The command stops with 156 and neither build is held
    against its commit (the second most likely failed on the same disk); with
    space again the same command names the culprit."""
    from klbisect import measure  # noqa: PLC0415
    h = make_history(tmp_path / "repo", n_commits=30, merges=0, culprit_index=17, seed=8)
    full = tmp_path / "disk-full"
    full.touch()
    script = tmp_path / "build.py"
    script.write_text(ONE_FULL_ONE_BROKEN_BUILD)
    cfg = BisectConfig(good=h.good, bad=h.bad, probe_cmd=f"{sys.executable} probe.py", parallel=2,
                       build_cmd=f"{sys.executable} {script} {full} {h.good} {h.bad}", build_paths=("*",))
    monkeypatch.setattr(measure, "LOW_SPACE", 1 << 62)    # every disk short of space

    def whole_batches(cfg, slots, measurer, ws):
        return _WholeBatches(LocalExecutor(slots, measurer.measure))

    said: list[str] = []
    with pytest.raises(KlbisectError) as e:
        run_bisect(h.path, cfg, progress=said.append, executor_factory=whole_batches)
    assert e.value.code == 156 and "the disk is full (No space left on device" in e.value.message, e.value.message
    assert (tmp_path / "disk-full.first").exists()
    assert db_query(h.path, "SELECT sha FROM builds WHERE ok=0") == [], said
    assert not any("untestable" in m for m in said), said
    full.unlink()
    res = run_bisect(h.path, cfg, progress=said.append, executor_factory=whole_batches)
    assert res.complete and res.culprit == h.culprit
