"""Orchestration: the commands a user runs, over the pure core.

``run_bisect`` drives the whole search itself in worktrees under the git dir;
``start`` + ``probe_head`` hand the search to ``git bisect run``; ``status``
and ``reset`` look at and end a session. Every finished run is in sqlite the
moment it finishes, so any of these can be interrupted and rerun.
"""
from __future__ import annotations

import errno
import json
import math
import re
import shlex
import shutil
import statistics
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import filelock

from . import repo as gitrepo
from .build import DEFAULT_BUILD_PATHS, DEFAULT_BUILD_TIMEOUT, Builder, CommandBuilder, shared_install
from .decide import (BAD, DECISIVE_RUNS, GOOD, MAX_CONFIDENCE, MAX_ENDPOINT_RUNS, MAX_TOTAL_RUNS, MIN_ENDPOINT_RUNS,
                     OVERLAP_ENDPOINT_RUNS, OVERLAP_P, SEPARATION_P, SKIP, STALE_CHECK_RUNS, STALE_MAX_RUNS,
                     STALE_RUN_LR, UNDECIDED, UNDECIDED_LIMIT, VERDICT_LR, EndpointStep, Model, ThresholdModel,
                     contradicts, crash_skip_limit, endpoint_crash_limit, endpoint_step, is_undecided_skip, judge,
                     label_separations, labels_apart, runs_per_commit, separation, summarize, verdict_model, worse_tail)
from .errors import (EXIT_BUSY, EXIT_NO_SIGNAL, EXIT_NOT_SURE, EXIT_PROBE_MISSING, EXIT_REPO_STATE, EXIT_STORAGE,
                     EXIT_USAGE, Interrupted, KlbisectError, NoDifference)
from .executors import MAX_PARALLEL, Failure, LocalExecutor, make_slots, port_bases
from .measure import Measurer, Outcome
from .metric import (broke, check_regex, fmt_count, fmt_subject, fmt_summary, fmt_value, last_exception,
                     over_labels, scalar)
from .probe import (DEFAULT_TIMEOUT, STATUS_FAILED, STATUS_NOSERVER, STATUS_NOTFOUND, STATUS_TIMEOUT,
                    CommandProbe, Probe, Slot)
from .proc import (interrupt_on_stop_signals, log_tail, marker_alive, owner_marker, reap_orphans_of,
                   reap_stale)
from .runs import (MEASURED, cut_short, failed_launches, missed_worse, repeated_runs, run_shown, typical_values,
                   usual_labels, valued_runs, value_counts)
from .search import CommitRuns, plan
from .store import Run, SessionRow, Store, storage_error

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class BisectConfig:
    """Everything that defines a bisect. The fields in ``question()`` decide
    whether an interrupted session is the same one and may be resumed."""

    good: str = ""
    bad: str = ""
    probe_cmd: str | None = None
    probe: str = "cmd"                    # cmd | sglang
    build_cmd: str | None = None
    build: str | None = None              # None | sglang
    build_paths: tuple[str, ...] = DEFAULT_BUILD_PATHS
    timeout: float = DEFAULT_TIMEOUT
    build_timeout: float = DEFAULT_BUILD_TIMEOUT
    metric: str | None = None
    metric_regex: str | None = None
    threshold: float | None = None        # classic mode
    votes: int = 1
    max_runs: int | None = None           # None: decide.runs_per_commit
    endpoint_runs: int = MIN_ENDPOINT_RUNS
    max_endpoint_runs: int = MAX_ENDPOINT_RUNS
    confidence: float = 0.99
    worse: str = "higher"                 # which way the metric gets worse: higher | lower | either
    first_parent: bool = True
    crash_limit: int = 2
    max_total_runs: int = MAX_TOTAL_RUNS
    parallel: int = 1
    gpus_per_probe: int = 0
    executor: str = "local"               # local | ray
    ray_address: str | None = None
    sglang: dict = field(default_factory=dict)   # model_path, server_args, prompts, ...
    fresh: bool = False                   # count only runs recorded since the session began

    def question(self) -> dict:
        d = asdict(self)
        for k in ("good", "bad", "parallel", "gpus_per_probe", "executor", "ray_address",
                  "max_total_runs", "timeout", "build_timeout", "fresh"):
            d.pop(k)
        d["build_paths"] = list(self.build_paths)
        return d

    def stored(self) -> dict:
        """What a session keeps: the question, and the settings a rerun may
        change (RERUN_KEYS) but that `klbisect probe` and `status` read back."""
        return {**self.question(), "timeout": self.timeout, "build_timeout": self.build_timeout,
                "max_total_runs": self.max_total_runs, **({"fresh": True} if self.fresh else {})}

    def run_command(self, good: str, bad: str, max_runs: bool = True) -> str:
        """The `klbisect run` that asks this question, its options spelled out:
        advice a user can paste (a `run` needs the probe options again).
        ``max_runs=False`` leaves --max-runs out: the advice out of a git
        bisect that --max-runs stalled (a tester pasted it, and the run
        stalled on the same cap 344 runs later)."""
        d = BisectConfig()
        argv = ["klbisect", "run", "--good", good, "--bad", bad]

        def opt(flag: str, value, default) -> None:
            if value != default and value is not None:
                argv.extend([flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)])

        opt("--probe", self.probe, d.probe)
        opt("--probe-cmd", self.probe_cmd, None)
        for key, value in self.sglang.items():
            opt("--" + ("sglang-python" if key == "python" else key.replace("_", "-")), value, None)
        opt("--build-cmd", self.build_cmd, None)
        opt("--build", self.build, None)
        opt("--build-paths", tuple(self.build_paths), tuple(d.build_paths))
        opt("--timeout", f"{self.timeout:g}", f"{d.timeout:g}")
        opt("--build-timeout", f"{self.build_timeout:g}", f"{d.build_timeout:g}")
        for key in ("metric", "metric_regex", "threshold", "votes", "max_runs", "endpoint_runs",
                    "max_endpoint_runs", "max_total_runs", "confidence", "worse"):
            if key == "max_runs" and not max_runs:
                continue
            opt("--" + key.replace("_", "-"), getattr(self, key), getattr(d, key))
        if not self.first_parent:
            argv.append("--all-commits")
        if self.fresh:
            argv.append("--fresh")
        return shlex.join(argv)

    @classmethod
    def from_dict(cls, d: dict) -> "BisectConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "build_paths" in known:
            known["build_paths"] = tuple(known["build_paths"])
        return cls(**known)

    def validate(self) -> None:
        if self.probe_cmd is not None:
            # what the shell ignores, so do the session's question and the probe's key (a
            # tester's trailing space started a new session, or a new nightly baseline)
            self.probe_cmd = self.probe_cmd.strip()
        if self.probe == "cmd" and not (self.probe_cmd or "").strip():
            raise KlbisectError("no probe given: pass --probe-cmd \"...\" (or --probe sglang)", EXIT_USAGE)
        if self.worse not in ("higher", "lower", "either"):
            raise KlbisectError(f"--worse {self.worse!r}: give higher, lower or either", EXIT_USAGE)
        if self.probe not in ("cmd", "sglang"):
            raise KlbisectError(f"unknown --probe {self.probe!r}; use cmd or sglang", EXIT_USAGE)
        if self.timeout is not None and not self.timeout > 0:
            raise KlbisectError(f"--timeout {self.timeout:g}: give the seconds one probe run may take "
                                f"(default {DEFAULT_TIMEOUT:g})", EXIT_USAGE)
        if not 0.5 < self.confidence <= MAX_CONFIDENCE:
            raise KlbisectError(f"--confidence {self.confidence:g}: give a level above 0.5 and at most "
                                f"{MAX_CONFIDENCE:g} (e.g. 0.99)", EXIT_USAGE)
        if self.parallel > 1 and self.build_cmd and shared_install(self.build_cmd):
            raise KlbisectError(
                f"--parallel {self.parallel} with --build-cmd {self.build_cmd!r}: every slot's build installs "
                "into the one Python they share, so each probe would import whichever commit was installed "
                "last; use --parallel 1, or a build into the checkout's own environment (e.g. --build-cmd "
                "'python -m venv .venv && .venv/bin/pip install -e python' and the probe run by .venv/bin/python), "
                "or, for SGLang, --build sglang (each probe imports its own checkout's python/)", EXIT_USAGE)
        python = (self.sglang or {}).get("python")
        if python and (self.build == "sglang" or self.probe == "sglang") and self.executor == "local" \
                and shutil.which(python) is None:
            # found now, not after three "infrastructure failures" and a 152
            raise KlbisectError(f"--sglang-python {python}: no such executable here; give the interpreter whose "
                                "sglang the session builds and runs (e.g. .venv/bin/python)", EXIT_USAGE)
        if self.metric_regex is not None:
            check_regex(self.metric_regex)
        if (self.max_runs is not None and self.max_runs < 1) or self.parallel < 1 or self.votes < 1:
            raise KlbisectError("--max-runs, --parallel and --votes must be at least 1", EXIT_USAGE)
        if self.parallel > MAX_PARALLEL:
            raise KlbisectError(f"--parallel {self.parallel}: at most {MAX_PARALLEL} probes at a time (each slot "
                                "has its own worktree and range of ports)", EXIT_USAGE)
        if self.votes != 1 and self.threshold is None:
            raise KlbisectError(f"--votes {self.votes} counts runs at or above a --threshold: pass --threshold "
                                "VALUE too, or leave --votes out (the default mode learns good and bad from "
                                "the endpoints and decides how many runs each commit needs)", EXIT_USAGE)
        # --max-endpoint-runs alone may lower the default first batch
        self.endpoint_runs = min(self.endpoint_runs, self.max_endpoint_runs)
        if self.endpoint_runs < 2:
            raise KlbisectError("--endpoint-runs and --max-endpoint-runs must be at least 2", EXIT_USAGE)
        if self.threshold is not None and self.votes % 2 == 0:
            raise KlbisectError("--votes must be odd so a majority always exists", EXIT_USAGE)


def make_probe(cfg: BisectConfig):
    if cfg.probe == "sglang":
        from .sglang import SGLangProbe  # noqa: PLC0415 - only for SGLang users
        return SGLangProbe.from_options(cfg.sglang, timeout=cfg.timeout)
    # --build sglang installs one checkout into the Python every slot shares: each
    # probe imports its own checkout's python/ first, as the SGLang probe's server does
    return CommandProbe(cfg.probe_cmd or "", timeout=cfg.timeout, metric_regex=cfg.metric_regex,
                        pythonpath=("python",) if cfg.build == "sglang" else ())


def say_building(progress: Progress):
    """A Measurer's on_build: one line before each build, with its log."""
    return lambda sha, log: progress(f"  {sha[:12]}: building (log: {log})")


def hold_env(ws: "Workspace", sid: int, builder, log_dir: Path) -> None:
    """Before a session's first build: a builder that changes the user's
    environment (--build sglang) notes what it finds, in the store at once,
    so Ctrl-C or a kill -9 mid-build loses nothing. A resumed session
    takes over what its first command found (not the half-built state the
    interruption left), and `klbisect reset` can put that back too."""
    remember = getattr(builder, "remember_origin", None)
    if remember is None:
        return
    if not ws.store.get(_env_key(sid)):
        _take_over_env(ws, sid, builder)
    _adopt_env(ws, sid, builder)
    remember(log_dir)
    _keep_env(ws, sid, builder)


