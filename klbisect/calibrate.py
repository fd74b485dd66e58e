"""`klbisect calibrate`: measure one commit many times and say what its
metric's distribution supports: percentiles, exceedance counts, a threshold
for a chosen false-failure rate, and what a bisect would cost.

Thresholds get relaxed from run statistics ("N runs, k above x"); this is
the tool that produces those statistics, resumably, in the same run store.
"""
from __future__ import annotations

import contextlib
import math
import re
import time
from dataclasses import asdict, dataclass, field
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Callable

import numpy as np

from . import repo as gitrepo
from .buildenv import close_builder, hold_env
from .config import BisectConfig, make_builder, make_probe
from .decide import (MAX_TOTAL_RUNS, NO_THRESHOLD_REACHES, OUTLIER_ALPHA, Model, bits_interval, endpoint_crash_limit,
                     exceedance_lower_bound, exceedance_upper_bound, exceedances, high_outliers, info_per_run,
                     recommend_threshold, runs_lower_bound, sample_bits, separation, summarize, worse_tail)
from .endpoints import ended_on_errors, endpoint_problem
from .errors import EXIT_NO_SIGNAL, EXIT_REVISION, EXIT_USAGE, KlbisectError
from .labels import clearer_label, label_hint, silent_when_passing
from .metric import broke, fmt_count, fmt_value, over_labels, scalar
from .runs import run_shown, typical_values, usual_labels, valued_runs
from .simulate import simulate_bisect
from .workspace import Progress, Workspace, WorktreeMeter, commit_runs, note_stop, since, to_stderr


@dataclass
class LabelStats:
    label: str
    summary: dict
    exceedances: list[dict]
    recommended: float | None
    recommended_how: str
    # a bad commit's label: how often it fails the good commit's recommended
    # threshold, i.e. how often one CI run would catch the regression
    catch: dict | None = None
    # what the runs alone say of the recommended threshold's true false-failure rate
    # (recommendation_bound), whatever the estimator that chose it
    recommended_bound: dict | None = None


@dataclass
class CostEstimate:
    commits: int
    bits_per_run: float           # from the two samples (decide.sample_bits): what the limit is built on
    lower_bound_runs: float
    simulated_mean_runs: float
    simulated_p95_runs: float
    simulated_accuracy: float
    trials: int
    model_bits: float = float("nan")  # as the search's model weighs a run drawn from its own location fit
    disjoint: bool = False        # the runs of the two commits never overlapped
    bits_interval: list[float] | None = None  # a bootstrap range of bits_per_run (decide.bits_interval)
    capped: int = 0               # simulated bisects stopped at max_runs: the mean is a floor
    max_runs: int = MAX_TOTAL_RUNS
    sample: int = 0               # the fewer of the two commits' runs the estimate resamples (0: not known)


@dataclass
class Calibration:
    rev: str
    sha: str
    runs: int
    crashes: int
    labels: list[LabelStats]
    false_fail_rate: float
    confidence: float
    bad_sha: str | None = None
    bad_labels: list[LabelStats] = field(default_factory=list)
    cost: CostEstimate | None = None
    bad_crashes: int = 0
    notes: list[str] = field(default_factory=list)
    bad_runs: int = 0             # the bad commit's runs with values counted (0: stored before it was kept)
    worse: str = "higher"         # lower: an accuracy, failing at or below its threshold
    interrupted: bool = False     # Ctrl-C in the cost estimate: the report stands without it
    used_runs: list[int] = field(default_factory=list)   # the runs counted, by id: `status` and `log` show them

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Calibration":
        """The stored result back (``status`` shows the latest calibration)."""
        d = dict(d)
        d["labels"] = [LabelStats(**x) for x in d["labels"]]
        d["bad_labels"] = [LabelStats(**x) for x in d.get("bad_labels") or []]
        d["cost"] = CostEstimate(**d["cost"]) if d.get("cost") else None
        return cls(**d)


def default_thresholds(values: list[float]) -> list[float]:
    """Round numbers around the observed upper tail (0.003, 0.005, ...)."""
    if not values:
        return []
    hi = max(values)
    lo = float(np.percentile(values, 25))
    if hi <= 0:
        return []
    exp = math.floor(math.log10(hi))
    cands = sorted({round(m * 10 ** e, 12) for e in (exp - 1, exp, exp + 1) for m in (1, 2, 3, 5, 7)})
    return [c for c in cands if lo <= c <= 2 * hi][:8]


FEW_FOR_TAILS = 20   # runs before a label's line shows its 5th and 95th percentiles

MAX_LABEL = "(max over labels)"
MIN_LABEL = "(min over labels)"


def low_thresholds(values: list[float]) -> list[float]:
    """Round numbers in the lower tail, for a metric that fails low (an
    accuracy): steps of the spread's order of magnitude (0.005 for runs
    from 0.79 to 0.81), up to the 75th percentile."""
    if not values:
        return []
    lo, hi = min(values), float(np.percentile(values, 75))
    spread = hi - lo
    if not spread > 0:
        return [lo]
    step = 10 ** math.floor(math.log10(spread)) / 2
    top = math.floor(hi / step)
    cands = [round(k * step, 12) for k in range(top - 20, top + 1)]
    return [c for c in cands if c >= lo - 3 * spread][-8:]


def turner(values: list[float]) -> Callable[[float], float]:
    """How a metric worse lower is turned so that worse is higher (the
    statistics here count runs at or above a threshold): 1/x when every
    value is above 0, so the log-normal tail fit reads x's lower tail,
    else -x. Either is its own inverse; a nan stays the worst value, now
    the highest."""
    pos = all(v > 0 for v in values if not broke(v))
    f = (lambda v: 1.0 / v) if pos else (lambda v: -v)
    return lambda v: v if broke(v) else f(v)


