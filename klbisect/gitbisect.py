"""``klbisect start`` + ``git bisect run klbisect probe``: the search
handed to git. ``probe_head`` judges the checked-out commit (0 good, 1 bad,
125 skip, 128+ abort) from as many runs as its verdict needs, and
``gitbisect_result`` reads the answer the session's runs support;
``own_bisect`` and ``bisect_checkout`` tell whether, and in which worktree,
the git bisect in progress is the session's (``reset`` asks them too)."""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

from . import repo as gitrepo
from .build import Builder
from .buildenv import adopt_env, close_builder, hold_env, keep_env, warn_build_paths, warn_probe_python
from .config import BisectConfig, make_builder, make_probe, same_question
from .decide import (BAD, GOOD, SKIP, STALE_RUN_LR, UNDECIDED_LIMIT, VERDICT_LR, Model, ThresholdModel,
                     crash_skip_limit, is_undecided_skip, judge, runs_per_commit, verdict_model)
from .endpoints import calibrate_endpoints, never_built
from .errors import EXIT_NOT_SURE, EXIT_NO_SIGNAL, EXIT_REPO_STATE, EXIT_USAGE, KlbisectError
from .executors import port_bases
from .measure import Measurer
from .metric import fmt_count, fmt_subject, fmt_value
from .probe import Probe, Slot
from .result import GIT_ANSWER_DOUBTED, Result, build_result, current_analysis
from .runs import STATUS_TIMEOUT, run_shown, typical_values, usual_labels
from .search import CommitRuns
from .store import SessionRow
from .workspace import (Progress, Workspace, WorktreeMeter, bisect_key, checkout_key, commit_runs, note_checkout,
                        note_stop, own_runs_wanted, record, say_building, say_reused, since, stop_key, to_stderr,
                        worktree_key)


def own_bisect(ws: Workspace, sess: SessionRow, repo=None) -> bool:
    """Whether the git bisect in progress in ``repo`` (default: the asking
    checkout) is the one this `klbisect start` session began: after a
    `git bisect reset` by hand, a bisect the user starts is theirs (a
    tester's was judged by the old session's rule, then ended by `klbisect
    reset`)."""
    now = gitrepo.bisect_id(ws.repo if repo is None else repo)
    began = ws.store.get(bisect_key(sess.id))
    # none stored: a session from before bisects were told apart; "inode:mtime": an earlier build's id
    return now is not None and (not began or ":" in began or began == now)


def session_refs(ws: Workspace, sess: SessionRow) -> dict[str, list[str]]:
    """git's bisect refs (bad, good-*, skip-*) of this session's own bisect,
    read in the checkout it runs in (refs/bisect/* are a worktree's own);
    none after a `git bisect reset`, or for a bisect the user began since."""
    empty: dict[str, list[str]] = {"bad": [], "good": [], "skip": []}
    if sess.kind != "gitbisect":
        return empty
    repo, _ = bisect_checkout(ws, sess)
    if repo is None or not own_bisect(ws, sess, repo):
        return empty
    return gitrepo.bisect_refs(repo)


def bisect_checkout(ws: Workspace, sess: SessionRow):
    """The repository (worktree) a `klbisect start` session's git bisect
    runs in, and its path when it is not the asking one; None when that
    worktree is gone."""
    there = _elsewhere(ws, sess)
    if there is None:
        return ws.repo, None
    try:
        return (gitrepo.open_repo(there) if there.exists() else None), there
    except KlbisectError:
        return None, there


def _elsewhere(ws: Workspace, sess: SessionRow) -> Path | None:
    """The checkout a `klbisect start` session's git bisect runs in, when
    it is another worktree of this repository than the one asked from:
    the state is shared by the repository's worktrees, a git bisect is
    each worktree's own (a tester's second worktree joined the session,
    and `reset` in one left the other's bisect running, disowned). Known
    by the worktree's name, so `git worktree move` does not lose it."""
    top = ws.store.get(checkout_key(sess.id))
    wid = ws.store.get(worktree_key(sess.id))
    if wid is None:     # a session started before worktrees were known by name
        return Path(top) if top and Path(top) != ws.top else None
    if wid == gitrepo.worktree_id(ws.repo):
        if top != str(ws.top):
            ws.store.put(checkout_key(sess.id), str(ws.top))
        return None
    return (gitrepo.worktree_path(ws.repo, wid) if wid else None) or Path(top or wid)


