"""The anchor check of ``klbisect nightly``, on plain numbers: what it costs
on histories with no change, and what it finds after a regression the
baseline absorbed.

Each night's runs go through ``nightly.judge_night`` with the loop's run
policy (``--runs`` runs, one more while borderline, up to ``--max-runs``;
suspect nights pooled with the next). A night judged good is then checked
by ``nightly.judge_drift``: tonight and the baseline (the last
``--baseline-nights`` good nights), pooled, against the anchor (the
``--baseline-nights`` good nights before those).

* ``null``: ``--nights`` nights of one code. Any regressed night is a false
  alarm; counted apart for the baseline test and for the anchor check.
* ``absorbed``: ``--good-nights`` good nights, then a regression (one label
  of three times ``--factor``) whose first ``--absorbed`` nights are called
  good whatever their runs say (they drew low), then up to ``--nights``
  nights of it. Found: the first night judged regressed, by either test.

Values: three labels, log-normal (median 0.002, sigma 0.26: the KL test's
overlap model), the max over labels, as ``scripts/nightly_days.py``.

    python scripts/nightly_drift.py --trials 2000 --case null
    python scripts/nightly_drift.py --trials 2000 --case absorbed [--no-anchor]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from klbisect.nightly import judge_drift, judge_night


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
    ap.add_argument("--no-anchor", action="store_true", help="the rule before 2026-12-02: no anchor check")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    k = a.baseline_nights
    t0 = time.time()

    def run(reg: bool) -> float:
        v = 0.002 * np.exp(0.26 * rng.standard_normal(3))
        if reg:
            v[1] *= a.factor
        return float(v.max())

    def night(good: list[list[float]], suspects: list[list[float]], reg: bool, forced_good: bool):
        """(verdict, by): by is "baseline", "anchor" or "" for the test that called it."""
        head = [run(reg) for _ in range(a.runs)]
        baseline = [v for n in good[-k:] for v in n]
        anchor = [v for n in good[-2 * k:-k] for v in n]
        border = [v for n in suspects for v in n]
        while True:
            j = judge_night(head, baseline, border, alpha=a.alpha)
            if j.more and len(head) < a.max_runs:
                head.append(run(reg))
                continue
            break
        if forced_good:
            return "good", "", head
        if j.verdict == "good" and anchor and not a.no_anchor and judge_drift(head, baseline, anchor, a.alpha) is not None:
            return "regressed", "anchor", head
        return j.verdict, "baseline" if j.verdict == "regressed" else "", head

    stats = {"nights": 0, "anchored": 0, "by_baseline": 0, "by_anchor": 0, "histories_alarmed": 0}
    found_at: list[int | None] = []
    found_by: dict[str, int] = {"baseline": 0, "anchor": 0}
    for _ in range(a.trials):
        good: list[list[float]] = []
        suspects: list[list[float]] = []
        if a.case == "null":
            alarmed = False
            for _n in range(a.nights):
                anchored = len(good) > k
                v, by, head = night(good, suspects, False, False)
                stats["nights"] += 1
                stats["anchored"] += int(anchored and v in ("good", "regressed"))
                if v == "regressed":
                    stats[f"by_{by}"] += 1
                    alarmed = True
                    suspects = []       # a false alarm: its bisect finds nothing, the night stays out
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
              f"baseline {k} nights, alpha {a.alpha:g}; {took:.0f} s")
        n = stats["nights"]
        print(f"  nights judged: {n}; false alarms by the baseline test: {stats['by_baseline']} "
              f"({100 * stats['by_baseline'] / n:.3f}%)")
        print(f"  nights with an anchor: {stats['anchored']}; false alarms by the anchor check: {stats['by_anchor']} "
              f"({100 * stats['by_anchor'] / max(stats['anchored'], 1):.3f}% of them)")
        print(f"  histories with any false alarm: {stats['histories_alarmed']} of {a.trials}")
        return
    hits = [h for h in found_at if h is not None]
    print(f"absorbed: {a.trials} histories; one label of three x{a.factor:g} after {a.good_nights} good nights, "
          f"its first {a.absorbed} night(s) called good; {a.runs} runs a night (up to {a.max_runs}), "
          f"baseline {k} nights, alpha {a.alpha:g}; {took:.0f} s")
    print(f"  found within {a.nights} nights: {len(hits)} of {a.trials} "
          f"(by the baseline test {found_by['baseline']}, by the anchor check {found_by['anchor']})")
    if hits:
        q = np.percentile(np.array(hits) + 1, [50, 95])
        print(f"  night found (1 = the regression's first): median {q[0]:.0f}, 95th percentile {q[1]:.0f}")


if __name__ == "__main__":
    main()
