"""What a search concluded: the ``Result`` a command prints and stores,
its notes (steps, order, kernels), and the plain-words explanation of
every commit's verdict that ``status`` shows."""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from . import repo as gitrepo
from .config import BisectConfig, make_builder
from .decide import (BAD, GOOD, SKIP, UNDECIDED, VERDICT_LR, Model, ThresholdModel, fmt_odds, is_undecided_skip, judge,
                     predictive_log_lr, separation, summarize)
from .errors import KlbisectError
from .metric import fmt_count, fmt_subject, fmt_value, last_exception, over_labels
from .proc import log_tail
from .redact import redact_text
from .runs import STATUS_NOSERVER, STATUS_TIMEOUT, valued_runs
from .search import integrated_mark, plan
from .store import SessionRow
from .workspace import Workspace, all_commits_key, commit_runs


# how a git bisect's answer the runs doubt begins, where the runs' own answer is sure: its
# confidence is not "NOT reached" (report.unmet)
GIT_ANSWER_DOUBTED = "git bisect finished on"


@dataclass
class Result:
    culprit: str | None
    candidates: list[str]
    pr: int | None
    subject: str
    confidence: float
    probe_runs: int
    good: str
    bad: str
    n_commits: int
    complete: bool
    reason: str
    session: int
    candidate_info: list[dict] = field(default_factory=list)
    labels: dict = field(default_factory=dict)
    # the value the search judged, when that is no one label's: the max over several
    judged: dict = field(default_factory=dict)
    top: list[dict] = field(default_factory=list)
    probe_seconds: float = 0.0
    build_seconds: float = 0.0
    model: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    reused_runs: int = 0          # runs of earlier sessions (same probe) the answer also rests on
    worse: str = "higher"         # which way the metric got worse: KL is higher, an accuracy lower
    # run --all-commits: each stage's range and answer, outermost first (good/bad above are the
    # last stage's, where the culprit was found)
    stages: list[dict] = field(default_factory=list)

    def stands_out(self) -> bool:
        """A finished answer, or an unfinished one worth naming as likeliest
        (what the report's "No commit stands out yet" line tells a reader)."""
        return self.complete or stands_out(self.confidence, self.n_commits, max(len(self.candidates), 1))

    def to_json(self) -> dict:
        """What is stored (and read back by from_json): the fields alone."""
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Result":
        """A stored answer; keys it does not know (a later version's) are left out."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


FLAT = 2.0   # a best guess under FLAT times its share with no evidence names no one


def stands_out(mass: float, n_commits: int, size: int = 1) -> bool:
    """Whether the likeliest place is worth naming: with no evidence a
    block of ``size`` of the ``n_commits`` places holds size/n, and a tie
    of them all named one of 79 commits as "most likely" (a tester's
    report, after a Ctrl-C). Its odds against the rest must be FLAT times
    those (on mass alone a block of half the range could never pass)."""
    rest = max(n_commits, 1) - size
    if rest <= 0:
        return False     # the whole range: no place is singled out
    return mass >= 1.0 or mass / (1.0 - mass) >= FLAT * size / rest


def top_stands_out(top: dict | None, n_commits: int) -> bool:
    """``stands_out`` of the likeliest place in status's ``top`` list, the
    one rule status's JSON and its text (report.format_status) both read."""
    return top is not None and stands_out(top["mass"], n_commits or 1, len(top["candidates"]))


def _label_summaries(values_before: list[dict], values_after: list[dict]) -> dict:
    labels = sorted({k for d in values_before + values_after for k in d})
    out = {}
    for lab in labels:
        out[lab] = {}
        for side, values in (("before", values_before), ("after", values_after)):
            s = summarize([d[lab] for d in values if lab in d])
            if not s["n"] and values:
                # a test that asserts inside its loop over labels stops before the later ones
                s["unprinted"] = len(values)
            out[lab][side] = s
    return out


