#!/usr/bin/env python
"""Benchmark: runs spent and accuracy of bisect strategies on noisy KL metrics.

Simulated histories of N commits (index 0 = known good, N = known bad, first
bad commit ``c`` in 1..N) under several noise models, and five strategies:

``plain``      git bisect at the CI threshold: one run per commit, trusted
               (a crash exits non-zero and counts as bad; a build failure is
               ``git bisect skip``).
``maj5``       the same with a majority of 5 runs per commit (stops at 3
               agreeing runs).
``bayesect``   the real ``git-bayesect`` package (PyPI, 1.2): its ``Bisector``
               chooses every commit (expected-entropy minimisation) and its
               stopping rule (posterior max >= --bayesect-confidence, 0.95 by
               default, as ``git bayesect run``). Observations are pass/fail at
               the CI threshold; crashes and build failures are failures (it has
               no skip in ``run``). For N = 1,000 (``--bayesect-repos``) a real
               repository is generated with ``klbisect.histgen`` and the
               package's own ``State``/``get_commit_indices``/``get_bisector``
               map it onto commits; the probe outcome is drawn in-process from
               the same noise model (spawning the probe would only add time).
``klbisect``   exactly what ``session.run_bisect`` does with one slot
               (``klbisect.simulate``): endpoint calibration
               (``decide.endpoint_step``: ``MIN_ENDPOINT_RUNS`` runs each, more
               while they overlap, up to ``MAX_ENDPOINT_RUNS``), then
               ``search.plan`` with k=1 until it names a block at --confidence
               (0.99 by default). Every run counts: endpoint runs and crashed
               runs (build failures are not probe runs).
``known``      not a tool anyone can run: the same posterior search
               (``search.Posterior``, median probing, stop at --confidence)
               told the TRUE likelihood ratio of every run
               (``Scenario.log_lr``), with no endpoint runs and no guards.
               It prices the search alone against the bound, so klbisect's
               runs beyond it are the price of learning the noise.

The lower bound is Fano's ((1 - delta) log2 N - 1) / C with delta = 0.01 and
C the capacity (bits) of one run: the mutual information between its
outcome (value, or crash) and good-vs-bad, maximised over P(bad), computed
by Monte Carlo from the TRUE distributions (a fine histogram of log values;
C = 1 when they never overlap). It equals the information at P(bad) = 1/2
on every model whose sides share one shape; on the spike model it is 4.6%
above it.

Progress goes to stderr, a line per finished row (model, N, strategy) and a
count every 10 s between rows; stdout and --write-docs hold only the table.

Usage::

    python scripts/bench_bisect.py                 # the table in docs/benchmarks.rst
    python scripts/bench_bisect.py --heldout       # other parameters, same columns
    python scripts/bench_bisect.py --set variants  # a new user's own variations
    python scripts/bench_bisect.py --commits 1000 --random-models 20 --seed 7 \
        --strategies klbisect                      # 20 models nobody chose
    python scripts/bench_bisect.py --commits 1000 --model \
        "name=mine kind=lognormal good=0.004,0.3 bad=1.3,1.5 crashes=0.02"   # your own
    python scripts/bench_bisect.py --commits 1000 --models overlap --strategies klbisect \
        --constant search.INTEGRATED_STRICTNESS=1  # what one guard costs (an ablation)
    python scripts/bench_bisect.py --commits 1000 --strategies klbisect,known \
        --where                                    # where each strategy spends its runs
    python scripts/bench_bisect.py --set variants --models overlap-small --commits 1000 \
        --strategies klbisect --wrong              # which trials were wrong ...
    python scripts/bench_bisect.py --set variants --models overlap-small --commits 1000 \
        --strategies klbisect --trial 111          # ... and one of them again, same seeds
    python scripts/bench_bisect.py --trials 3 --commits 100 --models seed \
        --strategies klbisect,plain                # smoke test
"""
from __future__ import annotations

import argparse
import collections
import datetime
import math
import multiprocessing as mp
import os
import platform
import shlex
import shutil
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy import optimize, special

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from klbisect import decide, search  # noqa: E402
from klbisect.search import Posterior, decided  # noqa: E402
from klbisect.simulate import simulate_bisect  # noqa: E402

DELTA = 0.01
CONFIDENCE = 0.99
MAX_JOBS = 512   # worker processes: more is a typo, and each one costs a fork and its memory
LLR_CLIP = 30.0          # a value only one side can give: decisive, but finite


# ---------------------------------------------------------------------------
# noise models

