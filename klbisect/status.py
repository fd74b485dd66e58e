"""Looking at and ending sessions: ``status`` (every verdict in plain
words), ``log`` (every run) and ``reset`` (ends a session, its git bisect
and worktrees, and puts back what ``--build sglang`` changed)."""
from __future__ import annotations

import json
import shutil
import time
from contextlib import suppress
from pathlib import Path

from . import repo as gitrepo
from .buildenv import env_key, restore_env
from .errors import EXIT_USAGE, KlbisectError
from .gitbisect import bisect_checkout, gitbisect_result, own_bisect
from .result import boundary_evidence, current_analysis, probed_commits, top_stands_out
from .runs import valued_runs
from .workspace import Workspace, answered, note_stop, shown_session, stop_reason


def _shown_session(ws: Workspace, session_id: int | None = None, runs_only: bool = False):
    """The session ``status`` and ``log`` show: the one asked for, else the
    one in progress, else the latest; a usage error when there is none.
    ``runs_only`` (``log``): a calibration that stopped short will do."""
    where = f"in {ws.top}"
    sess = None
    if ws.has_state():
        st = ws.store
        if session_id is not None:
            sess = st.session(session_id)
            if sess is None:
                raise KlbisectError(f"no klbisect session {session_id} {where}: `klbisect log --sessions` lists "
                                    "them", EXIT_USAGE)
        else:
            # the newer of the two by its last run: an interrupted session of an older question
            # must not hide the bisect that finished after it, and a `run` that resumed an
            # older session is the one just looked at, not a calibration begun before it
            found = [x for x in (st.active_session(), st.latest_session(
                ("run", "gitbisect", "calibrate", "nightly"), shown_only=True, touched=True),
                # `log`: a calibration Ctrl-C'd after a finished one made the runs just looked at
                # (a reviewer's `log` listed the older one's)
                st.latest_session(("calibrate",), touched=True) if runs_only else None) if x]
            sess = max(found, key=lambda x: (st.last_touched(x), x.id), default=None)
            if not runs_only:     # `log` lists the runs just made, whatever answer they served
                sess = shown_session(st, sess)
            live = st.active_session("gitbisect")
            if live is not None and sess is not None and sess.id != live.id and own_bisect(ws, live):
                # the checkout is mid `git bisect run`: that session is the one being
                # looked at, even if a `run` of another range finished since
                sess = live
    if sess is None and ws.has_state():
        # only calibrations that stopped short: their runs are kept, by commit
        # (shown, with why it stopped: a tester's read 150 "no session" beside `log` listing its runs)
        cut = ws.store.latest_session(("calibrate",), touched=True)
        if cut is not None:
            return cut
    if sess is None:
        raise KlbisectError(f"no klbisect session {where}: start one with `klbisect run` or "
                            "`klbisect start`", EXIT_USAGE)
    return sess


def calibration_runs(st, sess) -> tuple[list, set[int]]:
    """The runs at a calibration's commits from before it that it may count
    (under --fresh, its chain's only: a reviewer's stopped --fresh one
    counted the 14 it had left out), and the ids of those it counts: a
    finished one's as it stored them; an unfinished one's, the last --runs
    with a value at each commit, as its resume would reuse them (a tester's
    stopped one said "+8" where the resume reused 3). No ids: not known
    (results before 2026-12-07)."""
    first = sess.config.get("fresh_from", sess.id) if sess.config.get("fresh") else 0
    earlier = [r for r in st.runs(sess.probe_key, [sha for sha in (sess.good, sess.bad) if sha], every=True)
               if first <= (r.session_id or 0) < sess.id]
    if sess.result is not None:
        return earlier, set(sess.result.get("used_runs") or [])
    want = sess.config.get("runs") or 0
    used: set[int] = set()
    for sha in (sess.good, sess.bad):
        valued = [r for r in earlier if r.sha == sha and r.value is not None]
        used.update(r.id for r in (valued[-want:] if want else []))
    return earlier, used


