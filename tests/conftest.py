"""Shared fixtures: generated repositories and the real CLI in a subprocess.

Every end-to-end test runs ``python -m klbisect`` (or the console script for
``git bisect run``) as a separate process on a repository that
``klbisect.histgen.make_history`` generated in ``tmp_path``, so what is tested
is what a user gets.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from klbisect.histgen import NoiseModel, _git_env, make_history, write_driver_probe

PY = sys.executable
BIN = str(Path(sys.executable).parent)

# A shell without job control starts `pytest &` with SIGINT ignored, and
# every klbisect it starts would inherit that: the Ctrl-C tests would then
# test the shell, not klbisect. Python's own handler here means exec'd
# children get the default disposition back.
signal.signal(signal.SIGINT, signal.default_int_handler)
HEX40 = re.compile(r"^[0-9a-f]{40}$")

# Good and bad never overlap: every run is conclusive. Used where a test is
# about plumbing, not statistics, so the answer is certain.
SEPARATED = NoiseModel(good=(0.003, 0.004), bad=(0.012, 0.014))

# the first lines of a wrapper probe, run in a generated history's checkout, that draws with
# `random`: the nth run of a commit in a test (``nth``, from 0) seeds `random` as the history's
# probe.py seeds its own draws under KVSERVE_PROBE_DRAWS (same_draws), counted apart from them
SAME_DRAWS = """import os as _os, random as _random, sys as _sys
nth = 0
if _os.environ.get("KVSERVE_PROBE_DRAWS"):
    _sys.path.insert(0, _os.getcwd())
    from probe import _draws_of_this_commit
    _draw = _draws_of_this_commit(_os.path.join(_os.environ["KVSERVE_PROBE_DRAWS"], "wrapper"))
    nth = int(_draw.rsplit(":", 1)[1]) - 1
    _random.seed(f"wrapper:{_draw}")
"""

# the first lines of a wrapper over the driver probe.py (its output in ``out``): ``bad`` says
# which side of the regression the commit is on
OVER_DRIVER = SAME_DRAWS + r"""import pathlib, random, subprocess, sys
out = subprocess.run([sys.executable, "probe.py"], capture_output=True, text=True).stdout
bad = max(float(line.split("=")[1]) for line in out.splitlines() if line.startswith("avg_kl_div=")) >= 0.01
"""

# a probe over the driver probe.py: two labels that never move set every run's max, and the
# one that moved a little at the regression never reaches it
HIDDEN_LABEL_PROBE = OVER_DRIVER + r"""# two labels that never move set every run's max; the one that moved, a little, never reaches it
for label, high in (("long_ctx", 0.02), ("decode", 0.019)):
    print(f"[{label}]\navg_kl_div={high}")
print(f"[steady]\navg_kl_div={random.uniform(0.0047, 0.0052) if bad else random.uniform(0.0040, 0.0045):.6f}")
"""


@pytest.fixture(autouse=True)
def same_draws(tmp_path_factory, monkeypatch):
    """The nth run of a commit by a test's simulated probe draws the same
    numbers on every test run: a statistical test that fails, fails again
    (CI once drew p=0.039 where nothing had moved). Module-scoped fixtures
    start before this one and draw afresh."""
    monkeypatch.setenv("KVSERVE_PROBE_DRAWS", str(tmp_path_factory.mktemp("draws")))


def child_env(extra: dict | None = None) -> dict:
    """The environment of every child: no git redirection, this interpreter
    first on PATH (so ``python`` in a probe command and the ``klbisect``
    console script belong to the tested installation)."""
    env = _git_env()
    env.pop("KLBISECT_DEBUG", None)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.setdefault("GIT_AUTHOR_NAME", "Test")
    env.setdefault("GIT_AUTHOR_EMAIL", "test@example.com")
    env.setdefault("GIT_COMMITTER_NAME", "Test")
    env.setdefault("GIT_COMMITTER_EMAIL", "test@example.com")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if extra:
        env.update(extra)
    return env


def klb(*args, cwd, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m klbisect ARGS`` and capture its output."""
    return subprocess.run([PY, "-m", "klbisect", *map(str, args)], cwd=str(cwd), env=child_env(env),
                          capture_output=True, text=True, timeout=timeout)


