#!/usr/bin/env python3
"""What `klbisect calibrate --bad-rev`'s bisect cost is worth: its estimate
from R measured runs a side, against what bisects drawing fresh runs from
the true distributions spend.

For each noise model, S times: draw R good and R bad runs (crashes at the
model's rate), estimate the cost as calibrate does (``simulate_cost``: 40
replays of the search on values drawn like the measured ones, through a
kernel of Silverman's width where they overlap, its spread the smaller of
the standard deviation and the interquartile range's, with their crash
rate) and as it did before (``--before plain``: the plain standard
deviation's width; ``--before measured``: the measured values themselves,
no crashes, as before 2026-12-05). The truth: T simulated bisects on fresh
draws from the model. Every bisect is over N commits; runs are counted as
a session counts them.

    python scripts/cost_estimate.py --samples 6 --runs 100 --jobs 2 [--before plain]
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from klbisect.calibrate import simulate_cost  # noqa: E402
from klbisect.simulate import simulate_bisect  # noqa: E402


def _lognormal(median: float, sigma: float):
    return lambda rng: median * float(np.exp(sigma * rng.standard_normal()))


def _seed_good(rng) -> float:
    return float(rng.uniform(0.003, 0.006, 3).max())


def _seed_bad(rng) -> float:
    return max(float(rng.uniform(0.003, 0.006, 2).max()), float(rng.uniform(0.007, 0.013)))


def _spiky(median: float, sigma: float, rate: float, lo: float, hi: float):
    base = _lognormal(median, sigma)
    return lambda rng: base(rng) * (float(rng.uniform(lo, hi)) if rng.random() < rate else 1.0)


# name: (good draw, bad draw, crash rate, what it is)
MODELS = {
    "overlap": (_lognormal(0.0045, 0.3), _lognormal(0.0075, 0.3), 0.05,
                "a tester's: log-normal sigma 0.3, x1.67, 5% crashes"),
    "overlap-small": (_lognormal(0.002, 0.26), _lognormal(0.0025, 0.26), 0.0,
                      "issue 3's (b): log-normal sigma 0.26, x1.25"),
    "seed": (_seed_good, _seed_bad, 0.0, "issue 3's (a): one of three labels U(.003,.006) -> U(.007,.013), max"),
    "outliers": (_spiky(0.004, 0.45, 0.05, 3, 8), _spiky(0.0064, 0.45, 0.05, 3, 8), 0.15,
                 "a tester's: log-normal sigma 0.45, x1.6, 5% outliers x3-8, 15% crashes"),
}


def _draws(draw, crash: float, n: int, rng) -> tuple[list[float], int]:
    vals, crashes = [], 0
    while len(vals) < n:
        if rng.random() < crash:
            crashes += 1
        else:
            vals.append(draw(rng))
    return vals, crashes


def estimate(args: tuple) -> tuple[str, float, float, float, float]:
    """(model, new mean, new p95, old mean, old p95) from one sample of runs."""
    name, seed, runs, commits, before = args
    good, bad, crash, _ = MODELS[name]
    rng = np.random.default_rng(seed)
    g, cg = _draws(good, crash, runs, rng)
    b, cb = _draws(bad, crash, runs, rng)
    crash_rate = (cg + cb) / (cg + cb + 2 * runs)
    new = simulate_cost(g, b, commits, crash_rate=crash_rate)
    old = (simulate_cost(g, b, commits, crash_rate=crash_rate, robust=False) if before == "plain"
           else simulate_cost(g, b, commits, smooth=False))
    if new is None or old is None:
        return name, float("nan"), float("nan"), float("nan"), float("nan")
    return (name, new.simulated_mean_runs, new.simulated_p95_runs, old.simulated_mean_runs,
            old.simulated_p95_runs)


def truth(args: tuple) -> tuple[str, int]:
    name, seed, commits = args
    good, bad, crash, _ = MODELS[name]
    rng = np.random.default_rng(seed)
    culprit = int(rng.integers(1, commits + 1))

    def probe(i: int) -> float | None:
        if rng.random() < crash:
            return None
        return bad(rng) if i >= culprit else good(rng)
    return name, simulate_bisect(commits, probe)[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--samples", type=int, default=6, help="samples of measured runs per model (S)")
    ap.add_argument("--runs", type=int, default=100, help="measured runs a side per sample (R)")
    ap.add_argument("--true-trials", type=int, default=200, help="bisects on fresh draws per model (T)")
    ap.add_argument("--commits", type=int, default=40, help="commits in each bisect (N)")
    ap.add_argument("--before", choices=("plain", "measured"), default="plain",
                    help="the estimate to compare with: the plain standard deviation's kernel width, or the "
                         "measured values themselves with no crashes")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    t0 = time.time()
    names = a.models.split(",")
    with mp.Pool(a.jobs) as pool:
        est = pool.map(estimate, [(m, 1000 + s, a.runs, a.commits, a.before)
                                  for m in names for s in range(a.samples)])
        tru = pool.map(truth, [(m, 50000 + t, a.commits) for m in names for t in range(a.true_trials)])
    print(f"command: python scripts/cost_estimate.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"{'model':<14} {'true mean':>9} {'true p95':>8}  {'estimate (now)':>22}  {'estimate (' + a.before + ')':>22}  "
          f"{'true runs under p95 (now / before)':>34}")
    for m in names:
        t = np.array([n for k, n in tru if k == m])
        rows = np.array([r[1:] for r in est if r[0] == m])
        under = [float(np.mean(t <= p)) for p in (np.nanmean(rows[:, 1]), np.nanmean(rows[:, 3]))]
        fmt = lambda mean, p95: f"{np.nanmean(mean):6.1f} (p95 {np.nanmean(p95):5.1f})"  # noqa: E731
        print(f"{m:<14} {t.mean():9.1f} {np.percentile(t, 95):8.1f}  {fmt(rows[:, 0], rows[:, 1]):>22}  "
              f"{fmt(rows[:, 2], rows[:, 3]):>22}  {under[0]:>17.0%} / {under[1]:.0%}")
    for m in names:
        print(f"  {m}: {MODELS[m][3]}")
    print(f"({a.samples} samples of {a.runs} runs a side, {a.true_trials} true bisects, N={a.commits}; "
          f"{time.time() - t0:.0f} s, {a.jobs} worker(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
