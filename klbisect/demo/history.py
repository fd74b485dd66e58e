"""Plan the demo history from a seed and write it with one ``git fast-import``.

The plan is pure (seed in, commits out); only ``write_repository`` runs git.
Fixed names, e-mails and dates make the commit shas a function of the seed
and of the engine sources shipped in ``engine/``.
"""
from __future__ import annotations

import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

from klbisect.demo.fillers import PEOPLE, Fillers
from klbisect.demo.story import CULPRIT, STORY, Change, HistoryError, Tree

ENGINE_DIR = Path(__file__).resolve().parent / "engine"
START_TIME = 1767603600  # 2026-01-05 09:00 UTC
COMMITTER = "GitHub <noreply@github.com>"

GITIGNORE = """__pycache__/
*.py[cod]
*.egg-info/
.pytest_cache/
build/
dist/
"""

ROOT_SUBJECT = "Initial tinyserve engine"


@dataclass(frozen=True)
class PlannedCommit:
    subject: str  # with the " (#N)" suffix
    pr: int
    author: tuple[str, str]  # name, e-mail
    timestamp: int
    message: str  # full commit message
    changes: dict[str, str | None]  # path -> new text, None when deleted


@dataclass(frozen=True)
class HistoryPlan:
    commits: list[PlannedCommit]
    culprit_index: int

    @property
    def culprit_pr(self) -> int:
        return self.commits[self.culprit_index].pr


def load_engine_tree() -> Tree:
    """The root commit's files: the engine sources shipped with klbisect."""
    tree: Tree = {}
    for path in sorted(ENGINE_DIR.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".pyc", ".pyo"):
            continue
        tree[path.relative_to(ENGINE_DIR).as_posix()] = path.read_text(encoding="utf-8")
    if "tinyserve/kl_test.py" not in tree:
        raise HistoryError(f"engine sources not found under {ENGINE_DIR}")
    tree[".gitignore"] = GITIGNORE
    return tree


def _check_python(path: str, text: str) -> None:
    try:
        compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        raise HistoryError(f"generated {path} does not compile: {exc}") from exc


def plan_history(seed: int = 0) -> HistoryPlan:
    """Commits from the root (good) to HEAD (bad); the culprit sits in the middle half."""
    rng = random.Random(seed)
    n = 240 + rng.randrange(81)
    culprit = rng.randint(int(n * 0.35), int(n * 0.65))
    free = [i for i in range(1, n) if i != culprit]
    story_at = dict(zip(sorted(rng.sample(free, len(STORY))), STORY))
    fillers = Fillers(random.Random(rng.getrandbits(64)))
    kinds = iter(fillers.plan_kinds(n - 2 - len(STORY)))

    tree = load_engine_tree()
    pr = 26000 + rng.randrange(1500)
    when = START_TIME + rng.randrange(3600)
    # (subject, pr, files before) of recent docs-like commits that can still be reverted cleanly
    revertible: list[tuple[str, int, dict[str, str | None]]] = []
    commits: list[PlannedCommit] = []
    for i in range(n):
        if i == 0:
            change = Change(ROOT_SUBJECT, lambda t: None)
            changes: dict[str, str | None] = dict(tree)
        else:
            if i == culprit:
                change = CULPRIT
            elif i in story_at:
                change = story_at[i]
            else:
                change = fillers.make(next(kinds), tree, revertible)
            before = dict(tree)
            change.apply(tree)
            changes = {p: tree.get(p) for p in sorted(set(before) | set(tree)) if before.get(p) != tree.get(p)}
            if not changes:
                raise HistoryError(f"commit {i} ({change.subject}) changes nothing")
            revertible = [r for r in revertible if not set(r[2]) & set(changes)]
            if change.revertible:
                revertible.append((change.subject, pr, {p: before.get(p) for p in changes}))
        for path, text in changes.items():
            if text is not None and path.endswith(".py"):
                _check_python(path, text)
        name, handle = PEOPLE[rng.randrange(len(PEOPLE))]
        subject = f"{change.subject} (#{pr})"
        message = subject + "\n"
        body = change.body
        if rng.random() < 0.12:
            co_name, co_handle = PEOPLE[rng.randrange(len(PEOPLE))]
            if co_handle != handle:
                body += f"\nCo-authored-by: {co_name} <{co_handle}@users.noreply.github.com>\n"
        if body:
            message += "\n" + body.lstrip("\n")
        commits.append(PlannedCommit(subject, pr, (name, f"{handle}@users.noreply.github.com"), when, message, changes))
        pr += rng.randint(1, 30)
        when += rng.randint(1200, 8 * 3600)
    return HistoryPlan(commits, culprit)


def fast_import_stream(plan: HistoryPlan, ref: str = "refs/heads/main") -> bytes:
    """The whole history as a git fast-import stream (blobs deduplicated)."""
    out: list[bytes] = []
    blob_marks: dict[bytes, int] = {}
    mark = 0

    def data(payload: bytes) -> None:
        out.append(b"data %d\n" % len(payload))
        out.append(payload)
        out.append(b"\n")

    for commit in plan.commits:
        for text in commit.changes.values():
            if text is None:
                continue
            payload = text.encode("utf-8")
            if payload not in blob_marks:
                mark += 1
                blob_marks[payload] = mark
                out.append(b"blob\nmark :%d\n" % mark)
                data(payload)
    for index, commit in enumerate(plan.commits):
        name, email = commit.author
        out.append(f"commit {ref}\n".encode())
        out.append(f"author {name} <{email}> {commit.timestamp} +0000\n".encode())
        out.append(f"committer {COMMITTER} {commit.timestamp} +0000\n".encode())
        data(commit.message.encode("utf-8"))
        for path, text in commit.changes.items():
            if text is None:
                out.append(f"D {path}\n".encode())
            else:
                out.append(b"M 100644 :%d %s\n" % (blob_marks[text.encode("utf-8")], path.encode("utf-8")))
        out.append(b"\n")
    out.append(b"done\n")
    return b"".join(out)


def git_env() -> dict[str, str]:
    """The caller's environment minus variables that would point git at another repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    return env


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args], input=stdin, capture_output=True, env=git_env(), check=False
    )
    if proc.returncode != 0:
        raise HistoryError(f"git {' '.join(args[:2])} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()


def check_target(path: Path) -> None:
    """Refuse to write into anything but an absent path or an empty directory."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise HistoryError(f"{path} exists and is not an empty directory")


def write_repository(path: Path, plan: HistoryPlan) -> list[str]:
    """Create the repository at ``path`` (absent or empty) and return the shas, oldest first."""
    check_target(path)
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "--quiet", "--initial-branch=main")
    git(path, "fast-import", "--quiet", "--done", stdin=fast_import_stream(plan))
    git(path, "reset", "--quiet", "--hard", "main")
    shas = git(path, "rev-list", "--reverse", "main").split()
    if len(shas) != len(plan.commits):
        raise HistoryError(f"expected {len(plan.commits)} commits, git has {len(shas)}")
    return shas