@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    kind: str = "uniform"              # uniform | lognormal
    good: tuple = (0.003, 0.006)       # uniform bounds, or (median, sigma_log)
    bad: tuple = (0.007, 0.013)        # uniform bounds, or (median factor lo, hi)
    labels: int = 3                    # run value = max over labels; one label moves
    outlier_rate: float = 0.0          # runs multiplied by U(3, 10)
    outlier_mult: tuple = (3.0, 10.0)
    crash_rate: float = 0.0            # runs with no value
    spike_rate: float = 0.0            # BAD runs only, multiplied by U(spike_mult): a regression seen as spikes
    spike_mult: tuple = (4.0, 8.0)
    threshold: float = 0.01            # CI threshold for plain / maj5 / bayesect
    untestable: tuple = (0, 0)         # build-broken stretch right before the culprit: length range
    max_runs: int | None = None        # klbisect --max-runs (None: the default, from the model)

    def trial_params(self, rng: np.random.Generator) -> dict:
        p = {}
        if self.kind == "lognormal":
            p["factor"] = float(rng.uniform(*self.bad))
        return p

    def draw(self, rng: np.random.Generator, bad: bool, params: dict, n: int = 1) -> np.ndarray:
        """n run values (nan = crashed run)."""
        if self.kind == "uniform":
            v = rng.uniform(*self.good, size=(n, self.labels))
            if bad:
                v[:, 0] = rng.uniform(*self.bad, size=n)
            v = v.max(axis=1)
        else:
            med, sig = self.good
            if bad:
                med = med * params["factor"]
            v = med * np.exp(sig * rng.standard_normal((n, self.labels)))
            v = v.max(axis=1)
        if self.outlier_rate:
            out = rng.random(n) < self.outlier_rate
            v = np.where(out, v * rng.uniform(*self.outlier_mult, size=n), v)
        if bad and self.spike_rate:
            out = rng.random(n) < self.spike_rate
            v = np.where(out, v * rng.uniform(*self.spike_mult, size=n), v)
        if self.crash_rate:
            v = np.where(rng.random(n) < self.crash_rate, np.nan, v)
        return v

    def log_lr(self, params: dict, bins: int = 6000):
        """The TRUE log likelihood ratio (bad over good) of one run's value,
        from the model's exact distributions on a fine grid of log values
        (outliers and spikes convolved in; a crash is equally likely either way, so it
        weighs 0). Values only one side can give weigh +-LLR_CLIP."""
        def cdf(x: np.ndarray, bad: bool) -> np.ndarray:
            if self.kind == "uniform":
                g = np.clip((x - self.good[0]) / (self.good[1] - self.good[0]), 0, 1)
                if not bad:
                    return g ** self.labels
                b = np.clip((x - self.bad[0]) / (self.bad[1] - self.bad[0]), 0, 1)
                return b * g ** (self.labels - 1)
            med, sig = self.good[0] * (params["factor"] if bad else 1.0), self.good[1]
            z = (np.log(np.maximum(x, 1e-300)) - math.log(med)) / sig
            return (0.5 * special.erfc(-z / math.sqrt(2))) ** self.labels

        if self.kind == "uniform":
            lo, hi = min(self.good[0], self.bad[0]), max(self.good[1], self.bad[1])
        else:
            f = params["factor"]
            lo = self.good[0] * min(1.0, f) * math.exp(-9 * self.good[1])
            hi = self.good[0] * max(1.0, f) * math.exp(9 * self.good[1])
        # factors under 1 must not pull the top below the values themselves (a tester's
        # outlier-mult=.3,.7 cut the grid at 0.0084, under most bad values)
        top = math.log(hi * max(1.0, self.outlier_mult[1] if self.outlier_rate else 1.0)
                       * max(1.0, self.spike_mult[1] if self.spike_rate else 1.0))
        # factors under 1 ("sometimes a low value", a tester's model) reach below the values
        lo *= min(1.0, self.outlier_mult[0] if self.outlier_rate else 1.0,
                  self.spike_mult[0] if self.spike_rate else 1.0)
        edges = np.linspace(math.log(lo), top, bins + 1)
        h = edges[1] - edges[0]

        def times(p: np.ndarray, rate: float, mult: tuple) -> np.ndarray:
            """p with a share ``rate`` of runs multiplied by U(mult): the log
            of U(m1, m2) on the same grid, as shifts by whole bins (down too)."""
            m1, m2 = mult
            if m2 <= m1:
                shifts = {round(math.log(m1) / h): 1.0}
            else:
                k = np.arange(math.floor(math.log(m1) / h) - 1, math.ceil(math.log(m2) / h) + 2)
                w = (np.clip(np.exp((k + 0.5) * h), m1, m2) - np.clip(np.exp((k - 0.5) * h), m1, m2)) / (m2 - m1)
                shifts = {int(a): float(b) for a, b in zip(k, w) if b > 0}
            moved = np.zeros_like(p)
            for k, w in shifts.items():
                if k >= 0:
                    moved[k:] += w * p[:bins - k]
                else:
                    moved[:bins + k] += w * p[-k:]
            return (1 - rate) * p + rate * moved
        mass = []
        for bad in (False, True):
            p = np.diff(cdf(np.exp(edges), bad))
            if self.outlier_rate:
                p = times(p, self.outlier_rate, self.outlier_mult)
            if bad and self.spike_rate:
                p = times(p, self.spike_rate, self.spike_mult)
            mass.append(p)
        g, b = mass
        with np.errstate(divide="ignore", invalid="ignore"):
            llr = np.where((g > 0) & (b > 0), np.log(b / g), np.where(b > 0, LLR_CLIP, -LLR_CLIP))
        llr = np.where((g == 0) & (b == 0), 0.0, llr)

        def one(v: float | None) -> float:
            if v is None:
                return 0.0
            i = int(np.clip(np.searchsorted(edges, math.log(v)) - 1, 0, bins - 1))
            return float(llr[i])
        return one

    def bits_per_run(self, n: int = 2_000_000, seed: int = 12345) -> float:
        """The channel capacity C: I(outcome; good-vs-bad) from the true
        distributions, maximised over P(bad). A search picks the commit, so it
        picks P(bad); Fano's bound holds with the maximum, not with I at 1/2.
        The two agree when both sides have one shape; they part only where
        the sides differ in kind (spikes: 0.177 at P(bad) = 0.39 against
        0.169 at 1/2)."""
        rng = np.random.default_rng(seed)
        params = {"factor": float(np.mean(self.bad))} if self.kind == "lognormal" else {}
        return capacity_of(self.draw(rng, False, params, n), self.draw(rng, True, params, n))


def capacity_of(g: np.ndarray, b: np.ndarray) -> float:
    """C from n draws of each side (nan: a crash, an outcome of its own):
    histograms of the log values over 2,000 bins, I(outcome; side)
    maximised over P(bad). Also ``heldout_models.py``'s."""
    n = len(g)
    lg, lb = np.log(g[~np.isnan(g)]), np.log(b[~np.isnan(b)])
    lo, hi = min(lg.min(), lb.min()), max(lg.max(), lb.max())
    edges = np.linspace(lo, hi + 1e-12, 2001)
    hg = np.append(np.histogram(lg, edges)[0], np.isnan(g).sum()) / n
    hb = np.append(np.histogram(lb, edges)[0], np.isnan(b).sum()) / n

    def info(p_bad: float) -> float:
        m = (1 - p_bad) * hg + p_bad * hb

        def kl(h: np.ndarray) -> float:
            k = h > 0
            return float(np.sum(h[k] * np.log2(h[k] / m[k])))
        return (1 - p_bad) * kl(hg) + p_bad * kl(hb)
    best = optimize.minimize_scalar(lambda p: -info(p), bounds=(0.01, 0.99), method="bounded",
                                    options={"xatol": 1e-4})
    return max(info(0.5), -float(best.fun))


LOGN_SIGMA = math.log(1.5) / 1.555     # P(good > 0.003) = 6%, P(good > 0.005) = 2e-4

SCENARIOS = {
    "seed": Scenario("seed", "(a) seed: 1 of 3 labels U(.003,.006) -> U(.007,.013), max; threshold 0.01"),
    "overlap": Scenario("overlap", "(b) log-normal, median 0.002 sigma 0.26 (6% > 0.003, ~0 > 0.005); "
                        "regression x1.2-1.3; threshold 0.003",
                        kind="lognormal", good=(0.002, LOGN_SIGMA), bad=(1.2, 1.3), labels=1,
                        threshold=0.003),
    "heavy": Scenario("heavy", "(c) seed + 3% outliers x3-10 + 3% crashes (any commit)",
                      outlier_rate=0.03, crash_rate=0.03),
    "untestable": Scenario("untestable", "(d) seed + 1-4 build failures right before the culprit",
                           untestable=(1, 4)),
}

HELDOUT = {
    "seed": Scenario("seed", "(a') 1 of 4 labels U(.002,.005) -> U(.0055,.02), max; threshold 0.015",
                     good=(0.002, 0.005), bad=(0.0055, 0.02), labels=4, threshold=0.015),
    "overlap": Scenario("overlap", "(b') log-normal, median 0.01 sigma 0.35; regression x1.35-1.5; "
                        "threshold 0.015", kind="lognormal", good=(0.01, 0.35), bad=(1.35, 1.5),
                        labels=1, threshold=0.015),
    "heavy": Scenario("heavy", "(c') (a') + 6% outliers x2-20 + 8% crashes",
                      good=(0.002, 0.005), bad=(0.0055, 0.02), labels=4, threshold=0.015,
                      outlier_rate=0.06, outlier_mult=(2.0, 20.0), crash_rate=0.08),
    "untestable": Scenario("untestable", "(d') (a') + 3% crashes + 2-8 build failures before the culprit",
                           good=(0.002, 0.005), bad=(0.0055, 0.02), labels=4, threshold=0.015,
                           crash_rate=0.03, untestable=(2, 8)),
}

