"""Whole `git bisect run klbisect probe` sessions, on plain numbers: how
often git's answer is wrong, and how often a wrong one is reported as sure.

Each trial measures the endpoints as ``klbisect start`` does
(``decide.endpoint_step`` without a pool: 6 runs a side, 20 when the sides
overlap), then plays git: the commit nearest the middle of what is left,
runs until ``decide.judge`` gives a verdict with the model ``probe`` uses
(the endpoint fit, refitted with the runs of commits already judged, and
judged against the runs themselves where the sides overlap:
``gitbisect._refined_model``), and on a skip the next nearest. When git is
done (one commit left, or only skipped ones), the answer is weighed as
``klbisect status`` weighs it (``gitbisect.gitbisect_result``): the posterior
of all the runs over git's answer; under ``--confidence`` it is reported
"NOT sure".

Since 2026-12-02 ``probe`` stops git bisect (exit 157, naming ``klbisect
run``) once ``decide.UNDECIDED_LIMIT`` commits stayed undecided at
``--max-runs``, or the session spent ``--max-total-runs``; ``--no-limits``
plays the rule before.

Columns: ``right`` (git named the culprit alone), ``block`` (git's answer is
a block of skipped commits holding the culprit), ``wrong``, and of the
wrong ones how many were reported sure, the failure that matters;
``stopped`` (probe stopped git bisect); ``NOT sure`` (every session whose
answer, if any, is under ``--confidence``); then runs per session,
endpoints included.

    python scripts/gitbisect_sessions.py --trials 100 --commits 1000
"""
from __future__ import annotations

import argparse
import math
import random
import time

from klbisect.decide import (BAD, GOOD, MAX_TOTAL_RUNS, OVERLAP_MAX_RUNS, UNDECIDED, UNDECIDED_LIMIT, VERDICT_LR,
                             Model, endpoint_step, judge, verdict_model)
from klbisect.search import CommitRuns, plan

BASES = (0.0030, 0.0045, 0.0038)
# (name, shift of the second label, log spread, outlier rate): the first as the
# issue's seed case in log-normal form, the rest as scripts/verdict_errors.py
MODELS = (("separated", 2.5, 0.1, 0.0), ("1.5x/0.15", 1.5, 0.15, 0.03), ("1.45x/0.23", 1.45, 0.23, 0.03),
          ("1.35x/0.3", 1.35, 0.3, 0.03))


def refined(runs: dict[int, list[float]], verdicts: dict[int, str], n: int):
    g = [x for i, v in verdicts.items() if v == GOOD for x in runs[i]] + runs[0]
    b = [x for i, v in verdicts.items() if v == BAD for x in runs[i]] + runs[n]
    return verdict_model(g, b)


def session(draw, n: int, culprit: int, max_runs: int, confidence: float, scaled: bool = False,
            limits: bool = True) -> dict:
    g: list[float] = []
    b: list[float] = []
    while True:
        st = endpoint_step(g, b, pooled=False)
        if st.action != "more":
            break
        g += [draw(False) for _ in range(st.more_good)]
        b += [draw(True) for _ in range(st.more_bad)]
    if st.action == "fail":
        return {"outcome": "no signal", "runs": len(g) + len(b), "sure": False}
    runs: dict[int, list[float]] = {0: g, n: b}
    verdicts: dict[int, str] = {}
    lo, hi, skipped = 0, n, set()
    while True:
        left = [i for i in range(lo + 1, hi) if i not in skipped]
        if not left:
            break
        spent = sum(len(x) for x in runs.values())
        if limits and (len(skipped) >= UNDECIDED_LIMIT or spent >= MAX_TOTAL_RUNS):
            # `probe` stops git bisect here (exit 157) and names `klbisect run`
            return {"outcome": "stopped", "runs": spent, "sure": False}
        mid = min(left, key=lambda i: abs(i - (lo + hi) / 2))
        model = refined(runs, verdicts, n)
        xs = runs.setdefault(mid, [])
        while True:
            v = judge(xs, 0, model, max_runs)
            if scaled and v.decision in (GOOD, BAD):
                # what a wrong verdict would move: the commits between it and git's other end
                m = (mid - lo) if v.decision == GOOD else (hi - mid)
                need = max(VERDICT_LR, m / (1 - confidence))
                v = judge(xs, 0, model, max_runs, verdict_lr=need)
            if v.decision != UNDECIDED:
                break
            xs.append(draw(mid >= culprit))
        if v.decision == GOOD:
            lo = mid
        elif v.decision == BAD:
            hi = mid
        else:
            skipped.add(mid)
        if v.decision in (GOOD, BAD):
            verdicts[mid] = v.decision
    block = list(range(lo + 1, hi + 1))
    commits = [CommitRuns(list(runs.get(i, []))) for i in range(n + 1)]
    pl = plan(commits, Model.fit(g, b), confidence)
    mass = float(pl.posterior.p_first_bad[block].sum())
    outcome = "wrong" if culprit not in block else "right" if len(block) == 1 else "block"
    return {"outcome": outcome, "runs": sum(len(x) for x in runs.values()), "sure": mass >= confidence}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--max-runs", type=int, default=OVERLAP_MAX_RUNS)
    ap.add_argument("--confidence", type=float, default=0.99)
    ap.add_argument("--models", default=",".join(m[0] for m in MODELS))
    ap.add_argument("--scaled", action="store_true",
                    help="ablation: a verdict needs 1/(1 - confidence) times the commits a wrong one would move")
    ap.add_argument("--no-limits", action="store_true",
                    help="the rule before 2026-12-02: probe never stops git bisect (no UNDECIDED_LIMIT, no "
                         "--max-total-runs)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print(f"{a.commits} commits, --max-runs {a.max_runs}, --confidence {a.confidence:g}, {a.trials} trials a model")
    print(f"{'model':<12} {'right':>6} {'block':>6} {'wrong':>6} {'wrong, sure':>11} {'stopped':>7} {'NOT sure':>8} "
          f"{'mean runs':>9} {'p95 runs':>8}")
    t0 = time.time()
    for name, shift, sigma, outliers in MODELS:
        if name not in a.models.split(","):
            continue

        def draw(bad: bool) -> float:
            vals = []
            for k, m in enumerate(BASES):
                v = m * (shift if bad and k == 1 else 1.0) * math.exp(rng.gauss(0, sigma))
                if rng.random() < outliers:
                    v *= rng.uniform(3, 10)
                vals.append(v)
            return max(vals)

        out = [session(draw, a.commits, rng.randint(1, a.commits), a.max_runs, a.confidence, a.scaled,
                       not a.no_limits)
               for _ in range(a.trials)]
        count = {k: sum(o["outcome"] == k for o in out) for k in ("right", "block", "wrong", "stopped")}
        wrong_sure = sum(o["outcome"] == "wrong" and o["sure"] for o in out)
        not_sure = sum(not o["sure"] for o in out)
        runs = sorted(o["runs"] for o in out)
        print(f"{name:<12} {count['right']:>6} {count['block']:>6} {count['wrong']:>6} {wrong_sure:>11} {count['stopped']:>7} "
              f"{not_sure:>8} {sum(runs) / len(runs):>9.1f} {runs[int(0.95 * (len(runs) - 1))]:>8}", flush=True)
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
