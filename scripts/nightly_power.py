#!/usr/bin/env python3
"""How soon `klbisect nightly` sees a regression, and how often it cries wolf.

Simulates nights with klbisect.nightly.judge_night, the function the
command uses, and the command's run policy (``--runs`` runs, one more while
the verdict is borderline, up to ``--max-runs``), on log-normal KL values
(two labels, a run's value the max; the regression multiplies one label's
median). Two rules side by side:

* ``suspect``: the command's rule. A night still borderline after
  ``--max-runs`` runs is suspect: kept out of the baseline, its runs pooled
  with the next nights' until they decide.
* ``good-if-unsure``: the rule before 2026-12-01. Such a night was good,
  and joined the baseline.

    python scripts/nightly_power.py --trials 400
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from klbisect.nightly import judge_night


def draw(rng, n: int, median: float, sigma: float, factor: float) -> list[float]:
    a = median * np.exp(sigma * rng.standard_normal(n))
    b = median * factor * np.exp(sigma * rng.standard_normal(n))
    return list(np.maximum(a, b))


def one_history(rng, factor: float, nights_after: int, args, rule: str) -> list[str]:
    """Verdicts of the nights after the regression lands (factor 1: none)."""
    baseline: list[list[float]] = [draw(rng, args.runs, args.median, args.sigma, 1.0)
                                   for _ in range(args.baseline_nights)]
    suspects: list[float] = []
    out = []
    for _ in range(nights_after):
        pool = [v for night in baseline[-args.baseline_nights:] for v in night]
        vals = draw(rng, args.runs, args.median, args.sigma, factor)
        while True:
            j = judge_night(vals, pool, suspects if rule == "suspect" else None)
            if not j.more or len(vals) >= args.max_runs:
                break
            vals += draw(rng, 1, args.median, args.sigma, factor)
        verdict = j.verdict
        if rule != "suspect" and verdict == "suspect":
            verdict = "good"
        out.append(verdict)
        if verdict == "regressed":
            break
        if verdict == "suspect":
            suspects += vals
        else:
            suspects = []
            baseline.append(vals)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--factors", default="1.3,1.5,2.0")
    ap.add_argument("--nights", type=int, default=5, help="nights watched after the regression lands")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-runs", type=int, default=10)
    ap.add_argument("--baseline-nights", type=int, default=5)
    ap.add_argument("--median", type=float, default=0.002)
    ap.add_argument("--sigma", type=float, default=0.26)
    ap.add_argument("--good-nights", type=int, default=30, help="nights per trial for the false-alarm row")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.time()
    print("command: python scripts/nightly_power.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()))
    print(f"log-normal median {args.median:g}, sigma {args.sigma:g}, 2 labels (max), {args.runs} runs a night "
          f"(up to {args.max_runs} when borderline), baseline {args.baseline_nights} good nights; "
          f"{args.trials} trials a row")
    print()
    print(f"{'rule':<16} {'regression':>10}  " + "  ".join(f"by night {k}" for k in range(1, args.nights + 1))
          + "  missed")
    for rule in ("suspect", "good-if-unsure"):
        for f in [float(x) for x in args.factors.split(",")]:
            found_by = np.zeros(args.nights)
            for t in range(args.trials):
                # one stream per trial: both rules see the same values on the same night
                rng = np.random.default_rng([args.seed, t, int(f * 1000)])
                v = one_history(rng, f, args.nights, args, rule)
                if v[-1] == "regressed":
                    found_by[len(v) - 1:] += 1
            cells = "  ".join(f"{100 * found_by[k] / args.trials:9.1f}%" for k in range(args.nights))
            print(f"{rule:<16} {'x' + format(f, 'g'):>10}  {cells}  {100 * (1 - found_by[-1] / args.trials):5.1f}%")
        alarms = nights = 0
        for t in range(max(1, args.trials // 4)):
            rng = np.random.default_rng([args.seed, t, 1])
            v = one_history(rng, 1.0, args.good_nights, args, rule)
            nights += len(v)
            alarms += v[-1] == "regressed"
        print(f"{rule:<16} {'none':>10}  false alarms: {alarms} in {nights} good nights "
              f"({100 * alarms / max(nights, 1):.2f}% a night)")
    print(f"\n{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