def start(path: str | Path | None, cfg: BisectConfig, progress: Progress = to_stderr) -> dict:
    """Calibrate the endpoints (in a worktree, leaving the user's tree alone),
    then `git bisect start --first-parent`. Returns what git printed."""
    cfg.validate()
    ws = Workspace(path, cfg.metric, cfg.worse)
    try:
        good, bad = gitrepo.check_range(ws.repo, cfg.good, cfg.bad)   # before the state directory is made
        with ws.locked():
            active = ws.store.active_session("gitbisect")
            if (active and active.state == "bisecting" and active.model is not None
                    and same_question(active, good, bad, cfg)
                    and not (cfg.fresh and not active.config.get("fresh"))
                    and gitrepo.bisect_in_progress(ws.repo)
                    and ws.store.get(bisect_key(active.id)) == gitrepo.bisect_id(ws.repo)
                    and _elsewhere(ws, active) is None):
                # the same start again, after one that finished but was stopped a moment before it
                # could say so (a tester's TERM as git bisect began: `start && git bisect run ...`
                # stopped, and the rerun was "a git bisect is already in progress")
                # the settings a rerun may change (--timeout, --max-total-runs) apply from here,
                # as on any start that resumes its session
                ws.store.update_session(active.id, config=cfg.stored())
                progress(f"klbisect: session {active.id} already began this git bisect")
                return {"session": active.id, "git": "", "model": active.model,
                        "n_commits": len(ws.store.candidates(active.id)) - 1, "top": str(ws.top)}
            gitrepo.ensure_clean(ws.repo)
            if (active and active.state == "calibrating" and active.model is None
                    and not gitrepo.bisect_in_progress(ws.repo)
                    and (not same_question(active, good, bad, cfg)
                         or cfg.fresh and not active.config.get("fresh"))):
                # a start that failed (a probe-cmd typo, endpoints that did not separate) before
                # git bisect began: the corrected command replaces it; its runs stay in the store
                ws.store.update_session(active.id, state="ended", ended=time.time())
                progress(f"klbisect: session {active.id} stopped before git bisect began; starting over "
                         "with these options")
                active = None
            there = _elsewhere(ws, active) if active else None
            if there is not None and not there.exists():
                raise KlbisectError(f"a klbisect git bisect (session {active.id}) ran in the worktree {there}, which "
                                    "was removed since: run `klbisect reset` (it ends that session) first",
                                    EXIT_REPO_STATE)
            if there is not None:
                raise KlbisectError(f"a klbisect git bisect (session {active.id}) runs in the worktree {there}: "
                                    "finish it there, or run `klbisect reset` (it ends that one too) first",
                                    EXIT_REPO_STATE)
            if active and not same_question(active, good, bad, cfg):
                raise KlbisectError(f"a klbisect session ({active.id}) is already active here; "
                                    "run `klbisect reset` first", EXIT_REPO_STATE)
            cands = [(c.sha, c.subject, c.pr) for c in gitrepo.candidates(ws.repo, good, bad, cfg.first_parent)]
            probe, builder = make_probe(cfg), make_builder(cfg)
            # `klbisect probe` has no options of its own: it runs with the
            # --timeout of the latest `start`
            if active:
                if cfg.fresh and not active.config.get("fresh"):
                    raise KlbisectError(f"session {active.id} is already active here with the earlier runs; "
                                        "run `klbisect reset`, then `klbisect start --fresh` again", EXIT_REPO_STATE)
                sid = active.id
                cfg.fresh = bool(active.config.get("fresh"))
                ws.store.update_session(sid, config=cfg.stored())
                ws.use_session(ws.store.session(sid))
                if ws.store.get(stop_key(sid)):
                    ws.store.put(stop_key(sid), "")
            else:
                sid = ws.store.create_session("gitbisect", good, bad, probe.key, cfg.stored(), cands)
                note_checkout(ws, sid)
                ws.use_session(ws.store.session(sid))
                # the checkout may have been rebuilt, cleaned or switched since an earlier
                # session's last build: this session's first probe builds
                for key in ws.store.keys("last_build:"):
                    if key.endswith(f":{ws.top}"):
                        ws.store.put(key, "")
                say_reused(ws, probe.key, [c[0] for c in cands], cfg.timeout, progress)
            meter = WorktreeMeter(ws, sid, probe, builder, progress)
            build_key = meter.build_key
            # what --build sglang finds before its first build, kept where a Ctrl-C cannot lose it
            hold_env(ws, sid, builder, ws.logs / f"s{sid}")
            warn_build_paths(ws.repo, builder, good, bad, progress)
            warn_probe_python(cfg, builder, progress)

            def execute(batch, stop=None):
                for sha in batch:
                    out, run = meter.measure(sha)
                    if run is not None:
                        progress(f"  {sha[:12]}: {run.value if run.value is not None else 'no value'}")
                    elif out.build_failed:
                        progress(f"  {sha[:12]}: build failed ({out.build.log_path})")
                    if stop is not None and stop():
                        return
            try:
                model = calibrate_endpoints(ws, cfg, sid, good, bad, execute, probe.key, build_key, progress,
                                            pooled=False)
            except KlbisectError as e:
                note_stop(ws.store, sid, e.message)
                raise
            finally:
                meter.close()
                close_builder(builder, progress, ws, sid)
            ws.store.update_session(sid, model=model.to_dict(), state="bisecting")
            if isinstance(model, Model) and not model.decisive:
                how = ("overlap" if not model.disjoint else "sit close for their spread" if not model.separates
                       else f"separate on only {min(model.n_good, model.n_bad)} runs a side")
                progress(f"warning: good and bad {how}{verdict_cost(model, cfg.max_runs)}, and `git bisect` needs a "
                         "final verdict per commit: "
                         + ("each is judged against the endpoints' runs themselves, which takes tens of runs "
                            "and leaves some commits skipped undecided; " if not model.separates else "")
                         + "`klbisect run` weighs all runs together and is the cheaper and safer choice here")
            out = gitrepo.bisect_start(ws.repo, good, bad, cfg.first_parent)
            ws.store.put(bisect_key(sid), gitrepo.bisect_id(ws.repo) or "")
            return {"session": sid, "git": out, "model": model.to_dict(), "n_commits": len(cands) - 1,
                    "top": str(ws.top)}
    finally:
        ws.close()


