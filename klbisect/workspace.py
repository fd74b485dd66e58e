"""The state one repository's sessions share: its paths, its lock, its
sqlite store under the git dir, and the small records and keys every
command reads from it (a session's stop reason, its checkout, its runs
per commit), and the progress lines commands print. Everything here is
read or written the moment it happens, so any command can be interrupted
and the next one resumes."""
from __future__ import annotations

import errno
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import filelock

from . import repo as gitrepo
from .decide import STALE_CHECK_RUNS, STALE_MAX_RUNS, contradicts, summarize
from .errors import EXIT_BUSY, EXIT_NO_SIGNAL, KlbisectError
from .executors import make_slots
from .measure import Measurer, Outcome
from .metric import fmt_summary, fmt_value, scalar
from .proc import interrupt_on_stop_signals, marker_alive, owner_marker, reap_orphans_of, reap_stale
from .redact import redact
from .runs import STATUS_FAILED, cut_short, typical_values, usual_labels, value_counts
from .search import CommitRuns
from .store import Run, SessionRow, Store, storage_error


Progress = Callable[[str], None]


def to_stderr(msg: str) -> None:
    """The default progress line. Redacted here too, not only by the console
    script's streams: ``run_bisect`` called from Python printed a probe
    command's HF_TOKEN=... as it was given."""
    print(redact(msg), file=sys.stderr, flush=True)


def say_building(progress: Progress, probe=None):
    """A Measurer's on_build: one line before each build, with its log; and
    the probe's launches, where it launches a server (--probe sglang), said
    too: a launch on a GPU box takes minutes that read as a hang."""
    if probe is not None and hasattr(probe, "on_launch"):
        probe.on_launch = progress
    return lambda sha, log: progress(f"  {sha[:12]}: building (log: {log})")


# seconds a command waits for the lock before it is busy (153): a command stopping after Ctrl-C
# still holds it while it stops its probe and any server
LOCK_WAIT = 10.0


