#!/usr/bin/env python3
"""The best accuracy any bisect can reach on ``heldout_shapes.py``'s offset
shapes, where every commit's median carries an offset of its own
(e^(tau Z), fixed for all its runs) under a step of x1.3 at the culprit.

Even told tau and the step, with every commit's median known exactly
(infinite runs at every commit), the likeliest first bad commit is the
wrong one whenever the last good commit's offset puts it nearer the bad
side, or the culprit's nearer the good side: the Bayes rule below picks
the boundary that fits every commit's median best, and no rule does
better on average. So the 99% target is out of reach on ``offset6``.

    python scripts/offset_ceiling.py --trials 20000
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from scipy.stats import norm

from heldout_shapes import OFFSETS     # scripts/ is on the path when this runs as a script


def ceiling(tau: float, step: float = math.log(1.3), commits: int = 1000, trials: int = 20000,
            seed: int = 0) -> float:
    """Share of trials where the Bayes rule, given every commit's median, names the culprit."""
    rng = np.random.default_rng(seed)
    right = 0
    for _ in range(trials):
        c = int(rng.integers(1, commits + 1))
        m = tau * rng.standard_normal(commits + 1) + np.where(np.arange(commits + 1) >= c, step, 0.0)
        good, bad = norm.logpdf(m, 0.0, tau), norm.logpdf(m, step, tau)
        # boundary b (1..commits): commits before it good, from it on bad
        fit = np.cumsum(good)[:-1] + np.cumsum(bad[::-1])[::-1][1:]
        right += int(np.argmax(fit) + 1 == c)
    return right / trials


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20000)
    ap.add_argument("--commits", type=int, default=1000)
    a = ap.parse_args(argv)
    if a.trials < 1 or a.commits < 2:
        ap.error("--trials at least 1, --commits at least 2")
    print(f"command: python scripts/offset_ceiling.py --trials {a.trials} --commits {a.commits}")
    for shape, tau in OFFSETS.items():
        z = math.log(1.3) / 2 / tau
        print(f"{shape}: tau {tau}: best accuracy {ceiling(tau, commits=a.commits, trials=a.trials):.4f} "
              f"(the two commits beside the step each past the midpoint: (1 - Phi(-{z:.2f}))^2 = "
              f"{(1 - norm.cdf(-z)) ** 2:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
