"""klbisect's own time beside its probe's, on a long history and a big run store.

A nightly job that keeps one probe command for a year stores tens of
thousands of runs, and every search step reads the runs of its range. This
makes a history with ``klbisect.histgen`` (its probe takes ~0.1 s), bisects
it once, pads the store with copies of those runs (same probe, same
commits), then times what a user runs next: a new ``klbisect run`` of a
narrower range (it reuses the stored runs), ``status``, ``log`` and
``report``. Overhead is wall time less the probe runs' own time.

    python scripts/store_overhead.py --commits 10000 --pad 20000
"""
from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def klb(repo: Path, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "klbisect", *args], cwd=repo, capture_output=True, text=True)
    return time.monotonic() - t, p


def probe_seconds(db: Path, session: int) -> tuple[int, float]:
    with sqlite3.connect(db) as c:
        n, s = c.execute("SELECT COUNT(*), COALESCE(SUM(duration), 0) FROM runs WHERE session_id=?",
                         (session,)).fetchone()
    return n, s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=10000)
    ap.add_argument("--pad", type=int, default=20000, help="runs in the store after padding")
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    repo = Path(tempfile.mkdtemp(prefix="klb-store-")) / "repo"
    answer = repo.parent / "answer.json"
    subprocess.run([sys.executable, "-m", "klbisect.histgen", str(repo), "--commits", str(a.commits),
                    "--seed", str(a.seed), "--answer", str(answer)], check=True, capture_output=True)
    truth = json.loads(answer.read_text())
    shas = subprocess.run(["git", "rev-list", "--first-parent", "--reverse", "HEAD"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.split()
    probe = ["--probe-cmd", "python probe.py"]
    rows = []

    def row(what: str, wall: float, p: subprocess.CompletedProcess, session: int | None = None) -> None:
        n, s = probe_seconds(db, session) if session else (0, 0.0)
        ok = "ok" if p.returncode == 0 else f"exit {p.returncode}"
        rows.append((what, n, wall, s, wall - s, ok))

    wall, p = klb(repo, "run", "--good", shas[0], "--bad", "HEAD", *probe, "--json")
    db = repo / ".git" / "klbisect" / "state.db"
    first = json.loads(p.stdout.strip().splitlines()[-1])
    assert first["culprit"] == truth["culprit"], p.stderr
    row(f"run, {a.commits:,} commits, empty store", wall, p, first["session"])
    with sqlite3.connect(db) as c:
        have = c.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        cols = "session_id, probe_key, sha, started, duration, exit_code, status, vals, value, log_path, slot"
        while have < a.pad:
            c.execute(f"INSERT INTO runs ({cols}) SELECT {cols} FROM runs LIMIT ?", (a.pad - have,))
            have = c.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    for cmd in (("status",), ("log",), ("report", "--offline", "-o", str(repo.parent / "r.html"))):
        wall, p = klb(repo, *cmd)
        row(f"{' '.join(cmd[:2])}, {have:,} runs stored", wall, p)
    # a narrower range: a new session that reuses the stored runs of its commits
    lo = max(0, truth["culprit_index"] - a.commits // 4)
    wall, p = klb(repo, "run", "--good", shas[lo], "--bad", "HEAD", *probe, "--json")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    row(f"new run reusing them ({a.commits - lo:,} commits)", wall, p, res["session"])
    print(f"command: python scripts/store_overhead.py --commits {a.commits} --pad {a.pad} --seed {a.seed}")
    print(f"{'what':<44} {'runs':>5} {'wall s':>7} {'probe s':>8} {'overhead s':>11}")
    for what, n, wall, s, over, ok in rows:
        print(f"{what:<44} {n:>5} {wall:>7.2f} {s:>8.2f} {over:>11.2f}  {ok}")


if __name__ == "__main__":
    main()
