"""Which KL label moved between the endpoints, and the hints that say so:
a probe prints several labels, a regression usually moves one, and a
search on the wrong one finds nothing (154) or the wrong commit."""
from __future__ import annotations

import re
import shlex
import statistics
from dataclasses import dataclass
from typing import Callable

from .config import BisectConfig
from .decide import DECISIVE_RUNS, SEPARATION_P, label_separations, labels_apart, separation, worse_tail
from .errors import NoDifference
from .metric import fmt_count, fmt_summary, fmt_value, over_labels
from .runs import MEASURED, valued_runs
from .workspace import Workspace


def spikes_note(good: list[float], bad: list[float], worse: str) -> str:
    """What a "do not separate" adds when bad runs lie far past every good
    one: their middles agree, their tails do not."""
    n = worse_tail(good, bad, "lower" if worse == "lower" else "higher")
    if not n:
        return ""
    far = max(bad) if worse != "lower" else min(bad)
    edge = max(good) if worse != "lower" else min(good)
    return (f"; yet {fmt_count(n, 'bad run')} lie far past every good run ({fmt_value(far)} against the good "
            f"runs' {'max' if worse != 'lower' else 'min'} {fmt_value(edge)}): a regression that shows only as "
            "occasional spikes leaves the middle alone, and more endpoint runs (--max-endpoint-runs) show it")


def goes_better(cfg: BisectConfig, sep) -> bool:
    """Did the endpoints move the way this session calls better?"""
    return cfg.worse not in ("either", "higher" if sep.direction == "up" else "lower")


def check_direction(cfg: BisectConfig, sep, finding: Callable[[], LabelHint | None] = lambda: None,
                    spikes: int = 0) -> None:
    """Endpoints that moved the way that is better: a fix in the range, or
    --good and --bad swapped. Named as "first bad", its commit would be
    blamed for the improvement. ``finding``: what the labels show (label_finding);
    ``spikes``: bad runs far past every good one the worse way (worse_tail)."""
    moved = "higher" if sep.direction == "up" else "lower"
    if not goes_better(cfg, sep):
        return
    label = finding()
    hint = str(label or "")
    if spikes:
        raise NoDifference(
            f"the bad endpoint's runs sit {moved} than the good one's (good {fmt_summary(sep.good)}, bad "
            f"{fmt_summary(sep.bad)}, p={sep.p_value:.2g}), the better way, yet {spikes} of them "
            f"lie far past every good run the worse way: a regression that shows only as occasional spikes? "
            f"--worse either bisects whatever changed, these runs reused" + hint)
    if sep.p_value > SEPARATION_P:
        raise NoDifference(
            f"good and bad barely differ (p={sep.p_value:.2g}; good {fmt_summary(sep.good)}, bad "
            f"{fmt_summary(sep.bad)}), and the little difference there is goes the better way ({moved}): most "
            f"likely there is no regression between these endpoints; check that --bad fails the test (pass "
            f"--worse {moved} if {moved} values are worse for this metric)" + hint,
            alike=not hint and min(sep.good["n"], sep.bad["n"]) >= DECISIVE_RUNS)
    if label and label.kind == "moved worse":
        # a label that moved the worse way under a max that moved the better way, by chance
        # or with another label's fix: that label is the question (a test's draw had the
        # accuracy's min "fixed" at p=0.02 while gsm8k fell at p=2e-10)
        raise NoDifference(
            f"{label.text}; the {over_labels(cfg.worse)} over labels went the better way ({moved}: good "
            f"{fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}, p={sep.p_value:.2g}), so it cannot be bisected "
            "as a regression")
    # a label that moved on its own is the better advice: under --worse {moved} the other
    # side's max (or min) may be a label that never moved (CI's draw: an accuracy's max
    # "fixed" at p=0.039, by chance, while gsm8k fell)
    raise NoDifference(
        f"the bad endpoint's runs are {moved} than the good one's (good {fmt_summary(sep.good)}, bad "
        f"{fmt_summary(sep.bad)}, p={sep.p_value:.2g}), and this metric is worse {cfg.worse}: the range holds "
        f"a fix, or --good and --bad are swapped" + (hint if label and label.kind == "moved better" else
                                                     f"; pass --worse {moved} (or either) if {moved} values are "
                                                     "worse here" + hint))


def _vanished_label(good: list[set], bad: list[set]) -> str:
    """A label every run of one endpoint prints and no run of the other:
    its line changed form there (a nan a --metric-regex does not read), and
    the max or min over the rest cannot show what happened to it."""
    if len(good) < 2 or len(bad) < 2:
        return ""
    for side, mine, theirs in (("good", good, bad), ("bad", bad, good)):
        gone = sorted(set.intersection(*mine) - set.union(*theirs))
        if gone:
            other = "bad" if side == "good" else "good"
            return (f"label {gone[0]} is in every {side} endpoint run and in no {other} one: its line reads "
                    f"differently there (a nan or inf your --metric-regex does not match?); compare the two "
                    "endpoints' logs (`klbisect log`)")
    return ""