def build_result(ws: Workspace, sid: int, cands: list[tuple[str, str, int | None]], pl, complete: bool,
                 reason: str, probe_key: str, build_key: str | None, refs: dict | None = None) -> Result:
    post = pl.posterior
    top = pl.done or post.top()
    shas = [c[0] for c in cands]
    block = [shas[i] for i in top.indices]
    runs = ws.store.runs(probe_key, shas)
    idx = {s: i for i, s in enumerate(shas)}
    counted = valued_runs(runs, ws.metric, ws.worse)
    sides = ([r for r in counted if r.values and post.p_bad[idx[r.sha]] < 0.01],
             [r for r in counted if r.values and post.p_bad[idx[r.sha]] > 0.99])
    before, after = ([r.values for r in side] for side in sides)
    labels = _label_summaries(before, after)
    judged = {}
    if ws.metric is None and len(labels) > 1:
        # one label can move while the others hold: the max (min) is what was judged
        before_v, after_v = ([r.value for r in side if r.value is not None] for side in sides)
        judged = {"name": f"{over_labels(ws.worse)} over labels", "before": summarize(before_v),
                  "after": summarize(after_v)}
    first = cands[top.last]
    # ``refs``: a git bisect's own (gitbisect_result's), where the user may have skipped commits by hand
    by_hand = set(hand_skipped(ws.store.session(sid), refs, ws.store.verdicts(sid),
                               {r.sha for r in counted if r.values and r.session_id == sid})) if refs else set()
    info = []
    for i in top.indices:
        sha, subj, pr = cands[i]
        why = "untestable: build failed" if (build_key and ws.store.failed_build(build_key, sha)) else (
            "untestable: skipped by hand (git bisect skip)" if sha in by_hand else
            "untestable: every run crashed" if pl.untestable[i] else "first bad")
        info.append({"sha": sha, "subject": subj, "pr": pr, "why": why})
    sess_runs = ws.store.session_runs(sid)
    builds = [b for b in ws.store.builds(build_key)] if build_key else []
    sess_row = ws.store.session(sid)
    session_start, sess_cfg = sess_row.created, sess_row.config or {}
    top_list = [{"candidates": [shas[i] for i in b.indices], "mass": b.mass} for b in post.top_blocks(5)]
    single = len(block) == 1
    notes = _kernel_notes(ws, [cands[i] for i in top.indices], build_key)
    notes += step_notes(runs, shas, sides, ws.metric is None and len(labels) > 1)
    whole = float(post.p_first_bad[top.indices].sum())
    first_parent = bool(sess_cfg.get("first_parent", True))
    if complete and whole < float(sess_cfg.get("confidence", 0.99)):
        # the integrated search may answer on its counts' channel with the
        # values' evidence discounted (search.tempered): say what all runs give
        # (a new user read "0.989; it reached 0.9902" as "short of 0.99")
        notes.append(f"the confidence {top.mass:.4f} is the integrated model's, which discounts the values' evidence "
                     f"and counts the runs far outside both sides (docs/statistics.rst): it is the one --confidence "
                     f"is met by; all runs weighed plainly give this answer {whole:.3f}, the scale of the 'top' "
                     "masses")
    if single and not first_parent:
        notes += _order_notes(ws, cands, top.last, {r.sha for r in runs})
    # a merge note on a guess far from sure sent a new user to --all-commits, not to more runs
    if single and first_parent and (complete or top.mass >= 0.5):
        side = gitrepo.side_commits(ws.repo, first[0], cands[0][0])
        if side:
            notes.append(f"{first[0][:12]} is a merge that brings in {fmt_count(side, 'commit')} of a side branch; "
                         "any of them may be the cause: rerun with --all-commits to search them too (the runs "
                         "so far are kept)")
    conf = float(sess_cfg.get("confidence", 0.99))
    if not complete and pl.integrated and top.mass >= conf:
        # "0.9936 (NOT reached ...)" read as a contradiction of --confidence 0.99 (a new user's)
        reason += (f"; where good and bad runs overlap the mark for --confidence {conf:g} is "
                   f"{integrated_mark(conf):.4g} on the runs' values (docs/statistics.rst)")
    pr = first[2] if single else None
    if single and pr is None and not first_parent:
        # a side branch's commit: the PR is its merge's
        merge = gitrepo.merged_by(ws.repo, first[0], shas[-1])
        pr = gitrepo.parse_pr(gitrepo.subject(ws.repo, merge)) if merge else None
    return Result(
        culprit=block[0] if single else None,
        candidates=block,
        pr=pr,
        subject=first[1] if single else " | ".join(cands[i][1] for i in top.indices),
        # an answer of the whole range is only as sure as the endpoints' difference
        confidence=float(top.mass) if pl.unproven is None else min(float(top.mass), 1 - pl.unproven.p_value),
        probe_runs=len(sess_runs),
        good=shas[0], bad=shas[-1], n_commits=len(shas) - 1,
        complete=complete, reason=reason, session=sid, candidate_info=info,
        labels=labels, judged=judged, top=top_list,
        probe_seconds=float(sum(r.duration or 0 for r in sess_runs)),
        build_seconds=float(sum(b["duration"] or 0 for b in builds if b["started"] >= session_start)),
        model=pl.model.to_dict(), notes=notes,
        reused_runs=max(len(runs) - sum(1 for r in sess_runs if r.sha in idx), 0),
        worse=ws.worse,
    )


