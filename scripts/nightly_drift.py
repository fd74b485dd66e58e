"""The trend check of ``klbisect nightly``, on plain numbers: what it costs
on histories with no change, and what it finds after a regression the
baseline absorbed.

Each night's runs go through ``nightly.judge_night`` with the loop's run
policy (``--runs`` runs, one more while borderline, up to ``--max-runs``;
suspect nights pooled with the next). A night judged good is then checked
by ``nightly.judge_trend``: for each split of the last ``--trend-nights``
good nights, tonight and the nights after the split against the nights
before it, at ``--alpha`` over the number of splits. The policy is simpler
than the command's in one way: a night still borderline at ``--max-runs``
does not measure the baseline heads again, so the baseline test's false
alarms here are more than the command's.

* ``null``: ``--nights`` nights of one code. Any regressed night is a false
  alarm (its bisect would find nothing: the night stays out, and the trend
  starts again after it); counted apart for the baseline test and the trend check.
* ``absorbed``: ``--good-nights`` good nights, then a regression (one label
  of three times ``--factor``) whose first ``--absorbed`` nights are called
  good whatever their runs say (they drew low), then up to ``--nights``
  nights of it. Found: the first night judged regressed, by either test.

Values: three labels, log-normal (median 0.002, sigma 0.26: the KL test's
overlap model), the max over labels, as ``scripts/nightly_days.py``.

    python scripts/nightly_drift.py --trials 2000 --case null
    python scripts/nightly_drift.py --trials 2000 --case absorbed [--no-trend]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from klbisect.nightly import TREND_NIGHTS, judge_night, judge_trend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", choices=("null", "absorbed"), default="null")
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--nights", type=int, default=30)
    ap.add_argument("--good-nights", type=int, default=10)
    ap.add_argument("--absorbed", type=int, default=1)
    ap.add_argument("--factor", type=float, default=1.6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-runs", type=int, default=10)
    ap.add_argument("--baseline-nights", type=int, default=5)
    ap.add_argument("--alpha", type=float, default=0.001)
    ap.add_argument("--no-trend", action="store_true", help="the rule before 2026-12-02: no trend check")
    ap.add_argument("--trend-nights", type=int, default=0,
                    help=f"good nights the trend check looks back over (default: {TREND_NIGHTS} x --baseline-nights)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    k = a.baseline_nights
    trend = a.trend_nights or TREND_NIGHTS * k
    t0 = time.time()

    def run(reg: bool) -> float:
        v = 0.002 * np.exp(0.26 * rng.standard_normal(3))
        if reg:
            v[1] *= a.factor
        return float(v.max())

    def night(good: list[list[float]], suspects: list[list[float]], reg: bool, forced_good: bool, since: int = 0):
        """(verdict, by, runs): by is "baseline", "trend" or "" for the test that
        called it. The trend holds the good nights from index ``since`` on: it
        starts again after a regressed night (a false alarm, here)."""
        head = [run(reg) for _ in range(a.runs)]
        baseline = [v for n in good[-k:] for v in n]
        border = [v for n in suspects for v in n]
        while True:
            j = judge_night(head, baseline, border, alpha=a.alpha)
            if j.more and len(head) < a.max_runs:
                head.append(run(reg))
                continue
            break
        if forced_good:
            return "good", "", head
        if j.verdict == "good" and not a.no_trend:
            nights = good[::-1][:min(trend, len(good) - since)]
            if len(nights) >= 2 and judge_trend(head, nights, a.alpha) is not None:
                return "regressed", "trend", head
        return j.verdict, "baseline" if j.verdict == "regressed" else "", head

    stats = {"nights": 0, "trended": 0, "by_baseline": 0, "by_trend": 0, "histories_alarmed": 0}
    found_at: list[int | None] = []
    found_by: dict[str, int] = {"baseline": 0, "trend": 0}
    for _ in range(a.trials):
        good: list[list[float]] = []
        suspects: list[list[float]] = []
        if a.case == "null":
            since = 0
            alarmed = False
            for _n in range(a.nights):
                trended = len(good) - since >= 2
                v, by, head = night(good, suspects, False, False, since)
                stats["nights"] += 1
                stats["trended"] += int(trended and (v == "good" or by == "trend"))
                if v == "regressed":
                    stats[f"by_{by}"] += 1
                    alarmed = True
                    suspects = []       # a false alarm: its bisect finds nothing, the night stays out
                    since = len(good)
                elif v == "suspect":
                    suspects.append(head)
                else:
                    good.append(head)
                    suspects = []
            stats["histories_alarmed"] += int(alarmed)
            continue
        for _n in range(a.good_nights):
            v, _by, head = night(good, suspects, False, True)
            good.append(head)
        hit = None
        for n in range(a.nights):
            v, by, head = night(good, suspects, True, n < a.absorbed)
            if v == "regressed":
                hit = n
                found_by[by] += 1
                break
            if v == "suspect":
                suspects.append(head)
            else:
                good.append(head)
                suspects = []
        found_at.append(hit)
    took = time.time() - t0
    if a.case == "null":
        print(f"null: {a.trials} histories of {a.nights} nights, {a.runs} runs a night (up to {a.max_runs}), "
              f"baseline {k} nights, trend {0 if a.no_trend else trend} nights, alpha {a.alpha:g}; {took:.0f} s")
        n = stats["nights"]
        print(f"  nights judged: {n}; false alarms by the baseline test: {stats['by_baseline']} "
              f"({100 * stats['by_baseline'] / n:.3f}%)")
        print(f"  nights checked against the trend: {stats['trended']}; false alarms by the trend check: "
              f"{stats['by_trend']} ({100 * stats['by_trend'] / max(stats['trended'], 1):.3f}% of them)")
        print(f"  histories with any false alarm: {stats['histories_alarmed']} of {a.trials}")
        return
    hits = [h for h in found_at if h is not None]
    print(f"absorbed: {a.trials} histories; one label of three x{a.factor:g} after {a.good_nights} good nights, "
          f"its first {a.absorbed} night(s) called good; {a.runs} runs a night (up to {a.max_runs}), "
          f"baseline {k} nights, trend {0 if a.no_trend else trend} nights, alpha {a.alpha:g}; {took:.0f} s")
    print(f"  found within {a.nights} nights: {len(hits)} of {a.trials} "
          f"(by the baseline test {found_by['baseline']}, by the trend check {found_by['trend']})")
    if hits:
        q = np.percentile(np.array(hits) + 1, [50, 95])
        print(f"  night found (1 = the regression's first): median {q[0]:.0f}, 95th percentile {q[1]:.0f}")


if __name__ == "__main__":
    main()