def _unbuilt_sglang_hint(ws: "Workspace", cfg: BisectConfig) -> str:
    """Endpoints alike in an SGLang checkout probed with no build: each
    commit's test most likely imported the one sglang installed (a tester
    bisected their own editable checkout, the same code at every commit)."""
    if cfg.build or cfg.build_cmd or cfg.probe == "sglang" or not (ws.top / "python" / "sglang").is_dir():
        return ""
    return ("; this is an SGLang checkout probed with no build: every commit's test may have imported the "
            "same installed sglang; add --build sglang (each probe then imports its own checkout)")


def _take_over_env(ws: "Workspace", sid: int, builder) -> None:
    """An earlier session that a Ctrl-C or a kill stopped before it put the
    same interpreter back: what that one found is this one's "before" (not
    the half-built state it left, which the next session ended by
    "restoring"), and its record moves here, so it is put back once. A git
    bisect session still under way keeps its own: its probes need it."""
    python = getattr(builder, "python", None)
    for key in ws.store.keys("env_before:"):
        other, raw = int(key.rsplit(":", 1)[1]), ws.store.get(key)
        sess = ws.store.session(other) if raw and other != sid else None
        if sess is None or (sess.kind == "gitbisect" and sess.state != "ended"):
            continue
        theirs = make_builder(BisectConfig.from_dict({**sess.config, "good": sess.good, "bad": sess.bad}))
        if getattr(theirs, "python", None) == python:
            builder.adopt_origin(json.loads(raw))
            ws.store.put(_env_key(sid), raw)
            ws.store.put(key, "")
            return


def close_builder(builder, progress: Progress, ws: "Workspace | None" = None, sid: int | None = None) -> None:
    """End of a session's builds: a builder that changed the user's
    environment (--build sglang) puts it back, and says so. With the
    session (``hold_env``), what could not be put back stays in its store."""
    close = getattr(builder, "close", None)
    if close:
        try:
            close(progress)
        finally:
            if ws is not None and sid is not None:
                saved = getattr(builder, "saved_origin", None)
                left = saved() if saved else None
                ws.store.put(_env_key(sid), json.dumps(left) if left is not None else "")


def make_builder(cfg: BisectConfig):
    if cfg.build == "sglang":
        from .sglang import SGLangBuilder  # noqa: PLC0415
        return SGLangBuilder.from_options({**cfg.sglang, "timeout": cfg.build_timeout})
    if cfg.build_cmd:
        return CommandBuilder(cfg.build_cmd, tuple(cfg.build_paths), cfg.build_timeout)
    return None


# ---- workspace: paths, lock, store -------------------------------------------

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


# ---- recording and reading runs ----------------------------------------------

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
    # reached that label, which says nothing of whether the test prints it (_endpoint_problem)
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
                                     use_worktree=True, on_build=say_building(self.progress))
        out = self.measurer.measure(sha, self.slot)
        return out, record(ws, self.sid, self.probe.key, self.build_key, out, self.slot.checkout)

    def close(self) -> None:
        if self.slot is not None and self.slot.checkout.exists():
            gitrepo.worktree_remove(self.ws.repo, self.slot.checkout)


def commit_runs(ws: Workspace, probe_key: str, build_key: str | None, shas: list[str],
                timeout: float | None = None, after_session: int = 0, labels_from: list[str] | None = None,
                failed_after: int = 0) -> dict[str, CommitRuns]:
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
    a Ray node's clock, which may lag."""
    out = {s: CommitRuns([]) for s in shas}
    last_run: dict[str, float] = {}
    runs = ws.store.runs(probe_key, shas)
    ref = _label_reference(ws, probe_key, runs, shas, labels_from)
    usual = usual_labels(ref) if ws.metric is None else frozenset()
    typical = typical_values(ref, usual)
    for r in runs:
        last_run[r.sha] = max(last_run.get(r.sha, 0.0), r.started)
        if cut_short(r, timeout) or (after_session and (r.session_id or 0) <= after_session):
            continue
        c = out[r.sha]
        if value_counts(r, usual, typical, ws.worse):
            c.values.append(r.value)
        else:
            c.crashes += 1
    if build_key:
        for s in shas:
            failed = ws.store.failed_build(build_key, s)
            # a probe run after the failed build (a checkout that needed no
            # rebuild) shows the commit can be tested after all
            if failed and last_run.get(s, 0.0) <= failed["started"] and failed["started"] >= ws.store.since \
                    and failed["id"] > failed_after:
                out[s].build_failed = True
    return out


# Stored with a session but not part of its question: a rerun with another
# --timeout or --build-timeout (after every run timed out) resumes the same session, and a
# rerun without --fresh resumes a --fresh one (which stays fresh).
RERUN_KEYS = ("timeout", "build_timeout", "fresh", "fresh_from", "max_total_runs")


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


def _reused_boundary(ws: Workspace, sid: int, probe_key: str, shas: list[str], block, model,
                     timeout: float | None = None) -> list[int]:
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
    for r in ws.store.runs(probe_key, shas):
        if r.session_id == sid and not cut_short(r, timeout):
            mine.setdefault(at[r.sha], []).append(r)
        if r.value is not None:
            by_index.setdefault(at[r.sha], []).append(r)
    reused = [i for i, runs in by_index.items() if any(r.session_id != sid for r in runs)]
    below = [i for i in reused if i < block.first]
    above = [i for i in reused if i >= block.last]
    need = []
    for i in ([max(below)] if below else []) + ([min(above)] if above else []):
        want = _own_runs_wanted(model, shas[i], by_index[i], sid, "near the answer",
                                "rerun with --fresh to leave the earlier runs out")
        tried = mine.get(i, [])
        if want and len(tried) >= want and all(r.value is None or r.status == STATUS_TIMEOUT for r in tried):
            timed_out = all(r.status == STATUS_TIMEOUT for r in tried)
            raise KlbisectError(
                f"{shas[i][:12]}, near the answer, gave no value in the {len(tried)} runs this session made to "
                "check the runs earlier sessions recorded there ("
                + (f"each stopped by --timeout {_seconds(timeout or 0)}): raise --timeout (the runs it cut short "
                   "are then run again)" if timed_out else
                   f"each crashed): see why in {tried[-1].log_path}; once fixed, rerun the same command")
                + "; or rerun with --fresh to leave the earlier runs out", EXIT_NO_SIGNAL)
        need += [i] * max(want - len(tried), 0)
    return need


def _own_runs_wanted(model, sha: str, runs: list, sid: int, where: str, advice: str) -> int:
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


def _spikes_note(good: list[float], bad: list[float], worse: str) -> str:
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


def _goes_better(cfg: BisectConfig, sep) -> bool:
    """Did the endpoints move the way this session calls better?"""
    return cfg.worse not in ("either", "higher" if sep.direction == "up" else "lower")


def _check_direction(cfg: BisectConfig, sep, finding: Callable[[], LabelHint | None] = lambda: None,
                     spikes: int = 0) -> None:
    """Endpoints that moved the way that is better: a fix in the range, or
    --good and --bad swapped. Named as "first bad", its commit would be
    blamed for the improvement. ``finding``: what the labels show (label_finding);
    ``spikes``: bad runs far past every good one the worse way (worse_tail)."""
    moved = "higher" if sep.direction == "up" else "lower"
    if not _goes_better(cfg, sep):
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
            f"--worse {moved} if {moved} values are worse for this metric)" + hint)
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


def _question_of(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in RERUN_KEYS}


def _asks(sess, good: str, bad: str, cfg: BisectConfig) -> bool:
    """Whether a stored session asks this command's question (its settings a rerun may change aside)."""
    return (sess.good, sess.bad, _question_of(sess.config)) == (good, bad, cfg.question())


def _label_reference(ws: Workspace, probe_key: str, runs: list, shas: list[str],
                    labels_from: list[str] | None) -> list:
    """``runs`` (of ``shas``) and the runs of ``labels_from`` that exited 0:
    what says which labels a complete run prints. Only clean exits join:
    where every run exits non-zero, a label the newer commits dropped must
    not make all their runs crashes."""
    extra = [x for x in labels_from or [] if x not in shas]
    return runs + [r for r in ws.store.runs(probe_key, extra) if r.exit_code == 0] if extra else runs


def _log_says(path: str | None, text: str, limit: int = 1 << 20) -> bool:
    # the whole log, not its tail: the server's last lines (a ServerArgs line of kilobytes) follow it
    try:
        with open(path or "", "rb") as f:
            return text.encode() in f.read(limit)
    except OSError:
        return False


def _model_from(d: dict):
    return ThresholdModel.from_dict(d) if d.get("kind") == "threshold" else Model.from_dict(d)


def _failed_before(ws: Workspace, build_key: str | None, shas: list[str], runs: dict[str, CommitRuns],
                   indices, first_build: int) -> list[str]:
    """The commits at ``indices`` untestable on a build that failed before
    this command, whose builds are those after id ``first_build``."""
    if not build_key:
        return []
    return [shas[i] for i in indices if runs[shas[i]].build_failed
            and (ws.store.failed_build(build_key, shas[i]) or {}).get("id", 0) <= first_build]


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


# ---- endpoint calibration ------------------------------------------------------