def as_ended(sess) -> bool:
    """A session that will not go on: shown with the runs it had when it ended."""
    return sess.kind in ("run", "gitbisect") and sess.state in ("done", "ended")


def status(path: str | Path | None, session_id: int | None = None) -> dict:
    ws = Workspace(path)
    try:
        sess = _shown_session(ws, session_id)
        ws.use_session(sess)
        st = ws.store
        out: dict = {"session": sess.id, "kind": sess.kind, "state": sess.state, "good": sess.good,
                     "bad": sess.bad, "config": sess.config,
                     "stopped": None if sess.state == "done" else stop_reason(st, sess.id)}
        # a command holds the lock: working on the session shown by default, not an older one asked for
        out["running"] = ws.busy() and (session_id is None or _shown_session(ws).id == sess.id)
        if sess.kind == "run":
            # a nightly's bisect is a run session: named by its night (a tester read "run" and
            # looked for a `klbisect run` nobody typed), the first that points to it: the one that
            # found the regression, not a later "known" night
            out["for_night"] = next((r["night"] for r in (json.loads(row["result"] or "{}") for row in st.db.execute(
                "SELECT result FROM sessions WHERE kind='nightly' AND result IS NOT NULL ORDER BY id"))
                if r.get("bisect_session") == sess.id), None)
        later = st.latest_session(("calibrate",)) if session_id is None else None
        if later is not None and later.id > sess.id and later.result is None:
            # hidden from status (nothing to show yet), but the user who just pressed
            # Ctrl-C must not read an older calibration as this one
            out["interrupted_calibration"] = {
                "session": later.id, "rev": later.good, "runs": len(st.session_runs(later.id)),
                "wanted": later.config.get("runs"), "stopped": stop_reason(st, later.id)}
        if session_id is None:
            # a tester's killed `run` of another question stayed active behind a finished one
            # shown here, and only `reset` ("ended session 11") ever named it
            out["unfinished"] = [{"session": o.id, "kind": o.kind, "good": o.good, "bad": o.bad,
                                  "runs": len(st.session_runs(o.id)), "stopped": stop_reason(st, o.id)}
                                 for o in st.active_sessions(("run", "gitbisect")) if o.id != sess.id]
        if st.get(env_key(sess.id)) and sess.state not in ("done", "ended"):
            # a session stopped part-way left the user's interpreter on its builds (a tester's
            # `import sglang` failed after a Ctrl-C, and status said nothing of it)
            out["env_held"] = (sess.config.get("sglang") or {}).get("python") or "the Python klbisect runs in"
        if sess.kind == "calibrate":
            out["probe_runs"] = len(st.session_runs(sess.id))
            # a resumed calibration counts the runs its commits already had (those of earlier
            # sessions: later ones' are not in its table), those it counted: a tester's `--runs 3`
            # over 44 earlier runs said "+44 reused"
            earlier, used = calibration_runs(st, sess)
            out["reused_runs"] = sum(1 for r in earlier if r.id in used) if used else len(earlier)
            out["calibration"] = sess.result          # None until it finishes; rerun it to resume
            return out
        if sess.kind == "nightly":
            out["result"] = sess.result
        if sess.kind not in ("run", "gitbisect"):
            return out
        shas = [c[0] for c in st.candidates(sess.id)]
        # runs later sessions recorded at these commits: weighed while the session may still go on,
        # left out of one that ended, shown as it ended
        everything = st.runs(sess.probe_key, shas)
        out["as_ended"] = as_ended(sess)
        st.view_until(sess if out["as_ended"] else None)
        out["later_runs"] = (len(everything) - len(st.runs(sess.probe_key, shas)) if out["as_ended"] else
                             sum((r.session_id or 0) > sess.id for r in everything))
        analysis = current_analysis(ws, sess)
        cfg, cands, runs, pl, probe_key, build_key = analysis
        commits = probed_commits(ws, sess, cfg, cands, runs, pl)
        out["commits"] = commits
        out["probe_runs"] = len(st.session_runs(sess.id))
        out["reused_runs"] = max(len(st.runs(probe_key, shas)) - out["probe_runs"], 0)
        out["n_commits"] = len(shas) - 1
        if sess.kind == "gitbisect" and sess.state == "bisecting":
            # in the worktree it runs in: asked from another, this checkout's own state says nothing
            there_repo, _ = bisect_checkout(ws, sess)
            out["git_bisect_running"] = there_repo is not None and own_bisect(ws, sess, there_repo)
        if pl is not None:
            out["model"] = pl.model.to_dict()
            if pl.took_over:
                out["took_over"] = pl.took_over
            out["top"] = [{"candidates": [shas[i] for i in b.indices], "mass": b.mass,
                           "subjects": [cands[i][1] for i in b.indices]} for b in pl.posterior.top_blocks(5)]
            out["evidence"] = boundary_evidence(commits, pl.posterior, shas)
        if sess.kind == "gitbisect" and not (sess.state == "ended" and sess.result):
            res = gitbisect_result(ws, sess, analysis)
            out["result"] = res.to_json() if res else None
        else:
            out["result"] = answered(st, sess)     # an ended git bisect's: as `reset` found it
        res = out["result"] or {}
        # the endpoints' runs do not differ (now, or at the answer's level): no place is a
        # regression's, as the report says it
        out["no_signal"] = (pl is not None and (pl.lost is not None or pl.unproven is not None)
                            and not res.get("complete"))
        # the same top-level keys as `run --json`, so one parser reads both
        out.update({k: res.get(k) for k in ("culprit", "pr", "subject", "confidence")},
                   complete=bool(res.get("complete")), candidates=res.get("candidates") or [])
        top = (out.get("top") or [None])[0]
        # as status's text reads it: "No commit stands out" names no place (a script's flag for it)
        out["stands_out"] = out["complete"] or (not out["no_signal"] and top_stands_out(top, out["n_commits"]))
        return out
    finally:
        ws.close()