def verdict_cost(model: Model, max_runs: int | None) -> str:
    """What a verdict per commit costs at the endpoints' separation, where
    that is many runs: a tester's endpoints read 0.2 spreads apart, and
    `git bisect run` spent 100 runs on each of two commits, then stopped."""
    # a normal shift of d spreads gives d^2/2 of log likelihood ratio a run on average
    per_commit = math.log(VERDICT_LR) / max(model.effect ** 2 / 2, 1e-9)
    if per_commit < VERDICT_COST_NOTE:
        return ""
    limit = runs_per_commit(model, max_runs)
    return (f" (they read {model.effect:.2g} spreads apart: a verdict at {VERDICT_LR:g}:1 takes some "
            f"{per_commit:,.0f} runs a commit" + (f", past its cap of {limit} (--max-runs), so commits will be "
                                                  "skipped undecided" if per_commit > limit else "") + ")")


VERDICT_COST_NOTE = 20   # runs a verdict takes before start's warning says how many


@dataclass
class HeadVerdict:
    sha: str
    decision: str
    exit_code: int
    reason: str
    values: list[float]


def probe_head(path: str | Path | None, progress: Progress = to_stderr) -> HeadVerdict:
    """Judge the checked-out commit for `git bisect run`: 0 good, 1 bad,
    125 skip. Runs as many times as the evidence needs; reuses earlier runs
    of the same commit, so a rerun after Ctrl-C continues where it was."""
    ws = Workspace(path)
    no_session = KlbisectError("no klbisect session here: run `klbisect start --good G --bad B "
                               "--probe-cmd ...` first", EXIT_USAGE)
    try:
        if ws.never_used():
            raise no_session      # and makes no state directory (one that exists may be another's: busy)
        with ws.locked():
            sess = ws.store.active_session("gitbisect")
            if sess is None or sess.model is None:
                raise no_session
            there = _elsewhere(ws, sess)
            if there is not None:
                raise KlbisectError(f"session {sess.id}'s git bisect runs in the worktree {there}, not here: run "
                                    "`git bisect run klbisect probe` there", EXIT_USAGE)
            cfg = BisectConfig.from_dict({**sess.config, "good": sess.good, "bad": sess.bad})
            ws.use_session(sess)
            probe, builder = make_probe(cfg), make_builder(cfg)
            build_key = builder.key if builder else None
            adopt_env(ws, sess.id, builder)
            sha = gitrepo.head_sha(ws.top)
            if not gitrepo.bisect_in_progress(ws.repo):
                progress(f"klbisect: warning: no git bisect is in progress (reset outside klbisect?); judging "
                         f"HEAD {sha[:12]} for session {sess.id} all the same (`klbisect reset` ends it)")
            elif not own_bisect(ws, sess):
                raise KlbisectError(f"the git bisect in progress here is not the one session {sess.id} began (that "
                                    "one was reset, and this one started since, outside klbisect): `klbisect "
                                    f"reset` ends session {sess.id} and leaves this bisect alone; `klbisect start` "
                                    "begins a session of its own", EXIT_USAGE)
            if sha not in {c[0] for c in ws.store.candidates(sess.id)}:
                progress(f"klbisect: warning: HEAD {sha[:12]} is not one of the session's commits between "
                         f"{sess.good[:12]} and {sess.bad[:12]}{' (first parents)' if cfg.first_parent else ''}; "
                         "judging it anyway")
            model = _refined_model(ws, sess, cfg, probe.key, build_key)
            slot = Slot(0, ws.top, {}, port_bases(1)[0], ws.pids)  # the user's own checkout
            built_key = f"last_build:{build_key}:{ws.top}"
            say = say_building(progress, probe)

            def on_build(sha_: str, log: Path) -> None:
                # a Ctrl-C or kill mid-build or mid-run leaves this checkout holding
                # another commit's build: forgotten before it starts, not after
                ws.store.put(built_key, "")
                say(sha_, log)
            measurer = Measurer(ws.repo, probe, builder, ws.logs / f"s{sess.id}", use_worktree=False,
                                on_build=on_build)
            last = ws.store.get(built_key) if build_key else None
            measurer.last_built[str(ws.top)] = last or None
            # a build that failed in an earlier command is tried once more (the README's promise):
            # the environment may have been fixed since
            first_build = ws.store.last_build_id()
            before = commit_runs(ws, probe.key, build_key, [sha], cfg.timeout, failed_after=first_build)[sha]
            ends = commit_runs(ws, probe.key, build_key, [sess.good, sess.bad], cfg.timeout)
            crashed = sum(c.crashes for c in ends.values())
            crash_limit = crash_skip_limit(crashed, crashed + sum(len(c.values) for c in ends.values()),
                                           cfg.crash_limit)
            try:
                v, cr = _judge_head(_HeadJob(ws, sess, cfg, sha, probe, builder, build_key, built_key, measurer, slot,
                                             model, crash_limit, first_build, before, progress))
                if v.decision == SKIP and not v.values and not cr.build_failed:
                    _check_environment(ws, sess, cfg, probe, builder, sha, progress)
            finally:
                # the server stops here, where a Ctrl-C is an exit 130, not at the interpreter's exit
                # (a tester's Ctrl-C there printed a traceback from the atexit hook)
                getattr(probe, "close", lambda: None)()
            ws.store.set_verdict(sess.id, sha, v.decision, {"reason": v.reason, "values": v.values})
            progress(f"klbisect: {sha[:12]} is {v.decision.upper()}: {v.reason}")
            return v
    finally:
        ws.close()