def _endpoint_problem(ws: Workspace, which: str, sha: str, probe_key: str, build_key: str | None,
                      cr: CommitRuns, crash_limit: int, note: str = "",
                      where: str | None = None, metric_regex: str | None = None,
                      at_both: bool = False, other: str | None = None) -> KlbisectError | None:
    """Why this endpoint cannot be measured, once that is clear: its build
    failed, it printed no value in ``crash_limit`` runs, or it printed
    labels but never the --metric asked for. ``where`` names the commit
    when it is not an endpoint (a nightly head); ``other`` is the other
    endpoint, whose runs may show a label that can be bisected instead."""
    where = where or f"the {which} endpoint"
    metric = ws.metric
    if metric and not cr.values:
        printed = [r for r in ws.store.runs(probe_key, [sha]) if r.values]
        # a run that stopped on its own assertion (a test that asserts in its loop over labels)
        # never reached its later labels: it says nothing of whether the test prints this one
        finished = [r for r in printed if r.status != STATUS_FAILED]
        if len(finished) >= 2 and not any(metric in r.values for r in printed):
            seen = sorted({k for r in finished for k in r.values})
            return KlbisectError(f"--metric {metric}: {where} {sha[:12]} printed the labels "
                                 f"{', '.join(seen)} in {len(finished)} finished runs, never {metric}; pick one of "
                                 f"them (or leave --metric out: the {over_labels(ws.worse)} over labels)"
                                 + ("; a [label] with a space in it is not read as one: print labels without spaces, "
                                    "or set --metric-regex with a group named label" if " " in metric else ""),
                                 EXIT_USAGE)
    if cr.build_failed:
        b = ws.store.failed_build(build_key or "", sha) or {}
        full = _disk_full(ws, f"{where} {sha[:12]} does not build", b.get("log_path"))
        if full:
            return full
        hint = ("give it a longer --build-timeout" if b.get("note") == "build timed out"
                else build_fix_hint(build_key))
        return KlbisectError(f"{where} {sha[:12]} does not build ({b.get('note', 'failed')}); "
                             f"{hint} or pick another {which} commit; "
                             f"log: {b.get('log_path')}",
                             EXIT_NO_SIGNAL, detail=log_tail(b.get("log_path", "")))
    runs = ws.store.runs(probe_key, [sha]) if not cr.values and cr.crashes else []
    last = runs[-1] if runs else None
    if last and last.status == STATUS_NOTFOUND:
        crash_limit = min(crash_limit, cr.crashes)    # the shell's "command not found": no run will differ
    if probe_key.startswith("sglang:") and failed_launches(runs[-2:]) == 2 and \
            runs[-1].started >= runs[-2].started + (runs[-2].duration or 0.0):
        # a server that did not start twice in a row (one after the other: two at once may both
        # have waited on one slow first download): its arguments or environment, and each more
        # try costs up to --launch-timeout (a tester's never-ready server was launched six times)
        crash_limit = min(crash_limit, cr.crashes)
    if not cr.values and cr.crashes >= crash_limit:
        if last and last.status == STATUS_NOTFOUND:
            return KlbisectError(f"the probe command was not found (exit 127) at {where} "
                                 f"{sha[:12]}; check --probe-cmd; log: {last.log_path}", EXIT_PROBE_MISSING,
                                 detail=log_tail(last.log_path or ""))
        if last and last.status == STATUS_TIMEOUT:
            # a run that printed values and then hung is still cut short: its labels may be incomplete
            what = "printed values but did not finish" if last.values else "printed no metric value"
            return KlbisectError(f"{where} {sha[:12]} {what} in {cr.crashes} runs{note}, "
                                 f"the last stopped by --timeout after {_seconds(last.duration)} (a probe "
                             f"that ignores SIGTERM is killed 5 s later); raise "
                                 f"--timeout (the runs it cut short are then run again); log: {last.log_path}",
                                 EXIT_NO_SIGNAL, detail=log_tail(last.log_path or ""))
        tail = log_tail(last.log_path if last and last.log_path else "")
        missing = re.search(r"No module named '?([\w.]+)", tail)
        missing_module = missing.group(1) if missing else ""
        if missing_module == "sglang" and probe_key.startswith("sglang:"):
            hint = ("sglang is not importable by the --sglang-python interpreter: install it there (`klbisect "
                    "run --build sglang` installs each commit) or point --sglang-python at the one that has it")
        elif missing_module.startswith("sglang.") and probe_key.startswith("sglang:"):
            # sglang itself imports: this commit's own code does not (a tester's stale import was
            # told to install sglang)
            hint = (f"its server could not import {missing_module}: this commit's own sglang code fails to import "
                    f"(its server log's traceback says where)"
                    + (f"; pick a {which} commit whose server starts" if which in ("good", "bad") else ""))
        elif probe_key.startswith("cmd:") and missing_module and which != "good":
            # at the bad end (or a nightly head) the test exists: the commit's own code or the
            # probe's Python lacks the module
            hint = (f"the probe could not import {missing_module}: a package must be installed in the probe's "
                    "Python, or this commit's own code fails to import (then pick a bad commit where the test "
                    "runs)")
        elif probe_key.startswith("cmd:") and missing_module:
            hint = (f"the probe could not import {missing_module}: a test module newer than the good "
                    "commit must be copied outside the repository and --probe-cmd pointed at the copy; a package "
                    "must be installed in the probe's Python")
        elif probe_key.startswith("cmd:") and re.search(
                r"can't open file|No such file or directory|ERROR: file or directory not found|can't cd to", tail):
            # the usual cause: a KL test added after --good is not in that commit's checkout
            hint = ("the probe's own file is missing at both endpoints: check its path in --probe-cmd (it runs "
                    "from the checkout's root); a test newer than the good commit must be copied outside the "
                    "repository" if at_both else
                    "the probe's own file is missing there: a test newer than the good commit must be copied "
                    "outside the repository and --probe-cmd pointed at the copy")
        else:
            hint = no_value_hint(probe_key, metric_regex, tail)
        exc = last_exception(tail)
        recent = runs[-cr.crashes:]
        if metric and recent and all(r.status == STATUS_FAILED and r.values for r in recent):
            # a test that asserts in its loop over labels stopped on an earlier label every time
            return KlbisectError(f"--metric {metric}: {where} {sha[:12]} stopped on its own assertion before "
                                 f"printing {metric} in {cr.crashes} runs (it printed "
                                 f"{', '.join(sorted({k for r in recent for k in r.values}))}): there that label "
                                 "cannot be measured; pick a label the test prints before it asserts, or leave "
                                 f"--metric out (the {over_labels(ws.worse)} over labels); log: {last.log_path if last else '?'}",
                                 EXIT_NO_SIGNAL, detail=tail)
        if other and recent and all(r.status == STATUS_FAILED and r.values for r in recent):
            # a test that asserts in its loop over labels stopped every time short of a label that
            # sets the max (min) in complete runs: the max cannot be read here, a label alone can
            printed = {k for r in recent for k in r.values}
            theirs = ws.store.runs(probe_key, [other])
            missed = missed_worse(recent[-1], typical_values(theirs, usual_labels(theirs)), ws.worse) or ["a label"]
            pair = (other, sha) if which == "bad" else (sha, other)
            cfg = BisectConfig(worse=ws.worse, metric_regex=metric_regex)
            return KlbisectError(f"{where} {sha[:12]} stopped on its own assertion in {cr.crashes} runs, each "
                                 f"after {', '.join(sorted(printed))} and short of {missed[0]}, which reads "
                                 f"{'lower' if ws.worse == 'lower' else 'higher'} in complete runs: its "
                                 f"{over_labels(ws.worse)} over labels cannot be read there"
                                 f"{label_hint(ws, probe_key, *pair, cfg)}; log: {last.log_path if last else '?'}",
                                 EXIT_NO_SIGNAL)
        if any(r.values for r in recent):
            # values, then a crash short of the labels the other runs print: said as such
            return KlbisectError(f"{where} {sha[:12]} crashed part-way in {cr.crashes} runs: each printed some "
                                 "labels' values, then failed without an assertion before the rest (a run "
                                 "that fails its own assertion is measured); see why in the log: "
                                 f"{last.log_path if last else '?'}", EXIT_NO_SIGNAL, detail=tail)
        if exc and not missing_module and "can't open file" not in tail:
            # it crashed, and says why: a hint about unread values would mislead
            return KlbisectError(f"{where} {sha[:12]} crashed before printing a metric value in {cr.crashes} "
                                 f"runs{note}; the last ended on {exc}; log: "
                                 f"{last.log_path if last else '?'}", EXIT_NO_SIGNAL, detail=tail)
        if probe_key.startswith("sglang:") and last is not None and _log_says(last.log_path, "not ready after"):
            hint += ("; its server was not ready in time: if it is only slow (a first download, a compile), "
                     "raise --launch-timeout, and --timeout, which bounds the launch too")
        return KlbisectError(f"{where} {sha[:12]} printed no metric value in {cr.crashes} runs"
                             f"{note} ({hint}); log: "
                             f"{last.log_path if last else '?'}", EXIT_NO_SIGNAL, detail=tail)
    return None


def build_fix_hint(build_key: str | None) -> str:
    from .sglang import build_fix_hint as hint  # noqa: PLC0415 - the words depend on the builder
    return hint(build_key)


def no_value_hint(probe_key: str | None, metric_regex: str | None = None, log: str = "") -> str:
    from .sglang import no_value_hint as hint  # noqa: PLC0415 - --metric-regex is for --probe-cmd only
    return hint(probe_key, metric_regex, log)


NEVER_BUILT_LIMIT = 3  # failed builds, none ever good under this --build-cmd: the command is wrong


def _infrastructure_error(f: Failure) -> KlbisectError:
    """Three failures outside the probe at one commit: a full disk or a log
    folder klbisect may not write is storage (156), with what to do about it."""
    full = f.errno in (errno.ENOSPC, errno.EDQUOT) or any(
        t in f.error for t in ("No space left on device", "the disk is full"))
    denied = f.errno in (errno.EACCES, errno.EPERM, errno.EROFS) or any(
        t in f.error for t in ("Permission denied", "Read-only file system", "Operation not permitted"))
    fix = "free disk space, then " if full else "make the folder it names writable, then " if denied else ""
    return KlbisectError(f"probing {f.sha[:12]} failed 3 times for reasons outside the probe: {f.error}; "
                         f"finished runs are saved: {fix}rerun to resume",
                         EXIT_STORAGE if full or denied else EXIT_REPO_STATE)


def _disk_full(ws: Workspace, what: str, log_path: str | None) -> KlbisectError | None:
    """A build that failed on a full disk (its log often empty: it could not
    be written either) is the disk's failure, not the build command's."""
    if not gitrepo.nearly_full(ws.logs if ws.logs.exists() else ws.top):
        return None
    return KlbisectError(f"{what}: the disk is full (log: {log_path}); free disk space and rerun the same "
                         "command: the build is tried again and recorded runs are kept", EXIT_STORAGE)


def _never_built(ws: Workspace, build_key: str | None, log_path: str | None,
                 rerun: str = "rerun") -> KlbisectError | None:
    """A build command that has failed on every commit it was tried on.
    Endpoint runs reused from sessions with another --build-cmd skip the
    endpoint builds, so without this every interior commit would fail to
    build and the answer would be "one of N untestable commits"."""
    if not build_key:
        return None
    builds = ws.store.builds(build_key)
    if any(b["ok"] for b in builds) or len(builds) < NEVER_BUILT_LIMIT:
        return None
    tried = f"the build failed on all {len(builds)} commits it was tried on in this repository (any session)"
    full = _disk_full(ws, tried, log_path)
    if full:
        return full
    return KlbisectError(f"{tried} and has never "
                         f"succeeded here: {build_fix_hint(build_key)}, and {rerun}; log: {log_path}",
                         EXIT_NO_SIGNAL,
                         detail=log_tail(log_path or ""))


def _seconds(d: float | None) -> str:
    """A duration as a --timeout reads: 0.5 s stays 0.5 s, 1800 s stays whole."""
    d = d or 0.0
    return f"{d:.2g} s" if d < 0.1 else f"{d:.1f} s" if d < 10 else f"{d:.0f} s"


REBUILD_BATCH = 3   # endpoint runs a side per round when each switch of endpoint rebuilds


