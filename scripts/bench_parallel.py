#!/usr/bin/env python
"""How much do P parallel probes shorten a bisect? Rounds and wall time for
P = 1, 2, 4, 8 over 1,000 commits, against the ideal of log2(N)/log2(P+1)
rounds for decisive probes.

Two modes:

``sim`` (default): the real search (``search.plan`` with ``k`` = free slots
and ``pending`` = commits in flight, exactly as ``session._run_locked`` calls
it) on an event clock. Every probe takes ``--duration`` seconds (with
``--jitter``, uniformly up to that fraction longer), results are taken as
they arrive and freed slots refilled at once, the search stops when the
top candidate block holds ``--confidence`` and nothing is in flight. Runs of
the two endpoints are given at the start (``--endpoint-runs`` each), so the
numbers count the search only. Noise regimes:

* ``decisive``: threshold mode (one run decides a commit), the setting of
  the ideal;
* ``clean``: the learned model, values uniform in [0.003, 0.006] (good) and
  [0.007, 0.013] (bad), as the generated histories draw them;
* ``noisy``: the learned model, lognormal values with overlapping tails
  (median 0.0045 vs 0.0070, sigma_log 0.25) and 2% outliers.

``real``: ``klbisect run`` itself (``run_bisect`` with the local executor)
on a generated 1,000-commit history (``histgen``), with a probe that sleeps
``--duration`` seconds and then runs the history's probe; endpoint
calibration included, wall time measured. Its rounds are the wall time
divided by the mean probe run time (results arrive a little apart, so the
number of submission batches, also shown, overstates the rounds).

Round: one dispatch of probes to free slots. With fixed durations and no
jitter all P slots finish together, so rounds = wall time / duration.
"""
from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from klbisect.decide import MAX_TOTAL_RUNS, MIN_ENDPOINT_RUNS, Model, ThresholdModel
from klbisect.search import CommitRuns, plan

REGIMES = {
    "decisive": dict(kind="uniform", good=(0.003, 0.006), bad=(0.007, 0.013), outliers=0.0),
    "clean": dict(kind="uniform", good=(0.003, 0.006), bad=(0.007, 0.013), outliers=0.0),
    "noisy": dict(kind="lognormal", good=(0.0045, 0.25), bad=(0.0070, 0.25), outliers=0.02),
}


def draw(rng: random.Random, regime: dict, bad: bool) -> float:
    a, b = regime["bad"] if bad else regime["good"]
    v = rng.uniform(a, b) if regime["kind"] == "uniform" else a * math.exp(b * rng.gauss(0, 1))
    if rng.random() < regime["outliers"]:
        v *= rng.uniform(3, 10)
    return v


def simulate(n: int, parallel: int, regime_name: str, seed: int, duration: float, jitter: float,
             confidence: float, endpoint_runs: int, max_runs: int, max_total_runs: int = MAX_TOTAL_RUNS) -> dict:
    rng = random.Random(seed)
    regime = REGIMES[regime_name]
    culprit = rng.randint(1, n)
    commits = [CommitRuns([]) for _ in range(n + 1)]
    commits[0].values = [draw(rng, regime, False) for _ in range(endpoint_runs)]
    commits[n].values = [draw(rng, regime, True) for _ in range(endpoint_runs)]
    model = (ThresholdModel(0.0065) if regime_name == "decisive"
             else Model.fit(commits[0].values, commits[n].values))
    clock, runs, rounds = 0.0, 0, 0
    in_flight: list[tuple[float, int, int]] = []   # (finish time, seq, commit)
    seq = 0
    while True:
        pending = [i for _, _, i in in_flight]
        free = parallel - len(in_flight)
        pl = plan(commits, model, confidence, k=max(free, 1), max_runs=max_runs, pending=pending)
        if pl.done and not in_flight:
            break
        if not pl.done and not in_flight and (not pl.next or runs >= max_total_runs):
            break   # nothing left to ask, or the session's --max-total-runs
        if pl.next and free and not pl.done and runs + len(in_flight) < max_total_runs:
            rounds += 1
            for i in pl.next[:free]:
                d = duration * (1 + jitter * rng.random())
                heapq.heappush(in_flight, (clock + d, seq, i))
                seq += 1
        # take what finishes next (and everything finishing at the same moment)
        t, _, i = heapq.heappop(in_flight)
        done = [i]
        while in_flight and in_flight[0][0] <= t + 1e-9:
            done.append(heapq.heappop(in_flight)[2])
        clock = t
        for i in done:
            commits[i].values.append(draw(rng, regime, i >= culprit))
            runs += 1
    top = pl.done or pl.posterior.top()
    return {"rounds": rounds, "wall": clock, "runs": runs, "correct": culprit in top.indices,
            "done": pl.done is not None}


