"""The command line: parse options, call the core, print. Nothing else."""
from __future__ import annotations

import errno
import json
import math
import os
import shlex
import sqlite3
import sys
import traceback
from pathlib import Path

import click

from . import __version__
from .build import DEFAULT_BUILD_PATHS, DEFAULT_BUILD_TIMEOUT
from .decide import (DECISIVE_RUNS, MAX_CONFIDENCE, MAX_ENDPOINT_RUNS, MAX_TOTAL_RUNS, MIN_ENDPOINT_RUNS,
                     OVERLAP_ENDPOINT_RUNS)
from .errors import (EXIT_CODES, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_NOT_SURE, EXIT_USAGE, KlbisectError,
                     json_failure)
from .metric import fmt_count
from .probe import DEFAULT_TIMEOUT, MAX_PARALLEL


def _text_only(argv: list[str]) -> None:
    """Options are stored as text (UTF-8): an argument that is not (a byte
    the shell passed raw) failed only when its session was written, as an
    internal error that left the session half-made (a tester's --metric
    $'\\xff')."""
    for i, arg in enumerate(argv):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as e:
            bad = arg[e.start:e.end].encode("utf-8", "surrogateescape")
            flag = arg.partition("=")[0] if arg.startswith("--") and "=" in arg else (
                argv[i - 1] if i and argv[i - 1].startswith("-") else f"argument {arg[:e.start]!r}...")
            raise KlbisectError(f"{flag} is not valid UTF-8 (it has the byte 0x{bad[0]:02x}); klbisect keeps "
                                "its options as text: write it in UTF-8", EXIT_USAGE) from None


class Cli(click.Group):
    """Turns every failure into one line and a documented exit code. A
    traceback would exit 1, which `git bisect run` reads as 'bad'."""

    # Commands defined in their own modules, loaded when named (they import
    # this module's option decorators, so importing them here would cycle).
    lazy = {"report": "cli_report", "nightly": "cli_report", "history": "cli_report"}

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx, name):
        if name in self.lazy and name not in self.commands:
            import importlib
            module = importlib.import_module(f"klbisect.{self.lazy[name]}")
            self.add_command(getattr(module, name))
        return super().get_command(ctx, name)

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        argv = list(kwargs.get("args") or (args[0] if args else None) or sys.argv[1:])
        # --json promises stdout ends with one JSON object: a failure says so there too
        self._json = "--json" in argv or _report_json_to_stdout(argv)
        self._nightly = argv[:1] == ["nightly"]
        try:
            _text_only(argv)
            rv = super().main(*args, **kwargs)
            sys.exit(rv if isinstance(rv, int) else 0)
        except KlbisectError as e:
            self._partial = getattr(e, "json_partial", None)
            self._fail(e.code, f"klbisect: error: {e.message}", e.detail)
        except (click.exceptions.Abort, KeyboardInterrupt) as e:
            # click turns a KeyboardInterrupt into Abort: the session's own line rides on its cause
            said = getattr(e, "message", None) or getattr(e.__cause__, "message", None)
            self._partial = getattr(e, "json_partial", None) or getattr(e.__cause__, "json_partial", None)
            self._fail(EXIT_INTERRUPTED, "klbisect: " + (said or "interrupted; finished runs are saved, "
                                                          "rerun to resume"))
        except click.UsageError as e:
            if type(e).__name__ == "NoArgsIsHelpError" and e.ctx is not None:
                click.echo(e.ctx.get_help())
                sys.exit(0)
            name = e.ctx.command_path if e.ctx else "klbisect"
            hint = _one_dash(e, argv) or _misplaced(e, argv)
            said = e.format_message().rstrip(".") + hint if hint else e.format_message()
            self._fail(EXIT_USAGE, f"klbisect: error: {said} (see {name} --help)")
        except click.ClickException as e:
            self._fail(EXIT_USAGE, f"klbisect: error: {e.format_message()}")
        except (sqlite3.DatabaseError, OSError) as e:
            if isinstance(e, OSError) and e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
                return self._internal(e)
            damaged = "malformed" in str(e) or "not a database" in str(e)
            if isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError) and not damaged:
                return self._internal(e)     # an IntegrityError is klbisect's bug, not the disk's
            from .store import storage_error  # noqa: PLC0415
            err = storage_error(e)
            self._fail(err.code, f"klbisect: error: {err.message}")
        except SystemExit:
            raise
        except Exception as e:  # noqa: BLE001 - the last line of defence for git bisect
            return self._internal(e)

    def _fail(self, code: int, line: str, detail: str | None = None) -> None:
        if detail:
            # the log tail first: a CI step's `tail -1` (a tester's) reads klbisect's line, not the probe's
            click.echo(detail, err=True)
        click.echo(line, err=True)
        if getattr(self, "_json", False):
            try:
                _emit_json(json_failure(getattr(self, "_nightly", False),
                                        line.removeprefix("klbisect: ").removeprefix("error: "), code,
                                        getattr(self, "_partial", None)))
            except OSError:
                pass   # stdout gone (a closed pipe): the exit code still says it
        sys.exit(code)

    def _internal(self, e: Exception):
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else "?"
        import os
        if os.environ.get("KLBISECT_DEBUG"):
            traceback.print_exc()
        self._fail(EXIT_INTERNAL, f"klbisect: internal error: {type(e).__name__}: {e} (at {where}); "
                   "set KLBISECT_DEBUG=1 for the traceback")


