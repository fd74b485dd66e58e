#!/usr/bin/env python3
"""A new user's held-out shapes through klbisect.simulate.simulate_bisect (what
bench_bisect's klbisect strategy runs): history lengths of 100 and 10,000, one of
several correlated labels moving, accuracy going down, large but rare outliers on
bad commits, zeros and four-decimal prints, nan on bad commits.

    python scripts/newuser_shapes.py --shapes a,b --trials 100 --commits 1000 --seed 1 --jobs 2

Written by an eleventh tester (2026-12-07); its table is in docs/benchmarks.rst,
"A new user's shapes at N = 100 and 10,000". ``--place edge`` puts the culprit
next to an endpoint; ``--dump F`` pickles the runs of the trials that missed.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from klbisect.simulate import simulate_bisect
from klbisect.metric import NONFINITE

from heldout_models import print_tally   # scripts/ is on the path when run as a script


def ln(r, med, s):
    return med * math.exp(s * r.standard_normal())


def multi_corr(r, bad, meds, moved, factor, s_run=0.15, s_own=0.10, worse="higher"):
    """several labels sharing a per-run factor; only label `moved` changes."""
    shared = s_run * r.standard_normal()
    vals = []
    for k, m in enumerate(meds):
        f = factor if (bad and k == moved) else 1.0
        vals.append(m * f * math.exp(shared + s_own * r.standard_normal()))
    return max(vals) if worse == "higher" else min(vals)


def acc_labels(r, bad, ps, ns, moved, drop):
    """accuracies k/n per label (binomial, plus a shared run effect on p); min over labels."""
    shared = 0.01 * r.standard_normal()
    out = []
    for k, (p, n) in enumerate(zip(ps, ns)):
        pp = min(max(p + shared - (drop if (bad and k == moved) else 0.0), 0.0), 1.0)
        out.append(r.binomial(n, pp) / n)
    return min(out)


def zeros(r, bad, pz_good, pz_bad, med_g, med_b, s):
    pz = pz_bad if bad else pz_good
    if r.random() < pz:
        return 0.0
    return ln(r, med_b if bad else med_g, s)


def printed(v, fmt):
    return float(fmt % v)


SHAPES = {
    # (a) history lengths
    "ln30": ("log-normal .004 sigma .2, x1.3", lambda r, bad: ln(r, 0.004 * (1.3 if bad else 1), 0.2)),
    "ln-wide": ("log-normal .004 sigma .4, x1.5 (overlapping)", lambda r, bad: ln(r, 0.004 * (1.5 if bad else 1), 0.4)),
    # (b) one of several labels, correlated within a run
    "lab4-top": ("4 labels .004/.0035/.003/.0025, shared run factor e^.15Z + own e^.1Z; label0 (the top) x1.4; max",
                 lambda r, bad: multi_corr(r, bad, (0.004, 0.0035, 0.003, 0.0025), 0, 1.4)),
    "lab4-low": ("as lab4-top, but the LOWEST label .0025 moves x1.5 (.00375, still under label0 mostly); max",
                 lambda r, bad: multi_corr(r, bad, (0.004, 0.0035, 0.003, 0.0025), 3, 1.5)),
    "lab8-low": ("8 labels .004..0.002 evenly; the lowest x1.8 (.0036); shared e^.2Z own e^.1Z; max",
                 lambda r, bad: multi_corr(r, bad, tuple(np.linspace(0.004, 0.002, 8)), 7, 1.8, 0.2, 0.1)),
    "lab4-low-m": ("lab4-low bisected with --metric on the moved label",
                   lambda r, bad: ln(r, 0.0025 * (1.5 if bad else 1), math.hypot(0.15, 0.1))),
    # (c) lower is worse
    "acc-gsm": ("accuracy: 3 labels k/n, n=1319,500,200 at p .78,.62,.85, shared run sd .01; label0 drops .02; min",
                lambda r, bad: acc_labels(r, bad, (0.78, 0.62, 0.85), (1319, 500, 200), 0, 0.02)),
    "acc-one": ("accuracy: one label k/1319 at p .78 + run sd .005, bad drops .015 (the test's --worse lower)",
                lambda r, bad: acc_labels(r, bad, (0.78,), (1319,), 0, 0.015)),
    "acc-min-corr": ("accuracies near 1: 4 labels .97-.99 via e^-x, shared factor; one label .98->.968 "
                     "(under .97 label), rel sd .004+.004; min",
                     lambda r, bad: multi_corr(r, bad, (0.99, 0.98, 0.975, 0.97), 1, 0.988, 0.004, 0.004, "lower")),
    # (d) large but rare
    "rare3x": ("log-normal .004 sigma .1; BAD runs x3 in 15% of runs, otherwise identical",
               lambda r, bad: ln(r, 0.004, 0.1) * (3.0 if bad and r.random() < 0.15 else 1.0)),
    "rare3x-wide": ("log-normal .004 sigma .3; BAD runs x3 in 15% of runs",
                    lambda r, bad: ln(r, 0.004, 0.3) * (3.0 if bad and r.random() < 0.15 else 1.0)),
    # (e) zeros
    "zero60": ("KL 0.0 in 60% good / 30% bad runs; else log-normal .001/.0015 sigma .5",
               lambda r, bad: zeros(r, bad, 0.6, 0.3, 0.001, 0.0015, 0.5)),
    "zero-all-good": ("good: 0.0 in 95% of runs (else 1e-5 s.5); bad: 0.0 in 40%, else .0003 s.5",
                      lambda r, bad: zeros(r, bad, 0.95, 0.4, 1e-5, 3e-4, 0.5)),
    "zero-print": ("log-normal 3e-5 sigma .6, bad x2, printed %.4f (mostly 0.0000, bad sometimes .0001)",
                   lambda r, bad: printed(ln(r, 3e-5 * (2 if bad else 1), 0.6), "%.4f")),
    "zero-print6": ("log-normal 4e-6 sigma .4, x1.5, printed %.6f (0.000002..0.000010)",
                    lambda r, bad: printed(ln(r, 4e-6 * (1.5 if bad else 1), 0.4), "%.6f")),
    # (f) other SGLang things
    "nan-bad": ("log-normal .004 s.15; bad: 10% of runs print nan (an overflow), else x1.15",
                lambda r, bad: NONFINITE if (bad and r.random() < 0.10) else ln(r, 0.004 * (1.15 if bad else 1), 0.15)),
    "bimodal-bad": ("log-normal .004 s.15; bad: 50% of runs .004 (cache hit path), 50% .007 (new kernel path)",
                    lambda r, bad: ln(r, 0.004 * (1.75 if (bad and r.random() < 0.5) else 1), 0.15)),
    "fix-lower": ("log-normal .004 s.2; bad LOWER x0.7 (bisecting a 'fix' or improvement, --worse either)",
                  lambda r, bad: ln(r, 0.004 * (0.7 if bad else 1), 0.2)),
}

def one(args):
    name, n, seed, t, place = args
    rng = np.random.default_rng([seed, list(SHAPES).index(name), n, t])
    if place == "edge":
        c = [1, n, 2, n - 1][t % 4]
    else:
        c = int(rng.integers(1, n + 1))
    f = SHAPES[name][1]
    log = []

    def draw(i):
        v = f(rng, i >= c)
        log.append((i, v))
        return v
    why = []
    block, runs = simulate_bisect(n, draw, why=why)
    return name, t, c, block, runs, (why[0] if why else ""), (log if block != [c] else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--place", default="uniform")
    ap.add_argument("--dump", default="")
    a = ap.parse_args()
    names = a.shapes.split(",")
    jobs = [(m, a.commits, a.seed, t, a.place) for m in names for t in range(a.trials)]
    t0 = time.time()
    with ProcessPoolExecutor(a.jobs) as ex:
        res = []
        for x in ex.map(one, jobs, chunksize=1):
            res.append(x)
            print(f"TRIAL {x[0]} t={x[1]} culprit={x[2]} named={x[3]} runs={x[4]} {x[5]}", flush=True)
    print(f"command: python scripts/newuser_shapes.py {' '.join(sys.argv[1:])}  ({time.time() - t0:.0f} s wall)")
    print(f"{'shape':25} {'N':>5} {'trials':>6} {'acc':>7} {'wrong':>5} {'gaveup':>6} {'mean':>7} {'p95':>5}")
    for m in names:
        print_tally(m, a.commits, [x[1:6] for x in res if x[0] == m], SHAPES[m][0])
    if a.dump:
        import pickle
        pickle.dump([x for x in res if x[6] is not None], open(a.dump, "wb"))


if __name__ == "__main__":
    main()