# Variations a new user tries: a tighter gap, fewer labels, wider and smaller
# log-normal shifts, more outliers, outliers on overlapping values.
VARIANTS = {
    "seed-tight": Scenario("seed-tight", "(v1) 1 of 3 labels U(.003,.006) -> U(.0062,.010): a 3% gap",
                           good=(0.003, 0.006), bad=(0.0062, 0.010), threshold=0.008),
    "seed-2labels": Scenario("seed-2labels", "(v2) 1 of 2 labels U(.004,.008) -> U(.009,.02) + 5% crashes",
                             good=(0.004, 0.008), bad=(0.009, 0.02), labels=2, crash_rate=0.05,
                             threshold=0.012),
    "overlap-3labels": Scenario("overlap-3labels", "(v3) log-normal, 3 labels, median .005 sigma .3; x1.3-1.6",
                                kind="lognormal", good=(0.005, 0.3), bad=(1.3, 1.6), labels=3,
                                threshold=0.012),
    "overlap-small": Scenario("overlap-small", "(v4) log-normal median .003 sigma .2; x1.15-1.25",
                              kind="lognormal", good=(0.003, 0.2), bad=(1.15, 1.25), labels=1,
                              threshold=0.0045),
    "overlap-heavy": Scenario("overlap-heavy", "(v5) log-normal sigma .26, x1.25-1.4 + 3% outliers + 3% crashes",
                              kind="lognormal", good=(0.002, 0.26), bad=(1.25, 1.4), labels=1,
                              outlier_rate=0.03, crash_rate=0.03, threshold=0.003),
    "heavy-10pct": Scenario("heavy-10pct", "(v6) seed + 10% outliers x2-5 + 5% crashes",
                            outlier_rate=0.10, outlier_mult=(2.0, 5.0), crash_rate=0.05),
    "spikes": Scenario("spikes", "(v7) log-normal median .004 sigma .2, no shift; 30% of bad runs spike x4-8",
                       kind="lognormal", good=(0.004, 0.2), bad=(1.0, 1.0), labels=1, spike_rate=0.3,
                       threshold=0.01),
}
SETS = {"main": SCENARIOS, "heldout": HELDOUT, "variants": VARIANTS}


# What each --model key does, as parse_model and Scenario.draw read it (--help prints these).
MODEL_KEYS = {
    "name": "NAME: the row's name (default custom); each --model needs its own",
    "kind": "uniform (default) or lognormal: how good= and bad= are read",
    "good": "uniform: LO,HI, each label of a run is U(LO,HI) (default 0.003,0.006); "
            "lognormal: MEDIAN,SIGMA, each label is MEDIAN*exp(SIGMA*Z), Z standard normal "
            "(default 0.002,0.261)",
    "bad": "uniform: LO,HI, at a bad commit ONE label is U(LO,HI) instead, the others stay good "
           "(default 0.007,0.013); lognormal: a FACTOR range LO,HI on the median, one factor drawn "
           "per trial, and EVERY label moves by it (default 1.2,1.3), so 'one label of N moves' "
           "needs kind=uniform. Bad must be above good (uniform: bad HI > good HI; lognormal: "
           "1 <= LO, HI > 1), or equal to it with spikes=",
    "labels": "N: labels per run; a run's value is their max (default 3 uniform, 1 lognormal)",
    "outliers": "RATE in [0,1): share of runs, at any commit, multiplied by U(outlier-mult) (default 0)",
    "outlier-mult": "LO,HI: the outlier factor (default 3,10; under 1: runs that read low)",
    "crashes": "RATE in [0,1): share of runs, at any commit, that give no value (default 0)",
    "spikes": "RATE in [0,1): share of BAD commits' runs multiplied by U(spike-mult), a regression "
              "seen as spikes (default 0)",
    "spike-mult": "LO,HI, 1 <= LO, HI > 1: the spike factor (default 4,8)",
    "threshold": "KL: a run at or above it fails, for plain, maj5 and bayesect (default: uniform "
                 "sqrt(good HI * bad HI); lognormal MEDIAN*exp(1.555*SIGMA), which 6% of one-label "
                 "good runs reach)",
    "untestable": "LO,HI whole numbers: each trial puts LO..HI build-broken commits right before "
                  "the culprit (default 0,0)",
}


def model_keys_help() -> str:
    """--help's list of --model keys, one wrapped entry per key, as wide as argparse's."""
    width = max(60, min(100, shutil.get_terminal_size().columns - 2))
    lines = ["--model keys (SPEC is space-separated key=value words):"]
    for key, what in MODEL_KEYS.items():
        lines += textwrap.wrap(what, width, initial_indent=f"  {key + '=':<14}", subsequent_indent=" " * 16,
                               break_on_hyphens=False)
    return "\n".join(lines)


NUMBER_KEYS = ("labels", "outliers", "crashes", "threshold", "spikes")     # the rest but name and kind are lo,hi


def random_model(k: int, seed: int) -> str:
    """The k-th random ``--model`` spec: uniform or log-normal values, gaps from
    1% to 50%, shifts of 1-5 log spreads, 1-5 labels, and now and then
    outliers, crashes and untestable stretches, so a user can check the
    accuracy claim on parameters nobody chose."""
    r = np.random.default_rng([seed, 7919, k])
    if r.random() < 0.5:
        lo = float(r.uniform(0.001, 0.02))
        hi = lo * float(r.uniform(1.3, 3))
        blo = hi * float(r.uniform(1.01, 1.5))
        bhi = blo * float(r.uniform(1.2, 4))
        spec = f"name=u{k} good={lo:.5g},{hi:.5g} bad={blo:.5g},{bhi:.5g} labels={int(r.integers(1, 6))}"
    else:
        med, sig = float(r.uniform(0.001, 0.05)), float(r.uniform(0.08, 0.45))
        f1 = float(np.exp(sig * r.uniform(1.0, 5.0)))
        f2 = f1 * float(r.uniform(1.0, 1.3))
        spec = (f"name=l{k} kind=lognormal good={med:.5g},{sig:.3g} bad={f1:.4g},{f2:.4g} "
                f"labels={int(r.integers(1, 4))}")
    if r.random() < 0.4:
        spec += f" outliers={r.uniform(0.01, 0.06):.3f} outlier-mult={r.uniform(1.5, 3):.2f},{r.uniform(4, 10):.2f}"
    if r.random() < 0.4:
        spec += f" crashes={r.uniform(0.01, 0.1):.3f}"
    if r.random() < 0.3:
        spec += f" untestable=0,{int(r.integers(1, 6))}"
    return spec