def turned_back(ls: LabelStats, turn: Callable[[float], float], summary: dict) -> LabelStats:
    """``label_stats`` of turned values, read back in the metric's own terms
    (``summary`` from its own values): thresholds turned back, "at or
    above" now meaning at or below."""
    def back(t: float) -> float:
        return float(f"{turn(t):.12g}")     # 1/(1/0.013) is 0.013000000000000001
    ex = sorted(({**e, "threshold": back(e["threshold"])} for e in ls.exceedances), key=lambda e: e["threshold"])
    # the good row's recommendation, printed as that row prints it (a tester saw 0.7674 there, 0.7675 here)
    catch = {**ls.catch, "threshold": round_up(turn(ls.catch["threshold"]), down=True)} if ls.catch else None
    label = MIN_LABEL if ls.label == MAX_LABEL else ls.label
    how = ls.recommended_how.replace(f"[{MAX_LABEL}]", f"[{MIN_LABEL}]")
    # the tail fit's point estimate, written in the turned terms
    how = re.sub(r"(estimate of the level is )([-+0-9.eE]+)", lambda m: m.group(1) + fmt_value(turn(float(m.group(2)))),
                 how)
    # a metric failing at or below it: rounded down where it is printed, as a KL's is up
    rec = None if ls.recommended is None else round_up(turn(ls.recommended), down=True)
    return LabelStats(label, summary, ex, rec, how, catch, ls.recommended_bound)


def own_summaries(values_by_run: list[dict]) -> dict[str, dict]:
    """Per label, and for the min over labels, the summary of a metric worse
    lower in its own terms."""
    def one(vals: list[float]) -> dict:
        finite = [v for v in vals if not broke(v)]
        return {**summarize(finite), "nan": len(vals) - len(finite)}
    labels = sorted({k for d in values_by_run for k in d})
    out = {lab: one([d[lab] for d in values_by_run if lab in d]) for lab in labels}
    if len(labels) > 1:
        out[MIN_LABEL] = one([scalar(d, worse="lower") for d in values_by_run if d])
    return out


def round_up(x: float, digits: int = 4, down: bool = False) -> float:
    """``x`` rounded up to the ``digits`` significant digits fmt_value prints: a
    threshold printed rounded down could fall below the run it must clear, and
    CI fails at or above the number it is given."""
    d = Decimal(repr(x))
    if not d.is_finite() or d == 0:
        return x
    # the nearest float to a decimal at or above x is still at or above x (x is a float)
    return float(d.quantize(Decimal(1).scaleb(d.adjusted() - digits + 1),
                            rounding=ROUND_FLOOR if down else ROUND_CEILING))


def runs_for_bound(rate: float, confidence: float) -> int:
    """Fewest runs that can bound a false-failure rate at ``rate`` with
    ``confidence`` whatever the distribution: the smallest n with
    1 - (1 - rate)^n >= confidence, where a threshold above all n runs is
    the order statistic that bounds it (459 for 0.01 at 0.99)."""
    n = max(1, math.ceil(math.log1p(-confidence) / math.log1p(-rate)))
    # the logarithms can round across an integer: settle on the exact condition
    while n > 1 and 1 - (1 - rate) ** (n - 1) >= confidence:
        n -= 1
    while 1 - (1 - rate) ** n < confidence:
        n += 1
    return n


def recommendation_bound(values: list[float], threshold: float, rate: float, confidence: float) -> dict:
    """The upper bound the runs alone put on a recommended threshold's true
    false-failure rate, so that a log-normal fit's threshold is held to it
    too: ``distribution_free`` says whether it reaches ``rate``. Clopper-
    Pearson on k of n runs at or above it is exact, whatever the
    distribution, for an order statistic picked by rank and for any
    threshold above every run (k = 0, a tail fit's usual place): the rate
    there is at most the top run's, a uniform order statistic."""
    (_, k, n), = exceedances(values, [threshold])
    b = exceedance_upper_bound(k, n, confidence)
    return {"above": k, "runs": n, "rate_upper_bound": b, "distribution_free": b <= rate * (1 + 1e-9),
            "runs_for_bound": runs_for_bound(rate, confidence)}


def raise_to_labels(max_rec: float | None, label_recs: dict[str, float | None]) -> tuple[float | None, str | None]:
    """The max over labels' threshold, raised to the highest label's. The
    max is at or above every label in every run, so its quantile is at
    least each label's; its own estimate can land lower, though: a
    log-normal fit to a max of differently shaped labels misses the widest
    label's tail, and a label's order statistic can come from runs the max
    lacks (a nan in another label). Raising keeps a valid bound valid,
    lowering a label would not. Returns (threshold, the label raised to or
    None)."""
    top = max(((r, lab) for lab, r in label_recs.items() if r is not None), default=None)
    if top is None or (max_rec is not None and max_rec >= top[0]):
        return max_rec, None
    return top