def silent_when_passing(ws: Workspace, probe_key: str, shas: list[str]) -> str:
    """Runs that passed (exit 0) printed nothing while every run with a
    value failed: pytest without -s shows a test's prints only when it
    fails, so only the high runs are measured (a tester's good endpoint
    read 0.0105 where its runs lay around 0.0075)."""
    runs = ws.store.runs(probe_key, shas)
    quiet = [r for r in runs if r.exit_code == 0 and not r.values]
    if len(quiet) < 2 or any(r.exit_code == 0 for r in runs if r.values):
        return ""
    return (f"{len(quiet)} endpoint runs passed (exit 0) and printed no value, while every run with a value "
            "failed: only failing runs are measured, and they are not the typical ones (pytest shows a test's "
            "prints only when it fails: add -s to the pytest command)")


def judged_on(ws: Workspace) -> str:
    """What the endpoints were compared on, for a "do not differ" line."""
    return f"on label {ws.metric}" if ws.metric else f"over the {over_labels(ws.worse)} of labels"


def _labels_offered(ws: Workspace, cfg: BisectConfig) -> bool:
    """Whether a label's own --metric can be offered: not under --metric,
    and not with a regex without a label group (it names its matches by
    position)."""
    return ws.metric is None and _names_labels(cfg)


def _names_labels(cfg: BisectConfig) -> bool:
    """Whether runs come with their labels' names (a regex without a label
    group names its matches by position)."""
    return cfg.metric_regex is None or "label" in re.compile(cfg.metric_regex).groupindex


def _one_label(ws: Workspace, cfg: BisectConfig, on_good: dict[str, list[float]],
               on_bad: dict[str, list[float]]) -> LabelHint | None:
    """When the max (or min) over labels shows nothing: a label whose own
    runs separate the endpoints, named with the --metric that bisects it,
    and with --worse when it moved the way this session calls better (an
    accuracy bisected as if higher were worse)."""
    if not _labels_offered(ws, cfg):
        return None
    apart = labels_apart(on_good, on_bad) if len(on_good) > 1 else []
    if not apart:
        return None
    # a label that moved the worse way first: one that moved the better way (another
    # label's fix, or a label that is better lower) is the answer only when none did
    lab, p = next(((lab, p) for lab, p in apart if cfg.worse in ("either", _moved(on_good, on_bad, lab))),
                  apart[0])
    moved = _moved(on_good, on_bad, lab)
    if cfg.worse not in ("either", moved):
        return LabelHint("moved better", f"label {lab} alone moved {moved} (p={p:.2g}): if {moved} values are worse "
                         f"for this metric, rerun with --worse {moved} --metric {shlex.quote(lab)}, which reuses "
                         "these runs")
    return LabelHint("moved worse", f"label {lab} alone differs (p={p:.2g}, its change hidden under the other labels' "
                     f"{over_labels(ws.worse)}): rerun with --metric {shlex.quote(lab)}, which reuses these runs")


def _other_label(ws: Workspace, cfg: BisectConfig, on_good: dict[str, list[float]],
                 on_bad: dict[str, list[float]]) -> str:
    """Under a --metric whose label did not move, another label that did
    (the worse way): a tester's --metric on the steady one of two spent
    40+40 runs and stopped with no word of the one that moved."""
    if ws.metric is None or not _names_labels(cfg):
        return ""
    apart = [(lab, p) for lab, p in (labels_apart(on_good, on_bad) if len(on_good) > 1 else [])
             if lab != ws.metric and cfg.worse in ("either", _moved(on_good, on_bad, lab))]
    if not apart:
        return ""
    lab, p = apart[0]
    return (f"label {lab} differs (p={p:.2g}) where --metric {ws.metric} does not: rerun with --metric "
            f"{shlex.quote(lab)}, which reuses these runs")


def _by_label(runs: list, sha: str) -> dict[str, list[float]]:
    """A commit's values per label; a run its own assertion stopped short
    measured the labels it printed."""
    return _on_side(runs, {sha})


def _on_side(runs: list, shas: set[str]) -> dict[str, list[float]]:
    """Those commits' values per label, as ``_by_label``."""
    out: dict[str, list[float]] = {}
    for r in runs:
        if r.sha in shas and r.status in MEASURED:
            for k, v in r.values.items():
                out.setdefault(k, []).append(v)
    return out


@dataclass(frozen=True)
class LabelHint:
    """What the labels show that the max (or min) over them hides. ``kind``
    says which finding it is, so a caller picks its words by it, not by the
    text: "moved worse" (one label alone, hidden under the others), "moved
    better" (one label alone, the way this session calls better), or
    "other" (a vanished line, the closest label, another than --metric)."""
    kind: str
    text: str

    def __str__(self) -> str:
        return f"; {self.text}"


