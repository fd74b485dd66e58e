"""What defines a bisect (``BisectConfig``): the question a session asks,
which decides whether a rerun resumes it (``question``, ``RERUN_KEYS``),
and the probe and builder it makes."""
from __future__ import annotations

import shlex
import shutil
from dataclasses import asdict, dataclass, field
from typing import Mapping

from .build import DEFAULT_BUILD_PATHS, DEFAULT_BUILD_TIMEOUT, CommandBuilder, shared_install
from .decide import MAX_CONFIDENCE, MAX_ENDPOINT_RUNS, MAX_TOTAL_RUNS, MIN_ENDPOINT_RUNS
from .errors import EXIT_USAGE, KlbisectError
from .metric import check_regex
from .probe import DEFAULT_TIMEOUT, MAX_PARALLEL, CommandProbe


def given_sglang(options: Mapping) -> dict:
    """The SGLang settings a command gave: an empty or zero one was not
    given (a default), except a temperature of 0, which is greedy sampling
    (a reviewer's --temperature 0 was dropped as 0 and sampled at 1); the
    default temperature 1 is left out, so that runs stored before the option
    keep their session's question."""
    return {k: v for k, v in options.items()
            if ((v is not None and v != 1.0) if k == "temperature" else v not in (None, "", 0, [], ()))}


def sglang_flag(key: str) -> str:
    """The command-line option of a --probe/--build sglang setting."""
    return "--sglang-python" if key == "python" else "--" + key.replace("_", "-")


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
    # --all-commits: the session whose answer, a merge, this search's range is the side branch of,
    # and the last run id before the command began (its stages' runs after it are the command's own)
    side_of: int = 0
    command_after_run: int | None = None
    # --all-commits: runs the command's earlier stages spent, which --max-total-runs counts too
    prior_runs: int = 0

    def runs_left(self, spent: int) -> int:
        """What --max-total-runs leaves after a session's ``spent`` runs (and
        the earlier stages' of an --all-commits command)."""
        return self.max_total_runs - self.prior_runs - spent

    def question(self) -> dict:
        d = asdict(self)
        for k in ("good", "bad", "parallel", "gpus_per_probe", "executor", "ray_address",
                  "max_total_runs", "timeout", "build_timeout", "fresh", "side_of",
                  "command_after_run", "prior_runs"):
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
        argv = ["klbisect", "run", "--good", good, "--bad", bad, *self.measure_argv()]

        def opt(flag: str, value, default) -> None:
            if value != default and value is not None:
                argv.extend([flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)])

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

    def measure_argv(self) -> list[str]:
        """``probe_argv`` and the build that decides what the probe measures
        (--build sglang puts each checkout first on the probe's imports)."""
        return [*self.probe_argv(), *(["--build-cmd", self.build_cmd] if self.build_cmd else []),
                *(["--build", self.build] if self.build else [])]

    def probe_argv(self) -> list[str]:
        """The options that choose and shape the probe, as a command line gives
        them: for the `run` advice above, and for reports (a reader measures
        the same way with them)."""
        argv = [] if self.probe == "cmd" else ["--probe", self.probe]
        if self.probe_cmd is not None:
            argv += ["--probe-cmd", self.probe_cmd]
        for key, value in self.sglang.items():
            if value is None:
                continue
            if key == "server_env":     # repeated, one variable each
                argv += [a for item in value for a in (sglang_flag(key), item)]
            else:
                shown = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
                argv += [sglang_flag(key), shown]
        return argv

    @classmethod
    def from_dict(cls, d: dict) -> "BisectConfig":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if "build_paths" in known:
            known["build_paths"] = tuple(known["build_paths"])
        return cls(**known)

    def check_options(self) -> None:
        """Options that contradict each other, or that the chosen probe or
        build does not read: they were dropped without a word (a tester's
        --build-cmd never ran beside --build sglang, and --model-path did
        nothing with --probe-cmd)."""
        # as make_config keeps them: a setting left empty was not given (from Python too)
        sglang = given_sglang(self.sglang or {})
        if self.probe == "sglang" and not sglang.get("model_path"):
            raise KlbisectError("--probe sglang needs --model-path", EXIT_USAGE)
        if self.probe == "sglang" and self.probe_cmd:
            raise KlbisectError("--probe sglang runs klbisect's own KL probe against a server, and --probe-cmd is "
                                "the command of --probe cmd: give one of them", EXIT_USAGE)
        if self.build == "sglang" and self.build_cmd:
            raise KlbisectError("--build sglang and --build-cmd both build each commit: give one of them", EXIT_USAGE)
        if self.probe != "sglang":
            idle = [k for k in sglang if k not in ("python", "pip_args")]
            if idle:
                raise KlbisectError(f"{sglang_flag(idle[0])} is an option of --probe sglang, which this command "
                                    "does not use: leave it out, or pass --probe sglang", EXIT_USAGE)
        labels = sglang.get("labels") or ""
        labels = [x.strip() for x in (labels.split(",") if isinstance(labels, str) else labels) if x.strip()]
        if self.probe == "sglang" and labels and self.metric and self.metric not in labels:
            # found after two endpoint runs before: each one a server launch
            raise KlbisectError(f"--metric {self.metric} is not among --labels {','.join(labels)}: the probe would "
                                "never measure it; add it to --labels or pick one of them", EXIT_USAGE)
        if self.build != "sglang":
            idle = [k for k in ("pip_args",) if k in sglang] + (
                [k for k in ("python",) if k in sglang] if self.probe != "sglang" else [])
            if idle:
                raise KlbisectError(f"{sglang_flag(idle[0])} is an option of --build sglang"
                                    f"{' (or --probe sglang)' if idle[0] == 'python' else ''}, which this command "
                                    "does not use: leave it out, or pass --build sglang", EXIT_USAGE)

    def validate(self) -> None:
        self.check_options()
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
                        python=(cfg.sglang or {}).get("python") if cfg.build == "sglang" else None,
                        pythonpath=("python",) if cfg.build == "sglang" else ())


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


# Stored with a session but not part of its question: a rerun with another
# --timeout or --build-timeout (after every run timed out) resumes the same session, and a
# rerun without --fresh resumes a --fresh one (which stays fresh).
RERUN_KEYS = ("timeout", "build_timeout", "fresh", "fresh_from", "max_total_runs")


def question_of(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in RERUN_KEYS}
