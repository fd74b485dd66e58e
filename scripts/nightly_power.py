#!/usr/bin/env python3
"""How soon `klbisect nightly` sees a regression, and how often it cries wolf.

Simulates nights with klbisect.nightly.judge_night, the function the
command uses, and the command's run policy (``--runs`` runs, one more while
the verdict is borderline, up to ``--max-runs``), on log-normal KL values
(``--medians``: one per label, a run's value the max; the regression
multiplies the last label's median). The rules side by side:

* ``suspect``: the command's rule. A night still borderline after
  ``--max-runs`` runs is suspect: kept out of the baseline, its runs pooled
  with the next nights' until they decide.
* ``good-if-unsure``: the rule before 2026-12-01. Such a night was good,
  and joined the baseline.
* ``suspect+labels``: each label is also tested alone (``judge_labels``,
  at ``--alpha`` / labels), so a label the max hides is seen.
* ``suspect+labels+confirm``: the command's rule since 2026-12-07: a night
  judged regressed (not on pooled suspect nights) is measured again and
  must show it on its fresh runs (``confirm_night``), else it is suspect.

    python scripts/nightly_power.py --trials 400
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from klbisect import nightly
from klbisect.nightly import judge_labels, judge_night


def draw(rng, n: int, medians: list[float], sigma: float, factor: float) -> dict[str, list[float]]:
    """``n`` runs of each label; the regression multiplies the last label's median."""
    return {f"l{i}": list(m * (factor if i == len(medians) - 1 else 1.0) * np.exp(sigma * rng.standard_normal(n)))
            for i, m in enumerate(medians)}


def joined(a: dict, b: dict) -> dict:
    return {k: a.get(k, []) + b.get(k, []) for k in set(a) | set(b)}


def the_max(runs: dict) -> list[float]:
    return list(np.max(np.array(list(runs.values())), axis=0)) if runs else []


def one_history(rng, factor: float, nights_after: int, args, rule: str) -> list[str]:
    """Verdicts of the nights after the regression lands (factor 1: none)."""
    medians = [float(m) for m in args.medians.split(",")]
    baseline = [draw(rng, args.runs, medians, args.sigma, 1.0) for _ in range(args.baseline_nights)]
    suspects: dict = {}
    out = []
    for _ in range(nights_after):
        pool: dict = {}
        for night in baseline[-args.baseline_nights:]:
            pool = joined(pool, night)
        vals = draw(rng, args.runs, medians, args.sigma, factor)
        while True:
            j = judge_night(the_max(vals), the_max(pool), the_max(suspects) if rule != "good-if-unsure" else None)
            if rule.startswith("suspect+labels") and j.verdict in ("good", "suspect"):
                lab = judge_labels(vals, pool, suspects or None)
                if lab is not None and (lab.verdict == "regressed" or j.verdict == "good"):
                    j = lab
            if not j.more or len(vals["l0"]) >= args.max_runs:
                break
            vals = joined(vals, draw(rng, 1, medians, args.sigma, factor))
        verdict = j.verdict
        if rule.endswith("+confirm") and verdict == "regressed" and not j.pooled:
            fresh = draw(rng, max(nightly.CONFIRM_RUNS, args.runs), medians, args.sigma, factor)
            seen = fresh[j.label] if j.label else the_max(fresh)
            against = pool[j.label] if j.label else the_max(pool)
            if nightly.confirm_night(seen, against).verdict != "regressed":
                verdict = "suspect"
            vals = joined(vals, fresh)
        if rule == "good-if-unsure" and verdict == "suspect":
            verdict = "good"
        out.append((verdict, len(vals["l0"])))
        if verdict == "regressed":
            break
        if verdict == "suspect":
            suspects = joined(suspects, vals)
        else:
            suspects = {}
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
    ap.add_argument("--median", type=float, default=None, help="two labels of this median (the first tables')")
    ap.add_argument("--medians", default="0.002,0.002",
                    help="each label's median; the regression moves the last one, a run's value is the max")
    ap.add_argument("--rules", default="suspect,good-if-unsure",
                    help="suspect, good-if-unsure, suspect+labels, suspect+labels+confirm (the command's rule "
                         "since 2026-12-07)")
    ap.add_argument("--sigma", type=float, default=0.26)
    ap.add_argument("--label-suspect-p", type=float, default=None,
                    help="nightly.LABEL_SUSPECT_P for suspect+labels (default: the command's)")
    ap.add_argument("--good-nights", type=int, default=30, help="nights per trial for the false-alarm row")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.median is not None:
        args.medians = f"{args.median:g},{args.median:g}"
    if args.label_suspect_p is not None:
        nightly.LABEL_SUSPECT_P = args.label_suspect_p
    t0 = time.time()
    print("command: python scripts/nightly_power.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()))
    print(f"log-normal medians {args.medians}, sigma {args.sigma:g}, max over labels, {args.runs} runs a night "
          f"(up to {args.max_runs} when borderline), baseline {args.baseline_nights} good nights; "
          f"{args.trials} trials a row")
    print()
    print(f"{'rule':<22} {'regression':>10}  " + "  ".join(f"by night {k}" for k in range(1, args.nights + 1))
          + "  missed")
    for rule in args.rules.split(","):
        for f in [float(x) for x in args.factors.split(",")]:
            found_by = np.zeros(args.nights)
            for t in range(args.trials):
                # one stream per trial: both rules see the same values on the same night
                rng = np.random.default_rng([args.seed, t, int(f * 1000)])
                v = [verdict for verdict, _ in one_history(rng, f, args.nights, args, rule)]
                if v[-1] == "regressed":
                    found_by[len(v) - 1:] += 1
            cells = "  ".join(f"{100 * found_by[k] / args.trials:9.1f}%" for k in range(args.nights))
            print(f"{rule:<22} {'x' + format(f, 'g'):>10}  {cells}  {100 * (1 - found_by[-1] / args.trials):5.1f}%")
        alarms = nights = runs = 0
        for t in range(max(1, args.trials // 4)):
            rng = np.random.default_rng([args.seed, t, 1])
            v = one_history(rng, 1.0, args.good_nights, args, rule)
            nights += len(v)
            runs += sum(n for _, n in v)
            alarms += v[-1][0] == "regressed"
        print(f"{rule:<22} {'none':>10}  false alarms: {alarms} in {nights} good nights "
              f"({100 * alarms / max(nights, 1):.2f}% a night), {runs / max(nights, 1):.2f} runs a night")
    print(f"\n{time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
