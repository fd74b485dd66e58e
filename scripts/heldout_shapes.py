#!/usr/bin/env python3
"""Noise shapes ``bench_bisect.py --model`` cannot write, through the same
search (``klbisect.simulate.simulate_bisect``, what bench_bisect's klbisect
strategy runs): good commits that drift before the culprit, values printed
to one or two significant digits, a regression that adds a constant, Pareto
tails, and the culprit at either end of a short history. A tester wrote
them on 2026-12-04 as held-out models; this is their harness, kept. The
``offset`` shapes (2026-12-06) give each commit an offset of its own.

    python scripts/heldout_shapes.py --jobs 16 --trials 100            # every shape
    python scripts/heldout_shapes.py --shapes drift50,ln60 --trials 300 --commits 10 --culprit last

Accuracy counts the exact first bad commit; a search that gives up (no
answer) is not right. Each trial's draws come from (--seed, trial), so a row
replays alike on any machine.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable

import numpy as np

from klbisect.simulate import simulate_bisect


def sig(x: float, digits: int) -> float:
    """x as a test prints it with %.{digits}g."""
    return float(f"{x:.{digits}g}")


def lognormal(rng, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.standard_normal())


def seed_max(rng, bad: bool) -> float:
    v = rng.uniform(0.003, 0.006, 3)
    if bad:
        v[0] = rng.uniform(0.007, 0.013)
    return float(v.max())


# shape -> (what it is, run(rng, i, culprit, n) -> value)
SHAPES: dict[str, tuple[str, Callable]] = {
    "drift20": ("log-normal .004 sigma .2; good creeps +0-20% over the history; x1.6 at the culprit",
                lambda r, i, c, n: lognormal(r, 0.004 * (1 + 0.2 * i / n) * (1.6 if i >= c else 1), 0.2)),
    "drift50": ("as drift20, creeping +0-50%",
                lambda r, i, c, n: lognormal(r, 0.004 * (1 + 0.5 * i / n) * (1.6 if i >= c else 1), 0.2)),
    "drift20-wide": ("as drift20 with sigma .35",
                     lambda r, i, c, n: lognormal(r, 0.004 * (1 + 0.2 * i / n) * (1.6 if i >= c else 1), 0.35)),
    "drift-prefix": ("good creeps to +20% just before the culprit, then x1.6",
                     lambda r, i, c, n: lognormal(r, 0.004 * (1 + 0.2 * min(i, c) / c) * (1.6 if i >= c else 1),
                                                  0.2)),
    "q2-fine": ("2 significant digits; .0042 sigma .1, x1.3",
                lambda r, i, c, n: sig(lognormal(r, 0.0042 * (1.3 if i >= c else 1), 0.1), 2)),
    "q2-coarse": ("2 significant digits; .012 (steps of 8%) sigma .1, x1.3",
                  lambda r, i, c, n: sig(lognormal(r, 0.012 * (1.3 if i >= c else 1), 0.1), 2)),
    "q2-decade": ("2 significant digits; .0085 sigma .15, x1.5 (the step changes at 0.01)",
                  lambda r, i, c, n: sig(lognormal(r, 0.0085 * (1.5 if i >= c else 1), 0.15), 2)),
    "q1-coarse": ("1 significant digit; .004 sigma .15, x1.6",
                  lambda r, i, c, n: sig(lognormal(r, 0.004 * (1.6 if i >= c else 1), 0.15), 1)),
    "add-ln": ("log-normal .004 sigma .3; bad adds .002",
               lambda r, i, c, n: lognormal(r, 0.004, 0.3) + (0.002 if i >= c else 0)),
    "add-ln-small": ("log-normal .004 sigma .3; bad adds .001",
                     lambda r, i, c, n: lognormal(r, 0.004, 0.3) + (0.001 if i >= c else 0)),
    "add-uni": ("the seed case's good runs (max of 3 U(.003,.006)); bad adds .0015",
                lambda r, i, c, n: float(r.uniform(0.003, 0.006, 3).max()) + (0.0015 if i >= c else 0)),
    "add-gauss": ("normal .005 sd .0008; bad adds .001 (1.25 sd)",
                  lambda r, i, c, n: max(1e-5, 0.005 + 0.0008 * r.standard_normal() + (0.001 if i >= c else 0))),
    "pareto25": (".003 Pareto(alpha 2.5), x1.3",
                 lambda r, i, c, n: 0.003 * (1 + r.pareto(2.5)) * (1.3 if i >= c else 1)),
    "pareto15-add": (".003 e^(.1Z) x1.4 at bad, plus .001 Lomax(1.5) on every run (infinite variance)",
                     lambda r, i, c, n: lognormal(r, 0.003 * (1.4 if i >= c else 1), 0.1) + 0.001 * r.pareto(1.5)),
    "pareto12-x15": (".003 (1 + Lomax(1.2)), x1.5",
                     lambda r, i, c, n: 0.003 * (1 + r.pareto(1.2)) * (1.5 if i >= c else 1)),
    "seed": ("the benchmark's seed case (a check: the table's seed row)",
             lambda r, i, c, n: seed_max(r, i >= c)),
    "ln60": ("log-normal .004 sigma .25, x1.6", lambda r, i, c, n: lognormal(r, 0.004 * (1.6 if i >= c else 1), 0.25)),
    "offset6": ("log-normal .004 sigma .2, x1.3; every commit's median also x e^(.06 Z), its own (2026-12-06)",
                lambda r, i, c, n: lognormal(r, 0.004 * (1.3 if i >= c else 1), 0.2)),
    "offset3": ("as offset6, x e^(.03 Z)", lambda r, i, c, n: lognormal(r, 0.004 * (1.3 if i >= c else 1), 0.2)),
}
# shape -> the log spread of an offset each commit keeps for all its runs (a build's autotuned
# kernels, a change that nudges the numerics): drawn once a trial, apart from the runs' draws
OFFSETS = {"offset6": 0.06, "offset3": 0.03}


def one(args) -> tuple[str, int, int, list[int] | None]:
    shape, n, where, seed, t = args
    rng = np.random.default_rng([seed, t])
    c = {"first": 1, "last": n}.get(where) or int(rng.integers(1, n + 1))
    draw = SHAPES[shape][1]
    off = np.exp(OFFSETS.get(shape, 0.0) * np.random.default_rng([seed, t, 1]).standard_normal(n + 1))
    block, runs = simulate_bisect(n, lambda i: draw(rng, i, c, n) * off[i])
    return shape, c, runs, block


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog="\n".join(
                                     f"  {k:<13} {v[0]}" for k, v in SHAPES.items()))
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated shapes (below); default every one")
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--culprit", default="uniform", choices=["uniform", "first", "last"])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args(argv)
    shapes = [s for s in a.shapes.split(",") if s]
    bad = [s for s in shapes if s not in SHAPES]
    if bad or not shapes:
        ap.error(f"--shapes: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(SHAPES)}")
    if a.commits < 2 or a.trials < 1 or a.jobs < 1 or a.seed < 0:
        ap.error("--commits at least 2, --trials and --jobs at least 1, --seed 0 or more")
    t0 = time.time()
    work = [(s, a.commits, a.culprit, a.seed, t) for s in shapes for t in range(a.trials)]
    with ProcessPoolExecutor(a.jobs) as pool:
        done = list(pool.map(one, work, chunksize=max(1, len(work) // (8 * a.jobs))))
    print(f"command: python scripts/heldout_shapes.py --shapes {','.join(shapes)} --commits {a.commits} "
          f"--culprit {a.culprit} --trials {a.trials} --seed {a.seed}  ({a.jobs} jobs, {time.time() - t0:.0f} s)")
    print(f"{'shape':<14} {'right':>9} {'accuracy':>9} {'wrong':>6} {'gave up':>8} {'mean runs':>10} {'p95 runs':>9}  "
          "not right (trial: culprit -> named)")
    for s in shapes:
        rows = [(t, d) for t, d in enumerate(done) if d[0] == s]
        right = sum(1 for _, d in rows if d[3] == [d[1]])
        runs = np.array([d[2] for _, d in rows])
        misses = [f"{t % a.trials}: {d[1]} -> {'gave up' if d[3] is None else d[3]}"
                  for t, d in rows if d[3] != [d[1]]]
        gave_up = sum(1 for _, d in rows if d[3] is None)
        print(f"{s:<14} {right:>5}/{len(rows):<3} {100 * right / len(rows):>8.1f}% "
              f"{len(rows) - right - gave_up:>6} {gave_up:>8} {runs.mean():>10.1f} "
              f"{np.percentile(runs, 95):>9.0f}  {'; '.join(misses[:4])}{' ...' if len(misses) > 4 else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
