"""What defines a bisect (``BisectConfig``) and the probe and builder it
makes: a builder that changes the user's environment (``--build sglang``)
notes what it found in the store first, so ``reset`` can put it back."""
from __future__ import annotations

import json
import shlex
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import repo as gitrepo
from .build import DEFAULT_BUILD_PATHS, DEFAULT_BUILD_TIMEOUT, CommandBuilder, shared_install
from .decide import MAX_CONFIDENCE, MAX_ENDPOINT_RUNS, MAX_TOTAL_RUNS, MIN_ENDPOINT_RUNS
from .errors import EXIT_USAGE, KlbisectError
from .executors import MAX_PARALLEL, LocalExecutor
from .measure import Measurer
from .metric import check_regex, fmt_count
from .probe import DEFAULT_TIMEOUT, CommandProbe, Slot
from .store import SessionRow
from .workspace import Progress, Workspace, env_key, question_of


@dataclass
class BisectConfig:
    """Everything that defines a bisect. The fields in ``question()`` decide
    whether an interrupted session is the same one and may be resumed."""

    good: str = ""
    bad: str = ""
    probe_cmd: str | None = None
    probe: str = "cmd"                    # cmd | sglang
    build_cmd: str | None = None
    build: str | None = None              # None | sglang
    build_paths: tuple[str, ...] = DEFAULT_BUILD_PATHS
    timeout: float = DEFAULT_TIMEOUT
    build_timeout: float = DEFAULT_BUILD_TIMEOUT
    metric: str | None = None
    metric_regex: str | None = None
    threshold: float | None = None        # classic mode
    votes: int = 1
    max_runs: int | None = None           # None: decide.runs_per_commit
    endpoint_runs: int = MIN_ENDPOINT_RUNS
    max_endpoint_runs: int = MAX_ENDPOINT_RUNS
    confidence: float = 0.99
    worse: str = "higher"                 # which way the metric gets worse: higher | lower | either
    first_parent: bool = True
    crash_limit: int = 2
    max_total_runs: int = MAX_TOTAL_RUNS
    parallel: int = 1
    gpus_per_probe: int = 0
    executor: str = "local"               # local | ray
    ray_address: str | None = None
    sglang: dict = field(default_factory=dict)   # model_path, server_args, prompts, ...
    fresh: bool = False                   # count only runs recorded since the session began

    def question(self) -> dict:
        d = asdict(self)
        for k in ("good", "bad", "parallel", "gpus_per_probe", "executor", "ray_address",
                  "max_total_runs", "timeout", "build_timeout", "fresh"):
            d.pop(k)
        d["build_paths"] = list(self.build_paths)
        return d

    def stored(self) -> dict:
        """What a session keeps: the question, and the settings a rerun may
        change (RERUN_KEYS) but that `klbisect probe` and `status` read back."""
        return {**self.question(), "timeout": self.timeout, "build_timeout": self.build_timeout,
                "max_total_runs": self.max_total_runs, **({"fresh": True} if self.fresh else {})}

    def run_command(self, good: str, bad: str, max_runs: bool = True) -> str:
        """The `klbisect run` that asks this question, its options spelled out:
        advice a user can paste (a `run` needs the probe options again).
        ``max_runs=False`` leaves --max-runs out: the advice out of a git
        bisect that --max-runs stalled (a tester pasted it, and the run
        stalled on the same cap 344 runs later)."""
        d = BisectConfig()
        argv = ["klbisect", "run", "--good", good, "--bad", bad]

        def opt(flag: str, value, default) -> None:
            if value != default and value is not None:
                argv.extend([flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)])

        opt("--probe", self.probe, d.probe)
        opt("--probe-cmd", self.probe_cmd, None)
        for key, value in self.sglang.items():
            opt("--" + ("sglang-python" if key == "python" else key.replace("_", "-")), value, None)
        opt("--build-cmd", self.build_cmd, None)
        opt("--build", self.build, None)
        opt("--build-paths", tuple(self.build_paths), tuple(d.build_paths))
        opt("--timeout", f"{self.timeout:g}", f"{d.timeout:g}")
        opt("--build-timeout", f"{self.build_timeout:g}", f"{d.build_timeout:g}")
        for key in ("metric", "metric_regex", "threshold", "votes", "max_runs", "endpoint_runs",
                    "max_endpoint_runs", "max_total_runs", "confidence", "worse"):
            if key == "max_runs" and not max_runs:
                continue
            opt("--" + key.replace("_", "-"), getattr(self, key), getattr(d, key))
        if not self.first_parent:
            argv.append("--all-commits")
        if self.fresh:
            argv.append("--fresh")
        return shlex.join(argv)

    @classmethod
    def from_dict(cls, d: dict) -> "BisectConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "build_paths" in known:
            known["build_paths"] = tuple(known["build_paths"])
        return cls(**known)

    def validate(self) -> None:
        if self.probe_cmd is not None:
            # what the shell ignores, so do the session's question and the probe's key (a
            # tester's trailing space started a new session, or a new nightly baseline)
            self.probe_cmd = self.probe_cmd.strip()
        if self.probe == "cmd" and not (self.probe_cmd or "").strip():
            raise KlbisectError("no probe given: pass --probe-cmd \"...\" (or --probe sglang)", EXIT_USAGE)
        if self.worse not in ("higher", "lower", "either"):
            raise KlbisectError(f"--worse {self.worse!r}: give higher, lower or either", EXIT_USAGE)
        if self.probe not in ("cmd", "sglang"):
            raise KlbisectError(f"unknown --probe {self.probe!r}; use cmd or sglang", EXIT_USAGE)
        if self.timeout is not None and not self.timeout > 0:
            raise KlbisectError(f"--timeout {self.timeout:g}: give the seconds one probe run may take "
                                f"(default {DEFAULT_TIMEOUT:g})", EXIT_USAGE)
        if not 0.5 < self.confidence <= MAX_CONFIDENCE:
            raise KlbisectError(f"--confidence {self.confidence:g}: give a level above 0.5 and at most "
                                f"{MAX_CONFIDENCE:g} (e.g. 0.99)", EXIT_USAGE)
        if self.parallel > 1 and self.build_cmd and shared_install(self.build_cmd):
            raise KlbisectError(
                f"--parallel {self.parallel} with --build-cmd {self.build_cmd!r}: every slot's build installs "
                "into the one Python they share, so each probe would import whichever commit was installed "
                "last; use --parallel 1, or a build into the checkout's own environment (e.g. --build-cmd "
                "'python -m venv .venv && .venv/bin/pip install -e python' and the probe run by .venv/bin/python), "
                "or, for SGLang, --build sglang (each probe imports its own checkout's python/)", EXIT_USAGE)
        python = (self.sglang or {}).get("python")
        if python and (self.build == "sglang" or self.probe == "sglang") and self.executor == "local" \
                and shutil.which(python) is None:
            # found now, not after three "infrastructure failures" and a 152
            raise KlbisectError(f"--sglang-python {python}: no such executable here; give the interpreter whose "
                                "sglang the session builds and runs (e.g. .venv/bin/python)", EXIT_USAGE)
        if self.metric_regex is not None:
            check_regex(self.metric_regex)
        if (self.max_runs is not None and self.max_runs < 1) or self.parallel < 1 or self.votes < 1:
            raise KlbisectError("--max-runs, --parallel and --votes must be at least 1", EXIT_USAGE)
        if self.parallel > MAX_PARALLEL:
            raise KlbisectError(f"--parallel {self.parallel}: at most {MAX_PARALLEL} probes at a time (each slot "
                                "has its own worktree and range of ports)", EXIT_USAGE)
        if self.votes != 1 and self.threshold is None:
            raise KlbisectError(f"--votes {self.votes} counts runs at or above a --threshold: pass --threshold "
                                "VALUE too, or leave --votes out (the default mode learns good and bad from "
                                "the endpoints and decides how many runs each commit needs)", EXIT_USAGE)
        # --max-endpoint-runs alone may lower the default first batch
        self.endpoint_runs = min(self.endpoint_runs, self.max_endpoint_runs)
        if self.endpoint_runs < 2:
            raise KlbisectError("--endpoint-runs and --max-endpoint-runs must be at least 2", EXIT_USAGE)
        if self.threshold is not None and self.votes % 2 == 0:
            raise KlbisectError("--votes must be odd so a majority always exists", EXIT_USAGE)


