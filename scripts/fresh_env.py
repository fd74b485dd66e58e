#!/usr/bin/env python3
"""A bisect after the environment changed: ``klbisect run`` reusing the old
environment's runs, against ``klbisect run --fresh``.

Each trial generates a history (the seed noise model, three labels) and
runs a first bisect over ``good..main~5`` in the old environment (at most
400 runs), then bisects ``good..main`` in the new one twice, from copies of
the same state: once as is (the first session's runs are reused) and once
with ``--fresh``.
The environment is ``histgen.DRIVER_PROBE``, a wrapper around the generated
probe. ``--case shift``: the new one moves every value of every commit by
``--scale`` (a new driver or wheel). ``--case appears``: the old one never
shows the regression (its bad values fall in the good range: a kernel path
only the new GPU takes), so the first bisect finds nothing. Everything is
the real command, in subprocesses, on real repositories; runs are the new
session's own.

``--flow git`` does each bisect as ``klbisect start`` and ``git bisect run
klbisect probe`` instead (the answer: ``status``'s culprit after git
finished; a probe's 154 or 157 aborts git and names none).

    python scripts/fresh_env.py --case shift --trials 10 --scale 1.6
    python scripts/fresh_env.py --case appears --trials 10
    python scripts/fresh_env.py --case shift --flow git --trials 10
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from klbisect.histgen import make_history, write_driver_probe  # noqa: E402

def _env(env: dict) -> dict:
    return {**os.environ, **env,
            "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}


def klbisect(repo: Path, *args: str, env: dict) -> dict:
    p = subprocess.run([sys.executable, "-m", "klbisect", *args, "--json"], cwd=repo, env=_env(env),
                       capture_output=True, text=True)
    try:
        out = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        out = {"culprit": None, "probe_runs": 0}
    out["exit"] = p.returncode
    return out


def bisect(repo: Path, good: str, bad: str, cmd: str, extra: tuple, env: dict, flow: str) -> dict:
    """One bisect, the way ``flow`` says: ``run``, or ``start`` then ``git bisect run klbisect probe``
    (klbisect as ``python -m klbisect``, this tree's). Returns its exit and the culprit it named."""
    if flow == "run":
        res = klbisect(repo, "run", "--good", good, "--bad", bad, "--probe-cmd", cmd, *extra, env=env)
        return {"exit": res["exit"], "named": res.get("culprit") if res["exit"] == 0 else None}
    def klb(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "klbisect", *args], cwd=repo, env=_env(env),
                              capture_output=True, text=True, **kw)

    try:
        st = klb("start", "--good", good, "--bad", bad, "--probe-cmd", cmd, *extra)
        if st.returncode != 0:
            return {"exit": st.returncode, "named": None}
        gb = subprocess.run(["git", "bisect", "run", sys.executable, "-m", "klbisect", "probe"], cwd=repo,
                            env=_env(env), capture_output=True, text=True)
        if gb.returncode != 0:     # git aborts on a probe's 128+ exit and names it
            m = re.search(r"exit code (\d+)", gb.stdout + gb.stderr)
            return {"exit": int(m.group(1)) if m else gb.returncode, "named": None}
        res = json.loads(klb("status", "--json").stdout)
        return {"exit": 0, "named": res.get("culprit") if res.get("complete") else None}
    finally:   # a start that stopped stays to be resumed, and a finished git bisect stays open: reset both
        klb("reset")


def explain(repo: Path, shas: list[str], culprit: int, named: str) -> str:
    """Where a wrong answer came from: each commit the last session saw,
    with the earlier sessions' runs and its own."""
    at = {s: i for i, s in enumerate(shas)}
    with sqlite3.connect(repo / ".git" / "klbisect" / "state.db") as db:
        last = db.execute("SELECT MAX(id) FROM sessions").fetchone()[0]
        rows = db.execute("SELECT sha, session_id, value FROM runs ORDER BY id").fetchall()
    seen: dict[int, tuple[list, list]] = {}
    for sha, sid, v in rows:
        if sha in at and v is not None:
            seen.setdefault(at[sha], ([], []))[sid == last].append(v)
    parts = [f"{i}: {len(e)} earlier" + (f" {min(e):.4f}-{max(e):.4f}" if e else "")
             + (f", now {' '.join(f'{v:.4f}' for v in n)}" if n else "")
             for i, (e, n) in sorted(seen.items())]
    return f"named {at[named]}, culprit {culprit}; " + "; ".join(parts)


