"""Whole nightly histories, night by night, through the real command.

Each history is a fresh git repository whose committed probe prints three
SGLang-style labels, log-normal (median 0.002, sigma 0.26, the KL test's
overlap model). Two commits land a night; before night ``--regress-night``
one of them multiplies one label's median by ``--factor``; with
``--fix-night`` a later commit puts it back. ``klbisect nightly`` runs once a
night (a real subprocess, the real store), as a cron job would.

Per history it prints the nights' verdicts (B baseline, g good, s suspect,
R regressed, k known, c crashed) and counts what a maintainer would feel:

* ``bisects``: bisect sessions started (each costs dozens of probe runs),
  and in brackets how many judged one label rather than the max;
* ``reported``: nights that reported a culprit anew (regressed), and how
  many of them named the planted commit;
* ``absorbed``: nights whose head carried the regression yet was judged
  good (it then joins the baseline, and the regression hides in it);
* ``runs``: probe runs in all, nightly and bisect;
* ``trend``: nights called regressed by the trend check (``drift``), not
  against the baseline;
* ``wrong``: reported culprits that are not the planted commit (with
  ``--env-night``, when none is planted, every culprit is wrong).

With ``--env-night K`` the machine changes before night K: from then on the
probe runs with ``KL_ENV_SCALE=--env-factor``, which multiplies every label
of every commit (a new driver or wheel). ``E`` marks a night judged
``environment``.

    python scripts/nightly_days.py --histories 6 --nights 14 --seed 0

Run it with ``PYTHONPATH`` pointing at the klbisect tree to measure; the
nights run in the history's own directory with that tree first on their
path (run from a checkout, ``python -m klbisect`` would otherwise import the
checkout's tree, whatever ``PYTHONPATH`` says).
"""
from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import klbisect

TREE = str(Path(klbisect.__file__).resolve().parent.parent)   # the klbisect measured

PROBE = '''import json, math, os, random
spec = json.load(open("kl.json"))
scale = float(os.environ.get("KL_ENV_SCALE", "1"))   # the machine, not the code
rng = random.Random(os.urandom(16))
for label in ("logprobs_match", "prefill_cache_hit", "decode_cache_hit"):
    print(f"[{label}]")
    print(f"avg_kl_div={scale * spec.get(label, 0.002) * math.exp(rng.gauss(0, 0.26)):.6g}")
'''
LETTER = {"baseline": "B", "good": "g", "suspect": "s", "regressed": "R", "known": "k", "crashed": "c",
          "environment": "E"}


def git(root: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "N", "GIT_AUTHOR_EMAIL": "n@example.com",
           "GIT_COMMITTER_NAME": "N", "GIT_COMMITTER_EMAIL": "n@example.com"}
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True, env=env).stdout