def calibrate_endpoints(ws: Workspace, cfg: BisectConfig, sid: int, good: str, bad: str, execute,
                        probe_key: str, build_key: str | None, progress: Progress, width: int = 1,
                        pooled: bool = True):
    """Probe both endpoints until the regression is confirmed and both sides
    are described well enough to judge other commits. Returns the model.
    ``width``: parallel slots, so each round asks for that many runs."""
    per_side = max(1, width // 2)
    before = commit_runs(ws, probe_key, build_key, [good, bad], cfg.timeout)
    limit = endpoint_crash_limit(cfg.crash_limit)

    def this_command(sha: str, now: CommitRuns) -> tuple[CommitRuns, str]:
        """An endpoint's runs as the crash checks read them. One with values from
        earlier commands but none from this one is judged on this command's runs
        alone: the environment broke, or --timeout was cut, since those values,
        and their count never grows, so the rounds would ask for more runs forever."""
        old = before[sha]
        if old.values and len(now.values) == len(old.values) and now.crashes > old.crashes:
            return (CommitRuns([], now.crashes - old.crashes, now.build_failed),
                    f" in this command (it printed {fmt_count(len(old.values), 'value')} in earlier ones: did "
                    "the environment or --timeout change?)")
        return since(now, old), ""

    def problem() -> KlbisectError | None:
        now = commit_runs(ws, probe_key, build_key, [good, bad], cfg.timeout)
        (g, g_note), (b, b_note) = this_command(good, now[good]), this_command(bad, now[bad])
        if not g.values and not b.values and min(g.crashes, b.crashes) >= (limit + 1) // 2:
            # neither endpoint has printed a value in half the limit each: the probe is
            # broken, not flaky (at a 15% crash rate this happens once in 100,000 starts)
            return _endpoint_problem(ws, "good", good, probe_key, build_key, g, 1,
                                     note=f"{g_note}, nor the bad endpoint in {b.crashes}",
                                     metric_regex=cfg.metric_regex, at_both=True)
        # runs that passed silently while every run with a value failed (pytest without -s) are
        # no flaky environment: the other side's silent passes do not buy this side more runs
        silent = bool(_silent_when_passing(ws, probe_key, [good, bad]))
        for which, sha, cr, note, other in (("good", good, g, g_note, b), ("bad", bad, b, b_note, g)):
            side_limit = endpoint_crash_limit(cfg.crash_limit, 0 if silent else other.crashes,
                                              other.crashes + len(other.values))
            err = _endpoint_problem(ws, which, sha, probe_key, build_key, cr, side_limit, note=note,
                                    metric_regex=cfg.metric_regex, other=bad if sha == good else good)
            if err:
                return err
        return None

    # an endpoint whose build failed in an earlier command is built once more
    # (the user may have fixed the environment, not the command)
    rebuild = [sha for sha in (good, bad) if before[sha].build_failed]
    while True:
        if rebuild:
            sha = rebuild.pop(0)
            progress(f"building the {'good' if sha == good else 'bad'} endpoint {sha[:12]} again: "
                     "its build failed in an earlier command")
            execute([sha])
            continue
        runs = commit_runs(ws, probe_key, build_key, [good, bad], cfg.timeout)
        g, b = runs[good], runs[bad]
        err = problem()
        if err:
            raise err
        need = []
        if cfg.threshold is not None:
            # the first --votes runs a side check the failure reproduces, as classic mode judges
            # a commit; at least MIN_ENDPOINT_RUNS a side then say how far a verdict can be trusted
            enough = max(cfg.votes, min(cfg.endpoint_runs, MIN_ENDPOINT_RUNS))
            if len(g.values) >= cfg.votes and len(b.values) >= cfg.votes:
                model = ThresholdModel(cfg.threshold, cfg.votes)
                vg = judge(g.values[:cfg.votes], 0, model, cfg.votes)
                vb = judge(b.values[:cfg.votes], 0, model, cfg.votes)
                if vg.decision == GOOD and vb.decision == BAD and min(len(g.values), len(b.values)) < enough:
                    need = [s for s, cr in ((good, g), (bad, b)) for _ in range(enough - len(cr.values))]
                elif vg.decision == GOOD and vb.decision == BAD:
                    model = model.with_rates(g.values, b.values)
                    up, down = model.verdict_log_lrs()
                    failed = (f"good failed {int(sum(model.fails(g.values)))}/{len(g.values)} runs, bad "
                              f"{int(sum(model.fails(b.values)))}/{len(b.values)}")
                    if up <= 0 or down >= 0:
                        raise KlbisectError(
                            f"at threshold {cfg.threshold:g} the endpoints fail alike ({failed}): a majority "
                            "verdict would say nothing; leave --threshold and --votes out to judge runs by their "
                            "values", EXIT_NO_SIGNAL)
                    progress(f"endpoints at threshold {cfg.threshold:g}: {failed}: a majority of {cfg.votes} that "
                             f"fails counts {math.exp(up):.3g}:1 for bad, one that passes {math.exp(-down):.3g}:1 "
                             "for good")
                    return model
                else:
                    raise KlbisectError(
                        f"the endpoints do not reproduce the failure at threshold {cfg.threshold:g}: "
                        f"good {_fmt_vals(g.values[:cfg.votes])} ({vg.decision}), bad "
                        f"{_fmt_vals(b.values[:cfg.votes])} ({vb.decision}); a flaky test's bad commit passes "
                        "some runs: leave --threshold and --votes out to judge runs by their values",
                        EXIT_NO_SIGNAL)
            else:
                need = [s for s, cr in ((good, g), (bad, b)) if len(cr.values) < cfg.votes]
        else:
            step = endpoint_step(g.values, b.values, cfg.endpoint_runs, cfg.max_endpoint_runs, pooled)
            sep = step.separation

            hint_of_labels = partial(label_hint, ws, probe_key, good, bad, cfg)
            finding = partial(label_finding, ws, probe_key, good, bad, cfg)
            if min(len(g.values), len(b.values)) >= cfg.endpoint_runs and all(map(broke, (*g.values, *b.values))):
                # the same at both ends, run after run: up to --max-endpoint-runs would say no more.
                # One label broken everywhere breaks the max over labels: the others may still tell.
                labelled = [r.values for r in ws.store.runs(probe_key, [good, bad]) if r.values]
                fine = sorted({k for v in labelled for k, x in v.items() if not broke(x)})
                if fine and not ws.metric:
                    dead = sorted({k for v in labelled for k in v} - set(fine))
                    raise NoDifference(
                        f"every run at both endpoints printed nan or inf on {', '.join(dead) or 'some label'}, so "
                        f"the {over_labels(ws.worse)} over labels is broken in each: rerun with --metric and one "
                        f"of the labels that print numbers ({', '.join(fine)})")
                raise NoDifference(
                    f"every run at both endpoints printed nan or inf ({len(g.values)}+{len(b.values)} runs, "
                    f"{ws.metric or 'the ' + over_labels(ws.worse) + ' over labels'}): numerics broke at the good "
                    "endpoint too, so nothing tells good from bad here; check the environment (driver, dtype, "
                    "model files) with a run of the good endpoint, or pick an older --good")
            spikes = worse_tail(g.values, b.values, cfg.worse) if step.action == "ready" and _goes_better(cfg, sep) \
                else 0
            if spikes and min(len(g.values), len(b.values)) < cfg.max_endpoint_runs:
                # the medians say "better", a bad run far past every good one says worse: the
                # medians' difference may be chance, and more runs tell which
                want = max(min(2 * OVERLAP_ENDPOINT_RUNS, cfg.max_endpoint_runs), min(len(g.values), len(b.values)) + 1)
                progress(f"the bad endpoint's runs sit {'higher' if sep.direction == 'up' else 'lower'} than the "
                         f"good one's (p={sep.p_value:.2g}), but {fmt_count(spikes, 'of its runs')} lie far past "
                         "every good run: measuring both further before calling it a fix")
                step = EndpointStep("more", max(want - len(g.values), 0), max(want - len(b.values), 0), sep)
            if step.action == "ready":
                _check_direction(cfg, sep, finding, spikes)
                hint = hint_of_labels() if sep.p_value > SEPARATION_P else ""
                if hint:
                    # the max only hints, one label is plain: a search on the max would be long, and
                    # on a move that small it named a wrong commit once in 13 (a tester's)
                    raise NoDifference(
                        f"good and bad only hint at a difference {_judged_on(ws)} (p={sep.p_value:.2g}): "
                        f"good {fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}" + hint)
                silent = _silent_when_passing(ws, probe_key, [good, bad])
                if silent:
                    progress(f"warning: {silent}")
                same = repeated_runs(g.values, b.values)
                if same:
                    progress(f"warning: {same}")
                model = Model.fit(g.values, b.values)
                # a search begun on a hint (OVERLAP_P) is no shown difference: a tester read
                # "endpoints differ" at p=0.19, and git bisect then spent 258 runs
                contact = (model.contact if sep.p_value <= SEPARATION_P else
                           f"only hint at a difference (p above {SEPARATION_P:g}), their runs overlapping")
                progress(f"endpoints {contact}: "
                         f"good {fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)} "
                         f"(p={sep.p_value:.2g}, {model.effect:.1f} spreads apart"
                         f"{'' if model.decisive else '; ' + model.regime})")
                clear = "" if model.separates else clearer_label(ws, probe_key, good, bad, cfg, sep.p_value)[1]
                if clear:
                    progress(f"note: {clear}: stop (Ctrl-C) and rerun with it")
                return model
            if step.action == "more" and min(len(g.values), len(b.values)) >= DECISIVE_RUNS \
                    and sep is not None and sep.p_value > OVERLAP_P:
                # one label plain while the max (or min) over labels shows nothing: the runs up
                # to --max-endpoint-runs would not change what to do (rerun with --metric)
                hint = hint_of_labels()
                if hint:
                    # "at most 40 a side" was in the progress line: a tester read the stop at 10 as broken
                    raise NoDifference(
                        f"good and bad do not differ {_judged_on(ws)} after {len(g.values)}+"
                        f"{len(b.values)} runs (p={sep.p_value:.2g}; stopped short of --max-endpoint-runs "
                        f"{cfg.max_endpoint_runs}, since one label shows what more runs would "
                        f"not): good {fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}" + hint)
            if step.action == "fail":
                raise NoDifference(
                    f"good and bad do not separate after {len(g.values)}+{len(b.values)} runs "
                    f"(p={sep.p_value:.2g}): good {fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}; "
                    "the regression does not reproduce at these endpoints, or needs more runs "
                    "(--max-endpoint-runs)" + _spikes_note(g.values, b.values, cfg.worse) + hint_of_labels(weak=True)
                    + _unbuilt_sglang_hint(ws, cfg)
                    + "".join(f"; {n}" for n in (ended_on_errors(ws.store.runs(probe_key, [sha]), f"the {end} endpoint")
                                                 for sha, end in ((good, "good"), (bad, "bad"))) if n))
            # Spare slots measure the endpoints in parallel; alternate them so an
            # interrupted calibration leaves both sides measured alike. One slot
            # takes each endpoint's runs together: alternating there would check out
            # and rebuild the other endpoint, or relaunch its server, before every run.
            ng, nb = (max(m, per_side) if m else 0 for m in (step.more_good, step.more_bad))
            if width == 1 and (cfg.build_cmd or cfg.build or cfg.probe == "sglang"):
                # a few runs a side per round, the endpoint built last first: one rebuild per
                # round instead of two for every pair of runs
                ng, nb = (min(max(n, REBUILD_BATCH), max(cfg.max_endpoint_runs - len(cr.values), n)) if n else 0
                          for n, cr in ((ng, g), (nb, b)))
                last = [r.sha for r in ws.store.session_runs(sid) if r.sha in (good, bad)][-1:]
                need = [bad] * nb + [good] * ng if last == [bad] else [good] * ng + [bad] * nb
            else:
                need = [sha for i in range(max(ng, nb)) for sha, n in ((good, ng), (bad, nb)) if i < n]
        # the batch fits in what is left of an endpoint's runs and of --max-total-runs (a
        # wide --parallel would otherwise ask hundreds of runs of each endpoint at once)
        spent = len(ws.store.session_runs(sid))
        room = cfg.max_total_runs - spent
        if room <= 0:
            raise KlbisectError(f"stopped at --max-total-runs {cfg.max_total_runs} while calibrating the endpoints "
                                f"({len(g.values)}+{len(b.values)} values so far): raise it (it counts endpoint "
                                "runs too) and rerun the same command; runs are kept", EXIT_NOT_SURE)
        if cfg.threshold is None:
            left = {sha: max(cfg.max_endpoint_runs - len(cr.values), 1) for sha, cr in ((good, g), (bad, b))}
            need = [s for i, s in enumerate(need) if need[:i].count(s) < left[s]]
        need = need[:room]
        so_far = ""
        if cfg.threshold is None and step.separation is not None:
            # one run a side at a time can go on for a while: say where it stands
            so_far = (f"; {len(g.values)}+{len(b.values)} so far, p={step.separation.p_value:.2g}, "
                      f"at most {cfg.max_endpoint_runs} a side")
        for sha in dict.fromkeys(need):
            progress(f"calibrating {'good' if sha == good else 'bad'} endpoint {sha[:12]} "
                     f"({need.count(sha)} run{'s' if need.count(sha) > 1 else ''}{so_far})")
        # a batch stops early once an endpoint cannot be measured (a failed build, a
        # broken probe, a missing --metric): each run of a real probe costs minutes
        execute(need, lambda: problem() is not None)


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


def _silent_when_passing(ws: Workspace, probe_key: str, shas: list[str]) -> str:
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


def _judged_on(ws: Workspace) -> str:
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
    out: dict[str, list[float]] = {}
    for r in runs:
        if r.sha == sha and r.status in MEASURED:
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
                  p_over: float) -> tuple[str, str]:
    """A label that moved the worse way and separates the endpoints far
    more clearly than the max (min) over labels, which they differ on only
    a little (p_over): a bisect of the max over runs that overlap takes
    hundreds of runs where that label alone takes dozens (a tester's: 510
    runs and 85% right, against 49 and 100% with --metric). (label, a note
    on it), or ("", "")."""
    if not _labels_offered(ws, cfg):
        return "", ""
    stored = ws.store.runs(probe_key, [good, bad])
    on_good, on_bad = _by_label(stored, good), _by_label(stored, bad)
    apart = labels_apart(on_good, on_bad) if len(on_good) > 1 else []
    if not apart or apart[0][1] * CLEARER_LABEL > p_over:
        return "", ""
    lab, p = apart[0]
    moved = _moved(on_good, on_bad, lab)
    if cfg.worse not in ("either", moved):
        return "", ""
    return lab, (f"label {lab} alone separates the endpoints far more clearly (p={p:.2g}, against p={p_over:.2g} "
                 f"for the {over_labels(ws.worse)} over labels): --metric {shlex.quote(lab)} would need fewer runs, "
                 "and reuses these")