STEP_NOTE_P = 0.001   # interior runs of a side this unlike its endpoint's get a note
STEP_NOTE_RUNS = 5    # ... when each holds at least this many runs


def step_notes(runs, shas: list[str], sides, max_over_labels: bool) -> list[str]:
    """The search assumes one step: every commit before the culprit like
    --good, every one after it like --bad. Interior runs of a side that
    differ from their endpoint's say otherwise: a gradual drift, or a
    second change in the range."""
    notes = []
    for side, end, name, other in ((sides[0], shas[0], "--good", "an earlier"),
                                   (sides[1], shas[-1], "--bad", "a later")):
        ends = [r.value for r in side if r.sha == end and r.value is not None]
        inner = [r.value for r in side if r.sha != end and r.value is not None]
        if min(len(ends), len(inner)) < STEP_NOTE_RUNS:
            continue
        sep = separation(ends, inner)
        if sep.p_value < STEP_NOTE_P:
            where = "before" if end == shas[0] else "after"
            notes.append(f"the commits {where} the answer look unlike {name} (median "
                         f"{fmt_value(sep.bad['median'])} against {fmt_value(sep.good['median'])}, p={sep.p_value:.1g}"
                         f"{', max over labels' if max_over_labels else ''}): the values may drift over many commits, "
                         f"or {other} change in the range moved them too; check the runs with `klbisect status`")
    return notes


def _order_notes(ws: Workspace, cands: list[tuple[str, str, int | None]], last: int,
                 probed: set[str]) -> list[str]:
    """--all-commits lays side branches out in one order and reads each
    commit as containing every one before it. Where the culprit's own parents
    were not what the search judged good, or a probed commit after it does
    not contain it, the answer rests on that order: say so, and how to check."""
    culprit, subj = cands[last][0], cands[last][1]
    index = {c[0]: i for i, c in enumerate(cands)}
    notes = []
    # the posterior calls a parent good by the order alone: only its own runs show it
    unprobed = [p for p in gitrepo.parents(ws.repo, culprit)
                if p in index and p != cands[last - 1][0] and p not in probed]
    if unprobed:
        p = unprobed[0]
        notes.append(f"--all-commits: {culprit[:12]} ({fmt_subject(subj, 50)}) is named because {cands[last - 1][0][:12]}, "
                     f"before it in the search's order, looked good; its parent {p[:12]} "
                     f"({cands[index[p]][1][:50]}) was never probed. If that parent is bad, the culprit is "
                     f"on its line: rerun with --bad {p[:12]}, or without --all-commits")
    later = [c for c in cands[last + 1:] if c[0] in probed and not gitrepo.is_ancestor(ws.repo, culprit, c[0])]
    if later:
        notes.append(f"--all-commits: {len(later)} probed commit(s) after {culprit[:12]} in the search's order "
                     f"do not contain it (side branches, e.g. {later[0][0][:12]} {later[0][1][:50]}), yet "
                     "their runs were read as if they did; confirm the answer without --all-commits")
    return notes