def _codes_epilog() -> str:
    return "Exit codes:\n\n" + "\n\n".join(f"  {k}: {v}" for k, v in sorted(EXIT_CODES.items()))


@click.group(cls=Cli, epilog=_codes_epilog())
@click.version_option(__version__, prog_name="klbisect")
def cli() -> None:
    """Find the commit that made a noisy KL-divergence metric worse.

    \b
    klbisect run --good ddd4600 --bad main --probe-cmd "python3 test_kl.py"
    klbisect start --good ddd4600 --bad main --probe-cmd "..."; git bisect run klbisect probe
    """


class _SessionId(click.ParamType):
    """A session number as sqlite stores it (a larger one was an
    OverflowError, exit 159), refused in words a user reads, not as
    "not in the range 1<=x<=9223372036854775807"."""

    name = "N"

    def convert(self, value, param, ctx):
        try:
            n = int(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a session number (1, 2, ...: `klbisect log --sessions` lists them)",
                      param, ctx)
        if not 1 <= n <= 2**63 - 1:
            self.fail(f"{n} is not a session number: {'they start at 1' if n < 1 else 'no session has it'} "
                      "(`klbisect log --sessions` lists them)", param, ctx)
        return n


SESSION_ID = _SessionId()

repo_option = click.option("--repo", "repo", default=None, metavar="PATH",
                           help="Repository (default: the one of the current directory).")


class _Revision(click.ParamType):
    """A revision, not the next option taken as its value when the value was
    left out: `--good --bad main` read as a missing --bad (a tester's). git
    refuses names that start with "-"; others such are left to it (151)."""
    name = "REV"

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.startswith("--"):
            self.fail(f"needs a revision (a sha, branch or tag), not the option {value!r}: give it one", param, ctx)
        return value


REVISION = _Revision()


def range_options(f):
    f = click.option("--bad", required=True, type=REVISION, help="A known-bad commit, e.g. main.")(f)
    return click.option("--good", required=True, type=REVISION, help="A known-good commit (sha, branch or tag).")(f)