def ended_on_errors(runs: list, where: str) -> str:
    """A note when every run that printed values then failed without an
    assertion of its own (a server that died mid-test): with no run that
    finished, nothing shows which labels it never reached, so their
    values are missing from its max unnoticed. "" otherwise."""
    valued = [r for r in runs if r.values and r.status in MEASURED]
    if len(valued) < 2 or any(r.exit_code == 0 or r.status == STATUS_FAILED for r in valued):
        return ""
    exc = last_exception(log_tail(valued[-1].log_path or "")) if valued[-1].log_path else None
    return (f"every run of {where} that printed values then failed without an assertion of its own"
            f"{f' (the last on {exc})' if exc else ''}: labels a run never reached are missing from its "
            f"values, and no run finished to show which; see {valued[-1].log_path}")


def _fmt_vals(vals: list[float]) -> str:
    return "[" + ", ".join(fmt_value(v) for v in vals[:12]) + (", ..." if len(vals) > 12 else "") + "]"


# ---- the result -----------------------------------------------------------------

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

    def to_json(self) -> dict:
        return asdict(self)


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
                 reason: str, probe_key: str, build_key: str | None) -> Result:
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
    info = []
    for i in top.indices:
        sha, subj, pr = cands[i]
        why = "untestable: build failed" if (build_key and ws.store.failed_build(build_key, sha)) else (
            "untestable: every run crashed" if pl.untestable[i] else "first bad")
        info.append({"sha": sha, "subject": subj, "pr": pr, "why": why})
    sess_runs = ws.store.session_runs(sid)
    builds = [b for b in ws.store.builds(build_key)] if build_key else []
    sess_row = ws.store.session(sid)
    session_start, sess_cfg = sess_row.created, sess_row.config or {}
    top_list = [{"candidates": [shas[i] for i in b.indices], "mass": b.mass} for b in post.top_blocks(5)]
    single = len(block) == 1
    notes = _kernel_notes(ws, [cands[i] for i in top.indices], build_key)
    notes += _step_notes(runs, shas, sides, ws.metric is None and len(labels) > 1)
    whole = float(post.p_first_bad[top.indices].sum())
    first_parent = bool(sess_cfg.get("first_parent", True))
    if complete and whole < float(sess_cfg.get("confidence", 0.99)):
        # the integrated search may answer on its counts' channel with the
        # values' evidence discounted (search.tempered): say what all runs give
        notes.append(f"all runs weighed together give this answer {whole:.3f}; it reached {top.mass:.4f} with the "
                     "values' evidence discounted and the runs far outside both sides counted (docs/statistics.rst), "
                     "so the 'top' masses differ from the confidence")
    if single and not first_parent:
        notes += _order_notes(ws, cands, top.last, {r.sha for r in runs})
    if single and first_parent:
        side = gitrepo.side_commits(ws.repo, first[0], cands[0][0])
        if side:
            notes.append(f"{first[0][:12]} is a merge that brings in {fmt_count(side, 'commit')} of a side branch; "
                         "any of them may be the cause: rerun with --all-commits to search them too (the runs "
                         "so far are kept)")
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


def _step_notes(runs, shas: list[str], sides, max_over_labels: bool) -> list[str]:
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


# ---- run: the self-driving bisect ---------------------------------------------

CANARY_STREAK = 6     # runs crashed in a row ...
CANARY_COMMITS = 3    # ... at this many commits: check the environment on the good endpoint

def run_bisect(path: str | Path | None, cfg: BisectConfig, progress: Progress = _stderr,
               executor_factory=None, check_reused: bool = True) -> Result:
    """Find the first bad commit between cfg.good and cfg.bad without touching
    the user's checkout. Resumes an interrupted run of the same question.
    ``check_reused``: measure again the reused commits an answer leans on
    (``_reused_boundary``); the nightly job judges its environment itself."""
    cfg.validate()
    ws = Workspace(path, cfg.metric, cfg.worse)
    try:
        # refused before the state directory is made: a typo leaves nothing behind
        good, bad = gitrepo.check_range(ws.repo, cfg.good, cfg.bad)
        with ws.locked():
            return _run_locked(ws, cfg, good, bad, progress, executor_factory, check_reused)
    finally:
        ws.close()


def _fresh_origin(st: Store, good: str, bad: str, probe_key: str, cfg: BisectConfig) -> SessionRow | None:
    """The --fresh git bisect of this range and question that is the latest
    session here (active, or just reset), whose runs a `run --fresh` counts:
    status and probe send the user of a doubted or stalled answer to that
    command, and its runs are of the new environment too."""
    last = st.latest_session(("run", "gitbisect", "calibrate", "nightly"))
    if (last is not None and last.kind == "gitbisect" and last.config.get("fresh")
            and (last.good, last.bad, last.probe_key) == (good, bad, probe_key)
            and _question_of(last.config) == cfg.question()):
        return st.session(last.config["fresh_from"]) if last.config.get("fresh_from") else last
    return None


