"""One measurement of one commit on one slot: check out, build if needed, probe.

Runs in worker threads (or on a Ray node), so it touches no database: it
returns an ``Outcome`` that the caller records.
"""
from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import git

from . import repo as gitrepo
from .build import Builder, BuildResult
from .errors import EXIT_STORAGE, KlbisectError
from .probe import Probe, RunResult, Slot
from .proc import log_tail
from .runs import CRASHED


@dataclass
class Outcome:
    sha: str
    slot: int
    started: float
    build: BuildResult | None = None   # set when a build ran
    run: RunResult | None = None       # None when the build failed
    checkout: str = ""                 # where it ran (a slot may run in any checkout of a pool)

    @property
    def build_failed(self) -> bool:
        return self.build is not None and not self.build.ok


@dataclass
class Measurer:
    """Holds what is known between measurements: which commit each
    checkout last built successfully (by its path)."""

    repo: git.Repo
    probe: Probe
    builder: Builder | None
    log_dir: Path
    use_worktree: bool = True
    last_built: dict[str, str | None] = field(default_factory=dict)
    # told (sha, build log) before a build starts: a multi-minute pip
    # install must not look like a hang
    on_build: Callable[[str, Path], None] | None = None
    # seconds of the builds that began from nothing and of those that built on an earlier one
    build_seconds: dict[str, list[float]] = field(default_factory=lambda: {"fresh": [], "incremental": []})

    def fresh_costs_more(self) -> bool:
        """Whether a build from nothing costs far more here than one on top of
        an earlier build (an in-tree C++/CUDA build): then a new checkout is
        the dearest place to build, not the cheapest. Until a build in place
        has been timed, a fresh one that took minutes is taken to."""
        fresh, inc = self.build_seconds["fresh"], self.build_seconds["incremental"]
        if not fresh:
            return False
        mean = sum(fresh) / len(fresh)
        return mean > FRESH_BUILD_RATIO * sum(inc) / len(inc) + 1.0 if inc else mean > DEAR_FRESH_SECONDS

    def would_build(self, checkout: Path, sha: str) -> bool:
        """Whether measuring ``sha`` in ``checkout`` would build first."""
        if self.builder is None:
            return False
        last = self.last_built.get(str(checkout))
        if last == sha:
            return False
        return self.builder.needs_build(None if last is None else gitrepo.changed_files(self.repo, last, sha))

    def measure(self, sha: str, slot: Slot) -> Outcome:
        started = time.time()
        where = str(slot.checkout)
        out = Outcome(sha, slot.index, started, checkout=where)
        if self.use_worktree:
            # a build in place keeps what it made: a reviewer's build wrote an output that is not
            # in .gitignore, the clean before the next run removed it, and the checkout, still
            # taken as built, crashed 1,999 runs in a row
            in_place = self.builder is not None and self.last_built.get(where) is not None
            if gitrepo.worktree_checkout(self.repo, slot.checkout, sha, keep=in_place):
                self.last_built[where] = None    # the build's changes to tracked files were put back
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started)) + f"-{int(started * 1e6) % 1000000:06d}"
        if self.builder is not None:
            last = self.last_built.get(where)
            if self.would_build(slot.checkout, sha):
                log = self.log_dir / f"build-{sha[:12]}-{stamp}.log"
                if self.on_build is not None:
                    self.on_build(sha, log)
                out.build = self.builder.build(slot.checkout, log, slot)
                self.build_seconds["fresh" if last is None else "incremental"].append(out.build.duration)
                if not out.build.ok:
                    # a half-finished build may have left the environment
                    # changed: the next commit rebuilds whatever it touches
                    self.last_built[where] = None
                    self._check_disk(f"the build of {sha[:12]}", out.build.log_path, slot.checkout)
                    return out
                self.last_built[where] = sha
        # slot (GPUs, ports) and worktree in the name: in a pool they vary apart
        name = f"run-{sha[:12]}-{stamp}-s{slot.index}-{Path(where).name}.log"
        out.run = r = self.probe.run(slot.checkout, self.log_dir / name, slot)
        if r.status in CRASHED and not r.values:
            # (not by its log's words: NCCL's "No space left on device" is a small /dev/shm)
            self._check_disk(f"the probe run of {sha[:12]}", r.log_path, slot.checkout, read_log=False)
        return out

    def _check_disk(self, what: str, log_path: str, checkout: Path, read_log: bool = True) -> None:
        """A build or run that failed on a full disk is the disk's failure, not
        the commit's: recorded, it made the commit untestable (a tester's
        build on a full disk was a skip, and git bisect skips for good).
        Raised, it stops the command with 156 before anything is recorded.
        A log's "No space left on device" counts only where space is short
        (a reviewer's: a small /dev/shm or a build that writes far too much
        would stop every rerun at the same commit)."""
        said = gitrepo.DISK_FULL.search(log_tail(log_path)) if log_path and read_log else None
        places = (checkout, self.log_dir, Path(tempfile.gettempdir()))
        # (a quota is not in the free space a disk reports: its words alone count)
        if said and "quota" not in said.group(0).lower() and not any(gitrepo.nearly_full(p, LOW_SPACE)
                                                                     for p in places):
            said = None
        if said or gitrepo.nearly_full(checkout) or gitrepo.nearly_full(self.log_dir):
            # (no "; " before the advice: the executor keeps a message's first clause)
            raise KlbisectError(f"{what} failed: the disk is full ({said.group(0) if said else 'under 32 MiB free'}"
                                f", log {log_path}); free disk space and rerun the same command: recorded runs "
                                "are kept", EXIT_STORAGE)


LOW_SPACE = 1 << 30          # where a failed build's log says the disk is full, this little free space agrees

FRESH_BUILD_RATIO = 2.0      # fresh builds this many times dearer than builds in place: rebuild in place
DEAR_FRESH_SECONDS = 120.0   # ... or, before a build in place is timed, fresh builds this long