class _Number(click.ParamType):
    """A number an option can use, else one usage line in klbisect's own words
    ("--max-new-tokens -5: give a whole number, at least 1", exit 150) before
    anything runs: a bad number used to launch a server per run and end on
    "printed no metric value". Floats must be finite (nan passes every range
    check, and a nan timeout never expires)."""

    def __init__(self, cast: type, ok, wants: str):
        self.name = {int: "integer", float: "float"}[cast]   # the help shows INTEGER / FLOAT, as before
        self._cast, self._ok, self._wants = cast, ok, wants

    def convert(self, value, param, ctx):
        try:
            v = self._cast(value)
        except (TypeError, ValueError):
            v = None
        if v is None or (isinstance(v, float) and not math.isfinite(v)) or not self._ok(v):
            raise click.UsageError(f"{param.opts[0] if param else 'value'} {value}: give {self._wants}", ctx)
        return v


# Upper bounds catch a typo (a tester's --runs 99999999999999999999 probed until Ctrl-C), not a need:
# a million runs or a year of seconds is past any probe.
MOST_RUNS, MOST_SECONDS = 1_000_000, 365 * 86400
COUNT = _Number(int, lambda v: 1 <= v <= MOST_RUNS, f"a whole number from 1 to {MOST_RUNS:,}")
SIDE_RUNS = _Number(int, lambda v: 2 <= v <= MOST_RUNS,   # one run per side tells nothing
                    f"a whole number from 2 to {MOST_RUNS:,}")
SECONDS = _Number(float, lambda v: 0.001 <= v <= MOST_SECONDS, f"seconds, from 0.001 to {MOST_SECONDS:,} (a year)")
VALUE = _Number(float, lambda v: True, "a finite number")
KL_VALUE = _Number(float, lambda v: v > 0, "a KL value above 0")
TEMPERATURE = _Number(float, lambda v: 0 <= v < math.inf, "a sampling temperature, 0 or more")
CONFIDENCE = _Number(float, lambda v: 0.5 < v <= MAX_CONFIDENCE,
                     f"a level above 0.5 and at most {MAX_CONFIDENCE:g} (e.g. 0.99)")
# the executors' own limit, said by the option's check (--parallel 0 said "1 to 1,000,000", 300 "at most 256")
SLOTS = _Number(int, lambda v: 1 <= v <= MAX_PARALLEL, f"a whole number from 1 to {MAX_PARALLEL} (probes at a time)")
RUNS_PER_LAUNCH = _Number(int, lambda v: v >= 0, "a whole number, 0 or more (0: all runs of a commit)")


def probe_options(f):
    """How to build and measure a commit (all commands that probe share these)."""
    opts = [
        click.option("--probe-cmd", default=None, help="Shell command that runs the KL test from the checkout root."),
        click.option("--probe", "probe_kind", type=click.Choice(["cmd", "sglang"]), default="cmd",
                     show_default=True, help="cmd: --probe-cmd; sglang: launch a server and measure KL."),
        click.option("--build-cmd", default=None, help="Shell command that builds a checkout before probing it."),
        click.option("--build", "build_kind", type=click.Choice(["sglang"]), default=None,
                     help="SGLang-aware rebuilds (editable install, pinned kernel wheels)."),
        click.option("--build-paths", default=",".join(DEFAULT_BUILD_PATHS), show_default=True,
                     help="Comma-separated globs: rebuild only when a matching file changed."),
        click.option("--timeout", type=SECONDS, default=DEFAULT_TIMEOUT, show_default=True,
                     help="Seconds before one probe run is killed."),
        click.option("--build-timeout", type=SECONDS, default=DEFAULT_BUILD_TIMEOUT, show_default=True,
                     help="Seconds before one build is killed (the commit is then untestable)."),
        click.option("--metric", default=None, help="Judge one label (default: max over labels)."),
        click.option("--metric-regex", default=None,
                     help="Regex with a group 'value' (and optionally 'label') for non-SGLang output."),
    ]
    f = sglang_options(f)
    for o in reversed(opts):
        f = o(f)
    return f


