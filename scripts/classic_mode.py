#!/usr/bin/env python3
"""Classic mode (--threshold --votes) on the issue's seed noise, driven the
way `klbisect run` drives it: the first --votes runs of each endpoint must
reproduce the failure, six a side give the fail rates, then search.plan
until it names a commit or gives up. Prints how many trials were right,
wrong, NOT sure or stopped at the endpoints, and the mean probe runs.

    python scripts/classic_mode.py --trials 40 --commits 200 --threshold 0.01 --votes 3
    python scripts/classic_mode.py --trials 40 --commits 200 --threshold 0.0065 --votes 1
    python scripts/classic_mode.py ... --plug-in     # the fail rates as counted, not read cautiously
"""
from __future__ import annotations

import argparse
import dataclasses
from collections import Counter

import numpy as np

from klbisect.decide import ThresholdModel
from klbisect.search import CommitRuns, plan


def seed_value(rng, bad: bool) -> float:
    """The max over three labels; one moves from U(.003,.006) to U(.007,.013)."""
    labels = list(rng.uniform(0.003, 0.006, 2))
    labels.append(rng.uniform(0.007, 0.013) if bad else rng.uniform(0.003, 0.006))
    return float(max(labels))


def trial(seed: int, n: int, threshold: float, votes: int, plug_in: bool) -> tuple[str, int]:
    rng = np.random.default_rng(seed)
    culprit = int(rng.integers(1, n + 1))
    cs = [CommitRuns([]) for _ in range(n + 1)]
    for _ in range(6):
        cs[0].values.append(seed_value(rng, False))
        cs[n].values.append(seed_value(rng, True))
    t = ThresholdModel(threshold, votes)
    if sum(t.fails(cs[0].values[:votes])) * 2 > votes or sum(t.fails(cs[n].values[:votes])) * 2 < votes:
        return "endpoints do not reproduce", 12
    if plug_in:
        rate = lambda v: (float(np.sum(t.fails(v))) + 0.5) / (len(v) + 1)  # noqa: E731
        t = dataclasses.replace(t, fail_good=rate(cs[0].values), fail_bad=rate(cs[n].values))
    else:
        t = t.with_rates(cs[0].values, cs[n].values)
    runs = 12
    while runs < 2000:
        pl = plan(cs, t, 0.99)
        if pl.done:
            return ("right" if pl.done.indices == [culprit] else "WRONG"), runs
        if not pl.next:
            return "NOT sure", runs
        for i in pl.next:
            cs[i].values.append(seed_value(rng, i >= culprit))
            runs += 1
    return "--max-total-runs", runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--commits", type=int, default=200)
    ap.add_argument("--threshold", type=float, default=0.01)
    ap.add_argument("--votes", type=int, default=3)
    ap.add_argument("--plug-in", action="store_true")
    a = ap.parse_args()
    res = [trial(s, a.commits, a.threshold, a.votes, a.plug_in) for s in range(a.trials)]
    print(f"threshold {a.threshold:g}, votes {a.votes}, {a.commits} commits, {a.trials} trials"
          f"{', plug-in rates' if a.plug_in else ''}: {dict(Counter(r for r, _ in res))}; "
          f"mean runs {np.mean([n for _, n in res]):.1f}")


if __name__ == "__main__":
    main()