def make_probe(cfg: BisectConfig):
    if cfg.probe == "sglang":
        from .sglang import SGLangProbe  # noqa: PLC0415 - only for SGLang users
        return SGLangProbe.from_options(cfg.sglang, timeout=cfg.timeout)
    # --build sglang installs one checkout into the Python every slot shares: each
    # probe imports its own checkout's python/ first, as the SGLang probe's server does
    return CommandProbe(cfg.probe_cmd or "", timeout=cfg.timeout, metric_regex=cfg.metric_regex,
                        pythonpath=("python",) if cfg.build == "sglang" else ())


def hold_env(ws: "Workspace", sid: int, builder, log_dir: Path) -> None:
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


def unbuilt_sglang_hint(ws: "Workspace", cfg: BisectConfig) -> str:
    """Endpoints alike in an SGLang checkout probed with no build: each
    commit's test most likely imported the one sglang installed (a tester
    bisected their own editable checkout, the same code at every commit)."""
    if cfg.build or cfg.build_cmd or cfg.probe == "sglang" or not (ws.top / "python" / "sglang").is_dir():
        return ""
    return ("; this is an SGLang checkout probed with no build: every commit's test may have imported the "
            "same installed sglang; add --build sglang (each probe then imports its own checkout)")


def _take_over_env(ws: "Workspace", sid: int, builder) -> None:
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


