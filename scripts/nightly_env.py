"""How often the nightly environment check calls "environment", on plain numbers.

``nightly.judge_environment`` is asked on two kinds of night:

* ``regressed``: a night regressed against its baseline measures its good
  endpoint again (``_check_environment``: up to 20 runs, until decided);
* ``borderline``: a borderline night measured its baseline heads again (3
  runs here) and judges them, with more only while they lean towards the
  head at 3:1 (``_seen_environment``).

Values: the max over three labels, each log-normal (median 0.002, sigma
0.26), as ``scripts/nightly_days.py`` prints them; the baseline is five
nights of three runs. Under ``--case null`` nothing changed: tonight's head
runs are drawn until they are a false alarm (regressed at ``--alpha``) or
borderline (p <= 0.25 and the median 10% up, not regressed), which is when
the check runs; a call of "environment" is a false one, though a harmless
kind: the night is not bisected and the baseline starts again, where a
bisect of the false alarm would have spent hundreds of runs. Under
``--case reg`` the head's values are x``--factor`` (the code regressed) and
the good commits are as they were: a call hides the regression in the
baseline. Under ``--case env`` every value is x``--factor`` from tonight on
(head and good commits alike): a call is right. Reported: calls, and the
good-commit runs spent.

    python scripts/nightly_env.py --trials 2000 --case null
    python scripts/nightly_env.py --trials 2000 --case reg --factor 1.6
    python scripts/nightly_env.py --trials 2000 --case env --factor 1.6
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

from klbisect.nightly import ENV_CHECK_RUNS, ENV_LEAN, compare, judge_environment

BASELINE_RUNS = 15
HEAD_RUNS = 10
SEEN_RUNS = 3


def draw(rng: np.random.Generator, n: int, scale: float = 1.0) -> list[float]:
    return list(scale * np.max(0.002 * np.exp(0.26 * rng.standard_normal((n, 3))), axis=1))


def night(rng, kind: str, case: str, factor: float, alpha: float) -> tuple[list[float], list[float]]:
    """The baseline's runs and the head's, on a night the check runs: under
    no change both are drawn again until the night is one (a baseline that
    drew high makes false alarms rarer, so it is part of the draw)."""
    while True:
        earlier = draw(rng, BASELINE_RUNS)
        if case != "null":
            return earlier, draw(rng, HEAD_RUNS, factor)
        head = draw(rng, HEAD_RUNS)
        c = compare(head, earlier, alpha)
        if kind == "regressed" and c.verdict == "regressed":
            return earlier, head
        if kind == "borderline" and c.verdict == "good" and c.suspicious:
            return earlier, head


def one(rng, kind: str, case: str, factor: float, alpha: float) -> tuple[str, int]:
    earlier, head = night(rng, kind, case, factor, alpha)
    scale = factor if case == "env" else 1.0
    fresh = draw(rng, SEEN_RUNS, scale) if kind == "borderline" else []
    while True:
        v = judge_environment(fresh, 0, earlier, head, ENV_CHECK_RUNS, alpha=alpha)
        if v.decision != "undecided" or (kind == "borderline" and v.log_lr < math.log(ENV_LEAN)):
            break
        fresh += draw(rng, 1, scale)
    if kind == "borderline" and v.decision == "undecided":
        v = judge_environment(fresh, 0, earlier, head, len(fresh), alpha=alpha)
    return v.decision, len(fresh)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--case", choices=("null", "reg", "env"), default="null")
    ap.add_argument("--factor", type=float, default=1.6)
    ap.add_argument("--alpha", type=float, default=0.001)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    what = {"null": "no change", "reg": f"the head x{a.factor:g}, the good commits as they were",
            "env": f"every value x{a.factor:g}"}[a.case]
    print(f"case {a.case} ({what}), {a.trials} trials")
    print(f"{'night':<11} {'environment':>12} {'good':>6} {'neither':>8} {'runs mean':>10} {'p95':>5}")
    for kind in ("regressed", "borderline"):
        out = [one(rng, kind, a.case, a.factor, a.alpha) for _ in range(a.trials)]
        runs = np.array([n for _, n in out])
        env = sum(d == "bad" for d, _ in out)
        good = sum(d == "good" for d, _ in out)
        print(f"{kind:<11} {env:>12} {good:>6} {a.trials - env - good:>8} {runs.mean():>10.1f} "
              f"{int(np.percentile(runs, 95)):>5}", flush=True)
    print(f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