@dataclass
class _HeadJob:
    """What judging HEAD under git bisect needs: the session, what measures
    it, and where this command's runs begin (``first_build``: a build that
    failed before it is tried again; ``before``: HEAD's runs as this
    command found them)."""

    ws: Workspace
    sess: SessionRow
    cfg: BisectConfig
    sha: str
    probe: Probe
    builder: Builder | None
    build_key: str | None
    built_key: str      # the store key naming the commit whose build the checkout holds
    measurer: Measurer
    slot: Slot
    model: Model
    crash_limit: int
    first_build: int    # the store's last build id when this command began: later ones are its own
    before: CommitRuns
    progress: Progress


def _judge_head(job: _HeadJob):
    """Measure HEAD until its runs decide: (verdict, its runs)."""
    ws, sess, cfg, sha, probe = job.ws, job.sess, job.cfg, job.sha, job.probe
    build_key, built_key, model, progress = job.build_key, job.built_key, job.model, job.progress
    if job.before.values:
        # its runs are numbered on from these: "run 2" with no run 1 read as a lost run (a tester's)
        shown = ", ".join(fmt_value(x) for x in job.before.values[:6]) + (" ..." if len(job.before.values) > 6 else "")
        progress(f"klbisect: {sha[:12]}: {fmt_count(len(job.before.values), 'earlier run')} reused [{shown}]"
                 + (f" and {job.before.crashes} that crashed" if job.before.crashes else ""))
    checked = False
    while True:
        cr = since(commit_runs(ws, probe.key, build_key, [sha], cfg.timeout, failed_after=job.first_build)[sha],
                   job.before)
        if cr.build_failed:
            log = (ws.store.failed_build(build_key or "", sha) or {}).get("log_path")
            # a session's build options are fixed at `start`: a new one is how to change them
            err = never_built(ws, build_key, log, rerun="start again (`klbisect reset` ends this "
                              "session and git's bisect; then `klbisect start` with the build fixed)")
            if err:
                raise err   # abort git bisect: skipping every commit would hide a broken command
            v = HeadVerdict(sha, SKIP, 125, f"build failed; log: {log or '?'}", [])
            break
        verdict = judge(cr.values, cr.crashes, model, cfg.max_runs, job.crash_limit)
        # before every verdict, undecided too: old and new runs pooled can stay undecided
        # until --max-runs, and a skip there would hide the contradiction (raises 154)
        unchecked = _reuse_unchecked(ws, sess.id, probe.key, sha, model)
        if verdict.decision != "undecided" and not (unchecked and verdict.decision != SKIP):
            code = {GOOD: 0, BAD: 1, SKIP: 125}[verdict.decision]
            v = HeadVerdict(sha, verdict.decision, code, verdict.reason, cr.values)
            break
        stop = _gitbisect_budget(ws, sess, cfg, sha)
        if stop is not None:
            # git bisect run aborts on it: `status` is where the user looks next
            note_stop(ws.store, sess.id, stop.message)
            raise stop
        if not checked:     # after the first run, the check after each run covers the next
            _check_unchanged(ws, sha)
            checked = True
        try:
            out = job.measurer.measure(sha, job.slot)
        except KlbisectError:
            # a full disk mid-build: the pinned wheels it replaced are kept for `reset` (a reviewer's)
            with contextlib.suppress(Exception):
                keep_env(ws, sess.id, job.builder)
            raise
        keep_env(ws, sess.id, job.builder)
        try:
            _check_unchanged(ws, sha, measured=True)
        except KlbisectError:
            ws.store.put(built_key, "")     # whatever was built, it may not be this commit's
            raise
        if out.build is not None and out.build.ok and build_key:
            ws.store.put(built_key, sha)
        run = record(ws, sess.id, probe.key, build_key, out, ws.top)
        if run is not None:
            near = ws.store.runs(probe.key, [sess.good, sess.bad, sha])
            usual = usual_labels(near) if ws.metric is None else frozenset()
            progress(f"klbisect: {sha[:12]} run {len(cr.values) + cr.crashes + 1}: "
                     f"{run_shown(run, usual, ws.metric, typical_values(near, usual), ws.worse)[0]}")
    return v, cr