def _kernel_notes(ws: Workspace, block: list[tuple[str, str, int | None]], build_key: str | None) -> list[str]:
    """SGLang: a culprit that only edits kernel sources the pinned wheel does
    not contain cannot have changed what the probe measured."""
    if not build_key or not build_key.startswith("sglang-build"):
        return []
    from .sglang import kernel_note, parse_pins  # noqa: PLC0415
    notes = []
    for sha, subj, _ in block:
        try:
            changed = gitrepo.changed_files(ws.repo, f"{sha}^", sha)
            pins = [parse_pins(gitrepo.show_file(ws.repo, rev, "python/pyproject.toml")) for rev in (f"{sha}^", sha)]
        except KlbisectError:
            continue
        note = kernel_note(changed, pins[0] != pins[1])
        if note:
            notes.append(f"{sha[:12]} ({fmt_subject(subj, 50)}): {note}")
    return notes


def capped_note(pl, shas: list[str]) -> str:
    """Why more runs could not settle it, where the per-commit cap is the
    limit: the commits the likeliest answer rests on hold all the runs they
    may get (a tester's --max-total-runs advice, where --max-runs was it)."""
    if not pl.held:
        return ""
    which = " and ".join(shas[i][:12] for i in pl.held)
    return (f"; {which}, which the likeliest answer rests on, {'hold' if len(pl.held) > 1 else 'holds'} all the "
            f"runs a commit may get ({pl.held_cap}): rerun with a higher --max-runs (e.g. {2 * pl.held_cap}) to "
            f"measure {'them' if len(pl.held) > 1 else 'it'} more; the runs so far are kept")


def finish_result(ws, sid, cands, pl, complete, reason, probe_key, build_key, progress) -> Result:
    res = build_result(ws, sid, cands, pl, complete, reason, probe_key, build_key)
    ws.store.update_session(sid, result=res.to_json(), state="done" if complete else "bisecting",
                            model=pl.model.to_dict())
    if ws.store.get(all_commits_key(sid)):
        ws.store.put(all_commits_key(sid), "")   # answered by itself now
    return res


# why a commit's verdict or P(bad) is not its own runs' alone: said in full under the first commit
# it fits in `status`'s list, then pointed back to (said_once; a tester read it under eleven commits)
SITS_WHY = ("weighs every commit's runs at once, and where good and bad runs overlap a commit's few runs say "
            "little alone; the commits on either side of the answer decide it")
LESS_SURE_WHY = (": it weighs every commit's runs at once, over every place the first bad commit could be, and "
                 "one commit's odds move it less where many places are left")
LESS_SURE_RANKS = ": it is the rank-based weighing's, not the fitted model's that gave the verdict (see above)"
_SITS = re.compile(r": P\(bad\) = [0-9.]+ " + re.escape(SITS_WHY))


def said_once(explains: list[str]) -> list[str]:
    """``explains`` of a list of commits, each long reason in full only the
    first time (JSON keeps every commit's whole)."""
    out, told = [], set()
    for text in explains:
        for key, pattern in (("sits", _SITS), ("less sure", re.compile(re.escape(LESS_SURE_WHY)))):
            if pattern.search(text):
                text = pattern.sub(" (as above)", text) if key in told else text
                told.add(key)
        out.append(text)
    return out


