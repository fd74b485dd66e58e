"""How often one commit's verdict is wrong, as `klbisect probe` gives it
under `git bisect run`: plain numbers, no git.

Each trial draws endpoint runs (``--endpoint-runs`` a side), then runs of
one commit, good or bad (half each), until ``decide.judge`` gives a verdict
at 500:1 or ``--max-runs`` leave it undecided (git is told to skip it).
Values: three labels, log-normal around 0.0030 / 0.0045 / 0.0038 at spread
``sigma``, the second multiplied by ``shift`` on a bad commit, 3% of runs
3-10x outliers; the metric is the max over labels (an acceptance tester's
histories, 2026-12-02). Two verdict models: ``plugin``, a ``Model`` fitted
to the endpoint runs and plugged in (what `probe` used on overlapping
sides before), and ``now`` (``PredictiveModel`` where the sides overlap: this tree).

    python scripts/verdict_errors.py --trials 400
"""
from __future__ import annotations

import argparse
import math
import random
import time


from klbisect.decide import OVERLAP_MAX_RUNS, Model, judge, verdict_model

BASES = (0.0030, 0.0045, 0.0038)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--max-runs", type=int, default=OVERLAP_MAX_RUNS)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)

    def draw(bad: bool, shift: float, sigma: float) -> float:
        vals = []
        for k, m in enumerate(BASES):
            v = m * (shift if bad and k == 1 else 1.0) * math.exp(rng.gauss(0, sigma))
            if rng.random() < 0.03:
                v *= rng.uniform(3, 10)
            vals.append(v)
        return max(vals)

    print(f"{'shift':>5} {'sigma':>5} {'endpoint':>8}  {'model':<10} {'wrong':>9} {'skipped':>9} {'mean runs':>9}")
    t0 = time.time()
    for shift, sigma in ((1.5, 0.15), (1.45, 0.23), (1.35, 0.3)):
        for n_end in (10, 20):
            for kind in ("plugin", "now"):
                wrong = skipped = runs = 0
                for t in range(a.trials):
                    truth_bad = t % 2 == 0
                    g = [draw(False, shift, sigma) for _ in range(n_end)]
                    b = [draw(True, shift, sigma) for _ in range(n_end)]
                    model = Model.fit(g, b) if kind == "plugin" else verdict_model(g, b)
                    xs: list[float] = []
                    while True:
                        v = judge(xs, 0, model, a.max_runs)
                        if v.decision != "undecided":
                            break
                        xs.append(draw(truth_bad, shift, sigma))
                    runs += len(xs)
                    skipped += v.decision == "skip"
                    wrong += v.decision == ("good" if truth_bad else "bad")
                print(f"{shift:>5} {sigma:>5} {n_end:>8}  {kind:<10} {wrong:>4}/{a.trials:<4} "
                      f"{skipped:>4}/{a.trials:<4} {runs / a.trials:>9.1f}", flush=True)
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