def _check_unchanged(ws: Workspace, sha: str, measured: bool = False) -> None:
    """Under git bisect the probe runs in the user's checkout: an edited
    tracked file (by hand, or by a probe or build that writes into the
    tree), or another commit checked out while it ran, would be measured
    and its runs stored as HEAD's, which later sessions reuse. Checked
    before every run and, ``measured``, after it, before it is recorded;
    152 makes git abort."""
    now = gitrepo.head_sha(ws.top)
    if now != sha:
        lost = ("its last run measured whichever code was checked out and is not recorded" if measured
                else "nothing more was measured")
        raise KlbisectError(f"HEAD moved from {sha[:12]} to {now[:12]} while `klbisect probe` judged it: {lost}; "
                            f"`git checkout {sha[:12]}` (or `git bisect reset` and start again), then "
                            "`git bisect run klbisect probe` again", EXIT_REPO_STATE)
    dirty = gitrepo.dirty_files(ws.repo, submodules=False)
    if dirty:
        shown = gitrepo.describe_dirty(ws.repo, dirty)
        raise KlbisectError(f"the working tree has uncommitted changes to {shown}: a run here would measure them, "
                            f"not HEAD {sha[:12]}; if the probe or build writes into tracked files, make it write "
                            "elsewhere; `git stash` (or `git checkout -- .`), then `git bisect run klbisect probe` "
                            "again", EXIT_REPO_STATE)