def explain_commit(entry: dict, model) -> str:
    """The evidence on one commit in plain words, for `klbisect status`."""
    vals = entry["values"]
    parts = []
    if entry.get("build_failed"):
        parts.append("its build failed, so it cannot be measured (untestable)")
    if entry.get("skipped_by_hand"):
        parts.append("skipped by hand (`git bisect skip`): never measured, untestable as git takes it")
    if entry.get("git_marked"):
        parts.append(f"git bisect holds it {entry['git_marked'].upper()}, against this verdict: marked by hand "
                     "(`git bisect log` shows it), and git's answer follows that mark")
    if entry.get("crashes") and entry.get("no_server", 0) >= entry["crashes"]:
        parts.append(f"{entry['crashes']} run(s) gave no value: its server did not start (not counted as evidence)")
    elif entry.get("crashes"):
        parts.append(f"{entry['crashes']} run(s) gave no value (crashed, timed out, cut short or printed no "
                     "--metric label"
                     + (f"; {entry['no_server']} of them: its server did not start" if entry.get("no_server") else "")
                     + "; not evidence)")
    if entry.get("crashes") and entry.get("crash_cause"):
        parts.append(f"the last one's log ends on {entry['crash_cause']}")
    if vals:
        shown = ", ".join(fmt_value(v) for v in vals[:6]) + (" ..." if len(vals) > 6 else "")
        llr = entry.get("log_lr", 0.0)
        side = "bad" if llr > 0 else "good"
        if isinstance(model, ThresholdModel):
            fails = sum(v >= model.threshold for v in vals)
            parts.append(f"{len(vals)} run(s) [{shown}]: {fails} at or above the threshold {model.threshold:g}")
        elif model is not None and entry.get("integrated"):
            # the sides overlap: the header says so once; a commit's own ratio decides nothing here
            parts.append(f"{len(vals)} run(s) [{shown}], median {fmt_value(statistics.median(vals))}")
            if entry.get("own_log_lr") is not None:
                # a reviewer's: the two commits beside the answer, with 236 runs between them, read
                # "from where it sits ... a commit's few runs say little alone"
                parts.append(f"its runs alone, against the runs of the commits placed good and of those placed "
                             f"bad (rank test): {fmt_odds(entry['own_log_lr'])}")
        elif model is not None:
            parts.append(f"{len(vals)} run(s) [{shown}] look {side}: weighed now, with the model every run so far "
                         f"gives, together {math.exp(min(abs(llr), 700)):.3g} times likelier if the commit is {side}")
        else:
            # a start killed while calibrating: "3 probe runs" in the header, none below (a tester's)
            parts.append(f"{len(vals)} run(s) [{shown}], median {fmt_value(statistics.median(vals))}; no model "
                         "weighs them (the endpoints' runs have not been shown to differ)")
    own = entry.get("own_log_lr")
    says_itself = own is not None and abs(own) >= math.log(VERDICT_LR) and (own > 0) == (entry.get("verdict") == BAD)
    if vals and entry.get("integrated") and entry.get("verdict") in (GOOD, BAD) and not entry.get("reason") \
            and entry.get("p_bad") is not None and 0 < entry["index"] and not says_itself:
        # a tester's: "BAD P(bad)=1.000 / 1 run [0.00228]" below the good side's median, unexplained
        parts.append(f"verdict {entry['verdict']} from where it sits, not from its own runs alone: "
                     f"P(bad) = {entry['p_bad']:.3f} {SITS_WHY}")
    if entry.get("verdict") and entry.get("reason"):
        # the runs and the model as they stood then: its ratio differs from the one above
        parts.append(f"verdict {entry['verdict']}, when it was given: {entry['reason']}")
        p_bad = entry.get("p_bad")
        if p_bad is not None and 0.01 < p_bad < 0.99 and entry["verdict"] in (GOOD, BAD) and 0 < entry["index"]:
            # a tester read "1.6e+03:1 for good" beside P(bad)=0.28 as a contradiction
            parts.append("P(bad) is less sure than that verdict" + (LESS_SURE_RANKS if entry.get("took_over")
                                                                    else LESS_SURE_WHY))
    return "; ".join(parts)


def boundary_evidence(commits: list[dict], post, shas: list[str]) -> dict | None:
    """What the most likely answer rests on, for `status`: every run before
    it against every run from it on (the endpoints' included), whether
    the endpoints themselves differ, and how much of the posterior it
    holds against the next place. Where the sides overlap no one commit's
    runs decide; this is the evidence that does."""
    blocks = post.top_blocks(2)
    top = blocks[0]
    before = [v for c in commits if c["index"] < top.first for v in c["values"]]
    after = [v for c in commits if c["index"] >= top.last for v in c["values"]]
    ends = [next((c["values"] for c in commits if c["index"] == i), []) for i in (0, len(shas) - 1)]
    if len(before) < 2 or len(after) < 2 or min(map(len, ends)) < 2:
        return None
    # the split is the one these runs chose: a test of it would be far too sure (a
    # reviewer's: p < 0.05 in 44% of ranges with no change); the endpoints' own is a test
    sep = separation(*ends)

    def side(values: list[float], inside) -> dict:
        return {"runs": len(values), "commits": sum(1 for c in commits if c["values"] and inside(c["index"])),
                "median": statistics.median(values)}
    return {"first_bad": shas[top.last], "mass": top.mass, "endpoints_p": sep.p_value,
            "before": side(before, lambda i: i < top.first), "after": side(after, lambda i: i >= top.last),
            "next": {"candidates": [shas[i] for i in blocks[1].indices], "mass": blocks[1].mass}
            if len(blocks) > 1 else None}