class Workspace:
    """A repository and klbisect's state for it."""

    def __init__(self, path: str | Path | None, metric: str | None = None, worse: str = "higher"):
        self.metric = metric  # the --metric in force: how every stored run is read (Store.metric)
        self.worse = worse    # with no --metric, lower: the min over labels is judged
        self.repo = gitrepo.open_repo(path)
        self.top = gitrepo.toplevel(self.repo)
        self.dir = gitrepo.common_dir(self.repo) / "klbisect"
        self.logs = self.dir / "logs"
        self.worktrees = self.dir / "worktrees"
        self.pids = self.dir / "pids"
        # any command (status and log too) kills what a klbisect killed with SIGKILL left running
        reap_stale(self.pids)
        self._reap_dead_owner()
        self._store: Store | None = None
        self._lock = filelock.FileLock(str(self.dir / "lock"))

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store(self.dir / "state.db", self.metric, self.worse)
        return self._store

    def use_metric(self, metric: str | None, worse: str = "higher") -> None:
        """Read runs with this --metric (and --worse) from now on (a session's own)."""
        self.metric, self.worse = metric, worse
        if self._store is not None:
            self._store.metric, self._store.worse = metric, worse

    def use_session(self, sess: SessionRow) -> None:
        """See the runs as this session does: its --metric, and for a --fresh
        session only the runs recorded since it began."""
        self.use_metric(sess.config.get("metric"), sess.config.get("worse") or "higher")
        origin = self.store.session(sess.config["fresh_from"]) if sess.config.get("fresh_from") else None
        self.store.view_from((origin or sess) if sess.config.get("fresh") else None)

    @contextmanager
    def locked(self) -> Iterator["Workspace"]:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise storage_error(e) from None
        try:
            try:
                self._lock.acquire(timeout=0)
            except filelock.Timeout:
                # one still stopping: Ctrl-C ends `git bisect run` at once while its `klbisect
                # probe` stops its probe (a server's whole tree), and a rerun at once was busy
                print(f"klbisect: another klbisect holds this repository; waiting up to {LOCK_WAIT:g} s for it "
                      "to finish", file=sys.stderr, flush=True)
                self._lock.acquire(timeout=LOCK_WAIT)
        except filelock.Timeout:
            raise KlbisectError(f"busy: another klbisect is working on {self.top} "
                                f"(lock {self.dir / 'lock'}); wait for it or stop it first", EXIT_BUSY) from None
        except OSError as e:
            # an immutable or foreign state directory fails here first (EPERM, EACCES)
            raise storage_error(e, self.dir / "lock") from None
        owner = self.dir / "owner"
        try:
            # who holds the lock, so `status` tells a live command from a killed one (a dead
            # holder's leftovers were reaped when the workspace opened)
            try:
                owner.write_text(owner_marker() + "\n")
            except OSError:
                pass
            reap_stale(self.pids)
            with interrupt_on_stop_signals():
                yield self
        finally:
            owner.unlink(missing_ok=True)   # left behind only by a klbisect killed hard
            self._lock.release()

    def never_used(self) -> bool:
        """No state directory here (a dangling link is one: `locked` gives its
        storage error): a command with nothing to read or end makes none."""
        return not self.dir.exists() and not self.dir.is_symlink()

    def has_state(self) -> bool:
        """Whether there is a state database to read; a file or a dangling
        link where the state directory belongs is an error, not "no session"."""
        if self.dir.is_symlink() and not self.dir.exists() or self.dir.exists() and not self.dir.is_dir():
            raise storage_error(FileExistsError(errno.EEXIST, "File exists", str(self.dir)))
        return (self.dir / "state.db").exists()

    def _owner_marker(self) -> str | None:
        try:
            return (self.dir / "owner").read_text().strip()
        except OSError:
            return None

    def _reap_dead_owner(self) -> None:
        """The lock holder was killed hard: kill what it left, even a run
        it was starting (no pid file yet). The next lock holder overwrites
        its marker."""
        marker = self._owner_marker()
        if marker and not marker_alive(marker):
            reap_orphans_of(marker)

    def busy(self) -> bool:
        """Is a klbisect command working on this repository now?"""
        return marker_alive(self._owner_marker())

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def record(ws: Workspace, sid: int | None, probe_key: str, build_key: str | None, outcome: Outcome,
           checkout: Path) -> Run | None:
    """Store one measurement (its build, its run); the run's value is read
    with the workspace's --metric, as every stored run is (Store.metric)."""
    st = ws.store
    if outcome.build is not None and build_key:
        st.add_build(build_key, str(checkout), outcome.sha, outcome.build.ok, outcome.started,
                     outcome.build.duration, outcome.build.log_path, outcome.build.note)
    r = outcome.run
    if r is None:
        return None
    value = scalar(r.values, ws.metric, ws.worse)
    # a run that stopped on its own assertion keeps saying so without the --metric label: it never
    # reached that label, which says nothing of whether the test prints it (endpoint_problem)
    kept = value is not None or not r.values or r.status == STATUS_FAILED
    rid = st.add_run(sid, probe_key, outcome.sha, outcome.started, r.duration, r.exit_code,
                     r.status if kept else "novalue", r.values, value,
                     r.log_path, outcome.slot)
    return Run(rid, sid, probe_key, outcome.sha, outcome.started, r.duration, r.exit_code, r.status,
               r.values, value, r.log_path, outcome.slot)


class WorktreeMeter:
    """Measures commits one at a time in a worktree under the git dir, made
    on first use, so the user's checkout (and git bisect's) stays put; each
    run is recorded as it ends. ``close`` removes the worktree; the builder
    stays open for its owner to close (``close_builder``), since `probe`
    keeps its environment between git bisect's steps."""

    def __init__(self, ws: Workspace, sid: int, probe, builder, progress: Progress):
        self.ws, self.sid, self.probe, self.builder, self.progress = ws, sid, probe, builder, progress
        self.build_key = builder.key if builder else None
        self.slot = self.measurer = None

    def measure(self, sha: str) -> tuple[Outcome, Run | None]:
        ws = self.ws
        if self.slot is None:
            self.slot = make_slots(ws.worktrees, 1, pid_dir=ws.pids)[0]
            self.measurer = Measurer(ws.repo, self.probe, self.builder, ws.logs / f"s{self.sid}",
                                     use_worktree=True, on_build=say_building(self.progress, self.probe))
        out = self.measurer.measure(sha, self.slot)
        return out, record(ws, self.sid, self.probe.key, self.build_key, out, self.slot.checkout)

    def close(self) -> None:
        if self.slot is not None and self.slot.checkout.exists():
            gitrepo.worktree_remove(self.ws.repo, self.slot.checkout)


