#!/usr/bin/env python
"""Which of issue 3's run-count targets any method could meet, model by model.

The targets: mean runs within 1.5x Fano's bound, and at least 4x fewer runs
than git-bayesect at equal or better accuracy. Both are numbers of runs, so
both can be set against what is possible. For each noise model of
``scripts/bench_bisect.py`` this prints:

``bound``      Fano's ((1 - delta) log2 N - 1) / C with C the capacity of one
               run (bench_bisect's ``bound`` column): no method right 99% of
               the time averages fewer runs.
``bayesect``   the real git-bayesect package stopping at 0.99 (mean runs and
               accuracy), and ``4x target``, a quarter of its mean.
``known``      klbisect's posterior search told the TRUE noise (bench_bisect's
               ``known`` strategy) at the lowest of the marks 0.99, 0.999 and
               0.9997 that is right at least 99% of the time: what the search
               costs with nothing to learn.
``verdict``    ``under the bound``: the 4x target is below Fano's bound, so no
               method can meet it; ``under known``: above the bound, but
               below what the search needs even when told the noise, so no
               amount of learning meets it, only a better search could;
               ``open``: the told search meets it, and what klbisect spends
               beyond the told search is the price of learning the noise.
``known/bound``  the 1.5x target for the told search.

Usage::

    python scripts/target_floor.py                       # every set, N = 1,000
    python scripts/target_floor.py --sets variants --models spikes --known-trials 50
    python scripts/target_floor.py --model "name=mine kind=lognormal good=0.004,0.3 bad=1.3,1.5"
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_bisect as bench  # noqa: E402
from klbisect import decide  # noqa: E402

MARKS = (0.99, 0.999, 0.9997)
ACCURACY = 0.99


def verdict(bound: float, target: float, known: float | None) -> str:
    """Where the 4x target falls: under Fano's bound, under the told search, or open."""
    if target < bound:
        return "under the bound"
    if known is None or target < known:
        return "under known"
    return "open"


def cheapest_sure(by_mark: dict) -> tuple[float, float, float] | None:
    """(mark, mean runs, accuracy) of the lowest mark right >= 99% of the time."""
    for mark in sorted(by_mark):
        ok, runs = by_mark[mark]
        if np.mean(ok) >= ACCURACY:
            return mark, float(np.mean(runs)), float(np.mean(ok))
    return None


def rows_for(results: dict, bits: dict, n: int) -> list[list[str]]:
    rows = []
    for key in results:
        set_name, model = key
        r = results[key]
        bound = decide.runs_lower_bound(n, bits[key], bench.DELTA)
        bay_ok, bay_runs = r["bayesect"]
        target = float(np.mean(bay_runs)) / 4
        known = cheapest_sure(r["known"])
        told = ["-"] * 4 if known is None else [f"{known[1]:.1f}", f"{known[0]:g}", f"{100 * known[2]:.1f}%",
                                               f"{known[1] / bound:.2f}x"]
        rows.append([set_name, model, f"{bound:.1f}", f"{np.mean(bay_runs):.1f}",
                     f"{100 * np.mean(bay_ok):.1f}%", f"{target:.1f}", *told,
                     verdict(bound, target, None if known is None else known[1])])
    return rows


def render(rows: list[list[str]]) -> list[str]:
    return bench._grid(["set", "model", "bound", "bayesect", "right", "4x target", "known", "mark", "right",
                        "known/bound", "verdict"], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sets", default="main,heldout,variants")
    ap.add_argument("--models", default=None, help="default: every model of each set")
    ap.add_argument("--model", dest="custom", action="append", default=[], metavar="SPEC",
                    help="your own noise model instead of the sets, as bench_bisect.py --model takes it")
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--known-trials", type=int, default=150)
    ap.add_argument("--bayesect-trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--write-docs", metavar="RST", default=None,
                    help="write the table and its command to this file (a new one, or one these "
                         "scripts wrote before: it is replaced whole)")
    a = ap.parse_args(argv)
    bench.writable_docs(ap, a.write_docs)
    bench.check_options(ap, [
        ("--commits", a.commits >= bench.MIN_COMMITS, f"give a size of at least {bench.MIN_COMMITS}"),
        ("--known-trials", a.known_trials >= 1, "give at least 1 trial per mark"),
        ("--bayesect-trials", a.bayesect_trials >= 1, "give at least 1 trial per model"),
        ("--jobs", a.jobs >= 1, "give at least 1 worker"),
    ])
    sets = [s for s in a.sets.split(",") if s]
    if a.custom:
        try:
            bench.register_custom(a.custom)
        except ValueError as e:
            ap.error(str(e))
        sets = ["custom"]
    for s in sets:
        if s not in bench.SETS or (s == "custom" and not a.custom):
            ap.error(f"unknown set {s!r}; choose from main,heldout,variants")
    wanted = None if a.models is None else set(a.models.split(","))
    keys = [(s, m) for s in sets for m in bench.SETS[s] if wanted is None or m in wanted]
    if not keys:
        ap.error(f"no model named {a.models!r} in {a.sets}")
    bench.check_room(ap, [bench.SETS[s][m] for s, m in keys], a.commits)

    tmp = tempfile.mkdtemp(prefix="klb-floor-")
    base = dict(tmp=tmp, bayesect_repos=True, bayesect_confidence=0.99, bayesect_max_runs=3000,
                bayesect_trials=a.bayesect_trials, endpoint_runs=None, confidence=0.99, constants=())
    jobs, tags = [], []
    for s, m in keys:
        for t in range(a.bayesect_trials):
            jobs.append(bench.job(s, m, a.commits, "bayesect", t, a.seed, base))
            tags.append((s, m, "bayesect", None))
        for mark in MARKS:
            opts = dict(base, confidence=mark)
            for t in range(a.known_trials):
                jobs.append(bench.job(s, m, a.commits, "known", t, a.seed, opts))
                tags.append((s, m, "known", mark))
    t0 = time.time()
    out = bench.run_jobs(jobs, a.jobs, tmp)
    elapsed = time.time() - t0

    results: dict = {}
    for (s, m, strat, mark), o in zip(tags, out):
        r = results.setdefault((s, m), {"bayesect": ([], []), "known": {}})
        ok_runs = r["bayesect"] if strat == "bayesect" else r["known"].setdefault(mark, ([], []))
        ok_runs[0].append(o.ok)
        ok_runs[1].append(o.runs)
    bits = {k: bench.SETS[k[0]][k[1]].bits_per_run() for k in keys}
    lines = render(rows_for(results, bits, a.commits))
    header = (bench.machine_header("target_floor.py", argv, a.jobs, elapsed)
              + f"; N = {a.commits:,}; git-bayesect at 0.99, {a.bayesect_trials} trials; "
              f"known at {', '.join(f'{m:g}' for m in MARKS)}, {a.known_trials} trials")
    bench.emit(header, lines, a.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
