"""A probe's processes never outlive it: after a normal exit, on timeout,
and when they detached themselves with setsid or a double fork."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import psutil

from klbisect.proc import reap_stale, run_logged


def _alive(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if tag in " ".join(cmd) and p.status() != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


def _sleeper(tag: str) -> str:
    # a sleep whose command line carries a unique tag we can look for
    return f"{sys.executable} -c 'import time; time.sleep(300)' {tag}"


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
    time.sleep(0.3)
    assert _alive(tag) == []


def test_timeout_kills_the_whole_group(tmp_path):
    tag = uuid.uuid4().hex
    res = run_logged(f"{_sleeper(tag)} & {_sleeper(tag)}", tmp_path, tmp_path / "run.log", timeout=1.0)
    assert res.timed_out and res.exit_code is None
    assert _alive(tag) == []


def test_groups_of_a_killed_klbisect_are_reaped(tmp_path):
    """The pid file a SIGKILLed klbisect leaves lets the next command reap."""
    tag = uuid.uuid4().hex
    orphan = subprocess.Popen(["sh", "-c", _sleeper(tag)], start_new_session=True)
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    pids = tmp_path / "pids"
    pids.mkdir()
    (pids / f"{orphan.pid}.pid").write_text(f"{dead_owner.pid} {orphan.pid}\n")
    assert _alive(tag)
    assert reap_stale(pids) == [orphan.pid]
    orphan.wait(timeout=10)
    assert _alive(tag) == []
    assert not list(pids.iterdir())


def test_a_live_owners_groups_are_left_alone(tmp_path):
    tag = uuid.uuid4().hex
    child = subprocess.Popen(["sh", "-c", _sleeper(tag)], start_new_session=True)
    try:
        pids = tmp_path / "pids"
        pids.mkdir()
        (pids / f"{child.pid}.pid").write_text(f"{os.getpid()} {child.pid}\n")
        assert reap_stale(pids) == []
        assert _alive(tag)
    finally:
        child.kill()
        child.wait()


def test_klbisect_status_reaps_what_a_killed_klbisect_left(tmp_path):
    """Not only `run`: any command, `status` included, opens the workspace
    and reaps first (here `status` then exits 150: there is no session)."""
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    tag = uuid.uuid4().hex
    orphan = subprocess.Popen(["sh", "-c", _sleeper(tag)], start_new_session=True)
    dead_owner = subprocess.Popen(["true"])
    dead_owner.wait()
    pids = repo / ".git" / "klbisect" / "pids"
    pids.mkdir(parents=True)
    (pids / f"{orphan.pid}.pid").write_text(f"{dead_owner.pid} {orphan.pid}\n")
    assert _alive(tag)
    p = subprocess.run([sys.executable, "-m", "klbisect", "status", "--repo", str(repo)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 150, p.stderr
    orphan.wait(timeout=10)
    assert _alive(tag) == []
