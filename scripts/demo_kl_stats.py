"""KL distributions of the demo engine at its good and culprit commits.

Creates a fresh demo repository, checks out the root (good) and the culprit
commit in two worktrees, runs the engine's KL probe ``--runs`` times in each
(alternating, so that load changes hit both alike) and prints min / median /
max per label, how many runs crossed the threshold, and seconds per run.

    PYTHONPATH=. python scripts/demo_kl_stats.py --device cuda --runs 20

Needs only the standard library, torch (for the probe) and git: no GitPython.
"""
from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from klbisect.demo import create_demo_repo

THRESHOLD = 0.01
_LABEL = re.compile(r"^\[(\w+)\] ")
_AVG = re.compile(r"^avg_kl_div=([-+0-9.eEinfa]+)\s*$")


@dataclass
class Runs:
    """Everything measured at one commit."""

    values: dict[str, list[float]] = field(default_factory=dict)
    seconds: list[float] = field(default_factory=list)
    exit_codes: list[int] = field(default_factory=list)
    no_value: int = 0


def parse_kl(output: str) -> dict[str, float]:
    """label -> avg_kl_div, from the first avg_kl_div line after each label line."""
    values: dict[str, float] = {}
    label: str | None = None
    for line in output.splitlines():
        m = _LABEL.match(line)
        if m:
            label = m.group(1)
            continue
        m = _AVG.match(line)
        if m and label is not None:
            values[label] = float(m.group(1))
            label = None
    return values


def run_probe(cmd: str, cwd: Path, timeout: float) -> tuple[dict[str, float], int, float, str]:
    start = time.perf_counter()
    proc = subprocess.run(shlex.split(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - start
    output = proc.stdout + proc.stderr
    return parse_kl(output), proc.returncode, elapsed, output


def startup_seconds(python: str) -> float:
    """Time of a bare ``import torch``, the floor of every probe run."""
    start = time.perf_counter()
    subprocess.run([python, "-c", "import torch"], check=True)
    return time.perf_counter() - start


def fmt(xs: list[float], digits: int = 4) -> str:
    if not xs:
        return "-"
    return f"{min(xs):.{digits}f} / {statistics.median(xs):.{digits}f} / {max(xs):.{digits}f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--runs", type=int, default=10, help="probe runs per commit")
    parser.add_argument("--seed", type=int, default=0, help="demo history seed")
    parser.add_argument("--dir", type=Path, default=None, help="where to create the demo repository")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per probe run")
    parser.add_argument("--json", dest="json_path", type=Path, default=None, help="also write raw results here")
    parser.add_argument("--show-output", action="store_true", help="print the first run's output")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="klbisect-demo-")) if args.dir is None else args.dir
    start = time.perf_counter()
    demo = create_demo_repo(workdir / "repo", seed=args.seed, device=args.device)
    created = time.perf_counter() - start
    print(f"demo repo: {demo.path} ({demo.n_commits} commits, culprit #{demo.culprit_pr} "
          f"{demo.culprit[:12]}), created in {created:.2f} s")
    print(f"probe: {demo.probe_cmd}")
    cmd = demo.probe_cmd

    trees: dict[str, Path] = {}
    for name, sha in (("good", demo.good), ("bad", demo.culprit)):
        trees[name] = workdir / f"wt-{name}"
        subprocess.run(["git", "-C", str(demo.path), "worktree", "add", "--quiet", "--detach", str(trees[name]), sha],
                       check=True)
    print(f"python + import torch: {startup_seconds(sys.executable):.2f} s")

    results = {name: Runs() for name in trees}
    for i in range(args.runs):
        for name, tree in trees.items():
            values, code, seconds, output = run_probe(cmd, tree, args.timeout)
            runs = results[name]
            runs.seconds.append(seconds)
            runs.exit_codes.append(code)
            if not values:
                runs.no_value += 1
                print(f"[{name} run {i}] no value, exit {code}:\n{output[-2000:]}", file=sys.stderr)
            for label, value in values.items():
                runs.values.setdefault(label, []).append(value)
            if args.show_output and i == 0:
                print(f"--- {name} output ---\n{output}--- end ---")
        print(f"run {i + 1}/{args.runs} done", file=sys.stderr, flush=True)

    labels = sorted({label for runs in results.values() for label in runs.values})
    print()
    print(f"device {args.device}, {args.runs} runs per commit, threshold {THRESHOLD}")
    print(f"{'commit':6s}  {'label':18s}  {'n':>3s}  {'min / median / max':26s}  {'>= thr':>6s}")
    for name, runs in results.items():
        for label in labels:
            xs = runs.values.get(label, [])
            over = sum(x >= THRESHOLD for x in xs)
            print(f"{name:6s}  {label:18s}  {len(xs):3d}  {fmt(xs):26s}  {over:6d}")
    print()
    print(f"{'commit':6s}  {'seconds per run (min / median / max)':38s}  exit codes")
    for name, runs in results.items():
        codes = {c: runs.exit_codes.count(c) for c in sorted(set(runs.exit_codes))}
        print(f"{name:6s}  {fmt(runs.seconds, 2):38s}  {codes}  no value: {runs.no_value}")
    if args.json_path is not None:
        raw = {name: vars(runs) for name, runs in results.items()}
        args.json_path.write_text(json.dumps({"device": args.device, "created_s": created, "results": raw}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
