"""The embedded demo: a small torch inference engine with a planted KL regression.

``create_demo_repo`` writes a git repository whose few hundred squash commits
evolve the engine in ``engine/``; one of them (the culprit) changes attention
backend resolution so that prefill runs through an FP8 Q/K/V quantization
hook, which roughly doubles the engine's KL metric. The engine ships its own
probe (``python -m tinyserve.kl_test``), printing SGLang-style KL lines.

This package uses only the standard library and ``git``: it must run where
GitPython and the rest of klbisect are not installed.
"""
from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from klbisect.demo.history import HistoryError, HistoryPlan, check_target, plan_history, write_repository

__all__ = ["DemoRepo", "HistoryError", "create_demo_repo", "probe_command"]

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class DemoRepo:
    path: Path
    good: str  # root commit: engine before the regression
    bad: str  # HEAD of main
    culprit: str  # first bad commit
    culprit_pr: int
    probe_cmd: str  # shell command, run from the repository root
    n_commits: int


def probe_command(device: str = "cpu", python: str | None = None) -> str:
    """Shell command that runs the engine's KL test once on ``device``."""
    if device.split(":", 1)[0] not in DEVICES:
        raise ValueError(f"device must be cpu, cuda or cuda:N, not {device!r}")
    # The interpreter running klbisect is the one known to have torch.
    exe = shlex.quote(python or sys.executable)
    return f"{exe} -m tinyserve.kl_test --device {shlex.quote(device)}"


def create_demo_repo(path: Path, seed: int = 0, device: str = "cpu") -> DemoRepo:
    """Create the demo repository at ``path`` (must be absent or an empty directory)."""
    path = Path(path)
    probe_cmd = probe_command(device)
    check_target(path)
    plan: HistoryPlan = plan_history(seed)
    shas = write_repository(path, plan)
    return DemoRepo(
        path=path.resolve(),
        good=shas[0],
        bad=shas[-1],
        culprit=shas[plan.culprit_index],
        culprit_pr=plan.culprit_pr,
        probe_cmd=probe_cmd,
        n_commits=len(shas),
    )