MAX_LABELS = 64       # a KL test prints a handful of labels; a run draws this many values at most
MAX_SIGMA = 3.0       # a log-normal spread of e^3 (x20) per run: past it no model is a KL test's


def parse_model(spec: str) -> Scenario:
    """A noise model from ``key=value`` words (``--model``), so a new user can try
    parameters nobody tuned for. Raises ValueError naming the bad word."""
    if not spec.split():
        raise ValueError("--model: the spec is empty; give key=value words, e.g. 'name=m good=0.003,0.006 "
                         "bad=0.007,0.013'")
    fields: dict = {}
    for word in spec.split():
        key, eq, val = word.partition("=")
        if not eq or key not in MODEL_KEYS:
            raise ValueError(f"--model: {word!r} is not key=value with a key among {', '.join(MODEL_KEYS)}")
        if key in fields:
            raise ValueError(f"--model: {key}= is given twice; give it once")
        if key in ("name", "kind"):
            fields[key] = val
            continue
        try:
            nums = [float(x) for x in val.split(",")]
            if len(nums) != (1 if key in NUMBER_KEYS else 2) or (key == "labels" and not nums[0].is_integer()):
                raise ValueError
        except ValueError:
            takes = ("a whole number" if key == "labels" else "a number" if key in NUMBER_KEYS
                     else "two numbers: lo,hi")
            raise ValueError(f"--model: {word!r}: {key} takes {takes}") from None
        if not all(map(math.isfinite, nums)):
            raise ValueError(f"--model: {word!r}: give finite numbers")
        fields[key] = int(nums[0]) if key == "labels" else nums[0] if key in NUMBER_KEYS else tuple(nums)
    if fields.get("name") == "":
        raise ValueError("--model: name= is empty; give the row a name")
    kind = fields.get("kind", "uniform")
    if kind not in ("uniform", "lognormal"):
        raise ValueError(f"--model: kind={kind} is not uniform or lognormal")
    default = SCENARIOS["seed"] if kind == "uniform" else SCENARIOS["overlap"]
    good, bad = fields.get("good", default.good), fields.get("bad", default.bad)
    if kind == "uniform" and not (0 < good[0] < good[1] and 0 < bad[0] < bad[1]):
        raise ValueError("--model: good and bad take lo,hi with 0 < lo < hi")
    if kind == "lognormal" and not (good[0] > 0 and good[1] > 0 and 0 < bad[0] <= bad[1]):
        raise ValueError("--model: lognormal takes good=median,sigma and bad=factor lo,hi, all > 0")
    for key in ("outliers", "crashes", "spikes"):
        if not 0 <= fields.get(key, 0.0) < 1:
            raise ValueError(f"--model: {key}={fields[key]:g} is a share of runs: give 0 <= {key} < 1")
    spikes = fields.get("spikes", 0.0) > 0
    # Bad runs that never read higher are no regression to find: every strategy scores
    # about 0% after thousands of runs. With spikes= the spikes alone may carry it.
    said = {k: f"{k}={v[0]:g},{v[1]:g}" + ("" if k in fields else " (the default)")
            for k, v in (("good", good), ("bad", bad))}
    if kind == "uniform" and not (bad[1] > good[1] or (spikes and bad[1] == good[1])):
        raise ValueError(f"--model: {said['bad']} is not above {said['good']}: a regression raises KL, "
                         "so give bad hi > good hi (bad hi = good hi only with spikes=)")
    if kind == "lognormal" and not (bad[0] >= 1 and (bad[1] > 1 or spikes)):
        raise ValueError(f"--model: {said['bad']} is a factor on the good median and a regression raises "
                         "it: give 1 <= lo <= hi with hi > 1 (hi = 1 only with spikes=)")
    if not 1 <= fields.get("labels", 1) <= MAX_LABELS:
        raise ValueError(f"--model: labels={fields['labels']}: give 1 to {MAX_LABELS} labels a run")
    if kind == "lognormal" and good[1] > MAX_SIGMA:
        raise ValueError(f"--model: good={good[0]:g},{good[1]:g}: a sigma of {good[1]:g} spreads one commit's "
                         f"runs over x{math.exp(good[1]):.3g}; give sigma <= {MAX_SIGMA:g}")
    if "outlier-mult" in fields and not 0 < fields["outlier-mult"][0] <= fields["outlier-mult"][1]:
        raise ValueError("--model: outlier-mult takes a factor lo,hi with 0 < lo <= hi")
    lo, hi = fields.get("spike-mult", (4.0, 8.0))
    if not (1 <= lo <= hi and hi > 1):
        raise ValueError("--model: spike-mult takes a factor lo,hi with 1 <= lo <= hi and hi > 1: "
                         "a spike raises a bad run")
    if "untestable" in fields:
        lo, hi = fields["untestable"]
        if not (lo.is_integer() and hi.is_integer() and 0 <= lo <= hi):
            raise ValueError("--model: untestable takes a length lo,hi of whole numbers with 0 <= lo <= hi")
        fields["untestable"] = (int(lo), int(hi))
    if fields.get("threshold", 1.0) <= 0:
        raise ValueError("--model: threshold takes a KL value > 0")
    threshold = fields.get("threshold")
    if threshold is None:
        threshold = (good[0] * math.exp(1.555 * good[1]) if kind == "lognormal"
                     else math.sqrt(good[1] * bad[1]))
    name = fields.get("name", "custom")
    return Scenario(name, "(custom) " + spec.strip(), kind=kind, good=good, bad=bad,
                    labels=fields.get("labels", 3 if kind == "uniform" else 1),
                    outlier_rate=fields.get("outliers", 0.0),
                    outlier_mult=fields.get("outlier-mult", (3.0, 10.0)),
                    crash_rate=fields.get("crashes", 0.0), threshold=threshold,
                    spike_rate=fields.get("spikes", 0.0), spike_mult=fields.get("spike-mult", (4.0, 8.0)),
                    untestable=fields.get("untestable", (0, 0)))


# ---------------------------------------------------------------------------
# one history

@dataclass
class Truth:
    n: int
    culprit: int
    untestable: frozenset
    params: dict

    @property
    def block(self) -> list[int]:
        i = self.culprit
        while i - 1 > 0 and (i - 1) in self.untestable:
            i -= 1
        return list(range(i, self.culprit + 1))


def make_truth(sc: Scenario, n: int, rng: np.random.Generator) -> Truth:
    lo_u, hi_u = sc.untestable
    length = int(rng.integers(lo_u, hi_u + 1)) if hi_u else 0
    c = int(rng.integers(1 + length + (1 if length else 0), n + 1))
    return Truth(n, c, frozenset(range(c - length, c)), sc.trial_params(rng))