def commit_runs(ws: Workspace, probe_key: str, build_key: str | None, shas: list[str],
                timeout: float | None = None, after_session: int = 0, labels_from: list[str] | None = None,
                failed_after: int = 0, session: int = 0) -> dict[str, CommitRuns]:
    """Everything known per commit, from every session that used this probe:
    a rerun of the same question reuses finished runs. With ``timeout`` (the
    --timeout in force now), a run that timed out sooner than that says
    nothing about a crash: the user who raised --timeout after every run
    timed out gets new runs, not the old timeouts counted as crashes. With
    ``after_session``, only the runs of later sessions count (a nightly
    regression's head, without the runs that found it). A --fresh session's
    store hides older runs, and older failed builds count for nothing too.
    ``labels_from``: more commits whose runs say which labels a complete
    run prints (a nightly head whose every run tonight died after its
    first label has no complete run of its own to say so). ``failed_after``:
    only failed builds recorded after this build id count, so a command
    (whose builds follow the id it began at) builds an older failure once
    more where it needs it, and a fixed environment (a network blip, a
    full disk) needs no other command; told by the store's order, not by
    a Ray node's clock, which may lag. ``session``: that session's runs
    alone (a nightly's own crashes)."""
    out = {s: CommitRuns([]) for s in shas}
    last_run: dict[str, float] = {}
    runs = ws.store.runs(probe_key, shas)
    ref = _label_reference(ws, probe_key, runs, shas, labels_from)
    usual = usual_labels(ref) if ws.metric is None else frozenset()
    typical = typical_values(ref, usual)
    for r in runs:
        last_run[r.sha] = max(last_run.get(r.sha, 0.0), r.started)
        if cut_short(r, timeout) or (after_session and (r.session_id or 0) <= after_session) \
                or (session and r.session_id != session):
            continue
        c = out[r.sha]
        if value_counts(r, usual, typical, ws.worse):
            c.values.append(r.value)
        else:
            c.crashes += 1
    if build_key:
        failed_at = ws.store.failed_builds(build_key, shas)
        for s in shas:
            failed = failed_at.get(s)
            # a probe run after the failed build (a checkout that needed no
            # rebuild) shows the commit can be tested after all
            if failed and last_run.get(s, 0.0) <= failed["started"] and failed["started"] >= ws.store.since \
                    and failed["id"] > failed_after:
                out[s].build_failed = True
    return out


def say_reused(ws: Workspace, probe_key: str, shas: list[str], timeout: float | None, progress: Progress) -> None:
    """Runs are matched by the probe command alone: a new session says how
    many it reuses, since a changed environment (a new wheel, another GPU)
    would make them stale, or, with --fresh, how many it leaves out. Runs
    cut short by a --timeout lower than this one's are run again, so they
    are not counted."""
    fresh = ws.store.since_session
    earlier = sum(1 for r in ws.store.runs(probe_key, shas, every=True)
                  if not cut_short(r, timeout) and not (fresh and (r.session_id or 0) >= fresh))
    if earlier and fresh:
        progress(f"--fresh: leaving out the {earlier} runs this probe command recorded earlier at these commits")
    elif earlier:
        progress(f"reusing {earlier} runs this probe command recorded earlier at these commits "
                 "(if the environment changed since, rerun with --fresh to leave them out)")


