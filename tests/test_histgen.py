"""The synthetic histories are the ground truth of every other test: check them."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from klbisect.histgen import LABELS, History, NoiseModel, make_history

N = 120
CULPRIT = 70


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def checkout(h: History, sha: str) -> None:
    git(h.path, "checkout", "-q", "--detach", sha)


def probe(h: History) -> tuple[int, dict[str, float], str]:
    """Run the committed probe once; return exit code, label -> value, full output."""
    r = subprocess.run([sys.executable, "probe.py"], cwd=h.path, capture_output=True, text=True,
                       timeout=30)
    values = dict((m.group(1), float(m.group(2))) for m in re.finditer(
        r"^\[(\w+)\] \d+ samples, \d+ turns\nkl_divs=\[.*\]\navg_kl_div=(\S+)$", r.stdout, re.M))
    return r.returncode, values, r.stdout + r.stderr


def build(h: History) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "build.py"], cwd=h.path, capture_output=True,
                          text=True, timeout=30)


@pytest.fixture(scope="module")
def hist(tmp_path_factory) -> History:
    return make_history(tmp_path_factory.mktemp("hist") / "repo", n_commits=N,
                        culprit_index=CULPRIT, seed=11, build_broken_before=2, crash_before=2,
                        merges=8)


def test_first_parent_chain(hist):
    assert len(hist.shas) == N
    assert git(hist.path, "rev-list", "--first-parent", "--count", "main").strip() == str(N)
    assert git(hist.path, "rev-list", "--first-parent", "--reverse", "main").split() == hist.shas
    assert hist.good == hist.shas[0] and hist.bad == hist.shas[-1]
    assert git(hist.path, "rev-parse", "--abbrev-ref", "HEAD").strip() == "main"
    assert git(hist.path, "status", "--porcelain").strip() == ""
    assert git(hist.path, "rev-list", "--max-parents=0", "main").strip() == hist.shas[0]


def test_culprit_is_a_plain_mainline_commit_editing_the_data_file(hist):
    assert hist.culprit_index == CULPRIT and hist.shas[CULPRIT] == hist.culprit
    assert len(git(hist.path, "rev-list", "--parents", "-n1", hist.culprit).split()) == 2
    changed = git(hist.path, "diff", "--name-only", hist.culprit + "^", hist.culprit).split()
    assert "python/kvserve/numerics.json" in changed
    assert hist.culprit not in hist.merges + hist.build_broken + hist.crashing
    assert hist.expected_block == [hist.culprit] and hist.expected_culprit == hist.culprit


def test_probe_values_and_exit_codes(hist):
    lo_g, hi_g = hist.noise.good
    lo_b, hi_b = hist.noise.bad
    checkout(hist, hist.good)
    for _ in range(3):
        rc, values, out = probe(hist)
        assert rc == 0, out
        assert set(values) == set(LABELS)
        assert all(lo_g <= v <= hi_g for v in values.values()), values
    checkout(hist, hist.culprit)
    codes = set()
    for _ in range(6):
        rc, values, out = probe(hist)
        moving = values.pop(hist.noise.moving_label)
        assert lo_b <= moving <= hi_b
        assert all(lo_g <= v <= hi_g for v in values.values()), values
        assert rc == (1 if moving >= hist.noise.threshold else 0)
        if rc:
            assert "AssertionError" in out
        codes.add(rc)
    print("exit codes seen at the culprit:", codes)
    git(hist.path, "checkout", "-q", "main")


def test_a_draws_folder_replays_each_commits_runs(hist, tmp_path, monkeypatch):
    """KVSERVE_PROBE_DRAWS: the nth run of a commit draws the same in every
    new folder, whatever ran at other commits between; runs differ from
    each other; KVSERVE_PROBE_SEED picks another set."""
    def runs(folder: str, seed: str = "") -> list[dict[str, float]]:
        monkeypatch.setenv("KVSERVE_PROBE_DRAWS", str(tmp_path / folder))
        monkeypatch.setenv("KVSERVE_PROBE_SEED", seed)
        out = []
        for sha in (hist.good, hist.good, hist.culprit, hist.good) if folder != "b" else (
                hist.culprit, hist.good, hist.good, hist.good):
            checkout(hist, sha)
            out.append((sha, probe(hist)[1]))
        git(hist.path, "checkout", "-q", "main")
        return sorted(out, key=lambda r: r[0] == hist.good)   # the culprit's run, then good's in order
    a, b = runs("a"), runs("b")
    assert a == b
    goods = [v for sha, v in a if sha == hist.good]
    assert len({json.dumps(v) for v in goods}) == 3
    assert runs("c", seed="7") != a


def test_probe_is_fast(hist):
    checkout(hist, hist.good)
    t = time.perf_counter()
    probe(hist)
    elapsed = time.perf_counter() - t
    print(f"\nprobe run: {elapsed:.3f} s")
    assert elapsed < 2.0  # catches a heavy import or a sleep; about 0.05 s when idle
    git(hist.path, "checkout", "-q", "main")


def test_crashing_commits_print_no_value(hist):
    assert len(hist.crashing) == 2
    for sha in hist.crashing:
        assert CULPRIT - 10 <= hist.index(sha) <= CULPRIT - 2
        checkout(hist, sha)
        rc, values, out = probe(hist)
        assert rc != 0 and values == {} and "avg_kl_div" not in out
        assert "illegal memory access" in out
    git(hist.path, "checkout", "-q", "main")


def test_build_fails_exactly_at_broken_commits(hist):
    assert len(hist.build_broken) == 2
    broken = set(hist.build_broken)
    for i in range(CULPRIT - 11, CULPRIT + 2):
        sha = hist.shas[i]
        checkout(hist, sha)
        r = build(hist)
        if sha in broken:
            assert r.returncode == 1 and "error" in r.stderr, r.stdout
            changed = git(hist.path, "diff", "--name-only", sha + "^", sha).split()
            assert set(changed) & set(hist.build_paths), changed
            assert CULPRIT - 10 <= i <= CULPRIT - 2
        else:
            assert r.returncode == 0, r.stderr
            assert (hist.path / ".build" / "stamp").is_file()
    assert git(hist.path, "status", "--porcelain").strip() == ""  # .build/ is ignored
    git(hist.path, "checkout", "-q", "main")


def test_merges(hist):
    assert len(hist.merges) == 8
    for sha in hist.merges:
        parents = git(hist.path, "rev-list", "--parents", "-n1", sha).split()[1:]
        assert len(parents) == 2
        assert parents[0] == hist.shas[hist.index(sha) - 1]
        assert parents[1] not in hist.shas
    chain = set(hist.shas)
    assert hist.side_commits and not chain & set(hist.side_commits)
    assert int(git(hist.path, "rev-list", "--count", "main")) == N + len(hist.side_commits)


def test_subjects_and_prs(hist):
    prs = [hist.prs[s] for s in hist.shas]
    assert prs == sorted(prs) and len(set(prs)) == len(prs)
    for sha in hist.shas:
        subject = hist.subjects[sha]
        assert git(hist.path, "log", "-1", "--format=%s", sha).strip() == subject
        if sha in hist.merges:
            assert subject.startswith(f"Merge pull request #{hist.prs[sha]} from ")
        else:
            assert subject.endswith(f"(#{hist.prs[sha]})"), subject


def test_determinism_and_seed_sensitivity(tmp_path):
    a = make_history(tmp_path / "a", n_commits=60, seed=5)
    b = make_history(tmp_path / "b", n_commits=60, seed=5)
    c = make_history(tmp_path / "c", n_commits=60, seed=6)
    assert a.shas == b.shas and a.culprit == b.culprit and a.subjects == b.subjects
    assert a.shas != c.shas


def test_crash_right_before_forms_a_block(tmp_path):
    h = make_history(tmp_path / "r", n_commits=40, culprit_index=20, seed=2,
                     crash_right_before=True, merges=3)
    assert h.crashing == [h.shas[19]]
    assert h.expected_block == [h.shas[19], h.culprit] and h.expected_culprit is None
    checkout(h, h.shas[19])
    rc, values, _ = probe(h)
    assert rc != 0 and values == {}
    checkout(h, h.culprit)
    rc, values, _ = probe(h)
    assert set(values) == set(LABELS)


def test_noise_spec_crash_rate_and_required_build(tmp_path):
    noise = NoiseModel(kind="lognormal", good=(0.001, 0.2), bad=(0.003, 0.2), crash_rate=1.0)
    h = make_history(tmp_path / "n", n_commits=5, seed=1, noise=noise, merges=0,
                     subject_style="plain")
    assert h.prs == {} and not any("(#" in s for s in h.subjects.values())
    rc, values, _ = probe(h)
    assert rc != 0 and values == {}

    h = make_history(tmp_path / "b", n_commits=5, seed=1, merges=0, probe_requires_build=True)
    rc, values, out = probe(h)
    assert rc != 0 and values == {} and "build.py" in out
    assert build(h).returncode == 0
    rc, values, _ = probe(h)
    assert set(values) == set(LABELS)


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError):
        make_history(tmp_path / "x", n_commits=10, culprit_index=10)
    with pytest.raises(ValueError):
        make_history(tmp_path / "y", n_commits=10, culprit_index=3, build_broken_before=3)
    (tmp_path / "z").mkdir()
    (tmp_path / "z" / "f").write_text("x")
    with pytest.raises(ValueError):
        make_history(tmp_path / "z", n_commits=10)


def test_large_history(tmp_path):
    t = time.perf_counter()
    h = make_history(tmp_path / "big", n_commits=1000, seed=3, build_broken_before=3,
                     crash_before=2, merges=20)
    print(f"\n1000-commit history created in {time.perf_counter() - t:.2f} s")
    assert len(h.shas) == 1000 and len(h.merges) == 20
    assert any(s.startswith('Revert "') for s in h.subjects.values())
    # the window rule: everything untestable sits within 10 commits before the culprit
    for sha in h.build_broken + h.crashing:
        assert h.culprit_index - 10 <= h.index(sha) <= h.culprit_index - 2


def test_the_generator_is_a_command_a_new_user_can_run(tmp_path):
    """`python -m klbisect.histgen --help` printed nothing: a new user had
    to write their own wrapper to make a history to try klbisect on."""
    repo, answer = tmp_path / "r", tmp_path / "answer.json"
    p = subprocess.run([sys.executable, "-m", "klbisect.histgen", str(repo), "--commits", "30", "--seed", "4",
                        "--answer", str(answer)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    info, truth = json.loads(p.stdout), json.loads(answer.read_text())
    assert "answer" not in info and "klbisect run --good" in info["try"]
    log = subprocess.run(["git", "rev-list", "--first-parent", "main"], cwd=repo, capture_output=True,
                         text=True).stdout.split()
    assert len(log) == 30 and log[0] == info["bad"] and log[-1] == info["good"] and truth["culprit"] in log
    again = subprocess.run([sys.executable, "-m", "klbisect.histgen", str(repo)], capture_output=True, text=True)
    assert again.returncode == 2 and "exists and is not empty" in again.stderr and "Traceback" not in again.stderr
