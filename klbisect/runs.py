"""Which recorded runs count as measurements, and how a run is shown.

A run that printed a value may still be a crash: it timed out, or failed
before printing every label the other runs print, so its max over labels
misses the one that moved. These rules are shared by the search, the
progress lines, status, calibrate and the nightly job; pure functions over
``store.Run`` records, no git, no processes.
"""
from __future__ import annotations

import statistics

from .metric import fmt_value

STATUS_OK = "ok"
STATUS_CRASH = "crash"
STATUS_TIMEOUT = "timeout"
STATUS_NOTFOUND = "notfound"
# printed values, then failed its own assertion: a measurement even if it
# stopped before its later labels (their max can only be higher)
STATUS_FAILED = "failed"
# a server probe whose server never came up: a crash the session tells apart (two in a row stop)
STATUS_NOSERVER = "noserver"
CRASHED = (STATUS_CRASH, STATUS_NOSERVER)

MEASURED = (STATUS_OK, STATUS_FAILED)   # the statuses of runs whose values count in full


def usual_labels(runs, counts: dict[frozenset, list[int]] | None = None) -> frozenset:
    """The label set most runs print (ties: the larger), among the runs
    that exited 0 when there are any. ``counts`` carries the tally from one
    call to the next, for runs that come one at a time. Runs that stopped
    on their own assertion are left out: they end short by design, and
    where they were the most, a run that crashed after the same first label
    looked complete and counted (a tester's: 6 of 20). Runs that crashed
    after some labels count only where no run exited 0: a broken NCCL that
    killed every run of a night after its first label outvoted three
    nights of complete runs, and the night read good past a regression."""
    counts = {} if counts is None else counts
    for r in runs:
        if r.values and r.status == STATUS_OK:
            tally = counts.setdefault(frozenset(r.values), [0, 0])
            tally[0] += r.exit_code == 0     # None: stopped by klbisect, not a clean exit
            tally[1] += 1
    clean = any(t[0] for t in counts.values())
    return max(counts, key=lambda k: (counts[k][0] if clean else counts[k][1], len(k)), default=frozenset())


def cut_off(run, usual: frozenset, typical: dict[str, float] | None = None, worse: str = "higher") -> bool:
    """A run that failed before printing every label the others print: its
    max over labels misses the ones it never reached, so it is a crash, not a
    low value. A failed assertion is a measurement, even one that stopped the
    test before its later labels, while those labels (their ``typical``
    values) sit on the good side of the value it printed: they could only
    make it worse. One that usually sets the max (the min, for --worse
    lower: an accuracy test that stops on its first low label, before a
    label that always reads lower) would have made it look better than the
    complete runs, a regression read as a fix. A run that exits 0 with
    fewer labels skipped them on purpose."""
    if not usual or run.exit_code == 0 or not frozenset(run.values) < usual:
        return False
    return run.status != STATUS_FAILED or bool(missed_worse(run, typical, worse))


def missed_worse(run, typical: dict[str, float] | None, worse: str) -> list[str]:
    """The labels a run never reached whose typical values lie the worse
    way from the value it printed: what makes an assertion-stopped run a
    crash."""
    low = worse == "lower"
    return sorted(k for k, t in (typical or {}).items()
                  if k not in run.values and ((t < run.value) if low else (t > run.value)))


def typical_values(runs, usual: frozenset) -> dict[str, float]:
    """Each label's median over the runs that printed every usual label."""
    seen: dict[str, list[float]] = {}
    for r in runs:
        if usual and frozenset(r.values) >= usual:
            for k in usual:
                seen.setdefault(k, []).append(r.values[k])
    return {k: statistics.median(v) for k, v in seen.items()}


def valued_runs(runs: list, metric: str | None, worse: str = "higher", among: list | None = None) -> list:
    """The runs whose value counts, as ``commit_runs`` counts them: not
    timed out, and not cut off short of the labels the others print (the
    others: ``among``, default ``runs``)."""
    usual = usual_labels(among if among is not None else runs) if metric is None else frozenset()
    typical = typical_values(among if among is not None else runs, usual)
    return [r for r in runs if value_counts(r, usual, typical, worse)]


def value_counts(run, usual: frozenset, typical: dict[str, float] | None = None, worse: str = "higher") -> bool:
    return (run.value is not None and run.status != STATUS_TIMEOUT
            and not cut_off(run, usual, typical, worse))


_STATUS_SHOWN = {STATUS_NOSERVER: "its server did not start", STATUS_NOTFOUND: "command not found"}


def status_words(status: str) -> str:
    """A run's status as a progress line says it."""
    return _STATUS_SHOWN.get(status, status)


def run_shown(run, usual: frozenset, metric: str | None, typical: dict[str, float] | None = None,
              worse: str = "higher") -> tuple[str, bool]:
    """One run as a progress line shows it, and whether it counts as a
    crash (as commit_runs judges it): a value the run printed before it
    timed out or failed short of its labels is named with what became of it."""
    if run.value is None:
        if run.status in MEASURED and metric:
            return f"no value for --metric {metric}", True
        # "(crash)" for a probe that exited 0 read as a probe that crashed (a tester's)
        return ("no value (exit 0, printed none)" if run.status == STATUS_CRASH and run.exit_code == 0
                else f"no value ({status_words(run.status)})"), True
    if run.status == STATUS_TIMEOUT:
        return f"{fmt_value(run.value)}, then timed out: counted as a crash", True
    if metric is None and cut_off(run, usual, typical, worse):
        missed = missed_worse(run, typical, worse)
        why = (f", short of {missed[0]}, which reads {'lower' if worse == 'lower' else 'higher'} in complete runs"
               if run.status == STATUS_FAILED and missed else "")
        return (f"{fmt_value(run.value)} from {len(run.values)} of {len(usual)} labels, then "
                f"exit {run.exit_code}{why}: counted as a crash"), True
    return fmt_value(run.value), False


def repeated_runs(good: list[float], bad: list[float]) -> str | None:
    """A probe whose runs repeat to the last digit: a fixed seed (SGLang's
    --random-seed, a test that seeds its sampling) makes every run of a
    commit one draw, counted as many (a tester's 19 launches all read
    0.005017 at good, 0.008863 at bad, and the answer claimed 0.9992)."""
    for side, values in (("good", good), ("bad", bad)):
        # 0 every time is an exact match (deterministic inference), not a repeated draw
        if len(values) >= 3 and len(set(values)) == 1 and values[0] != 0:
            return (f"the {side} endpoint's {len(values)} runs all read {fmt_value(values[0])} exactly: the probe "
                    "repeats itself (a fixed seed: --random-seed in --server-args, or a test that seeds its "
                    "sampling), so each commit's runs are one draw counted as many, and the confidence overstates "
                    "what they show; drop the seed so that each run samples anew (a probe deterministic by design "
                    "can ignore this)")
    return None


def failed_launches(runs) -> int:
    """How many of these runs' servers never started."""
    return sum(1 for r in runs if r.status == STATUS_NOSERVER)


def cut_short(run, timeout: float | None) -> bool:
    """A run stopped by a shorter --timeout than the one in force now."""
    return (timeout is not None and run.status == STATUS_TIMEOUT and run.duration is not None
            and run.duration < 0.99 * timeout)
