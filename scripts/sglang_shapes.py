#!/usr/bin/env python3
"""SGLang-KL-like noise shapes through klbisect.simulate.simulate_bisect (what bench_bisect's
klbisect strategy runs), plus a `known` reference: klbisect.search's Posterior/decided told a
Monte Carlo histogram LLR of one run (crash = own outcome), no endpoint runs (as bench_bisect's
run_known). For the time-correlated models the `known` LLR is the stationary marginal's.

    python scripts/sglang_shapes.py --models tok-ln,q4f-tie --trials 150 --seed 3 --jobs 2 [--commits 100] [--known]

Written by a statistics tester (2026-12-07); its table is in docs/benchmarks.rst,
"Noise shapes of a real KL test".
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from klbisect.simulate import simulate_bisect
from klbisect.search import Posterior, decided

from heldout_models import Model, print_tally   # scripts/ is on the path when run as a script


class M(Model):
    discrete = False
    corr = False   # time-correlated: draw() keeps state across runs

    def draw(self, i):
        v = float(self.vals(self.rng, i >= self.c, 1)[0])
        return None if math.isnan(v) else v


class TokLN(M):
    desc = "mean over 500 tokens of per-token KL log-normal(sigma 2) (run CV .33, right-skewed); bad x1.5 per token"
    T, S, F = 500, 2.0, 1.5

    @classmethod
    def vals(cls, rng, bad, n):
        med = 1e-4 * (cls.F if bad else 1.0)
        out = np.empty(n)
        for k in range(0, n, 2000):
            m = min(2000, n - k)
            out[k:k + m] = (med * np.exp(cls.S * rng.standard_normal((m, cls.T)))).mean(1)
        return out


class TokGammaTvar(M):
    desc = "mean over T~U{200..2000} tokens (per run) of per-token Gamma(k=.25) KL (CV 2); bad x1.2 per token"

    @staticmethod
    def vals(rng, bad, n):
        T = rng.integers(200, 2001, n)
        sc = 0.004 / 0.25 * (1.2 if bad else 1.0)
        # sum of T Gamma(k) = Gamma(kT): exact, cheap
        return rng.gamma(0.25 * T, sc) / T


class PromptSubset(M):
    desc = ("pool of 200 prompts (base KL lognormal .003 s.8, fixed per trial); a run = mean over 20 "
            "sampled prompts x run noise e^.3Z; bad: a fixed 25% of the pool x2.2 (mean +30%)")
    P, K = 200, 20

    def setup(self):
        self.base = 0.003 * np.exp(0.8 * self.rng.standard_normal(self.P))
        self.hit = self.rng.random(self.P) < 0.25

    def _vals(self, rng, bad, n):
        idx = np.array([rng.choice(self.P, self.K, replace=False) for _ in range(n)])
        b = self.base[idx] * np.where(bad & self.hit[idx], 2.2, 1.0)
        return (b * np.exp(0.3 * rng.standard_normal(b.shape))).mean(1)

    @classmethod
    def vals(cls, rng, bad, n):
        m = cls.__new__(cls)
        m.rng = np.random.default_rng(777)
        m.setup()
        return m._vals(rng, bad, n)

    def draw(self, i):
        return float(self._vals(self.rng, i >= self.c, 1)[0])


def _q4(x):
    return np.round(x, 4)


class Q4f(M):
    desc = "printed %.4f: log-normal .00312 sigma .03 (reads .0030-.0032), bad x1.1 (reads .0034)"
    discrete = True
    S, F = 0.03, 1.1

    @classmethod
    def vals(cls, rng, bad, n):
        return _q4(0.00312 * (cls.F if bad else 1.0) * np.exp(cls.S * rng.standard_normal(n)))


class Q4fSmall(Q4f):
    desc = "printed %.4f: log-normal .00312 sigma .03, bad x1.05 (reads .0032-.0034)"
    F = 1.05


class Q4fTie(Q4f):
    desc = "printed %.4f: log-normal .00312 sigma .01 (nearly all .0031), bad x1.04 (.0032, some .0033)"
    S, F = 0.01, 1.04


class DayOU(M):
    desc = ("machine drift: every run x e^X, X an AR(1) over runs in time order (sd .12, corr 40 runs); "
            "log-normal .004 sigma .1, bad x1.35")
    corr = True
    SD, TAU, S, F = 0.12, 40.0, 0.1, 1.35

    def setup(self):
        self.x = self.SD * self.rng.standard_normal()

    @classmethod
    def vals(cls, rng, bad, n):
        return 0.004 * (cls.F if bad else 1) * np.exp(math.hypot(cls.SD, cls.S) * rng.standard_normal(n))

    def draw(self, i):
        r = math.exp(-1 / self.TAU)
        self.x = r * self.x + self.SD * math.sqrt(1 - r * r) * self.rng.standard_normal()
        return 0.004 * (self.F if i >= self.c else 1) * math.exp(self.x + self.S * self.rng.standard_normal())


class DayOUBig(DayOU):
    desc = "as day-ou with drift sd .2, corr 100 runs, bad x1.35"
    SD, TAU = 0.2, 100.0


class DaySteps(M):
    desc = "days of 48 runs, each day's factor e^(.15Z) on every run; log-normal .004 sigma .1, bad x1.4"
    corr = True

    def setup(self):
        self.k, self.f = 0, 1.0

    @staticmethod
    def vals(rng, bad, n):
        return 0.004 * (1.4 if bad else 1) * np.exp(math.hypot(0.15, 0.1) * rng.standard_normal(n))

    def draw(self, i):
        if self.k % 48 == 0:
            self.f = math.exp(0.15 * self.rng.standard_normal())
        self.k += 1
        return 0.004 * (1.4 if i >= self.c else 1) * self.f * math.exp(0.1 * self.rng.standard_normal())


class PathProb(M):
    desc = ("kernel path picked at server start: A .003 / B .0045 (sigma .06 each); good P(B)=.5, "
            "bad P(B)=.85, no value shift")

    @staticmethod
    def vals(rng, bad, n):
        return np.where(rng.random(n) < (0.85 if bad else 0.5), 0.0045, 0.003) * np.exp(0.06 * rng.standard_normal(n))


class PathShift(M):
    desc = "kernel path A .003 / B .0045 P(B)=.5 both sides (sigma .06); bad x1.3 (bad A .0039 between)"

    @staticmethod
    def vals(rng, bad, n):
        return (np.where(rng.random(n) < 0.5, 0.0045, 0.003) * (1.3 if bad else 1)
                * np.exp(0.06 * rng.standard_normal(n)))


def _two_labels(rng, bad, n):
    """Label A moves down, label B up."""
    a = 0.004 * (0.75 if bad else 1) * np.exp(0.12 * rng.standard_normal(n))
    b = 0.0032 * (1.5 if bad else 1) * np.exp(0.12 * rng.standard_normal(n))
    return a, b


class LabelFlip(M):
    desc = "max of 2 labels: A .004 s.12 -> x0.75, B .0032 s.12 -> x1.5 (max .0041 -> .0048)"

    @staticmethod
    def vals(rng, bad, n):
        return np.maximum(*_two_labels(rng, bad, n))


class LabelFlipMean(M):
    desc = "mean of 2 labels: A .004 s.12 -> x0.75, B .0032 s.12 -> x1.5 (mean .0036 -> .0039, +8%)"

    @staticmethod
    def vals(rng, bad, n):
        return sum(_two_labels(rng, bad, n)) / 2


class OOM(M):
    desc = "log-normal .004 sigma .2, bad x1.3; 30% of BAD runs crash (OOM), good never"
    R, BG = 0.3, 0.0

    @classmethod
    def vals(cls, rng, bad, n):
        v = 0.004 * (1.3 if bad else 1) * np.exp(0.2 * rng.standard_normal(n))
        cr = rng.random(n) < ((cls.R + cls.BG - cls.R * cls.BG) if bad else cls.BG)
        return np.where(cr, np.nan, v)


class OOM40(OOM):
    desc = "as oom30 with 40% of bad runs crashing"
    R = 0.4


class OOM30bg(OOM):
    desc = "as oom30 plus 5% crashes at every commit"
    BG = 0.05


MODELS = {"tok-ln": TokLN, "tok-gamma-tvar": TokGammaTvar, "prompt-subset": PromptSubset, "q4f": Q4f,
          "q4f-small": Q4fSmall, "q4f-tie": Q4fTie, "day-ou": DayOU, "day-ou-big": DayOUBig,
          "day-steps": DaySteps, "path-prob": PathProb, "path-shift": PathShift, "label-flip": LabelFlip,
          "label-flip-mean": LabelFlipMean, "oom30": OOM, "oom40": OOM40, "oom30-bg5": OOM30bg}

_LLR = {}


def llr_fn(name):
    """histogram log LR of one run (bad/good) from 200k draws a side; nan = crash outcome."""
    if name in _LLR:
        return _LLR[name]
    cls = MODELS[name]
    rng = np.random.default_rng(4242)
    g, b = cls.vals(rng, False, 200_000), cls.vals(rng, True, 200_000)
    cg, cb = (np.isnan(g).mean() + 1e-6), (np.isnan(b).mean() + 1e-6)
    crash = math.log(cb / cg)
    g, b = g[~np.isnan(g)], b[~np.isnan(b)]
    if cls.discrete:
        keys = np.unique(np.concatenate([g, b]))
        pg = np.array([(g == k).sum() + 0.5 for k in keys]) / (len(g) + 0.5 * len(keys))
        pb = np.array([(b == k).sum() + 0.5 for k in keys]) / (len(b) + 0.5 * len(keys))
        table = dict(zip(keys.tolist(), np.log(pb / pg)))
        f = lambda v: crash if v is None else table.get(round(v, 4), 0.0)  # noqa: E731
    else:
        lg, lb = np.log(g), np.log(b)
        edges = np.quantile(np.concatenate([lg, lb]), np.linspace(0, 1, 201))
        edges[0], edges[-1] = -np.inf, np.inf
        hg = np.histogram(lg, edges)[0] + 0.5
        hb = np.histogram(lb, edges)[0] + 0.5
        l = np.log(hb / hb.sum()) - np.log(hg / hg.sum())

        def f(v):
            if v is None:
                return crash
            return float(l[min(199, max(0, np.searchsorted(edges, math.log(v)) - 1))])
    _LLR[name] = f
    return f


def run_known(n, draw, conf=0.99, cap=20000):
    f = llr_fn(CUR[0])
    s = np.zeros(n + 1)
    unt = np.zeros(n + 1, bool)
    runs = 0
    while runs < cap:
        post = Posterior(s, unt)
        done = decided(post, conf)
        nxt = post.choose(1)
        if done or not nxt:
            return (list(done.indices) if done else None), runs
        s[nxt[0]] += f(draw(nxt[0]))
        runs += 1
    return None, runs


CUR = [None]


def one(args):
    name, n, seed, t, strat = args
    CUR[0] = name
    rng = np.random.default_rng([seed, list(MODELS).index(name), n, t])
    m = MODELS[name](rng, n)
    why = []
    log = []

    def draw(i):
        v = m.draw(i)
        log.append((i, v))
        return v
    if strat == "known":
        block, runs = run_known(n, draw)
    else:
        block, runs = simulate_bisect(n, draw, why=why)
    return name, strat, t, m.c, block, runs, (why[0] if why else ""), log if block != [m.c] else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--trials", type=int, default=150)
    ap.add_argument("--trial", type=int, action="append", default=[])
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--strategies", default="klbisect")
    ap.add_argument("--dump", default="")
    a = ap.parse_args()
    names = a.models.split(",")
    jobs = [(m, a.commits, a.seed, t, s) for m in names for s in a.strategies.split(",")
            for t in (a.trial or range(a.trials))]
    t0 = time.time()
    with ProcessPoolExecutor(a.jobs) as ex:
        res = list(ex.map(one, jobs, chunksize=1))
    print(f"command: python scripts/sglang_shapes.py {' '.join(sys.argv[1:])}  ({time.time() - t0:.0f} s wall)")
    print(f"{'model/strategy':25} {'N':>5} {'trials':>6} {'acc':>7} {'wrong':>5} {'gaveup':>6} {'mean':>7} {'p95':>5}")
    for m in names:
        for s in a.strategies.split(","):
            print_tally(f"{m}/{s}", a.commits, [x[2:7] for x in res if x[0] == m and x[1] == s])
    if a.dump:
        import pickle
        pickle.dump([x for x in res if x[7] is not None], open(a.dump, "wb"))


if __name__ == "__main__":
    main()
