"""Rebuild a checkout only when the files that matter changed.

A rebuild of a large project costs minutes; most commits of a Python
project change no packaging file, so the last successful build in the same
checkout is still valid for them.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from .probe import Slot, config_key
from .proc import run_logged

DEFAULT_BUILD_PATHS = (
    "setup.py", "setup.cfg", "pyproject.toml", "requirements*.txt",
    "CMakeLists.txt", "*.rs", "Cargo.toml",
)
DEFAULT_BUILD_TIMEOUT = 3600.0


@dataclass
class BuildResult:
    ok: bool
    duration: float
    log_path: str
    note: str = ""


class Builder(Protocol):
    key: str

    def needs_build(self, changed: Sequence[str] | None) -> bool:
        """``changed``: paths differing from the checkout's last successful
        build, or None when this checkout was never built."""
        ...

    def build(self, checkout: Path, log_path: Path, slot: Slot) -> BuildResult: ...


_INSTALL = re.compile(r"(?:\bpip3?|\bpython3?(?:\.\d+)? -m pip|\buv pip)\s+install\b"
                      r"|\bsetup\.py\s+(?:install|develop)\b")
_EDITABLE = re.compile(r"(?:^|\s)(?:-e|--editable)(?:\s|=|$)|\bsetup\.py\s+develop\b")
# a build that installs into an environment of the checkout's own (or a named target) shares nothing
_OWN_ENV = re.compile(r"venv|virtualenv|--target\b|--prefix\b|--root\b|\bconda\b|\bpixi\b")


def shared_install(cmd: str) -> str | None:
    """"editable" or "install" when a build command installs the checkout into
    one Python environment that every checkout shares (``pip install -e
    python``), else None. Parallel slots would then all import whichever
    commit was installed last, and after the session an editable install
    points into a removed worktree."""
    if not _INSTALL.search(cmd) or _OWN_ENV.search(cmd):
        return None
    return "editable" if _EDITABLE.search(cmd) else "install"


def matches_any(path: str, patterns: Sequence[str]) -> bool:
    """Match a repository path against glob patterns, by full path or by name."""
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in patterns)


@dataclass
class CommandBuilder:
    cmd: str
    paths: tuple[str, ...] = DEFAULT_BUILD_PATHS
    timeout: float = DEFAULT_BUILD_TIMEOUT
    _built: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def key(self) -> str:
        return config_key("build", cmd=self.cmd, paths=list(self.paths))

    def close(self, progress) -> None:
        """After builds in klbisect's worktrees: a command that installed into
        the user's Python left it on a commit of the range, or, editable,
        pointing into a worktree that is gone. Said, with the fix."""
        how = shared_install(self.cmd) if self._built else None
        if how:
            now = ("an editable install from klbisect's worktree, which is removed now"
                   if how == "editable" else "the last commit klbisect built")
            progress(f"note: --build-cmd installed into your Python, which now has {now}: run "
                     f"`{self.cmd}` in your own checkout to put yours back (--build sglang does that itself)")

    def needs_build(self, changed: Sequence[str] | None) -> bool:
        if changed is None:
            return True
        return any(matches_any(p, self.paths) for p in changed)

    def build(self, checkout: Path, log_path: Path, slot: Slot) -> BuildResult:
        self._built = True
        res = run_logged(self.cmd, cwd=checkout, log_path=log_path, timeout=self.timeout,
                         env=slot.env, pid_dir=slot.pid_dir)
        ok = res.exit_code == 0
        note = "" if ok else ("build timed out" if res.timed_out else f"build exited {res.exit_code}")
        return BuildResult(ok, res.duration, str(log_path), note)