class Oracle:
    """Draws runs at commit i and counts them, in all and per commit."""

    def __init__(self, sc: Scenario, truth: Truth, rng: np.random.Generator):
        self.sc, self.t, self.rng = sc, truth, rng
        self.runs = 0
        self.at: collections.Counter = collections.Counter()

    def count(self, i: int) -> None:
        self.runs += 1
        self.at[i] += 1

    def roles(self) -> tuple[int, ...]:
        """Runs on (the good endpoint, the bad endpoint, the last good commit,
        the first bad one, every other commit): where a strategy spends."""
        seen, out = set(), []
        for i in (0, self.t.n, self.t.block[0] - 1, self.t.culprit):
            out.append(0 if i in seen else self.at[i])      # culprit 1: the last good IS the endpoint
            seen.add(i)
        return (*out, self.runs - sum(out))

    def run(self, i: int) -> float | None:
        """One probe run; None = crashed (no value). Untestable commits are not asked."""
        self.count(i)
        v = float(self.sc.draw(self.rng, i >= self.t.culprit, self.t.params)[0])
        return None if math.isnan(v) else v

    def fails(self, i: int) -> bool:
        """Pass/fail at the CI threshold: a crash exits non-zero, like a failure."""
        v = self.run(i)
        return v is None or v >= self.sc.threshold


# ---------------------------------------------------------------------------
# strategies: each returns the answer block (or None); the Oracle counts the runs

def run_plain(o: Oracle, votes: int = 1):
    t = o.t
    lo, hi = 0, t.n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        testable = [i for i in range(lo + 1, hi) if i not in t.untestable]
        if not testable:
            break                      # git: "only skipped commits left": any of lo+1..hi
        if mid in t.untestable:        # git bisect skip: a testable commit near the middle
            mid = min(testable, key=lambda i: (abs(i - mid), i))
        need, f, p = votes // 2 + 1, 0, 0
        while f < need and p < need:
            if o.fails(mid):
                f += 1
            else:
                p += 1
        if f >= need:
            hi = mid
        else:
            lo = mid
    return list(range(lo + 1, hi + 1))


def _bayesect_loop(bis, t: Truth, o: Oracle, to_chain, confidence: float, max_runs: int):
    from_rel = {}
    while True:
        if bis.distribution.max() >= confidence or o.runs >= max_runs:
            break
        rel = bis.select()
        i = to_chain(rel)
        if i in t.untestable:          # `git bayesect run`: the build+probe command failed
            o.count(i)
            fail = True
        else:
            fail = o.fails(i)
        bis.record(rel, fail)
        from_rel[rel] = i
    best = int(np.argmax(bis.distribution))
    return [to_chain(best)]


def run_bayesect(o: Oracle, confidence: float, repo_dir: Path | None, max_runs: int, seed: int):
    import git_bayesect as gb
    sc, t = o.sc, o.t
    if repo_dir is None:
        # the package's pure Bisector over N+1 commits, index 0 = newest
        bis = gb.Bisector(np.ones(t.n + 1))
        return _bayesect_loop(bis, t, o, lambda rel: t.n - rel, confidence, max_runs)
    from klbisect.histgen import NoiseModel, make_history
    noise = NoiseModel(kind="uniform" if sc.kind == "uniform" else "lognormal",
                       good=sc.good if sc.kind == "uniform" else (sc.good[0], sc.good[1]),
                       bad=sc.bad if sc.kind == "uniform" else (sc.good[0] * t.params["factor"], sc.good[1]),
                       outlier_rate=sc.outlier_rate, crash_rate=sc.crash_rate, threshold=sc.threshold)
    path = repo_dir / f"r{seed}"
    h = make_history(path, n_commits=t.n + 1, culprit_index=t.culprit, seed=seed, noise=noise, merges=5)
    try:
        repo = Path(h.path)
        new_sha, old_sha = h.bad.encode(), h.good.encode()
        indices = gb.get_commit_indices(repo, new_sha)
        b0 = gb.Bisector([])
        state = gb.State(old_sha=old_sha, new_sha=new_sha,
                         beta_priors=gb.BetaPriors(b0.alpha_new, b0.beta_new, b0.alpha_old, b0.beta_old),
                         priors={}, results=[], commit_indices=indices)
        bis = gb.get_bisector(state)
        new_index, old_index = indices[new_sha], indices[old_sha]
        sha_at = {i: s for s, i in indices.items()}
        chain = {s.encode(): k for k, s in enumerate(h.shas)}

        def to_chain(rel: int) -> int:
            return chain[sha_at[new_index - rel]]
        assert to_chain(0) == t.n and to_chain(new_index - old_index) == 0
        return _bayesect_loop(bis, t, o, to_chain, confidence, max_runs)
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_klbisect(o: Oracle, endpoint_runs: int | None = None,
                 max_endpoint_runs: int | None = None, confidence: float = CONFIDENCE,
                 max_runs: int | None = None, crash_limit: int = 2,
                 max_total_runs: int | None = None, why: list[str] | None = None):
    """session.run_bisect with one slot, step for step (klbisect.simulate).
    Every default is read from ``decide`` at the call, so --constant reaches it."""
    t = o.t
    return simulate_bisect(
        t.n, o.run, t.untestable, confidence,
        decide.MIN_ENDPOINT_RUNS if endpoint_runs is None else endpoint_runs,
        decide.MAX_ENDPOINT_RUNS if max_endpoint_runs is None else max_endpoint_runs,
        max_runs, crash_limit, decide.MAX_TOTAL_RUNS if max_total_runs is None else max_total_runs, why)[0]


def run_known(o: Oracle, confidence: float = CONFIDENCE):
    """klbisect's search with the noise KNOWN: every run weighs the true log
    likelihood ratio, no endpoint runs, no refit, no guards. Not a strategy
    anyone can run; it measures what the search alone costs against Fano's
    bound, so the rest of klbisect's runs are the price of learning the
    noise from the endpoints."""
    t = o.t
    llr = o.sc.log_lr(t.params)
    s = np.zeros(t.n + 1)
    unt = np.array([i in t.untestable for i in range(t.n + 1)], bool)
    while True:
        post = Posterior(s, unt)
        done = decided(post, confidence)
        nxt = post.choose(1)
        if done or not nxt:
            return list(done.indices) if done else None
        s[nxt[0]] += llr(o.run(nxt[0]))


# ---------------------------------------------------------------------------
# the table

STRATEGIES = ("plain", "maj5", "bayesect", "klbisect", "known")


TUNABLE = {"decide": decide, "search": search}


def parse_constant(spec: str) -> tuple[str, str, int | float]:
    """``module.NAME=VALUE`` for --constant: one of klbisect.decide's or
    klbisect.search's numeric module constants."""
    name, sep, value = spec.partition("=")
    mod, _, attr = name.partition(".")
    if not sep or mod not in TUNABLE or not attr.isupper() or not isinstance(
            getattr(TUNABLE[mod], attr, None), (int, float)):
        raise ValueError(f"--constant {spec!r}: give decide.NAME=VALUE or search.NAME=VALUE "
                         "for a numeric constant of that module, e.g. search.INTEGRATED_STRICTNESS=1")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--constant {spec!r}: {value!r} is not a number") from None
    if isinstance(getattr(TUNABLE[mod], attr), int):
        if not number.is_integer():
            raise ValueError(f"--constant {spec!r}: {mod}.{attr} counts something; give a whole number")
        number = int(number)
    if not (math.isfinite(number) and number >= 0):
        # every tunable constant is a count, a ratio or a share: none is negative
        raise ValueError(f"--constant {spec!r}: give a finite value of 0 or more")
    if attr.endswith("_RUNS") and number < 1:
        raise ValueError(f"--constant {spec!r}: {mod}.{attr} counts runs; give at least 1")
    return mod, attr, number