def label_stats(values_by_run: list[dict], thresholds: list[float] | None, rate: float,
                confidence: float, good: list[LabelStats] | None = None,
                candidates: Callable[[list[float]], list[float]] = default_thresholds) -> list[LabelStats]:
    """Per label: percentiles, exceedances and a recommended threshold; with
    ``good`` (the good commit's labels) these are a bad commit's runs, so
    instead of a threshold of their own they get how often they fail the
    good commit's, with a lower bound on that rate.

    With two labels or more, a row for their max comes last: a KL test
    fails when any label fails, so one threshold's false-failure rate for
    the whole test is the max's, not any one label's (and the max is what
    a bisect judges unless --metric picks a label)."""
    labels = sorted({k for d in values_by_run for k in d})
    if len(labels) > 1:
        values_by_run = [{**d, MAX_LABEL: max(d.values())} if d else d for d in values_by_run]
        labels.append(MAX_LABEL)
    recommended = {ls.label: ls.recommended for ls in good or []}
    # a bad commit's runs are counted against the good commit's lines, so the two
    # blocks read side by side (its own would start at its own p25, above them)
    good_lines = {ls.label: [e["threshold"] for e in ls.exceedances] for ls in good or []}
    # a test fails when any label passes its one threshold: every row lists the lines the
    # max's tail suggests beside its own (a tester's CI threshold was missing from the quiet label's)
    tail = [d[MAX_LABEL] for d in values_by_run if d and not broke(d[MAX_LABEL])] if len(labels) > 1 else []
    shared = candidates(tail) if good is None and not thresholds else []
    out, values = [], {}
    for lab in labels:
        vals = values[lab] = [d[lab] for d in values_by_run if lab in d]
        # a printed nan fails any threshold (exceedances count it), but its stand-in
        # would drag percentiles and candidate thresholds up to 1e9: those use the rest
        finite = [v for v in vals if not broke(v)]
        summary = {**summarize(finite), "nan": len(vals) - len(finite)}
        # no finite run: no line of its own (nan's 1e9 stand-in made "0/30 at or above 2e+09")
        ths = thresholds or good_lines.get(lab) or sorted({*(candidates(finite) if finite else []), *shared})
        ex = [{"threshold": t, "above": k, "runs": n,
               "rate_upper_bound": exceedance_upper_bound(k, n, confidence),
               "rate_lower_bound": exceedance_lower_bound(k, n, confidence)}
              for t, k, n in exceedances(vals, ths)]
        if good is None:
            rec, how = recommend_threshold(finite, rate, confidence, nonfinite=len(vals) - len(finite))
            # its bound lines say whether it is distribution-free, and how many runs that needs
            out.append(LabelStats(lab, summary, ex, None if rec is None else round_up(rec),
                                  how.replace(" (distribution-free)", "")))
            continue
        t = recommended.get(lab)
        catch = None
        if t is not None:
            (_, k, n), = exceedances(vals, [t])
            catch = {"threshold": t, "above": k, "runs": n,
                     "rate_lower_bound": exceedance_lower_bound(k, n, confidence)}
        out.append(LabelStats(lab, summary, ex, None, "a bad commit's runs", catch))
    # a max whose nan runs alone exceed the rate is past any label's threshold too
    if good is None and out and out[-1].label == MAX_LABEL and NO_THRESHOLD_REACHES not in out[-1].recommended_how:
        whole = out[-1]
        rec, raised = raise_to_labels(whole.recommended, {ls.label: ls.recommended for ls in out[:-1]})
        if raised is not None:
            own = "none" if whole.recommended is None else fmt_value(whole.recommended)
            whole.recommended, whole.recommended_how = rec, (
                f"[{raised}]'s: the max fails whenever [{raised}] does; the max's own recommendation was {own}")
    for ls in out:
        if ls.recommended is not None:
            b = ls.recommended_bound = recommendation_bound(values[ls.label], ls.recommended, rate, confidence)
            if not b["distribution_free"]:
                b["outliers"] = high_outliers([v for v in values[ls.label] if not broke(v)])
    return out


def resampler(values: list[float], rng: np.random.Generator, smooth: bool = True, robust: bool = True):
    """Draws like the measured runs: one of them, with ``smooth`` moved by
    a kernel of Silverman's width (on the log scale where the values
    allow). Where good and bad runs overlap, drawing the measured values
    themselves made a bisect look 10-20% cheaper than real runs did (a
    tester's: 57 runs estimated, 70 spent). Where they never overlap the
    kernel's tails would cross a gap real runs never cross (33 runs
    estimated for 29 on the seed model), so the values are drawn as
    measured. A nan's stand-in stays as it is. The width is Silverman's
    rule with the spread the smaller of the standard deviation and the
    interquartile range's (``robust``): a few outliers 3-8x out widened
    the plain rule's kernel over every run, and a tester's estimate read
    590 runs for a bisect that took 334."""
    x = np.asarray(values, float)
    log = bool(np.all(x > 0))
    t = np.log(x) if log else x
    ok = ~np.array([broke(v) for v in x], bool)
    width = 0.0
    if smooth and ok.sum() > 1:
        spread = float(np.std(t[ok]))
        if robust:
            q1, q3 = np.percentile(t[ok], [25, 75])
            spread = min(spread, float(q3 - q1) / 1.349) or spread
        width = (0.9 if robust else 1.06) * spread * int(ok.sum()) ** -0.2

    def draw() -> float:
        i = int(rng.integers(len(x)))
        if not ok[i] or not width:
            return float(x[i])
        v = t[i] + width * float(rng.standard_normal())
        return float(np.exp(v)) if log else float(v)
    return draw


