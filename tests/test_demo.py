"""The embedded demo: deterministic history, a culprit that moves the KL, SGLang-style output."""
from __future__ import annotations

import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from klbisect.demo import DemoRepo, HistoryError, create_demo_repo

LABELS = ("logprobs_match", "prefill_cache_hit", "decode_cache_hit")
THRESHOLD = 0.01


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRepo:
    return create_demo_repo(tmp_path_factory.mktemp("demo") / "repo", seed=0)


def test_same_seed_same_history(tmp_path: Path) -> None:
    start = time.perf_counter()
    a = create_demo_repo(tmp_path / "a", seed=3)
    elapsed = time.perf_counter() - start
    b = create_demo_repo(tmp_path / "b", seed=3)
    c = create_demo_repo(tmp_path / "c", seed=4)
    assert (a.good, a.bad, a.culprit, a.culprit_pr, a.n_commits) == (b.good, b.bad, b.culprit, b.culprit_pr, b.n_commits)
    assert git(a.path, "rev-list", "main") == git(b.path, "rev-list", "main")
    assert c.bad != a.bad
    assert elapsed < 15, f"creating the repository took {elapsed:.1f} s"


def test_repository_shape(demo: DemoRepo) -> None:
    assert git(demo.path, "symbolic-ref", "--short", "HEAD").strip() == "main"
    assert git(demo.path, "status", "--porcelain", "--untracked-files=all") == ""
    shas = git(demo.path, "rev-list", "--reverse", "--first-parent", "main").split()
    assert len(shas) == demo.n_commits and 200 <= demo.n_commits <= 400
    assert shas[0] == demo.good and shas[-1] == demo.bad
    assert git(demo.path, "rev-list", "--max-parents=0", "main").split() == [demo.good]
    position = shas.index(demo.culprit)
    assert 0.3 * len(shas) <= position <= 0.7 * len(shas)

    subjects = git(demo.path, "log", "--reverse", "--format=%s", "main").splitlines()
    prs = [int(m.group(1)) for s in subjects if (m := re.search(r" \(#(\d+)\)$", s))]
    assert len(prs) == len(subjects), "every subject ends with (#NNNNN)"
    assert prs == sorted(set(prs)), "PR numbers increase"
    assert subjects[position].endswith(f"(#{demo.culprit_pr})")
    touched = git(demo.path, "show", "--name-only", "--format=", demo.culprit).split()
    assert set(touched) == {"tinyserve/attention/registry.py", "tinyserve/model.py"}
    assert sum(s.startswith("Revert ") for s in subjects) >= 1


def test_refuses_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(HistoryError):
        create_demo_repo(tmp_path, seed=0)
    assert (tmp_path / "x").read_text() == "keep me"