def apply_constants(constants) -> None:
    """Set the ablation's constants in this process (each worker does it
    too, whatever the start method)."""
    for mod, attr, value in constants:
        setattr(TUNABLE[mod], attr, value)


class TrialResult(NamedTuple):
    """One trial of one row: what the tables count, and what ``--wrong``
    prints to replay it (``--trial``)."""

    model: str
    n: int
    strat: str
    ok: bool
    runs: int
    seconds: float
    roles: tuple
    trial: int
    block: list          # the right answer
    named: list | None   # the strategy's answer; None when it gave up
    why: str = ""        # klbisect's reason for giving up, as its session would exit


def _job(args) -> TrialResult:
    sc, mi, si, n, strat, trial, seed, opts = args
    apply_constants(opts.get("constants", ()))
    truth = make_truth(sc, n, np.random.default_rng([seed, mi, n, trial, si]))
    rng = np.random.default_rng([seed, mi, n, trial, si, 1 + STRATEGIES.index(strat)])
    t0 = time.perf_counter()
    o = Oracle(sc, truth, rng)
    why: list[str] = []
    if strat == "plain":
        ans = run_plain(o, 1)
    elif strat == "maj5":
        ans = run_plain(o, 5)
    elif strat == "bayesect":
        repo_dir = Path(opts["tmp"]) if (opts["bayesect_repos"] and n == 1000) else None
        ans = run_bayesect(o, opts["bayesect_confidence"], repo_dir,
                           opts["bayesect_max_runs"], seed * 100003 + trial * 7 + mi + n)
    elif strat == "known":
        ans = run_known(o, opts["confidence"])
    else:
        ans = run_klbisect(o, opts["endpoint_runs"], confidence=opts["confidence"], max_runs=sc.max_runs, why=why)
    return TrialResult(sc.key, n, strat, ans == truth.block, o.runs, time.perf_counter() - t0, o.roles(),
                   trial, truth.block, None if ans is None else list(ans), why[0] if why else "")


def job(set_name: str, model: str, n: int, strat: str, trial: int, seed: int, opts: dict) -> tuple:
    """The work item for one trial of one row; the seeds depend on the model's place in its set."""
    table = SETS[set_name]
    si = list(SETS).index(set_name)
    return (table[model], list(table).index(model), si, n, strat, trial, seed, opts)


MIN_COMMITS = 10   # room for an untestable stretch and a culprit after it


def check_options(ap: argparse.ArgumentParser, checks: list[tuple[str, bool, str]]) -> None:
    """One line and exit 2 for the first option out of range, before any trial."""
    for flag, ok, what in checks:
        if not ok:
            ap.error(f"{flag}: {what}")


def check_room(ap: argparse.ArgumentParser, scenarios, n: int) -> None:
    """Each model's untestable stretch and its culprit fit in N commits."""
    for sc in scenarios:
        if sc.untestable[1] + 2 > n:
            ap.error(f"--commits {n}: model {sc.key} puts up to {sc.untestable[1]} untestable commits "
                     f"before the culprit; give at least {sc.untestable[1] + 2} commits")


def register_custom(specs: list[str]) -> None:
    """--model specs as the "custom" set; ValueError says what is wrong with one."""
    custom = [parse_model(spec) for spec in specs]
    if len({sc.key for sc in custom}) < len(custom):
        raise ValueError("--model: give each model its own name=")
    SETS["custom"] = {sc.key: sc for sc in custom}


PROGRESS_EVERY = 10.0   # seconds between "trials done" lines while no row finishes


class Progress:
    """Sparse progress on stderr, so minutes of trials are not silence: a line
    per finished row (model, N, strategy) and, between rows, at most one
    every PROGRESS_EVERY seconds. Stdout keeps only the table."""

    def __init__(self, jobs: list, workers: int):
        self.t0 = self.last = time.time()
        self.total, self.done = len(jobs), 0
        self.size = collections.Counter(self.row(j) for j in jobs)
        self.left = collections.Counter(self.size)
        self.rows, self.rows_done = len(self.size), 0
        self.right: collections.Counter = collections.Counter()
        self.runs: collections.Counter = collections.Counter()
        # target_floor mixes sets and confidence marks: name them then
        self.sets = len({key[0] for key in self.size}) > 1
        self.marks = len({key[4] for key in self.size}) > 1
        self.say(f"{self.total:,} trials in {self.rows} rows on {workers} worker(s); "
                 "a line per finished row")

    @staticmethod
    def row(j: tuple) -> tuple:
        _, mi, si, n, strat, _, _, opts = j
        return si, mi, n, strat, opts.get("bayesect_confidence" if strat == "bayesect" else "confidence")

    def say(self, what: str) -> None:
        self.last = time.time()
        print(f"[{self.last - self.t0:5.0f} s] {what}", file=sys.stderr, flush=True)

    def add(self, j: tuple, r: "TrialResult") -> None:
        key = self.row(j)
        self.done += 1
        self.left[key] -= 1
        self.right[key] += r.ok
        self.runs[key] += r.runs
        if self.left[key] == 0:
            self.rows_done += 1
            k = self.size[key]
            where = f"{list(SETS)[key[0]]} " if self.sets else ""
            mark = f" at {key[4]:g}" if self.marks else ""
            self.say(f"{self.counts()}  {where}{j[0].key} N={j[3]:,} {j[4]}{mark}: {k} trial{'s' * (k != 1)}, "
                     f"{100 * self.right[key] / k:.1f}% right, {self.runs[key] / k:.1f} runs each")
        else:
            self.tick()

    def counts(self) -> str:
        return f"{self.rows_done}/{self.rows} rows, {self.done:,}/{self.total:,} trials"

    def tick(self) -> None:
        if time.time() - self.last >= PROGRESS_EVERY:
            self.say(self.counts())


def _job_chunk(chunk: list) -> list:
    return [(i, _job(j)) for i, j in chunk]