def close_builder(builder, progress: Progress, ws: "Workspace | None" = None, sid: int | None = None) -> None:
    """End of a session's builds: a builder that changed the user's
    environment (--build sglang) puts it back, and says so. With the
    session (``hold_env``), what could not be put back stays in its store."""
    close = getattr(builder, "close", None)
    if close:
        try:
            close(progress)
        finally:
            if ws is not None and sid is not None:
                saved = getattr(builder, "saved_origin", None)
                left = saved() if saved else None
                ws.store.put(env_key(sid), json.dumps(left) if left is not None else "")


def make_builder(cfg: BisectConfig):
    if cfg.build == "sglang":
        from .sglang import SGLangBuilder  # noqa: PLC0415
        return SGLangBuilder.from_options({**cfg.sglang, "timeout": cfg.build_timeout})
    if cfg.build_cmd:
        return CommandBuilder(cfg.build_cmd, tuple(cfg.build_paths), cfg.build_timeout)
    return None


def same_question(sess, good: str, bad: str, cfg: BisectConfig) -> bool:
    """Whether a stored session asks this command's question (its settings a rerun may change aside)."""
    return (sess.good, sess.bad, question_of(sess.config)) == (good, bad, cfg.question())


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


def unfollowed_pins(repo, good: str, bad: str) -> str:
    """The pins --build sglang does not install (torch, transformers) that a
    commit of the range changes: "SHA: torch 2.8.0 -> 2.9.1"; else "". The
    kernel wheels it installs are built for one torch: past a joint bump,
    every commit may fail to import them."""
    from .sglang import PYPROJECT, UNFOLLOWED_PINS, parse_pins  # noqa: PLC0415
    first = parse_pins(gitrepo.show_file(repo, good, PYPROJECT), UNFOLLOWED_PINS)
    for sha in gitrepo.touching(repo, good, bad, PYPROJECT):
        pins = parse_pins(gitrepo.show_file(repo, sha, PYPROJECT), UNFOLLOWED_PINS)
        if pins != first:
            return f"{sha[:12]}: " + ", ".join(f"{n} {first.get(n) or 'unpinned'} -> {pins.get(n) or 'unpinned'}"
                                               for n in sorted(set(first) | set(pins)) if first.get(n) != pins.get(n))
    return ""


def pins_moved(repo, cfg: BisectConfig, builder, good: str, bad: str) -> str:
    """Where --build sglang meets a range whose commits pin different kernel
    wheels, with --parallel: "SHA (name old -> new, ...)"; else "". The
    wheels go into the one Python that slots (or a Ray node's tasks) share,
    and a slot whose own checkout needs no build would probe with the wheel
    another had just installed."""
    if cfg.parallel <= 1 or not getattr(builder, "install_pins", False):
        return ""
    from .sglang import PYPROJECT, parse_pins  # noqa: PLC0415
    first = parse_pins(gitrepo.show_file(repo, good, PYPROJECT))
    for sha in gitrepo.touching(repo, good, bad, PYPROJECT):
        pins = parse_pins(gitrepo.show_file(repo, sha, PYPROJECT))
        if pins != first:
            return f"{sha[:12]} (" + ", ".join(f"{n} {first.get(n) or 'unpinned'} -> {pins.get(n) or 'unpinned'}"
                                               for n in sorted(set(first) | set(pins))
                                               if first.get(n) != pins.get(n)) + ")"
    return ""


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


def default_executor(cfg: BisectConfig, slots: list[Slot], measurer: Measurer, ws: Workspace,
                     take_turns: bool = False):
    if cfg.executor == "ray":
        from .ray_executor import RayExecutor  # noqa: PLC0415 - optional extra
        return RayExecutor.from_config(cfg, ws, measurer, take_turns=take_turns)
    # spare checkouts keep built the few commits a search revisits from whichever slot is free;
    # one slot keeps its one worktree, built incrementally from commit to commit
    return LocalExecutor(slots, measurer.measure, spare_checkouts=len(slots) + 1 if len(slots) > 1 else 0)


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
