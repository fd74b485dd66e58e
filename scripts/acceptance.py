#!/usr/bin/env python3
"""Acceptance trials: use klbisect the way a new user would, on fresh histories.

Each trial creates a seeded synthetic history (klbisect.histgen) with a planted
KL regression and runs the public CLI on it, either end to end
(``klbisect run --json``) or through git (``klbisect start``, then
``git bisect run klbisect probe``, ``klbisect status --json``,
``klbisect reset``). It reports per scenario and mode how often the answer
was right and how many probe runs it took. The CLI is only ever called as a
subprocess, so this measures what a user gets, not what a unit test sees.

    python scripts/acceptance.py --trials 20 --scenario all --mode both
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from klbisect.histgen import History, NoiseModel, make_history  # noqa: E402

SCENARIOS = ("plain", "build-fail", "crash-before", "crash-right-before", "merges")
MODES = ("run", "gitbisect")


def scenario_kwargs(scenario: str, commits: int) -> dict:
    return {
        "plain": {},
        "build-fail": {"build_broken_before": 3},
        "crash-before": {"crash_before": 3},
        "crash-right-before": {"crash_right_before": True},
        "merges": {"merges": max(10, commits // 10)},
    }[scenario]


@dataclass
class Trial:
    scenario: str
    mode: str
    seed: int
    culprit_index: int
    expected: list[str]          # the block a correct answer names (one sha, or several)
    answer: list[str]            # what klbisect (or git) named
    correct: bool
    contains: bool               # the planted culprit is among the named commits
    probe_runs: int | None
    seconds: float
    error: str = ""


def klbisect(args: list[str], cwd: Path | None, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klbisect", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=child_env())


def child_env() -> dict[str, str]:
    """Make ``python -m klbisect`` importable even when the project is not installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def last_json(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def tail(text: str, n: int = 3) -> str:
    return " | ".join(text.strip().splitlines()[-n:])


def judge(h: History, answer: list[str], culprit: str | None) -> tuple[bool, bool]:
    expected = h.expected_block
    if len(expected) == 1:
        correct = culprit == h.culprit
    else:
        correct = culprit is None and set(answer) == set(expected)
    return correct, h.culprit in answer


def trial_run(h: History, args: argparse.Namespace) -> tuple[list[str], str | None, int | None, str]:
    cmd = ["run", "--repo", str(h.path), "--good", h.good, "--bad", "main",
           "--probe-cmd", h.probe_cmd, "--build-cmd", h.build_cmd, "--json", *args.klb_args]
    r = klbisect(cmd, None, args.timeout)
    obj = last_json(r.stdout)
    if obj is None:
        return [], None, None, f"exit {r.returncode}: {tail(r.stderr)}"
    return list(obj.get("candidates") or []), obj.get("culprit"), obj.get("probe_runs"), ""


def parse_git_bisect(out: str) -> list[str]:
    m = re.search(r"^([0-9a-f]{40}) is the first bad commit", out, re.M)
    if m:
        return [m.group(1)]
    if "could be any of" in out:
        rest = out.split("could be any of", 1)[1]
        return re.findall(r"^([0-9a-f]{40})\s*$", rest, re.M)
    return []


def trial_gitbisect(h: History, args: argparse.Namespace) -> tuple[list[str], str | None, int | None, str]:
    repo = str(h.path)
    r = klbisect(["start", "--repo", repo, "--good", h.good, "--bad", "main",
                  "--probe-cmd", h.probe_cmd, "--build-cmd", h.build_cmd, *args.klb_args],
                 h.path, args.timeout)
    if r.returncode != 0:
        return [], None, None, f"start exit {r.returncode}: {tail(r.stderr)}"
    try:
        g = subprocess.run(["git", "bisect", "run", sys.executable, "-m", "klbisect", "probe"],
                           cwd=h.path, capture_output=True, text=True, timeout=args.timeout,
                           env=child_env())
        answer = parse_git_bisect(g.stdout)
        error = "" if answer else f"git bisect run exit {g.returncode}: {tail(g.stdout + g.stderr)}"
        st = last_json(klbisect(["status", "--repo", repo, "--json"], h.path, args.timeout).stdout)
        runs = st.get("probe_runs") if st else None
        if st and answer and args.verbose:
            res = st.get("result") or {}
            if res and set(res.get("candidates") or []) != set(answer):
                print(f"    note: status says {res.get('candidates')}, git said {answer}")
    finally:
        klbisect(["reset", "--repo", repo], h.path, args.timeout)
    return answer, answer[0] if len(answer) == 1 else None, runs, error


def one_trial(scenario: str, mode: str, seed: int, workdir: Path,
              args: argparse.Namespace) -> Trial:
    noise = NoiseModel(kind=args.noise, outlier_rate=args.outlier_rate, crash_rate=args.crash_rate)
    if args.noise == "lognormal":
        noise.good, noise.bad = (0.0042, 0.2), (0.0095, 0.2)
    path = workdir / f"{scenario}-{mode}-{seed}"
    h = make_history(path, n_commits=args.commits, seed=seed, noise=noise,
                     probe_requires_build=args.require_build,
                     **scenario_kwargs(scenario, args.commits))
    t = time.perf_counter()
    try:
        fn = trial_run if mode == "run" else trial_gitbisect
        answer, culprit, runs, error = fn(h, args)
    except subprocess.TimeoutExpired as exc:
        answer, culprit, runs, error = [], None, None, f"timeout after {exc.timeout:.0f} s"
    seconds = time.perf_counter() - t
    correct, contains = judge(h, answer, culprit)
    if not args.keep:
        shutil.rmtree(path, ignore_errors=True)
    return Trial(scenario, mode, seed, h.culprit_index, h.expected_block, answer, correct,
                 contains, runs, seconds, error)


def p95(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.95 * len(xs)) - 1)]