def run_jobs(jobs: list, workers: int, tmp: str) -> list:
    """Every job's result, in the jobs' order, with progress on stderr;
    ``tmp`` (git-bayesect's generated repositories) is removed afterwards."""
    progress = Progress(jobs, workers)
    out: list = [None] * len(jobs)
    try:
        if workers > 1:
            with mp.Pool(workers) as pool:
                # chunks of 4 made here: with chunksize > 1 imap has no next(timeout)
                items = list(enumerate(jobs))
                it = pool.imap_unordered(_job_chunk, [items[k:k + 4] for k in range(0, len(items), 4)])
                while True:
                    try:
                        done = it.next(timeout=PROGRESS_EVERY)
                    except mp.TimeoutError:       # a long trial: say the count anyway
                        progress.tick()
                        continue
                    except StopIteration:
                        break
                    for i, r in done:
                        out[i] = r
                        progress.add(jobs[i], r)
        else:
            for i, j in enumerate(jobs):
                out[i] = _job(j)
                progress.add(j, out[i])
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def machine_header(script: str, argv, workers: int, elapsed: float) -> str:
    """The command and the machine a table came from: its first two lines."""
    cmd = f"python scripts/{script} " + shlex.join(sys.argv[1:] if argv is None else argv)
    return (f"command: {cmd.strip()}\n"
            f"date: {datetime.date.today().isoformat()}, machine: {os.cpu_count()}-core CPU "
            f"({platform.processor() or platform.machine()}), {workers} worker(s), {elapsed:.0f} s")


def writable_docs(ap: argparse.ArgumentParser, path: str | None) -> None:
    """Before any trial: --write-docs replaces its file, so only a new file
    or a table one of these scripts wrote before may be named."""
    if path and Path(path).is_dir():
        ap.error(f"--write-docs {path}: that is a directory; name a file in it")
    if path and not Path(path).parent.is_dir():
        ap.error(f"--write-docs {path}: the folder {Path(path).parent} does not exist; create it or name "
                 "a file in one that does")
    if path and Path(path).exists():
        with open(path, errors="replace") as f:
            first = f.readline()
        if not first.startswith("command: python scripts/"):
            ap.error(f"--write-docs {path}: the file exists and is not a table these scripts wrote; "
                     "name a new file (it is replaced whole)")


def emit(header: str, lines: list[str], write_docs: str | None) -> None:
    print(header)
    print("\n".join(lines))
    if write_docs:
        Path(write_docs).write_text(header + "\n\n" + "\n".join(lines) + "\n")


def trials_for(strat: str, n: int, base: int, opts, model: str = "") -> int:
    if strat == "bayesect":
        t = opts["bayesect_trials"]
        return max(1, t // 4) if n >= 10000 else t
    if n >= 10000:
        return max(1, base // (8 if model.startswith("overlap") and strat == "klbisect" else 4))
    return base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=model_keys_help(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=150, help="trials per row for N <= 1000 "
                    "(N = 10,000 rows use a quarter, klbisect on the overlap model an eighth)")
    ap.add_argument("--bayesect-trials", type=int, default=20,
                    help="trials per git-bayesect row (N = 10,000: a quarter)")
    ap.add_argument("--commits", default="100,1000,10000")
    ap.add_argument("--models", default=None, help="default: every model of the set")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--set", dest="set_name", choices=sorted(SETS), default="main",
                    help="which noise models: the issue's (main), held-out parameters, or variations")
    ap.add_argument("--heldout", dest="set_name", action="store_const", const="heldout",
                    help="same as --set heldout")
    ap.add_argument("--model", dest="custom", action="append", default=[], metavar="SPEC",
                    help="your own noise model instead of a set, as key=value words, e.g. "
                         "\"name=mine kind=lognormal good=0.004,0.3 bad=1.3,1.5 outliers=0.05 "
                         "crashes=0.02\"; repeatable; the keys are listed at the end")
    ap.add_argument("--random-models", type=int, default=None, metavar="K",
                    help="K random --model specs drawn with --seed (printed with the table)")
    ap.add_argument("--confidence", type=float, default=CONFIDENCE,
                    help="klbisect's --confidence (the posterior mass it stops at)")
    ap.add_argument("--bayesect-confidence", type=float, default=0.95,
                    help="git-bayesect's stopping mark (0.95 is its default)")
    ap.add_argument("--bayesect-max-runs", type=int, default=3000)
    ap.add_argument("--no-bayesect-repos", dest="bayesect_repos", action="store_false",
                    help="drive the package's Bisector without generated repositories")
    ap.add_argument("--endpoint-runs", type=int, default=None,
                    help="klbisect endpoint runs before the separation check "
                         "(default: decide.MIN_ENDPOINT_RUNS, the BisectConfig default)")
    ap.add_argument("--constant", action="append", default=[], metavar="MODULE.NAME=VALUE",
                    help="an ablation: run klbisect with one of klbisect.decide's or "
                         "klbisect.search's constants changed, e.g. search.INTEGRATED_STRICTNESS=1; "
                         "repeatable; named in the table's header")
    ap.add_argument("--where", action="store_true",
                    help="also tabulate where each strategy spends its runs: each endpoint, the "
                         "commits either side of the boundary, every other commit")
    ap.add_argument("--wrong", action="store_true",
                    help="also list every wrong trial (model, N, strategy, trial number, the right "
                         "block, the answer, runs by commit) to replay with --trial")
    ap.add_argument("--trial", type=int, action="append", default=[], metavar="T",
                    help="run only trial number T of each row (repeatable): replays a trial "
                         "that --wrong listed, with the same seeds when the rest of the command "
                         "(every --model, --seed) is the same")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--write-docs", metavar="RST", default=None,
                    help="write the table and its command to this file (a new one, or one these "
                         "scripts wrote before: it is replaced whole)")
    a = ap.parse_args(argv)
    writable_docs(ap, a.write_docs)

    a.custom += [random_model(k, a.seed) for k in range(a.random_models or 0)]
    if a.custom:
        try:
            register_custom(a.custom)
        except ValueError as e:
            ap.error(str(e))
        a.set_name = "custom"
    try:
        constants = [parse_constant(spec) for spec in a.constant]
    except ValueError as e:
        ap.error(str(e))
    apply_constants(constants)
    table = SETS[a.set_name]
    models = [m for m in (a.models or ",".join(table)).split(",") if m]
    try:
        commits = [int(x) for x in a.commits.split(",") if x]
    except ValueError:
        ap.error(f"--commits {a.commits!r}: give history sizes separated by commas, e.g. 100,1000")
    check_options(ap, [
        ("--commits", bool(commits) and min(commits) >= MIN_COMMITS, f"give sizes of at least {MIN_COMMITS}"),
        ("--trials", a.trials >= 1, "give at least 1 trial per row"),
        ("--seed", a.seed >= 0, "give a seed of 0 or more"),
        ("--bayesect-trials", a.bayesect_trials >= 1, "give at least 1 trial per row"),
        ("--jobs", a.jobs >= 1, "give at least 1 worker"),
        ("--jobs", a.jobs <= MAX_JOBS, f"give at most {MAX_JOBS} workers"),
        ("--confidence", 0.5 < a.confidence <= decide.MAX_CONFIDENCE,
         f"give a posterior mass above 0.5 and at most {decide.MAX_CONFIDENCE:g} (klbisect's own limit), e.g. 0.99"),
        ("--bayesect-confidence", 0.5 < a.bayesect_confidence < 1, "give a mass between 0.5 and 1, e.g. 0.95"),
        ("--bayesect-max-runs", a.bayesect_max_runs >= 1, "give at least 1 run"),
        ("--random-models", a.random_models is None or a.random_models >= 1,
         "give 1 or more models (without it the set's own models run)"),
        ("--endpoint-runs", a.endpoint_runs is None or 2 <= a.endpoint_runs <= decide.MAX_ENDPOINT_RUNS,
         f"give 2 to {decide.MAX_ENDPOINT_RUNS} runs per endpoint (klbisect's --max-endpoint-runs caps it there)"),
    ])
    strats = [s for s in a.strategies.split(",") if s]
    if not strats:
        ap.error(f"--strategies {a.strategies!r}: name at least one of {','.join(STRATEGIES)}")
    for m in models:
        if m not in table:
            ap.error(f"unknown model {m!r}; choose from {','.join(table)}")
    check_room(ap, [table[m] for m in models], min(commits))
    for s in strats:
        if s not in STRATEGIES:
            ap.error(f"unknown strategy {s!r}; choose from {','.join(STRATEGIES)}")

    tmp = tempfile.mkdtemp(prefix="klb-bench-")
    opts = dict(tmp=tmp, bayesect_repos=a.bayesect_repos, bayesect_confidence=a.bayesect_confidence,
                bayesect_max_runs=a.bayesect_max_runs, bayesect_trials=a.bayesect_trials,
                endpoint_runs=a.endpoint_runs, confidence=a.confidence, constants=constants)
    jobs = []
    for m in models:
        for n in commits:
            for s in strats:
                for tr in range(trials_for(s, n, a.trials, opts, m)):
                    if a.trial and tr not in a.trial:
                        continue
                    jobs.append(job(a.set_name, m, n, s, tr, a.seed, opts))
    if a.trial and not jobs:
        ap.error(f"--trial {' '.join(map(str, a.trial))}: no row has that trial; they are numbered "
                 "from 0 to the row's trials minus 1 (--trials, --bayesect-trials)")
    # long jobs first, so the two workers finish together
    jobs.sort(key=lambda j: -(j[3] * (50 if j[4] == "bayesect" else 1) * (5 if j[0].kind == "lognormal" else 1)))
    t0 = time.time()
    out = run_jobs(jobs, min(a.jobs, len(jobs)), tmp)
    results: dict = {}
    for o in out:
        results.setdefault((o.model, o.n, o.strat), []).append((o.ok, o.runs, o.seconds, o.roles))
    elapsed = time.time() - t0

    bits = {m: table[m].bits_per_run() for m in models}
    lines = render(models, commits, strats, results, bits, table)
    if a.where:
        lines += ["", "where the runs go (mean per trial; last good = the commit before the named block):",
                  *render_where(models, commits, strats, results)]
    if a.wrong:
        lines += ["", *render_wrong(out)]
    header = (machine_header("bench_bisect.py", argv, a.jobs, elapsed)
              + f"; decide.RUN_LR_CAP={decide.RUN_LR_CAP:g}, "
              f"MIN_ENDPOINT_RUNS={decide.MIN_ENDPOINT_RUNS}, search.HIGH_SIDE_EXTRA={search.HIGH_SIDE_EXTRA}; "
              f"confidence {a.confidence:g} "
              f"(git-bayesect {a.bayesect_confidence:g})")
    if constants:
        header += "\nablation: " + ", ".join(f"{m}.{k}={getattr(TUNABLE[m], k):g}" for m, k, _ in constants)
    emit(header, lines, a.write_docs)
    return 0