def label_finding(ws: Workspace, probe_key: str, good: str, bad: str, cfg: BisectConfig,
                  weak: bool = False) -> LabelHint | None:
    """``label_hint``'s finding, or None when nothing."""
    stored = ws.store.runs(probe_key, [good, bad])
    counted = valued_runs(stored, None, ws.worse)
    on_good, on_bad = _by_label(stored, good), _by_label(stored, bad)
    found = _one_label(ws, cfg, on_good, on_bad)
    if found:
        return found
    text = (_vanished_label(*([set(r.values) for r in counted if r.sha == sha] for sha in (good, bad)))
            # only once all the runs asked for are in: a weak move of the --metric label may yet show
            or (_closest_label(ws, cfg, on_good, on_bad) or _other_label(ws, cfg, on_good, on_bad) if weak else ""))
    return LabelHint("other", text) if text else None


def label_hint(ws: Workspace, probe_key: str, good: str, bad: str, cfg: BisectConfig, weak: bool = False) -> str:
    """What the labels show that the max (or min) over them hides, from
    every stored run of the two endpoints, as "; ..." to end a message;
    "" when nothing. ``weak``: also the label that differs most when none
    does on its own account (for a final "do not separate": a hint there
    must not stop a calibration that more runs could settle)."""
    return str(label_finding(ws, probe_key, good, bad, cfg, weak) or "")


WEAK_LABEL_P = 0.1   # a label this different alone is named, short of what several looked at need


def _closest_label(ws: Workspace, cfg: BisectConfig, on_good: dict[str, list[float]],
                   on_bad: dict[str, list[float]]) -> str:
    """The label that differs most, when none separates the endpoints on its
    own account (a tester's "does not reproduce" while one of three labels
    read p=0.042, and --metric on it found the culprit at 0.9997)."""
    if not _labels_offered(ws, cfg) or len(on_good) < 2:
        return ""
    seps = label_separations(on_good, on_bad)
    if not seps or seps[0][1] > WEAK_LABEL_P or cfg.worse not in ("either", _moved(on_good, on_bad, seps[0][0])):
        return ""
    lab, p = seps[0]
    return (f"label {lab} differs most (p={p:.2g} alone, weak with {len(seps)} labels looked at): if "
            f"that label is the test that fails, --metric {shlex.quote(lab)} bisects it and reuses these runs")


def _moved(on_good: dict[str, list[float]], on_bad: dict[str, list[float]], lab: str) -> str:
    """Which way a label's median went from the good endpoint to the bad."""
    return "higher" if statistics.median(on_bad[lab]) > statistics.median(on_good[lab]) else "lower"


CLEARER_LABEL = 100   # a label this many times surer than the max over labels is worth its own --metric
CLEARER_LOOK = 50     # ... looked for again at this many session runs, then twice as many, ...


def clearer_label(ws: Workspace, probe_key: str, good: str, bad: str, cfg: BisectConfig,
                  p_over: float | None, placed: tuple[list[str], list[str]] = ([], [])) -> tuple[str, str]:
    """A label that moved the worse way and separates the endpoints far
    more clearly than the max (min) over labels, which they differ on only
    a little (p_over): a bisect of the max over runs that overlap takes
    hundreds of runs where that label alone takes dozens (a tester's: 510
    runs and 85% right, against 49 and 100% with --metric). With
    ``placed``, the commits a search placed good and bad, their runs join
    their side's (and p_over, None to read it here, is read from them): a search spends its
    runs inside the range, and a tester's 877 went by with 17 + 12 at the
    endpoints, never enough to show it. (label, a note on it), or ("", "")."""
    if not _labels_offered(ws, cfg):
        return "", ""
    goods, bads = {good, *placed[0]}, {bad, *placed[1]}
    stored = ws.store.runs(probe_key, [*goods, *bads])
    on_good, on_bad = _on_side(stored, goods), _on_side(stored, bads)
    if p_over is None or placed[0] or placed[1]:
        side = [[r.value for r in stored if r.sha in shas and r.status in MEASURED and r.value is not None]
                for shas in (goods, bads)]
        p_over = separation(*side).p_value if min(map(len, side)) >= 2 else 1.0
    apart = labels_apart(on_good, on_bad) if len(on_good) > 1 else []
    if not apart or apart[0][1] * CLEARER_LABEL > p_over:
        return "", ""
    lab, p = apart[0]
    moved = _moved(on_good, on_bad, lab)
    if cfg.worse not in ("either", moved):
        return "", ""
    what = ("the good and the bad side (the endpoints and the commits placed on each)" if placed[0] or placed[1]
            else "the endpoints")
    return lab, (f"label {lab} alone separates {what} far more clearly (p={p:.2g}, against p={p_over:.2g} "
                 f"for the {over_labels(ws.worse)} over labels): --metric {shlex.quote(lab)} would need fewer runs, "
                 "and reuses these")