def probed_commits(ws: Workspace, sess: SessionRow, cfg: BisectConfig, cands, runs, pl) -> list[dict]:
    """Every commit with runs: its values, P(bad), evidence and verdict,
    explained in plain words (for status and reports)."""
    verdicts = ws.store.verdicts(sess.id)
    n = len(cands) - 1
    out = []
    no_server: dict[str, int] = {}
    crashed_log: dict[str, str] = {}
    for r in ws.store.runs(sess.probe_key, [c[0] for c in cands if runs[c[0]].crashes]):
        no_server[r.sha] = no_server.get(r.sha, 0) + (r.status == STATUS_NOSERVER)
        if r.value is None and r.log_path and r.status != STATUS_TIMEOUT:    # a timeout's last line is no cause
            crashed_log[r.sha] = r.log_path
    # git's own marks, where a hand-typed one disagrees with klbisect's verdict (a tester's wrong
    # `git bisect good` showed as "BAD" in the table, with nothing to say git holds it good)
    from .gitbisect import session_refs  # noqa: PLC0415 - gitbisect builds on this module
    held = session_refs(ws, sess) if sess.state == "bisecting" else None
    # and the commits the user skipped, which a tester missed from the table
    by_hand = set(hand_skipped(sess, held, verdicts, {r.sha for r in ws.store.session_runs(sess.id)
                                                      if r.value is not None})) if held else set()
    for i, (sha, subj, pr) in enumerate(cands):
        cr = runs[sha]
        if not cr.values and not cr.crashes and not cr.build_failed and sha not in by_hand:
            continue
        entry = {"index": i, "sha": sha, "subject": subj, "pr": pr, "values": list(cr.values),
                 "crashes": cr.crashes, "build_failed": cr.build_failed, "no_server": no_server.get(sha, 0)}
        if sha in by_hand:
            entry["skipped_by_hand"] = True
        if cr.crashes and sha in crashed_log:
            # why, from its last crashed run's log: a broken commit and a broken environment look
            # alike as "2 crashed" (a tester's ModuleNotFoundError was in the log files alone)
            entry["crash_cause"] = crash_cause(crashed_log[sha])
        if pl is not None:
            entry["p_bad"] = float(pl.posterior.p_bad[i])
            entry["log_lr"] = pl.model.commit_log_lr(cr.values)
            # the sides overlap: the search weighs every run with both distributions
            # integrated out, and one commit's ratio under the fitted model is not what it used
            entry["integrated"] = bool(pl.integrated)
            entry["took_over"] = bool(pl.took_over)
        if sha in verdicts:
            entry["verdict"], entry["reason"] = verdicts[sha]["verdict"], verdicts[sha].get("reason", "")
        elif i in (0, n) and pl is None and cr.values:
            # no model: the endpoints were not shown to differ (a tester read "verdict bad" of a
            # --bad whose runs looked like the good end's as a finding)
            entry["verdict"], entry["reason"] = ((GOOD, "the good end as given (--good)") if i == 0 else
                                                 (BAD, "the bad end as given (--bad), not judged by its runs: no "
                                                       "model was fitted to the endpoints (see why the session "
                                                       "stopped)"))
        elif i in (0, n) and (cr.values or pl is not None):
            entry["verdict"], entry["reason"] = (GOOD, "good endpoint") if i == 0 else (BAD, "bad endpoint")
        elif i in (0, n):
            # a start that stopped on endpoints that printed nothing: given, not shown so
            entry["verdict"], entry["reason"] = "", "endpoint: no value yet"
        elif cr.build_failed:
            entry["verdict"], entry["reason"] = SKIP, "build failed"
        elif sha in by_hand:
            entry["verdict"], entry["reason"] = SKIP, ""
        elif pl is not None and pl.integrated and sess.kind == "run":
            # its verdict is where P(bad), shown beside it, stands now
            p, sure = entry["p_bad"], 1 - cfg.confidence
            entry["verdict"] = GOOD if p < sure else BAD if p > 1 - sure else UNDECIDED
            entry["reason"] = ""
        elif pl is not None:
            v = judge(cr.values, cr.crashes, pl.model, cfg.max_runs, cfg.crash_limit)
            entry["verdict"], entry["reason"] = v.decision, v.reason
            if is_undecided_skip(v.decision, v.reason) and sess.kind == "run":
                # --max-runs without a verdict is a skip to git bisect; `run` skips nothing,
                # and the search may still place it from its neighbours (good*/bad*)
                entry["verdict"] = UNDECIDED
        git_says = held and 0 < i < n and (GOOD if sha in held["good"] else BAD if sha in held["bad"][:1] else None)
        if git_says and entry.get("verdict") in (GOOD, BAD) and entry["verdict"] != git_says:
            entry["git_marked"] = git_says
        out.append(entry)
    if pl is not None and pl.integrated:
        _own_evidence(out, len(cands) - 1)
    for entry in out:
        entry["explain"] = explain_commit(entry, pl.model if pl else None)
    return out