def search_options(f=None, *, worse=("higher", "lower", "either")):
    """How to decide and when to stop (bisecting commands only); nightly's
    one-sided tests take a narrower --worse."""
    if f is None:
        return lambda g: search_options(g, worse=worse)
    opts = [
        click.option("--threshold", type=VALUE, default=None,
                     help="Classic mode: a run fails at or above this value (no learning)."),
        click.option("--votes", type=COUNT, default=1, show_default=True,
                     help="Classic mode: majority of this many runs per commit."),
        click.option("--max-runs", type=COUNT, default=None,
                     help="At most this many runs with a value per commit [default: 10 when good and "
                          "bad separate, 100 when they overlap; in `run` and `nightly`, 400 for the two commits the likeliest "
                          "answer rests on while it is short of --confidence]."),
        click.option("--endpoint-runs", type=SIDE_RUNS, default=MIN_ENDPOINT_RUNS, show_default=True,
                     help=f"Runs per endpoint before checking that they separate. `run` may start "
                          f"searching on fewer than {DECISIVE_RUNS} when they separate widely, adds the runs of "
                          f"commits it places on a side to that side, and answers once each has {DECISIVE_RUNS}; "
                          f"`start` (a verdict per commit) measures both on to {DECISIVE_RUNS} first. Sides "
                          f"that overlap go on to {OVERLAP_ENDPOINT_RUNS} each."),
        click.option("--max-endpoint-runs", type=SIDE_RUNS, default=MAX_ENDPOINT_RUNS, show_default=True,
                     help="Give up when the endpoints still do not separate after this many runs each."),
        click.option("--confidence", type=CONFIDENCE, default=0.99, show_default=True,
                     help="Stop when the most likely culprit (or block) reaches this probability."),
        # nightly parses every choice so that its refusal of the others says what to run instead
        click.option("--worse", type=click.Choice(["higher", "lower", "either"]), default="higher",
                     show_default=True, metavar=f"[{'|'.join(worse)}]",
                     help="Which way the metric gets worse: a KL divergence is worse higher; an accuracy lower. "
                          "Endpoints that moved the other way are a fix, or swapped, and stop with 154."
                     if len(worse) > 1 else "Higher values are worse (a KL divergence): nightly's tests are "
                                            "one-sided; bisect an accuracy with `klbisect run --worse lower`."),
        click.option("--all-commits", is_flag=True, help="Also consider commits of merged side branches."),
        click.option("--max-total-runs", type=COUNT, default=MAX_TOTAL_RUNS, show_default=True,
                     help="Stop searching after this many runs of this session (endpoint runs included; "
                          "runs reused from earlier sessions not counted)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


# bisects only: the nightly job tells a new environment by itself
fresh_option = click.option(
    "--fresh", is_flag=True,
    help="Leave out the runs and failed builds recorded before this session (after a new driver, wheel or "
         "machine); a rerun without --fresh resumes it.")


def sglang_options(f):
    opts = [
        click.option("--model-path", default=None, help="--probe sglang: model to serve."),
        click.option("--server-args", default="", help="--probe sglang: extra launch_server arguments."),
        click.option("--server-env", multiple=True, metavar="NAME=VALUE",
                     help="--probe sglang: an environment variable for the server, as the test's launch sets "
                          "(e.g. SGLANG_ENABLE_UNIFIED_RADIX_TREE=1); repeat it for several."),
        click.option("--prompts", default=None, help="--probe sglang: JSON list of token-id lists."),
        click.option("--runs-per-launch", type=RUNS_PER_LAUNCH, default=0,
                     help="--probe sglang: runs sharing one server launch (0: all runs of a commit)."),
        click.option("--max-new-tokens", type=COUNT, default=None, help="--probe sglang: tokens per sample."),
        click.option("--labels", default=None,
                     help="--probe sglang: comma-separated subset of logprobs_match,prefill_cache_hit,"
                          "decode_cache_hit."),
        click.option("--num-samples", type=COUNT, default=None, help="--probe sglang: use the first N prompts (at most the file's count)."),
        click.option("--launch-timeout", type=SECONDS, default=None,
                     help="--probe sglang: seconds for /health_generate to answer 200 (default 1800); "
                          "--timeout counts from then."),
        click.option("--request-timeout", type=SECONDS, default=None, help="--probe sglang: seconds per request."),
        click.option("--sglang-python", "python", default=None,
                     help="--probe/--build sglang: interpreter that has sglang's dependencies."),
        click.option("--kl-flow", type=click.Choice(("single", "multiturn")), default=None,  # sglang.KL_FLOWS
                     help="--probe sglang: single (kl_test_utils.py's helpers, the default) or multiturn (the "
                          "unified-radix-tree tests' three turns over branching prefixes, kl_multiturn_utils.py)."),
        click.option("--temperature", type=TEMPERATURE, default=None,
                     help="--probe sglang: sampling temperature of every request (default 1; the tests' "
                          "sampling_temperature, 0 in some)."),
        click.option("--prefix-len", type=COUNT, default=None,
                     help="--kl-flow multiturn: tokens of each prompt the branches share (the kit's prefix_len, "
                          "512)."),
        click.option("--turn-separator", default=None,
                     help="--probe sglang: comma-separated token ids between turns for decode_cache_hit."),
        click.option("--kl-threshold", type=KL_VALUE, default=None,
                     help="--probe sglang: also write pass/fail against this threshold into each run's log, "
                          "like the test's assertion (the run exits 1 at or above it; its values count all the "
                          "same)."),
        click.option("--pip-args", multiple=True,
                     help="--build sglang: extra pip arguments (repeat it, or quote several in one; split as a "
                          "shell splits, so an argument with a space needs its own quotes)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def make_config(kw: dict):
    from .config import BisectConfig, given_sglang
    sglang = {k: kw.pop(k) for k in _SGLANG_KEYS if k in kw}
    if isinstance(sglang.get("pip_args"), tuple):
        # every --pip-args given, in order (a tester's three kept only the last, and pip went to PyPI)
        sglang["pip_args"] = " ".join(sglang["pip_args"])
    if sglang.get("turn_separator"):
        sglang["turn_separator"] = _token_ids(sglang["turn_separator"])
    if "server_env" in sglang:
        sglang["server_env"] = list(sglang["server_env"] or ())
    sglang = given_sglang(sglang)
    if os.sep in sglang.get("python", ""):
        # one interpreter wherever the command runs from (git bisect runs `probe` from the top)
        sglang["python"] = os.path.abspath(sglang["python"])
    for k in ("prompts", "model_path"):
        # stored with the session and read from the checkouts' directories: a path from here
        # (a model id such as org/name is not a path here and stays as it is)
        if k in sglang and os.path.exists(sglang[k]):
            sglang[k] = os.path.abspath(sglang[k])
    cfg = BisectConfig(
        good=kw.get("good") or "", bad=kw.get("bad") or "", probe_cmd=kw["probe_cmd"], probe=kw["probe_kind"],
        build_cmd=kw["build_cmd"], build=kw["build_kind"],
        build_paths=tuple(p.strip() for p in kw["build_paths"].split(",") if p.strip()),
        timeout=kw["timeout"], build_timeout=kw["build_timeout"], metric=kw["metric"],
        metric_regex=kw["metric_regex"],
        sglang=sglang, **{k: kw[k] for k in _SEARCH_KEYS if k in kw},
        **({"first_parent": not kw["all_commits"]} if "all_commits" in kw else {}),
        parallel=kw.get("parallel", 1), gpus_per_probe=kw.get("gpus_per_probe", 0),
        executor=kw.get("executor", "local"), ray_address=kw.get("ray_address"), fresh=kw.get("fresh", False),
    )
    cfg.check_options()    # before anything runs: a nightly measures its night before it bisects
    return cfg


def _token_ids(text: str) -> list[int]:
    """--turn-separator: token ids are integers from 0 up."""
    try:
        ids = [int(t) for t in text.split(",")]
    except ValueError:
        ids = [-1]
    if any(t < 0 for t in ids):
        raise KlbisectError(f"--turn-separator {text!r}: give token ids (integers from 0) separated by commas",
                            EXIT_USAGE)
    return ids


_SGLANG_KEYS = ("model_path", "server_args", "server_env", "prompts", "runs_per_launch", "max_new_tokens", "labels",
                "num_samples", "launch_timeout", "request_timeout", "python", "turn_separator", "kl_flow",
                "temperature", "prefix_len",
                "kl_threshold", "pip_args")
_SEARCH_KEYS = ("threshold", "votes", "max_runs", "endpoint_runs", "max_endpoint_runs", "confidence",
                "max_total_runs", "worse")


def _report_json_to_stdout(argv: list[str]) -> bool:
    """`report --format json` without -o: a script reads stdout, so a
    failure ends there in a JSON object too, as with --json."""
    if argv[:1] != ["report"]:
        return False
    fmt = [b for a, b in zip(argv, argv[1:] + [""]) if a == "--format"] + \
          [a.split("=", 1)[1] for a in argv if a.startswith("--format=")]
    to_file = any(a in ("-o", "--output") or a.startswith(("--output=", "-o")) for a in argv[1:])
    return fmt[-1:] == ["json"] and not to_file


def _one_dash(e: click.UsageError, argv: list[str]) -> str:
    """`-good` reads as -g -o -o -d to click ("No such option: -g"): name
    the long option the user meant."""
    short = getattr(e, "option_name", "") or ""
    if not isinstance(e, click.NoSuchOption) or short.startswith("--"):
        return ""
    meant = next((t for t in argv if t.startswith(short) and not t.startswith("--") and len(t) > 2), None)
    return f" (long options take two dashes: -{meant.split('=', 1)[0]})" if meant else ""


def _misplaced(e: click.UsageError, argv: list[str]) -> str:
    """An option click does not know where it was given, though a command
    takes it (a tester's `klbisect --good X run ...`, `klbisect probe
    --probe-cmd ...`): say where it goes."""
    if not isinstance(e, click.NoSuchOption) or e.ctx is None:
        return ""
    name = e.option_name.split("=", 1)[0]
    if e.ctx.parent is None:    # before the command's name
        takes = [c for c in [*argv, *cli.commands] if c in cli.commands
                 and any(name in p.opts for p in cli.commands[c].params)]
        return f" (options go after the command: klbisect {takes[0]} {name} ...)" if takes else ""
    if e.ctx.command.name == "probe" and any(name in p.opts for p in cli.commands["start"].params):
        return (f" (`klbisect probe` takes the session's settings: give {name} to `klbisect start`, "
                "or `klbisect start` again with it)")
    return ""


def _emit_json(obj) -> None:
    click.echo(json.dumps(obj, sort_keys=False, default=str))


@cli.command()
@repo_option
@range_options
@probe_options
@search_options
@fresh_option
@click.option("--parallel", type=SLOTS, default=1, show_default=True, help="Probe this many commits at once.")
@click.option("--gpus-per-probe", type=_Number(int, lambda v: v >= 0, "a whole number, 0 or more (0: no assignment)"),
              default=0, show_default=True,
              help="GPUs given to each parallel probe (CUDA_VISIBLE_DEVICES); 0: no assignment.")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--ray-address", default=None, help="auto or ray://HOST:PORT (with --executor ray).")
@click.option("--json", "as_json", is_flag=True, help="End stdout with one JSON object.")
def run(repo, as_json, **kw):
    """Bisect by itself in a worktree; your checkout and HEAD stay untouched."""
    from .report import format_result
    from .session import run_bisect
    cfg = make_config(kw)
    res = run_bisect(repo, cfg)
    click.echo(format_result(res), err=as_json)
    code = 0 if res.complete else EXIT_NOT_SURE
    if as_json:
        # what measured it (a stored answer of --kl-flow multiturn read like a single-turn one: a tester's)
        _emit_json({**res.to_json(), "stands_out": res.stands_out(), "probe": shlex.join(cfg.measure_argv()),
                    "exit_code": code})
    return code


@cli.command()
@repo_option
@range_options
@probe_options
@search_options
@fresh_option
def start(repo, **kw):
    """Calibrate the endpoints, then `git bisect start --first-parent`.

    Next: git bisect run klbisect probe
    """
    from .gitbisect import start as do_start
    out = do_start(repo, make_config(kw))
    click.echo(out["git"].strip())
    top = out.get("top") or ""
    here = "" if not top or Path.cwd().resolve() == Path(top).resolve() else f"    cd {shlex.quote(str(top))}\n"
    click.echo(f"klbisect: session {out['session']} ready ({fmt_count(out['n_commits'], 'candidate commit')}). Next:\n"
               f"{here}    git bisect run klbisect probe\n"
               "then `klbisect status` for the answer and `klbisect reset` to finish.")
    return 0


@cli.command()
@repo_option
def probe(repo):
    """Judge HEAD for `git bisect run`: exit 0 good, 1 bad, 125 skip."""
    from .gitbisect import probe_head
    return probe_head(repo).exit_code


@cli.command()
@repo_option
@click.option("--session", "session_id", type=SESSION_ID, default=None,
              help="An earlier session (its number, as `klbisect log --sessions` lists it).")
@click.option("--json", "as_json", is_flag=True)
def status(repo, session_id, as_json):
    """Commits probed, their values and verdicts, the most likely culprit."""
    from .report import format_status
    from .status import status as get_status
    st = get_status(repo, session_id)
    if as_json:
        _emit_json(st)
    else:
        click.echo(format_status(st))
    return 0


@cli.command()
@repo_option
@click.option("--session", "session_id", type=SESSION_ID, default=None)
@click.option("--sessions", "list_sessions", is_flag=True,
              help="List every session instead: its number, kind, state, runs and answer.")
@click.option("--json", "as_json", is_flag=True)
def log(repo, session_id, list_sessions, as_json):
    """Every probe run of the session, with its log file."""
    from .report import format_log, format_sessions
    from .status import log as get_log, sessions
    if list_sessions:
        if session_id is not None:
            raise KlbisectError("--sessions lists every session: leave out --session (or --sessions, to see "
                                "that session's runs)", EXIT_USAGE)
        rows = sessions(repo)
        if as_json:
            _emit_json(rows)
        else:
            click.echo(format_sessions(rows))
        return 0
    rows = get_log(repo, session_id)
    if as_json:
        _emit_json(rows)
        return 0
    click.echo(format_log(rows))
    return 0


@cli.command()
@repo_option
@click.option("--purge", is_flag=True, help="Also delete run history and logs.")
def reset(repo, purge):
    """End the session, reset git bisect, remove worktrees (keeps history)."""
    from .status import reset as do_reset
    for line in do_reset(repo, purge) or ["nothing to reset"]:
        click.echo(line)
    return 0


@cli.command()
@repo_option
@click.option("--rev", required=True, type=REVISION, help="The commit to measure.")
@click.option("--runs", type=COUNT, default=30, show_default=True, help="Runs with a value to collect.")
@click.option("--bad-rev", default=None, type=REVISION, help="Also measure a bad commit and estimate a bisect's cost.")
@click.option("--commits", type=int, default=1000, show_default=True,
              help="Range size for the cost estimate (with --bad-rev).")
@click.option("--thresholds", default=None, help="Comma-separated candidate thresholds to count runs above.")
@click.option("--false-fail-rate", type=float, default=0.01, show_default=True)
@click.option("--confidence", "conf", type=float, default=0.95, show_default=True,
              help="Confidence of the threshold bound.")
@click.option("--worse", type=click.Choice(["higher", "lower"]), default="higher", show_default=True,
              help="Which way the metric fails: a KL test fails at or above its threshold, an accuracy "
                   "at or below; runs are counted, and thresholds recommended, on that side.")
@probe_options
@click.option("--fresh", is_flag=True,
              help="Count only runs from now on (after a new driver, wheel or machine); the same command "
                   "with --fresh resumes one that was interrupted.")
@click.option("--json", "as_json", is_flag=True)
def calibrate(repo, rev, runs, bad_rev, commits, thresholds, false_fail_rate, conf, as_json, **kw):
    """Run the probe N times at one commit and report what its values support."""
    from .calibrate import calibrate as do_calibrate, format_calibration
    try:
        ths = [float(t) for t in thresholds.split(",")] if thresholds else None
    except ValueError:
        raise KlbisectError(f"--thresholds {thresholds!r}: give numbers separated by commas", EXIT_USAGE)
    res = do_calibrate(repo, make_config(kw), rev, runs, bad_rev, ths, false_fail_rate, conf, commits)
    click.echo(format_calibration(res), err=as_json)
    if as_json:
        _emit_json({**res.to_json(), "exit_code": EXIT_INTERRUPTED if res.interrupted else 0})
    if res.interrupted:
        click.echo("klbisect: interrupted in the cost estimate; the report above is whole without it", err=True)
        return EXIT_INTERRUPTED
    return 0


@cli.command()
@click.option("--dir", "directory", default=None, type=click.Path(file_okay=False),
              help="Where to create the demo repository (default: a new temporary directory).")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N.")
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same history.")
@click.option("--parallel", type=SLOTS, default=2, show_default=True, help="Probes at a time.")
@click.option("--json", "as_json", is_flag=True)
def demo(directory, device, seed, parallel, as_json):
    """Bisect the embedded example engine: a tiny torch transformer whose
    history hides a commit that routes prefill through an FP8 Q/K/V hook."""
    from .demo.run import run_demo
    from .report import format_result
    out = run_demo(directory, device, seed, parallel, progress=lambda m: click.echo(m, err=True))
    text = format_result(out.result) + (
        f"\nPlanted culprit: {out.demo.culprit[:12]} (#{out.demo.culprit_pr}): "
        f"{'found' if out.found else 'NOT found'} in {out.seconds:.0f}s\n" + out.reproduce())
    click.echo(text, err=as_json)
    if as_json:
        _emit_json(out.to_json())
    return 0 if out.found else EXIT_NOT_SURE


@cli.command("make-prompts")
@click.argument("text_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--tokenizer", required=True, help="Tokenizer path or name (the served model's).")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="JSON file to write.")
@click.option("--num-samples", type=int, default=18, show_default=True)
@click.option("--max-tokens", type=int, default=3000, show_default=True)
@click.option("--trust-remote-code", is_flag=True,
              help="Load a tokenizer that ships its own code (Kimi, DeepSeek), as the tests' get_input_ids does.")
def make_prompts(text_file, tokenizer, out, num_samples, max_tokens, trust_remote_code):
    """Write a --prompts file (JSON list of token-id lists) from text, as
    SGLang's KL tests build theirs (needs `transformers`)."""
    from .sglang import make_prompts as do_make
    n, comma = do_make(text_file, tokenizer, out, num_samples, max_tokens, trust_remote_code=trust_remote_code)
    click.echo(f"wrote {n} prompts to {out}")
    if comma:
        # the tests' decode_cache_hit appends tokenizer.encode(","); the probe knows no tokenizer
        click.echo(f"decode_cache_hit's turn separator as the single-turn tests build it (--kl-flow single): "
                   f"--turn-separator {','.join(map(str, comma))}")
    return 0


def main() -> None:
    from .proc import become_subreaper
    become_subreaper()
    cli(prog_name="klbisect")


if __name__ == "__main__":
    # through the console script's entry: its output is redacted and a stop signal is one line
    from klbisect.__main__ import run as console_entry
    console_entry()