def _check_environment(ws: Workspace, sess: SessionRow, cfg: BisectConfig, probe, builder, sha: str,
                       progress: Progress) -> None:
    """Two commits in a row skipped on crashes alone: an untestable
    stretch, or the environment broke (a lost GPU, a deleted test) and git
    would skip every commit it tries next, for days. One run of the good
    endpoint, in a worktree so git's checkout stays put, tells them apart;
    a crash there aborts git bisect (154) before it skips more."""
    earlier = [(s, v) for s, v in ws.store.verdicts(sess.id).items() if s != sha]
    if not earlier:
        return
    prev, pv = earlier[-1]
    if pv["verdict"] != SKIP or pv.get("values") or str(pv.get("reason", "")).startswith("build failed"):
        return
    progress(f"klbisect: {prev[:12]} and {sha[:12]} both crashed on every run: running the good endpoint "
             f"{sess.good[:12]} once to check the environment")
    meter = WorktreeMeter(ws, sess.id, probe, builder, progress)
    try:
        run = meter.measure(sess.good)[1]
    finally:
        meter.close()
        if meter.build_key:
            ws.store.put(f"last_build:{meter.build_key}:{ws.top}", "")   # the install is the good endpoint's now
    if run is None or run.value is None or run.status == STATUS_TIMEOUT:
        raise KlbisectError(
            f"the environment broke mid-bisect: {prev[:12]} and {sha[:12]} crashed on every run, and so did the "
            f"good endpoint {sess.good[:12]}, which printed values before"
            + (f" (log: {run.log_path})" if run is not None else " (its build failed)")
            + f"; fix it, then `git bisect run klbisect probe` again: finished runs are kept, and git keeps "
            f"{prev[:12]} skipped (`git bisect log` shows it)", EXIT_NO_SIGNAL)
    progress(f"klbisect: the good endpoint printed {fmt_value(run.value)}: the environment works, "
             f"{sha[:12]} is untestable")


def _reuse_unchecked(ws: Workspace, sid: int, probe_key: str, sha: str, model) -> bool:
    """A verdict that leans on runs earlier sessions recorded at HEAD waits
    for runs of this session that agree with them (``own_runs_wanted``):
    git bisect trusts each verdict for good, so it is checked at every
    commit, not only beside the answer as ``run`` does."""
    runs = ws.store.runs(probe_key, [sha])
    want = own_runs_wanted(model, sha, runs, sid, "the commit git bisect checked out",
                           "`klbisect reset`, then `klbisect start --fresh` with the same options leaves them out")
    return sum(r.session_id == sid for r in runs) < want