def test_klbisect_demo_bad_options_leave_no_repository(tmp_path: Path) -> None:
    import torch
    cases = [(["--device", "tpu"], "--device"), (["--parallel", "0"], "--parallel 0")]
    if not torch.cuda.is_available():
        # checked before the repository is made, not found after seven crashed probe runs
        cases.append((["--device", "cuda"], "--device cuda: this torch"))
    for opts, words in cases:
        where = tmp_path / opts[0].strip("-")
        p = subprocess.run([sys.executable, "-m", "klbisect", "demo", "--dir", str(where), *opts],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 150 and p.stderr.startswith(f"klbisect: error: {words}"), p.stderr
        assert "Traceback" not in p.stderr and not where.exists()
    # a --dir under a file: a usage line, not an internal error
    (tmp_path / "afile").write_text("x")
    p = subprocess.run([sys.executable, "-m", "klbisect", "demo", "--dir", str(tmp_path / "afile" / "sub")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 150 and "pass --dir with a new or empty directory" in p.stderr, p.stderr


def parse(output: str) -> dict[str, tuple[list[float], float]]:
    """label -> (kl_divs, avg_kl_div); the three lines must follow each other."""
    lines = output.splitlines()
    found: dict[str, tuple[list[float], float]] = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\[(\w+)\] (\d+) samples, ", line)
        if not m:
            continue
        divs = re.fullmatch(r"kl_divs=\[(.*)\]", lines[i + 1])
        avg = re.fullmatch(r"avg_kl_div=([0-9.]+)", lines[i + 2])
        assert divs and avg, f"label line not followed by kl_divs= and avg_kl_div=:\n{output}"
        values = [float(x) for x in divs.group(1).split(", ")]
        assert len(values) == int(m.group(2))
        found[m.group(1)] = (values, float(avg.group(1)))
    return found


def test_probe_separates_good_from_culprit(demo: DemoRepo, tmp_path: Path) -> None:
    trees = {}
    for name, rev in (("good", demo.good), ("before", f"{demo.culprit}~1"), ("bad", demo.culprit)):
        trees[name] = tmp_path / name
        git(demo.path, "worktree", "add", "--quiet", "--detach", str(trees[name]), rev)
    assert demo.probe_cmd.endswith("-m tinyserve.kl_test --device cpu")
    jobs = [("good", 11), ("good", 12), ("good", None), ("bad", 11), ("bad", 12), ("bad", None), ("before", 11)]

    def run(job: tuple[str, int | None]) -> subprocess.CompletedProcess[str]:
        name, seed = job
        cmd = [sys.executable, "-m", "tinyserve.kl_test", "--device", "cpu"]
        cmd += [] if seed is None else ["--seed", str(seed)]
        return subprocess.run(cmd, cwd=trees[name], capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = list(pool.map(run, jobs))

    results: dict[str, list[dict[str, float]]] = {"good": [], "bad": [], "before": []}
    seeds_printed = []
    for (name, seed), proc in zip(jobs, procs):
        parsed = parse(proc.stdout)
        assert set(parsed) == set(LABELS), proc.stdout + proc.stderr
        for values, avg in parsed.values():
            assert avg == pytest.approx(sum(values) / len(values), abs=2e-5)
        avgs = {label: avg for label, (_, avg) in parsed.items()}
        results[name].append(avgs)
        failing = max(avgs.values()) >= THRESHOLD
        # A failing run has printed its values and then fails like a unittest.
        assert proc.returncode == (1 if failing else 0), proc.stderr
        assert ("AssertionError" in proc.stderr) == failing
        if seed is None:
            seeds_printed.append(re.search(r"seed (\d+)$", proc.stdout.splitlines()[0]).group(1))

    assert seeds_printed[0] != seeds_printed[1], "unpinned runs draw fresh prompts"
    assert results["before"][0] == results["good"][0], "every commit before the culprit measures like the root"
    assert results["bad"][0] != results["good"][0]
    for label in LABELS:
        good = statistics.median(r[label] for r in results["good"])
        bad = statistics.median(r[label] for r in results["bad"])
        assert 0.0025 <= good <= 0.0065, (label, results)
        assert 0.0065 <= bad <= 0.016, (label, results)
        assert bad >= 1.5 * good, (label, results)
    assert all(max(r.values()) < THRESHOLD for r in results["good"][:2]), results


def test_klbisect_demo_finds_the_planted_culprit(tmp_path: Path) -> None:
    """The README's first command, as a user runs it: a real bisect of the
    engine's history with its own KL probe, ending in one JSON object."""
    import json

    target = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "klbisect", "demo", "--dir", str(target), "--json"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    planted = create_demo_repo(tmp_path / "again")  # same seed, same history
    assert out["culprit"] == planted.culprit == out["demo"]["planted"]
    assert out["pr"] == planted.culprit_pr and out["demo"]["found"] is True
    assert out["confidence"] >= 0.99
    assert set(out["labels"]) == {"logprobs_match", "prefill_cache_hit", "decode_cache_hit"}
    assert "git bisect run klbisect probe" in proc.stderr
    assert "Traceback" not in proc.stderr
