"""State in sqlite under ``<git-common-dir>/klbisect/``: sessions, every run,
builds, verdicts, PR metadata.

Every finished run is committed at once, so an interrupted bisect resumes
from the database and the search state is recomputed from the runs (it is
derivable, so it is never stored). WAL mode lets ``status`` read while a
bisect writes.
"""
from __future__ import annotations

import errno
import os
import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.request import pathname2url

from .errors import EXIT_STORAGE, KlbisectError
from .metric import scalar

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,            -- run | gitbisect | calibrate | nightly
    created REAL NOT NULL,
    good TEXT, bad TEXT,           -- full shas
    probe_key TEXT NOT NULL,
    config TEXT NOT NULL,          -- JSON of the options
    model TEXT,                    -- JSON of the learned good/bad model
    state TEXT NOT NULL,           -- calibrating | bisecting | done | ended
    result TEXT,                   -- JSON of the final answer
    ended REAL
);
CREATE TABLE IF NOT EXISTS candidates (
    session_id INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    sha TEXT NOT NULL,
    subject TEXT, pr INTEGER,
    PRIMARY KEY (session_id, idx)
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    session_id INTEGER,
    probe_key TEXT NOT NULL,
    sha TEXT NOT NULL,
    started REAL NOT NULL,
    duration REAL,
    exit_code INTEGER,
    status TEXT NOT NULL,          -- ok | failed | crash | timeout | notfound | noserver | novalue
    vals TEXT NOT NULL,            -- JSON label -> value
    value REAL,                    -- the run's scalar (max over labels or --metric)
    log_path TEXT,
    slot INTEGER
);
CREATE INDEX IF NOT EXISTS runs_by_sha ON runs (probe_key, sha);
CREATE TABLE IF NOT EXISTS builds (
    id INTEGER PRIMARY KEY,
    build_key TEXT NOT NULL,
    checkout TEXT NOT NULL,
    sha TEXT NOT NULL,
    ok INTEGER NOT NULL,
    started REAL NOT NULL,
    duration REAL,
    log_path TEXT,
    note TEXT
);
CREATE TABLE IF NOT EXISTS verdicts (
    session_id INTEGER NOT NULL,
    sha TEXT NOT NULL,
    verdict TEXT NOT NULL,
    evidence TEXT,                 -- JSON: values, log LR, reason
    decided REAL NOT NULL,
    PRIMARY KEY (session_id, sha)
);
CREATE TABLE IF NOT EXISTS pr_meta (
    pr INTEGER PRIMARY KEY,
    meta TEXT NOT NULL,
    fetched REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


@dataclass
class Run:
    id: int
    session_id: int | None
    probe_key: str
    sha: str
    started: float
    duration: float | None
    exit_code: int | None
    status: str
    values: dict
    value: float | None
    log_path: str | None
    slot: int | None


@dataclass
class SessionRow:
    id: int
    kind: str
    created: float
    good: str | None
    bad: str | None
    probe_key: str
    config: dict
    model: dict | None
    state: str
    result: dict | None
    ended: float | None


def _last_run_key(sid: int) -> str:
    return f"last_run:{sid}"


# a session's last activity: its newest run's start, or its creation
_TOUCHED = "MAX(s.created, COALESCE((SELECT MAX(r.started) FROM runs r WHERE r.session_id = s.id), 0))"


def storage_error(e: Exception, path: Path | None = None) -> KlbisectError:
    """What went wrong with the state, and the advice that fits it: a full
    disk, a read-only or foreign directory, or a damaged database."""
    text = " ".join(str(e).split())    # sqlite's quick_check reports span lines
    if getattr(e, "errno", None) in (errno.EEXIST, errno.ENOTDIR) and getattr(e, "filename", None):
        return KlbisectError(f"klbisect state: {e.filename} is in the way ({e.strerror}; a directory of "
                             "klbisect's belongs there): move it away and rerun", EXIT_STORAGE)
    if path is not None and path.is_dir():
        return KlbisectError(f"klbisect state {path} is a directory, not a database: move it away and rerun",
                             EXIT_STORAGE)
    if "not a database" in text or "malformed" in text:
        # damage found by a query, not on opening: the store this command opened
        where = path or _opened or "$(git rev-parse --git-common-dir)/klbisect/state.db"
        # the session of a `git bisect run` was in it: git's bisect must start over with it
        bisecting = (isinstance(where, Path) and (where.parent.parent / "BISECT_LOG").exists())
        again = ("; git's bisect in progress was klbisect's: `git bisect reset`, then `klbisect start` "
                 "again" if bisecting else "")
        return KlbisectError(f"klbisect state {where} is damaged ({text}): move it away (e.g. to "
                             "state.db.bad) and rerun; the runs it held are lost, the repository "
                             f"is untouched{again}", EXIT_STORAGE)
    if "database is locked" in text:
        return KlbisectError("klbisect state is locked by another process (a klbisect on another machine "
                             "sharing this .git, or a sqlite tool left open): close it and rerun; runs "
                             "already recorded are kept", EXIT_STORAGE)
    if getattr(e, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM) or any(
            t in text for t in ("readonly", "read-only", "unable to open database")):
        if path is None:     # the file the error names, else (a write after opening) the store it opened
            path = Path(e.filename) if getattr(e, "filename", None) else _opened
        where = f" in {path.parent}" if path is not None else ""
        rofs = getattr(e, "errno", None) == errno.EROFS     # no chmod makes anything there writable
        files = _unwritable(path) if path is not None and not rofs else []
        if rofs:
            what = ("its file system is mounted read-only; remount it writable, or clone the repository to a "
                    "disk that is,")
        elif len(files) == 1:
            what = f"{files[0]} is read-only or belongs to another user; make it writable"
        elif files:
            what = f"{', '.join(files)} are read-only or belong to another user; make them writable"
        else:
            what = "the directory is read-only or belongs to another user; make it writable"
        return KlbisectError(f"cannot write klbisect state{where} ({text}): {what} and rerun: runs already "
                             "recorded are kept", EXIT_STORAGE)
    # the disk it is on, named: a tester's full tmpfs was not the disk they looked at first
    where = path or _opened
    return KlbisectError(f"cannot write klbisect state{f' {where}' if where else ''} ({text}); free disk space "
                         "there and rerun: runs already recorded are kept", EXIT_STORAGE)


_opened: Path | None = None   # the state database this process opened last


def _companions(path: Path) -> tuple[Path, Path]:
    """SQLite's WAL and shared-memory files beside the database."""
    return path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def _owner_only(path: Path) -> None:
    """A store made before it was created 0600 (its WAL and shared memory
    too) becomes so, where it is ours. SQLite gives those two the database's
    mode when it makes them: a command that ran while the database was
    read-only left them so, and a database made writable again, as the
    error advised, still could not be written through them (a tester's)."""
    try:
        writable = path.stat().st_mode & 0o200
    except OSError:
        writable = 0
    for f in (path, *_companions(path)):
        try:
            st = f.stat()
            mode = st.st_mode & 0o700 | (0o600 if writable and f != path else 0)
            if st.st_uid == os.getuid() and mode != st.st_mode & 0o777:
                f.chmod(mode)
        except OSError:
            continue


def _unwritable(path: Path) -> list[str]:
    """The state's folder and files this process may not write."""
    return [str(f) for f in (path.parent, path, *_companions(path)) if f.exists() and not os.access(f, os.W_OK)]


class Store:
    """The sqlite state. ``metric`` is the --metric in force: a run's value
    is read from its stored per-label values with it, so runs recorded
    under another --metric (or none) are reused correctly. After
    ``view_from`` (a --fresh session's view, after the environment
    changed), ``runs`` leaves out the runs of earlier sessions."""

    def __init__(self, path: Path, metric: str | None = None, worse: str = "higher"):
        self.path = Path(path)
        self.metric = metric
        self.worse = worse
        self.since_session = 0     # runs of sessions before this one are left out
        self.since = 0.0           # when that session began: older failed builds are left out
        self.until_session = 0     # the session shown as it ended: runs recorded after it are left out,
        self.until_run = 0         # ... those past this run id, its own aside
        # runs as read, by id, under the (metric, worse) they were read with: a row never
        # changes once written, and a search step reads every run of the range several
        # times (a tester's store of 20,000 runs spent 9 s a command parsing them again)
        self._read: dict[int, Run] = {}
        self._read_as: tuple = (metric, worse)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                # it holds the probe command and --server-args as given, secrets among them (SQLite
                # gives its WAL and shared-memory files the same mode)
                os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
            _owner_only(self.path)
            self.db = sqlite3.connect(str(self.path), timeout=30, isolation_level=None,
                                      check_same_thread=False)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            # a damaged page the next command's queries skip would let `run` answer from
            # it while `status` calls it damaged: every command checks the whole file
            bad = self.db.execute("PRAGMA quick_check(1)").fetchone()
            if bad and bad[0] != "ok":
                raise sqlite3.DatabaseError(f"database disk image is malformed: {bad[0]}")
        except (sqlite3.Error, OSError) as e:
            err = storage_error(e, self.path)
            if not (self.path.is_file() and "read-only" in err.message):
                raise err from None
            # a read-only .git (another user's checkout, a mounted snapshot): what was
            # recorded can still be read by status, log and report; a write says why not
            try:
                self.db = sqlite3.connect(f"file:{pathname2url(str(self.path))}?mode=ro&immutable=1", uri=True,
                                          isolation_level=None, check_same_thread=False)
                self.db.row_factory = sqlite3.Row
                self.db.execute("SELECT 1 FROM sessions LIMIT 1")
            except sqlite3.Error:
                raise err from None
        global _opened
        _opened = self.path
        self._inode = self.path.stat().st_ino
        self._root = self.path.parent.resolve()   # where log paths are kept relative to

    def _check_file(self) -> None:
        # sqlite keeps writing to a deleted or replaced file: every run after
        # it would be lost without a word
        try:
            same = self.path.stat().st_ino == self._inode
        except OSError:
            same = False
        if not same:
            raise KlbisectError(f"klbisect state {self.path} was deleted or replaced while this command ran; "
                                "what it recorded since is lost: rerun the command", EXIT_STORAGE)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self._check_file()
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield self.db
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")
        except sqlite3.OperationalError as e:
            raise storage_error(e) from None

    # ---- sessions ---------------------------------------------------------
    def create_session(self, kind: str, good: str | None, bad: str | None, probe_key: str,
                       config: dict, candidates: list[tuple[str, str, int | None]] = ()) -> int:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO sessions (kind, created, good, bad, probe_key, config, state) "
                "VALUES (?, ?, ?, ?, ?, ?, 'calibrating')",
                (kind, time.time(), good, bad, probe_key, json.dumps(config, sort_keys=True)))
            sid = int(cur.lastrowid)
            db.executemany("INSERT INTO candidates (session_id, idx, sha, subject, pr) VALUES (?, ?, ?, ?, ?)",
                           [(sid, i, sha, subj, pr) for i, (sha, subj, pr) in enumerate(candidates)])
        return sid

    def _session(self, row) -> SessionRow | None:
        if row is None:
            return None
        return SessionRow(row["id"], row["kind"], row["created"], row["good"], row["bad"],
                          row["probe_key"], json.loads(row["config"]),
                          json.loads(row["model"]) if row["model"] else None, row["state"],
                          json.loads(row["result"]) if row["result"] else None, row["ended"])

    def session(self, sid: int) -> SessionRow | None:
        return self._session(self.db.execute("SELECT * FROM sessions WHERE id=?", (sid,)).fetchone())

    def active_session(self, kind: str | None = None) -> SessionRow | None:
        q = "SELECT * FROM sessions WHERE state NOT IN ('done', 'ended')"
        args: tuple = ()
        if kind:
            q += " AND kind=?"
            args = (kind,)
        return self._session(self.db.execute(q + " ORDER BY id DESC LIMIT 1", args).fetchone())

    def session_table(self) -> list[tuple[SessionRow, int]]:
        """Every session, newest first, with the number of runs it recorded."""
        rows = self.db.execute("SELECT s.*, (SELECT COUNT(*) FROM runs r WHERE r.session_id = s.id) AS n_runs "
                               "FROM sessions s ORDER BY s.id DESC").fetchall()
        return [(self._session(r), int(r["n_runs"])) for r in rows]

    def active_sessions(self, kinds: tuple[str, ...]) -> list[SessionRow]:
        """Every unfinished session of ``kinds``, newest first."""
        rows = self.db.execute(f"SELECT * FROM sessions WHERE state NOT IN ('done', 'ended') AND kind IN "
                               f"({','.join('?' * len(kinds))}) ORDER BY id DESC", kinds).fetchall()
        return [self._session(r) for r in rows]

    def latest_session(self, kinds: tuple[str, ...] = ("run", "gitbisect"),
                       shown_only: bool = False, touched: bool = False) -> SessionRow | None:
        """The latest session of ``kinds``; ``shown_only`` leaves out the
        calibrations that ended without a result (failed or interrupted:
        nothing to show, and their runs stay in the store by commit).
        ``touched``: latest by its last run, not by when it began, so that a
        `run` that resumed an older session is the one shown after it."""
        marks = ",".join("?" * len(kinds))
        skip = " AND NOT (kind='calibrate' AND state='ended' AND result IS NULL)" if shown_only else ""
        order = f"{_TOUCHED} DESC, s.id DESC" if touched else "s.id DESC"
        return self._session(self.db.execute(
            f"SELECT s.* FROM sessions s WHERE kind IN ({marks}){skip} ORDER BY {order} LIMIT 1", kinds).fetchone())

    def last_answered(self, kinds: tuple[str, ...] = ("run", "gitbisect"), before: int | None = None) -> int | None:
        """The id of the latest session of ``kinds`` that stored a result
        (before session ``before``), or None."""
        marks = ",".join("?" * len(kinds))
        row = self.db.execute(f"SELECT id FROM sessions WHERE kind IN ({marks}) AND result IS NOT NULL "
                              "AND id < ? ORDER BY id DESC LIMIT 1", (*kinds, before or 1 << 62)).fetchone()
        return row[0] if row else None

    def finished_at_run(self, sess: SessionRow) -> int | None:
        """The newest run id recorded when ``sess`` last finished (None for one
        that finished before that was kept)."""
        last = self.get(_last_run_key(sess.id))
        return int(last) if last else None

    def last_touched(self, sess: SessionRow) -> float:
        """When a session last recorded a run (its creation, before any)."""
        return float(self.db.execute(f"SELECT {_TOUCHED} FROM sessions s WHERE s.id=?", (sess.id,)).fetchone()[0])

    def find_session(self, kind: str, good: str, bad: str, probe_key: str, config: dict,
                     ignore: tuple[str, ...] = ()) -> SessionRow | None:
        """The latest session not ended with the same question, to resume it:
        its stored config equals ``config`` once the keys in ``ignore`` (what
        a rerun may change) are left out of it."""
        rows = self.db.execute(
            "SELECT * FROM sessions WHERE kind=? AND good=? AND bad=? AND probe_key=? "
            "AND state NOT IN ('ended') ORDER BY id DESC", (kind, good, bad, probe_key)).fetchall()
        for row in rows:
            sess = self._session(row)
            if {k: v for k, v in sess.config.items() if k not in ignore} == config:
                return sess
        return None

    def interrupted_calibration(self, rev: str, bad: str | None, probe_key: str) -> SessionRow | None:
        """The latest calibration of this question, when it is a --fresh one
        that stopped short of a result: a ``calibrate --fresh`` rerun resumes
        from it instead of leaving its runs out too."""
        row = self.db.execute(
            "SELECT * FROM sessions WHERE kind='calibrate' AND good=? AND bad IS ? AND probe_key=? "
            "ORDER BY id DESC LIMIT 1", (rev, bad, probe_key)).fetchone()
        sess = self._session(row)
        # one whose cost estimate was cut short kept its report, but not the estimate the rerun gives
        short = sess is not None and (sess.result is None or bool(sess.result.get("interrupted")))
        return sess if sess and sess.config.get("fresh") and short else None

    def update_session(self, sid: int, **fields) -> None:
        """Set a session's fields; one that ends (done, ended) keeps the last run
        id recorded by then, what ``view_until`` shows it with."""
        cols, vals = [], []
        for k, v in fields.items():
            cols.append(f"{k}=?")
            vals.append(json.dumps(v, sort_keys=True) if k in ("model", "result", "config") and v is not None else v)
        with self.tx() as db:
            db.execute(f"UPDATE sessions SET {', '.join(cols)} WHERE id=?", (*vals, sid))
        if fields.get("state") in ("done", "ended"):
            self.put(_last_run_key(sid), str(self.db.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0]))

    def candidates(self, sid: int) -> list[tuple[str, str, int | None]]:
        return [(r["sha"], r["subject"], r["pr"]) for r in self.db.execute(
            "SELECT sha, subject, pr FROM candidates WHERE session_id=? ORDER BY idx", (sid,))]

    # ---- runs -------------------------------------------------------------
    def add_run(self, session_id: int | None, probe_key: str, sha: str, started: float,
                duration: float, exit_code: int | None, status: str, values: dict,
                value: float | None, log_path: str | None, slot: int | None = None) -> int:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO runs (session_id, probe_key, sha, started, duration, exit_code, status, "
                "vals, value, log_path, slot) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (session_id, probe_key, sha, started, duration, exit_code, status,
                 json.dumps(values), value, self._rel(log_path), slot))
            return int(cur.lastrowid)

    def runs(self, probe_key: str, shas: list[str] | None = None, session_id: int | None = None,
             every: bool = False) -> list[Run]:
        """The runs of this probe command (at ``shas``), oldest first; ``every``
        includes those that ``view_from`` leaves out."""
        q, args = "SELECT * FROM runs WHERE probe_key=?", [probe_key]
        if self.since_session and not every:
            # by session, not by time: a Ray node's clock may run behind this machine's
            q += " AND session_id>=?"
            args.append(self.since_session)
        if self.until_session and not every:
            # by the runs table's order, not by time: a Ray node's clock may run behind this machine's
            q += " AND (id<=? OR session_id=?)"
            args += [self.until_run, self.until_session]
        if session_id is not None:
            q += " AND session_id=?"
            args.append(session_id)
        if shas is not None:
            # in SQL, by the (probe_key, sha) index: a nightly store holds every night's heads
            q += " AND sha IN (SELECT value FROM json_each(?))"
            args.append(json.dumps(list(shas)))
        return [self._run(r) for r in self.db.execute(q + " ORDER BY id", args)]

    def view_from(self, sess: SessionRow | None) -> None:
        """Show only what ``sess`` and later sessions recorded (None: everything)."""
        self.since_session, self.since = (sess.id, sess.created) if sess else (0, 0.0)

    def view_until(self, sess: SessionRow | None) -> None:
        """Show only what was recorded before ``sess`` ended (None: everything):
        a finished session looked at later, as it ended, not recomputed with
        the runs later sessions added at its commits (a tester's read "53
        probe runs (+232 reused)" beside its own "Probe runs: 53")."""
        if sess is None:
            self.until_session, self.until_run = 0, 0
            return
        last = self.get(_last_run_key(sess.id))
        if last is None:
            # a session that ended before its last run id was kept: by time, its runs' or its end's
            end = sess.ended or self.db.execute("SELECT MAX(started + COALESCE(duration, 0)) FROM runs "
                                                "WHERE session_id=?", (sess.id,)).fetchone()[0] or sess.created
            last = self.db.execute("SELECT COALESCE(MAX(id), 0) FROM runs WHERE started<=?", (end,)).fetchone()[0]
        self.until_session, self.until_run = sess.id, int(last)

    def session_runs(self, session_id: int) -> list[Run]:
        return [self._run(r) for r in self.db.execute(
            "SELECT * FROM runs WHERE session_id=? ORDER BY id", (session_id,))]

    def _run(self, r) -> Run:
        if self._read_as != (self.metric, self.worse):
            self._read, self._read_as = {}, (self.metric, self.worse)
        run = self._read.get(r["id"])
        if run is None:
            vals = json.loads(r["vals"])
            run = Run(r["id"], r["session_id"], r["probe_key"], r["sha"], r["started"], r["duration"],
                      r["exit_code"], r["status"], vals, scalar(vals, self.metric, self.worse),
                      self._abs(r["log_path"]), r["slot"])
            self._read[r["id"]] = run
        return run

    # Logs under the state directory are stored relative to it, so that they
    # are still found after the repository is moved or copied.
    def _rel(self, log_path: str | None) -> str | None:
        if not log_path:
            return log_path
        try:
            return Path(log_path).resolve().relative_to(self._root).as_posix()
        except ValueError:
            return str(log_path)

    def _abs(self, log_path: str | None) -> str | None:
        if not log_path or os.path.isabs(log_path):
            return log_path
        return os.path.join(self.path.parent, log_path)

    def _build_row(self, r) -> dict:
        d = dict(r)
        d["log_path"] = self._abs(d.get("log_path"))
        return d

    # ---- builds -----------------------------------------------------------
    def add_build(self, build_key: str, checkout: str, sha: str, ok: bool, started: float,
                  duration: float, log_path: str, note: str = "") -> None:
        with self.tx() as db:
            db.execute("INSERT INTO builds (build_key, checkout, sha, ok, started, duration, log_path, note) "
                       "VALUES (?,?,?,?,?,?,?,?)",
                       (build_key, checkout, sha, int(ok), started, duration, self._rel(log_path), note))

    def last_run_id(self) -> int:
        return int(self.db.execute("SELECT COALESCE(MAX(id), 0) FROM runs").fetchone()[0])

    def last_build_id(self) -> int:
        return self.db.execute("SELECT COALESCE(MAX(id), 0) FROM builds").fetchone()[0]

    def failed_builds(self, build_key: str, shas: list[str]) -> dict[str, dict]:
        """``failed_build`` of every commit of ``shas`` at once (a search step
        asked once per commit of the range: 10,000 queries at 10,000 commits)."""
        rows = self.db.execute("SELECT * FROM builds WHERE build_key=? AND sha IN (SELECT value FROM json_each(?)) "
                               "ORDER BY id", (build_key, json.dumps(list(shas)))).fetchall()
        last = {r["sha"]: r for r in rows}
        return {sha: self._build_row(r) for sha, r in last.items() if not r["ok"]}

    def failed_build(self, build_key: str, sha: str) -> dict | None:
        """The commit's last build under ``build_key``, when it failed."""
        return self.failed_builds(build_key, [sha]).get(sha)

    def builds(self, build_key: str) -> list[dict]:
        return [self._build_row(r) for r in self.db.execute("SELECT * FROM builds WHERE build_key=? ORDER BY id",
                                                 (build_key,))]

    # ---- verdicts ---------------------------------------------------------
    def set_verdict(self, session_id: int, sha: str, verdict: str, evidence: dict) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO verdicts (session_id, sha, verdict, evidence, decided) "
                       "VALUES (?,?,?,?,?)", (session_id, sha, verdict, json.dumps(evidence), time.time()))

    def verdicts(self, session_id: int) -> dict[str, dict]:
        return {r["sha"]: {"verdict": r["verdict"], **json.loads(r["evidence"] or "{}")}
                for r in self.db.execute("SELECT * FROM verdicts WHERE session_id=? ORDER BY decided",
                                         (session_id,))}

    # ---- PR metadata cache and small values --------------------------------
    def get_pr(self, pr: int) -> dict | None:
        row = self.db.execute("SELECT meta FROM pr_meta WHERE pr=?", (pr,)).fetchone()
        return json.loads(row["meta"]) if row else None

    def put_pr(self, pr: int, meta: dict) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO pr_meta (pr, meta, fetched) VALUES (?,?,?)",
                       (pr, json.dumps(meta), time.time()))

    def get(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return row["value"] if row else None

    def keys(self, prefix: str) -> list[str]:
        """The keys that start with ``prefix`` and hold a value."""
        rows = self.db.execute("SELECT key FROM kv WHERE substr(key, 1, ?) = ? AND value != ''",
                               (len(prefix), prefix)).fetchall()
        return [r["key"] for r in rows]

    def put(self, key: str, value: str) -> None:
        with self.tx() as db:
            db.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?,?)", (key, value))

    def purge(self) -> None:
        # overwritten and the file shrunk, not just unlinked from the tables: the deleted rows
        # (--server-args as given) would stay in free pages where SQLite's secure_delete is off
        self.db.execute("PRAGMA secure_delete=ON")
        with self.tx() as db:
            for t in ("runs", "builds", "verdicts", "candidates", "sessions", "pr_meta", "kv"):
                db.execute(f"DELETE FROM {t}")
        self._read = {}
        self.db.execute("VACUUM")
        self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
