"""`klbisect demo`: create the demo engine's history and bisect it for real."""
from __future__ import annotations

import os
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import EXIT_USAGE, KlbisectError
from ..config import BisectConfig
from ..result import Result
from ..session import run_bisect
from . import DemoRepo, HistoryError, create_demo_repo, probe_command


@dataclass
class DemoOutcome:
    demo: DemoRepo
    result: Result
    seconds: float
    create_seconds: float

    @property
    def found(self) -> bool:
        return self.result.culprit == self.demo.culprit

    def to_json(self) -> dict:
        return {**self.result.to_json(),
                "demo": {"dir": str(self.demo.path), "planted": self.demo.culprit,
                         "planted_pr": self.demo.culprit_pr, "found": self.found,
                         "repo_commits": self.demo.n_commits, "seconds": round(self.seconds, 1),
                         "create_seconds": round(self.create_seconds, 2)}}

    def reproduce(self) -> str:
        d = shlex.quote(str(self.demo.path))
        probe = shlex.quote(self.demo.probe_cmd)
        return "\n".join([
            "Reproduce it by hand:",
            f"  cd {d}",
            f"  klbisect start --good {self.demo.good[:12]} --bad main --probe-cmd {probe}",
            "  git bisect run klbisect probe",
            "  klbisect status && klbisect report -o report.md",
            "  klbisect reset",
        ])


def _check_cuda(device: str) -> None:
    """--device cuda on a machine without it: one line before any repository
    or probe run, not seven crashed runs and a hint about --metric-regex."""
    import torch  # noqa: PLC0415 - the demo's own dependency
    if not torch.cuda.is_available():
        raise KlbisectError(f"--device {device}: this torch ({torch.__version__}) sees no CUDA device; "
                            "use --device cpu, or a torch built with CUDA on a GPU machine", EXIT_USAGE)
    index = device.split(":", 1)[1] if ":" in device else "0"
    if index.isdigit() and int(index) >= torch.cuda.device_count():
        raise KlbisectError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)",
                            EXIT_USAGE)


def run_demo(directory: str | None, device: str = "cpu", seed: int = 0, parallel: int = 2,
             progress=None) -> DemoOutcome:
    t0 = time.monotonic()
    # bad options first, so no repository is left behind for them
    try:
        probe_command(device)
    except ValueError as e:
        raise KlbisectError(f"--device: {e}", EXIT_USAGE) from None
    if parallel < 1:
        raise KlbisectError(f"--parallel {parallel}: give at least 1 probe at a time", EXIT_USAGE)
    if device.startswith("cuda"):
        _check_cuda(device)
    path = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="klbisect-demo-"))
    try:
        demo = create_demo_repo(path, seed=seed, device=device)
    except (HistoryError, ValueError, OSError) as e:
        raise KlbisectError(f"cannot create the demo in {path}: {e}; pass --dir with a new or empty "
                            "directory", EXIT_USAGE) from None
    created = time.monotonic() - t0
    if progress:
        progress(f"demo repository: {demo.path} ({demo.n_commits} commits, created in {created:.1f}s); "
                 f"bisecting with {demo.probe_cmd!r}")
    # One torch thread per probe: parallel probes share the cores instead of fighting.
    os.environ.setdefault("TINYSERVE_THREADS", "1")
    cfg = BisectConfig(good=demo.good, bad="main", probe_cmd=demo.probe_cmd, timeout=300,
                       parallel=parallel)
    kwargs = {"progress": progress} if progress else {}
    result = run_bisect(demo.path, cfg, **kwargs)
    return DemoOutcome(demo, result, time.monotonic() - t0, created)