def _max_runs_left_out(cfg: BisectConfig) -> str:
    return (f" (without --max-runs {cfg.max_runs}: the run spreads its runs over the commits as the evidence "
            "needs, where a low cap holds each commit short of it)" if cfg.max_runs else "")


def _gitbisect_budget(ws: Workspace, sess: SessionRow, cfg: BisectConfig, sha: str) -> KlbisectError | None:
    """Why `probe` stops git bisect (exit 157, so git aborts) before another
    run: commits left undecided at --max-runs, or --max-total-runs spent.
    Where good and bad overlap that much, git would spend --max-runs on
    every commit it tries next and skip them, a block of hundreds for tens
    of thousands of runs (scripts/gitbisect_sessions.py); the same runs,
    weighed together by `klbisect run`, go much further."""
    undecided = [s for s, v in ws.store.verdicts(sess.id).items()
                 if s != sha and is_undecided_skip(v["verdict"], str(v.get("reason", "")))]
    total = len(ws.store.session_runs(sess.id))
    advice = (f"`klbisect reset`, then `{cfg.run_command(sess.good[:12], sess.bad[:12], max_runs=False)}` reuses "
              f"these {total} runs and weighs them all together" + _max_runs_left_out(cfg))
    if len(undecided) >= UNDECIDED_LIMIT:
        return KlbisectError(f"{len(undecided)} commits stayed undecided after their --max-runs runs: a verdict per "
                             "commit is out of reach here (good and bad runs overlap, or --max-runs is too low), "
                             f"and git would spend as many on each commit it tries next; {advice}", EXIT_NOT_SURE)
    if total >= cfg.max_total_runs:
        return KlbisectError(f"this git bisect has spent {total} probe runs (--max-total-runs "
                             f"{cfg.max_total_runs}); {advice}", EXIT_NOT_SURE)
    return None


def _refined_model(ws: Workspace, sess: SessionRow, cfg: BisectConfig, probe_key: str, build_key):
    """The endpoint model, sharpened by the runs of commits already judged."""
    model = Model.from_dict(sess.model)
    if isinstance(model, ThresholdModel):
        return model
    verdicts = ws.store.verdicts(sess.id)
    goods = [s for s, v in verdicts.items() if v["verdict"] == GOOD] + [sess.good]
    bads = [s for s, v in verdicts.items() if v["verdict"] == BAD] + [sess.bad]
    runs = commit_runs(ws, probe_key, build_key, list(dict.fromkeys(goods + bads)), cfg.timeout)
    g = [x for s in goods for x in runs[s].values]
    b = [x for s in bads for x in runs[s].values]
    if not (g and b):
        return model
    return verdict_model(g, b)


