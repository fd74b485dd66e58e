"""Small functions over ``git``; every failure becomes one ``KlbisectError``.

Commands run through GitPython's argv interface (and one ``git rev-parse``
through ``subprocess`` with an argv, before GitPython may read GIT_DIR): no
shell ever sees a revision or path the user typed.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

import git

from .errors import EXIT_REPO_STATE, EXIT_REVISION, EXIT_STORAGE, KlbisectError

_PR = re.compile(r"\(#(\d+)\)\s*$")


@dataclass
class Commit:
    sha: str
    subject: str
    pr: int | None


_MERGE_PR = re.compile(r"^Merge pull request #(\d+) from \S")


def parse_pr(subject: str) -> int | None:
    """PR number of a squash-merge subject: the trailing ``(#N)``; for
    ``Revert "... (#A)" (#B)`` that is B, the revert's own PR; for GitHub's
    merge commits, ``Merge pull request #N from owner/branch``."""
    m = _PR.search(subject or "") or _MERGE_PR.match(subject or "")
    return int(m.group(1)) if m else None


# git's variables that name another repository than the directory's: git commands
# klbisect runs would act on theirs while klbisect reads the one it opened
_GIT_PLACE = ("GIT_DIR", "GIT_WORK_TREE", "GIT_COMMON_DIR", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


def open_repo(path: str | Path | None = None) -> git.Repo:
    """The repository at ``path`` (default: the one GIT_DIR and
    GIT_WORK_TREE name, else the current directory's). From then on every
    git command runs in its checkout, not by those variables."""
    if path is None and os.environ.get("GIT_DIR"):
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL)
        path = top.stdout.strip() or None
    for name in _GIT_PLACE:
        os.environ.pop(name, None)
    where = Path(path or ".").resolve()
    if not where.exists():
        raise KlbisectError(f"{where} does not exist; pass --repo PATH of a git repository", EXIT_REVISION)
    try:
        return git.Repo(where, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise KlbisectError(f"{where} is not a git repository; cd into one or pass --repo PATH",
                            EXIT_REVISION) from None


def _git(repo: git.Repo, *args: str, cwd: str | Path | None = None) -> str:
    g = git.Git(str(cwd)) if cwd else repo.git
    try:
        return g.execute(["git", *args])
    except git.GitCommandError as e:
        err = (e.stderr or "").strip()
        # GitPython hands stderr back wrapped as "stderr: '...'"
        m = re.fullmatch(r"stderr: '(.*)'", err, re.S)
        lines = [ln.strip() for ln in (m.group(1) if m else err).strip().splitlines() if ln.strip()]
        msg = [ln for ln in lines if not ln.startswith("hint:")] or lines
        # git's first line is often the cause, its last the consequence (a tester's missing
        # git-lfs showed only "fatal: the remote end hung up unexpectedly")
        said = "; ".join(dict.fromkeys([msg[0], msg[-1]])) if msg else f"exit code {e.status}"
        if DISK_FULL.search(err) or (_WRITE_FAILED.search(err) and nearly_full(cwd or repo.common_dir)):
            raise KlbisectError(f"git {args[0]} failed: the disk is full ({said}); free space and rerun "
                                "the same command: recorded runs are kept", EXIT_STORAGE) from None
        raise KlbisectError(f"git {args[0]} failed: {said}", EXIT_REVISION) from None


# git's words for ENOSPC/EDQUOT differ by command ("Out of diskspace", strerror's own)
DISK_FULL = re.compile(r"No space left on device|Out of diskspace|Disk quota exceeded", re.I)
# ... and a checkout on a full disk often names only the file it could not write
_WRITE_FAILED = re.compile(r"unable to write|Could not reset index file|short write", re.I)


def nearly_full(where: str | Path, floor: int = 32 << 20) -> bool:
    """Less than ``floor`` bytes free where ``where`` lives: a failure there
    is the disk's, whatever words the failing command found for it."""
    try:
        return shutil.disk_usage(where).free < floor
    except OSError:
        return False


def toplevel(repo: git.Repo) -> Path:
    if repo.bare:
        raise KlbisectError(f"{repo.git_dir} is a bare repository; klbisect needs a working tree: run it in a "
                            f"clone (`git clone {repo.git_dir} DIR`) or a worktree of it (`git -C {repo.git_dir} "
                            "worktree add DIR BRANCH`)", EXIT_REVISION)
    return Path(repo.working_tree_dir)


def common_dir(repo: git.Repo) -> Path:
    """Shared by all worktrees of the repository: where klbisect keeps state."""
    return Path(repo.common_dir).resolve()


def worktree_id(repo: git.Repo) -> str:
    """Which of the repository's worktrees ``repo`` is: "" for the main one,
    else the linked worktree's name, which `git worktree move` keeps (its
    path does not)."""
    own = Path(repo.git_dir).resolve()
    return "" if own == common_dir(repo) else own.name


def worktree_path(repo: git.Repo, wid: str) -> Path | None:
    """Where linked worktree ``wid`` (``worktree_id``) is checked out now, or
    None when git no longer knows it. The main worktree is not asked for:
    `git worktree move` cannot move it, and its git dir need not sit in it
    (--separate-git-dir, a submodule)."""
    record = common_dir(repo) / "worktrees" / wid / "gitdir"
    try:
        dotgit = record.read_text().strip()
    except OSError:
        return None
    # git 2.48's worktree.useRelativePaths writes it relative to the record
    return (record.parent / dotgit).resolve().parent


def resolve(repo: git.Repo, rev: str, what: str = "revision") -> str:
    if not rev or rev.startswith("-"):
        raise KlbisectError(f"{what} {rev!r} is not a revision; give a sha, branch or tag", EXIT_REVISION)
    # as a commit first (a short sha that a tree or blob shares stays a commit's), then as
    # any object, peeled: ":/message^{commit}" would search for the suffix too
    found = _rev_parse(repo, f"{rev}^{{commit}}") or _rev_parse(repo, rev)
    if found is not None:
        code, out, err = found
        if "ambiguous" in err:
            # git took the ref over the sha prefix (or one ref over another): which was meant?
            raise KlbisectError(f"{what} {rev!r} is ambiguous in {toplevel(repo)} (git: "
                                f"{err.strip().splitlines()[-1]}); give refs/heads/NAME, refs/tags/NAME or more "
                                "characters of the sha", EXIT_REVISION)
        commit = _rev_parse(repo, f"{out}^{{commit}}")
        if commit is not None:
            return commit[1]
        try:
            kind = repo.git.execute(["git", "cat-file", "-t", out]).strip()
        except git.GitCommandError:
            kind = ""    # a full sha names no object here (a shallow clone): unknown, below
        if kind:
            raise KlbisectError(f"{what} {rev!r} names a {kind}, not a commit; give a sha, branch or tag of a "
                                "commit", EXIT_REVISION)
    if re.fullmatch(r"[0-9a-fA-F]{1,39}", rev):
        # git's --quiet says nothing about why a short sha failed: it may name several objects
        found = (_git(repo, "rev-parse", f"--disambiguate={rev}").split() if len(rev) >= 4 else [])
        if len(found) > 1 or len(rev) < 4:
            raise KlbisectError(f"{what} {rev!r} " + (f"is ambiguous: {len(found)} objects in {toplevel(repo)} "
                                                      "start with it" if found else
                                                      "is too short for a sha (git needs 4 characters or more)")
                                + "; give more characters of the sha (12 is plenty)", EXIT_REVISION)
    hint = (_SHALLOW_HINT if is_shallow(repo) else "check the name or fetch it first")
    back = re.fullmatch(r"(.+?)~(\d+)", rev)
    base = _rev_parse(repo, f"{back.group(1)}^{{commit}}") if back else None
    if base is not None:
        # HEAD~300 where HEAD has fewer first-parent ancestors: say how far it reaches
        depth = int(_git(repo, "rev-list", "--first-parent", "--count", base[1])) - 1
        hint = (f"{back.group(1)} has {depth} first-parent ancestors, so {back.group(1)}~{depth} is the oldest; "
                + hint)
    raise KlbisectError(f"unknown {what} {rev!r}: no such commit in {toplevel(repo)}; {hint}", EXIT_REVISION)


def _rev_parse(repo: git.Repo, rev: str) -> tuple[int, str, str] | None:
    """git rev-parse --verify of one revision: (status, sha, stderr), None when it names nothing."""
    try:
        code, out, err = repo.git.execute(["git", "rev-parse", "--verify", "--end-of-options", rev],
                                          with_extended_output=True)
    except git.GitCommandError:
        return None
    return (code, out.strip(), err) if out.strip() else None


_SHALLOW_HINT = ("this clone is shallow: run `git fetch --unshallow` (or `git fetch --shallow-since=DATE` "
                 "reaching past the good commit), then run klbisect again")


def is_shallow(repo: git.Repo) -> bool:
    """A shallow clone cuts history short, so an old good commit is missing or
    looks unrelated to bad: the fix is a fetch, not another revision."""
    try:
        return repo.git.execute(["git", "rev-parse", "--is-shallow-repository"]).strip() == "true"
    except git.GitCommandError:
        return False


def missing_commits(repo: git.Repo, shas: list[str]) -> list[str]:
    """Those of ``shas`` this clone holds no commit object for (one git call
    for a year of nightly heads)."""
    if not shas:
        return []
    try:
        out = subprocess.run(["git", "cat-file", "--batch-check"], cwd=repo.git_dir,
                             input="\n".join(shas) + "\n", capture_output=True, text=True)
    except OSError:
        return []
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != len(shas):
        return []     # not known: no claim either way
    return [sha for sha, ln in zip(shas, lines) if ln.split()[1:2] != ["commit"]]


def is_ancestor(repo: git.Repo, a: str, b: str) -> bool:
    try:
        repo.git.execute(["git", "merge-base", "--is-ancestor", a, b])
        return True
    except git.GitCommandError:
        return False


def merge_base(repo: git.Repo, a: str, b: str) -> str:
    return _git(repo, "merge-base", a, b).strip()


def check_range(repo: git.Repo, good: str, bad: str) -> tuple[str, str]:
    g, b = resolve(repo, good, "good revision"), resolve(repo, bad, "bad revision")
    if g == b:
        raise KlbisectError(f"good and bad are the same commit ({g[:12]}); "
                            "give a known-good commit older than the bad one", EXIT_REVISION)
    if not is_ancestor(repo, g, b):
        if is_shallow(repo):
            hint = _SHALLOW_HINT
        elif is_ancestor(repo, b, g):
            hint = "they are the wrong way round: swap them"
        else:
            # a good tag on a release branch (v0.4.0.post1): bad's history holds only their merge base
            try:
                base = _git(repo, "merge-base", g, b).strip()
            except KlbisectError:
                base = ""
            hint = (f"they are on diverged branches; their merge base {base[:12]} is in bad's history: "
                    f"--good {base[:12]}, if it is good" if base else
                    "they share no history: pick a good commit from bad's history")
        raise KlbisectError(f"good {good} ({g[:12]}) is not an ancestor of bad {bad} ({b[:12]}); {hint}",
                            EXIT_REVISION)
    return g, b


def candidates(repo: git.Repo, good: str, bad: str, first_parent: bool = True) -> list[Commit]:
    """The commits a culprit can be, oldest first, with ``good`` at index 0."""
    args = ["log", "--reverse", "--format=%H%x00%s", "--topo-order"]
    if first_parent:
        args.append("--first-parent")
    out = _git(repo, *args, f"{good}..{bad}")
    commits = [Commit(good, subject(repo, good), parse_pr(subject(repo, good)))]
    for line in out.splitlines():
        sha, _, subj = line.partition("\x00")
        commits.append(Commit(sha, subj, parse_pr(subj)))
    return commits


def subject(repo: git.Repo, sha: str) -> str:
    return _git(repo, "log", "-1", "--format=%s", sha)


def parents(repo: git.Repo, sha: str) -> list[str]:
    return _git(repo, "rev-list", "--parents", "-n", "1", sha).split()[1:]


def side_commits(repo: git.Repo, merge: str, good: str | None = None) -> int:
    """How many commits a merge brings in beside its first parent's line
    that could be the cause (0 for a commit that is not a merge): not
    merges themselves ("Merge branch 'main' into ..."), nor in ``good``'s
    history."""
    ps = parents(repo, merge)
    if len(ps) < 2:
        return 0
    return int(_git(repo, "rev-list", "--count", "--no-merges", f"{ps[0]}..{merge}",
                    *([f"^{good}"] if good else [])))


def merged_by(repo: git.Repo, sha: str, head: str) -> str | None:
    """The commit on ``head``'s first-parent line that brought ``sha`` in
    (the merge of its side branch), or None when ``sha`` is on that line:
    a side branch's commits carry no "(#N)", their merge names the PR."""
    # git's --ancestry-path does not follow a merge's second parent under
    # --first-parent: intersect the two walks instead
    after = set(_git(repo, "rev-list", "--ancestry-path", f"{sha}..{head}").split())
    line = [c for c in _git(repo, "rev-list", "--first-parent", "--reverse", f"{sha}..{head}").split() if c in after]
    if not line or parents(repo, line[0])[:1] == [sha]:
        return None
    return line[0]


def dirty_files(repo: git.Repo, submodules: bool = True) -> list[str]:
    """Tracked files with uncommitted changes (staged or not). Without
    ``submodules``, a submodule at another commit or with changes of its
    own is left out: a checkout by git bisect leaves submodules where they
    were, and the probe's build may update them."""
    args = ["status", "--porcelain", "--untracked-files=no"] + ([] if submodules else ["--ignore-submodules=all"])
    return [ln[3:] for ln in _git(repo, *args).splitlines() if ln.strip()]


def describe_dirty(repo: git.Repo, files: list[str], shown: int = 3) -> str:
    """The first few dirty files, each marked when only its mode or its line
    endings differ: git counts those as changes (and a probe would run in
    them), yet `git diff` shows no line, so the user needs to know which
    setting (core.fileMode, core.autocrlf) made them."""
    try:
        stat = _git(repo, "diff", "HEAD", "--ignore-cr-at-eol", "--numstat", "--", *files[:shown])
    except KlbisectError:
        stat = ""
    counts = {}
    for ln in stat.splitlines():
        parts = ln.split("\t", 2)
        if len(parts) == 3:
            counts[parts[2]] = (parts[0], parts[1])
    out = []
    for f in files[:shown]:
        if f not in counts:
            out.append(f"{f} (line endings only: see core.autocrlf)")
        elif counts[f] == ("0", "0"):
            out.append(f"{f} (file mode only: see core.fileMode)")
        else:
            out.append(f)
    return ", ".join(out) + (" ..." if len(files) > shown else "")


def bisect_in_progress(repo: git.Repo) -> bool:
    gd = Path(repo.git_dir)
    return (gd / "BISECT_START").exists()


def bisect_id(repo: git.Repo) -> str | None:
    """Which git bisect is in progress in this worktree (None: none): the
    branch it began on and its `git bisect start` line, so one reset and
    started again by hand on other endpoints is another, which a session
    must not take for its own. By content, not the file's identity: `git
    bisect replay` (git's way to undo a wrong mark) writes the files anew,
    as does a copy of the repository (a reviewer's)."""
    gd = Path(repo.git_dir)
    try:
        began = (gd / "BISECT_START").read_text(errors="replace")
    except OSError:
        return None
    try:
        log = (gd / "BISECT_LOG").read_text(errors="replace")
    except OSError:
        log = ""
    start = next((ln for ln in log.splitlines() if ln.startswith("git bisect start")), "")
    return hashlib.sha1(f"{began.strip()}\0{start}".encode()).hexdigest()[:16]


def changed_files(repo: git.Repo, a: str, b: str) -> list[str]:
    return [p for p in _git(repo, "diff", "--name-only", "--no-renames", a, b).splitlines() if p]


def files_touched(repo: git.Repo, good: str, bad: str) -> list[str]:
    """Every file a commit after ``good`` up to ``bad`` changes, also one
    that ends as it began (the endpoints' diff leaves those out)."""
    out = _git(repo, "log", "--format=", "--name-only", "--no-renames", f"{good}..{bad}")
    return sorted({p for p in out.splitlines() if p})


def touching(repo: git.Repo, good: str, bad: str, path: str) -> list[str]:
    """The commits after ``good`` up to ``bad`` that change ``path``, side
    branches' included, oldest first."""
    return _git(repo, "log", "--reverse", "--format=%H", f"{good}..{bad}", "--", path).split()


def show_file(repo: git.Repo, rev: str, path: str) -> str:
    """A file's text at a revision; empty when it does not exist there."""
    try:
        return repo.git.execute(["git", "show", f"{rev}:{path}"], strip_newline_in_stdout=False)
    except git.GitCommandError:
        return ""


def remote_url(repo: git.Repo, name: str = "origin") -> str | None:
    try:
        return repo.git.execute(["git", "remote", "get-url", name]).strip() or None
    except git.GitCommandError:
        return None


def head_sha(checkout: Path) -> str:
    return git.Git(str(checkout)).execute(["git", "rev-parse", "HEAD"]).strip()


# ---- worktrees -------------------------------------------------------------

# `git worktree add` reads every worktree's record under .git/worktrees: one that
# another slot's add has half written fails it ("failed to read .git/worktrees/
# slot-3/commondir"; eight slots starting at once in CI). Slots are threads of one
# klbisect, and the repository lock keeps other commands out, so one lock in the
# process serialises the records' changes. (Ray nodes hold a file lock around theirs.)
_WORKTREE_RECORDS = threading.Lock()


def worktree_checkout(repo: git.Repo, path: Path, sha: str, keep: bool = False) -> bool:
    """A detached worktree at ``sha``, created on first use and reused after,
    cleaned of untracked files (not ignored ones). ``keep``: a build is in
    place, whose outputs need not be ignored, nor untracked: at ``sha``
    already nothing is touched (a tester's build rewrote a tracked file,
    which the checkout put back before every run), elsewhere untracked files
    stay. True when the checkout put back tracked files the build had
    changed: it must build again."""
    if (path / ".git").exists():
        g = git.Git(str(path))
        try:
            changed = False
            if keep:
                if g.execute(["git", "rev-parse", "HEAD"]).strip() == sha:
                    return False
                changed = bool(g.execute(["git", "status", "--porcelain", "--untracked-files=no",
                                          "--ignore-submodules=all"]).strip())
            g.execute(["git", "checkout", "--quiet", "--force", "--detach", sha])
            if not keep:
                g.execute(["git", "clean", "-fdq", "-e", ".klbisect-keep"])
            return changed
        except git.GitCommandError:
            worktree_remove(repo, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # --force reuses a registered path whose directory is gone; no `git worktree
    # prune`, which would also forget the user's own worktrees on an unmounted disk
    with _WORKTREE_RECORDS:
        _git(repo, "worktree", "add", "--force", "--detach", str(path), sha)
    return False


def worktree_remove(repo: git.Repo, path: Path) -> None:
    with _WORKTREE_RECORDS:
        try:
            repo.git.execute(["git", "worktree", "remove", "--force", str(path)])
        except git.GitCommandError:
            shutil.rmtree(path, ignore_errors=True)
            _forget_worktree(repo, path)


def _forget_worktree(repo: git.Repo, path: Path) -> None:
    """Drop git's record of this one worktree (its directory gone): what
    `git worktree prune` does, without touching any other worktree."""
    admin = common_dir(repo) / "worktrees"
    want = (Path(path) / ".git").resolve()
    for entry in admin.glob("*/gitdir") if admin.is_dir() else []:
        try:
            if Path(entry.read_text().strip()).resolve() == want:
                shutil.rmtree(entry.parent, ignore_errors=True)
        except OSError:
            continue


# ---- git bisect ------------------------------------------------------------

def bisect_start(repo: git.Repo, good: str, bad: str, first_parent: bool = True) -> str:
    args = ["bisect", "start"]
    if first_parent:
        args.append("--first-parent")
    return _git(repo, *args, bad, good)


def bisect_reset(repo: git.Repo) -> None:
    if not bisect_in_progress(repo):
        return
    try:
        _git(repo, "bisect", "reset")
    except KlbisectError as e:
        if e.code != EXIT_REVISION:
            raise
        dirty = dirty_files(repo)
        # git could not check the original branch out again: local changes (a probe that writes into
        # a tracked file) would be overwritten; the bisect stays as it was
        why = (f"it has uncommitted changes to {describe_dirty(repo, dirty)}; commit, stash or `git checkout "
               "--` them" if dirty else "if that branch is gone, end the bisect on a commit with `git bisect "
               "reset HEAD` (or another commit)")
        raise KlbisectError(f"`git bisect reset` could not check out the branch it began on in {toplevel(repo)} "
                            f"({e.message.removeprefix('git bisect failed: ')}): {why}, then rerun",
                            EXIT_REPO_STATE) from None


def bisect_refs(repo: git.Repo) -> dict[str, list[str]]:
    """git's own bisect state: refs/bisect/bad, good-*, skip-*."""
    out = {"bad": [], "good": [], "skip": []}
    try:
        text = repo.git.execute(["git", "for-each-ref", "--format=%(refname) %(objectname)", "refs/bisect/"])
    except git.GitCommandError:
        return out
    for line in text.splitlines():
        ref, sha = line.split()
        kind = ref.rsplit("/", 1)[-1].split("-", 1)[0]
        if kind in out:
            out[kind].append(sha)
    return out


def ensure_clean(repo: git.Repo) -> None:
    if not repo.head.is_valid():
        # found here, not after calibrating both endpoints, when `git bisect start` fails on it
        raise KlbisectError(f"HEAD of {toplevel(repo)} is on a branch with no commits yet (an unborn branch); "
                            "check out a branch or commit first (`git checkout main`)", EXIT_REPO_STATE)
    dirty = dirty_files(repo)
    if dirty:
        raise KlbisectError(f"the working tree of {toplevel(repo)} has uncommitted changes to "
                            f"{describe_dirty(repo, dirty)}; "
                            "commit or stash them first (git bisect checks out other commits)",
                            EXIT_REPO_STATE)
    if bisect_in_progress(repo):
        raise KlbisectError("a git bisect is already in progress here: end it with `git bisect reset` (or "
                            "`klbisect reset`, if a `klbisect start` began it; it leaves others alone) "
                            "and rerun", EXIT_REPO_STATE)
