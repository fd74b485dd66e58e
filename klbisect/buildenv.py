"""Builds and the environment they change. ``--build sglang`` installs each
commit into the user's interpreter: the first build notes where that
interpreter's sglang came from, in the store at once, so Ctrl-C, a kill or
``reset`` can put it back. Before any build, the range is checked for what
the builds cannot follow (paths a --build-cmd never rebuilds on, pins it
does not install, kernel wheels that slots of one Python would share)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from . import repo as gitrepo
from .build import CommandBuilder
from .config import BisectConfig, make_builder
from .metric import fmt_count
from .proc import despite_a_stop
from .store import SessionRow
from .workspace import Progress, Workspace


def hold_env(ws: Workspace, sid: int, builder, log_dir: Path) -> None:
    """Before a session's first build: a builder that changes the user's
    environment (--build sglang) notes what it finds, in the store at once,
    so Ctrl-C or a kill -9 mid-build loses nothing. A resumed session
    takes over what its first command found (not the half-built state the
    interruption left), and `klbisect reset` can put that back too."""
    remember = getattr(builder, "remember_origin", None)
    if remember is None:
        return
    if not ws.store.get(env_key(sid)):
        _take_over_env(ws, sid, builder)
    adopt_env(ws, sid, builder)
    remember(log_dir)
    keep_env(ws, sid, builder)


def _take_over_env(ws: Workspace, sid: int, builder) -> None:
    """An earlier session that a Ctrl-C or a kill stopped before it put the
    same interpreter back: what that one found is this one's "before" (not
    the half-built state it left, which the next session ended by
    "restoring"), and its record moves here, so it is put back once. A git
    bisect session still under way keeps its own: its probes need it."""
    python = getattr(builder, "python", None)
    for key in ws.store.keys("env_before:"):
        other, raw = int(key.rsplit(":", 1)[1]), ws.store.get(key)
        sess = ws.store.session(other) if raw and other != sid else None
        if sess is None or (sess.kind == "gitbisect" and sess.state != "ended"):
            continue
        theirs = make_builder(BisectConfig.from_dict({**sess.config, "good": sess.good, "bad": sess.bad}))
        if getattr(theirs, "python", None) == python:
            builder.adopt_origin(json.loads(raw))
            ws.store.put(env_key(sid), raw)
            ws.store.put(key, "")
            return


def close_builder(builder, progress: Progress, ws: Workspace | None = None, sid: int | None = None) -> None:
    """End of a session's builds: a builder that changed the user's
    environment (--build sglang) puts it back, and says so. With the
    session (``hold_env``), what could not be put back stays in its store."""
    close = getattr(builder, "close", None)
    if close:
        try:
            with despite_a_stop():
                close(progress)
        finally:
            if ws is not None and sid is not None:
                saved = getattr(builder, "saved_origin", None)
                left = saved() if saved else None
                ws.store.put(env_key(sid), json.dumps(left) if left is not None else "")


def warn_probe_python(cfg: BisectConfig, builder, progress: Progress) -> None:
    """--build sglang with no --sglang-python installs each commit into
    klbisect's own interpreter; a --probe-cmd whose ``python3`` is another
    (klbisect installed with pipx, or run from a venv not activated) runs
    on what that one has installed. Said before the first build."""
    target = getattr(builder, "python", None)
    if not getattr(builder, "install_pins", False) or cfg.probe != "cmd" or (cfg.sglang or {}).get("python") \
            or target is None:
        return
    for name in ("python3", "python"):
        # the word as the shell runs it: not .venv/bin/python3, python3.11 or my_python3
        found = shutil.which(name) if re.search(rf"(?<![\w./-]){name}(?![\w.-])", cfg.probe_cmd or "") else None
        if found is None:
            continue
        try:
            theirs = subprocess.run([found, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                                    text=True, timeout=60)
            ours = subprocess.run([target, "-c", "import sys; print(sys.prefix)"], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            return
        if theirs.returncode == ours.returncode == 0 \
                and os.path.realpath(theirs.stdout.strip()) != os.path.realpath(ours.stdout.strip()):
            progress(f"warning: --build sglang installs each commit into {target}, but the probe command's "
                     f"{name} is {found}, another environment ({theirs.stdout.strip()}): pass --sglang-python "
                     f"{found} to build into the one the probe runs")
        return


def warn_build_paths(repo, builder, good: str, bad: str, progress: Progress) -> None:
    """A --build-cmd whose --build-paths match no file that differs between
    the endpoints builds once per checkout and measures every commit on
    that build: said before the first run, not after 80 runs that 'do not
    separate' (a tester's build copied a file the default paths miss)."""
    if getattr(builder, "install_pins", False):
        moved = unfollowed_pins(repo, good, bad)
        if moved:
            progress(f"warning: python/pyproject.toml's pins move in this range ({moved}), and --build sglang "
                     "installs with --no-deps: commits on the other side run on the versions installed now, and "
                     "may fail to import (skipped) or measure differently; install what each side needs, or use "
                     "a --build-cmd that installs with dependencies")
        return
    if not isinstance(builder, CommandBuilder):
        return
    changed = gitrepo.changed_files(repo, good, bad)
    # a file that changes inside the range and back is rebuilt for all the same (a tester's was)
    if changed and not builder.needs_build(changed) and not builder.needs_build(
            gitrepo.files_touched(repo, good, bad)):
        progress(f"warning: --build-cmd runs only where a file matching --build-paths ({', '.join(builder.paths)}) "
                 f"changed, and none changes between the endpoints ({fmt_count(len(changed), 'file')} do, e.g. "
                 f"{changed[0]}): every commit will be measured on the first build; if the build reads other "
                 "files, add them to --build-paths")


def _first_pin_change(repo, good: str, bad: str, packages: tuple[str, ...] | None = None) -> tuple[str, str] | None:
    """The first commit after ``good`` whose python/pyproject.toml pins
    ``packages`` (default: the kernel wheels) otherwise, and what moved:
    ("SHA", "name old -> new, ..."); None when nothing does."""
    from .sglang import PINNED_PACKAGES, PYPROJECT, parse_pins  # noqa: PLC0415
    packages = packages or PINNED_PACKAGES
    first = parse_pins(gitrepo.show_file(repo, good, PYPROJECT), packages)
    for sha in gitrepo.touching(repo, good, bad, PYPROJECT):
        pins = parse_pins(gitrepo.show_file(repo, sha, PYPROJECT), packages)
        if pins != first:
            return sha[:12], ", ".join(f"{n} {first.get(n) or 'unpinned'} -> {pins.get(n) or 'unpinned'}"
                                       for n in sorted(set(first) | set(pins)) if first.get(n) != pins.get(n))
    return None


def unfollowed_pins(repo, good: str, bad: str) -> str:
    """The pins --build sglang does not install (torch, transformers) that a
    commit of the range changes: "SHA: torch 2.8.0 -> 2.9.1"; else "". The
    kernel wheels it installs are built for one torch: past a joint bump,
    every commit may fail to import them."""
    from .sglang import UNFOLLOWED_PINS  # noqa: PLC0415
    moved = _first_pin_change(repo, good, bad, UNFOLLOWED_PINS)
    return f"{moved[0]}: {moved[1]}" if moved else ""


def pins_moved(repo, cfg: BisectConfig, builder, good: str, bad: str) -> str:
    """Where --build sglang meets a range whose commits pin different kernel
    wheels, with --parallel: "SHA (name old -> new, ...)"; else "". The
    wheels go into the one Python that slots (or a Ray node's tasks) share,
    and a slot whose own checkout needs no build would probe with the wheel
    another had just installed."""
    if cfg.parallel <= 1 or not getattr(builder, "install_pins", False):
        return ""
    moved = _first_pin_change(repo, good, bad)
    return f"{moved[0]} ({moved[1]})" if moved else ""


def slots_for(cfg: BisectConfig, moved: str, progress: Progress) -> int:
    """--parallel's slots, or one locally when the pinned wheels move
    (``pins_moved``); on Ray a node's tasks take turns instead."""
    if not moved:
        return cfg.parallel
    if cfg.executor == "ray":
        progress(f"note: with --build sglang the range's pinned wheels change at {moved}, and the tasks on one "
                 "Ray node share its Python: they take turns there (nodes still run in parallel)")
        return cfg.parallel
    progress(f"note: --parallel {cfg.parallel} with --build sglang, but the range's pinned wheels change "
             f"at {moved} and the slots share one Python, so one slot could probe with "
             "another's wheel: running one slot (bisect each side of that commit in parallel, or give "
             "each its own interpreter)")
    return 1


def slots_for_pins(repo, cfg: BisectConfig, builder, good: str, bad: str, progress: Progress) -> int:
    """slots_for over pins_moved."""
    return slots_for(cfg, pins_moved(repo, cfg, builder, good, bad), progress)


def adopt_env(ws: Workspace, sid: int, builder) -> None:
    """`git bisect run` starts a `klbisect probe` per commit: a builder that
    changes the user's environment (--build sglang) takes over what the
    first of them found, so `klbisect reset` can put that back."""
    adopt = getattr(builder, "adopt_origin", None)
    raw = ws.store.get(env_key(sid))
    if adopt and raw:
        adopt(json.loads(raw))


def keep_env(ws: Workspace, sid: int, builder) -> None:
    saved = getattr(builder, "saved_origin", None)
    data = saved() if saved else None
    if data is not None:
        ws.store.put(env_key(sid), json.dumps(data))


def restore_env(ws: Workspace, sess: SessionRow) -> list[str]:
    """At `klbisect reset`: what a git bisect session's probes changed in
    the user's environment, put back (one line saying so, or how to)."""
    raw = ws.store.get(env_key(sess.id))
    if not raw:
        return []
    builder = make_builder(BisectConfig.from_dict({**sess.config, "good": sess.good, "bad": sess.bad}))
    if not hasattr(builder, "adopt_origin"):
        return []
    builder.adopt_origin(json.loads(raw))
    lines = builder.close(lambda line: None)
    ws.store.put(env_key(sess.id), "")
    return lines


def env_key(sid: int) -> str:
    return f"env_before:{sid}"