def _grid(cols: list[str], rows: list[list[str]]) -> list[str]:
    """An rst simple table."""
    w = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    sep = "  ".join("=" * x for x in w)
    return [sep, "  ".join(c.ljust(x) for c, x in zip(cols, w)).rstrip(), sep,
            *("  ".join(v.ljust(x) for v, x in zip(r, w)).rstrip() for r in rows), sep]


def render_where(models, commits, strats, results) -> list[str]:
    """Mean runs per trial by role (``Oracle.roles``): the endpoints' share is
    what learning the noise costs up front; the two boundary commits, what
    proving the answer costs."""
    rows = []
    for m in models:
        for n in commits:
            for s in strats:
                r = results.get((m, n, s))
                if not r:
                    continue
                roles = np.mean([x[3] for x in r], axis=0)
                rows.append([m, f"{n:,}", s, *(f"{v:.1f}" for v in roles),
                             f"{100 * (roles[0] + roles[1]) / max(roles.sum(), 1e-9):.0f}%"])
    return _grid(["model", "N", "strategy", "good end", "bad end", "last good", "first bad", "elsewhere",
                  "endpoints"], rows)


def render_wrong(out: list[TrialResult], most: int = 20) -> list[str]:
    """The wrong trials of each row, at most ``most`` a row, in trial order."""
    rows: dict = {}
    for o in sorted(out, key=lambda o: o.trial):
        if not o.ok:
            rows.setdefault((o.model, o.n, o.strat), []).append(o)
    if not rows:
        return ["wrong trials: none"]
    lines = ["wrong trials (replay one: the same command, every --model and --seed kept, since a "
             "trial's seed follows its model's place, with --models M --commits N --strategies S "
             "--trial T; runs: good end, bad end, last good, first bad, elsewhere):"]
    for (m, n, s), wrong in rows.items():
        for o in wrong[:most]:
            named = (f"gave up ({o.why})" if o.why else "gave up") if o.named is None else f"named {_span(o.named)}"
            lines.append(f"  {m} N={n:,} {s} trial {o.trial}: culprit {_span(o.block)}, {named}, "
                         f"{o.runs} runs {tuple(int(x) for x in o.roles)}")
        if len(wrong) > most:
            lines.append(f"  {m} N={n:,} {s}: and {len(wrong) - most} more")
    return lines


def _span(block: list) -> str:
    return str(block[0]) if len(block) == 1 else f"{block[0]}..{block[-1]}"


def render(models, commits, strats, results, bits, table) -> list[str]:
    cols = ["model", "N", "strategy", "trials", "accuracy", "mean runs", "p95 runs",
            "bound", "mean/bound", "s/trial"]
    rows = []
    for m in models:
        for n in commits:
            bound = decide.runs_lower_bound(n, bits[m], DELTA)
            for s in strats:
                r = results.get((m, n, s))
                if not r:
                    continue
                ok = np.array([x[0] for x in r], float)
                runs = np.array([x[1] for x in r], float)
                dt = np.mean([x[2] for x in r])
                rows.append([m, f"{n:,}", s, str(len(r)), f"{100 * ok.mean():.1f}%",
                             f"{runs.mean():.1f}", f"{np.percentile(runs, 95):.0f}",
                             f"{bound:.1f}", f"{runs.mean() / bound:.2f}x", f"{dt:.2f}"])
    out = [*_grid(cols, rows), ""]
    out.append("per-run information C (bits, Monte Carlo from the true distributions):")
    for m in models:
        out.append(f"  {m}: C = {bits[m]:.3f}  -- {table[m].title}")
    return out


if __name__ == "__main__":
    sys.exit(main())