def own_runs_wanted(model, sha: str, runs: list, sid: int, where: str, advice: str) -> int:
    """How many runs of session ``sid`` a commit that earlier sessions
    measured needs before its verdict may lean on their runs: STALE_CHECK_RUNS,
    one more while ``contradicts`` is unsure (up to STALE_MAX_RUNS), and a
    154 naming the commit and what to do once they read the other way."""
    earlier = [r.value for r in runs if r.session_id != sid and r.value is not None]
    now = [r.value for r in runs if r.session_id == sid and r.value is not None]
    if not earlier:
        return 0
    verdict = contradicts(model, earlier, now)
    if verdict:
        was, other = ("bad", "good") if model.commit_log_lr(earlier) > 0 else ("good", "bad")
        raise KlbisectError(
            f"{sha[:12]}, {where}, read {was} in the {len(earlier)} runs earlier sessions "
            f"recorded there ({fmt_summary(summarize(earlier))}) and reads nearer the {other} side now "
            f"({', '.join(fmt_value(v) for v in now)}): the environment the probe sees changed since (a new "
            f"driver, wheel or machine?); {advice}", EXIT_NO_SIGNAL)
    # not sure yet: one more run
    want = STALE_CHECK_RUNS if verdict is False or len(now) < STALE_CHECK_RUNS else len(now) + 1
    return min(want, STALE_MAX_RUNS)


def _label_reference(ws: Workspace, probe_key: str, runs: list, shas: list[str],
                     labels_from: list[str] | None) -> list:
    """``runs`` (of ``shas``) and the runs of ``labels_from`` that exited 0:
    what says which labels a complete run prints. Only clean exits join:
    where every run exits non-zero, a label the newer commits dropped must
    not make all their runs crashes."""
    extra = [x for x in labels_from or [] if x not in shas]
    return runs + [r for r in ws.store.runs(probe_key, extra) if r.exit_code == 0] if extra else runs


def since(now: CommitRuns, before: CommitRuns) -> CommitRuns:
    """A commit's runs as this command judges them: a commit that had printed
    no value when the command started gets a fresh crash budget. Its
    earlier crashes were most likely the environment (a probe set up wrong,
    a full disk, a missing variable), and once the user fixes it the same
    command must measure again, not stop on the old crashes or call the
    commit untestable. Crashes mixed with values are kept: they are the
    probe's own flakiness."""
    old = before.crashes if not before.values else 0
    return CommitRuns(now.values, now.crashes - old, now.build_failed)


def stop_key(sid: int) -> str:
    return f"stopped:{sid}"


def all_commits_key(sid: int) -> str:
    """The answer `run --all-commits` gave, kept with the session it rests
    on: a merge found on the first-parent line and named in the end (its
    side branch alike, or not searched), or a side branch's commit with the
    merge's PR and every stage's runs. Cleared when the session answers
    again by itself."""
    return f"all_commits:{sid}"


def fresh_open_key(sid: int) -> str:
    """A finished --fresh stage of a `run --all-commits --fresh` that has not
    finished: its rerun resumes the stage (a finished --fresh session is
    otherwise never resumed, and the first-parent line was measured again)."""
    return f"fresh_open:{sid}"


def side_done_key(sid: int) -> str:
    """A side-branch search of `run --all-commits` that ended short (its
    branch alike to its fork, or unsearchable): `status` and `report` show
    the session of the merge it searched under, which holds the answer."""
    return f"side_done:{sid}"


def answered(st: Store, sess) -> dict | None:
    """A session's result as the last command that answered from it gave it."""
    raw = st.get(all_commits_key(sess.id)) if sess.result and sess.state == "done" else None
    return json.loads(raw) if raw else sess.result


def shown_session(st: Store, sess):
    """The session `status` and `report` show for ``sess``: itself, or the
    merge's that a side-branch search which ended short answered under."""
    parent = st.get(side_done_key(sess.id)) if sess is not None else None
    return st.session(int(parent)) or sess if parent else sess


def checkout_key(sid: int) -> str:
    return f"checkout:{sid}"


def worktree_key(sid: int) -> str:
    return f"worktree:{sid}"


def note_checkout(ws: Workspace, sid: int) -> None:
    ws.store.put(checkout_key(sid), str(ws.top))
    ws.store.put(worktree_key(sid), gitrepo.worktree_id(ws.repo))


def bisect_key(sid: int) -> str:
    return f"bisect:{sid}"


def stop_reason(st: Store, sid: int) -> str | None:
    """Why a session stopped short, if it did (and has not gone on since)."""
    return st.get(stop_key(sid)) or None


def note_stop(st: Store, sid: int, why: str) -> None:
    """Why a session stopped short, for `status` (cleared when it goes on)."""
    try:
        st.put(stop_key(sid), why)
    except KlbisectError:
        pass    # the state itself failed (a full disk): the error being raised says so