def simulate_cost(good: list[float], bad: list[float], commits: int, trials: int = 40,
                  seed: int = 0, confidence: float = 0.99,
                  max_runs: int = MAX_TOTAL_RUNS, crash_rate: float = 0.0,
                  smooth: bool = True, robust: bool = True,
                  after_trial: Callable[[list[int]], bool] | None = None) -> CostEstimate | None:
    """Runs a bisect over ``commits`` would need, by replaying the real
    search, endpoint policy included, on values drawn like the measured
    good and bad runs (``resampler``), a ``crash_rate`` of them crashing
    (a session counts a crashed run too); ``smooth=False`` draws the
    measured values themselves (as before 2026-12-05), ``robust=False``
    widens its kernel by the plain standard deviation (as until the
    session after; both for scripts/cost_estimate.py). ``after_trial(runs so far)`` may end the
    trials early by returning True (a bisect that runs to the cap takes
    half a minute to replay). Returns None when the two commits do not
    separate at all."""
    if not separation(good, bad).separated:
        return None
    rng = np.random.default_rng(seed)
    g, b = np.asarray(good), np.asarray(bad)
    model_bits = info_per_run(Model.fit(g, b))
    bits, disjoint = sample_bits(g, b)
    interval = None
    if not np.isfinite(bits):
        bits = model_bits
    elif not disjoint:
        interval = bits_interval(g, b)
    runs_used, right, capped = [], 0, 0
    draw_good, draw_bad = (resampler(x, rng, smooth and not disjoint, robust) for x in (good, bad))

    def probe(i: int, culprit: int) -> float | None:
        if crash_rate and rng.random() < crash_rate:
            return None
        return draw_bad() if i >= culprit else draw_good()
    for _ in range(trials):
        culprit = int(rng.integers(1, commits + 1))
        ans, n = simulate_bisect(commits, lambda i, c=culprit: probe(i, c),
                                 confidence=confidence, max_total_runs=max_runs)
        runs_used.append(n)
        right += int(ans == [culprit])
        capped += int(ans is None and n >= max_runs)
        if after_trial is not None and after_trial(runs_used):
            break
    return CostEstimate(commits, bits, runs_lower_bound(commits, bits), float(np.mean(runs_used)),
                        float(np.percentile(runs_used, 95)), right / len(runs_used), len(runs_used), model_bits,
                        disjoint, list(interval) if interval else None,
                        capped, max_runs, min(len(good), len(bad)))


def _check_options(runs: int, false_fail_rate: float, confidence: float, commits: int,
                   thresholds: list[float] | None = None, bad_rev: str | None = None) -> None:
    """Before the first run: a bad option found after N probe runs wastes them."""
    bad = [t for t in thresholds or [] if not t > 0]
    if bad:
        raise KlbisectError(f"--thresholds {','.join(f'{t:g}' for t in bad)}: a KL threshold is above 0 "
                            "(e.g. 0.005,0.01)", EXIT_USAGE)
    if runs < 1:
        raise KlbisectError(f"--runs {runs}: give at least 1 run to collect (30 or more for a threshold)",
                            EXIT_USAGE)
    if bad_rev and runs < 2:
        raise KlbisectError(f"--runs {runs} with --bad-rev: a bisect's cost needs at least 2 runs with values at "
                            "each commit (give --runs 2 or more, 30 or more for a threshold)", EXIT_USAGE)
    if not 0 < false_fail_rate < 1:
        raise KlbisectError(f"--false-fail-rate {false_fail_rate:g}: give a rate between 0 and 1 (e.g. 0.01)",
                            EXIT_USAGE)
    if not 0 < confidence < 1:
        raise KlbisectError(f"--confidence {confidence:g}: give a level between 0 and 1 (e.g. 0.95)", EXIT_USAGE)
    if commits < 2:
        raise KlbisectError(f"--commits {commits}: give the size of the range a bisect would search, "
                            "at least 2", EXIT_USAGE)


def calibrate(path: str | Path | None, cfg: BisectConfig, rev: str, runs: int,
              bad_rev: str | None = None, thresholds: list[float] | None = None,
              false_fail_rate: float = 0.01, confidence: float = 0.95, commits: int = 1000,
              progress: Progress = to_stderr) -> Calibration:
    cfg.validate()
    _check_options(runs, false_fail_rate, confidence, commits, thresholds, bad_rev)
    ws = Workspace(path, cfg.metric, cfg.worse)
    try:
        # refused before the state directory is made: a typo leaves nothing behind
        sha = gitrepo.resolve(ws.repo, rev, "revision")
        bad_sha = gitrepo.resolve(ws.repo, bad_rev, "bad revision") if bad_rev else None
        if bad_sha == sha:
            raise KlbisectError(f"--bad-rev {bad_rev} is the same commit as --rev {rev} ({sha[:12]}): "
                                "give a commit with the regression", EXIT_REVISION)
        with ws.locked():
            probe, builder = make_probe(cfg), make_builder(cfg)
            build_key = builder.key if builder else None
            # a --fresh calibration cut short is resumed by the next one, back to the first of the chain
            resumed = ws.store.interrupted_calibration(sha, bad_sha, probe.key) if cfg.fresh else None
            origin = ws.store.session(resumed.config.get("fresh_from", resumed.id)) if resumed else None
            sid = ws.store.create_session("calibrate", sha, bad_sha, probe.key,
                                          {**cfg.stored(), "rev": rev, "runs": runs,
                                           **({"fresh_from": origin.id} if origin else {})})
            if cfg.fresh:
                ws.store.view_from(origin or ws.store.session(sid))
                at = [sha, bad_sha or sha]
                left_out = len(ws.store.runs(probe.key, at, every=True)) - len(ws.store.runs(probe.key, at))
                if left_out or origin:
                    progress(f"--fresh: leaving out the {left_out} runs this probe command recorded earlier at "
                             f"{'these commits' if bad_sha else 'this commit'}"
                             + (f"; resuming the interrupted --fresh calibration of session {origin.id}"
                                if origin else ""))
            try:
                return _calibrate_session(ws, cfg, sid, rev, sha, bad_sha, runs, probe, builder, build_key,
                                          thresholds, false_fail_rate, confidence, commits, progress)
            except BaseException as e:
                # an interrupted or failed calibration must not stay the session `status` shows;
                # its runs are kept by commit, and the same command resumes from them. Why it
                # stopped is kept for `status` (a tester's failed and Ctrl-C'd ones read alike, "ended")
                why = (e.message if isinstance(e, KlbisectError) else
                       "interrupted" if isinstance(e, KeyboardInterrupt) else f"{type(e).__name__}: {e}")
                with contextlib.suppress(Exception):
                    ws.store.update_session(sid, state="ended", ended=time.time())
                    # (an error says its own way on: rerun as it was, a bad probe fails again)
                    note_stop(ws.store, sid, why if isinstance(e, KlbisectError) else
                              f"{why}; rerun the same `klbisect calibrate` command to resume (its runs are kept)")
                raise
    finally:
        ws.close()


