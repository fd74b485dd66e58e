#!/usr/bin/env python3
"""A range with no regression in it: what ``klbisect run`` spends before it
says so (exit 154).

Both endpoints and every commit between them draw from one distribution.
The endpoint policy may still see a hint of a difference (p <= 0.2, looked
at run after run) and start an integrated search; ``decide.lost_separation``
is what ends such a search early. Each trial is one whole simulated ``run``
(``klbisect.simulate.simulate_bisect``) on one slot; runs are counted as a
session counts them.

    python scripts/null_range.py --trials 100 --jobs 2
    python scripts/null_range.py --trials 100 --jobs 2 --no-lost-check   # the search without it
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from klbisect import search  # noqa: E402
from klbisect.simulate import simulate_bisect  # noqa: E402

MODELS = {
    # the seed case's good side: the max of three labels, each U(0.003, 0.006)
    "seed": lambda rng: max(rng.uniform(0.003, 0.006) for _ in range(3)),
    # the overlap model's good side: log-normal, median 0.002, sigma 0.26
    "overlap": lambda rng: 0.002 * float(np.exp(0.26 * rng.gauss(0.0, 1.0))),
}


def trial(args: tuple) -> tuple[str, int]:
    model, seed, commits, max_total, lost = args
    search.LOST_CHECK = lost
    rng = random.Random(seed)
    draw = MODELS[model]
    phases = {"endpoints": 0}

    def run(i: int) -> float:
        if i not in (0, commits):
            phases["endpoints"] = 1    # an interior run: the search started
        return draw(rng)

    block, runs = simulate_bisect(commits, run, max_total_runs=max_total)
    if block is not None:
        return "named a commit", runs
    if not phases["endpoints"]:
        return "154 at the endpoints", runs
    return ("stopped at --max-total-runs" if runs >= max_total else "154 mid-search"), runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--commits", type=int, default=100)
    ap.add_argument("--models", default="seed,overlap")
    ap.add_argument("--max-total-runs", type=int, default=400,
                    help="the stop for a runaway search (klbisect's default is 2000; 400 keeps this quick)")
    ap.add_argument("--no-lost-check", action="store_true", help="search without decide.lost_separation")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    t0 = time.time()
    print(f"command: python scripts/null_range.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    for model in a.models.split(","):
        jobs = [(model, 1000 * i + 7, a.commits, a.max_total_runs, not a.no_lost_check) for i in range(a.trials)]
        with mp.Pool(a.jobs) as pool:
            out = pool.map(trial, jobs)
        runs = np.array([r for _, r in out])
        kinds = {}
        for k, _ in out:
            kinds[k] = kinds.get(k, 0) + 1
        parts = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
        print(f"{model}: N={a.commits}, {a.trials} trials, lost check {'off' if a.no_lost_check else 'on'}: "
              f"{parts}; runs mean {runs.mean():.1f}, median {np.median(runs):.0f}, "
              f"p95 {np.percentile(runs, 95):.0f}, max {runs.max()}")
    print(f"({time.time() - t0:.0f} s, {a.jobs} worker(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