def klb_popen(*args, cwd, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([PY, "-m", "klbisect", *map(str, args)], cwd=str(cwd), env=child_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def reaped(proc: subprocess.Popen):
    """A klbisect started in the background, killed if the test leaves it running."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def interrupted(*args, cwd, env: dict | None = None, after: int, where: str = "1") -> tuple[subprocess.Popen, str]:
    """`klbisect ARGS` in the background, Ctrl-C'd once the store holds
    ``after`` runs (of any session, or those matching the SQL ``where``):
    the process, ended, and its stderr."""
    with reaped(klb_popen(*args, cwd=cwd, env=env)) as proc:
        deadline = time.monotonic() + 120
        while len(db_query(cwd, f"SELECT id FROM runs WHERE {where}")) < after:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    return proc, err


def calibrate_wrapped(h, tmp_path: Path, source: str, runs: int) -> subprocess.CompletedProcess:
    """`klbisect calibrate --json` of ``h``'s good commit with a probe written
    from ``source``, given a counter file (``tmp_path / "n"``) to shape its runs."""
    probe = tmp_path / "wrapped_probe.py"
    probe.write_text(source)
    p = klb("calibrate", "--rev", h.good, "--runs", str(runs), "--probe-cmd", f"{PY} {probe} {tmp_path / 'n'}",
            "--json", cwd=h.path)
    assert p.returncode == 0, p.stderr
    return p


@contextlib.contextmanager
def fake_github(status: int = 201, body: bytes = b'{"html_url": "https://github.com/acme/kv/issues/7#c1"}',
                delay: float = 0.0, headers: dict | None = None, routes: dict | None = None):
    """A GitHub API (or any small HTTP API) on loopback that answers every
    request with ``status``, ``headers`` and ``body`` after ``delay``
    seconds, or a path in ``routes`` with its own ``(status, body)``;
    yields its URL and the request bodies it received, in order."""
    import threading  # noqa: PLC0415
    from http.server import BaseHTTPRequestHandler, HTTPServer  # noqa: PLC0415
    got: list[bytes] = []

    class Api(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            got.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            time.sleep(delay)
            code, out = (routes or {}).get(self.path, (status, body))
            self.send_response(code)
            self.send_header("Content-Length", str(len(out)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(out)

        do_GET = do_POST  # noqa: N815

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", got
    finally:
        srv.shutdown()
        srv.server_close()


def git(cwd, *args, check: bool = True) -> str:
    p = subprocess.run(["git", *args], cwd=str(cwd), env=child_env(), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p.stdout


def klbisect_script() -> list[str]:
    """How `git bisect run` calls klbisect: the console script when installed."""
    exe = shutil.which("klbisect", path=child_env()["PATH"])
    return [exe] if exe else [PY, "-m", "klbisect"]


def json_tail(stdout: str) -> dict:
    """The one JSON object stdout must end with."""
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert lines, "stdout is empty"
    obj = json.loads(lines[-1])
    assert isinstance(obj, dict)
    return obj


def error_line(proc: subprocess.CompletedProcess, code: int) -> str:
    """Assert a clean failure: the documented code, exactly one
    'klbisect: error:' line on stderr, no traceback anywhere."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}, expected {code}\n{out}"
    assert "Traceback" not in out, out
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("klbisect: error:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def state_dir(repo) -> Path:
    common = git(repo, "rev-parse", "--git-common-dir").strip()
    return (Path(repo) / common).resolve() / "klbisect"


def log_file(repo, row) -> Path:
    """A run's or build's log, from its row as stored (relative to the state
    directory, or absolute when it lies elsewhere)."""
    return state_dir(repo) / row["log_path"]


def db_query(repo, sql: str, args: tuple = ()) -> list[sqlite3.Row]:
    db = state_dir(repo) / "state.db"
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    con.row_factory = sqlite3.Row
    try:
        return con.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def processes_with(token: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``token``."""
    found = []
    me = os.getpid()
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(token in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            continue
    return found


def wait_gone(token: str, deadline: float = 15.0) -> list[psutil.Process]:
    """Processes still alive after a grace period (kill_tree waits a few
    seconds before SIGKILL; this is not a timing assertion)."""
    end = time.monotonic() + deadline
    while True:
        left = processes_with(token)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.2)


def user_state(repo) -> dict:
    """Everything `run` must not touch in the user's checkout."""
    return {
        "head": git(repo, "rev-parse", "HEAD"),
        "symbolic": git(repo, "symbolic-ref", "-q", "HEAD", check=False),
        "porcelain": git(repo, "status", "--porcelain", "--untracked-files=all"),
        "staged": git(repo, "diff", "--cached"),
        "unstaged": git(repo, "diff"),
        "index": git(repo, "ls-files", "-s"),
        "stash": git(repo, "stash", "list"),
    }


@pytest.fixture
def history(tmp_path):
    """Factory: ``history(n_commits=..., seed=..., ...)`` -> histgen.History
    in a fresh directory under tmp_path."""
    count = [0]

    def make(**kw):
        count[0] += 1
        kw.setdefault("n_commits", 100)
        kw.setdefault("merges", 5)
        return make_history(tmp_path / f"repo{count[0]}", **kw)

    return make


@pytest.fixture
def driver_probe(tmp_path) -> str:
    """A --probe-cmd for a generated history whose values KL_DRIVER_SCALE moves."""
    return write_driver_probe(tmp_path / "driver_probe.py")


def probe_cmd(extra: str = "") -> str:
    """The generated repository's probe, run by this interpreter."""
    return f"{PY} probe.py {extra}".strip()


def build_cmd(marker: Path) -> str:
    """The generated repository's build, logging each invocation to ``marker``."""
    return f"echo built >> {marker} && {PY} build.py"


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs holding a one-commit repository ``r`` with a file of
    ``size`` bytes, filled but for ``free_kb``: a real full file system
    (skipped where mounting is not allowed)."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")

    def make(size: int, free_kb: int) -> Path:
        repo = small / "r"
        git(tmp_path, "init", "-q", str(repo))
        (repo / "a.txt").write_text("b" * size)
        git(repo, "add", "a.txt")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
        count = shutil.disk_usage(small).free // 1024 - free_kb
        subprocess.run(["dd", "if=/dev/zero", f"of={small / 'fill'}", "bs=1k", f"count={count}"],
                       capture_output=True)
        return repo
    try:
        yield make
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


# ---- the end of a run that started Ray in this process ---------------------------------------------

_SESSION_STATUS: dict[str, int] = {}


def pytest_sessionfinish(session, exitstatus):
    _SESSION_STATUS["status"] = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """After Ray has been started and shut down in this process (the Ray
    executor's tests), its native threads can crash the interpreter's own
    finalization (ray-project/ray#31145): CI once saw "684 passed", then a
    segfault and exit 139. The verdict is pytest's, printed by now; leave
    with it before finalization runs."""
    if "ray" in sys.modules and "status" in _SESSION_STATUS:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_SESSION_STATUS["status"])