def _calibrate_session(ws, cfg, sid, rev, sha, bad_sha, runs, probe, builder, build_key, thresholds,
                       false_fail_rate, confidence, commits, progress) -> Calibration:
    meter = WorktreeMeter(ws, sid, probe, builder, progress)
    hold_env(ws, sid, builder, ws.logs / f"s{sid}")
    # as patient as `run` with its endpoints: two crashes in a row ended 9% of the
    # calibrations of a probe that crashes 30% of its runs
    crash_limit = endpoint_crash_limit(cfg.crash_limit)
    try:
        for which, target in (("", sha), ("bad ", bad_sha)):
            if target is None:
                continue

            def measure(values: int) -> None:
                r = meter.measure(target)[1]
                if r is None:
                    shown, crashed = "build failed", True
                else:
                    # as `run` shows it: a value printed before a timeout is a crash, not one of the values
                    near = ws.store.runs(probe.key, [sha] + ([bad_sha] if bad_sha else []))
                    usual = usual_labels(near) if cfg.metric is None else frozenset()
                    shown, crashed = run_shown(r, usual, cfg.metric, typical_values(near, usual), cfg.worse)
                progress(f"{which}{target[:12]} run: {shown} ({values + (not crashed)}/{runs} values)")

            before = commit_runs(ws, probe.key, build_key, [target], cfg.timeout)[target]
            if before.values:
                # a calibration done in a second read as if it had measured (a tester's)
                progress(f"{which}{target[:12]}: reusing {min(len(before.values), runs)} of the "
                         f"{len(before.values)} runs with a value recorded earlier at this commit with this probe "
                         "(--fresh leaves them out)")
            if before.build_failed:        # in an earlier command: build it once more
                measure(len(before.values))
            while True:
                cr = commit_runs(ws, probe.key, build_key, [target], cfg.timeout)[target]
                err = endpoint_problem(ws, which.strip() or "calibrated", target, probe.key, build_key,
                                        since(cr, before), crash_limit, where=f"the calibrated {which}commit",
                                        metric_regex=cfg.metric_regex)
                if err:
                    raise err
                if len(cr.values) >= runs:
                    break
                measure(len(cr.values))
            # the bad commit's runs crashing too is a flaky probe, not a broken commit
            crash_limit = endpoint_crash_limit(cfg.crash_limit, cr.crashes, cr.crashes + len(cr.values))
    finally:
        meter.close()
        close_builder(builder, progress, ws, sid)
    low = cfg.worse == "lower"

    def own(r) -> dict:
        # with --metric, that label is the one a bisect judges: the others would only distract
        return {cfg.metric: r.values[cfg.metric]} if cfg.metric and cfg.metric in r.values else r.values

    all_runs = ws.store.runs(probe.key, [sha])
    bad_all = ws.store.runs(probe.key, [bad_sha]) if bad_sha else []
    # a run cut off short of its labels is a crash
    measured = valued_runs(all_runs, cfg.metric, cfg.worse, among=all_runs + bad_all)
    with_values = measured[-runs:] if runs else []
    bad_counted = valued_runs(bad_all, cfg.metric, cfg.worse, among=all_runs + bad_all)
    bad_runs = bad_counted[-runs:]
    # the statistics count runs at or above a threshold: a metric that fails low is turned
    turn = turner([v for r in with_values + bad_runs for v in own(r).values()]) if low else (lambda v: v)

    def shown(r) -> dict:
        return {k: turn(v) for k, v in own(r).items()}

    if low and thresholds:
        thresholds = sorted(turn(t) for t in thresholds)
    # a label's candidate thresholds: round numbers around the tail where it fails
    cands = (lambda vals: sorted(turn(t) for t in low_thresholds([turn(v) for v in vals]) if t)) if low \
        else default_thresholds
    res = Calibration(rev, sha, len(with_values), crashes_among(all_runs, measured, runs),
                      label_stats([shown(r) for r in with_values], thresholds, false_fail_rate, confidence,
                                  candidates=cands), false_fail_rate, confidence,
                      worse="lower" if low else "higher")
    # (with the crashes the header counts: a tester's status and log left them out)
    res.used_runs = sorted(r.id for r in runs_among(all_runs, measured, runs)
                           + (runs_among(bad_all, bad_counted, runs) if bad_sha else []))
    res.notes += [n for n in [ended_on_errors(all_runs, f"{rev} ({sha[:12]})")] if n]
    if bad_sha:
        res.notes += [n for n in [ended_on_errors(bad_all, f"the bad rev ({bad_sha[:12]})")] if n]
        res.bad_sha = bad_sha
        res.bad_crashes = crashes_among(bad_all, bad_counted, runs)
        res.bad_runs = len(bad_runs)
        res.bad_labels = label_stats([shown(r) for r in bad_runs], thresholds, false_fail_rate,
                                     confidence, good=res.labels)
        gv = [r.value for r in with_values]
        bv = [r.value for r in bad_runs]
        if len(gv) < 2 or len(bv) < 2:
            raise KlbisectError("need at least 2 runs with values at each commit to estimate "
                                "bisect cost", EXIT_NO_SIGNAL)
        sep = separation(gv, bv)
        if sep.separated and sep.direction != ("down" if low else "up"):
            res.notes.append(f"the bad rev's runs are {'HIGHER' if low else 'LOWER'} than --rev's (median "
                             f"{fmt_value(float(np.median(bv)))} against {fmt_value(float(np.median(gv)))}): the "
                             "revisions are swapped, or the range holds a fix; a bisect from --rev to --bad-rev "
                             f"looks for a metric that got {'lower' if low else 'higher'} and stops on this range "
                             "with 154 (the cost below is for finding the change whichever way it went)"
                             + (f"; yet {spikes} of its runs lie far past every run of --rev the worse way: a "
                                "regression that shows only as occasional spikes? (`run --worse either` bisects it)"
                                if (spikes := worse_tail(gv, bv, "lower" if low else "higher")) else ""))
        priced = ""
        try:
            progress(f"estimating a bisect over {commits} commits: replaying the search on resampled values "
                     f"(up to {COST_TRIALS} simulated bisects)...")
            crashed = res.crashes + res.bad_crashes
            res.cost = simulate_cost(gv, bv, commits, COST_TRIALS, crash_rate=crashed / (crashed + len(gv) + len(bv)),
                                     after_trial=_cost_clock(progress))
            # a label far clearer than the max is priced beside it; where the max prices nothing
            # (its values do not separate the revisions), a label that does is priced alone
            lab, clear = clearer_label(ws, probe.key, sha, bad_sha, cfg, sep.p_value if res.cost else 1.0)
            if clear:
                progress(f"estimating the same bisect with --metric {lab}...")
                alone = simulate_cost(*([own(r)[lab] for r in rs if lab in own(r)] for rs in (with_values, bad_runs)),
                                      commits, COST_TRIALS, crash_rate=crashed / (crashed + len(gv) + len(bv)),
                                      after_trial=_cost_clock(progress))
                if alone and res.cost is None:
                    # said after the note that names the label (below), which it prices
                    priced = (f"a bisect with --metric {lab}: {alone.simulated_mean_runs:.1f} runs on average (p95 "
                              f"{alone.simulated_p95_runs:.0f}, right in {alone.simulated_accuracy:.0%} of "
                              f"{alone.trials} replays; endpoint runs included); the {over_labels(cfg.worse)} over "
                              "labels does not separate the revisions, so it has no cost to give")
                elif alone and alone.simulated_mean_runs < res.cost.simulated_mean_runs:
                    res.notes.append(f"{clear}: {alone.simulated_mean_runs:.1f} runs on average with it (p95 "
                                     f"{alone.simulated_p95_runs:.0f}, right in {alone.simulated_accuracy:.0%}; "
                                     f"endpoint runs included), against {res.cost.simulated_mean_runs:.1f} (p95 "
                                     f"{res.cost.simulated_p95_runs:.0f}) over every label")
                elif alone:
                    # a tester saw "estimating the same bisect with --metric X..." and then nothing
                    res.notes.append(f"--metric {lab} alone: {alone.simulated_mean_runs:.1f} runs on average (p95 "
                                     f"{alone.simulated_p95_runs:.0f}), no fewer than over every label: the "
                                     "default is at least as cheap")
                elif res.cost is not None:
                    res.notes.append(f"--metric {lab} alone does not separate the revisions in a replay: bisect "
                                     "over every label")
        except KeyboardInterrupt:
            # every run is in: the statistics above them are whole, and a user presses Ctrl-C
            # here because the replay is slow (a tester's report was lost with it); an estimate
            # finished before it stands
            res.interrupted = True
            res.notes.append(f"the {'estimate with one label' if res.cost else 'cost estimate'} was interrupted: "
                             "the same command gives it (no run is measured again)")
        hint = label_hint(ws, probe.key, sha, bad_sha, cfg) if res.cost is None and not res.interrupted else ""
        if hint:
            # as `run` says it: one label plain under the max (or min) over the others
            res.notes.append(hint[2:])
        if priced:
            res.notes.append(priced)
        if res.cost or priced:
            # a tester budgeted GPU time on the estimate: a bisect of this very range needs fewer new runs
            kept = len(ws.store.runs(probe.key, [sha, bad_sha], every=True))
            res.notes.append(f"a `klbisect run` from {sha[:12]} to {bad_sha[:12]} with this probe command reuses "
                             f"the {kept} runs recorded at them (not with --fresh) as its endpoints': the "
                             "estimate counts endpoint runs, so it measures fewer new ones")
    silent = silent_when_passing(ws, probe.key, [sha] + ([bad_sha] if bad_sha else []))
    if silent:
        res.notes.append(silent)
    if low:
        mine = own_summaries([own(r) for r in with_values])
        res.labels = [turned_back(ls, turn, mine[MIN_LABEL if ls.label == MAX_LABEL else ls.label])
                      for ls in res.labels]
        theirs = own_summaries([own(r) for r in bad_runs])
        res.bad_labels = [turned_back(ls, turn, theirs[MIN_LABEL if ls.label == MAX_LABEL else ls.label])
                          for ls in res.bad_labels]
    ws.store.update_session(sid, state="done", result=res.to_json())
    return res