def sessions(path: str | Path | None) -> list[dict]:
    """Every session of the repository, newest first: the numbers --session
    takes (a tester was sent to `log` for them, which showed one session's runs)."""
    ws = Workspace(path)
    try:
        out = []
        for sess, n_runs in ws.store.session_table():
            res = sess.result or {}
            out.append({"session": sess.id, "kind": sess.kind, "state": sess.state, "created": sess.created,
                        "good": sess.good, "bad": sess.bad, "runs": n_runs,
                        "night": res.get("night") if sess.kind == "nightly" else None,
                        "verdict": res.get("verdict") if sess.kind == "nightly" else None,
                        "culprit": res.get("culprit"), "complete": res.get("complete"),
                        "confidence": res.get("confidence") if sess.kind != "nightly" else None})
        return out
    finally:
        ws.close()


def log(path: str | Path | None, session_id: int | None = None) -> list[dict]:
    ws = Workspace(path)
    try:
        sess = _shown_session(ws, session_id, runs_only=True)
        ws.use_session(sess)
        ws.store.view_until(sess if as_ended(sess) else None)
        subjects = {sha: subj for sha, subj, _ in ws.store.candidates(sess.id)}
        # the runs its answer rests on: its own, and those it reused from
        # earlier sessions of the same probe (a rerun may have reused them all)
        shas = [s for s in {*subjects, sess.good, sess.bad} if s]
        runs = {r.id: r for r in ws.store.runs(sess.probe_key, shas)}
        used = calibration_runs(ws.store, sess)[1] if sess.kind == "calibrate" else set()
        if used:
            # the runs its tables counted (a tester's recomputed percentiles from all 44 runs at
            # the commit, of which it counted 3)
            runs = {i: r for i, r in runs.items() if i in used}
        runs.update((r.id, r) for r in ws.store.session_runs(sess.id))
        for sha in {r.sha for r in runs.values()} - subjects.keys():
            # a calibration has no candidate list: its commits' subjects come from git
            try:
                subjects[sha] = gitrepo.subject(ws.repo, sha)
            except KlbisectError:       # a commit gone from the repository since
                subjects[sha] = ""
        # a run that printed values may still count as a crash (timed out, or cut off short
        # of the labels the others print): as the session weighs it
        counted = {r.id for r in valued_runs(list(runs.values()), ws.metric, ws.worse)}
        return [{"id": r.id, "started": r.started, "sha": r.sha, "subject": subjects.get(r.sha, ""),
                 "status": r.status, "values": r.values, "value": r.value, "exit_code": r.exit_code,
                 "duration": r.duration, "log_path": r.log_path, "counted": r.id in counted,
                 "reused_from": r.session_id if r.session_id != sess.id else None}
                for r in sorted(runs.values(), key=lambda r: r.id)]
    finally:
        ws.close()