def trial(args: tuple) -> dict:
    seed, commits, case, scale, work, keep, flow = args
    base = work / f"h{seed}"
    h = make_history(base / "repo", n_commits=commits, seed=seed, culprit_index=commits // 3 + seed % (commits // 3))
    cmd = write_driver_probe(base / "driver_probe.py")
    old_bad = h.shas[-6]
    old_env, new_env = (({}, {"KL_DRIVER_SCALE": str(scale)}) if case == "shift" else
                        ({"KL_DRIVER_HIDE": "1"}, {"KL_DRIVER_SCALE": str(scale)}))
    # capped as scripts/null_range.py is: in `appears` the old range holds no regression, and a
    # search that starts on a chance hint there can run to the default 2,000 (docs/statistics.rst)
    # a culprit under exit 157 (the cap) is the most likely commit, not an answer
    first = bisect(h.path, h.good, old_bad, cmd, ("--max-total-runs", "400"), old_env, flow)
    named = first["named"]
    out = {"first": "right" if named == h.culprit else f"exit {first['exit']}" if named is None else "WRONG"}
    for how, extra in (("reused", ()), ("fresh", ("--fresh",))):
        repo = base / how
        shutil.copytree(h.path, repo, symlinks=True)
        res = bisect(repo, h.good, h.bad, cmd, extra, new_env, flow)
        with sqlite3.connect(repo / ".git" / "klbisect" / "state.db") as db:
            runs = db.execute("SELECT COUNT(*) FROM runs WHERE session_id=(SELECT MAX(id) FROM sessions)").fetchone()[0]
        named = res["named"]
        out[how] = {"right": named == h.culprit, "named": named is not None,
                    "runs": runs, "exit": res["exit"]}
        if named and named != h.culprit:
            out[how]["why"] = explain(repo, h.shas, h.culprit_index, named)
    if keep and any(out[k]["named"] and not out[k]["right"] for k in ("reused", "fresh")):
        shutil.copytree(base, keep / f"h{seed}", symlinks=True, dirs_exist_ok=True)
    shutil.rmtree(base, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--case", choices=("shift", "appears"), default="shift")
    ap.add_argument("--scale", type=float, default=None,
                    help="every value of the new environment, times this [default: 1.6 with shift, 1 with appears]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--flow", choices=("run", "git"), default="run",
                    help="klbisect run, or klbisect start and git bisect run klbisect probe")
    ap.add_argument("--keep-wrong", type=Path, default=None, metavar="DIR",
                    help="copy the repositories of trials that named a wrong commit here, to read their state")
    a = ap.parse_args(argv)
    scale = a.scale if a.scale is not None else 1.6 if a.case == "shift" else 1.0
    t0 = time.time()
    print(f"command: python scripts/fresh_env.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, mp.Pool(a.jobs) as pool:
        jobs = [(a.seed + i, a.commits, a.case, scale, Path(tmp), a.keep_wrong, a.flow) for i in range(a.trials)]
        for i, r in enumerate(pool.imap(trial, jobs)):
            rows.append(r)
            print(f"  trial {i}: first bisect {r['first']}; "
                  + "; ".join(f"{k}: {'right' if r[k]['right'] else 'named WRONG' if r[k]['named'] else 'no answer'} "
                              f"exit {r[k]['exit']}, {r[k]['runs']} runs" for k in ("reused", "fresh")), flush=True)
            for k in ("reused", "fresh"):
                if "why" in r[k]:
                    print(f"    {k}: {r[k]['why']}", flush=True)
    for k in ("reused", "fresh"):
        runs = np.array([r[k]["runs"] for r in rows])
        right = sum(r[k]["right"] for r in rows)
        wrong = sum(r[k]["named"] and not r[k]["right"] for r in rows)
        print(f"{k:>7}: {right}/{len(rows)} right, {wrong} named a wrong commit; new runs mean {runs.mean():.1f}, "
              f"max {runs.max()}")
    old = "as generated" if a.case == "shift" else "the regression hidden"
    print(f"({time.time() - t0:.0f} s, {a.jobs} worker(s); N = {a.commits}; old environment {old}, new one every value x{scale:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