COST_TRIALS = 40        # simulated bisects behind a cost estimate ...
COST_MIN_TRIALS = 10    # ... or this many, once COST_SECONDS have passed
COST_SECONDS = 120.0
COST_PROGRESS_SECONDS = 15.0


def _cost_clock(progress: Callable[[str], None]) -> Callable[[list[int]], bool]:
    """``simulate_cost``'s after_trial for a user waiting at the terminal:
    a line every 15 s, and an end after two minutes once ten bisects are
    in (a search that runs to --max-total-runs on overlapping values takes
    half a minute to replay; a tester waited 12 minutes on 40 of them,
    with nothing printed)."""
    start = last = time.monotonic()

    def after(runs: list[int]) -> bool:
        nonlocal last
        now = time.monotonic()
        if now - last >= COST_PROGRESS_SECONDS:
            last = now
            progress(f"  {len(runs)} of {COST_TRIALS} simulated bisects: {np.mean(runs):.0f} runs on average so far")
        return len(runs) >= COST_MIN_TRIALS and now - start >= COST_SECONDS
    return after


def runs_among(all_runs: list, counted: list, n: int) -> list:
    """The runs that gave the last ``n`` counted ones, crashes among them:
    from just after the last run left out."""
    if len(counted) <= n:
        return list(all_runs)
    cut = next(i for i, r in enumerate(all_runs) if r is counted[-n - 1])
    return all_runs[cut + 1:]


