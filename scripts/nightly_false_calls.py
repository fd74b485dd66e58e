"""How often a night with an open regression is called wrong, on plain numbers.

After ``klbisect nightly`` finds a regression, each later night is judged
against the runs of the head that found it: "fixed" when tonight is shown
better (the head then joins the baseline), "worse again" when shown worse
(a second bisect and report). Neither happens in these trials: every night
after the regression is the same regressed code. Each trial draws a
baseline, draws nights of the regression until one is judged regressed
(the night that "finds" it), then judges ``--known-nights`` more nights of
the same code through ``nightly.judge_night`` with the real loop's rules
(one more run while borderline, up to 10; the thin side measured again).

The reference is either ``found``, the runs of the night that found it
(they came out high, which is partly why that night was found), or
``fresh``, ``--fresh`` runs of that head measured afterwards (what
``nightly`` judges against since 2026-12-02).

Values: three labels, log-normal (median 0.002, sigma 0.26), one of which
the regression multiplies by ``--factor``; the metric is the max over
labels, and the open regression is judged on the moved label, as a bisect
that judged that label leaves it.

    python scripts/nightly_false_calls.py --trials 1000 --reference found
    python scripts/nightly_false_calls.py --trials 1000 --reference fresh
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from klbisect.nightly import judge_night

CAP = 10


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--known-nights", type=int, default=6)
    ap.add_argument("--reference", choices=("found", "fresh"), default="fresh")
    ap.add_argument("--fresh", type=int, default=6)
    ap.add_argument("--factor", type=float, default=1.6)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    t0 = time.time()

    def run(reg: bool) -> np.ndarray:
        v = 0.002 * np.exp(0.26 * rng.standard_normal(3))
        if reg:
            v[1] *= a.factor
        return v

    def night(base: list[float], ref: list | None, border: list[float]):
        head = [run(True) for _ in range(3)]
        ref = list(ref) if ref is not None else None
        tries = 0
        while True:
            mx = [float(h.max()) for h in head]
            if ref is None:
                j = judge_night(mx, base, border or None)
            else:
                j = judge_night(mx, base, None, [float(r[1]) for r in ref], open_head=[float(h[1]) for h in head])
            if j.more and len(head) < CAP:
                head.append(run(True))
            elif j.more and j.other_side == "open" and tries < CAP and len(ref) < len(head) + CAP:
                ref.append(run(True))
                tries += 1
            elif j.more and j.other_side == "baseline" and tries < CAP:
                base = base + [float(run(False).max())]
                tries += 1
            else:
                return j, head, ref, base

    fixed = worse = nights = found_runs = 0
    for _ in range(a.trials):
        base = [float(run(False).max()) for _ in range(15)]
        ref, border = None, []
        for _ in range(8):
            j, head, _, base = night(base, None, border)
            if j.verdict == "regressed":
                ref = head if a.reference == "found" else [run(True) for _ in range(a.fresh)]
                break
            if j.verdict == "suspect":
                border += [float(h.max()) for h in head]
        if ref is None:
            continue
        found_runs += len(ref)
        for _ in range(a.known_nights):
            j, _, ref, _ = night(base, ref, [])
            nights += 1
            fixed += j.verdict == "good"
            worse += j.verdict == "regressed"
    print(f"reference {a.reference}: {nights} known nights of an unchanged x{a.factor:g} regression "
          f"(reference {found_runs / max(a.trials, 1):.1f} runs to start)")
    print(f"  called fixed:       {fixed} ({100 * fixed / max(nights, 1):.3f}%)")
    print(f"  called worse again: {worse} ({100 * worse / max(nights, 1):.3f}%)")
    print(f"  {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