_NOT_OUR_BISECT = "left the git bisect in progress alone: klbisect did not start it (`git bisect reset` ends it)"


def reset(path: str | Path | None, purge: bool = False) -> list[str]:
    ws = Workspace(path)
    done = []
    try:
        if ws.never_used():
            # nothing of klbisect's here to end or remove: make no state directory for it
            return [_NOT_OUR_BISECT] if gitrepo.bisect_in_progress(ws.repo) else []
        with ws.locked():
            st = ws.store
            ended = []
            while (sess := st.active_session()) is not None:
                if sess.kind == "gitbisect":
                    # its answer as it stands now: a later `status --session N` shows that,
                    # not one recomputed with runs later sessions add at its commits
                    with suppress(KlbisectError):
                        ws.use_session(sess)
                        res = gitbisect_result(ws, sess)
                        if res is not None:
                            st.update_session(sess.id, result=res.to_json())
                reset_line = None
                if sess.kind == "gitbisect":
                    # before the session ends: a bisect git cannot end (local changes in the way) stays
                    # the session's, for the next `klbisect reset`
                    repo, there = bisect_checkout(ws, sess)   # None: its worktree was removed since
                    if repo is not None and own_bisect(ws, sess, repo):
                        gitrepo.bisect_reset(repo)
                        reset_line = "git bisect reset" + (f" in the worktree {there}" if there else "")
                st.update_session(sess.id, state="ended", ended=time.time())
                why = stop_reason(st, sess.id)
                if why:
                    # "ended; interrupted; rerun the same command to resume" said two things (a tester's)
                    resume = "rerun the same command to resume"
                    note_stop(st, sess.id, why.replace(resume, "then ended by `klbisect reset` (its runs are kept: "
                                                               "the same command starts a new session that reuses "
                                                               "them)") if resume in why
                              else f"{why}; then ended by `klbisect reset`")
                done += [f"ended session {sess.id} ({sess.kind})"] + ([reset_line] if reset_line else [])
                ended.append(sess)
            for key in st.keys("fresh_open:"):
                # an unfinished `run --all-commits --fresh` starts over: its finished stages too
                st.put(key, "")
            if gitrepo.bisect_in_progress(ws.repo):
                # the user's own bisect: its marks are not ours to throw away
                done.append(_NOT_OUR_BISECT)
            # after git's reset: an editable install of the checkout is at its HEAD again. Also what an
            # interrupted `run` or `calibrate` (ended since) could not put back
            left = {int(k.rsplit(":", 1)[1]) for k in st.keys("env_before:")}
            for sess in ended + [st.session(i) for i in sorted(left - {s.id for s in ended})]:
                if sess is not None:
                    done.extend(restore_env(ws, sess))
            if ws.worktrees.exists():
                for wt in ws.worktrees.iterdir():
                    gitrepo.worktree_remove(ws.repo, wt)
                shutil.rmtree(ws.worktrees, ignore_errors=True)
                done.append("removed worktrees")
            if purge:
                st.purge()
                shutil.rmtree(ws.logs, ignore_errors=True)
                done.append("purged run history and logs")
        return done
    finally:
        ws.close()