def crashes_among(all_runs: list, counted: list, n: int) -> int:
    """Runs without a value among those that gave the last ``n`` counted
    ones, so that the header's crashes and values come from the same runs."""
    return len(runs_among(all_runs, counted, n)) - min(len(counted), n)


def needs_runs(rate: float, confidence: float) -> str:
    n = runs_for_bound(rate, confidence)
    return (f"a bound at {rate:g} from the runs alone ({confidence:.0%} confidence, any distribution) "
            f"needs at least {n} runs (--runs {n})")


TAIL_REFUTED_P = 0.1    # this unlikely at the fit's rate (its 95% bound: less likely still), runs past it contradict it


def tail_p(k: int, n: int, rate: float) -> float:
    """P(at least k of n runs at or past a threshold whose true rate is ``rate``)."""
    from scipy import stats  # noqa: PLC0415 - slow to import; only calibrate's report needs it
    return float(stats.binom.sf(k - 1, n, rate)) if k else 1.0


def tail_refuted(k: int, n: int, rate: float) -> bool:
    return k > 0 and tail_p(k, n, rate) < TAIL_REFUTED_P


def recommendation_lines(ls: LabelStats, rate: float, confidence: float, side: str = "above") -> list[str]:
    """The recommendation with the bound it carries: a tail fit aims at
    ``rate`` but only the runs bound it, so it must not read as a bound."""
    b = ls.recommended_bound
    if b is None:        # stored before calibrate said what bounds it
        return [f"      recommended threshold for <= {rate:g} false failures: "
                f"{fmt_value(ls.recommended)} ({ls.recommended_how})"]
    seen = (f"{b['above']}/{b['runs']} runs at or {side} it, so true rate <= {b['rate_upper_bound']:.3g} "
            f"at {confidence:.0%} confidence")
    if b["distribution_free"]:
        return [f"      recommended threshold for <= {rate:g} false failures: {fmt_value(ls.recommended)} "
                f"({seen}, any distribution; {ls.recommended_how})"]
    # not distribution-free: a sample of one value, a stored order statistic aimed at a nan share, or a tail fit
    if ls.recommended_how.startswith("every one of"):
        lines = [f"      recommended threshold for {rate:g} false failures, if the test stays deterministic: "
                 f"{fmt_value(ls.recommended)} ({ls.recommended_how}); {seen}"]
    elif ls.recommended_how.startswith("order statistic"):     # stored before nan runs were counted in it
        lines = [f"      recommended threshold for {rate:g} false failures: {fmt_value(ls.recommended)} "
                 f"({ls.recommended_how}): the runs alone do not bound it at this rate; {seen}"]
    else:
        # the condition first: a maintainer copied the number into CI and missed it at the line's end (a tester's)
        lines = [f"      recommended threshold for {rate:g} false failures, a bound only if the tail is log-normal: "
                 f"{fmt_value(ls.recommended)} ({ls.recommended_how}); {seen}"]
    if tail_refuted(b["above"], b["runs"], rate):
        # a tester's good runs had 8% outliers: the fit's 0.0102 failed 5.5% of them, 3 of 100 here
        lines.append(f"      the runs contradict the tail fit: {b['above']} of {b['runs']} already at or {side} it, "
                     f"where {rate:g} false failures would put {rate * b['runs']:.2g} "
                     f"(p={tail_p(b['above'], b['runs'], rate):.2g}); the tail is heavier than log-normal, so this "
                     "threshold fails good commits more often")
    elif b.get("outliers"):
        top = "the top run stands" if b["outliers"] == 1 else f"the top {b['outliers']} runs stand"
        lines.append(f"      {top} apart from the rest (generalized ESD on the logs, p < {OUTLIER_ALPHA:g}): the tail "
                     "is likely heavier than log-normal, so this threshold may fail good commits more often than "
                     f"{rate:g}; only a bound from the runs alone holds whatever the tail")
    if b["runs"] < b["runs_for_bound"]:
        lines.append(f"      {needs_runs(rate, confidence)}")
    return lines


