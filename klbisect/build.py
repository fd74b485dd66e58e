"""Rebuild a checkout only when the files that matter changed.

A rebuild of a large project costs minutes; most commits of a Python
project change no packaging file, so the last successful build in the same
checkout is still valid for them.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass
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


def matches_any(path: str, patterns: Sequence[str]) -> bool:
    """Match a repository path against glob patterns, by full path or by name."""
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(name, p) for p in patterns)


@dataclass
class CommandBuilder:
    cmd: str
    paths: tuple[str, ...] = DEFAULT_BUILD_PATHS
    timeout: float = DEFAULT_BUILD_TIMEOUT

    @property
    def key(self) -> str:
        return config_key("build", cmd=self.cmd, paths=list(self.paths))

    def needs_build(self, changed: Sequence[str] | None) -> bool:
        if changed is None:
            return True
        return any(matches_any(p, self.paths) for p in changed)

    def build(self, checkout: Path, log_path: Path, slot: Slot) -> BuildResult:
        res = run_logged(self.cmd, cwd=checkout, log_path=log_path, timeout=self.timeout,
                         env=slot.env, pid_dir=slot.pid_dir)
        ok = res.exit_code == 0
        note = "" if ok else ("build timed out" if res.timed_out else f"build exited {res.exit_code}")
        return BuildResult(ok, res.duration, str(log_path), note)
