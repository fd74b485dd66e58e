"""Build a small git history of a fake SGLang with a planted KL regression.

The fake server's sources live in ``tests/fakesglang/``; this writes them into
a new repository under ``python/`` and commits a squash-merge style history
(``Subject (#NNNNN)``) with ``git fast-import`` (one process, fixed dates, so
the shas are the same on every machine). Planted:

- the culprit routes the prefill GEMMs through an FP8 hook
  (``python/sglang/numerics.py``): avg KL about 0.004 -> 0.010;
- later, a commit whose server dies at start (a stale import), fixed by the
  next commit;
- a kernel pin bump and a kernel-source-only commit, for the builder.
"""
from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import NamedTuple

FAKE = Path(__file__).resolve().parent / "fakesglang"
SOURCES = {
    "python/sglang/__init__.py": "__init__.py",
    "python/sglang/launch_server.py": "launch_server.py",
    "python/sglang/engine.py": "engine.py",
    "python/sglang/numerics.py": "numerics.py",
    "python/pyproject.toml": "pyproject.toml",
}
BROKEN_IMPORT = "from sglang.srt.model_loader.loader import DefaultModelLoader  # noqa: F401\n"
VOCAB = 512


class SGLangRepo(NamedTuple):
    path: Path
    good: str
    bad: str
    culprit: str
    broken: str          # the server exits at start here (fixed by the next commit)
    prompts: Path
    shas: list[str]      # oldest first
    subjects: list[str]


def _subjects(n: int, culprit: int, broken: int, pin_bump: int, kernel_only: int) -> list[str]:
    generic = [
        "[Docs] Update the server arguments page", "Fix typo in scheduler comments",
        "Add a unit test for the prefix cache", "Refactor sampling params validation",
        "[CI] Retry flaky nightly job", "Clean up unused imports in the tokenizer manager",
        "Support extra_key in GenerateReqInput", "Improve logging of health checks",
        "[Misc] Rename internal helper", "Speed up the detokenizer loop",
    ]
    out = []
    for i in range(n):
        if i == 0:
            s = "Initial fake SGLang"
        elif i == culprit:
            s = "Resolve the attention backend from server args"
        elif i == broken:
            s = "Move the model loader into srt/model_loader"
        elif i == broken + 1:
            s = "Fix stale import after the model loader move"
        elif i == pin_bump:
            s = "Bump sglang-kernel to 0.3.2"
        elif i == kernel_only:
            s = "[sgl-kernel] Tune the decode attention kernel"
        else:
            s = generic[i % len(generic)]
        out.append(f"{s} (#{27000 + 7 * i})")
    return out


def _files_at(i: int, culprit: int, broken: int, pin_bump: int, kernel_only: int) -> dict[str, str]:
    """The full tree of commit ``i`` (fast-import gets only what changed)."""
    files = {dst: (FAKE / src).read_text() for dst, src in SOURCES.items()}
    if i >= culprit:
        files["python/sglang/numerics.py"] = files["python/sglang/numerics.py"].replace(
            "PREFILL_FP8_GEMM = False", "PREFILL_FP8_GEMM = True")
    if i == broken:
        files["python/sglang/launch_server.py"] = files["python/sglang/launch_server.py"].replace(
            "import sys\n", "import sys\n\n" + BROKEN_IMPORT, 1)
    if i >= pin_bump:
        files["python/pyproject.toml"] = files["python/pyproject.toml"].replace(
            "sglang-kernel==0.3.1", "sglang-kernel==0.3.2")
    files["sgl-kernel/csrc/attention.cu"] = (
        "// fake kernel source\n" + ("// tuned\n" if i >= kernel_only else ""))
    files["README.md"] = "# fake sglang\n"
    files["docs/changes.md"] = "".join(f"- change {k}\n" for k in range(i + 1) if k != kernel_only)
    files[".gitignore"] = "__pycache__/\n*.egg-info/\n"
    return files


def make_sglang_repo(root: Path, n_commits: int = 40, culprit_index: int = 24,
                     good_index: int = 1, seed: int = 0, num_prompts: int = 8) -> SGLangRepo:
    """Create ``root/repo`` and ``root/prompts.json``; the culprit is the first
    commit with the high KL, ``good`` and ``bad`` bracket it."""
    broken, pin_bump, kernel_only = culprit_index + 5, culprit_index - 7, culprit_index - 3
    assert 0 < good_index < pin_bump < kernel_only < culprit_index < broken + 1 < n_commits - 1
    repo = Path(root) / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    subjects = _subjects(n_commits, culprit_index, broken, pin_bump, kernel_only)
    stream, prev = [], {}
    for i, subject in enumerate(subjects):
        files = _files_at(i, culprit_index, broken, pin_bump, kernel_only)
        msg = subject.encode() + b"\n"
        when = 1_760_000_000 + 3600 * i
        who = f"Dev {i % 5} <dev{i % 5}@example.com> {when} +0000"
        stream.append(f"commit refs/heads/main\nmark :{i + 1}\nauthor {who}\ncommitter {who}\n".encode())
        stream.append(f"data {len(msg)}\n".encode() + msg)
        if i:
            stream.append(f"from :{i}\n".encode())
        for path, text in sorted(files.items()):
            if prev.get(path) != text:
                data = text.encode()
                stream.append(f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n")
        prev = files
        stream.append(b"\n")
    subprocess.run(["git", "fast-import", "--quiet"], cwd=repo, input=b"".join(stream), check=True)
    _git(repo, "reset", "-q", "--hard", "main")
    shas = _git(repo, "rev-list", "--reverse", "main").split()
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(40, 100))] for _ in range(num_prompts)]
    prompts_path = Path(root) / "prompts.json"
    prompts_path.write_text(json.dumps(prompts))
    return SGLangRepo(repo, shas[good_index], shas[-1], shas[culprit_index], shas[broken], prompts_path,
                      shas, subjects)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout
