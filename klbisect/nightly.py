"""Nightly regression hunting over a branch head.

Each night the caller updates the repository (klbisect fetches nothing) and
runs ``klbisect nightly``. It records ``--runs`` probe runs of the branch head
in the history database (one session of kind ``nightly`` per night and head),
then compares the head's values with the pooled values of the last
``--baseline-nights`` nightly heads judged good: a one-sided Mann-Whitney U
test on the values (rank based, so one outlier cannot decide) plus a minimum
relative effect on the medians. Borderline nights get more runs, up to
``--max-runs``. The CI pass rate never enters.

On a regression it bisects between the oldest head of that baseline and the
head (``session.run_bisect``; on the one label that moved, when one did,
``moved_label``), writes the report and, when configured, posts it to
a GitHub issue. Rerunning the same night with the same head returns the
stored answer: no new runs, no second comment. A night whose probe printed no
value is "crashed", never a regression (but exit 154: nothing was
measured). A regression that was already found and is still there is
"known": it is reported with its culprit again but not bisected or posted
again; it stays open until a night's runs are shown better than its runs.
A regression whose bisect finds the two heads alike was not one: the night
becomes "suspect".

Verdicts of a night: ``baseline`` (no good nightlies yet to compare with;
counts as good), ``good``, ``suspect`` (still borderline after ``--max-runs``
runs: kept out of the baseline, and its runs are pooled with the next
nights' until they decide), ``regressed`` (new regression, bisected),
``known`` (the open regression persists, or is not shown fixed),
``crashed`` (no values), ``environment`` (good commits measured again
tonight read like the head: a regressed night's good endpoint, or the
baseline heads a borderline night measured again; not bisected, and the
baseline starts again from it; ``_check_environment``, ``_seen_environment``).

A night judged good is also checked against the trend: the good nights
since the last regression (up to ``TREND_NIGHTS`` x ``--baseline-nights``),
split at each night, tonight and the nights after the split against those
before it, at ``--alpha`` over the number of splits (``judge_trend``). The
baseline slides, so a regression whose first nights drew low joins it and,
once it fills it, is never worse than it; the older nights still predate
it. Such a night is regressed (``drift`` in its record), bisected from the
oldest night of the trend. A good night whose head holds the culprit of a
regression found later leaves the baseline.

A modest regression can stay borderline on one night's ten runs; calling
such a night good would put the regression into the baseline, after which
it is never seen. Pooling suspect nights with the next one gains the runs
it needs, at the price of a second test at ``--alpha`` on such nights:
more false alarms (0.39% of good nights against 0.10% on the simulated
model of ``scripts/nightly_power.py``; ``docs/statistics.rst``).
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import repo as gitrepo
from .buildenv import close_builder
from .decide import (BAD, DEFAULT_MAX_RUNS, GOOD, OVERLAP_ENDPOINT_RUNS, SKIP, UNDECIDED, UNDECIDED_SKIP, Verdict,
                     is_undecided_skip, judge as judge_commit, summarize, verdict_model)
from .errors import (EXIT_NOT_SURE, EXIT_NO_SIGNAL, EXIT_POST_FAILED, EXIT_PROBE_MISSING, EXIT_REVISION,
                     EXIT_USAGE, Interrupted, KlbisectError, NoDifference)
from .metric import fmt_count, fmt_ratio, fmt_span, fmt_subject, fmt_summary, fmt_value
from .plots import check_writable
from .redact import MASK, redact
from .runs import STATUS_NOTFOUND, STATUS_TIMEOUT, status_words
from .workspace import Progress, WorktreeMeter, to_stderr

GOOD_VERDICTS = ("good", "baseline")
OPEN_VERDICTS = ("regressed", "known")
TREND_NIGHTS = 4   # times --baseline-nights: the good nights nightly.judge_trend looks back over
POST_RETRY_NIGHTS = 14   # how far back a failed post is tried again, in nightly sessions
BISECT_TRIES = 3         # nights a bisect that fails on the machine (154) is tried before it is posted as failed
OPEN_RUNS = 6   # fresh runs of an open regression's head to judge later nights against (a bisect's endpoint)


@dataclass
class NightlyOptions:
    branch: str = "main"
    runs: int = 3                   # runs of the head per night
    baseline_nights: int = 5        # K: good nightly heads pooled as the baseline
    alpha: float = 0.001            # one-sided Mann-Whitney U level
    min_effect: float = 0.1         # head median must be >= (1 + min_effect) x baseline median
    min_baseline: int = 3           # fewer baseline values: the night is a baseline night
    night: str | None = None        # YYYY-MM-DD (default: today, UTC)
    report_format: str = "md"       # md | html | json
    report_path: str | None = None  # default: <git-common-dir>/klbisect/reports/nightly-<night>-<sha>.<fmt>
    post_to: str | None = None      # owner/repo#issue
    post_issue: int | None = None   # issue number in the origin remote's GitHub repository
    dry_run: bool = False           # print what would be posted instead of posting
    offline: bool = False           # no GitHub API calls for PR metadata


# ---- the test: pure ------------------------------------------------------------

@dataclass
class Comparison:
    verdict: str               # regressed | good | baseline | crashed
    p_value: float | None
    ratio: float | None        # head median / baseline median
    suspicious: bool           # more head runs could turn it into a regression
    head: dict = field(default_factory=dict)
    baseline: dict = field(default_factory=dict)
    reason: str = ""


def compare(head: list[float], baseline: list[float], alpha: float = 0.001, min_effect: float = 0.1,
            min_baseline: int = 3, against: str = "baseline") -> Comparison:
    """Is the head worse (higher KL) than the baseline? One-sided
    Mann-Whitney U on the values, and the medians at least ``min_effect``
    apart (so a tiny drift that many runs make significant is not flagged)."""
    sh, sb = summarize(head), summarize(baseline)
    if not head:
        return Comparison("crashed", None, None, False, sh, sb, "the probe printed no value tonight")
    if len(baseline) < min_baseline:
        return Comparison("baseline", None, None, False, sh, sb,
                          f"only {len(baseline)} baseline values (need {min_baseline}): tonight "
                          "becomes the baseline")
    from scipy import stats  # noqa: PLC0415
    h, b = np.asarray(head, float), np.asarray(baseline, float)
    if np.ptp(np.concatenate([h, b])) == 0:
        p = 1.0
    else:
        # Exact whenever a side is small: scipy's "auto" falls back to the normal
        # approximation on any tie, even two equal head runs (KL printed to six
        # digits), and against a three-run baseline that approximation's p is
        # several times the exact one, so one tie decided a night.
        method = "exact" if min(len(h), len(b)) <= 8 else "asymptotic"
        p = float(stats.mannwhitneyu(h, b, alternative="greater", method=method).pvalue)
    mb, mh = float(np.median(b)), float(np.median(h))
    ratio = mh / mb if mb > 0 else (math.inf if mh > mb else 1.0)
    big = ratio >= 1.0 + min_effect if mb > 0 else mh > mb
    why = (f"head median {fmt_value(mh)} vs {against} {fmt_value(mb)} ({fmt_ratio(mh, mb) or 'x n/a'}), "
           f"Mann-Whitney p={p:.2g}")
    if p <= alpha and big:
        return Comparison("regressed", p, ratio, False, sh, sb, f"{why} <= {alpha:g}")
    return Comparison("good", p, ratio, big and p <= 0.25, sh, sb, why)


def reachable(head_runs: int, baseline_runs: int, alpha: float) -> bool:
    """Can a one-sided Mann-Whitney test of this many runs a side reach
    ``alpha`` at all? Its smallest p, every head run above every baseline
    run, is 1 / C(n + m, m): three baseline runs against ten never pass 0.001."""
    return baseline_runs > 0 and 1.0 / math.comb(head_runs + baseline_runs, baseline_runs) <= alpha


@dataclass
class Judgement:
    verdict: str               # regressed | known | good | suspect | baseline | crashed
    cmp: Comparison            # the comparison that decided it
    more: bool                 # one more head run could change the verdict
    reason: str
    worse_again: bool = False  # a regression on top of the open one
    other_side: str = ""       # "baseline" or "open": whose runs, not tonight's, could also settle it
    label: str = ""            # the one label that decided it, when one did (and a bisect judges)
    pooled: bool = False       # decided with the suspect nights' runs (borderline across nights already)


def judge_night(head: list[float], baseline: list[float], borderline: list[float] | None = None,
                open_bad: list[float] | None = None, alpha: float = 0.001, min_effect: float = 0.1,
                min_baseline: int = 3, open_head: list[float] | None = None,
                open_whole: list[float] | None = None, open_label: str = "") -> Judgement:
    """Tonight's verdict from its runs, the good baseline, the runs of the
    suspect nights just before it (``borderline``) and the runs of the open
    regression's heads (``open_bad``). A night that stays borderline once
    no more runs are asked for is ``suspect``: neither good nor regressed.

    While a regression is open the question turns round: a night is good
    again only when its runs are shown better than the regression's (the
    same test, the other way), not when three runs fail to show it worse
    than the old baseline. Otherwise a regressed head that drew low would
    close the regression, join the baseline and be found again the next
    night, or never. ``open_head``: tonight's runs as ``open_bad`` holds
    them (one label's values, when the regression's bisect judged one), and
    ``open_whole`` the open regression's max over labels: a night back at
    the baseline whose max is shown better than it is fixed, whatever that
    one label says (a bisect judged a label that had drawn low by chance,
    and the fix of the real one was never seen); ``open_label`` names that
    label in the reason (the night's run lines show the max over labels)."""
    c = compare(head, baseline, alpha, min_effect, min_baseline)
    mine = open_head or head
    if c.verdict in ("crashed", "baseline"):
        return Judgement(c.verdict, c, False, c.reason)
    if open_bad:
        if c.verdict == "regressed":
            again = compare(mine, open_bad, alpha, min_effect, min_baseline,
                            against=f"the open regression's {len(open_bad)} runs")
            if again.verdict == "regressed" and len(open_bad) < len(mine):
                # Tonight's runs are the ones that came out high, and a reference
                # thinner than them passes that luck on: "worse again" means a bisect
                # and a report (docs/statistics.rst, "Nightly: the open regression's
                # own runs": seen in a scratch simulation, not measured by a script).
                return Judgement("known", c, True, f"worse again? {again.reason}, to be confirmed on as "
                                 f"many of its runs as tonight's {len(mine)}", other_side="open")
            if again.verdict == "regressed":
                return Judgement("regressed", c, False, f"worse again: {again.reason}", worse_again=True)
            # A second regression on top of the open one reads borderline against it at
            # first: more runs of both, not "known" (its nights would then hide it, and
            # their heads, which hold it, would become a later bisect's good end)
            return Judgement("known", c, again.suspicious,
                             f"{c.reason}; " + (f"worse again? {again.reason}" if again.suspicious
                                                else f"as the open regression: {again.reason}"),
                             other_side="open" if again.suspicious else "")
        fixed = compare(open_bad, mine, alpha, min_effect, min_baseline)
        mo, mt = float(np.median(open_bad)), float(np.median(mine))
        over = f"label {open_label}: " if open_head and open_label else ""
        if fixed.verdict != "regressed" and open_head and open_whole and not c.suspicious:
            whole = compare(open_whole, head, alpha, min_effect, min_baseline)
            if whole.verdict == "regressed":
                fixed, open_bad, mo, mt = whole, open_whole, float(np.median(open_whole)), float(np.median(head))
                over = "the max over labels: "
        why = (f"{over}tonight's median {fmt_value(mt)} vs the open regression's {fmt_value(mo)} over "
               f"{len(open_bad)} runs ({fmt_ratio(mt, mo) or 'x n/a'}), Mann-Whitney p={fixed.p_value:.2g}")
        if fixed.verdict != "regressed":
            # tonight above the baseline is what an open regression looks like: more runs only where
            # tonight may be better than the regression, or worse than it (a label regression's known
            # nights each ran to --max-runs on the max's borderline against the old baseline)
            worse = c.suspicious and compare(mine, open_bad, alpha, min_effect, min_baseline).suspicious
            return Judgement("known", c, fixed.suspicious or worse, f"not shown fixed: {why}",
                             other_side="open" if fixed.suspicious else "")
        if c.suspicious:
            # better than the regression, not yet as good as before it: a partial fix,
            # or a few runs short of a full one; it stays out of the baseline
            return Judgement("suspect", c, True, f"better than the open regression ({why}), but {c.reason}")
        return Judgement("good", c, False, f"fixed: {why}; {c.reason}")
    more = c.suspicious
    reason = c.reason
    if c.verdict == "good" and borderline:
        pooled = compare(list(head) + list(borderline), baseline, alpha, min_effect, min_baseline)
        why = f"with the {len(borderline)} runs of the suspect nights before: {pooled.reason}"
        if pooled.verdict == "regressed":
            return Judgement("regressed", pooled, False, why, pooled=True)
        if pooled.suspicious:
            more, reason = True, (reason if c.suspicious else why)
    if c.verdict == "good":
        return Judgement("suspect" if more else "good", c, more, reason, other_side="baseline" if more else "")
    return Judgement("regressed", c, False, reason)


CONFIRM_P = 0.05     # fresh runs of a regressed head must show it at this level (see confirm_night)
CONFIRM_RUNS = 6     # ... this many of them, at least --runs


def confirm_night(fresh: list[float], baseline: list[float], min_effect: float = 0.1) -> Comparison:
    """A night judged regressed, tested again on head runs measured after
    the verdict. The runs that decided it are the ones that came out high,
    as a false alarm's do: a bisect that reused them as its bad end found
    its endpoints apart (p=0.007) in a range with no change, and searched
    it for over a thousand runs. Fresh runs carry no such selection, so a
    plain one-sided test of them at CONFIRM_P tells a false alarm (passed
    one time in twenty) from a regression (passed almost always)."""
    return compare(fresh, baseline, CONFIRM_P, min_effect, 1, against="baseline")


# A label this near moving asks for more runs. The max's 0.25 would ask on most nights with three
# labels, and at 0.05 a night's false alarms doubled (scripts/nightly_power.py, docs/statistics.rst).
LABEL_SUSPECT_P = 0.01


def judge_labels_again(head: dict[str, list[float]], open_bad: dict[str, list[float]], alpha: float = 0.001,
                       min_effect: float = 0.1, min_baseline: int = 3) -> Judgement | None:
    """A second regression on another label than the open one's: tested
    label by label against the open regression's head. The max over labels
    hides it (the open regression already holds the max up, so a label that
    rose to the same height moves it little), and so does the open label's
    own test. Each label is tested at ``alpha`` / labels, so looking at
    several is paid for. None when no label looks worse."""
    labels = sorted(k for k in head if open_bad.get(k))
    if not labels:
        return None
    a = alpha / len(labels)
    found: list[tuple[str, Comparison]] = []
    for lab in labels:
        c = compare(head[lab], open_bad[lab], a, min_effect, min_baseline,
                    against=f"the open regression's {len(open_bad[lab])} runs")
        if c.verdict == "regressed" or (c.suspicious and c.p_value <= LABEL_SUSPECT_P):
            found.append((lab, c))
    if not found:
        return None
    lab, c = min(found, key=lambda x: (x[1].verdict != "regressed", x[1].p_value))
    n_head, n_open = len(head[lab]), len(open_bad[lab])
    if c.verdict == "regressed" and n_open >= n_head:
        return Judgement("regressed", c, False, f"worse again on {lab}: {c.reason} "
                         f"(--alpha {alpha:g} over {fmt_count(len(labels), 'label')})", worse_again=True, label=lab)
    why = (f", to be confirmed on as many of its runs as tonight's {n_head}" if c.verdict == "regressed"
           else "")
    return Judgement("known", c, True, f"worse again on {lab}? {c.reason}{why}", other_side="open", label=lab)


def judge_labels(head: dict[str, list[float]], baseline: dict[str, list[float]],
                 borderline: dict[str, list[float]] | None = None, alpha: float = 0.001, min_effect: float = 0.1,
                 min_baseline: int = 3) -> Judgement | None:
    """A regression of one label that the max over labels hides: a
    tester's +40% on one label of three moved the max 8%, under
    --min-effect, and four regressed nights joined the baseline. Each label
    against the baseline's runs of it at ``alpha`` / labels (looking at
    several is paid for), with the suspect nights' runs pooled as the
    max's are. None when no label looks worse."""
    labels = sorted(k for k in head if head[k] and len(baseline.get(k) or []) >= min_baseline)
    if len(labels) < 2:
        return None     # one label is the max: judge_night's test
    a = alpha / len(labels)
    found: list[tuple[str, Comparison, str]] = []
    for lab in labels:
        c, pooled = compare(head[lab], baseline[lab], a, min_effect, min_baseline), ""
        more = (borderline or {}).get(lab) or []
        if c.verdict != "regressed" and more:
            both = compare(list(head[lab]) + list(more), baseline[lab], a, min_effect, min_baseline)
            if both.verdict == "regressed" or (both.suspicious and both.p_value < c.p_value):
                c, pooled = both, f" (with the {len(more)} runs of the suspect nights before)"
        if c.verdict == "regressed" or (c.suspicious and c.p_value <= LABEL_SUSPECT_P):
            found.append((lab, c, pooled))
    if not found:
        return None
    lab, c, pooled = min(found, key=lambda x: (x[1].verdict != "regressed", x[1].p_value))
    over = f" (--alpha {alpha:g} over {fmt_count(len(labels), 'label')})"
    if c.verdict == "regressed":
        return Judgement("regressed", c, False, f"label {lab}{pooled}: {c.reason}{over}", label=lab,
                         pooled=bool(pooled))
    return Judgement("suspect", c, True, f"label {lab} may have moved{pooled}: {c.reason}{over}",
                     other_side="baseline", label=lab)


def judge_trend(head: list[float], nights: list[list[float]], alpha: float = 0.001, min_effect: float = 0.1,
                min_baseline: int = 3) -> tuple[int, Comparison] | None:
    """A night judged good against its baseline, checked against the trend
    of the good nights before it (``nights``, most recent first): for each
    split, tonight and the nights after it against the nights before it, at
    ``alpha`` over the number of splits. The split with the smallest p, when
    one is a regression; else None. The baseline slides, so a regression
    whose first nights drew low joins it and, once it fills it, is never
    worse than it; the nights before it still predate it."""
    from scipy import stats  # noqa: PLC0415
    splits = len(nights) - 1
    best = None
    for k in range(1, splits + 1):
        recent = list(head) + [v for n in nights[:k] for v in n]
        older = [v for n in nights[k:] for v in n]
        c = compare(recent, older, alpha / splits, min_effect, min_baseline)
        if c.verdict != "regressed":
            continue
        # Splits are ranked on one scale: ``compare`` is exact when a side has
        # eight runs or fewer and asymptotic (larger in the tail) above, so its
        # p-values favoured the split that put a night of the regression among
        # the older nights (3.7e-5 exact against 7.2e-5 asymptotic for the right one).
        rank = float(stats.mannwhitneyu(recent, older, alternative="greater", method="asymptotic").pvalue)
        if best is None or rank < best[0]:
            best = (rank, k, c)
    return best[1:] if best else None


ENV_CONFIRM_P = 0.01   # a verdict of "environment" also needs the good commits higher than they were, at this p


def judge_environment(fresh: list[float], crashes: int, good: list[float], head: list[float],
                      max_runs: int, crash_limit: int = 2, alpha: float = 0.001, min_effect: float = 0.1) -> Verdict:
    """Whether good commits, measured again tonight (``fresh``), still look
    like their runs of earlier nights (``good``) or like tonight's head
    (``head``). Bad: the environment changed (a driver, a wheel, another
    machine), not the code, and a bisect reusing the earlier nights' runs
    would blame whichever commit splits old runs from new. Judged as a
    bisect judges a commit (``decide.judge``): undecided while more runs
    would help. The head's runs drew high, which is why they are asked
    about, so its model can take good runs for its own: bad also needs the
    fresh runs higher than the earlier ones (one-sided Mann-Whitney at
    ``ENV_CONFIRM_P``, medians ``min_effect`` apart). At ``max_runs``,
    overlapping values can leave it between the two; then that test at
    ``alpha`` decides alone."""
    v = judge_commit(fresh, crashes, verdict_model(good, head), max_runs, crash_limit)
    if v.decision == GOOD:
        return v
    if v.decision == BAD:
        moved = compare(fresh, good, ENV_CONFIRM_P, min_effect)
        if moved.verdict == "regressed":
            return v
        if len(fresh) < max_runs:
            return dataclasses.replace(v, decision=UNDECIDED, reason="")
    if len(fresh) < max_runs:
        return v
    moved = compare(fresh, good, alpha, min_effect)
    if moved.verdict == "regressed":
        return dataclasses.replace(v, decision=BAD, reason=f"undecided between the two, but higher than they "
                                                          f"were: Mann-Whitney p={moved.p_value:.2g}")
    return dataclasses.replace(v, decision=SKIP, reason=v.reason or f"{UNDECIDED_SKIP} {len(fresh)} runs")


# ---- the store: nightly sessions --------------------------------------------------

def _nightly_sessions(store, probe_key: str) -> list:
    rows = store.db.execute("SELECT id FROM sessions WHERE kind='nightly' AND probe_key=? ORDER BY id",
                            (probe_key,)).fetchall()
    return [store.session(r["id"]) for r in rows]


def other_series(store, probe_key: str) -> list[dict]:
    """The judged nights of other probe commands, one entry per command
    (latest first): a changed --probe-cmd starts a new baseline, and the
    nights before it are judged and shown apart (a tester's one-off
    command showed "only 0 baseline values" and `history` lost seven nights)."""
    rows = store.db.execute("SELECT id, probe_key FROM sessions WHERE kind='nightly' AND probe_key != ? "
                            "AND result IS NOT NULL ORDER BY id DESC", (probe_key,)).fetchall()
    out: dict[str, dict] = {}
    for row in rows:
        s = store.session(row["id"])
        if not (s.result or {}).get("verdict"):
            continue
        e = out.setdefault(row["probe_key"], {"probe_cmd": s.config.get("probe_cmd"), "nights": 0,
                                              "last_night": (s.result or {}).get("night", "")})
        e["nights"] += 1
    return list(out.values())


def series_text(series: list[dict]) -> str:
    """``other_series`` in words, with the history command that shows each."""
    return "; ".join(f"{fmt_count(e['nights'], 'night')} (the last {e['last_night']}) of "
                     + (f"`{redact(e['probe_cmd'])}`: `klbisect history --probe-cmd "
                        f"{shlex.quote(redact(e['probe_cmd']))}` shows them" if e["probe_cmd"]
                        else "another probe") for e in series)


def _find_night(store, probe_key: str, night: str, head: str):
    for s in reversed(_nightly_sessions(store, probe_key)):
        if s.bad == head and s.config.get("night") == night and s.state != "ended":
            return s
    return None


def _night_taken(store, probe_key: str, night: str, head: str):
    """The judged session of ``night`` for another head, if any: reusing a
    night's name would put two heads on one date of the trend. A crashed
    night measured nothing: the cron job's retry after the branch moved
    takes the name."""
    for s in _nightly_sessions(store, probe_key):
        if s.bad != head and s.config.get("night") == night and s.state != "ended" and s.result \
                and s.result.get("verdict") not in (None, "crashed"):
            return s
    return None


def today() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())


def _report_path(ws, opts: NightlyOptions, night: str, head: str) -> str:
    if opts.report_path:
        return os.path.abspath(opts.report_path)   # the record outlives the directory it was typed in
    ext = {"md": "md", "html": "html", "json": "json"}[opts.report_format]
    return str(ws.dir / "reports" / f"nightly-{night}-{head[:12]}.{ext}")


# ---- the nightly run -------------------------------------------------------------

def run_nightly(path, cfg, opts: NightlyOptions | None = None, progress: Progress = to_stderr,
                post_out: Callable[[str], None] | None = None) -> dict:
    """Measure tonight's branch head, judge it against recent good nightlies,
    bisect and report a regression. Returns the night's record (also stored
    as the nightly session's result); ``summary(record)`` is the --json
    object. ``post_out`` receives what --dry-run would post (default stdout)."""
    opts = opts or NightlyOptions()
    if opts.runs < 1:
        raise KlbisectError("--runs must be at least 1", EXIT_USAGE)
    if opts.baseline_nights < 1:
        # with none, every night would be a baseline night and nothing is ever compared
        raise KlbisectError(f"--baseline-nights {opts.baseline_nights}: give at least 1 earlier good night "
                            "to compare with (default 5)", EXIT_USAGE)
    if not 0 < opts.alpha < 1:
        raise KlbisectError(f"--alpha {opts.alpha:g}: give a test level between 0 and 1 (e.g. 0.001)", EXIT_USAGE)
    if not (math.isfinite(opts.min_effect) and opts.min_effect >= 0):
        raise KlbisectError(f"--min-effect {opts.min_effect:g}: give how much higher the head's median must be, "
                            "0 or more (0.1 = 10%)", EXIT_USAGE)
    if opts.report_format not in ("md", "html", "json"):
        raise KlbisectError("--format must be md, html or json", EXIT_USAGE)
    if opts.report_path:
        # written only on the night a regression is found, hours in: checked now
        check_writable(os.path.abspath(opts.report_path))
        if opts.report_format != "html":
            check_writable(os.path.splitext(os.path.abspath(opts.report_path))[0] + ".png")
    target = _post_target(path, opts) if (opts.post_to or opts.post_issue) else None
    if target is not None and not opts.dry_run:
        # needed only on the night a regression is found, hours in: checked now
        from .github import check_api_base  # noqa: PLC0415
        check_api_base()
        if not os.environ.get("GITHUB_TOKEN"):
            raise KlbisectError(f"{'--post-to' if opts.post_to else '--post-issue'} ({'%s#%d' % target}) needs "
                                "GITHUB_TOKEN set to a token that may comment there; or pass --dry-run to print "
                                "what would be posted", EXIT_USAGE)
    if cfg.worse != "higher":
        # its tests are one-sided, higher is worse: an accuracy that dropped would read as a fix
        raise KlbisectError(f"--worse {cfg.worse}: nightly judges higher values as worse (a KL divergence); for "
                            "an accuracy, print 1 - accuracy (an error rate) as the value, or bisect a known drop "
                            "with `klbisect run --worse lower`", EXIT_USAGE)
    cfg = dataclasses.replace(cfg, good="", bad="")
    if cfg.probe == "cmd" and not cfg.probe_cmd:
        raise KlbisectError("no probe given: pass --probe-cmd \"...\" (or --probe sglang)", EXIT_USAGE)
    night = opts.night or today()
    if not re.fullmatch(r"[0-9A-Za-z_.:-]{1,40}", night):
        raise KlbisectError(f"--night {night!r}: use a date like 2025-01-31", EXIT_USAGE)
    known = {"night": night, "branch": opts.branch}
    try:
        return _run_night(path, cfg, opts, night, target, progress, post_out, known)
    except (KlbisectError, KeyboardInterrupt) as e:
        # a --json reader sees which night failed (a tester's 155 had none of them), with what
        # was decided before (a night judged regressed, then interrupted, is still a regression)
        e.json_partial = {**known, **(getattr(e, "json_partial", None) or {})}
        raise


def _run_night(path, cfg, opts: NightlyOptions, night: str, target, progress: Progress, post_out,
               known: dict) -> dict:
    """run_nightly once its options are checked: ``known`` gains the head."""
    from .config import make_builder, make_probe  # noqa: PLC0415
    from .workspace import Workspace  # noqa: PLC0415
    ws = Workspace(path, cfg.metric, cfg.worse)
    try:
        head = known["head"] = gitrepo.resolve(ws.repo, opts.branch, "branch")
        probe = make_probe(cfg)
        with ws.locked():
            shallow = _check_history(ws, probe.key, head, progress)
            unfinished = _unfinished_nights(ws, probe.key, head, night, target)
    finally:
        ws.close()
    # A night killed mid-bisect, or whose post failed, is finished first: the next
    # night is a new name, and "rerun the same command" is no advice for a cron job.
    # each to its own night's report file: tonight's -o is tonight's
    earlier = [_finish(path, cfg, dataclasses.replace(opts, report_path=None), r, target, progress, post_out,
                       why=why) for r, why in unfinished]

    ws = Workspace(path, cfg.metric, cfg.worse)
    try:
        builder = make_builder(cfg)
        probe_key, build_key = probe.key, (builder.key if builder else None)
        with ws.locked():
            rec = _measure_and_judge(ws, cfg, opts, night, head, probe, builder, probe_key, build_key,
                                     progress, [shallow] if shallow else [])
            judged_before = rec.pop(JUDGED_BEFORE, False)
            if target is not None and not opts.dry_run and _to_post(rec) and "post_to" not in rec:
                # kept, so that a kill before the post leaves the next night something to finish
                # (a --dry-run posts nothing and owes nothing: a tester's dry run had its night's
                # report posted, as new, by the first real post ten nights and a fix later)
                rec["post_to"] = "%s#%d" % target
                ws.store.update_session(rec["session"], result=rec)
    finally:
        ws.close()
    try:
        rec = _finish(path, cfg, opts, rec, target, progress, post_out)
    except KeyboardInterrupt as e:
        if rec.get("verdict") != "regressed":
            raise
        said = getattr(e, "message", None) or "interrupted"
        what = ("its answer is saved and the next nightly posts it" if "complete" in rec
                else "its bisect is saved: the next nightly finishes it")
        if opts.dry_run and "complete" in rec:     # a dry run's answer is never posted later (a tester's)
            what = "its answer is saved; a --dry-run night is not posted"
        stop = Interrupted(f"{said.split(';')[0]}; night {night} was judged REGRESSED and {what} (or run this "
                           "night again)")
        # so a --json reader still sees the regression, and what earlier nights' work was done
        stop.json_partial = summary(_with_earlier(dict(rec), earlier))
        raise stop from None
    if judged_before:
        rec = _report_again(path, opts, rec, progress)
    post = rec.get("post") or {}
    if opts.dry_run and post.get("error"):
        # a night judged before, whose post failed then: this run posted nothing and the exit
        # code is about this run (the next nightly that posts sends it)
        rec = {**rec, "post": {"target": post.get("target"), "dry_run": True},
               "notes": [*rec.get("notes", []), f"its post to {post.get('target')} failed when the night was "
                         f"judged ({post['error']}); the next nightly with --post-to posts it"]}
    return _with_earlier(rec, earlier)


JUDGED_BEFORE = "_judged_before"     # on a stored record _open_night returns; never saved


def _report_again(path, opts: NightlyOptions, rec: dict, progress: Progress) -> dict:
    """A night whose report was written before, run again with another -o:
    written there too (a tester's rerun with a new -o wrote nothing, and
    said nothing). The stored record keeps the first path."""
    from .report import write_report  # noqa: PLC0415
    # a report that failed to write before (report None, report_error set) is written now too
    had = rec.get("report") or rec.get("report_error")
    if not (opts.report_path and had) or rec.get("report") == os.path.abspath(opts.report_path):
        return rec
    if not (rec.get("bisect_session") or rec.get("bisect_failed")):
        return rec
    if rec.get("bisect_session"):
        try:
            out = write_report(path, fmt=opts.report_format, out=os.path.abspath(opts.report_path),
                               session_id=rec["bisect_session"], offline=opts.offline)["path"]
        except KlbisectError as e:
            return {**rec, "report_error": e.message + (f"; its report is still at {rec['report']}"
                                                        if rec.get("report") else "")}
    else:
        again = {**rec, "notes": list(rec.get("notes", []))}
        out = _write_failed_report(path, opts, again)
        if out is None:
            return {**rec, "report_error": again["report_error"]}
    progress(f"nightly {rec['night']}: judged before; its report written again, to {out}")
    return {**rec, "report": out, "report_error": None}


def _judged_nights(ws, probe_key: str, sid: int | None = None) -> list[dict]:
    """The records of this series' judged nights, oldest first, each with its
    head (a crashed night measured nothing)."""
    return [{**s.result, "head": s.result.get("head") or s.bad} for s in _nightly_sessions(ws.store, probe_key)
            if s.id != sid and (s.result or {}).get("verdict") not in (None, "crashed")]


def _check_history(ws, probe_key: str, head: str, progress: Progress) -> str | None:
    """A shallow clone (actions/checkout's default depth of 1) holds no
    earlier night's head: every night found no baseline, became one, and
    exited 0 past a regression (a tester's). Stopped where any head or
    culprit of this series is not in the clone (a reviewer's depth held the
    last, "known" nights and none of the good heads before them), or where
    they are, but cut off from tonight's (a `git fetch --depth 1` into a kept
    checkout; a shallow clone cannot tell that from a rewrite, a full one
    can: `_apart_from`). Said on a first night, which can form its baseline
    but not bisect later: returned, for the night's notes (a cron job's
    stderr is seldom read; its --json and `history` are)."""
    if not gitrepo.is_shallow(ws.repo):
        return None
    nights = _judged_nights(ws, probe_key)
    wanted = [sha for sha in dict.fromkeys(x for r in nights for x in (r["head"], r.get("culprit")))
              if sha and sha != head]
    cut = gitrepo.missing_commits(ws.repo, wanted) or ([r["head"] for r in nights]
                                                       if _apart_from(ws, probe_key, head) else [])
    if cut:
        several = len(cut) > 1
        raise KlbisectError(f"this clone is shallow and {fmt_count(len(cut), 'commit')} the earlier nights "
                            f"measured or named ({cut[-1][:12]}{', ...' if several else ''}) "
                            f"{'are' if several else 'is'} not in its history: nightly judges tonight against "
                            "earlier nights' heads and bisects between them; fetch the whole history (`git fetch "
                            "--unshallow`; in GitHub Actions, `fetch-depth: 0` in actions/checkout) and run it "
                            "again (if the branch was force-pushed since, they are gone for good, and a night in a "
                            "full clone starts a new baseline)", EXIT_REVISION)
    if nights:
        return None
    note = ("this clone is shallow: tonight can become the baseline, but later nights need its head in their "
            "history to compare with it and to bisect; fetch the whole history (`git fetch --unshallow`; in "
            "GitHub Actions, `fetch-depth: 0` in actions/checkout)")
    progress(f"klbisect: warning: {note}")
    return note


def _apart_from(ws, probe_key: str, head: str, sid: int | None = None) -> tuple[int, str, dict] | None:
    """The judged nights, when none of their heads is ``head`` or in its
    history (how many, the last one's night, and the record of the last
    but suspect nights, which leave a regression open): the branch was rewritten
    (a tester's force-push brought in a regression, and the night became a
    silent new baseline), or --branch names another line of history."""
    nights = _judged_nights(ws, probe_key, sid)
    heads = list(dict.fromkeys(r["head"] for r in reversed(nights)))
    if not heads or head in heads or any(gitrepo.is_ancestor(ws.repo, h, head) for h in heads):
        return None
    return (len(nights), nights[-1].get("night", ""),
            next((r for r in reversed(nights) if r["verdict"] != "suspect"), nights[-1]))


def _apart_note(ws, head: str, n: int, night: str, last: dict) -> str:
    """What a night apart from the earlier ones says, with the regression
    the last of them left open: a rewrite that dropped its culprit ended it
    without a "fixed" (the night is a new baseline either way)."""
    note = (f"no earlier night's head ({fmt_count(n, 'night')}, the last {night}) is in "
            f"{head[:12]}'s history: the branch was rewritten (e.g. force-pushed), or --branch names another "
            "line of history; tonight starts a new baseline, and a regression a rewrite brought in is not "
            "seen (`klbisect history` shows the earlier nights' values)")
    if last.get("verdict") not in OPEN_VERDICTS:
        return note
    return f"{note}; {_untracked(ws, head, last)}"


def _same_line(a: str, b: str) -> bool:
    """Whether two nights' --branch name one line of history: the same
    name, or both a commit's sha (a CI job that passes the sha it checked
    out: every night's differs; a tester's same culprit was posted twice)."""
    return a == b or bool(_SHA.fullmatch(a) and _SHA.fullmatch(b))


_SHA = re.compile(r"[0-9a-f]{7,40}")


def _untracked(ws, head: str, last: dict) -> str:
    """What becomes of the regression ``last`` left open when its head is
    not in tonight's history."""
    since = last.get("known_since") or last.get("night", "")
    culprit = last.get("culprit")
    if not culprit:
        return f"the regression found on {since} is no longer tracked"
    named = f"{culprit[:12]}" + (f" (#{last['pr']})" if last.get("pr") else "")
    gone = ("its culprit is not in tonight's history: the rewrite dropped it or rebased it (a regression found "
            "tonight whose bisect names the same PR is it; not posted as fixed)"
            if not gitrepo.is_ancestor(ws.repo, culprit, head) else "its culprit is in tonight's history")
    return f"the regression found on {since} ({named}) is no longer tracked: {gone}"


def _rewritten_open(ws, probe_key: str, head: str, branch: str, sid: int | None = None) -> dict | None:
    """The last judged night of ``branch`` (suspect ones aside) when it left
    a regression open on a head that is not in tonight's history (a
    force-push that rewrote only the newest commits; called when older
    nights' heads are there and no open regression is): the night was
    skipped as if it had never been, so a dropped culprit read as a quiet
    good night and a rebased one as a new regression (a tester's)."""
    nights = [r for r in _judged_nights(ws, probe_key, sid)
              if r["verdict"] != "suspect" and _same_line(r.get("branch", branch), branch)]
    last = nights[-1] if nights else None
    if last is None or last["verdict"] not in OPEN_VERDICTS or last["head"] == head \
            or gitrepo.is_ancestor(ws.repo, last["head"], head):
        return None
    return last


def _with_earlier(rec: dict, earlier: list[dict]) -> dict:
    if earlier:
        rec["earlier"] = [summary(r) | {"night": r["night"]} for r in earlier]
    return rec


def _to_post(rec: dict) -> bool:
    """A night that tells the issue something: a regression (once its
    bisect is sure) or the fix of the open one."""
    return (rec.get("verdict") == "regressed" and rec.get("complete") is not False) or bool(rec.get("fixed"))


def _finish(path, cfg, opts: NightlyOptions, rec: dict, target, progress: Progress, post_out,
            why: str = "") -> dict:
    """What a judged night still owes: the environment check and the
    bisect of a regression, then the post."""
    from .config import make_builder, make_probe  # noqa: PLC0415
    from .workspace import Workspace  # noqa: PLC0415
    if why:
        progress(f"nightly {rec['night']} ({rec['head'][:12]}): {why}: finishing it first")
    if rec["verdict"] == "regressed" and rec.get("state") != "done" and "env_check" not in rec:
        ws = Workspace(path, cfg.metric, cfg.worse)
        try:
            probe, builder = make_probe(cfg), make_builder(cfg)
            with ws.locked():
                rec = _check_environment(ws, cfg, opts, rec, probe, builder, probe.key,
                                         builder.key if builder else None, progress)
        finally:
            ws.close()
    if rec["verdict"] == "regressed" and rec.get("state") != "done":
        rec = _bisect_and_report(path, cfg, opts, rec, progress, keep_unfinished=bool(why))
    if not _to_post(rec) or rec.get("unfinished_error"):
        pass
    elif target is not None:
        rec = _post(path, opts, rec, target, progress, post_out)
    elif opts.dry_run:
        # "--dry-run prints what it would post": with nowhere to post, a tester saw no word of it
        progress("--dry-run: nothing would be posted (no --post-to or --post-issue); `klbisect report` "
                 "shows the report")
    return rec


def _unfinished_nights(ws, probe_key: str, head: str, night: str, target) -> list[tuple[dict, str]]:
    """Earlier nights a kill or a failed post left owing something, oldest
    first, each with why: the open regression's night when its bisect never
    returned, and nights whose report (or fix) was to be posted and was
    not. Tonight's own night, run again, finishes in the usual way. A
    --dry-run night shows what it would post for them and marks nothing."""
    st = ws.store
    tonight = _find_night(st, probe_key, night, head)
    sid = tonight.id if tonight else -1
    out: dict[int, tuple[dict, str]] = {}
    _, _, found = _open_regression(ws, probe_key, head, sid)
    if found and found.get("verdict") == "regressed" and found.get("state") == "bisecting" \
            and "complete" not in found:
        out[found["session"]] = (found, "its bisect failed on its night" if found.get("unfinished_error")
                                 else "its bisect was interrupted")
    recent = _nightly_sessions(st, probe_key)[-POST_RETRY_NIGHTS:]
    # a regression a later night found fixed is old news: the fix's post names it
    fixed = {(s.result or {}).get("fixed", {}).get("known_since") for s in recent}
    for s in recent:
        # a bisect the machine failed, of a regression a later one (worse again) took the
        # open place of: it was left for good, never posted (a reviewer's)
        r = s.result or {}
        if s.id != sid and s.id not in out and r.get("verdict") == "regressed" and r.get("state") == "bisecting" \
                and r.get("unfinished_error") and "complete" not in r and r["night"] not in fixed \
                and gitrepo.is_ancestor(ws.repo, r["head"], head):
            out[s.id] = (r, "its bisect failed on its night")
    if target is not None:
        for s in recent:
            r = s.result or {}
            if s.id == sid or s.id in out or not r.get("post_to") or not _to_post(r) \
                    or st.get(f"nightly-posted:{s.id}") or (r.get("verdict") == "regressed" and r["night"] in fixed):
                continue
            if r.get("verdict") == "regressed" and r.get("state") != "done":
                continue    # its bisect is unfinished and not the open regression's: not ours to resume
            post = r.get("post") or {}
            out[s.id] = (r, f"its post to {r['post_to']} failed ({post['error']})" if post.get("error")
                         else f"its report was never posted to {r['post_to']}")
    return [out[k] for k in sorted(out)]


class _Meter(WorktreeMeter):
    """A nightly session's meter: ``close`` also lets a builder that changed
    the user's environment (--build sglang) put it back."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            # a second Ctrl-C while the worktree goes must not leave the interpreter on it
            close_builder(self.builder, self.progress)


def _measure_and_judge(ws, cfg, opts, night, head, probe, builder, probe_key, build_key, progress,
                       notes: list[str] = ()) -> dict:
    """Tonight's session: the head measured until its verdict is decided,
    then the night's record (verdict, ``notes`` and its own, where a bisect
    starts)."""
    opened = _open_night(ws, cfg, opts, night, head, probe_key, progress)
    if isinstance(opened, dict):
        return opened     # judged already: the same night and head give the same answer
    sid, subj = opened
    sides = _Sides.load(ws, cfg, opts, probe_key, build_key, head, sid)
    meter = _Meter(ws, sid, probe, builder, progress)
    try:
        _measure_head(ws, cfg, opts, sid, head, sides, meter.measure, progress)
        confirmation = _confirm(ws, cfg, opts, sid, head, sides, meter.measure, progress)
    finally:
        meter.close()
    return _night_record(ws, cfg, opts, night, head, subj, sid, sides, probe, progress, notes, confirmation)


@dataclass
class _Confirmation:
    unconfirmed: str = ""   # why fresh runs did not show it (the night is then suspect)
    note: str = ""          # what the night says of a confirmation that could not be made


def _confirm(ws, cfg, opts, sid: int, head: str, sides: _Sides, measure, progress: Progress) -> _Confirmation:
    """A regression judged on tonight's runs, measured again on fresh runs
    of the head (``confirm_night``)."""
    j = sides.judge(list(sides.head_runs().values))
    if j.verdict != "regressed" or j.worse_again or j.pooled:
        return _Confirmation()   # worse than the open regression is judged against it; the suspect nights were borderline already
    st = ws.store
    # the runs taken to confirm it, kept: a night interrupted while confirming (a cron retry of a
    # killed night) goes on with them, and runs its judging took after them are not fresh
    key = f"nightly-confirm:{sid}"
    taken: list[int] = json.loads(st.get(key) or "[]")
    want = max(CONFIRM_RUNS, opts.runs)

    def fresh() -> list:
        return [r for r in st.session_runs(sid) if r.id in set(taken)]

    progress(f"  regressed{' on label ' + j.label if j.label else ''}: confirming it on {want} fresh runs of the "
             "head (the runs that decided it are the ones that came out high)")
    while len(_run_values(fresh(), j.label)) < want and len(taken) < want + cfg.crash_limit:
        before = {r.id for r in st.session_runs(sid)}
        out, run = measure(head)
        taken += [r.id for r in st.session_runs(sid) if r.id not in before and r.sha == head]
        st.put(key, json.dumps(taken))
        if out.build_failed:
            break
        if run is not None:
            progress(f"  confirming run {len(taken)}: {_shown(run, j.label or None)}")
    vals = _run_values(fresh(), j.label)
    base = label_runs(sides._runs_after(sides.baseline_shas), j.label) if j.label else list(sides.baseline)
    if len(vals) < 2:
        said = (f"not confirmed: the head gave {fmt_count(len(vals), 'value')} on its {len(taken)} fresh runs; "
                "judged on its runs before them")
        progress(f"  {said}")
        return _Confirmation(note=said)
    c = confirm_night(vals, base, opts.min_effect)
    if c.verdict == "regressed":
        progress(f"  confirmed: {c.reason}")
        return _Confirmation()
    progress(f"  not confirmed: {c.reason}")
    return _Confirmation(f"not confirmed on {len(vals)} fresh runs of the head"
                         f"{' (label ' + j.label + ')' if j.label else ''}: {c.reason}, not <= {CONFIRM_P:g} with a "
                         f"median {1 + opts.min_effect:g}x the baseline's; kept out of the baseline, and the next "
                         "nights' runs are pooled with tonight's")


def _open_night(ws, cfg, opts, night, head, probe_key, progress):
    """Tonight's session id and the head's subject; or, when the night and
    head were judged already, their record."""
    st = ws.store
    sess = _find_night(st, probe_key, night, head)
    other = _night_taken(st, probe_key, night, head)
    if sess is None and other is not None:
        raise KlbisectError(f"night {night} was judged already, for {opts.branch} at {other.bad[:12]} "
                            f"(session {other.id}); the branch is now at {head[:12]}: name this run "
                            f"another night, e.g. --night {night}.2 (what that night left unfinished, the "
                            f"next nightly finishes; or --night {night} --branch {other.bad[:12]} now)",
                            EXIT_USAGE)
    if sess is not None and sess.result and sess.result.get("verdict") not in (None, "crashed"):
        progress(f"nightly {night} for {head[:12]} already judged (session {sess.id}): "
                 f"{sess.result['verdict']}")
        return {**sess.result, JUDGED_BEFORE: True}
    if sess is not None and sess.result:
        # no value is no verdict: the cron job's retry after a fixed environment measures it
        progress(f"nightly {night} for {head[:12]} gave no value when it ran before (session {sess.id}): "
                 "measuring it again")
    subj = gitrepo.subject(ws.repo, head)
    config = {**cfg.question(), "night": night, "branch": opts.branch, "runs": opts.runs}
    if sess is None:
        sid = st.create_session("nightly", None, head, probe_key, config,
                                [(head, subj, gitrepo.parse_pr(subj))])
    else:
        # an unjudged night resumed, perhaps with a mistyped option fixed: the night
        # is judged by tonight's options, and `history` reads them from here
        sid = sess.id
        st.update_session(sid, config=config)
    progress(f"nightly {night}: {opts.branch} at {head[:12]} {fmt_subject(subj)} (session {sid})")
    return sid, subj


@dataclass
class _Sides:
    """What tonight's head is judged against: the baseline of good nights,
    the suspect nights pooled with it, and the regression still open. The
    value lists are updated in place as their heads are measured again."""

    ws: object
    cfg: object
    opts: NightlyOptions
    probe_key: str
    build_key: str | None
    head: str
    baseline_shas: list[str]
    baseline_nights: list[str]
    suspect_shas: list[str]
    suspect_nights: list[str]
    openr: dict | None          # the open regression's latest night
    found: dict | None          # the night that found it
    found_heads: list[str]
    known_heads: list[str]
    baseline: list[float]
    borderline: list[float]
    # The open regression as found; on the label its bisect judged, when it judged one
    # (a fix is then as plain as the regression was, not blurred by the other labels).
    open_label: str | None
    # And from the runs measured since the night that found it: that night's came out
    # high, which is partly why it was found, and against them a head still regressed
    # looked fixed, joined the baseline and had the same culprit bisected and reported
    # again (0.20% of known nights; 0.11% against six fresh runs: scripts/nightly_false_calls.py).
    open_after: int
    earlier: dict = field(default_factory=dict)     # the known heads' runs as the night began
    # the store's last build id as this command began: a build of the head that failed
    # before it (a night that crashed on a missing compiler, fixed since) is tried once more
    first_build: int = 0
    open_bad: list[float] = field(default_factory=list)
    open_bad_label: list[float] = field(default_factory=list)
    open_fresh: int = 0

    @classmethod
    def load(cls, ws, cfg, opts, probe_key, build_key, head, sid) -> "_Sides":
        from .workspace import commit_runs  # noqa: PLC0415
        baseline_shas, baseline_nights = _baseline(ws, probe_key, head, opts.baseline_nights, sid)
        suspect_shas, suspect_nights = _suspects(ws, probe_key, head, sid)
        openr, open_shas, found = _open_regression(ws, probe_key, head, sid)
        known_heads = baseline_shas + suspect_shas + open_shas
        # which labels a complete run prints, from the nights before too: tonight's runs may all
        # die after the first label (a broken NCCL), and read alone they look complete
        earlier = commit_runs(ws, probe_key, build_key, known_heads, cfg.timeout)
        sides = cls(ws, cfg, opts, probe_key, build_key, head, baseline_shas, baseline_nights, suspect_shas,
                    suspect_nights, openr, found, [found["head"]] if found else open_shas, known_heads,
                    [v for s in baseline_shas for v in earlier[s].values],
                    [v for s in suspect_shas for v in earlier[s].values],
                    (found or {}).get("bisect_metric"), found["session"] if found else 0, earlier,
                    first_build=ws.store.last_build_id())
        sides.refresh_open()
        return sides

    def _runs_after(self, shas: list[str], after: int = 0) -> list:
        return [r for r in self.ws.store.runs(self.probe_key, shas) if not after or (r.session_id or 0) > after]

    def _label_values(self, shas: list[str], after: int = 0) -> list[float]:
        return label_runs(self._runs_after(shas, after), self.open_label)

    def _by_label(self, shas: list[str], after: int = 0, but_open: bool = True) -> dict[str, list[float]]:
        """Every label's values (but the open one's), from one read of the runs."""
        runs = self._runs_after(shas, after)
        labels = {k for r in runs if r.value is not None for k in (r.values or {})}
        return {lab: label_runs(runs, lab) for lab in labels - ({self.open_label} if but_open else set())}

    def refresh_open(self) -> None:
        """The open regression's reference values (max, label) and how many
        runs are fresh, read again."""
        from .workspace import commit_runs  # noqa: PLC0415
        after = self.open_after
        fresh = commit_runs(self.ws, self.probe_key, self.build_key, self.found_heads, self.cfg.timeout,
                            after_session=after)
        n_fresh = sum(len(fresh[s].values) for s in self.found_heads)
        if not n_fresh:
            after, fresh = 0, self.earlier    # none since (the head no longer runs): the runs there are
        self.open_bad[:] = [v for s in self.found_heads for v in fresh[s].values]
        self.open_bad_label[:] = self._label_values(self.found_heads, after) if self.open_label else []
        self.open_fresh = n_fresh

    def remeasured(self, side: str) -> None:
        """After a run of one of ``side``'s heads: its values read again."""
        from .workspace import commit_runs  # noqa: PLC0415
        if side == "open":
            self.refresh_open()
            return
        again = commit_runs(self.ws, self.probe_key, self.build_key, self.baseline_shas, self.cfg.timeout)
        self.baseline[:] = [v for sha in self.baseline_shas for v in again[sha].values]

    def judge(self, values: list[float]) -> Judgement:
        opts = self.opts
        mine = self._label_values([self.head]) if self.open_bad_label else []
        j = judge_night(values, self.baseline, self.borderline, self.open_bad_label if mine else self.open_bad,
                        opts.alpha, opts.min_effect, opts.min_baseline, open_head=mine or None,
                        open_whole=self.open_bad if mine else None, open_label=self.open_label or "")
        if j.verdict in ("good", "suspect") and not self.open_bad and not self.cfg.metric and self.baseline_shas:
            every = functools.partial(self._by_label, but_open=False)
            lab = judge_labels(every([self.head]), every(self.baseline_shas),
                               every(self.suspect_shas) if self.suspect_shas else None,
                               opts.alpha, opts.min_effect, opts.min_baseline)
            if lab is not None and (lab.verdict == "regressed" or j.verdict == "good"):
                # the label's comparison is the night's (its p, ratio and summaries beside the verdict:
                # a reviewer's "REGRESSED — label l2" stood above the max's medians, barely apart)
                return dataclasses.replace(lab, reason=f"{lab.reason}; the max over labels: {j.reason}")
        if mine and j.verdict == "known" and not j.more:
            # the open regression's label is as it was, but another label may have moved on
            # top of it: the max over labels against the open regression's says so
            whole = judge_night(values, self.baseline, self.borderline, self.open_bad, opts.alpha,
                                opts.min_effect, opts.min_baseline)
            if whole.worse_again or (whole.verdict == "known" and whole.more):
                return whole
        if j.verdict == "known" and not j.more and not self.cfg.metric:
            # the other labels, one by one, against the open regression's head
            again = judge_labels_again(self._by_label([self.head]),
                                       self._by_label(self.found_heads, self.open_after if self.open_fresh else 0),
                                       opts.alpha, opts.min_effect, opts.min_baseline)
            if again is not None:
                # the night's own comparison stays what `history` shows; the label's is in the reason,
                # first: it is why the night is borderline (a tester read a p of 0.00075 as the cause)
                return dataclasses.replace(again, cmp=j.cmp, reason=f"{again.reason}; {j.reason}"
                                           if again.verdict == "known" else again.reason)
        return j

    def head_runs(self):
        """Tonight's head as ``commit_runs`` counts it, labels judged with the nights before."""
        from .workspace import commit_runs  # noqa: PLC0415
        return commit_runs(self.ws, self.probe_key, self.build_key, [self.head], self.cfg.timeout,
                           labels_from=self.known_heads, failed_after=self.first_build)[self.head]


def _measure_head(ws, cfg, opts, sid: int, head: str, sides: _Sides, measure, progress: Progress) -> None:
    """Runs of the head (and, where a side is the thinner one, of its heads)
    until the night's verdict is decided or its runs are spent."""
    st = ws.store
    found, baseline_shas = sides.found, sides.baseline_shas
    target = opts.runs
    cap_values = max(cfg.max_runs or DEFAULT_MAX_RUNS, opts.runs)
    base_tries = 0
    open_tries = 0
    # crashes an earlier command of this unjudged night left (a probe not found, fixed since)
    # are no reason to stop this one before it has run the probe itself
    stale = {r.id for r in st.session_runs(sid) if r.sha == head and r.value is None}
    crashes_before = sides.head_runs().crashes
    while True:
        cr = sides.head_runs()
        mine = [r for r in st.session_runs(sid) if r.sha == head and r.id not in stale]
        # as commit_runs counts them: a run that died after its first label is a crash too
        mine_crashes = cr.crashes - crashes_before
        if len(cr.values) >= target:
            if found and sides.open_fresh < OPEN_RUNS and open_tries < OPEN_RUNS + cfg.crash_limit:
                open_tries += 1
                progress(f"  one more run of the open regression's head {found['head'][:12]} ({sides.open_fresh} "
                         f"since {found['night']}, need {OPEN_RUNS}: the runs that found it came out high, "
                         "which is partly why it was found)")
                measure(found["head"])
                sides.refresh_open()
                continue
            j = sides.judge(list(cr.values))
            if (j.more and baseline_shas and base_tries < cap_values
                    and not reachable(cap_values, len(sides.baseline), opts.alpha)
                    and reachable(cap_values, len(sides.baseline) + cap_values - base_tries, opts.alpha)):
                # a young baseline: even every head run above every baseline run could
                # not reach --alpha, so the night would stay suspect however clear (and
                # when the runs it may still get could not reach it either, none are spent)
                base_tries += 1
                progress(f"  borderline, and {len(sides.baseline)} baseline runs cannot reach p <= {opts.alpha:g} "
                         f"with {cap_values} head runs: one more run of the baseline head "
                         f"{baseline_shas[0][:12]}")
                measure(baseline_shas[0])
                sides.remeasured("baseline")
                continue
            if j.more and len(cr.values) < cap_values:
                target = len(cr.values) + 1
                progress(f"  borderline ({j.reason}): one more run")
                continue
            # Still borderline with the head at its runs: the other side may be the
            # thinner one. A baseline that drew low by chance would make every later
            # night suspect, and no night could rejoin it (seen: eleven suspect nights
            # in a row with no change at all); a regression found on ten runs could
            # never be shown fixed by ten. That side's heads are measured again.
            side = {"baseline": (baseline_shas, sides.baseline),
                    "open": (sides.found_heads, sides.open_bad)}.get(j.other_side)
            if j.more and side and side[0] and len(side[1]) < len(cr.values) + len(sides.borderline) + cap_values \
                    and base_tries < cap_values:
                shas, vals = side
                sha = shas[base_tries % len(shas)]
                base_tries += 1
                progress(f"  still borderline after {len(cr.values)} runs against {len(vals)} runs of the "
                         f"{'baseline' if j.other_side == 'baseline' else 'open regression'}: one more run "
                         f"of {sha[:12]}")
                measure(sha)
                sides.remeasured(j.other_side)
                continue
            break
        if cr.build_failed:
            progress(f"  {head[:12]} does not build: no value tonight")
            break
        if not cr.values and mine_crashes >= cfg.crash_limit:
            break  # a crashed night: no value, so no evidence of anything
        if mine and mine[-1].status == STATUS_NOTFOUND:
            # the shell's "command not found": no second run will differ
            if not cr.values:
                break
            raise KlbisectError(f"the probe command was not found (exit 127) at the head {head[:12]}; check "
                                f"--probe-cmd; log: {mine[-1].log_path}", EXIT_PROBE_MISSING)
        if len(mine) >= cap_values + cfg.crash_limit:
            break
        out, run = measure(head)
        if out.build_failed:
            progress(f"  build failed: {out.build.log_path}")
        elif run is not None:
            progress(f"  run {len(mine) + 1}: {_shown(run)}")


def _night_record(ws, cfg, opts, night, head, subj, sid, sides: _Sides, probe, progress,
                  notes: list[str] = (), confirmation: _Confirmation | None = None) -> dict:
    """The night's verdict from the head's runs, stored with its notes and,
    for a regression, where its bisect starts and on which label."""
    from .config import make_builder  # noqa: PLC0415
    from .workspace import commit_runs  # noqa: PLC0415
    st = ws.store
    baseline_shas, baseline_nights = sides.baseline_shas, sides.baseline_nights
    openr, found, found_heads = sides.openr, sides.found, sides.found_heads
    cr = sides.head_runs()
    j = sides.judge(list(cr.values))
    confirmation = confirmation or _Confirmation()
    unconfirmed = confirmation.unconfirmed
    if unconfirmed and j.verdict == "regressed" and not j.worse_again:
        j = dataclasses.replace(j, verdict="suspect", reason=f"{j.reason}; not confirmed on fresh runs (note)")
    cmp = j.cmp
    if not cr.values:
        from .endpoints import endpoint_problem  # noqa: PLC0415
        # --branch given as a sha: "the head of 093d5bd 093d5bd5aec4" says it twice
        where = "the head" if head.startswith(opts.branch.lower()) else f"the head of {opts.branch}"
        why = endpoint_problem(ws, "head", head, sides.probe_key, sides.build_key, cr, 1, where=where,
                               metric_regex=cfg.metric_regex)
        if why is not None and why.code in (EXIT_USAGE, EXIT_PROBE_MISSING):
            raise why       # the command is wrong, not the branch: no verdict, rerun once fixed
        if why is not None:
            j = dataclasses.replace(j, reason=why.message)
            if why.detail:
                progress(f"  the log's last lines:\n{why.detail}")
    probe_key, build_key = sides.probe_key, sides.build_key
    suspect_shas, suspect_nights, borderline, open_bad = (sides.suspect_shas, sides.suspect_nights,
                                                         sides.borderline, sides.open_bad)
    drift, tonight = False, cmp
    recent_shas: list[str] = []
    anchor_shas: list[str] = []
    anchor_nights: list[str] = []
    env = None
    if j.verdict in ("good", "suspect") and openr is None and baseline_shas:
        env = _seen_environment(ws, cfg, opts, sid, probe_key, head, baseline_shas,
                                lambda: _Meter(ws, sid, probe, make_builder(cfg), progress),
                                progress)
    if j.verdict == "good" and openr is None and cr.values and env is None:
        # The baseline slides: a regression whose first nights drew low joined it, and
        # once it holds only regressed heads nothing is worse than it. The trend of the
        # good nights before tonight still shows it (nightly.judge_trend).
        trend_shas, trend_nights = _baseline(ws, probe_key, head, TREND_NIGHTS * opts.baseline_nights, sid,
                                             trend=True)
        by_sha = commit_runs(ws, probe_key, build_key, trend_shas, cfg.timeout)
        t = judge_trend(list(cr.values), [list(by_sha[x].values) for x in trend_shas], opts.alpha,
                        opts.min_effect, opts.min_baseline)
        if t is not None:
            k, d = t
            drift, cmp = True, d     # what decided: its p and ratio are the night's; the summaries stay tonight's
            recent_shas, anchor_shas, anchor_nights = trend_shas[:k], trend_shas[k:], trend_nights[k:]
            j = Judgement("regressed", d, False,
                          f"drift: tonight and the good nights {', '.join(trend_nights[:k])} (median "
                          f"{fmt_value(d.head['median'])} over {d.head['n']} runs) against the good nights before "
                          f"them, {', '.join(anchor_nights)} (median {fmt_value(d.baseline['median'])} over "
                          f"{d.baseline['n']} runs): {fmt_ratio(d.head['median'], d.baseline['median'])}, "
                          f"Mann-Whitney p={d.p_value:.2g} <= {opts.alpha:g} over {len(trend_shas) - 1} splits")
    rec = {"night": night, "branch": opts.branch, "head": head, "subject": subj,
           "session": sid, "verdict": j.verdict, "p_value": cmp.p_value, "ratio": cmp.ratio,
           "reason": j.reason, "values": list(cr.values),
           # tonight's: a head measured on an earlier night (crashed, or judged) keeps that night's
           "crashes": commit_runs(ws, probe_key, build_key, [head], cfg.timeout, labels_from=sides.known_heads,
                                  session=sid)[head].crashes,
           "build_failed": bool(cr.build_failed),
           "head_summary": tonight.head, "baseline_summary": tonight.baseline,
           # whose values the summaries are, when one label's decided (else the max over labels)
           # (a "known" night's label is the open regression's, its numbers the max's against the baseline)
           "judged_label": j.label if j.label and j.verdict in ("regressed", "suspect") and not j.worse_again
           and not drift else None,
           "baseline_heads": baseline_shas, "baseline_nights": baseline_nights,
           "last_good": baseline_shas[0] if baseline_shas else None,
           "culprit": None, "pr": None, "report": None, "bisect_session": None,
           "notes": list(notes) + ([confirmation.note] if confirmation.note and j.verdict == "regressed" else []),
           "drift": drift}
    if drift:
        rec.update(anchor_heads=anchor_shas, anchor_nights=anchor_nights, bisect_good=anchor_shas[-1],
                   anchor_summary=cmp.baseline)
        rec["notes"].append(f"a regression the baseline absorbed: bisecting from {anchor_shas[-1][:12]}, the "
                            f"oldest good head of the trend (night {anchor_nights[-1]})")
    same = [r["night"] for r in _judged_before(ws, probe_key, head, sid) if r.get("head") == head] \
        if j.verdict == "baseline" and not baseline_shas else []
    if same:
        # "only 0 baseline values" read as if those nights' runs were lost (a tester's)
        rec["notes"].append(f"{', '.join(reversed(same))} measured this same head: a night is compared with the "
                            "good nights of earlier heads, and tonight's runs join this head's")
    others = other_series(st, probe_key) if j.verdict == "baseline" and not baseline_shas else []
    if others:
        rec["notes"].append("the first night of this --probe-cmd: earlier nights ran another, and their runs are "
                            "not compared with its runs (a changed command may measure otherwise); "
                            + series_text(others))
    apart = (_apart_from(ws, probe_key, head, sid) if j.verdict == "baseline" and not baseline_shas and not same
             else None)
    rewritten = None if apart or openr is not None else _rewritten_open(ws, probe_key, head, opts.branch, sid)
    if apart or rewritten:
        note = (_apart_note(ws, head, *apart) if apart else
                f"night {rewritten.get('night', '')}'s head {rewritten['head'][:12]} is not in {head[:12]}'s "
                f"history (the branch was rewritten, e.g. force-pushed): {_untracked(ws, head, rewritten)}")
        rec["notes"].append(note)
        progress(f"klbisect: warning: {note}")
    if rewritten and rewritten.get("culprit"):
        rec["rewritten_open"] = {"night": rewritten.get("known_since") or rewritten.get("night"),
                                 "culprit": rewritten["culprit"], "pr": rewritten.get("pr")}
    if j.verdict == "suspect" and unconfirmed:
        rec["notes"].append(unconfirmed)
    elif j.verdict == "suspect":
        rec["notes"].append(f"still borderline after {len(cr.values)} runs: kept out of the baseline; "
                            "the next nights' runs are pooled with this night's until they decide")
    if j.verdict in ("regressed", "good") and suspect_nights and borderline:
        rec["notes"].append(f"the suspect nights {', '.join(suspect_nights)} were "
                            + ("part of this regression" if j.verdict == "regressed"
                               else "not confirmed (they stay out of the baseline)"))
    if openr is not None:
        # the night that found it holds its bisect's answer; a later night judged while
        # that bisect was unfinished (killed, resumed since) carries none
        src = found if found is not None and found.get("bisect_session") else openr
        known = {"culprit": src.get("culprit"), "pr": src.get("pr"), "report": src.get("report"),
                 "bisect_session": src.get("bisect_session"),
                 "known_since": openr.get("known_since") or openr["night"],
                 # the night that found it: its bisect failed, or waits for a machine that works
                 "unfinished": found is not None and "complete" not in found
                 and bool(found.get("unfinished_error") or found.get("bisect_failed"))}
        unsure = found is not None and found.get("complete") is False
    if j.worse_again:
        # from the head the comparison was made against (the night that found the open
        # regression): a later "known" night's head may already hold the new one, having
        # read borderline against it
        against = f"on {j.label}" if j.label else f"(against {len(open_bad)} runs of its head)"
        rec["notes"].append(f"worse again than the open regression of {known['known_since']} "
                            f"{against}: bisecting from {found_heads[-1][:12]}")
        rec["bisect_good"] = found_heads[-1]
        if j.label:
            rec["bisect_metric"] = j.label
        rec["open"] = known     # what this night is, should its bisect not confirm it
    elif j.verdict == "known":
        rec.update(known)
        if unsure:
            # the limit its own note named (a reviewer's: --max-total-runs, where --max-runs held it)
            cap = next(("--max-runs" for n in found.get("notes", []) if "a higher --max-runs" in n),
                       "--max-total-runs")
            rec["notes"].append(f"the regression found on {rec['known_since']} is still there; its bisect "
                                "stopped before --confidence: `klbisect nightly --night "
                                f"{found['night']} --branch {found['head'][:12]}` with a higher "
                                f"{cap} resumes it")
        else:
            rec["notes"].append(f"the regression found on {rec['known_since']} is still there "
                                "(not bisected or posted again)")
        if j.more:
            rec["notes"].append(f"tonight may be worse than it{f' on {j.label}' if j.label else ''}, short of "
                                f"p <= {opts.alpha:g} after "
                                f"{len(cr.values)} runs: the next nights' runs will tell")
    elif openr is not None and j.verdict == "good":
        rec["notes"].append(f"the regression found on {known['known_since']} is fixed")
        rec["fixed"] = known
    if j.verdict == "regressed" and j.label and not j.worse_again:
        rec["bisect_metric"] = j.label      # the label that moved: the max would blur it
    if j.verdict == "regressed" and not rec.get("bisect_good"):
        _bisect_from_baseline(ws, probe_key, head, sid, rec)
    if j.verdict == "regressed":
        # the runs the verdict rests on: tonight's side, and the side it was judged against
        rec["against_heads"] = found_heads if j.worse_again else anchor_shas if drift else baseline_shas
        rec["pooled_heads"] = [head] + ([] if j.worse_again else recent_shas if drift else suspect_shas)
    if j.verdict == "regressed" and not cfg.metric and not rec.get("bisect_metric"):
        _bisect_on_moved_label(st, probe_key, opts, rec, cmp)
    if env is not None:
        _as_environment(rec, env[1], env[0], progress)
    else:
        progress(f"nightly {night}: {rec['verdict'].upper()}: {j.reason}")
    rec["state"] = "bisecting" if rec["verdict"] == "regressed" else "done"
    rec["judged_notes"] = len(rec["notes"])     # the bisect's own notes follow, once per attempt
    st.update_session(sid, result=rec, state=rec["state"],
                      ended=time.time() if rec["state"] == "done" else None)
    return rec


def _bisect_from_baseline(ws, probe_key: str, head: str, sid: int, rec: dict) -> None:
    """Where a regressed night's bisect starts: the oldest head of the
    baseline, not the latest. A regression whose first night drew low was
    called good and sits in the baseline, and a bisect from that head would
    search a range with no regression in it (and run to its limits); the
    pool as a whole showed the difference, and a longer range costs a few
    runs. Not from before a regression that was found and fixed since: that
    range goes bad, good, bad again, and its bisect names the old culprit (a
    tester's: posted twice)."""
    baseline_shas, baseline_nights = rec["baseline_heads"], rec["baseline_nights"]
    old = _earlier_culprits(ws, probe_key, head, sid)
    since_fix = [(h, nt) for h, nt in zip(baseline_shas, baseline_nights)
                 if all(gitrepo.is_ancestor(ws.repo, c, h) for c in old)]
    ends = since_fix or list(zip(baseline_shas, baseline_nights))
    rec["bisect_good"] = ends[-1][0]
    if len(ends) > 1:
        rec["notes"].append(f"bisecting from {ends[-1][0][:12]}, the oldest of the {len(ends)} "
                            f"baseline heads (nights {', '.join(nt for _, nt in ends)}): a regression that "
                            "drew low on its first night may sit in the newer ones")
    if since_fix and len(since_fix) < len(baseline_shas):
        rec["notes"].append(f"not from an older baseline head: the range would hold the culprit of an earlier "
                            f"regression ({', '.join(c[:12] for c in old)}) and its fix")


def _bisect_on_moved_label(st, probe_key: str, opts: NightlyOptions, rec: dict, cmp: Comparison) -> None:
    """A regressed night's bisect on the one label that moved, when one did:
    the max over labels would blur it with the others' noise."""
    moved = moved_label(st.runs(probe_key, rec["pooled_heads"]), st.runs(probe_key, rec["against_heads"]),
                        cmp.ratio, opts.alpha, opts.min_effect)
    if moved is None:
        return
    label, c = moved
    rec["bisect_metric"] = label
    moved_by = fmt_ratio(c.head["median"], c.baseline["median"])
    max_by = fmt_ratio(cmp.head["median"], cmp.baseline["median"])
    rec["notes"].append(f"bisecting on the label {label}, the one that moved ({moved_by}, "
                        f"p={c.p_value:.2g}); the max over labels moved {max_by} and would "
                        "blur it with the others' noise")


ENV_CHECK_RUNS = 2 * OVERLAP_ENDPOINT_RUNS   # a regressed night's good endpoint tonight, at most (a bisect's
# endpoint runs: a bisect over overlapping values measures it that much anyway)
ENV_LEAN = 3.0   # odds for the head at which a night that measured its baseline again measures it more


def _run_values(runs: list, label: str | None) -> list[float]:
    if label:
        return label_runs(runs, label)
    return [r.value for r in runs if r.value is not None and r.status != STATUS_TIMEOUT]


def _split_tonight(st, probe_key: str, shas: list[str], sid: int, label: str | None = None):
    """The values of ``shas`` measured before tonight's session, and tonight's runs."""
    runs = st.runs(probe_key, shas)
    return (_run_values([r for r in runs if (r.session_id or 0) < sid], label),
            [r for r in runs if (r.session_id or 0) >= sid])


def _shown(run, label: str | None = None) -> str:
    """A run's value as a progress line shows it: ``label``'s, when the
    night is judged on one label (the max over labels would read unlike
    the note that sums the runs up)."""
    if label is not None:
        value = label_runs([run], label)
        return (f"{label} {fmt_value(value[0])}" if value
                else f"no value of {label} ({status_words(run.status)})")
    return fmt_value(run.value) if run.value is not None else f"no value ({status_words(run.status)})"


def _seen_text(what: str, fresh: list[float], earlier: list[float], head: list[float], of: str = "",
               label: str | None = None) -> str:
    """``of``: whose runs ``earlier`` are, when not the commits measured
    again; ``label``: the one label the values are of."""
    if not fresh:
        return f"{what} gave no value tonight"
    return (f"{what} measured again tonight{f', on {label}' if label else ''}: "
            f"median {fmt_value(float(np.median(fresh)))} over {len(fresh)} runs, "
            f"against {fmt_value(float(np.median(earlier)))} over {len(earlier)} runs"
            f"{f' of {of}' if of else ''} on earlier nights and "
            f"{fmt_value(float(np.median(head)))} at tonight's head")


def _as_environment(rec: dict, seen: str, v: Verdict, progress: Progress) -> None:
    why = v.reason if "Mann-Whitney" in v.reason else v.lr_text
    rec.update(verdict="environment", state="done", reason=f"not the code (the environment changed, or the earlier nights drew low): {seen} ({why})",
               env_check={"decision": v.decision, "runs": v.n_values, "reason": v.reason})
    rec["notes"] = [n.replace("were part of this regression", "were pooled with tonight's runs (they may predate the change)") for n in rec["notes"]
                    if "bisecting" not in n and "kept out of the baseline" not in n]
    rec["notes"].append("not bisected: the earlier nights' runs were measured in another environment (a "
                        "driver, a wheel, a machine); the next nights are judged against tonight's. If nothing "
                        "changed on the machine, those nights drew low and tonight was a false alarm: the same "
                        "answer, no bisect")
    progress(f"nightly {rec['night']}: ENVIRONMENT: {rec['reason']}")


def _measure_environment(ws, cfg, opts: NightlyOptions, sid: int, probe_key: str, shas: list[str],
                         earlier: list[float], head: list[float], label: str | None, cap: int,
                         new_meter: Callable[[], "_Meter"], progress: Progress,
                         lean: float | None = None) -> tuple[Verdict, list[float]]:
    """Tonight's runs of the good commits ``shas``, and more of ``shas[0]``
    until ``judge_environment`` decides or ``cap``. With ``lean`` (a log
    likelihood ratio), only while the runs so far lean that far towards
    the head, and the end judged on the runs there are. ``new_meter`` is
    called on the first run measured, if any."""
    st = ws.store
    meter = None
    try:
        while True:
            mine = _split_tonight(st, probe_key, shas, sid)[1]
            fresh = _run_values(mine, label)
            crashes = len(mine) - len(fresh)
            v = judge_environment(fresh, crashes, earlier, head, cap, cfg.crash_limit, opts.alpha, opts.min_effect)
            if v.decision != UNDECIDED or len(mine) >= cap + cfg.crash_limit or (lean is not None and v.log_lr < lean):
                break
            meter = meter or new_meter()
            out, run = meter.measure(shas[0])
            if out.build_failed:
                progress(f"  {shas[0][:12]} does not build now: {out.build.log_path}")
                break
            if run is not None:
                progress(f"  {shas[0][:12]} again, run {len(mine) + 1}: {_shown(run, label)}")
    finally:
        if meter is not None:
            meter.close()
    if lean is not None and v.decision == UNDECIDED and fresh:
        v = judge_environment(fresh, crashes, earlier, head, len(fresh), cfg.crash_limit, opts.alpha, opts.min_effect)
    return v, fresh


def _check_environment(ws, cfg, opts: NightlyOptions, rec: dict, probe, builder, probe_key: str,
                       build_key: str | None, progress: Progress) -> dict:
    """A regressed night's good endpoint, measured again tonight before any
    bisect (``judge_environment``). The nights' runs are matched by the
    probe command alone, so after a new driver or wheel the head's runs are
    high against runs the old environment gave; a bisect reusing those
    would blame a commit that changed nothing. Found so, the night is
    ``environment``: not bisected, and the baseline starts again from it.
    Resumable: tonight's runs of the endpoint are those of its session."""
    st, sid, good = ws.store, rec["session"], rec["bisect_good"]
    label = rec.get("bisect_metric")
    earlier, _ = _split_tonight(st, probe_key, rec.get("against_heads") or [good], sid, label)
    # the head as measured tonight (an unmoved branch has older runs of it too)
    head = _run_values(_split_tonight(st, probe_key, [rec["head"]], sid)[1], label)
    if len(earlier) < 2 or len(head) < 2:
        return rec      # measured tonight only: nothing older to be stale
    progress(f"nightly {rec['night']}: measuring the good endpoint {good[:12]} again, in tonight's environment")
    v, fresh = _measure_environment(ws, cfg, opts, sid, probe_key, [good], earlier, head, label,
                                    max(opts.runs, ENV_CHECK_RUNS),
                                    lambda: _Meter(ws, sid, probe, builder, progress), progress)
    pooled = len(rec.get("against_heads") or [good]) > 1
    seen = _seen_text(f"the good endpoint {good[:12]}", fresh, earlier, head,
                      "the baseline's heads" if pooled else "", label)
    if v.decision == BAD:
        _as_environment(rec, seen, v, progress)
    else:
        rec["env_check"] = {"decision": v.decision, "runs": len(fresh), "reason": v.reason}
        rec["notes"].append(f"{seen}: as it was ({v.lr_text}), so the change is in the code" if v.decision == GOOD
                            else f"{seen}: neither as it was nor like the head ("
                                 + (f"undecided after {len(fresh)} runs, the most this check spends"
                                    if is_undecided_skip(v.decision, v.reason) else v.reason or v.decision)
                                 + "); the bisect goes ahead")
    rec["judged_notes"] = len(rec["notes"])
    st.update_session(sid, result=rec, state=rec["state"], ended=time.time() if rec["state"] == "done" else None)
    return rec


def _seen_environment(ws, cfg, opts: NightlyOptions, sid: int, probe_key: str, head: str, shas: list[str],
                      new_meter: Callable[[], "_Meter"], progress: Progress) -> tuple[Verdict, str] | None:
    """A borderline night measures its baseline heads again when they are
    the thinner side. After a new driver those runs read like the head;
    in the baseline they make it half old, half new, against which the
    night (and the next ones) look good or stay suspect: a head at twice
    the old level was called good (p=0.39), and no night is regressed, so
    ``_check_environment`` never runs. Tonight's runs of those heads are
    judged the same way, with more runs only while they lean towards the
    head at ``ENV_LEAN`` to 1 or more (under no change, 1 in 3 or fewer of
    the nights that measured the baseline again ever do: Ville's
    inequality; one run's cap, 40:1, was too high a bar, as a run just
    past the head's range counts for less). The verdict and what was seen,
    when the environment changed."""
    st = ws.store
    earlier, mine = _split_tonight(st, probe_key, shas, sid)
    now = _run_values(_split_tonight(st, probe_key, [head], sid)[1], None)
    if not mine or len(earlier) < 2 or len(now) < 2:
        return None
    v, fresh = _measure_environment(ws, cfg, opts, sid, probe_key, shas, earlier, now, None,
                                    max(opts.runs, ENV_CHECK_RUNS), new_meter, progress, lean=math.log(ENV_LEAN))
    if v.decision != BAD:
        return None
    mine = _split_tonight(st, probe_key, shas, sid)[1]
    heads = ", ".join(x[:12] for x in shas if any(r.sha == x for r in mine))
    return v, _seen_text(f"the baseline {'heads' if ',' in heads else 'head'} {heads}", fresh, earlier, now)


def label_runs(runs: list, label: str) -> list[float]:
    """One label's values, from the runs that gave a value (a timed-out run
    is a crash, as ``workspace.commit_runs`` counts it)."""
    return [r.values[label] for r in runs if r.value is not None and r.status != STATUS_TIMEOUT
            and label in r.values and math.isfinite(r.values[label])]


def moved_label(head_runs: list, against_runs: list, max_ratio: float | None, alpha: float,
                min_effect: float) -> tuple[str, Comparison] | None:
    """The one label a regression moved, when it moved clearly more than the
    max over labels: a bisect judging the max mixes in the other labels'
    noise (a 1.85x shift of one label of three read as 1.18x of the max, and
    a four-commit bisect took 219 runs). Each label is tested at
    ``alpha`` / labels, so picking the best of several is paid for."""
    labels = sorted({k for r in head_runs + against_runs if r.value is not None for k in (r.values or {})})
    if len(labels) < 2:
        return None
    best = None
    for lab in labels:
        c = compare(label_runs(head_runs, lab), label_runs(against_runs, lab), alpha / len(labels), min_effect)
        if c.verdict == "regressed" and (best is None or c.ratio > best[1].ratio):
            best = (lab, c)
    if best is None or max_ratio is None or not best[1].ratio > max_ratio * (1 + min_effect):
        return None
    return best


def _good_heads(ws, probe_key: str, head: str, sid: int, trend: bool = False):
    """Distinct good nightly heads that are ancestors of ``head``, most
    recent first, with their nights. A good night whose head already held
    the culprit of a regression found on a later night is left out: it drew
    low on the regression's first night(s), and in a baseline it would hide
    the very change it carries. They stop at the last night the
    environment changed, with it (its head is good in the new one). With
    ``trend``, they also stop at the last
    regression (a bisect across its culprit and its fix would find the
    culprit again) and at the last trend check a bisect did not confirm
    (its two ends were measured at length and found alike)."""
    seen, culprits = set(), []
    for s in reversed(_nightly_sessions(ws.store, probe_key)):
        r = s.result or {}
        if s.id == sid:
            continue
        if trend and (r.get("verdict") in OPEN_VERDICTS or (r.get("drift") and r.get("verdict") == "suspect")):
            return
        if r.get("verdict") in OPEN_VERDICTS and r.get("culprit") and r.get("complete") is not False:
            culprits.append(r["culprit"])
        if r.get("verdict") == "environment":
            # the nights before it were measured in another environment
            h = r.get("head") or s.bad
            if h != head and h not in seen and gitrepo.is_ancestor(ws.repo, h, head):
                yield h, r.get("night", "")
            return
        if r.get("verdict") not in GOOD_VERDICTS:
            continue
        h = r.get("head") or s.bad
        if h == head or h in seen or not gitrepo.is_ancestor(ws.repo, h, head):
            continue
        seen.add(h)
        if any(gitrepo.is_ancestor(ws.repo, c, h) for c in culprits):
            continue
        yield h, r.get("night", "")


def _earlier_culprits(ws, probe_key: str, head: str, sid: int) -> list[str]:
    """The culprits earlier nights' bisects named that are in ``head``'s
    history: a regression that was fixed since (or is still open)."""
    out, seen = [], set()
    for s in _nightly_sessions(ws.store, probe_key):
        r = s.result or {}
        c = r.get("culprit")
        if s.id == sid or not c or r.get("complete") is False or c in seen:
            continue
        seen.add(c)     # the known nights after a regression repeat its culprit: one git call each
        if gitrepo.is_ancestor(ws.repo, c, head):
            out.append(c)
    return out


def _baseline(ws, probe_key: str, head: str, k: int, sid: int, trend: bool = False) -> tuple[list[str], list[str]]:
    """The last ``k`` good nightly heads (most recent first) and their nights."""
    heads = list(itertools.islice(_good_heads(ws, probe_key, head, sid, trend), k))
    return [h for h, _ in heads], [n for _, n in heads]


def _judged_before(ws, probe_key: str, head: str, sid: int):
    """The judged nights before this one whose heads are ``head`` or its
    ancestors, most recent first; crashed nights are skipped (they say
    nothing about the values)."""
    for r in reversed(_judged_nights(ws, probe_key, sid)):
        if r["head"] == head or gitrepo.is_ancestor(ws.repo, r["head"], head):
            yield r


def _open_regression(ws, probe_key: str, head: str, sid: int) -> tuple[dict | None, list[str], dict | None]:
    """The latest night, when it was a regression (new or known), the heads
    of the nights since that regression was found (most recent first), and
    the night that found it. That night's head, measured again by its
    bisect, is what "still the same regression" looks like: the known
    nights since are not, since a fixed head stays "known" until it is
    shown better, and its runs would blur the very runs it is tested
    against."""
    latest, heads, found = None, [], None
    for r in _judged_before(ws, probe_key, head, sid):
        if r["verdict"] == "suspect":
            continue    # neither fixed nor worse: it leaves a regression open (and is not one)
        if r["verdict"] not in OPEN_VERDICTS:
            break
        latest = latest or r
        if r["head"] not in heads:
            heads.append(r["head"])
        if r["verdict"] == "regressed":
            found = r
            break
    return latest, heads, found


def _suspects(ws, probe_key: str, head: str, sid: int) -> tuple[list[str], list[str]]:
    """The heads and nights of the unbroken run of suspect nights just
    before this one."""
    shas, nights = [], []
    for r in _judged_before(ws, probe_key, head, sid):
        if r["verdict"] != "suspect":
            break
        if r["head"] != head and r["head"] not in shas:
            shas.append(r["head"])
            nights.append(r.get("night", ""))
    return shas, nights


def _bisect_and_report(path, cfg, opts: NightlyOptions, rec: dict, progress: Progress,
                       keep_unfinished: bool = False) -> dict:
    from .report import write_report  # noqa: PLC0415
    from .session import run_bisect  # noqa: PLC0415
    from .workspace import Workspace  # noqa: PLC0415
    good = rec.get("bisect_good") or rec.get("last_good")
    # a resumed bisect (the night run again) writes its notes afresh
    rec["notes"] = rec["notes"][:rec.get("judged_notes", len(rec["notes"]))]
    rec.pop("unfinished_error", None)
    bcfg = dataclasses.replace(cfg, good=good, bad=rec["head"], metric=rec.get("bisect_metric") or cfg.metric)
    progress(f"nightly {rec['night']}: bisecting {good[:12]}..{rec['head'][:12]}")
    try:
        # its runs of earlier nights were judged tonight (_check_environment)
        res = run_bisect(path, bcfg, progress, check_reused=False)
        rec.update(culprit=res.culprit, pr=res.pr, bisect_session=res.session,
                   candidates=res.candidates, confidence=res.confidence, complete=res.complete)
        was = rec.get("rewritten_open") or {}
        if res.complete and res.culprit and (res.culprit == was.get("culprit") or res.pr and was.get("pr") == res.pr):
            # a force-push of the commits after the culprit (or of the culprit itself) made the
            # open regression look new: posted twice (a tester's)
            same = ("the culprit" if res.culprit == was["culprit"] else
                    f"the same PR (#{res.pr}) as the culprit {was['culprit'][:12]}")
            rec["notes"].append(f"{same} of the regression found on {was['night']}, before the branch was "
                                "rewritten: the rewrite carried it over; known, not posted again")
            rec.update(verdict="known", known_since=was["night"])
        if not res.complete:
            # the most likely commit, not an answer: not posted, exit 157, and the
            # night's bisect resumes when the night is run again
            rec["notes"].append(f"the bisect stopped before --confidence ({res.reason}): the culprit named is the "
                                "most likely, NOT sure; run the night again to resume it")
        ws = Workspace(path)
        try:
            out = _report_path(ws, opts, rec["night"], rec["head"])
        finally:
            ws.close()
        try:
            rep = write_report(path, fmt=opts.report_format, out=out, session_id=res.session,
                               offline=opts.offline)
        except KlbisectError as e:
            # the bisect stands (its answer is in the record and the post); the missing
            # file is the error, so that a cron job sees it
            rec.update(report=None, report_error=f"{e.message}; `klbisect report --session {res.session} -o PATH` "
                                                 "writes it")
            rep = {"path": f"none ({e.message})"}
        else:
            rec.update(report=rep["path"], plot=rep["plot"], report_error=None)
        if res.complete and (opts.post_to or opts.post_issue) and not opts.dry_run:
            # what it will post, as of tonight: a kill before the post, a failed post or a
            # dry run leaves it to a later night, whose runs must not rewrite it
            ws = Workspace(path)
            try:
                _night_body(ws, path, opts, {**rec, "verdict": "regressed"})
            finally:
                ws.close()
        if res.culprit:
            progress(f"nightly {rec['night']}: culprit {res.culprit[:12]} {fmt_subject(res.subject)}; report {rep['path']}")
        else:
            progress(f"nightly {rec['night']}: narrowed to {len(res.candidates)} commits; report {rep['path']}")
    except KlbisectError as e:
        if isinstance(e, NoDifference):
            # measured at length, the two heads do not differ: tonight's test was a false
            # alarm, or a change too small to bisect. Not a regression, and not good either.
            was = rec.pop("open", None)
            rec["reason"] += "; not confirmed by the bisect"
            rec["notes"] = [n.replace("were part of this regression", "stay suspect") for n in rec["notes"]]
            rec["notes"].append(f"not confirmed by the bisect: {e.message}")
            if was:
                rec.update(verdict="known", **was)
                rec["notes"].append(f"the regression found on {was['known_since']} is still there")
            else:
                rec["verdict"] = "suspect"
                rec["notes"].append("kept out of the baseline; the next nights' runs are pooled with this "
                                    "night's until they decide")
            progress(f"nightly {rec['night']}: {rec['verdict'].upper()}: the bisect did not confirm it: "
                     f"{e.message}")
        elif (keep_unfinished or e.code == EXIT_NO_SIGNAL) and (
                opts.dry_run or rec.get("bisect_failures", 0) + 1 < BISECT_TRIES):
            # what failed is tonight's machine (endpoints that no longer build or run), not
            # the night's answer: the next night tries again. Tonight's own bisect too: "no
            # culprit could be isolated" was posted, and no later night took it up. Not for
            # good: old commits a new driver cannot load fail every night, and the issue must
            # hear of the regression.
            # (a --dry-run night's try is not counted: it would give up where nothing is posted)
            rec["bisect_failures"] = rec.get("bisect_failures", 0) + (not opts.dry_run)
            rec["unfinished_error"] = e.message
            tries = (f"{rec['bisect_failures']} of {BISECT_TRIES} tries" if not opts.dry_run else
                     f"a --dry-run try, not counted: {rec['bisect_failures']} of {BISECT_TRIES} so far")
            progress(f"nightly {rec['night']}: its bisect failed tonight, left for the next night ({tries}): "
                     f"{e.message}")
            _save(path, rec)
            return rec
        else:
            tries = rec.get("bisect_failures", 0) + 1
            rec["notes"].append(f"bisect failed{f' on {tries} nights' if tries > 1 else ''}: {e.message}")
            rec["bisect_failed"] = True     # for the fix's post: no culprit, and why
            progress(f"nightly {rec['night']}: bisect failed: {e.message}")
            rec["report"] = _write_failed_report(path, opts, rec)
    rec["state"] = "bisecting" if rec.get("complete") is False else "done"
    _save(path, rec)
    return rec


def _write_failed_report(path, opts: NightlyOptions, rec: dict) -> str | None:
    """A regression whose bisect failed still gets its report file (the
    night, its evidence and why the bisect stopped): a cron job's ``-o``
    must not be silently missing."""
    from .workspace import Workspace  # noqa: PLC0415
    ws = Workspace(path)
    try:
        out = _report_path(ws, opts, rec["night"], rec["head"])
    finally:
        ws.close()
    if opts.report_format == "json":
        body = json.dumps({k: rec.get(k) for k in ("night", "branch", "head", "verdict", "reason", "notes",
                                                   "head_summary", "baseline_summary", "judged_label",
                                                   "baseline_heads")},
                          indent=2) + "\n"
    elif opts.report_format == "html":
        import html  # noqa: PLC0415
        body = f"<!doctype html><meta charset=utf-8><pre>{html.escape(comment_body(rec, None))}</pre>\n"
    else:
        body = comment_body(rec, None)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            f.write(body)
    except OSError as e:
        rec["report_error"] = f"could not write the report {out}: {e.strerror}"
        rec["notes"].append(rec["report_error"])
        return None
    return out


def _save(path, rec: dict) -> None:
    from .workspace import Workspace  # noqa: PLC0415
    ws = Workspace(path)
    try:
        ws.store.update_session(rec["session"], result=rec, state=rec.get("state", "done"),
                                ended=time.time() if rec.get("state") == "done" else None)
    finally:
        ws.close()


# ---- posting -----------------------------------------------------------------------

def _post_target(path, opts: NightlyOptions) -> tuple[str, int]:
    if opts.post_to:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)#(\d+)\s*", opts.post_to)
        if not m:
            raise KlbisectError(f"--post-to {opts.post_to!r}: expected owner/repo#ISSUE", EXIT_USAGE)
        return m.group(1), int(m.group(2))
    from .report import github_slug  # noqa: PLC0415
    repo = gitrepo.open_repo(path)
    slug = github_slug(gitrepo.remote_url(repo))
    if not slug:
        raise KlbisectError("--post-issue needs a GitHub 'origin' remote; or use --post-to owner/repo#ISSUE",
                            EXIT_USAGE)
    return slug, int(opts.post_issue)


def comment_body(rec: dict, data: dict | None) -> str:
    """What nightly posts: one line about the night, then the markdown
    report of the bisect (``data`` from report.report_data), all within
    one GitHub comment."""
    from .report import GITHUB_COMMENT_LIMIT, render_markdown  # noqa: PLC0415
    intro = (f"**klbisect nightly {rec['night']}**: `{rec['branch']}` at `{rec['head'][:12]}` regressed "
             f"({rec['reason']}).\n\n")
    if data is None:
        notes = "\n".join(f"> {n}" for n in rec.get("notes", []))
        return redact((intro + "No culprit could be isolated.\n\n" + notes).strip() + "\n")
    # a token in the probe command a note or the report names must not reach a public issue
    return redact(intro + render_markdown(data, limit=GITHUB_COMMENT_LIMIT - len(intro.encode("utf-8"))))


def fixed_body(rec: dict) -> str:
    """What nightly posts the night the open regression is shown fixed."""
    fx = rec["fixed"]
    what = (f"culprit `{fx['culprit'][:12]}`" + (f" (#{fx['pr']})" if fx.get("pr") else "")
            if fx.get("culprit") else "its bisect failed, no culprit named"
            if fx.get("unfinished") else "no single culprit")
    return redact(f"**klbisect nightly {rec['night']}**: `{rec['branch']}` at `{rec['head'][:12]}` "
                  f"{fmt_subject(rec.get('subject') or '')}: the regression found on {fx['known_since']} "
                  f"({what}) is fixed.\n\n> {rec['reason']}\n")


def _night_body(ws, path, opts: NightlyOptions, rec: dict, keep: bool = True) -> str:
    """What the night posts, rendered once: a post retried on a later night
    (or shown again by --dry-run) is the night's own, not recomputed from
    runs added since (a tester's read "Confidence 0.9978" above a table
    that had moved to 0.977). ``keep`` stores a body rendered now; one
    without the report it should have (report_data failed) is not kept."""
    key = f"nightly-body:{rec['session']}:{rec.get('verdict')}"
    body = ws.store.get(key)
    if body:
        return body
    data = None
    if rec.get("verdict") == "regressed" and rec.get("bisect_session"):
        from .report import report_data  # noqa: PLC0415
        try:
            data = report_data(path, rec["bisect_session"], offline=opts.offline)
        except KlbisectError as e:
            rec["notes"].append(f"no report: {e.message}")
    body = comment_body(rec, data) if rec.get("verdict") == "regressed" else fixed_body(rec)
    if keep and (data is not None or not rec.get("bisect_session")):
        ws.store.put(key, body)
    return body


def _post(path, opts: NightlyOptions, rec: dict, target: tuple[str, int], progress: Progress,
          post_out: Callable[[str], None] | None) -> dict:
    from .workspace import Workspace  # noqa: PLC0415
    ws = Workspace(path)
    try:
        # under the lock: two jobs of one night both saw "not posted yet" while the
        # first one's POST was in flight, and the issue got the comment twice
        with ws.locked():
            return _post_locked(ws, path, opts, rec, target, progress, post_out)
    finally:
        ws.close()


def _post_locked(ws, path, opts: NightlyOptions, rec: dict, target: tuple[str, int], progress: Progress,
                 post_out: Callable[[str], None] | None) -> dict:
    slug, issue = target
    key = f"nightly-posted:{rec['session']}"
    if ws.store.get(key) and not opts.dry_run:
        progress(f"already posted to {slug}#{issue} for night {rec['night']}: not posting again")
        return rec
    body = _night_body(ws, path, opts, rec, keep=not opts.dry_run)
    # hidden in the rendered comment: how a retry finds a post whose answer was lost
    marker = f"<!-- klbisect nightly: night {rec['night']}, session {rec['session']}, {rec.get('verdict')} -->"
    body = f"{body.rstrip()}\n\n{marker}\n"
    from .github import api_base  # noqa: PLC0415
    api = api_base()
    if opts.dry_run:
        out = post_out or (lambda s: print(s, flush=True))
        has_token = "set" if os.environ.get("GITHUB_TOKEN") else "NOT set"
        out(f"--dry-run: would POST {api}/repos/{slug}/issues/{issue}/comments "
            f"(token from GITHUB_TOKEN: {has_token}) with this body:\n{body}")
        rec["post"] = {"target": f"{slug}#{issue}", "dry_run": True}
        return rec
    # run_nightly refused a post without GITHUB_TOKEN before any run
    token = os.environ.get("GITHUB_TOKEN", "")
    try:
        from . import github  # noqa: PLC0415
        earlier = rec.get("post") or {}
        # an earlier attempt that got no answer in time, or a 5xx, may have made the comment
        found = github.find_comment(slug, issue, marker, token, since=earlier["at"] - 600) \
            if earlier.get("error") and earlier.get("at") else None
        if found is not None:
            progress(f"the earlier post of night {rec['night']} to {slug}#{issue} arrived after all "
                     "(its answer was lost): not posting again")
        got = found if found is not None else github.post_comment(slug, issue, body, token)
        url = _comment_url(got)
        ws.store.put(key, json.dumps({"target": f"{slug}#{issue}", "url": url, "at": time.time()}))
        rec["post"] = {"target": f"{slug}#{issue}", "url": url}
        progress(f"posted {'the report' if rec.get('verdict') == 'regressed' else 'the fix'} of night "
                 f"{rec['night']} to {slug}#{issue}" + (f": {url}" if url else ""))
    except ImportError:
        rec["post"] = {"target": f"{slug}#{issue}", "error": "klbisect.github is not available"}
        progress("not posting: klbisect.github is not available")
    except Exception as e:  # noqa: BLE001 - posting must not lose the night's answer
        msg = str(e).replace(token, MASK) if token else str(e)
        rec["post"] = {"target": f"{slug}#{issue}", "error": msg[:400], "at": time.time()}
        progress(f"posting to {slug}#{issue} failed: {msg[:400]}")
    ws.store.update_session(rec["session"], result=rec)
    return rec


def _comment_url(got) -> str | None:
    if isinstance(got, dict):
        return got.get("html_url") or got.get("url")
    if isinstance(got, str):
        return got
    return getattr(got, "html_url", None) or getattr(got, "url", None)


def summary(rec: dict) -> dict:
    """The --json object: {"night", "branch", "head", "regressed", "verdict",
    "culprit", "pr", "report", "posted", "exit_code"}; ``posted`` is the
    comment's URL, false when posting failed (or was a dry run), null when
    nothing was to be posted. ``regressed`` is true while a regression is
    open ("regressed": found tonight; "known": found on an earlier night),
    null on a crashed night (nothing measured);
    ``exit_code`` is the command's, with ``error`` when it is not 0."""
    post = rec.get("post")
    if post is None:
        posted = None
    elif post.get("error") or post.get("dry_run"):
        posted = False
    else:
        posted = post.get("url") or True
    out = {"night": rec.get("night"), "branch": rec.get("branch"), "head": rec.get("head"),
           "verdict": rec.get("verdict"),
           # a crashed night measured nothing: "false" read as "no longer regressed" under an open one
           "regressed": None if rec.get("verdict") == "crashed" else rec.get("verdict") in OPEN_VERDICTS,
           "culprit": rec.get("culprit"), "pr": rec.get("pr"), "report": rec.get("report"),
           "posted": posted}
    if rec.get("fixed"):
        fx = rec["fixed"]
        out["fixed"] = {"known_since": fx.get("known_since"), "culprit": fx.get("culprit"), "pr": fx.get("pr")}
    if rec.get("earlier"):
        # earlier nights finished tonight (a bisect a kill cut short, a post that failed)
        out["earlier"] = rec["earlier"]
    if rec.get("unfinished_error"):
        out.update(error=f"its bisect failed tonight (the next night tries again): {rec['unfinished_error']}",
                   exit_code=EXIT_NO_SIGNAL)
    elif rec.get("verdict") == "crashed":
        out.update(error=rec.get("reason"), exit_code=exit_code(rec))
    elif post and post.get("error"):
        out.update(error=f"posting to {post.get('target')} failed: {post['error']}", exit_code=exit_code(rec))
    elif rec.get("verdict") == "regressed" and rec.get("complete") is False:
        out.update(complete=False, exit_code=exit_code(rec),
                   error=f"the bisect stopped before --confidence (at {rec.get('confidence') or 0:.2g}): "
                         "the culprit is the most likely, NOT sure; run the night again to resume it")
    elif rec.get("report_error"):
        out.update(error=rec["report_error"], exit_code=exit_code(rec))
    elif exit_code(rec):
        bad = next(e for e in rec.get("earlier", []) if e.get("exit_code"))
        out.update(error=f"night {bad['night']}: {bad.get('error')}", exit_code=exit_code(rec))
    out.setdefault("exit_code", 0)
    return out


def exit_code(rec: dict) -> int:
    """0; EXIT_POST_FAILED when a regression's report could not be posted,
    and EXIT_NO_SIGNAL when the head printed no value or the machine broke
    in the bisect: a cron job must notice that nobody was told, or that
    nothing was measured."""
    post = rec.get("post") or {}
    if post.get("error"):
        return EXIT_POST_FAILED
    if rec.get("verdict") == "crashed" or rec.get("unfinished_error"):
        return EXIT_NO_SIGNAL
    if rec.get("verdict") == "regressed" and rec.get("complete") is False:
        return EXIT_NOT_SURE
    if rec.get("report_error"):
        return EXIT_USAGE
    # tonight went well, an earlier night finished tonight did not: the cron job must see that too
    return next((e["exit_code"] for e in rec.get("earlier", []) if e.get("exit_code")), 0)


def format_night(rec: dict) -> str:
    lines = [f"Nightly {rec['night']}: {rec['branch']} at {rec['head'][:12]} {fmt_subject(rec['subject'])}",
             f"  verdict: {rec['verdict'].upper()} — {rec['reason']}"]
    hs, bs = rec.get("head_summary") or {}, rec.get("baseline_summary") or {}
    of = f" (label {rec['judged_label']})" if rec.get("judged_label") else ""
    if hs.get("n"):
        lines.append(f"  head:     {fmt_summary(hs)}{of}"
                     + (f", {rec['crashes']} crashed" if rec.get("crashes") else ""))
    if bs.get("n"):
        lines.append(f"  baseline: {fmt_summary(bs)}{of} "
                     f"from nights {', '.join(rec.get('baseline_nights') or [])}")
    if (rec.get("anchor_summary") or {}).get("n"):
        lines.append(f"  anchor:   {fmt_summary(rec['anchor_summary'])} "
                     f"from nights {', '.join(rec.get('anchor_nights') or [])}")
    if rec.get("culprit"):
        pr = f" (#{rec['pr']})" if rec.get("pr") else ""
        unsure = (f"  (most likely, NOT sure: confidence {rec.get('confidence') or 0:.2g})"
                  if rec.get("complete") is False else "")
        lines.append(f"  culprit:  {rec['culprit']}{pr}{unsure}")
    if rec.get("report"):
        lines.append(f"  report:   {rec['report']}")
    for n in rec.get("notes", []):
        lines.append(f"  note: {n}")
    if rec.get("fixed") and (rec.get("post") or {}).get("url"):
        lines.append(f"  posted:   the fix, {rec['post']['url']}")
    for e in rec.get("earlier", []):
        what = (f"culprit {e['culprit'][:12]}" + (f" (#{e['pr']})" if e.get("pr") else "") if e.get("culprit")
                else f"verdict {e.get('verdict')}")
        told = (f"posted {e['posted']}" if isinstance(e.get("posted"), str) else "posted" if e.get("posted")
                else f"NOT posted: {e['error']}" if e.get("error")
                else "not posted (--dry-run)" if e.get("posted") is False else "nothing to post")
        lines.append(f"  earlier:  night {e['night']} finished tonight: {what}; {told}")
    return "\n".join(lines)


# ---- history -------------------------------------------------------------------

def history(path=None, label: str | None = None, plot: str | None = None,
            probe_key: str | None = None, probe_cmd: str | None = None) -> dict:
    """The metric per label over nightly heads, oldest first:
    ``{"labels", "nights": [{night, head, subject, verdict, n, crashes,
    value, labels: {label: summary}}], "plot", "probe_key", "other_series"}``.
    Uses the probe of the latest nightly unless ``probe_key`` is given, or
    the latest that ran ``probe_cmd``; writes the plot (default
    ``<git-common-dir>/klbisect/reports/history.png``; with ``probe_cmd``,
    ``history-<its key>.png``)."""
    from .plots import history_plot  # noqa: PLC0415
    from .workspace import Workspace  # noqa: PLC0415
    ws = Workspace(path)
    try:
        if not (ws.dir / "state.db").exists():
            raise KlbisectError(f"no nightly results in {ws.top}: run `klbisect nightly ...` first", EXIT_USAGE)
        st = ws.store
        if probe_key is None and probe_cmd is not None:
            keys = [r["probe_key"] for r in st.db.execute(
                "SELECT probe_key, config FROM sessions WHERE kind='nightly' AND result IS NOT NULL ORDER BY id DESC")
                # as given, or as klbisect printed it (secrets redacted) in its advice
                if probe_cmd.strip() in ((cmd := json.loads(r["config"] or "{}").get("probe_cmd") or "").strip(),
                                         redact(cmd).strip())]
            if not keys:
                raise KlbisectError(f"no nightly here ran --probe-cmd {shlex.quote(redact(probe_cmd))}; `klbisect "
                                    "history` alone shows the latest, and names the others", EXIT_USAGE)
            probe_key = keys[0]
        if probe_key is None:
            # the latest night that was judged: one refused for a mistyped option has no verdict
            row = st.db.execute("SELECT probe_key FROM sessions WHERE kind='nightly' AND result IS NOT NULL "
                                "ORDER BY id DESC LIMIT 1").fetchone()
            if row is None:
                raise KlbisectError("no nightly results yet: run `klbisect nightly ...` first", EXIT_USAGE)
            probe_key = row["probe_key"]
        latest = [s for s in _nightly_sessions(st, probe_key) if (s.result or {}).get("verdict")]
        if latest:
            ws.use_metric(latest[-1].config.get("metric"), latest[-1].config.get("worse") or "higher")
        nights, all_labels = [], []
        for s in _nightly_sessions(st, probe_key):
            r = s.result or {}
            if not r.get("verdict"):
                continue
            # the runs the night was judged on: a later night's environment check measures
            # old heads again, and after a new driver those would mix two environments
            runs = [x for x in st.runs(probe_key, [s.bad]) if (x.session_id or 0) <= s.id]
            per: dict[str, list[float]] = {}
            for run in runs:
                for k, v in run.values.items():
                    per.setdefault(k, []).append(v)
            for k in per:
                if k not in all_labels:
                    all_labels.append(k)
            nights.append({"night": r.get("night", ""), "head": s.bad, "subject": r.get("subject", ""),
                           "verdict": r["verdict"], "session": s.id,
                           "n": sum(1 for x in runs if x.value is not None),
                           "crashes": sum(1 for x in runs if x.value is None),
                           "value": summarize([x.value for x in runs if x.value is not None]),
                           "labels": {k: summarize(v) for k, v in per.items()},
                           "culprit": r.get("culprit"), "pr": r.get("pr"),
                           "build_failed": bool(r.get("build_failed"))})
        labels = sorted(all_labels)
        if label is not None:
            if label not in labels:
                raise KlbisectError(f"no label {label!r} in the nightly runs; labels: {', '.join(labels) or 'none'}",
                                    EXIT_USAGE)
            labels = [label]
            for n in nights:
                n["labels"] = {label: n["labels"][label]} if label in n["labels"] else {}
        # an older series' plot beside the latest one's, not over it (a tester's)
        named = "" if probe_cmd is None else "-" + probe_key.rsplit(":", 1)[-1][:8]
        out = plot or str(ws.dir / "reports" / f"history{named}.png")
        trend = {"labels": labels, "nights": nights, "plot": out, "probe_key": probe_key,
                 "other_series": [{**e, "probe_cmd": redact(e["probe_cmd"]) if e["probe_cmd"] else None}
                                  for e in other_series(st, probe_key)]}
        history_plot(trend, out)
        return trend
    finally:
        ws.close()


def history_table(trend: dict):
    """A rich Table of the trend: one row per night, one column per label."""
    from rich.markup import escape  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415
    t = Table(title=escape("KL per label over nightly heads: median [min, max] n, over the head's runs "
                           "as of its night (later nights' and bisects' runs left out)"))
    t.add_column("night")
    t.add_column("head")
    t.add_column("verdict")
    for lab in trend["labels"]:
        t.add_column(lab, justify="right")
    for n in trend["nights"]:
        cells = []
        for lab in trend["labels"]:
            s = n["labels"].get(lab) or {}
            cells.append(escape(f"{fmt_span(s)} {s['n']}")
                         if s.get("n") else "-")
        v = n["verdict"]
        style = {"regressed": "bold red", "known": "red", "suspect": "magenta", "crashed": "yellow",
                 "environment": "cyan"}.get(v, "")
        verdict = v + (f" {n['culprit'][:10]}" if n.get("culprit") and v == "regressed" else "")
        if n.get("build_failed"):
            verdict += " (did not build)"
        elif n.get("crashes"):
            verdict += f" ({n['crashes']} crashed)"
        verdict = escape(verdict)
        t.add_row(escape(n["night"]), n["head"][:10], f"[{style}]{verdict}[/]" if style else verdict, *cells)
    return t