def _run_locked(ws: Workspace, cfg: BisectConfig, good: str, bad: str, progress: Progress, executor_factory,
                check_reused: bool = True) -> Result:
    first_build = ws.store.last_build_id()     # the builds after it are this command's
    cands = [(c.sha, c.subject, c.pr) for c in gitrepo.candidates(ws.repo, good, bad, cfg.first_parent)]
    shas = [c[0] for c in cands]
    probe, builder = make_probe(cfg), make_builder(cfg)
    probe_key, build_key = probe.key, (builder.key if builder else None)
    st = ws.store
    dirty = gitrepo.dirty_files(ws.repo)
    if dirty:
        # a probe edited in place and never committed: its edit is in no worktree
        progress(f"note: uncommitted changes to {gitrepo.describe_dirty(ws.repo, dirty)} are in "
                 "no run: klbisect measures the commits themselves, in worktrees (commit them, or copy a probe "
                 "you changed outside the repository)")
    # Ray assigns GPUs on its nodes: this machine's GPUs matter only locally. Too few is refused
    # before a session is recorded (a tester's every later run "resuming session 1: 0 runs")
    moved = pins_moved(ws.repo, cfg, builder, good, bad)
    slots = make_slots(ws.worktrees, _slots_for(cfg, moved, progress),
                       cfg.gpus_per_probe if cfg.executor == "local" else 0, pid_dir=ws.pids)
    if cfg.executor == "ray" and executor_factory is None:
        from .ray_executor import RayExecutor  # noqa: PLC0415 - imports no Ray
        RayExecutor.refuse_missing_gpus(cfg)
    # --fresh starts a session of its own; a later rerun without it resumes that one, and so
    # does the same command with it while that session is unfinished: "interrupted; rerun
    # the same command" must not leave out the runs it just saved (as `calibrate --fresh`)
    prev = st.find_session("run", good, bad, probe_key, cfg.question(), RERUN_KEYS)
    if cfg.fresh and prev is not None:
        if prev.config.get("fresh") and prev.state != "done":
            progress(f"--fresh: resuming the unfinished --fresh session {prev.id}, whose runs count "
                     "(`klbisect reset` first to leave them out too)")
        else:
            prev = None
    if prev and prev.state == "done" and prev.result:
        done = Result(**prev.result)
        # an answer left as a block by failed builds is worth one more build each:
        # the user who reruns it may have fixed what broke them
        unbuilt = [i["sha"] for i in done.candidate_info if i["why"] == "untestable: build failed"]
        # runs recorded since it finished (a git bisect of the same range, whose answer
        # status doubted and sent the user here) are weighed with its own
        # (a finished run keeps no end time: its last run's start stands for it)
        finished_at = max(prev.ended or 0.0, st.last_touched(prev))
        newer = sum(1 for r in st.runs(probe_key, shas) if r.session_id != prev.id and r.started > finished_at)
        # (with no room left under --max-total-runs a reopened block could only fall apart unmeasured)
        room = len(st.session_runs(prev.id)) < cfg.max_total_runs
        if not (build_key and len(done.candidates) > 1 and unbuilt and room) and not newer:
            progress(f"this bisect already finished (session {prev.id}); showing its result")
            return done
        if newer:
            progress(f"session {prev.id} finished before {fmt_count(newer, 'run')} since recorded in this range: "
                     "weighing them with its own")
        else:
            progress(f"session {prev.id} ended on {len(done.candidates)} commits that cannot be told apart; "
                     f"building the {len(unbuilt)} whose build failed once more, as the search needs")
        st.update_session(prev.id, state="bisecting")
        prev = st.session(prev.id)
    fresh_from = _fresh_origin(st, good, bad, probe_key, cfg) if cfg.fresh else None
    if prev:
        sid = prev.id
        progress(f"resuming session {sid}: {len(st.session_runs(sid))} runs already recorded")
        cfg.fresh = bool(prev.config.get("fresh"))
        fresh_from = prev.config.get("fresh_from")
        st.update_session(sid, config={**cfg.stored(), **({"fresh_from": fresh_from} if fresh_from else {})})
        ws.use_session(st.session(sid))
        if st.get(_stop_key(sid)):
            st.put(_stop_key(sid), "")
    else:
        sid = st.create_session("run", good, bad, probe_key,
                                {**cfg.stored(), **({"fresh_from": fresh_from.id} if fresh_from else {})}, cands)
        ws.use_session(st.session(sid))
        if fresh_from is not None:
            progress(f"--fresh: counting the runs since session {fresh_from.id} (a --fresh git bisect of this "
                     f"range) began: {fmt_count(len(st.session_runs(fresh_from.id)), 'run')} of its own")
        say_reused(ws, probe_key, shas, cfg.timeout, progress)
    progress(f"{fmt_count(len(shas) - 1, 'candidate commit')} between {good[:12]} and {bad[:12]}; probe: {probe.describe()}")

    log_dir = ws.logs / f"s{sid}"
    hold_env(ws, sid, builder, log_dir)
    warn_build_paths(ws.repo, builder, good, bad, progress)
    measurer = Measurer(ws.repo, probe, builder, log_dir, use_worktree=True,
                        on_build=say_building(progress))
    ex = (executor_factory(cfg, slots, measurer, ws) if executor_factory
          else _default_executor(cfg, slots, measurer, ws, take_turns=bool(moved)))
    slot_by_index = {s.index: s for s in slots}
    failures: dict[str, int] = {}
    streak: list[str] = []    # the commits of the runs that crashed in a row, latest last
    label_sets: dict[frozenset, list[int]] = {}   # the label sets runs printed: usual_labels, as they come
    searching = False   # set once the endpoints are calibrated (handle reads it when called)

    def handle(results) -> None:
        for r in results:
            if isinstance(r, Failure):
                failures[r.sha] = failures.get(r.sha, 0) + 1
                progress(f"infrastructure failure on {r.sha[:12]} (slot {r.slot}): {r.error}")
                if failures[r.sha] >= 3 and r.outcome is not None:
                    # killed by a signal at this commit every time: its own doing (the OOM
                    # killer, a `timeout -s KILL` wrapper), so a crash of the commit, not a
                    # reason to stop the search for good
                    progress(f"  {r.sha[:12]}: killed {failures[r.sha]} times: counted as this commit's crash")
                    r = r.outcome
                else:
                    if failures[r.sha] >= 3:
                        raise _infrastructure_error(r)
                    continue
            run = record(ws, sid, probe_key, build_key, r, Path(r.checkout) if r.checkout
                         else slot_by_index[r.slot].checkout if r.slot in slot_by_index else Path("?"))
            if r.build is not None:
                _keep_env(ws, sid, builder)   # the pinned wheels this build changed, for a restore after a kill
            i = shas.index(r.sha)
            if r.build_failed:
                progress(f"[{i}/{len(shas) - 1}] {r.sha[:12]} build failed: untestable ({r.build.log_path})")
                # builds failing commit after commit look like crashes: a broken environment
                # (the canary rebuilds the good endpoint, and one that no longer builds stops it)
                streak.append(r.sha)
                err = _never_built(ws, build_key, r.build.log_path)
                if err:
                    raise err
                if searching and i in (0, len(shas) - 1):
                    # its runs are from before; the search would ask it again and again (a
                    # tester's resumed nightly rebuilt one 3,000 times with a broken PATH)
                    which = "good" if i == 0 else "bad"
                    raise KlbisectError(f"the {which} endpoint {r.sha[:12]} does not build now, though its runs "
                                        "were measured before: the build command or the environment changed "
                                        f"since; fix it and rerun the same command (runs so far are kept); log: "
                                        f"{r.build.log_path}", EXIT_NO_SIGNAL,
                                        detail=log_tail(r.build.log_path or ""))
            elif run is not None:
                usual = usual_labels([run], label_sets)
                # only a run its own assertion stopped short is judged by the others' typical values
                short = ws.metric is None and run.status == STATUS_FAILED and frozenset(run.values) < usual
                typical = typical_values(st.runs(probe_key, [good, bad, run.sha]), usual) if short else None
                shown, crashed = run_shown(run, usual, ws.metric, typical, ws.worse)
                progress(f"[{i}/{len(shas) - 1}] {r.sha[:12]} run: {shown}  ({run.duration:.1f}s)")
                streak[:] = streak + [r.sha] if crashed else []

    def execute(batch: list[str], stop=None) -> None:
        """Run one measurement for each sha in batch, as slots allow; when
        ``stop()`` turns true, submit no more (runs in flight finish)."""
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
            handle(ex.wait())
            if stop is not None and todo and stop():
                todo.clear()

    def canary(sha: str) -> None:
        """Many crashes in a row across commits: untestable commits, or the
        environment broke (a lost GPU, a full disk) and every run from now on
        will crash. One run of the good endpoint, which printed values, tells
        them apart before the search spends its budget on crashes."""
        n = len(streak)
        progress(f"the last {n} runs crashed (or builds failed) at {len(set(streak))} commits: running the good "
                 f"endpoint {sha[:12]} once to check the environment")
        execute([sha])
        last = ws.store.runs(probe_key, [sha])[-1:]
        if last and (last[0].value is None or last[0].status == STATUS_TIMEOUT):
            raise KlbisectError(
                f"the environment broke mid-search: the last {n} runs crashed, and so did the good endpoint "
                f"{sha[:12]}, which printed values before (see {last[0].log_path}); fix it and rerun the "
                "same command: finished runs are kept and crashed commits get fresh runs", EXIT_NO_SIGNAL)
        streak.clear()

    try:
        if prev and prev.model and prev.state == "bisecting":
            model = _model_from(prev.model)
        else:
            model = calibrate_endpoints(ws, cfg, sid, good, bad, execute, probe_key, build_key, progress,
                                        width=ex.slots)
            st.update_session(sid, model=model.to_dict(), state="bisecting")
        before = commit_runs(ws, probe_key, build_key, shas, cfg.timeout)
        searching = True
        look_at = CLEARER_LOOK      # session runs at which an overlapping search looks at the labels again
        # builds that failed in an earlier command stand until the answer is a block they make:
        # then each is built once more (a resumed run rebuilt every one first, a tester's minutes each)
        rebuilding = False
        while True:
            runs = commit_runs(ws, probe_key, build_key, shas, cfg.timeout,
                               failed_after=first_build if rebuilding else 0)
            commits = [since(runs[s], before[s]) for s in shas]
            pending = [shas.index(s) for s in ex.in_flight()]
            pl = plan(commits, model, cfg.confidence, k=max(ex.free(), 1), max_runs=cfg.max_runs,
                      crash_limit=cfg.crash_limit, pending=pending, max_endpoint_runs=cfg.max_endpoint_runs)
            total = len(st.session_runs(sid))
            if pl.integrated and total >= look_at:
                # the endpoints' runs grow as the search goes: a label that stands out
                # now is worth a note, once
                clear = clearer_label(ws, probe_key, good, bad, cfg,
                                      separation(commits[0].values, commits[-1].values).p_value)[1]
                look_at = math.inf if clear else 2 * look_at
                if clear:
                    progress(f"note: {clear}: stop (Ctrl-C) and rerun with it")
            # (a search left to widen its endpoints is out of commits too: a reviewer's old failures
            # waited for both endpoints' --max-endpoint-runs)
            if not rebuilding and not ex.in_flight() and (pl.done or not pl.next or pl.widening) \
                    and total < cfg.max_total_runs:
                # (at --max-total-runs the block stands as it is: no room to build and measure)
                old = _failed_before(ws, build_key, shas, runs,
                                     pl.done.indices if pl.done else range(1, len(shas) - 1), first_build)
                if old and (not pl.done or len(pl.done.indices) > 1):
                    rebuilding = True
                    progress(f"the answer is held up by {fmt_count(len(old), 'commit')} whose build failed in "
                             f"an earlier command ({', '.join(s[:12] for s in old[:3])}"
                             f"{', ...' if len(old) > 3 else ''}): building {'it' if len(old) == 1 else 'them'} "
                             "once more, as the search needs")
                    continue
            if pl.done and not ex.in_flight():
                recheck = (_reused_boundary(ws, sid, probe_key, shas, pl.done, pl.model, cfg.timeout)
                           if check_reused else [])
                room = max(cfg.max_total_runs - total, 0)
                if not recheck:
                    break
                if not room:
                    # an answer that leans on earlier sessions' runs unchecked is no answer (a tester's
                    # --max-total-runs 1 measured one side and exited 0, "confidence reached")
                    return _finish(ws, sid, cands, pl, False,
                                   f"stopped at --max-total-runs {cfg.max_total_runs} before the check of the "
                                   f"earlier sessions' runs the answer leans on ({fmt_count(len(set(recheck)), 'commit')} "
                                   "to measure in this one): a higher --max-total-runs finishes it",
                                   probe_key, build_key, progress)
                for i in dict.fromkeys(recheck[:min(ex.free(), room)]):
                    progress(f"checking {shas[i][:12]} ({i}/{len(shas) - 1}): the answer leans on its runs "
                             "from earlier sessions; measuring it in this one")
                for i in recheck[:min(ex.free(), room)]:
                    ex.submit(shas[i])
                handle(ex.wait())
                continue
            if pl.lost is not None and not pl.done and not ex.in_flight():
                sep = pl.lost
                raise NoDifference(
                    f"good and bad no longer differ after {sep.good['n']}+{sep.bad['n']} endpoint runs "
                    f"(p={sep.p_value:.2g}; the search began on a hint at p <= 0.2): good "
                    f"{fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}; there is no regression between "
                    "these endpoints to find, or it is too small to bisect; runs are kept"
                    + label_hint(ws, probe_key, good, bad, cfg, weak=True)
                    + _unbuilt_sglang_hint(ws, cfg))
            if not pl.done and total >= cfg.max_total_runs and not ex.in_flight():
                pl_reason = f"stopped at --max-total-runs {cfg.max_total_runs}" + (
                    _capped_note(pl, shas) or "; the same command with a higher --max-total-runs goes on from here "
                                              "(the runs so far are kept)")
                return _finish(ws, sid, cands, pl, False, pl_reason, probe_key, build_key, progress)
            if not pl.done and not pl.next and not ex.in_flight():
                why = ("no commit left whose runs could raise the confidence (all exhausted or untestable)"
                       + _capped_note(pl, shas)
                       + ("; at this threshold a majority verdict carries little evidence (the bad endpoint passes "
                          "often): leave --threshold and --votes out to judge runs by their values"
                          if isinstance(pl.model, ThresholdModel) and pl.model.fail_bad is not None
                          and pl.model.verdict_log_lrs()[0] < math.log(VERDICT_LR) else "")
                       if pl.unproven is None else
                       f"the answer is every commit in the range, and the endpoints still do not differ at "
                       f"p <= {1 - cfg.confidence:.2g} after {pl.unproven.good['n']}+{pl.unproven.bad['n']} runs "
                       f"(p={pl.unproven.p_value:.2g}): there may be no regression here")
                return _finish(ws, sid, cands, pl, False, why, probe_key, build_key, progress)
            top = pl.posterior.top()
            room = max(cfg.max_total_runs - total - len(ex.in_flight()), 0)
            if pl.next and ex.free() and not pl.done and room:
                for i in pl.next[:min(ex.free(), room)]:
                    progress(f"probing {shas[i][:12]} ({i}/{len(shas) - 1}, P(bad)={pl.posterior.p_bad[i]:.3f}; "
                             f"best guess {shas[top.last][:12]} at {top.mass:.3f})")
                    ex.submit(shas[i])
            handle(ex.wait())
            if len(streak) >= CANARY_STREAK and len(set(streak)) >= CANARY_COMMITS:
                canary(good)
        reason = "confidence reached"
        return _finish(ws, sid, cands, pl, True, reason, probe_key, build_key, progress)
    except KeyboardInterrupt as e:
        ex.close()
        _note_stop(st, sid, "interrupted; rerun the same command to resume")
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
        _note_stop(st, sid, e.message)
        raise
    finally:
        ex.close()
        close = getattr(probe, "close", None)
        if close:
            close()
        # a killed run of more slots left more of the pool behind (each may hold a build)
        stale = sorted(ws.worktrees.glob("slot-*")) if ws.worktrees.exists() else []
        for checkout in dict.fromkeys([s.checkout for s in slots] + list(getattr(ex, "checkouts", list)()) + stale):
            if checkout.exists():
                gitrepo.worktree_remove(ws.repo, checkout)
        close_builder(builder, progress, ws, sid)


def _stop_key(sid: int) -> str:
    return f"stopped:{sid}"


def _checkout_key(sid: int) -> str:
    return f"checkout:{sid}"


def _worktree_key(sid: int) -> str:
    return f"worktree:{sid}"


def _note_checkout(ws: Workspace, sid: int) -> None:
    ws.store.put(_checkout_key(sid), str(ws.top))
    ws.store.put(_worktree_key(sid), gitrepo.worktree_id(ws.repo))


def _bisect_key(sid: int) -> str:
    return f"bisect:{sid}"