def run_sim(args) -> list[dict]:
    rows = []
    for regime in args.regimes:
        for p in args.parallel:
            t0 = time.time()
            res = [simulate(args.commits, p, regime, args.seed + k, args.duration, args.jitter,
                            args.confidence, args.endpoint_runs, args.max_runs, args.max_total_runs)
                   for k in range(args.trials)]
            rows.append({
                "regime": regime, "P": p,
                "rounds": float(np.mean([r["rounds"] for r in res])),
                "rounds_max": max(r["rounds"] for r in res),
                "wall": float(np.mean([r["wall"] for r in res])),
                "runs": float(np.mean([r["runs"] for r in res])),
                "correct": sum(r["correct"] for r in res), "trials": len(res),
                "done": sum(r["done"] for r in res),
                "wrong_done": sum(r["done"] and not r["correct"] for r in res),
                "ideal": math.log2(args.commits) / math.log2(p + 1),
                "cpu": time.time() - t0,
            })
            print(f"  {regime} P={p}: {rows[-1]['rounds']:.1f} rounds ({rows[-1]['cpu']:.1f}s)",
                  file=sys.stderr, flush=True)
    base = {r["regime"]: r["wall"] for r in rows if r["P"] == 1}
    for r in rows:
        r["speedup"] = base.get(r["regime"], float("nan")) / r["wall"] if r["wall"] else float("nan")
    return rows


def run_real(args) -> list[dict]:
    from klbisect.executors import LocalExecutor  # noqa: PLC0415
    from klbisect.histgen import make_history  # noqa: PLC0415
    from klbisect.config import BisectConfig  # noqa: PLC0415
    from klbisect.session import run_bisect  # noqa: PLC0415

    rows = []
    with tempfile.TemporaryDirectory(prefix="klb-bench-") as tmp:
        h = make_history(Path(tmp) / "repo", n_commits=args.commits + 1, seed=args.seed, merges=10)
        for p in args.parallel:
            batches = {"n": 0, "since_wait": False}

            def factory(cfg, slots, measurer, ws, _b=batches):
                ex = LocalExecutor(slots, measurer.measure)
                submit, wait = ex.submit, ex.wait

                def counted_submit(sha):
                    if not _b["since_wait"]:
                        _b["n"] += 1
                        _b["since_wait"] = True
                    submit(sha)

                def counted_wait(timeout=None):
                    _b["since_wait"] = False
                    return wait(timeout)
                ex.submit, ex.wait = counted_submit, counted_wait
                return ex
            cfg = BisectConfig(
                good=h.good, bad=h.bad, metric="prefill_cache_hit", parallel=p,
                probe_cmd=f'python -c "import time; time.sleep({args.duration})" && python probe.py',
                confidence=args.confidence, max_runs=args.max_runs)
            # a fresh state per P: forget the runs of the previous P
            import shutil  # noqa: PLC0415
            shutil.rmtree(h.path / ".git" / "klbisect", ignore_errors=True)
            t0 = time.time()
            res = run_bisect(h.path, cfg, progress=lambda m: None, executor_factory=factory)
            wall = time.time() - t0
            # rounds: how many probe durations the wall time amounts to (results
            # arrive a little apart, so counting submission batches overstates it)
            per_probe = res.probe_seconds / max(res.probe_runs, 1)
            rounds = wall / per_probe
            rows.append({"regime": "real (histgen)", "P": p, "rounds": rounds, "rounds_max": batches["n"],
                         "wall": wall, "runs": res.probe_runs, "correct": int(res.culprit == h.culprit),
                         "trials": 1, "ideal": math.log2(args.commits) / math.log2(p + 1), "cpu": wall})
            print(f"  real P={p}: {rounds:.1f} rounds ({batches['n']} batches), {wall:.1f}s, "
                  f"{per_probe:.2f}s per probe", file=sys.stderr, flush=True)
    base = rows[0]["wall"]
    for r in rows:
        r["speedup"] = base / r["wall"]
    return rows


def table(rows: list[dict], duration: float, real: bool) -> str:
    head = ["regime", "P", "rounds (wall/probe)" if real else "rounds (mean)",
            "submit batches" if real else "rounds (max)", "ideal log2(N)/log2(P+1)", "runs",
            "wall s" if real else f"wall s (probe {duration:g} s)", "speed-up vs P=1", "correct",
            "confident (wrong)"]
    body = [[r["regime"], str(r["P"]), f"{r['rounds']:.1f}", str(r["rounds_max"]), f"{r['ideal']:.1f}",
             f"{r['runs']:.1f}", f"{r['wall']:.0f}", f"{r['speedup']:.2f}x",
             f"{r['correct']}/{r['trials']}",
             f"{r.get('done', r['correct'])} ({r.get('wrong_done', 0)})"] for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
    sep = "  ".join("=" * w for w in widths)
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([sep, fmt(head), sep, *(fmt(b) for b in body), sep])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["sim", "real"], default="sim")
    ap.add_argument("--commits", type=int, default=1000)
    ap.add_argument("--parallel", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--regimes", nargs="+", choices=sorted(REGIMES), default=["decisive", "clean", "noisy"])
    ap.add_argument("--trials", type=int, default=20, help="sim: bisects (random culprits) per row")
    ap.add_argument("--duration", type=float, default=600.0,
                    help="seconds per probe (sim: simulated; real: slept by the probe)")
    ap.add_argument("--jitter", type=float, default=0.0, help="sim: probes take up to this fraction longer")
    ap.add_argument("--confidence", type=float, default=0.99)
    ap.add_argument("--endpoint-runs", type=int, default=MIN_ENDPOINT_RUNS)
    ap.add_argument("--max-runs", type=int, default=None, help="per commit (default: the model's, as klbisect run)")
    ap.add_argument("--max-total-runs", type=int, default=MAX_TOTAL_RUNS, help="sim: stop like the session does")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    rows = run_real(args) if args.mode == "real" else run_sim(args)
    print(table(rows, args.duration, args.mode == "real"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
