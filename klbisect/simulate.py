"""A whole ``klbisect run`` with one slot, step for step, against a function
that plays the probe: the endpoint policy, the search and its stopping
rules, with nothing from git, processes or the network. ``calibrate``
replays it on resampled runs to price a bisect, and the benchmarks on
simulated noise models."""
from __future__ import annotations

from typing import Callable, Container

from .decide import MAX_ENDPOINT_RUNS, MAX_TOTAL_RUNS, MIN_ENDPOINT_RUNS, Model, endpoint_crash_limit, endpoint_step
from .search import CommitRuns, plan


def simulate_bisect(n: int, run: Callable[[int], float | None], untestable: Container[int] = (),
                    confidence: float = 0.99, endpoint_runs: int = MIN_ENDPOINT_RUNS,
                    max_endpoint_runs: int = MAX_ENDPOINT_RUNS, max_runs: int | None = None,
                    crash_limit: int = 2, max_total_runs: int = MAX_TOTAL_RUNS,
                    why: list[str] | None = None) -> tuple[list[int] | None, int]:
    """(the block named, or None when the search gave up; probe runs spent)
    over commits 0..n, 0 good and n bad. ``run(i)`` is one probe run at
    commit i: its value, or None for a crash; a commit in ``untestable``
    fails its build and is never run. ``why`` gets why it gave up, as the
    session would say it (a benchmark's wrong trials name it)."""

    def gave_up(reason: str) -> tuple[None, int]:
        if why is not None:
            why.append(reason)
        return None, runs
    commits = [CommitRuns([]) for _ in range(n + 1)]
    runs = 0

    def measure(i: int) -> None:
        nonlocal runs
        if i in untestable:
            commits[i].build_failed = True
            return
        runs += 1
        v = run(i)
        if v is None:
            commits[i].crashes += 1
        else:
            commits[i].values.append(v)

    while True:                                        # endpoints.calibrate_endpoints
        g, b = commits[0], commits[n]
        if any(not c.values and c.crashes >= endpoint_crash_limit(crash_limit, o.crashes, o.crashes + len(o.values))
               for c, o in ((g, b), (b, g))):
            return gave_up("154, an endpoint printed no value")
        step = endpoint_step(g.values, b.values, endpoint_runs, max_endpoint_runs)
        if step.action == "ready":
            model = Model.fit(g.values, b.values)
            break
        if step.action == "fail":
            return gave_up(f"154, the endpoints do not separate after {len(g.values)}+{len(b.values)} runs")
        for k in range(max(step.more_good, step.more_bad)):
            for i, m in ((0, step.more_good), (n, step.more_bad)):
                if k < m:
                    measure(i)
    while True:
        pl = plan(commits, model, confidence, k=1, max_runs=max_runs, crash_limit=crash_limit,
                  max_endpoint_runs=max_endpoint_runs)
        if pl.done:
            return list(pl.done.indices), runs
        if pl.lost is not None:
            return gave_up(f"154, the endpoints no longer differ after {len(commits[0].values)}+"
                           f"{len(commits[n].values)} runs")
        if runs >= max_total_runs:
            return gave_up(f"157, --max-total-runs {max_total_runs}")
        if not pl.next:
            return gave_up("157, no commit left whose runs could raise the confidence")
        measure(pl.next[0])
