"""Judge nothing, measure once: run the probe in a checkout and read its values.

A run that prints no value is a crash (evidence of nothing), whatever its
exit code; a run that prints values and then fails its assertion is a
measurement.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from .metric import failed_its_check, parse_values
from .proc import run_logged
# a run's statuses are the pure core's words (runs.py); the probe only assigns them
from .runs import STATUS_CRASH, STATUS_FAILED, STATUS_NOTFOUND, STATUS_OK, STATUS_TIMEOUT

PORT_SPAN = 100            # ports per slot: [port_base, port_base + PORT_SPAN)
# SGLang picks its NCCL port 100-1000 above its server port (PortArgs.init_new), checked free but not
# held: slots' ranges this far apart keep one slot's from landing on another's server port at launch
SERVER_REACH = 1100
PORT_LOW, PORT_HIGH = 10000, 32700   # below Linux's ephemeral range (32768-60999)
MAX_PARALLEL = 256         # slots at once: each gets one of the (PORT_HIGH - PORT_LOW) // PORT_SPAN port ranges

DEFAULT_TIMEOUT = 1800.0  # a 5-minute test plus a slow server launch, twice over



@dataclass
class Slot:
    """Where one probe runs: a checkout, its environment, its ports."""

    index: int
    checkout: Path
    env: dict[str, str] = field(default_factory=dict)
    port_base: int = 0
    pid_dir: Path | None = None


@dataclass
class RunResult:
    values: dict[str, float]
    exit_code: int | None
    status: str
    duration: float
    log_path: str

    def to_dict(self) -> dict:
        return asdict(self)


class Probe(Protocol):
    key: str

    def describe(self) -> str: ...

    def run(self, checkout: Path, log_path: Path, slot: Slot) -> RunResult: ...


NO_RETRY = "SGLANG_TEST_MAX_RETRY"


def config_key(kind: str, **parts) -> str:
    """A stable identity for a probe configuration, so stored runs are reused
    only by a probe that would have measured the same thing."""
    blob = json.dumps({"kind": kind, **parts}, sort_keys=True)
    return f"{kind}:" + hashlib.sha256(blob.encode()).hexdigest()[:16]


def classify(values: dict[str, float], exit_code: int | None, timed_out: bool,
             text: str | Callable[[], Iterable[str]] = "") -> str:
    # a run stopped at --timeout is a crash even after printing values: the
    # labels it never reached are missing from its max (the values are kept)
    if timed_out:
        return STATUS_TIMEOUT
    if values and exit_code and failed_its_check(text if isinstance(text, str) else text()):
        return STATUS_FAILED
    if values:
        return STATUS_OK
    if exit_code == 127:
        return STATUS_NOTFOUND
    return STATUS_CRASH


def python_env(python: str, where: Path, path: str) -> dict[str, str]:
    """PATH (and VIRTUAL_ENV) for a command whose ``python`` is ``python``:
    its scripts first, then a venv's own bin/ (its pip, pytest, torchrun)."""
    target = os.path.abspath(shutil.which(python) or python)
    venv = os.path.dirname(os.path.dirname(target))
    env = {}
    first = [str(python_links(target, where))]
    if os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        first.append(os.path.dirname(target))
        env["VIRTUAL_ENV"] = venv
    # an empty PATH entry is the current folder: none is added
    env["PATH"] = os.pathsep.join(first + [p for p in path.split(os.pathsep) if p])
    return env


def python_links(target: str, where: Path) -> Path:
    """A folder whose ``python`` and ``python3`` run ``target`` (an absolute
    path), to put first on a command's PATH. Scripts that exec it by its own
    path, not links: a venv's interpreter reached through a link elsewhere
    is the base Python, without the venv's packages; and its folder may hold
    another python3 (/usr/bin for a /usr/bin/python3.11)."""
    folder = Path(where) / f"python-{hashlib.sha256(target.encode()).hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    body = f"#!/bin/sh\nexec {shlex.quote(target)} \"$@\"\n"
    for name in ("python", "python3"):
        script = folder / name
        if not script.is_file() or script.read_text() != body:
            # parallel slots write the same scripts: each its own, renamed in place
            tmp = folder / f".{name}.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(body)
            tmp.chmod(0o755)
            os.replace(tmp, script)
    return folder


@dataclass
class CommandProbe:
    """The user's shell command, run from the checkout's root."""

    cmd: str
    timeout: float = DEFAULT_TIMEOUT
    metric_regex: str | None = None
    pythonpath: tuple[str, ...] = ()   # checkout folders put first on PYTHONPATH
    # the interpreter the command's `python` and `python3` run (--sglang-python under --build
    # sglang: the one the build installs into, not whichever PATH finds first)
    python: str | None = None

    @property
    def key(self) -> str:
        # the checkout first on PYTHONPATH (--build sglang) changes which code the
        # command imports: runs with and without it are not one probe's
        extra = {"pythonpath": list(self.pythonpath)} if self.pythonpath else {}
        if self.python:
            extra["python"] = self.python
        # the shell ignores whitespace around the command, so neither does its identity (a
        # tester's cron line with a trailing space started the nightly baseline afresh)
        if self.metric_regex and ("^" in self.metric_regex or "$" in self.metric_regex):
            # anchors match at every line since 2026-12-07 (metric.REGEX_FLAGS): runs an
            # anchored regex read before, from the whole text, were read otherwise
            extra["regex_flags"] = "m"
        return config_key("cmd", cmd=self.cmd.strip(), regex=self.metric_regex, **extra)

    def describe(self) -> str:
        return self.cmd

    def run(self, checkout: Path, log_path: Path, slot: Slot) -> RunResult:
        env = dict(slot.env)
        if slot.port_base:
            env["KLBISECT_PORT_BASE"] = str(slot.port_base)
        if NO_RETRY not in os.environ:
            # SGLang's CustomTestCase reruns a failed test method once in CI (SGLANG_IS_IN_CI):
            # the rerun's fresh draw would hide the high value that failed it
            env.setdefault(NO_RETRY, "0")
        if self.pythonpath:
            inherited = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
            env["PYTHONPATH"] = os.pathsep.join([*(str(Path(checkout).resolve() / d) for d in self.pythonpath),
                                                 *([inherited] if inherited else [])])
        if self.python:
            env.update(python_env(self.python, Path(log_path).parent, env.get("PATH", os.environ.get("PATH", ""))))
        res = run_logged(self.cmd, cwd=checkout, log_path=log_path, timeout=self.timeout,
                         env=env, pid_dir=slot.pid_dir)
        # line by line: a log of hundreds of megabytes is not held whole (but for a --metric-regex,
        # which may span lines)
        with open(log_path, errors="replace") as log:
            values = parse_values(log.read() if self.metric_regex else log, self.metric_regex)

        def lines() -> Iterator[str]:
            with open(log_path, errors="replace") as log:
                yield from log
        status = classify(values, res.exit_code, res.timed_out, lines)
        return RunResult(values, res.exit_code, status, res.duration, str(log_path))
