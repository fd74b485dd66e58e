"""``klbisect run``: the self-driving search. ``run_bisect`` calibrates the
endpoints, then probes the commits the search asks for in worktrees under
the git dir (the user's checkout is left alone), as many at once as there
are slots. Every finished run is in sqlite the moment it finishes, so the
same command resumes an interrupted one."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Callable

from . import repo as gitrepo
from .buildenv import (close_builder, hold_env, keep_env, pins_moved, slots_for, warn_build_paths,
                       warn_probe_python)
from .config import RERUN_KEYS, BisectConfig, make_builder, make_probe, question_of
from .decide import OVERLAP_P, VERDICT_LR, Model, ThresholdModel
from .endpoints import calibrate_endpoints, disk_full, infrastructure_error, never_built, unbuilt_sglang_hint
from .errors import EXIT_NO_SIGNAL, Interrupted, KlbisectError, NoDifference, OutOfRuns
from .executors import Executor, Failure, LocalExecutor, make_slots
from .labels import CLEARER_LOOK, clearer_label, label_hint
from .measure import Measurer
from .metric import fmt_count, fmt_seconds, fmt_summary
from .probe import Slot
from .proc import log_tail
from .result import Result, capped_note, finish_result
from .runs import STATUS_FAILED, STATUS_TIMEOUT, cut_short, run_shown, typical_values, usual_labels
from .search import CommitRuns, plan
from .store import SessionRow, Store
from .workspace import (Progress, Workspace, all_commits_key, commit_runs, note_stop, own_runs_wanted, record,
                        fresh_open_key, say_building, say_reused, side_done_key, since, stop_key, to_stderr)


CANARY_STREAK = 6     # runs crashed in a row ...
CANARY_COMMITS = 3    # ... at this many commits: check the environment on the good endpoint

# how a session gets its executor (tests pass their own: a pool that fails on purpose)
ExecutorFactory = Callable[[BisectConfig, list[Slot], Measurer, Workspace], Executor]


def run_bisect(path: str | Path | None, cfg: BisectConfig, progress: Progress = to_stderr,
               executor_factory: ExecutorFactory | None = None, check_reused: bool = True) -> Result:
    """Find the first bad commit between cfg.good and cfg.bad without touching
    the user's checkout. Resumes an interrupted run of the same question.
    ``check_reused``: measure again the reused commits an answer leans on
    (``reused_boundary``); the nightly job judges its environment itself."""
    cfg.validate()
    if not cfg.first_parent:
        return _through_merges(path, cfg, progress, executor_factory, check_reused)
    ws = Workspace(path, cfg.metric, cfg.worse)
    try:
        # refused before the state directory is made: a typo leaves nothing behind
        good, bad = gitrepo.check_range(ws.repo, cfg.good, cfg.bad)
        with ws.locked():
            return _run_locked(ws, cfg, good, bad, progress, executor_factory, check_reused)
    finally:
        ws.close()


SIDE_ENDPOINT_RUNS = 12   # a side branch's endpoint runs, when the first-parent line's regression separated


def _through_merges(path: str | Path | None, cfg: BisectConfig, progress: Progress,
                    executor_factory: ExecutorFactory | None, check_reused: bool) -> Result:
    """--all-commits: the first-parent search, then down each merge it names
    into the side branch that merge brought in (its second parent's
    first-parent line, from where it forked), until the answer is no merge,
    or a merge whose side branch reads like where it forked (the merge
    itself did it). Each line is in order, so every commit after the
    culprit on it contains the culprit, as the search assumes; one
    topological order of all commits put a branch forked before the culprit
    after it, and a tester's long-lived branch was named at 0.99. A side
    branch that cannot be searched (an octopus merge, a fork where the probe
    fails) leaves the merge named, not sure. The answer is kept with the
    session it rests on (``all_commits_key``), for `status` and `report`."""
    repo = gitrepo.open_repo(path)
    path = repo.working_tree_dir     # GIT_DIR and GIT_WORK_TREE are read once, by the line above
    ws = Workspace(path)
    try:
        return _down_merges(ws, repo, path, cfg, progress, executor_factory, check_reused)
    finally:
        ws.close()


def _down_merges(ws: Workspace, repo, path, cfg: BisectConfig, progress: Progress,
                 executor_factory: ExecutorFactory | None, check_reused: bool) -> Result:
    after = ws.store.last_run_id()      # the runs of this command's stages come after it

    def stage_cfg(good: str, bad: str, side_of: int = 0, model: dict | None = None,
                  prior_runs: int = 0) -> BisectConfig:
        side = {}
        if side_of and model and model.get("kind") != "threshold" and Model.from_dict(model).separates:
            # the same regression, if the side branch holds it, separates its ends as it did the
            # line's: measuring them to --max-endpoint-runs only to call them alike took 80 runs
            side = {"max_endpoint_runs": min(cfg.max_endpoint_runs, max(SIDE_ENDPOINT_RUNS, cfg.endpoint_runs))}
        return dataclasses.replace(cfg, good=good, bad=bad, first_parent=True, side_of=side_of,
                                   command_after_run=after, prior_runs=prior_runs, **side)

    stages: list[dict] = []   # every stage's range and answer, for --json and status

    def stage(scfg: BisectConfig) -> Result:
        got = run_bisect(path, scfg, progress, executor_factory, check_reused)
        stages.append({"good": got.good, "bad": got.bad, "n_commits": got.n_commits, "session": got.session,
                       "culprit": got.culprit, "complete": got.complete, "probe_runs": got.probe_runs})
        return got

    def merge_stands(merge: Result, why: str, sure: bool, spent: int, scfg: BisectConfig | None = None,
                     resumable: bool = False) -> Result:
        """The merge as the answer; ``resumable``: its side branch's search
        stopped on --max-total-runs, and a rerun with more goes on with it."""
        notes = [n for n in merge.notes if "--all-commits" not in n and "any of them may be the cause" not in n]
        side_runs = 0
        if scfg is not None:
            # the side branch's own search, stopped short, is the latest session: `status` and
            # `report` show the merge's, which holds the answer
            st = ws.store
            # (a side stage's ends are full shas already: the fork and the merge's parent)
            side = st.find_session("run", scfg.good, scfg.bad, make_probe(scfg).key, scfg.question(), RERUN_KEYS)
            if side is not None and side.id != merge.session:
                side_runs = len(st.session_runs(side.id))
                with contextlib.suppress(KlbisectError), ws.locked():
                    note_stop(st, side.id, f"searched by `run --all-commits` as the side branch of the merge "
                                           f"{merge.culprit[:12]}: {why}")
                    st.put(side_done_key(side.id), str(merge.session))
                    if not resumable:
                        # its job is done: not an unfinished session for `status` to list (a rerun makes
                        # a new one, which answers from the runs this one kept; under --fresh, from none)
                        st.update_session(side.id, state="ended", ended=time.time())
        return dataclasses.replace(merge, notes=notes + [f"--all-commits: {why}"], complete=merge.complete and sure,
                                   reason=merge.reason if sure else f"--all-commits: {why}",
                                   probe_runs=spent + side_runs, stages=stages)

    res = stage(stage_cfg(cfg.good, cfg.bad))
    outer_good = res.good
    runs, merges, stood = res.probe_runs, [], False   # stood: the answer is a merge whose side branch was not it
    while res.complete and res.culprit and gitrepo.side_commits(repo, res.culprit, res.good):
        merge, parents = res, gitrepo.parents(repo, res.culprit)
        first, side = parents[0], parents[-1]
        try:
            forks = [gitrepo.merge_base(repo, first, p) for p in parents[1:]]
        except KlbisectError:
            res, stood = merge_stands(merge, f"{merge.culprit[:12]} merges a history that shares none with its "
                                             "first parent's line (an imported project?): this search does not go "
                                             "into it", sure=False, spent=runs), True
            break
        if len(parents) > 2:
            each = ", ".join(f"--good {f[:12]} --bad {p[:12]}" for f, p in zip(forks, parents[1:]))
            res, stood = merge_stands(merge, f"{merge.culprit[:12]} merges {len(parents) - 1} branches into its "
                                             "first parent's line, which this search does not go down: run each "
                                             f"branch on its own ({each})", sure=False, spent=runs), True
            break
        fork, where = forks[0], "where it forked"
        if gitrepo.is_ancestor(repo, fork, outer_good) and gitrepo.is_ancestor(repo, outer_good, side) \
                and outer_good not in (side, fork):
            # --good on the side branch: the commits before it are good by the user's word
            fork, where = outer_good, "--good"
        scfg = stage_cfg(fork, side, side_of=merge.session, model=merge.model, prior_runs=runs)
        if cfg.runs_left(runs) <= 0:
            res, stood = merge_stands(merge, f"--max-total-runs {cfg.max_total_runs} was spent before its side "
                                             f"branch ({fork[:12]}..{side[:12]}) was searched: the same command with "
                                             "a higher --max-total-runs goes on from here", sure=False, spent=runs,
                                      scfg=scfg, resumable=True), True
            break
        progress(f"--all-commits: {merge.culprit[:12]} is a merge; searching the side branch it brings in, "
                 f"from {fork[:12]} ({where}) to its head {side[:12]}")
        if cfg.fresh:
            with ws.locked():
                ws.store.put(fresh_open_key(merge.session), "1")
        try:
            res = stage(scfg)
        except NoDifference as e:
            if e.alike:
                progress(f"--all-commits: the side branch's head reads like where it forked: the merge "
                         f"{merge.culprit[:12]} itself is the first bad commit")
                res = merge_stands(merge, f"the side branch this merge brings in ({fork[:12]}..{side[:12]}) "
                                          "reads like where it forked, so the merge itself (how it combined the "
                                          f"two lines) is the first bad commit ({e.message})", sure=True,
                                   spent=runs, scfg=scfg)
            else:
                res = merge_stands(merge, f"its side branch ({fork[:12]}..{side[:12]}) could not be searched: "
                                          f"{e.message}", sure=False, spent=runs, scfg=scfg)
            stood = True
            break
        except KlbisectError as e:
            if isinstance(e, Interrupted) or (e.endpoint is None and not isinstance(e, OutOfRuns)):
                raise      # a busy lock, a full disk, a broken environment: nothing about the branch
            res, stood = merge_stands(merge, f"its side branch ({fork[:12]}..{side[:12]}) could not be searched: "
                                             f"{e.message}", sure=False, spent=runs, scfg=scfg,
                                      resumable=isinstance(e, OutOfRuns)), True
            break
        merges.append(merge)
        runs += res.probe_runs
    if merges:
        outer, inner = merges[0], merges[1:]
        pr = res.pr or outer.pr
        # the earlier stages' runs at this stage's commits (its ends on the line) are this
        # command's, counted in probe_runs already, not "reused from other sessions" (a tester's)
        # (the stages before it only: a side stage after a merge that stands ran after its count)
        order = [s["session"] for s in stages]
        mine = set(order[:order.index(res.session)] if res.session in order else order)
        shas = [c[0] for c in ws.store.candidates(res.session)]
        ours = sum(r.session_id in mine for r in ws.store.runs(make_probe(cfg).key, shas))
        res = dataclasses.replace(
            res, pr=pr, probe_runs=res.probe_runs if stood else runs, stages=stages,
            reused_runs=max(res.reused_runs - ours, 0),
            candidate_info=[{**c, "pr": c.get("pr") or (pr if c.get("sha") == res.culprit else None)}
                            for c in res.candidate_info],
            notes=[f"--all-commits: found through the merge {outer.culprit[:12]}"
                   f"{f' (PR #{outer.pr})' if outer.pr else ''} on the first-parent line from "
                   f"{outer.good[:12]} to {outer.bad[:12]}, then down its side branch"
                   + "".join(f" and the merge {m.culprit[:12]} in it" for m in inner)
                   + "; runs counts every stage"] + res.notes)
    if merges or stood:
        with contextlib.suppress(KlbisectError), ws.locked():
            ws.store.put(all_commits_key(res.session), json.dumps(res.to_json()))
            # (an answer short of sure, the cap's say, is gone on with by the same command: a
            # reviewer's --fresh rerun after the cap measured every stage again)
            for s in stages if res.complete else ():
                if ws.store.get(fresh_open_key(s["session"])):
                    ws.store.put(fresh_open_key(s["session"]), "")
    return res


def chain_sessions(st: Store, sid: int) -> set[int]:
    """The sessions one `run --all-commits` made of ``sid``'s, it included:
    the first-parent search and the side-branch searches under it. Runs one
    of them made are no news to another (a finished stage was reopened on
    every rerun for "runs since", and its runs rechecked as another
    command's)."""
    links = {int(k.rsplit(":", 1)[1]): int(v) for k in st.keys("side_of:") if (v := st.get(k))}
    group, grew = {sid}, True
    while grew:
        grew = False
        for child, parent in links.items():
            if (child in group) != (parent in group):
                group |= {child, parent}
                grew = True
    return group


def _fresh_origin(st: Store, good: str, bad: str, probe_key: str, cfg: BisectConfig) -> SessionRow | None:
    """The --fresh git bisect of this range and question that is the latest
    session here (active, or just reset), whose runs a `run --fresh` counts:
    status and probe send the user of a doubted or stalled answer to that
    command, and its runs are of the new environment too."""
    last = st.latest_session(("run", "gitbisect", "calibrate", "nightly"))
    if (last is not None and last.kind == "gitbisect" and last.config.get("fresh")
            and (last.good, last.bad, last.probe_key) == (good, bad, probe_key)
            and question_of(last.config) == cfg.question()):
        return st.session(last.config["fresh_from"]) if last.config.get("fresh_from") else last
    return None


def _run_locked(ws: Workspace, cfg: BisectConfig, good: str, bad: str, progress: Progress,
                executor_factory: ExecutorFactory | None, check_reused: bool = True) -> Result:
    first_build = ws.store.last_build_id()     # the builds after it are this command's
    cands = [(c.sha, c.subject, c.pr) for c in gitrepo.candidates(ws.repo, good, bad, cfg.first_parent)]
    shas = [c[0] for c in cands]
    probe, builder = make_probe(cfg), make_builder(cfg)
    probe_key, build_key = probe.key, (builder.key if builder else None)
    dirty = gitrepo.dirty_files(ws.repo)
    if dirty:
        # a probe edited in place and never committed: its edit is in no worktree
        progress(f"note: uncommitted changes to {gitrepo.describe_dirty(ws.repo, dirty)} are in "
                 "no run: klbisect measures the commits themselves, in worktrees (commit them, or copy a probe "
                 "you changed outside the repository)")
    # Ray assigns GPUs on its nodes: this machine's GPUs matter only locally. Too few is refused
    # before a session is recorded (a tester's every later run "resuming session 1: 0 runs")
    moved = pins_moved(ws.repo, cfg, builder, good, bad)
    slots = make_slots(ws.worktrees, slots_for(cfg, moved, progress),
                       cfg.gpus_per_probe if cfg.executor == "local" else 0, pid_dir=ws.pids)
    if cfg.executor == "ray" and executor_factory is None:
        from .ray_executor import RayExecutor  # noqa: PLC0415 - imports no Ray
        RayExecutor.refuse_before_session(cfg)
    opened = _open_session(ws, cfg, good, bad, cands, probe_key, build_key, progress)
    if isinstance(opened, Result):
        return opened
    sid = opened
    progress(f"{fmt_count(len(shas) - 1, 'candidate commit')} between {_named(cfg.good, good)} and "
             f"{_named(cfg.bad, bad)}; probe: {probe.describe()}")

    log_dir = ws.logs / f"s{sid}"
    hold_env(ws, sid, builder, log_dir)
    warn_build_paths(ws.repo, builder, good, bad, progress)
    if not cfg.side_of:      # an --all-commits command's first stage has said it
        warn_probe_python(cfg, builder, progress)
    measurer = Measurer(ws.repo, probe, builder, log_dir, use_worktree=True,
                        on_build=say_building(progress, probe))
    ex = (executor_factory(cfg, slots, measurer, ws) if executor_factory
          else default_executor(cfg, slots, measurer, ws, take_turns=bool(moved)))
    search = _Search(ws, cfg, sid, cands, probe_key, build_key, builder, ex, slots, progress)
    st = ws.store
    try:
        resumed = st.session(sid)     # a new session has no model yet
        if resumed.model and resumed.state == "bisecting":
            model = Model.from_dict(resumed.model)
        else:
            model = calibrate_endpoints(ws, cfg, sid, good, bad, search.execute, probe_key, build_key, progress,
                                        width=ex.slots)
            st.update_session(sid, model=model.to_dict(), state="bisecting")
        return search.search(model, first_build, check_reused)
    except KeyboardInterrupt as e:
        ex.close()
        note_stop(st, sid, "interrupted; rerun the same command to resume")
        if isinstance(e, Interrupted):
            raise
        # a session that reuses earlier runs (a resumed nightly's, another command's) resumes from all of them
        kept = len(st.session_runs(sid)) if cfg.fresh else len(st.runs(probe_key, shas))
        # the resume counts the session's own: a tester read 15 saved against "6 already recorded"
        own = len(st.session_runs(sid))
        raise Interrupted(f"interrupted: {fmt_count(kept, 'finished run')} of this range saved"
                          + (f" ({own} of this session's)" if own != kept else "")
                          + "; rerun the same command to resume") from None
    except KlbisectError as e:
        note_stop(st, sid, e.message)
        raise
    finally:
        close_session(ws, ex, probe, builder, slots, progress, sid)


def _named(given: str, sha: str) -> str:
    """A revision as the user gave it (a tag, a branch) with its commit."""
    return sha[:12] if sha.startswith(given.lower()) else f"{given} ({sha[:12]})"


def close_session(ws: Workspace, ex: Executor, probe, builder, slots: list[Slot], progress: Progress,
                  sid: int) -> None:
    """A session's end, however it ends: its executor, its probe (a server it
    keeps), its worktrees, then the interpreter --build sglang changed put
    back, even when a second Ctrl-C stops the worktrees' removal."""
    try:
        ex.close()
        close = getattr(probe, "close", None)
        if close:
            close()
        # a killed run of more slots left more of the pool behind (each may hold a build)
        stale = sorted(ws.worktrees.glob("slot-*")) if ws.worktrees.exists() else []
        for checkout in dict.fromkeys([s.checkout for s in slots] + list(getattr(ex, "checkouts", list)()) + stale):
            if checkout.exists():
                gitrepo.worktree_remove(ws.repo, checkout)
    finally:
        close_builder(builder, progress, ws, sid)


class _Search:
    """One command's search over a session's commits: each run recorded and
    said as it lands, the search asked where to probe next until it answers
    or cannot, and the checks that stop it early: a commit whose probe the
    infrastructure failed three times, and runs crashing commit after
    commit (the canary)."""

    def __init__(self, ws: Workspace, cfg: BisectConfig, sid: int, cands: list, probe_key: str,
                 build_key: str | None, builder, ex: Executor, slots: list[Slot], progress: Progress):
        self.ws, self.cfg, self.sid, self.cands = ws, cfg, sid, cands
        self.shas = [c[0] for c in cands]
        self.probe_key, self.build_key, self.builder = probe_key, build_key, builder
        self.ex, self.progress = ex, progress
        self.slot_by_index = {s.index: s for s in slots}
        self.failures: dict[str, int] = {}
        self.streak: list[str] = []    # the commits of the runs that crashed in a row, latest last
        self.label_sets: dict[frozenset, list[int]] = {}   # the label sets runs printed: usual_labels, as they come
        self.searching = False   # set once the endpoints are calibrated

    def handle(self, results) -> None:
        # a disk-full failure: raised once the rest of the batch is recorded, before any other
        # error the batch raises (a reviewer's)
        full = next((infrastructure_error(r) for r in results if isinstance(r, Failure) and disk_full(r)), None)
        try:
            self._record_all(results, full)
        except Exception as e:
            if full is None:
                raise
            raise full from e
        if full is not None:
            # a build that installed pinned wheels, then met the full disk: what they replaced is kept
            # for the restore (best effort: the store shares the disk)
            with contextlib.suppress(Exception):
                keep_env(self.ws, self.sid, self.builder)
            raise full

    def _record_all(self, results, full: KlbisectError | None) -> None:
        ws, shas, progress = self.ws, self.shas, self.progress
        for r in results:
            if full is not None and not isinstance(r, Failure) and (
                    r.build_failed or (r.run is not None and not r.run.values)):
                continue    # beside a full disk, most likely on it too: not the commit's failure
            if isinstance(r, Failure):
                progress(f"infrastructure failure on {r.sha[:12]} (slot {r.slot}): {r.error}")
                if disk_full(r):
                    continue    # raised by handle once the batch is recorded
                self.failures[r.sha] = self.failures.get(r.sha, 0) + 1
                if self.failures[r.sha] >= 3 and r.outcome is not None:
                    # killed by a signal at this commit every time: its own doing (the OOM
                    # killer, a `timeout -s KILL` wrapper), so a crash of the commit, not a
                    # reason to stop the search for good
                    progress(f"  {r.sha[:12]}: killed {self.failures[r.sha]} times: counted as this commit's crash")
                    r = r.outcome
                else:
                    if self.failures[r.sha] >= 3:
                        raise infrastructure_error(r)
                    continue
            run = record(ws, self.sid, self.probe_key, self.build_key, r, Path(r.checkout) if r.checkout
                         else self.slot_by_index[r.slot].checkout if r.slot in self.slot_by_index else Path("?"))
            if r.build is not None:
                keep_env(ws, self.sid, self.builder)   # the pinned wheels this build changed, for a restore after a kill
            i = shas.index(r.sha)
            if r.build_failed:
                progress(f"[{i}/{len(shas) - 1}] {r.sha[:12]} build failed: untestable ({r.build.log_path})")
                # builds failing commit after commit look like crashes: a broken environment
                # (the canary rebuilds the good endpoint, and one that no longer builds stops it)
                self.streak.append(r.sha)
                err = never_built(ws, self.build_key, r.build.log_path)
                if err:
                    raise err
                if self.searching and i in (0, len(shas) - 1):
                    # its runs are from before; the search would ask it again and again (a
                    # tester's resumed nightly rebuilt one 3,000 times with a broken PATH)
                    which = "good" if i == 0 else "bad"
                    raise KlbisectError(f"the {which} endpoint {r.sha[:12]} does not build now, though its runs "
                                        "were measured before: the build command or the environment changed "
                                        f"since; fix it and rerun the same command (runs so far are kept); log: "
                                        f"{r.build.log_path}", EXIT_NO_SIGNAL,
                                        detail=log_tail(r.build.log_path or ""))
            elif run is not None:
                usual = usual_labels([run], self.label_sets)
                # only a run its own assertion stopped short is judged by the others' typical values
                short = ws.metric is None and run.status == STATUS_FAILED and frozenset(run.values) < usual
                typical = (typical_values(ws.store.runs(self.probe_key, [shas[0], shas[-1], run.sha]), usual)
                           if short else None)
                shown, crashed = run_shown(run, usual, ws.metric, typical, ws.worse)
                progress(f"[{i}/{len(shas) - 1}] {r.sha[:12]} run: {shown}  ({run.duration:.1f}s)")
                self.streak[:] = self.streak + [r.sha] if crashed else []

    def execute(self, batch: list[str], stop=None) -> None:
        """Run one measurement for each sha in batch, as slots allow; when
        ``stop()`` turns true, submit no more (runs in flight finish)."""
        ex = self.ex
        todo = list(batch)
        warm = getattr(ex, "warm", None)
        while todo or ex.in_flight():
            while todo and ex.free():
                # a free slot that has a queued commit built takes it first: with more
                # slots than commits, a slot would otherwise rebuild whichever came next.
                # It looks no further ahead than one round of slots, so a fast side
                # cannot run ahead of the other (the early stops compare both sides).
                j = next((k for k, s in enumerate(todo[:ex.slots]) if warm(s)), 0) if warm else 0
                ex.submit(todo.pop(j))
            self.handle(ex.wait())
            if stop is not None and todo and stop():
                todo.clear()

    def canary(self, sha: str) -> None:
        """Many crashes in a row across commits: untestable commits, or the
        environment broke (a lost GPU, a full disk) and every run from now on
        will crash. One run of the good endpoint, which printed values, tells
        them apart before the search spends its budget on crashes."""
        n = len(self.streak)
        self.progress(f"the last {n} runs crashed (or builds failed) at "
                      f"{fmt_count(len(set(self.streak)), 'commit')}: running the good endpoint {sha[:12]} once to "
                      "check the environment")
        self.execute([sha])
        last = self.ws.store.runs(self.probe_key, [sha])[-1:]
        if last and (last[0].value is None or last[0].status == STATUS_TIMEOUT):
            raise KlbisectError(
                f"the environment broke mid-search: the last {n} runs crashed, and so did the good endpoint "
                f"{sha[:12]}, which printed values before (see {last[0].log_path}); fix it and rerun the "
                "same command: finished runs are kept and crashed commits get fresh runs", EXIT_NO_SIGNAL)
        self.streak.clear()

    def search(self, model, first_build: int, check_reused: bool) -> Result:
        """Probe where the search asks until it answers (or cannot), from the
        endpoints' ``model``; builds after id ``first_build`` are this
        command's."""
        ws, cfg, sid, cands, shas, ex, progress = (self.ws, self.cfg, self.sid, self.cands, self.shas, self.ex,
                                                   self.progress)
        st, probe_key, build_key = ws.store, self.probe_key, self.build_key
        good, bad = shas[0], shas[-1]
        before = commit_runs(ws, probe_key, build_key, shas, cfg.timeout)
        self.searching = True
        look_at = CLEARER_LOOK      # session runs at which an overlapping search looks at the labels again
        # builds that failed in an earlier command stand until the answer is a block they make:
        # then each is built once more (a resumed run rebuilt every one first, a tester's minutes each)
        rebuilding = False
        told_took_over = False
        while True:
            runs = commit_runs(ws, probe_key, build_key, shas, cfg.timeout,
                               failed_after=first_build if rebuilding else 0)
            commits = [since(runs[s], before[s]) for s in shas]
            pending = [shas.index(s) for s in ex.in_flight()]
            pl = plan(commits, model, cfg.confidence, k=max(ex.free(), 1), max_runs=cfg.max_runs,
                      crash_limit=cfg.crash_limit, pending=pending, max_endpoint_runs=cfg.max_endpoint_runs)
            total = len(st.session_runs(sid))
            if pl.took_over and not told_took_over:
                # a tester's best guess fell from 0.970 to 0.774 after a run that looked bad: the
                # fitted model had an answer, and the rank-based one, less sure, took over
                told_took_over = True
                progress(f"the fitted model's answer waits: {pl.took_over}; until then P(bad) and the best guess "
                         "weigh every run by ranks and read less sure")
            if pl.integrated and total >= look_at:
                # the endpoints' runs grow as the search goes: a label that stands out
                # now is worth a note, once
                inside = [i for i in range(1, len(shas) - 1) if commits[i].values]
                placed = ([shas[i] for i in inside if pl.posterior.p_bad[i] < PLACED_P],
                          [shas[i] for i in inside if pl.posterior.p_bad[i] > 1 - PLACED_P])
                clear = clearer_label(ws, probe_key, good, bad, cfg, None, placed)[1]
                look_at = math.inf if clear else 2 * look_at
                if clear:
                    progress(f"note: {clear}: stop (Ctrl-C) and rerun with it")
            # (a search left to widen its endpoints is out of commits too: a reviewer's old failures
            # waited for both endpoints' --max-endpoint-runs)
            if not rebuilding and not ex.in_flight() and (pl.done or not pl.next or pl.widening) \
                    and cfg.runs_left(total) > 0:
                # (at --max-total-runs the block stands as it is: no room to build and measure)
                old = failed_before(ws, build_key, shas, runs,
                                    pl.done.indices if pl.done else range(1, len(shas) - 1), first_build)
                if old and (not pl.done or len(pl.done.indices) > 1):
                    rebuilding = True
                    progress(f"the answer is held up by {fmt_count(len(old), 'commit')} whose build failed in "
                             f"an earlier command ({', '.join(s[:12] for s in old[:3])}"
                             f"{', ...' if len(old) > 3 else ''}): building {'it' if len(old) == 1 else 'them'} "
                             "once more, as the search needs")
                    continue
            if pl.done and not ex.in_flight() and len(pl.done.indices) > 1 and self.streak \
                    and {shas[i] for i in pl.done.indices[:-1]} <= set(self.streak) \
                    and cfg.runs_left(len(st.session_runs(sid))) > 0:
                # a block of commits that all failed in this command's last runs: untestable, or
                # a machine that broke in a range too small for CANARY_STREAK (a tester's five
                # "untestable: build failed", the good nights' head among them, were posted)
                self.canary(good)
                continue
            if pl.done and not ex.in_flight():
                recheck = (reused_boundary(ws, sid, probe_key, shas, pl.done, pl.model, cfg.timeout,
                                           cfg.command_after_run)
                           if check_reused else [])
                room = max(cfg.runs_left(total), 0)
                if not recheck:
                    break
                if not room:
                    # an answer that leans on earlier sessions' runs unchecked is no answer (a tester's
                    # --max-total-runs 1 measured one side and exited 0, "confidence reached")
                    return finish_result(ws, sid, cands, pl, False,
                                         f"stopped at --max-total-runs {cfg.max_total_runs} before the check of the "
                                         f"earlier sessions' runs the answer leans on ({fmt_count(len(set(recheck)), 'commit')} "
                                         "to measure in this one): a higher --max-total-runs finishes it",
                                         probe_key, build_key, progress)
                for i in dict.fromkeys(recheck[:min(ex.free(), room)]):
                    progress(f"checking {shas[i][:12]} ({i}/{len(shas) - 1}): the answer leans on its runs "
                             "from earlier sessions; measuring it in this one")
                for i in recheck[:min(ex.free(), room)]:
                    ex.submit(shas[i])
                self.handle(ex.wait())
                continue
            if pl.lost is not None and not pl.done and not ex.in_flight():
                sep = pl.lost
                caveats = label_hint(ws, probe_key, good, bad, cfg, weak=True) + unbuilt_sglang_hint(ws, cfg)
                raise NoDifference(
                    f"good and bad no longer differ after {sep.good['n']}+{sep.bad['n']} endpoint runs "
                    f"(p={sep.p_value:.2g}; the search began on a hint at p <= 0.2): good "
                    f"{fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}; there is no regression between "
                    "these endpoints to find, or it is too small to bisect; runs are kept" + caveats,
                    alike=not caveats and sep.p_value > OVERLAP_P)
            why = None if ex.in_flight() else _no_answer(pl, cfg, shas, total)
            if why:
                return finish_result(ws, sid, cands, pl, False, why, probe_key, build_key, progress)
            top = pl.posterior.top()
            room = max(cfg.runs_left(total) - len(ex.in_flight()), 0)
            if pl.next and ex.free() and not pl.done and room:
                for i in pl.next[:min(ex.free(), room)]:
                    progress(f"probing {shas[i][:12]} ({i}/{len(shas) - 1}, P(bad)={pl.posterior.p_bad[i]:.3f}; "
                             f"best guess {shas[top.last][:12]} at {top.mass:.3f})")
                    ex.submit(shas[i])
            self.handle(ex.wait())
            if len(self.streak) >= CANARY_STREAK and len(set(self.streak)) >= CANARY_COMMITS:
                self.canary(good)
        reason = "confidence reached"
        return finish_result(ws, sid, cands, pl, True, reason, probe_key, build_key, progress)


PLACED_P = 0.1      # a commit this sure of its side lends its runs to the label check (at 0.01, a tester's search
# of 400 runs placed none: an overlapping posterior is seldom that sure far from the answer)


def _no_answer(pl, cfg: BisectConfig, shas: list[str], total: int) -> str | None:
    """Why the search ends here without an answer (its runs all in), or None
    while it can go on: out of --max-total-runs, or out of commits whose
    runs could raise the confidence."""
    if pl.done:
        return None
    if cfg.runs_left(total) <= 0:
        return f"stopped at --max-total-runs {cfg.max_total_runs}" + (
            capped_note(pl, shas) or "; the same command with a higher --max-total-runs goes on from here "
                                     "(the runs so far are kept)")
    if pl.next:
        return None
    if pl.unproven is not None:
        return (f"the answer is every commit in the range, and the endpoints still do not differ at "
                f"p <= {1 - cfg.confidence:.2g} after {pl.unproven.good['n']}+{pl.unproven.bad['n']} runs "
                f"(p={pl.unproven.p_value:.2g}): there may be no regression here")
    weak_votes = (isinstance(pl.model, ThresholdModel) and pl.model.fail_bad is not None
                  and pl.model.verdict_log_lrs()[0] < math.log(VERDICT_LR))
    return ("no commit left whose runs could raise the confidence (all exhausted or untestable)"
            + capped_note(pl, shas)
            + ("; at this threshold a majority verdict carries little evidence (the bad endpoint passes "
               "often): leave --threshold and --votes out to judge runs by their values" if weak_votes else ""))


def _open_session(ws: Workspace, cfg: BisectConfig, good: str, bad: str, cands: list, probe_key: str,
                  build_key: str | None, progress: Progress) -> int | Result:
    """The session this command works on: the unfinished one of the same
    question resumed, a finished one reopened when runs since change its
    evidence (or its failed builds may build now), else a new one; or the
    finished one's Result when nothing would change it."""
    st = ws.store
    shas = [c[0] for c in cands]
    reopened = False    # a finished session taken up again
    # --fresh starts a session of its own; a later rerun without it resumes that one, and so
    # does the same command with it while that session is unfinished: "interrupted; rerun
    # the same command" must not leave out the runs it just saved (as `calibrate --fresh`)
    prev = st.find_session("run", good, bad, probe_key, cfg.question(), RERUN_KEYS)
    if prev is not None and cfg.command_after_run is None and st.get(all_commits_key(prev.id)):
        # a plain run answers from this session now: `status` shows its answer, not --all-commits'
        st.put(all_commits_key(prev.id), "")
    if cfg.fresh and prev is not None:
        if prev.config.get("fresh") and prev.state != "done":
            progress(f"--fresh: resuming the unfinished --fresh session {prev.id}, whose runs count "
                     "(`klbisect reset` first to leave them out too)")
        elif prev.config.get("fresh") and cfg.command_after_run is not None and st.get(fresh_open_key(prev.id)):
            progress(f"--fresh: session {prev.id} is a finished stage of the unfinished `run --all-commits "
                     "--fresh` this command goes on with (`klbisect reset` first to start over)")
        else:
            prev = None
    if prev and prev.state == "done" and prev.result:
        done = Result.from_json(prev.result)
        # an answer left as a block by failed builds is worth one more build each:
        # the user who reruns it may have fixed what broke them
        unbuilt = [i["sha"] for i in done.candidate_info if i["why"] == "untestable: build failed"]
        # runs recorded since it finished (a git bisect of the same range, whose answer
        # status doubted and sent the user here) are weighed with its own: those after the
        # last run id when it finished (a reviewer's reopened session, done again with no run
        # of its own, counted the same runs as newer on every rerun), or, for one that finished
        # before that id was kept, after its last run's start
        ours = chain_sessions(st, prev.id)
        last_id = st.finished_at_run(prev)
        finished_at = max(prev.ended or 0.0, st.last_touched(prev))
        newer = sum(1 for r in st.runs(probe_key, shas) if r.session_id not in ours
                    and (r.id > last_id if last_id is not None else r.started > finished_at))
        # (with no room left under --max-total-runs a reopened block could only fall apart unmeasured)
        room = cfg.runs_left(len(st.session_runs(prev.id))) > 0
        if not (build_key and len(done.candidates) > 1 and unbuilt and room) and not newer:
            progress(f"this bisect already finished (session {prev.id}); showing its result")
            return done
        if newer:
            # "finished before 18 runs since recorded" read as a riddle (a tester's)
            progress(f"session {prev.id} answered this before; {fmt_count(newer, 'run')} recorded in this range "
                     "since then (by other sessions) change its evidence: going on from its answer with them")
        else:
            progress(f"session {prev.id} ended on {len(done.candidates)} commits that cannot be told apart; "
                     f"building the {len(unbuilt)} whose build failed once more, as the search needs")
        st.update_session(prev.id, state="bisecting")
        prev = st.session(prev.id)
        reopened = True
    fresh_from = _fresh_origin(st, good, bad, probe_key, cfg) if cfg.fresh else None
    if prev:
        sid = prev.id
        progress(f"{'reopening' if reopened else 'resuming'} session {sid}: "
                 f"{len(st.session_runs(sid))} runs already recorded")
        cfg.fresh = bool(prev.config.get("fresh"))
        fresh_from = prev.config.get("fresh_from")
        st.update_session(sid, config={**cfg.stored(), **({"fresh_from": fresh_from} if fresh_from else {})})
        ws.use_session(st.session(sid))
        if st.get(stop_key(sid)):
            st.put(stop_key(sid), "")
        if st.get(side_done_key(sid)):
            st.put(side_done_key(sid), "")    # going on: `status` shows this session again
    else:
        sid = st.create_session("run", good, bad, probe_key,
                                {**cfg.stored(), **({"fresh_from": fresh_from.id} if fresh_from else {})}, cands)
        ws.use_session(st.session(sid))
        if fresh_from is not None:
            progress(f"--fresh: counting the runs since session {fresh_from.id} (a --fresh git bisect of this "
                     f"range) began: {fmt_count(len(st.session_runs(fresh_from.id)), 'run')} of its own")
        say_reused(ws, probe_key, shas, cfg.timeout, progress)
    if cfg.side_of and cfg.side_of != sid:
        st.put(f"side_of:{sid}", str(cfg.side_of))
    return sid


def default_executor(cfg: BisectConfig, slots: list[Slot], measurer: Measurer, ws: Workspace,
                     take_turns: bool = False) -> Executor:
    if cfg.executor == "ray":
        from .ray_executor import RayExecutor  # noqa: PLC0415 - optional extra
        return RayExecutor.from_config(cfg, ws, measurer, take_turns=take_turns)
    # spare checkouts keep built the few commits a search revisits from whichever slot is free;
    # one slot keeps its one worktree, built incrementally from commit to commit
    return LocalExecutor(slots, measurer.measure, spare_checkouts=len(slots) + 1 if len(slots) > 1 else 0)


def reused_boundary(ws: Workspace, sid: int, probe_key: str, shas: list[str], block, model,
                    timeout: float | None = None, command_after_run: int | None = None) -> list[int]:
    """The commits nearest an answer on each side that earlier sessions
    measured: runs are matched by the probe command alone, so if the
    environment changed since, those runs are what the answer wrongly rests
    on. Each needs STALE_CHECK_RUNS runs of this session before the answer
    stands; runs that contradict the earlier ones stop the search with what
    to do, and so do checks that gave no value at all (a tester's --timeout
    0.001 timed out all four, and the answer stood on the earlier runs
    alone). Sessions that reuse nothing skip this."""
    by_index: dict[int, list] = {}
    # this session's runs per commit, crashed ones too: a crash is no reason to loop (runs cut
    # short by a lower --timeout than this one's are run again: not counted)
    mine: dict[int, list] = {}
    at = {s: i for i, s in enumerate(shas)}
    # --all-commits: the runs its other stages made in this same command are this one's too
    chain = chain_sessions(ws.store, sid) if command_after_run is not None else {sid}

    def own(r) -> bool:
        return r.session_id == sid or (r.session_id in chain and r.id > (command_after_run or 0))
    for r in ws.store.runs(probe_key, shas):
        if own(r) and not cut_short(r, timeout):
            mine.setdefault(at[r.sha], []).append(r)
        if r.value is not None:
            by_index.setdefault(at[r.sha], []).append(r)
    reused = [i for i, runs in by_index.items() if not all(map(own, runs))]
    below = [i for i in reused if i < block.first]
    above = [i for i in reused if i >= block.last]
    need = []
    for i in ([max(below)] if below else []) + ([min(above)] if above else []):
        want = own_runs_wanted(model, shas[i], by_index[i], sid, "near the answer",
                               "rerun with --fresh to leave the earlier runs out")
        tried = mine.get(i, [])
        if want and len(tried) >= want and all(r.value is None or r.status == STATUS_TIMEOUT for r in tried):
            timed_out = all(r.status == STATUS_TIMEOUT for r in tried)
            raise KlbisectError(
                f"{shas[i][:12]}, near the answer, gave no value in the {len(tried)} runs this session made to "
                "check the runs earlier sessions recorded there ("
                + (f"each stopped by --timeout {fmt_seconds(timeout or 0)}): raise --timeout (the runs it cut short "
                   "are then run again)" if timed_out else
                   f"each crashed): see why in {tried[-1].log_path}; once fixed, rerun the same command")
                + "; or rerun with --fresh to leave the earlier runs out", EXIT_NO_SIGNAL)
        need += [i] * max(want - len(tried), 0)
    return need


def failed_before(ws: Workspace, build_key: str | None, shas: list[str], runs: dict[str, CommitRuns],
                  indices, first_build: int) -> list[str]:
    """The commits at ``indices`` untestable on a build that failed before
    this command, whose builds are those after id ``first_build``."""
    if not build_key:
        return []
    return [shas[i] for i in indices if runs[shas[i]].build_failed
            and (ws.store.failed_build(build_key, shas[i]) or {}).get("id", 0) <= first_build]