def format_calibration(c: Calibration) -> str:
    bad = (f"; bad rev {c.bad_sha[:12]}: {c.bad_crashes} without a value" if c.bad_sha else "")
    lines = [f"Calibration of {c.rev} ({c.sha[:12]}): {c.runs} runs with values, {c.crashes} without{bad}"
             + ("; the metric fails low (--worse lower): runs are counted at or below each threshold"
                if c.worse == "lower" else "")]
    side = "below" if c.worse == "lower" else "above"

    def block(title: str, labs: list[LabelStats], bad: bool = False) -> None:
        lines.append(title)
        for ls in labs:
            s = ls.summary
            lines.append((f"  [{ls.label}] n={s['n']}" + (f" and {s['nan']} nan" if s.get("nan") else "")
                          + "  " + "  ".join(f"{k} {fmt_value(s[k])}" for k in
                                             # (a 5th percentile of 3 runs is only a line between two)
                                             ("min", "p5", "p25", "median", "p75", "p95", "max")
                                             if k in s and (s["n"] >= FEW_FOR_TAILS or k not in ("p5", "p95"))
                                             )).rstrip())
            for e in ls.exceedances:
                bound = (f">= {e['rate_lower_bound']:.3g}" if bad and "rate_lower_bound" in e
                         else f"<= {e['rate_upper_bound']:.3g}")
                lines.append(f"      {e['above']}/{e['runs']} runs at or {side} {e['threshold']:g} "
                             f"(true rate {bound} at {c.confidence:.0%} confidence)")
            k = ls.catch
            if bad and k is not None:
                # the whole test's catch rate is the max's (min's) row, at the test's one threshold: a
                # label's own line is lower, and its rate read as the test's overstated it (a tester's)
                whole = len(labs) == 1 or ls.label in (MAX_LABEL, MIN_LABEL)
                whose = "the" if whole else "this label's"
                lines.append(f"      fails {whose} recommended "
                             f"{fmt_value(k['threshold'])} in {k['above']}/{k['runs']} runs "
                             f"(true rate >= {k['rate_lower_bound']:.3g} at {c.confidence:.0%} confidence)"
                             + (": how often one CI run catches this regression" if whole else ""))
            elif bad and ls.recommended is None:
                lines.append("      no recommended threshold to try: the good commit had none for this label")
            elif ls.recommended is not None:
                lines.extend(recommendation_lines(ls, c.false_fail_rate, c.confidence, side))
            elif NO_THRESHOLD_REACHES in ls.recommended_how:     # it says itself whether more runs would help
                lines.append(f"      no threshold recommended: {ls.recommended_how}")
            else:
                lines.append(f"      no threshold recommended: {ls.recommended_how}; "
                             + needs_runs(c.false_fail_rate, c.confidence))
    block("Per label:", c.labels)
    if c.bad_sha:
        block(f"Bad commit {c.bad_sha[:12]}:", c.bad_labels, bad=True)
    if c.bad_sha and not c.cost and not c.interrupted:
        sides = (f"{c.runs} runs a side" if c.bad_runs in (0, c.runs)
                 else f"{c.runs} and {c.bad_runs} runs")
        # a tester's --runs 20 priced nothing and said nothing of how many might (100 did)
        lines.append(f"{c.sha[:12]} and {c.bad_sha[:12]} do not separate: these {sides} do not show a "
                     f"difference; more runs may show one (the same command with --runs {max(3 * c.runs, 30)} "
                     "keeps these and adds to them)")
    lines.extend(f"Note: {n}" for n in c.notes)
    if c.cost:
        lines.append(cost_line(c.cost))
    return "\n".join(lines)


def _runs(x: float) -> str:
    return f"{x:.0f}" if math.isfinite(x) else "no limit"


FEW_FOR_COST = 30   # runs a side under which an estimate says it may miss rare values (a tester's: 10 a side,
                    # p95 26 estimated, four of six real bisects over it)


def cost_line(k: CostEstimate) -> str:
    """Fano's limit and the simulated search. Disjoint runs are worth at most
    the one bit a good-or-bad question holds, so the limit is a bound; else
    the bits are a kernel estimate, and the limit is only as firm as it."""
    if k.disjoint:
        worth = (f"the two commits' runs never overlap: a run is worth up to 1 bit, and it needs at least "
                 f"{k.lower_bound_runs:.1f} runs (information limit, Fano)")
    else:
        basis = "capacity, a kernel-density estimate from the two commits' runs"
        limit = f"{k.lower_bound_runs:.1f} runs"
        if k.bits_interval:
            lo, hi = k.bits_interval
            basis += f"; 90% bootstrap range {lo:.2f}-{hi:.2f}"
            few, many = (_runs(runs_lower_bound(k.commits, b)) for b in (hi, lo))
            limit += f" ({few}-{many} over that range)"
        worth = (f"a run can tell at most about {k.bits_per_run:.2f} bits ({basis}), so Fano's information limit "
                 f"is about {limit}")
    model = f"its model credits a run with {k.model_bits:.2f} bits"
    if k.model_bits < k.bits_per_run:
        # info_per_run draws runs from the model's two centres and one pooled spread
        model += (", less: it caps what one run may weigh, a guard against outliers" if k.disjoint else
                  ", simulating runs that differ only in their median: a change of spread or tail (spikes) "
                  "counts for nothing there")
    elif k.model_bits > k.bits_per_run and not k.disjoint:
        # a tester read 0.75 credited against "at most about 0.55" as an overconfident search
        model += (", more than the runs show: it draws runs from its fitted centres and spread, with fewer "
                  "runs far out than these have; the simulated search above weighs these values themselves")
    return (f"A bisect over {k.commits} commits with this probe: {worth}; klbisect's search on "
            f"resampled values: {k.simulated_mean_runs:.1f} runs on average, p95 "
            f"{k.simulated_p95_runs:.0f}, right in {k.simulated_accuracy:.0%} of {k.trials} trials "
            f"(endpoint runs included; {model})"
            + (f"; {k.capped} of the {k.trials} stopped at the {k.max_runs}-run cap (--max-total-runs), so "
               "the mean is a floor: bisect a label that moved more clearly, or measure more runs"
               if k.capped else "")
            + (f"; from as few as {fmt_count(k.sample, 'run')} a side it cannot draw what so few did "
               f"not show (an outlier that 1 run in 20 gives), and a real bisect may take well over its p95: "
               f"budget on {FEW_FOR_COST} runs a side or more"
               if 0 < k.sample < FEW_FOR_COST else ""))
