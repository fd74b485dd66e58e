#!/usr/bin/env python3
"""Held-out noise models a ninth tester wrote (docs/benchmarks.rst, "Nine
models the benchmark's --model cannot write"), driven through klbisect.simulate.simulate_bisect,
the function bench_bisect.py's klbisect strategy calls (same defaults: confidence 0.99,
decide.MIN/MAX_ENDPOINT_RUNS, MAX_TOTAL_RUNS). Every run counts (endpoint and crashed runs).
Bound: decide.runs_lower_bound(N, C, 0.01), C by Monte Carlo as bench_bisect.bits_per_run does
(histogram of log values over 2000 bins + a crash bin, I(outcome; side) maximised over P(bad)).

    python scripts/heldout_models.py --models M1,M2 --trials 100 --seed 9 --jobs 2
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from klbisect import decide
from klbisect.simulate import simulate_bisect

from bench_bisect import capacity_of   # scripts/ is on the path when run as a script


def tally(trials) -> tuple[float, int, int, float, float, list]:
    """Of (trial, culprit, block named or None, runs, why) tuples: accuracy
    in %, wrong answers, give-ups, mean and 95th-percentile runs, and the
    misses (the shape scripts' one summary)."""
    trials = list(trials)
    runs = np.array([x[3] for x in trials], float)
    misses = [x for x in trials if x[2] != [x[1]]]
    return (100 * (1 - len(misses) / len(trials)), sum(1 for x in misses if x[2] is not None),
            sum(1 for x in misses if x[2] is None), runs.mean(), np.percentile(runs, 95), misses)


def print_tally(label: str, n: int, trials, desc: str = "") -> None:
    """One row of a shape script's table (``tally``'s numbers), then its misses."""
    trials = list(trials)
    acc, wrong, gave, mean, p95, misses = tally(trials)
    print(f"{label:25} {n:>5} {len(trials):>6} {acc:6.1f}% {wrong:>5} {gave:>6} {mean:7.1f} {p95:5.0f}   {desc}")
    for t, c, block, runs, why in misses:
        print(f"    miss {label} trial {t}: culprit {c} -> {block} {why} ({runs} runs)")


def sig(x, d):
    return float(f"{x:.{d}g}")


class Model:
    """One history per trial. draw(i) -> value or None (crash). good_bad(rng, bad, n) draws
    i.i.d. 'steady' run values of each side for the capacity C."""
    n = 1000
    desc = ""

    def __init__(self, rng, n):
        self.rng, self.n = rng, n
        self.c = int(rng.integers(1, n + 1))
        self.setup()

    def setup(self):
        pass

    def first_bad(self):
        return self.c


class GammaEst(Model):
    desc = "KL estimator bias: true KL .002 -> .0032 (+60%), plus Gamma(k=2, .001) sample noise (additive, skewed)"
    n = 1000

    @staticmethod
    def vals(rng, bad, n):
        return (0.0032 if bad else 0.002) + rng.gamma(2.0, 0.001, n)

    def draw(self, i):
        return float(self.vals(self.rng, i >= self.c, 1)[0])


class Weibull(Model):
    desc = "Weibull(k=1.5) x .004 per run (CV .68), bad scale x2.2"
    n = 300

    @staticmethod
    def vals(rng, bad, n):
        return 0.004 * (2.2 if bad else 1.0) * rng.weibull(1.5, n)

    def draw(self, i):
        return float(self.vals(self.rng, i >= self.c, 1)[0])


class Kernels(Model):
    desc = ("two kernels per run (P .6 / .4): medians .003 / .0045, sigma .08 each; bad x1.4 "
            "(bad fast kernel .0042 sits on good slow kernel .0045)")
    n = 1000

    @staticmethod
    def vals(rng, bad, n):
        med = np.where(rng.random(n) < 0.6, 0.003, 0.0045) * (1.4 if bad else 1.0)
        return med * np.exp(0.08 * rng.standard_normal(n))

    def draw(self, i):
        return float(self.vals(self.rng, i >= self.c, 1)[0])


class MissingLabel(Model):
    desc = ("4 labels U(.003,.006), one -> U(.008,.014); each label's line missing from the output "
            "8% of runs (max over what printed; none printed = crash); N=2000")
    n = 2000

    @staticmethod
    def vals(rng, bad, n):
        v = rng.uniform(0.003, 0.006, (n, 4))
        if bad:
            v[:, 0] = rng.uniform(0.008, 0.014, n)
        v[rng.random((n, 4)) < 0.08] = -np.inf
        m = v.max(axis=1)
        return np.where(np.isfinite(m), m, np.nan)

    def draw(self, i):
        v = float(self.vals(self.rng, i >= self.c, 1)[0])
        return None if math.isnan(v) else v


class TwoSteps(Model):
    desc = ("log-normal .004 sigma .2; x1.25 at c1, a further x1.6 at c2 = c1 + 5..200; "
            "right = c1 (C from good vs the x1.25 level)")
    n = 1000

    def setup(self):
        self.c = int(self.rng.integers(1, self.n - 4))
        self.c2 = min(self.n, self.c + int(self.rng.integers(5, 201)))

    @staticmethod
    def vals(rng, bad, n):
        return 0.004 * (1.25 if bad else 1.0) * np.exp(0.2 * rng.standard_normal(n))

    def draw(self, i):
        f = (1.25 if i >= self.c else 1.0) * (1.6 if i >= self.c2 else 1.0)
        return 0.004 * f * math.exp(0.2 * self.rng.standard_normal())


class TwoStepsBigFirst(TwoSteps):
    desc = "as two-steps with the big step first: x1.6 at c1, a further x1.25 at c2 = c1 + 5..200"

    @staticmethod
    def vals(rng, bad, n):
        return 0.004 * (1.6 if bad else 1.0) * np.exp(0.2 * rng.standard_normal(n))

    def draw(self, i):
        f = (1.6 if i >= self.c else 1.0) * (1.25 if i >= self.c2 else 1.0)
        return 0.004 * f * math.exp(0.2 * self.rng.standard_normal())


class Warmup(Model):
    desc = ("log-normal .004 sigma .15, x1.5; the FIRST run at each commit (cold autotune/JIT cache) "
            "x U(1.3,1.8); C from the warm runs")
    n = 500

    def setup(self):
        self.seen = set()

    @staticmethod
    def vals(rng, bad, n):
        return 0.004 * (1.5 if bad else 1.0) * np.exp(0.15 * rng.standard_normal(n))

    def draw(self, i):
        v = 0.004 * (1.5 if i >= self.c else 1.0) * math.exp(0.15 * self.rng.standard_normal())
        if i not in self.seen:
            self.seen.add(i)
            v *= self.rng.uniform(1.3, 1.8)
        return v


class Crash30Q(Model):
    desc = ("N=5000: log-normal .004 sigma .25, x1.5, printed %.2g (ties), 30% crashes everywhere")
    n = 5000

    @staticmethod
    def vals(rng, bad, n):
        v = 0.004 * (1.5 if bad else 1.0) * np.exp(0.25 * rng.standard_normal(n))
        v = np.array([sig(x, 2) for x in v])
        return np.where(rng.random(n) < 0.3, np.nan, v)

    def draw(self, i):
        v = float(self.vals(self.rng, i >= self.c, 1)[0])
        return None if math.isnan(v) else v


class Regime(Model):
    desc = ("machine regime: quiet/contended (x1.3) Markov switch p=.03 per run (stationary 50/50, "
            "runs correlated over ~33 runs); log-normal .004 sigma .12, x1.6")
    n = 1000

    def setup(self):
        self.state = int(self.rng.random() < 0.5)

    @staticmethod
    def vals(rng, bad, n):
        return (0.004 * (1.6 if bad else 1.0) * np.where(rng.random(n) < 0.5, 1.3, 1.0)
                * np.exp(0.12 * rng.standard_normal(n)))

    def draw(self, i):
        if self.rng.random() < 0.03:
            self.state ^= 1
        return (0.004 * (1.6 if i >= self.c else 1.0) * (1.3 if self.state else 1.0)
                * math.exp(0.12 * self.rng.standard_normal()))


class WarmupControl(Warmup):
    desc = "control for warmup: the same model with no cold first run"

    def draw(self, i):
        return 0.004 * (1.5 if i >= self.c else 1.0) * math.exp(0.15 * self.rng.standard_normal())


MODELS = {"gamma-est": GammaEst, "weibull": Weibull, "kernels": Kernels, "missing-label": MissingLabel,
          "two-steps": TwoSteps, "two-steps-bigfirst": TwoStepsBigFirst, "warmup": Warmup, "crash30-q2-n5000": Crash30Q, "regime": Regime, "warmup-control": WarmupControl}


def capacity(cls, n=400_000, seed=12345) -> float:
    rng = np.random.default_rng(seed)
    return capacity_of(cls.vals(rng, False, n), cls.vals(rng, True, n))


def one(args):
    name, n, seed, t = args
    cls = MODELS[name]
    rng = np.random.default_rng([seed, list(MODELS).index(name), n, t])
    m = cls(rng, n)
    why = []
    t0 = time.process_time()
    block, runs = simulate_bisect(n, m.draw, why=why)
    extra = getattr(m, "c2", None)
    return name, t, m.c, extra, block, runs, time.process_time() - t0, why[0] if why else ""


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--trial", type=int, action="append", default=[])
    ap.add_argument("--commits", type=int, default=None, help="override each model's N")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    names = a.models.split(",")
    jobs = [(m, a.commits or MODELS[m].n, a.seed, t) for m in names
            for t in (a.trial or range(a.trials))]
    t0 = time.time()
    with ProcessPoolExecutor(a.jobs) as ex:
        res = list(ex.map(one, jobs, chunksize=2))
    print(f"command: python heldout9_models.py {' '.join(sys.argv[1:])}  ({time.time() - t0:.0f} s wall)")
    hdr = (f"{'model':18} {'N':>5} {'trials':>6} {'acc':>7} {'wrong':>5} {'gaveup':>6} {'mean':>7} "
           f"{'p95':>5} {'C':>6} {'bound':>6} {'ratio':>6} {'cpu s/tr':>8}")
    print(hdr)
    bad_lines = []
    for m in names:
        r = [x for x in res if x[0] == m]
        n = a.commits or MODELS[m].n
        ok = [x[4] == [x[2]] for x in r]
        runs = np.array([x[5] for x in r], float)
        C = capacity(MODELS[m])
        bound = decide.runs_lower_bound(n, C, 0.01)
        wrong = sum(1 for x in r if x[4] is not None and x[4] != [x[2]])
        gave = sum(1 for x in r if x[4] is None)
        print(f"{m:18} {n:>5} {len(r):>6} {100 * np.mean(ok):6.1f}% {wrong:>5} {gave:>6} {runs.mean():7.1f} "
              f"{np.percentile(runs, 95):5.0f} {C:6.3f} {bound:6.1f} {runs.mean() / bound:5.2f}x "
              f"{np.mean([x[6] for x in r]):8.2f}")
        if m.startswith("two-steps"):
            named_c2 = sum(1 for x in r if x[4] == [x[3]])
            print(f"   two-steps: named c1 {sum(ok)}, named c2 {named_c2}, other {len(r) - sum(ok) - named_c2}")
        for x in [x for x in r if x[4] != [x[2]]][:12]:
            if True:
                bad_lines.append(f"  {m} trial {x[1]}: culprit {x[2]}" + (f" (c2 {x[3]})" if x[3] else "")
                                 + f", named {x[4]} {x[7]}, {x[5]} runs")
    print("\n".join(bad_lines) or "  no miss")
    print(f"  ({len(bad_lines)} misses)")


if __name__ == "__main__":
    main()