def _own_bisect(ws: Workspace, sess: SessionRow, repo=None) -> bool:
    """Whether the git bisect in progress in ``repo`` (default: the asking
    checkout) is the one this `klbisect start` session began: after a
    `git bisect reset` by hand, a bisect the user starts is theirs (a
    tester's was judged by the old session's rule, then ended by `klbisect
    reset`)."""
    now = gitrepo.bisect_id(ws.repo if repo is None else repo)
    began = ws.store.get(_bisect_key(sess.id))
    # none stored: a session from before bisects were told apart; "inode:mtime": an earlier build's id
    return now is not None and (not began or ":" in began or began == now)


def _bisect_checkout(ws: Workspace, sess: SessionRow):
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
    top = ws.store.get(_checkout_key(sess.id))
    wid = ws.store.get(_worktree_key(sess.id))
    if wid is None:     # a session started before worktrees were known by name
        return Path(top) if top and Path(top) != ws.top else None
    if wid == gitrepo.worktree_id(ws.repo):
        if top != str(ws.top):
            ws.store.put(_checkout_key(sess.id), str(ws.top))
        return None
    return (gitrepo.worktree_path(ws.repo, wid) if wid else None) or Path(top or wid)


def stop_reason(st: Store, sid: int) -> str | None:
    """Why a session stopped short, if it did (and has not gone on since)."""
    return st.get(_stop_key(sid)) or None


def _note_stop(st: Store, sid: int, why: str) -> None:
    """Why a session stopped short, for `status` (cleared when it goes on)."""
    try:
        st.put(_stop_key(sid), why)
    except KlbisectError:
        pass    # the state itself failed (a full disk): the error being raised says so


def warn_build_paths(repo, builder, good: str, bad: str, progress: Progress) -> None:
    """A --build-cmd whose --build-paths match no file that differs between
    the endpoints builds once per checkout and measures every commit on
    that build: said before the first run, not after 80 runs that 'do not
    separate' (a tester's build copied a file the default paths miss)."""
    if not isinstance(builder, CommandBuilder):
        return
    changed = gitrepo.changed_files(repo, good, bad)
    # a file that changes inside the range and back is rebuilt for all the same (a tester's was)
    if changed and not builder.needs_build(changed) and not builder.needs_build(
            gitrepo.files_touched(repo, good, bad)):
        progress(f"warning: --build-cmd runs only where a file matching --build-paths ({', '.join(builder.paths)}) "
                 f"changed, and none changes between the endpoints ({fmt_count(len(changed), 'file')} do, e.g. "
                 f"{changed[0]}): every commit will be measured on the first build; if the build reads other "
                 "files, add them to --build-paths")


def pins_moved(repo, cfg: BisectConfig, builder, good: str, bad: str) -> str:
    """Where --build sglang meets a range whose commits pin different kernel
    wheels, with --parallel: "SHA (name old -> new, ...)"; else "". The
    wheels go into the one Python that slots (or a Ray node's tasks) share,
    and a slot whose own checkout needs no build would probe with the wheel
    another had just installed."""
    if cfg.parallel <= 1 or not getattr(builder, "install_pins", False):
        return ""
    from .sglang import PYPROJECT, parse_pins  # noqa: PLC0415
    first = parse_pins(gitrepo.show_file(repo, good, PYPROJECT))
    for sha in gitrepo.touching(repo, good, bad, PYPROJECT):
        pins = parse_pins(gitrepo.show_file(repo, sha, PYPROJECT))
        if pins != first:
            return f"{sha[:12]} (" + ", ".join(f"{n} {first.get(n) or 'unpinned'} -> {pins.get(n) or 'unpinned'}"
                                               for n in sorted(set(first) | set(pins))
                                               if first.get(n) != pins.get(n)) + ")"
    return ""


def _slots_for(cfg: BisectConfig, moved: str, progress: Progress) -> int:
    """--parallel's slots, or one locally when the pinned wheels move
    (``pins_moved``); on Ray a node's tasks take turns instead."""
    if not moved:
        return cfg.parallel
    if cfg.executor == "ray":
        progress(f"note: with --build sglang the range's pinned wheels change at {moved}, and the tasks on one "
                 "Ray node share its Python: they take turns there (nodes still run in parallel)")
        return cfg.parallel
    progress(f"note: --parallel {cfg.parallel} with --build sglang, but the range's pinned wheels change "
             f"at {moved} and the slots share one Python, so one slot could probe with "
             "another's wheel: running one slot (bisect each side of that commit in parallel, or give "
             "each its own interpreter)")
    return 1


def slots_for_pins(repo, cfg: BisectConfig, builder, good: str, bad: str, progress: Progress) -> int:
    """_slots_for over pins_moved."""
    return _slots_for(cfg, pins_moved(repo, cfg, builder, good, bad), progress)


def _default_executor(cfg: BisectConfig, slots: list[Slot], measurer: Measurer, ws: Workspace,
                      take_turns: bool = False):
    if cfg.executor == "ray":
        from .ray_executor import RayExecutor  # noqa: PLC0415 - optional extra
        return RayExecutor.from_config(cfg, ws, measurer, take_turns=take_turns)
    # spare checkouts keep built the few commits a search revisits from whichever slot is free;
    # one slot keeps its one worktree, built incrementally from commit to commit
    return LocalExecutor(slots, measurer.measure, spare_checkouts=len(slots) + 1 if len(slots) > 1 else 0)


def _capped_note(pl, shas: list[str]) -> str:
    """Why more runs could not settle it, where the per-commit cap is the
    limit: the commits the likeliest answer rests on hold all the runs they
    may get (a tester's --max-total-runs advice, where --max-runs was it)."""
    if not pl.held:
        return ""
    which = " and ".join(shas[i][:12] for i in pl.held)
    return (f"; {which}, which the likeliest answer rests on, {'hold' if len(pl.held) > 1 else 'holds'} all the "
            f"runs a commit may get ({pl.held_cap}): rerun with a higher --max-runs (e.g. {2 * pl.held_cap}) to "
            f"measure {'them' if len(pl.held) > 1 else 'it'} more; the runs so far are kept")


def _finish(ws, sid, cands, pl, complete, reason, probe_key, build_key, progress) -> Result:
    res = build_result(ws, sid, cands, pl, complete, reason, probe_key, build_key)
    ws.store.update_session(sid, result=res.to_json(), state="done" if complete else "bisecting",
                            model=pl.model.to_dict())
    return res


# ---- git bisect: start, probe ---------------------------------------------------