def history(root: Path, a: argparse.Namespace, seed: int) -> dict:
    root.mkdir(parents=True)
    git(root, "init", "-q", "-b", "main")
    (root / "probe.py").write_text(PROBE)
    spec = {"prefill_cache_hit": 0.002}
    n = 0

    def commit(subject: str) -> str:
        nonlocal n
        n += 1
        (root / "kl.json").write_text(json.dumps(spec))
        (root / "notes.md").write_text(f"change {n} of history {seed}\n")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", subject)
        return git(root, "rev-parse", "HEAD").strip()

    commit("Add the KL probe (#1)")
    culprit, verdicts, reported, right, absorbed, wrong = None, [], 0, 0, 0, 0
    regressed_now = False
    for night in range(1, a.nights + 1):
        for k in range(2):
            pr = 100 * night + k
            if night == a.regress_night and k == 0:
                spec["prefill_cache_hit"] = 0.002 * a.factor
                culprit, regressed_now = commit(f"Quantize the KV cache (#{pr})"), True
            elif night == a.fix_night and k == 0:
                spec["prefill_cache_hit"] = 0.002
                regressed_now = False
                commit(f"Revert: quantize the KV cache (#{pr})")
            else:
                commit(f"Tidy module {pr} (#{pr})")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [TREE, os.environ.get("PYTHONPATH")])),
               **({"KL_ENV_SCALE": str(a.env_factor)} if a.env_night and night >= a.env_night else {})}
        p = subprocess.run([sys.executable, "-m", "klbisect", "nightly", "--repo", str(root), "--branch", "main",
                            "--probe-cmd", f"{sys.executable} probe.py", "--night", f"d{night:02d}", "--json"],
                           capture_output=True, text=True, timeout=3600, env=env, cwd=root)
        try:
            obj = json.loads(p.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            obj = {"verdict": "error"}
        v = obj.get("verdict", "error")
        verdicts.append(LETTER.get(v, "?"))
        if v == "regressed":
            reported += 1
            right += int(obj.get("culprit") == culprit)
            wrong += int(bool(obj.get("culprit")) and obj.get("culprit") != culprit)
        if regressed_now and v in ("good", "baseline"):
            absorbed += 1
    con = sqlite3.connect(root / ".git" / "klbisect" / "state.db")
    try:
        configs = [json.loads(c or "{}") for (c,) in con.execute("SELECT config FROM sessions WHERE kind='run'")]
        bisects = len(configs)
        on_label = sum(1 for c in configs if c.get("metric"))
        runs = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        trend = sum(1 for (r,) in con.execute("SELECT result FROM sessions WHERE kind='nightly'")
                    if r and json.loads(r).get("drift"))
    finally:
        con.close()
    return {"verdicts": "".join(verdicts), "bisects": bisects, "on_label": on_label, "reported": reported,
            "right": right, "absorbed": absorbed, "runs": runs, "trend": trend, "wrong": wrong}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--histories", type=int, default=6)
    ap.add_argument("--nights", type=int, default=14)
    ap.add_argument("--regress-night", type=int, default=6)
    ap.add_argument("--fix-night", type=int, default=0, help="0: never fixed")
    ap.add_argument("--factor", type=float, default=1.6, help="the moved label's median, times")
    ap.add_argument("--env-night", type=int, default=0, help="the machine changes before this night (0: never)")
    ap.add_argument("--env-factor", type=float, default=1.6, help="every label of every commit, times")
    ap.add_argument("--seed", type=int, default=0, help="names the histories (the probe's noise is fresh)")
    a = ap.parse_args()
    t0 = time.time()
    totals = {"bisects": 0, "on_label": 0, "reported": 0, "right": 0, "absorbed": 0, "runs": 0, "trend": 0,
              "wrong": 0}
    print(f"{a.histories} histories of {a.nights} nights; one label of three x{a.factor:g} before night "
          f"{a.regress_night}" + (f", fixed before night {a.fix_night}" if a.fix_night else ", never fixed")
          + (f"; every value x{a.env_factor:g} from night {a.env_night} (the machine)" if a.env_night else "")
          + f"; klbisect from {TREE}")
    print(f"{'history':>7}  {'verdicts':<{a.nights}}  bisects (label)  reported (right)  absorbed  runs  trend  wrong")
    with tempfile.TemporaryDirectory() as tmp:
        for h in range(a.histories):
            r = history(Path(tmp) / f"h{h}", a, a.seed + h)
            for k in totals:
                totals[k] += r[k]
            print(f"{h:>7}  {r['verdicts']:<{a.nights}}  {r['bisects']:>7} ({r['on_label']})  {r['reported']:>9} ({r['right']})"
                  f"  {r['absorbed']:>8}  {r['runs']:>4}  {r['trend']:>5}  {r['wrong']:>5}", flush=True)
    print(f"{'all':>7}  {'':<{a.nights}}  {totals['bisects']:>7} ({totals['on_label']})  {totals['reported']:>9} ({totals['right']})"
          f"  {totals['absorbed']:>8}  {totals['runs']:>4}  {totals['trend']:>5}  {totals['wrong']:>5}")
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