def summarize(trials: list[Trial]) -> str:
    head = (f"{'scenario':<20} {'mode':<10} {'trials':>6} {'accuracy':>9} {'contains':>9} "
            f"{'runs mean':>10} {'runs p95':>9} {'sec mean':>9} {'errors':>7}")
    lines = [head, "-" * len(head)]
    groups: dict[tuple[str, str], list[Trial]] = {}
    for t in trials:
        groups.setdefault((t.scenario, t.mode), []).append(t)
    for (scenario, mode), ts in groups.items():
        runs = [t.probe_runs for t in ts if t.probe_runs is not None]
        lines.append(
            f"{scenario:<20} {mode:<10} {len(ts):>6} "
            f"{sum(t.correct for t in ts) / len(ts):>9.0%} {sum(t.contains for t in ts) / len(ts):>9.0%} "
            f"{(sum(runs) / len(runs) if runs else float('nan')):>10.1f} "
            f"{(p95(runs) if runs else float('nan')):>9.0f} "
            f"{sum(t.seconds for t in ts) / len(ts):>9.1f} {sum(bool(t.error) for t in ts):>7}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=10, help="trials per scenario and mode")
    ap.add_argument("--commits", type=int, default=1000, help="first-parent commits per history")
    ap.add_argument("--scenario", action="append", choices=SCENARIOS + ("all",),
                    help="repeatable; default plain")
    ap.add_argument("--mode", choices=MODES + ("both",), default="both")
    ap.add_argument("--seed", type=int, default=0,
                    help="base seed; trial i of the k-th scenario uses seed + 1000*k + i "
                         "(both modes see the same histories)")
    ap.add_argument("--noise", choices=("uniform", "lognormal"), default="uniform")
    ap.add_argument("--outlier-rate", type=float, default=0.0)
    ap.add_argument("--crash-rate", type=float, default=0.0)
    ap.add_argument("--require-build", action="store_true",
                    help="the probe fails (no value) unless the last build matches the packaging")
    ap.add_argument("--klb-args", type=shlex.split, default=[],
                    help='extra klbisect options, e.g. "--parallel 4 --confidence 0.999"')
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per klbisect command")
    ap.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")
    ap.add_argument("--keep", action="store_true", help="keep the generated repositories")
    ap.add_argument("--json-out", type=Path, default=None, help="write every trial as JSON")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    scen = args.scenario or ["plain"]
    args.scenario = list(SCENARIOS) if "all" in scen else list(dict.fromkeys(scen))
    args.modes = list(MODES) if args.mode == "both" else [args.mode]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="klb-accept-"))
    workdir.mkdir(parents=True, exist_ok=True)
    trials: list[Trial] = []
    try:
        for scenario in args.scenario:
            for mode in args.modes:
                for i in range(args.trials):
                    seed = args.seed + 1000 * SCENARIOS.index(scenario) + i
                    t = one_trial(scenario, mode, seed, workdir, args)
                    trials.append(t)
                    mark = "ok " if t.correct else ("~  " if t.contains else "BAD")
                    got = ",".join(s[:10] for s in t.answer) or "-"
                    print(f"{mark} {scenario:<19} {mode:<9} seed={t.seed:<5} planted@{t.culprit_index:<5} "
                          f"got={got:<22} runs={t.probe_runs} {t.seconds:6.1f}s {t.error}",
                          flush=True)
    except KeyboardInterrupt:
        print("interrupted; summary of the finished trials:")
    finally:
        if args.workdir is None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if not trials:
        return 1
    print()
    print(summarize(trials))
    if args.json_out:
        args.json_out.write_text(json.dumps([asdict(t) for t in trials], indent=1))
    return 0 if all(t.correct for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
