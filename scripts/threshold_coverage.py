"""How often `klbisect calibrate`'s recommended threshold keeps its promise.

Each repetition draws N good runs from a distribution whose tail is known,
asks ``calibrate.label_stats`` (what the command prints) for the threshold
"for --false-fail-rate at --confidence", and computes that threshold's true
false-failure rate. A 95% bound should be over the rate in at most about 5%
of repetitions, counting those that recommend nothing as kept. Also counts
how often the output warns (the runs contradict the fit, or its top runs
stand apart).

    python scripts/threshold_coverage.py --reps 200 --runs 20,40,100,300
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from scipy import stats

from klbisect.calibrate import label_stats, tail_refuted
from klbisect.metric import NONFINITE

MU, SIGMA = math.log(0.005), 0.3


def ln_sf(t: float) -> float:
    return float(stats.norm.sf((math.log(t) - MU) / SIGMA))


def outlier_sf(t: float) -> float:
    """95% log-normal, 5% log-normal times U(3, 10)."""
    us = np.linspace(3, 10, 701)
    return 0.95 * ln_sf(t) + 0.05 * float(np.mean([ln_sf(t / u) for u in us]))


def draw(kind: str, n: int, rng: np.random.Generator) -> list[float]:
    x = np.exp(rng.normal(MU, SIGMA, n))
    if kind == "outliers":
        hit = rng.random(n) < 0.05
        x[hit] *= rng.uniform(3, 10, hit.sum())
    if kind == "uniform":
        x = rng.uniform(0.003, 0.006, n)
    vals = [float(v) for v in x]
    if kind == "nan":
        vals = [NONFINITE if rng.random() < 0.005 else v for v in vals]
    return vals


SF = {"lognormal": ln_sf, "uniform": lambda t: min(1.0, max(0.0, (0.006 - t) / 0.003)),
      "outliers": outlier_sf, "nan": lambda t: 0.005 + 0.995 * ln_sf(t)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--runs", default="20,40,100,300")
    ap.add_argument("--kinds", default="lognormal,uniform,outliers,nan")
    ap.add_argument("--rate", type=float, default=0.01)
    ap.add_argument("--confidence", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    print(f"command: python scripts/threshold_coverage.py --reps {a.reps} --runs {a.runs} --kinds {a.kinds} "
          f"--rate {a.rate:g} --confidence {a.confidence:g} --seed {a.seed}")
    print(f"{'runs of':<10} {'N':>5} {'none':>5} {'over rate':>10} {'median true':>12} {'warned':>7} "
          f"{'warned when over':>17}")
    for kind in a.kinds.split(","):
        for n in (int(x) for x in a.runs.split(",")):
            rng = np.random.default_rng(a.seed * 1000 + n)
            none = over = warned = warned_over = 0
            trues = []
            for _ in range(a.reps):
                ls, = label_stats([{"kl": v} for v in draw(kind, n, rng)], None, a.rate, a.confidence)
                if ls.recommended is None:
                    none += 1
                    continue
                true = SF[kind](ls.recommended)
                trues.append(true)
                b = ls.recommended_bound
                warn = tail_refuted(b["above"], b["runs"], a.rate) or bool(b.get("outliers"))
                over += true > a.rate
                warned += warn
                warned_over += warn and true > a.rate
            med = f"{np.median(trues):.4f}" if trues else "-"
            print(f"{kind:<10} {n:>5} {none:>5} {over / a.reps:>10.1%} {med:>12} {warned:>7} "
                  f"{f'{warned_over}/{over}':>17}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