def _own_evidence(commits: list[dict], last: int) -> None:
    """Where good and bad overlap, what each placed commit's runs say by
    themselves: against the runs of the other commits placed good and of
    those placed bad (``decide.predictive_log_lr``; their places rest on
    every run, its own too). Near the answer a commit may hold a hundred
    runs, and those decide it."""
    pools, spans = {}, {}     # each side's runs in one array, and where each commit's lie in it
    for side in (GOOD, BAD):
        at, parts = 0, []
        for c in commits:
            if c["values"] and c.get("verdict") == side:
                spans[c["index"]] = (at, at + len(c["values"]))
                at += len(c["values"])
                parts.append(c["values"])
        pools[side] = np.concatenate(parts) if parts else np.zeros(0)
    for c in commits:
        if not c["values"] or c.get("verdict") not in (GOOD, BAD) or c["index"] in (0, last):
            continue
        lo, hi = spans[c["index"]]
        own = pools[c["verdict"]]
        good, bad = ((np.concatenate([own[:lo], own[hi:]]), pools[BAD]) if c["verdict"] == GOOD
                     else (pools[GOOD], np.concatenate([own[:lo], own[hi:]])))
        if len(good) >= 2 and len(bad) >= 2:
            c["own_log_lr"] = predictive_log_lr(c["values"], good, bad)


def crash_cause(log_path: str) -> str | None:
    """The last exception line of a run's log, the server's lines a failed
    launch copied into it included."""
    # redacted before last_exception cuts the line: a cut token no longer looks like one, and the
    # logs keep what the probe printed
    return last_exception(redact_text(re.sub(r"(?m)^server\| ", "", log_tail(log_path, 40))))


def hand_skipped(sess: SessionRow, refs: dict, judged: dict, measured: set[str]) -> list[str]:
    """Interior commits of a git bisect in progress that git holds skipped
    (``refs``: gitbisect.session_refs) and this session neither judged (its
    own skips for crashes or builds) nor measured: the user's `git bisect
    skip` (or a wrapper's exit 125)."""
    if sess.kind != "gitbisect" or sess.state != "bisecting":
        return []
    return [s for s in refs["skip"] if s not in measured and s not in judged and s not in (sess.good, sess.bad)]


def current_analysis(ws: Workspace, sess: SessionRow):
    """Recompute the posterior of a session from its stored runs."""
    cfg = BisectConfig.from_dict({**sess.config, "good": sess.good, "bad": sess.bad})
    ws.use_session(sess)
    cands = ws.store.candidates(sess.id)
    shas = [c[0] for c in cands]
    # the key the session stored: the probe itself may read files (--prompts) that are
    # elsewhere, or changed, when `status` or `report` runs
    probe_key, builder = sess.probe_key, make_builder(cfg)
    build_key = builder.key if builder else None
    # a session stored before it kept its --timeout counts every timeout, as it did
    runs = commit_runs(ws, probe_key, build_key, shas, sess.config.get("timeout"))
    model = Model.from_dict(sess.model) if sess.model else None
    pl = None
    if model is not None:
        pl = plan([runs[s] for s in shas], model, cfg.confidence, max_runs=cfg.max_runs,
                  crash_limit=cfg.crash_limit, max_endpoint_runs=cfg.max_endpoint_runs)
    return cfg, cands, runs, pl, probe_key, build_key
