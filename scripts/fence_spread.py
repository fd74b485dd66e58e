"""How well six endpoint runs a side measure the spread the fence is set in.

``decide.Model.fence`` lies four robust spreads past the endpoint centres
(``Model.mad``). This draws endpoint samples of log-normal runs (sigma 0.2,
no shift) with a share of the bad runs spiking x4-8, fits ``Model`` to each,
and prints, against the true sigma:

- how often the spread comes out under 0.3 and 0.4 of it (a fence inside
  the bulk: ordinary runs fall past it on both sides and the search stalls);
- the share of spikes that land past the fence (the rest look like
  ordinary runs to the integrated model).

``resid-MAD`` is the residuals' MAD alone (the fence's unit before the
floor), ``pairs`` the spread between runs of a side alone
(``decide._pair_spread``), ``floored`` the larger of the first and 0.7 of
the second (the unit before the good side's cap), and ``Model.mad`` what
klbisect uses now: the residuals' MAD capped by the good side's own
spread, then floored by 0.7 of the pairs.

With ``--bisects K`` it then runs K whole searches (``klbisect.simulate``,
``--commits`` commits, a 2x log-normal regression, sigma_log 0.25) whose
first six runs at each endpoint are draws that made the residuals' MAD
come out under 0.28 of the true spread, and prints each one's answer and
runs, stopping a search at 600 runs.

    python scripts/fence_spread.py --draws 10000
    python scripts/fence_spread.py --draws 0 --bisects 30

Pure numpy over klbisect.decide: no git, no processes.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import replace

import numpy as np

from klbisect.decide import PAIR_SPREAD_FLOOR, Model, _pair_spread, _resid_sd
from klbisect.simulate import simulate_bisect

SIGMA = 0.2
SPIKE_MULT = (4.0, 8.0)


def fence_high(model: Model, unit: float) -> float:
    """Model.fence's upper end (log space), measured in ``unit`` instead."""
    return math.log(replace(model, mad=unit).fence()[1])


def resid_mad(g: np.ndarray, b: np.ndarray) -> float:
    """The residuals' MAD, both sides pooled, as a normal's sigma: the
    fence's unit before the floor."""
    return _resid_sd(np.concatenate([g - np.median(g), b - np.median(b)]))


def spikes_past(high: float, mu: float) -> float:
    """Share of spikes (a run at the true bulk times U(4, 8)) above ``high``."""
    lo, hi = math.log(SPIKE_MULT[0]), math.log(SPIKE_MULT[1])
    # the bulk's own spread is small next to the multiplier's: take the centre
    return float(np.clip((mu + hi - high) / (hi - lo), 0.0, 1.0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=10000)
    ap.add_argument("--runs", type=int, default=6, help="endpoint runs a side")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bisects", type=int, default=0)
    ap.add_argument("--commits", type=int, default=200)
    a = ap.parse_args()
    if a.draws:
        spreads(a)
    if a.bisects:
        bisects(a.bisects, a.commits)


def bisects(k: int, n: int, sigma: float = 0.25, collapsed: float = 0.28, stop: int = 600) -> None:
    print(f"\n{k} searches over {n} commits from endpoint draws whose residuals' MAD < {collapsed} sigma")
    results = []
    seed = 0
    while len(results) < k:
        rng = np.random.default_rng(seed)
        g = np.log(0.004) + sigma * rng.standard_normal(6)
        b = np.log(0.008) + sigma * rng.standard_normal(6)
        if resid_mad(g, b) < collapsed * sigma:
            c = int(rng.integers(1, n + 1))
            first = {0: list(np.exp(g)), n: list(np.exp(b))}

            def run(i: int) -> float:
                if first.get(i):
                    return float(first[i].pop(0))
                return float(np.exp(np.log(0.004 if i < c else 0.008) + sigma * rng.standard_normal()))
            block, runs = simulate_bisect(n, run, max_total_runs=stop)
            verdict = "right" if block == [c] else ("stopped" if block is None else f"wrong {block}")
            print(f"  draw {seed}: culprit {c}, {verdict}, {runs} runs")
            results.append((block == [c], block is None, runs))
        seed += 1
    right, stopped, runs = (np.array(x) for x in zip(*results))
    print(f"right {right.sum()} of {k}, stopped at {stop} runs {stopped.sum()}, mean runs {runs.mean():.1f}")


def spreads(a: argparse.Namespace) -> None:
    rng = np.random.default_rng(a.seed)
    mu = math.log(0.004)
    print(f"{a.runs} runs a side, sigma_log {SIGMA}, {a.draws} draws; spread in units of the true sigma")
    print(f"{'spiking':>8}  {'spread':>10}  {'median':>6}  {'<0.3':>7}  {'<0.4':>7}  {'spikes past fence':>17}")
    for rate in (0.0, 0.3, 0.5):
        rows: dict[str, list[tuple[float, float]]] = {"resid-MAD": [], "pairs": [], "floored": [],
                                                      "Model.mad": []}
        for _ in range(a.draws):
            g = mu + SIGMA * rng.standard_normal(a.runs)
            b = mu + SIGMA * rng.standard_normal(a.runs)
            b = b + np.where(rng.random(a.runs) < rate, np.log(rng.uniform(*SPIKE_MULT, a.runs)), 0.0)
            m = Model.fit(list(np.exp(g)), list(np.exp(b)))
            mad, pairs = resid_mad(g, b), _pair_spread(g, b)
            units = (("resid-MAD", mad), ("pairs", pairs), ("floored", max(mad, PAIR_SPREAD_FLOOR * pairs)),
                     ("Model.mad", m.mad))
            for name, unit in units:
                rows[name].append((unit / SIGMA, spikes_past(fence_high(m, unit), mu)))
        for name, r in rows.items():
            u, past = np.array(r).T
            print(f"{rate:>8.0%}  {name:>10}  {np.median(u):>6.2f}  {np.mean(u < 0.3):>7.2%}  "
                  f"{np.mean(u < 0.4):>7.2%}  {past.mean():>17.1%}")


if __name__ == "__main__":
    main()