def gitbisect_result(ws: Workspace, sess: SessionRow, analysis=None) -> Result | None:
    """The answer of a `git bisect run` session: git's first bad commit, or
    its block of skipped commits, with the confidence from all runs."""
    cfg, cands, runs, pl, probe_key, build_key = analysis or current_analysis(ws, sess)
    if pl is None:
        return None
    refs = session_refs(ws, sess)
    shas = [c[0] for c in cands]
    at = {s: i for i, s in enumerate(shas)}
    verdicts = ws.store.verdicts(sess.id)

    def marked(kind: str) -> set[int]:
        """klbisect's verdicts of this kind, and git's own refs: a commit marked by
        hand (`git bisect skip`, or a wrapper script's exit 125) has no verdict here."""
        return {at[s] for s, v in verdicts.items() if v["verdict"] == kind and s in at} | \
            {at[s] for s in refs[kind] if s in at}

    first_bad = at[refs["bad"][0]] if refs["bad"] and refs["bad"][0] in at else \
        min({at[s] for s, v in verdicts.items() if v["verdict"] == BAD and s in at} | {len(shas) - 1})
    last_good = max(i for i in marked(GOOD) | {0} if i < first_bad)
    between = list(range(last_good + 1, first_bad + 1))
    skipped = marked(SKIP)
    complete = all(i in skipped for i in between[:-1])
    if not complete:
        # git is still narrowing: what is left is a range, not an answer (status
        # shows the most likely commits so far from the posterior)
        return None
    mass = float(pl.posterior.p_first_bad[between].sum())
    from .search import Block  # noqa: PLC0415
    pl.done = Block(between, mass)
    if mass >= cfg.confidence:
        return build_result(ws, sess.id, cands, pl, True, "git bisect finished", probe_key, build_key, refs)
    # git trusts each verdict; when good and bad overlap, a verdict at 500:1 from a
    # model fitted to the endpoints' runs is wrong more often than that, and one
    # wrong verdict moves git's answer. All the runs together say how sure it is.
    best = pl.posterior.top()
    if best.mass >= cfg.confidence and best.indices != between:
        # a `klbisect run` (the one advised below, perhaps) has settled it since
        instead = (f"; all the runs put {best.mass:.1%} on {shas[best.last][:12]} "
                   f"({fmt_subject(cands[best.last][1], 50)}) instead: `klbisect report` shows that answer, "
                   "`klbisect reset` ends git bisect")
    else:
        instead = (f"; `{cfg.run_command(sess.good[:12], sess.bad[:12], max_runs=False)}` reuses these runs and "
                   "measures until sure" + _max_runs_left_out(cfg)
                   + _stale_dissent(ws, sess.id, probe_key, shas, between, pl.model))
    # git's answer past skipped commits is the block ("could be any of"), and so is the mass
    named = (shas[between[-1]][:12] if len(between) == 1 else
             f"the {len(between)} commits {shas[between[0]][:12]}..{shas[between[-1]][:12]}")
    said = f"its answer {named}" if len(between) == 1 else f"its answer, {named}"
    if best.indices != between and best.mass > mass and (mass < 0.5 or best.mass >= cfg.confidence):
        # "most likely (NOT sure)" must name the most likely: after one wrong verdict (a
        # hand-typed `git bisect bad`, say) git's answer may hold next to nothing
        pl.done = best
        if best.mass < cfg.confidence:
            instead = f"; the most likely is {shas[best.last][:12]} at {best.mass:.1%}" + instead
    if pl.done is best and best.mass >= cfg.confidence:
        # the confidence shown is the runs' answer's, above --confidence: "0.9956 (NOT reached: git
        # bisect finished ..." read as a contradiction (a tester's); which verdict git was given
        # against the runs, the commit table says
        return build_result(ws, sess.id, cands, pl, False,
                            f"{GIT_ANSWER_DOUBTED} {named}, "
                            f"on which all the runs put only {mass:.1%}: a verdict git was given may be wrong "
                            "(status's commit table marks one given by hand against the runs)" + instead,
                            probe_key, build_key, refs)
    return build_result(ws, sess.id, cands, pl, False,
                        f"git bisect finished, but all the runs put only {mass:.1%} on {said} (below "
                        f"--confidence {cfg.confidence:g}): a verdict may be wrong" + instead,
                        probe_key, build_key, refs)


def _stale_dissent(ws: Workspace, sid: int, probe_key: str, shas: list[str], between: list[int], model) -> str:
    """Why all the runs doubt git's answer, when it is runs only earlier
    sessions recorded, at a commit git never checked out here: after a new
    driver or machine those are what is wrong, not a verdict."""
    by: dict[str, list] = {}
    for r in ws.store.runs(probe_key, shas):
        if r.value is not None:
            by.setdefault(r.sha, []).append(r)
    for i, sha in enumerate(shas[1:-1], 1):        # the endpoints are known, whoever measured them
        runs = by.get(sha, [])
        if not runs or any(r.session_id == sid for r in runs) or between[0] <= i <= between[-1]:
            continue
        lr = model.commit_log_lr([r.value for r in runs])
        if (lr <= -math.log(STALE_RUN_LR) and i > between[-1]) or (lr >= math.log(STALE_RUN_LR) and i < between[0]):
            return (f"; the runs against it include {len(runs)} that earlier sessions recorded at {sha[:12]}, "
                    f"which read {'good' if lr < 0 else 'bad'} and which git never checked out here: if the "
                    "environment changed since, `klbisect reset`, then `klbisect start --fresh`")
    return ""