def start(path: str | Path | None, cfg: BisectConfig, progress: Progress = _stderr) -> dict:
    """Calibrate the endpoints (in a worktree, leaving the user's tree alone),
    then `git bisect start --first-parent`. Returns what git printed."""
    cfg.validate()
    ws = Workspace(path, cfg.metric, cfg.worse)
    try:
        good, bad = gitrepo.check_range(ws.repo, cfg.good, cfg.bad)   # before the state directory is made
        with ws.locked():
            active = ws.store.active_session("gitbisect")
            if (active and active.state == "bisecting" and active.model is not None
                    and _asks(active, good, bad, cfg)
                    and not (cfg.fresh and not active.config.get("fresh"))
                    and gitrepo.bisect_in_progress(ws.repo)
                    and ws.store.get(_bisect_key(active.id)) == gitrepo.bisect_id(ws.repo)
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
                    and (not _asks(active, good, bad, cfg)
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
            if active and not _asks(active, good, bad, cfg):
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
                if ws.store.get(_stop_key(sid)):
                    ws.store.put(_stop_key(sid), "")
            else:
                sid = ws.store.create_session("gitbisect", good, bad, probe.key, cfg.stored(), cands)
                _note_checkout(ws, sid)
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
                _note_stop(ws.store, sid, e.message)
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
            ws.store.put(_bisect_key(sid), gitrepo.bisect_id(ws.repo) or "")
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


def probe_head(path: str | Path | None, progress: Progress = _stderr) -> HeadVerdict:
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
            _adopt_env(ws, sess.id, builder)
            sha = gitrepo.head_sha(ws.top)
            if not gitrepo.bisect_in_progress(ws.repo):
                progress(f"klbisect: warning: no git bisect is in progress (reset outside klbisect?); judging "
                         f"HEAD {sha[:12]} for session {sess.id} all the same (`klbisect reset` ends it)")
            elif not _own_bisect(ws, sess):
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
            say = say_building(progress)

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
    checked = False
    while True:
        cr = since(commit_runs(ws, probe.key, build_key, [sha], cfg.timeout, failed_after=job.first_build)[sha],
                   job.before)
        if cr.build_failed:
            log = (ws.store.failed_build(build_key or "", sha) or {}).get("log_path")
            # a session's build options are fixed at `start`: a new one is how to change them
            err = _never_built(ws, build_key, log, rerun="start again (`klbisect reset` ends this "
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
            _note_stop(ws.store, sess.id, stop.message)
            raise stop
        if not checked:     # after the first run, the check after each run covers the next
            _check_unchanged(ws, sha)
            checked = True
        out = job.measurer.measure(sha, job.slot)
        _keep_env(ws, sess.id, job.builder)
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
    for runs of this session that agree with them (``_own_runs_wanted``):
    git bisect trusts each verdict for good, so it is checked at every
    commit, not only beside the answer as ``run`` does."""
    runs = ws.store.runs(probe_key, [sha])
    want = _own_runs_wanted(model, sha, runs, sid, "the commit git bisect checked out",
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


def _env_key(sid: int) -> str:
    return f"env_before:{sid}"


def _adopt_env(ws: Workspace, sid: int, builder) -> None:
    """`git bisect run` starts a `klbisect probe` per commit: a builder that
    changes the user's environment (--build sglang) takes over what the
    first of them found, so `klbisect reset` can put that back."""
    adopt = getattr(builder, "adopt_origin", None)
    raw = ws.store.get(_env_key(sid))
    if adopt and raw:
        adopt(json.loads(raw))


def _keep_env(ws: Workspace, sid: int, builder) -> None:
    saved = getattr(builder, "saved_origin", None)
    data = saved() if saved else None
    if data is not None:
        ws.store.put(_env_key(sid), json.dumps(data))


def _restore_env(ws: Workspace, sess: SessionRow) -> list[str]:
    """At `klbisect reset`: what a git bisect session's probes changed in
    the user's environment, put back (one line saying so, or how to)."""
    raw = ws.store.get(_env_key(sess.id))
    if not raw:
        return []
    builder = make_builder(BisectConfig.from_dict({**sess.config, "good": sess.good, "bad": sess.bad}))
    if not hasattr(builder, "adopt_origin"):
        return []
    builder.adopt_origin(json.loads(raw))
    lines = builder.close(lambda line: None)
    ws.store.put(_env_key(sess.id), "")
    return lines


def _refined_model(ws: Workspace, sess: SessionRow, cfg: BisectConfig, probe_key: str, build_key):
    """The endpoint model, sharpened by the runs of commits already judged."""
    model = _model_from(sess.model)
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


# ---- status, log, reset ----------------------------------------------------------

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
    model = _model_from(sess.model) if sess.model else None
    pl = None
    if model is not None:
        pl = plan([runs[s] for s in shas], model, cfg.confidence, max_runs=cfg.max_runs,
                  crash_limit=cfg.crash_limit, max_endpoint_runs=cfg.max_endpoint_runs)
    return cfg, cands, runs, pl, probe_key, build_key


def gitbisect_result(ws: Workspace, sess: SessionRow, analysis=None) -> Result | None:
    """The answer of a `git bisect run` session: git's first bad commit, or
    its block of skipped commits, with the confidence from all runs."""
    cfg, cands, runs, pl, probe_key, build_key = analysis or current_analysis(ws, sess)
    if pl is None:
        return None
    refs = gitrepo.bisect_refs(ws.repo)
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
        return build_result(ws, sess.id, cands, pl, True, "git bisect finished", probe_key, build_key)
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
    said = f"its answer {shas[between[-1]][:12]}"
    if best.indices != between and best.mass > mass and (mass < 0.5 or best.mass >= cfg.confidence):
        # "most likely (NOT sure)" must name the most likely: after one wrong verdict (a
        # hand-typed `git bisect bad`, say) git's answer may hold next to nothing
        pl.done = best
        if best.mass < cfg.confidence:
            instead = f"; the most likely is {shas[best.last][:12]} at {best.mass:.1%}" + instead
    return build_result(ws, sess.id, cands, pl, False,
                        f"git bisect finished, but all the runs put only {mass:.1%} on {said} (below "
                        f"--confidence {cfg.confidence:g}): a verdict may be wrong" + instead,
                        probe_key, build_key)


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


def explain_commit(entry: dict, model) -> str:
    """The evidence on one commit in plain words, for `klbisect status`."""
    vals = entry["values"]
    parts = []
    if entry.get("build_failed"):
        parts.append("its build failed, so it cannot be measured (untestable)")
    if entry.get("crashes") and entry.get("no_server", 0) >= entry["crashes"]:
        parts.append(f"{entry['crashes']} run(s) gave no value: its server did not start (not counted as evidence)")
    elif entry.get("crashes"):
        parts.append(f"{entry['crashes']} run(s) gave no value to judge (crashed, timed out, stopped before "
                     "printing every label, or printed no --metric label"
                     + (f"; {entry['no_server']} of them: its server did not start" if entry.get("no_server") else "")
                     + "; not counted as evidence)")
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
        elif model is not None:
            parts.append(f"{len(vals)} run(s) [{shown}] look {side}: weighed now, with the model every run so far "
                         f"gives, together {math.exp(min(abs(llr), 700)):.3g} times likelier if the commit is {side}")
        else:
            # a start killed while calibrating: "3 probe runs" in the header, none below (a tester's)
            parts.append(f"{len(vals)} run(s) [{shown}], median {fmt_value(statistics.median(vals))}; no model "
                         "weighs them yet (the endpoints have not been found to differ)")
    if entry.get("verdict") and entry.get("reason"):
        # the runs and the model as they stood then: its ratio differs from the one above
        parts.append(f"verdict {entry['verdict']}, when it was given: {entry['reason']}")
        p_bad = entry.get("p_bad")
        if p_bad is not None and 0.01 < p_bad < 0.99 and entry["verdict"] in (GOOD, BAD) and 0 < entry["index"]:
            # a tester read "1.6e+03:1 for good" beside P(bad)=0.28 as a contradiction
            parts.append("P(bad) is less sure than that verdict: it weighs every commit's runs at once, over "
                         "every place the first bad commit could be, and one commit's odds move it less "
                         "where many places are left")
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
    for r in ws.store.runs(sess.probe_key, [c[0] for c in cands if runs[c[0]].crashes]):
        no_server[r.sha] = no_server.get(r.sha, 0) + (r.status == STATUS_NOSERVER)
    for i, (sha, subj, pr) in enumerate(cands):
        cr = runs[sha]
        if not cr.values and not cr.crashes and not cr.build_failed:
            continue
        entry = {"index": i, "sha": sha, "subject": subj, "pr": pr, "values": list(cr.values),
                 "crashes": cr.crashes, "build_failed": cr.build_failed, "no_server": no_server.get(sha, 0)}
        if pl is not None:
            entry["p_bad"] = float(pl.posterior.p_bad[i])
            entry["log_lr"] = pl.model.commit_log_lr(cr.values)
            # the sides overlap: the search weighs every run with both distributions
            # integrated out, and one commit's ratio under the fitted model is not what it used
            entry["integrated"] = bool(pl.integrated)
        if sha in verdicts:
            entry["verdict"], entry["reason"] = verdicts[sha]["verdict"], verdicts[sha].get("reason", "")
        elif i in (0, n) and (cr.values or pl is not None):
            entry["verdict"], entry["reason"] = (GOOD, "good endpoint") if i == 0 else (BAD, "bad endpoint")
        elif i in (0, n):
            # a start that stopped on endpoints that printed nothing: given, not shown so
            entry["verdict"], entry["reason"] = "", "endpoint: no value yet"
        elif cr.build_failed:
            entry["verdict"], entry["reason"] = SKIP, "build failed"
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
        entry["explain"] = explain_commit(entry, pl.model if pl else None)
        out.append(entry)
    return out


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
                raise KlbisectError(f"no klbisect session {session_id} {where}: `klbisect status` names the "
                                    "latest", EXIT_USAGE)
        else:
            # the newer of the two by its last run: an interrupted session of an older question
            # must not hide the bisect that finished after it, and a `run` that resumed an
            # older session is the one just looked at, not a calibration begun before it
            found = [x for x in (st.active_session(), st.latest_session(
                ("run", "gitbisect", "calibrate", "nightly"), shown_only=True, touched=True)) if x]
            sess = max(found, key=lambda x: (st.last_touched(x), x.id), default=None)
            live = st.active_session("gitbisect")
            if live is not None and sess is not None and sess.id != live.id and _own_bisect(ws, live):
                # the checkout is mid `git bisect run`: that session is the one being
                # looked at, even if a `run` of another range finished since
                sess = live
    if sess is None and ws.has_state():
        # only calibrations that stopped short: their runs are kept, by commit
        cut = ws.store.latest_session(("calibrate",), touched=True)
        if cut is not None and runs_only:
            return cut
        if cut is not None:
            raise KlbisectError(f"calibration session {cut.id} {where} stopped before its result (its runs are "
                                f"kept: `klbisect log --session {cut.id}` lists them); rerun the same `klbisect "
                                "calibrate` command to finish it", EXIT_USAGE)
    if sess is None:
        raise KlbisectError(f"no klbisect session {where}: start one with `klbisect run` or "
                            "`klbisect start`", EXIT_USAGE)
    return sess


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
            # looked for a `klbisect run` nobody typed)
            out["for_night"] = next((r["night"] for r in (json.loads(row["result"] or "{}") for row in st.db.execute(
                "SELECT result FROM sessions WHERE kind='nightly' AND result IS NOT NULL ORDER BY id DESC"))
                if r.get("bisect_session") == sess.id), None)
        later = st.latest_session(("calibrate",)) if session_id is None else None
        if later is not None and later.id > sess.id and later.result is None:
            # hidden from status (nothing to show yet), but the user who just pressed
            # Ctrl-C must not read an older calibration as this one
            out["interrupted_calibration"] = {
                "session": later.id, "rev": later.good, "runs": len(st.session_runs(later.id)),
                "wanted": later.config.get("runs")}
        if session_id is None:
            # a tester's killed `run` of another question stayed active behind a finished one
            # shown here, and only `reset` ("ended session 11") ever named it
            out["unfinished"] = [{"session": o.id, "kind": o.kind, "good": o.good, "bad": o.bad,
                                  "runs": len(st.session_runs(o.id)), "stopped": stop_reason(st, o.id)}
                                 for o in st.active_sessions(("run", "gitbisect")) if o.id != sess.id]
        if st.get(_env_key(sess.id)) and sess.state not in ("done", "ended"):
            # a session stopped part-way left the user's interpreter on its builds (a tester's
            # `import sglang` failed after a Ctrl-C, and status said nothing of it)
            out["env_held"] = (sess.config.get("sglang") or {}).get("python") or "the Python klbisect runs in"
        if sess.kind == "calibrate":
            out["probe_runs"] = len(st.session_runs(sess.id))
            # a resumed calibration counts the runs its commits already had
            at = [sha for sha in (sess.good, sess.bad) if sha]
            # (those of earlier sessions: later ones' runs at the same commit are not in its table)
            out["reused_runs"] = sum(1 for r in st.runs(sess.probe_key, at, every=True)
                                     if r.session_id is None or r.session_id < sess.id)
            out["calibration"] = sess.result          # None until it finishes; rerun it to resume
            return out
        if sess.kind == "nightly":
            out["result"] = sess.result
        if sess.kind not in ("run", "gitbisect"):
            return out
        analysis = current_analysis(ws, sess)
        cfg, cands, runs, pl, probe_key, build_key = analysis
        shas = [c[0] for c in cands]
        commits = probed_commits(ws, sess, cfg, cands, runs, pl)
        out["commits"] = commits
        out["probe_runs"] = len(st.session_runs(sess.id))
        out["reused_runs"] = max(len(st.runs(probe_key, shas)) - out["probe_runs"], 0)
        out["n_commits"] = len(shas) - 1
        if sess.kind == "gitbisect" and sess.state == "bisecting":
            # in the worktree it runs in: asked from another, this checkout's own state says nothing
            there_repo, _ = _bisect_checkout(ws, sess)
            out["git_bisect_running"] = there_repo is not None and _own_bisect(ws, sess, there_repo)
        if pl is not None:
            out["model"] = pl.model.to_dict()
            out["top"] = [{"candidates": [shas[i] for i in b.indices], "mass": b.mass,
                           "subjects": [cands[i][1] for i in b.indices]} for b in pl.posterior.top_blocks(5)]
            out["evidence"] = boundary_evidence(commits, pl.posterior, shas)
        if sess.kind == "gitbisect" and not (sess.state == "ended" and sess.result):
            res = gitbisect_result(ws, sess, analysis)
            out["result"] = res.to_json() if res else None
        else:
            out["result"] = sess.result     # an ended git bisect's: as `reset` found it
        # runs later sessions recorded at these commits are weighed in the lists above
        out["later_runs"] = sum((r.session_id or 0) > sess.id for r in st.runs(probe_key, shas))
        res = out["result"] or {}
        # the same top-level keys as `run --json`, so one parser reads both
        out.update({k: res.get(k) for k in ("culprit", "pr", "subject", "confidence")},
                   complete=bool(res.get("complete")), candidates=res.get("candidates") or [])
        return out
    finally:
        ws.close()


def log(path: str | Path | None, session_id: int | None = None) -> list[dict]:
    ws = Workspace(path)
    try:
        sess = _shown_session(ws, session_id, runs_only=True)
        ws.use_session(sess)
        subjects = {sha: subj for sha, subj, _ in ws.store.candidates(sess.id)}
        # the runs its answer rests on: its own, and those it reused from
        # earlier sessions of the same probe (a rerun may have reused them all)
        shas = [s for s in {*subjects, sess.good, sess.bad} if s]
        runs = {r.id: r for r in ws.store.runs(sess.probe_key, shas)}
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
                    repo, there = _bisect_checkout(ws, sess)   # None: its worktree was removed since
                    if repo is not None and _own_bisect(ws, sess, repo):
                        gitrepo.bisect_reset(repo)
                        reset_line = "git bisect reset" + (f" in the worktree {there}" if there else "")
                st.update_session(sess.id, state="ended", ended=time.time())
                done += [f"ended session {sess.id} ({sess.kind})"] + ([reset_line] if reset_line else [])
                ended.append(sess)
            if gitrepo.bisect_in_progress(ws.repo):
                # the user's own bisect: its marks are not ours to throw away
                done.append(_NOT_OUR_BISECT)
            # after git's reset: an editable install of the checkout is at its HEAD again. Also what an
            # interrupted `run` or `calibrate` (ended since) could not put back
            left = {int(k.rsplit(":", 1)[1]) for k in st.keys("env_before:")}
            for sess in ended + [st.session(i) for i in sorted(left - {s.id for s in ended})]:
                if sess is not None:
                    done.extend(_restore_env(ws, sess))
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
