"""Endpoint calibration: runs at the known good and bad commits until
they tell apart (or say why they cannot: a build that never works, a probe
that prints no value, endpoints alike), and the model the search uses."""
from __future__ import annotations

import errno
import math
import re
from functools import partial

from . import repo as gitrepo
from .config import BisectConfig
from .decide import (BAD, DECISIVE_RUNS, GOOD, MIN_ENDPOINT_RUNS, OVERLAP_ENDPOINT_RUNS, OVERLAP_P, SEPARATION_P,
                     EndpointStep, Model, ThresholdModel, endpoint_crash_limit, endpoint_step, judge, worse_tail)
from .errors import (EXIT_NO_SIGNAL, EXIT_PROBE_MISSING, EXIT_REPO_STATE, EXIT_STORAGE, EXIT_USAGE, KlbisectError,
                     NoDifference, OutOfRuns)
from .executors import Failure
from .labels import (check_direction, clearer_label, goes_better, judged_on, label_finding, label_hint,
                     silent_when_passing, spikes_note)
from .metric import broke, fmt_count, fmt_seconds, fmt_summary, fmt_vals, last_exception, over_labels
from .proc import log_tail
from .runs import CRASHED, MEASURED, STATUS_FAILED, STATUS_NOTFOUND, STATUS_TIMEOUT, failed_launches, missed_worse, repeated_runs, typical_values, usual_labels
from .search import CommitRuns
from .workspace import Progress, Workspace, commit_runs, since


def endpoint_problem(ws: Workspace, which: str, sha: str, probe_key: str, build_key: str | None,
                     cr: CommitRuns, crash_limit: int, note: str = "",
                     where: str | None = None, metric_regex: str | None = None,
                     at_both: bool = False, other: str | None = None) -> KlbisectError | None:
    """Why this endpoint cannot be measured, once that is clear: its build
    failed, it printed no value in ``crash_limit`` runs, or it printed
    labels but never the --metric asked for. ``where`` names the commit
    when it is not an endpoint (a nightly head); ``other`` is the other
    endpoint, whose runs may show a label that can be bisected instead."""
    where = where or f"the {which} endpoint"
    metric = ws.metric
    if metric and not cr.values:
        printed = [r for r in ws.store.runs(probe_key, [sha]) if r.values]
        # a run that stopped on its own assertion (a test that asserts in its loop over labels)
        # never reached its later labels: it says nothing of whether the test prints this one
        # (nor one that crashed after its first label: only runs that exited 0 count, a reviewer's)
        finished = [r for r in printed if r.status != STATUS_FAILED and r.exit_code == 0]
        # one is enough once the commit is given up on anyway (a tester's nightly head, whose test
        # failed its assertion every other run, was said to have "crashed part-way")
        if (len(finished) >= 2 or (finished and cr.crashes >= crash_limit)) \
                and not any(metric in r.values for r in printed):
            seen = sorted({k for r in finished for k in r.values})
            return KlbisectError(f"--metric {metric}: {where} {sha[:12]} printed the labels "
                                 f"{', '.join(seen)} in {fmt_count(len(finished), 'finished run')}, never {metric}; pick one of "
                                 f"them (or leave --metric out: the {over_labels(ws.worse)} over labels)"
                                 + ("; a [label] with a space in it is not read as one: print labels without spaces, "
                                    "or set --metric-regex with a group named label" if " " in metric else "")
                                 # a tester's regex had no label group: "pick one of value, value2, value3"
                                 + ("; those are the names of the values a --metric-regex with no group named label "
                                    "reads: add (?P<label>...) to it to read the probe's labels"
                                    if all(re.fullmatch(r"value\d*", k) for k in seen) else ""),
                                 EXIT_USAGE)
    if cr.build_failed:
        b = ws.store.failed_build(build_key or "", sha) or {}
        full = _disk_full(ws, f"{where} {sha[:12]} does not build", b.get("log_path"))
        if full:
            return full
        hint = ("give it a longer --build-timeout" if b.get("note") == "build timed out"
                else build_fix_hint(build_key))
        return KlbisectError(f"{where} {sha[:12]} does not build ({b.get('note', 'failed')}); "
                             f"{hint} or pick another {which} commit; "
                             f"log: {b.get('log_path')}",
                             EXIT_NO_SIGNAL, detail=log_tail(b.get("log_path", "")))
    runs = ws.store.runs(probe_key, [sha]) if not cr.values and cr.crashes else []
    last = runs[-1] if runs else None
    if last and last.status == STATUS_NOTFOUND:
        crash_limit = min(crash_limit, cr.crashes)    # the shell's "command not found": no run will differ
    if probe_key.startswith("sglang:") and failed_launches(runs[-2:]) == 2 and \
            runs[-1].started >= runs[-2].started + (runs[-2].duration or 0.0):
        # a server that did not start twice in a row (one after the other: two at once may both
        # have waited on one slow first download): its arguments or environment, and each more
        # try costs up to --launch-timeout (a tester's never-ready server was launched six times)
        crash_limit = min(crash_limit, cr.crashes)
    if not cr.values and cr.crashes >= crash_limit:
        if last and last.status == STATUS_NOTFOUND:
            return KlbisectError(f"the probe command was not found (exit 127) at {where} "
                                 f"{sha[:12]}; check --probe-cmd; log: {last.log_path}", EXIT_PROBE_MISSING,
                                 detail=log_tail(last.log_path or ""))
        if last and last.status == STATUS_TIMEOUT:
            # a run that printed values and then hung is still cut short: its labels may be incomplete
            what = "printed values but did not finish" if last.values else "printed no metric value"
            return KlbisectError(f"{where} {sha[:12]} {what} in {cr.crashes} runs{note}, "
                                 f"the last stopped by --timeout after {fmt_seconds(last.duration)} (a probe "
                                 f"that ignores SIGTERM is killed 5 s later); raise "
                                 f"--timeout (the runs it cut short are then run again); log: {last.log_path}",
                                 EXIT_NO_SIGNAL, detail=log_tail(last.log_path or ""))
        tail = log_tail(last.log_path if last and last.log_path else "")
        missing = re.search(r"No module named '?([\w.]+)", tail)
        missing_module = missing.group(1) if missing else ""
        if missing_module == "sglang" and probe_key.startswith("sglang:"):
            hint = ("sglang is not importable by the --sglang-python interpreter: install it there (`klbisect "
                    "run --build sglang` installs each commit) or point --sglang-python at the one that has it")
        elif missing_module.startswith("sglang.") and probe_key.startswith("sglang:"):
            # sglang itself imports: this commit's own code does not (a tester's stale import was
            # told to install sglang)
            hint = (f"its server could not import {missing_module}: this commit's own sglang code fails to import "
                    f"(its server log's traceback says where)"
                    + (f"; pick a {which} commit whose server starts" if which in ("good", "bad") else ""))
        elif probe_key.startswith("cmd:") and missing_module and which != "good":
            # at the bad end (or a nightly head) the test exists: the commit's own code or the
            # probe's Python lacks the module
            hint = (f"the probe could not import {missing_module}: a package must be installed in the probe's "
                    "Python, or this commit's own code fails to import (then pick a bad commit where the test "
                    "runs)")
        elif probe_key.startswith("cmd:") and missing_module:
            hint = (f"the probe could not import {missing_module}: a test module newer than the good "
                    "commit must be copied outside the repository and --probe-cmd pointed at the copy; a package "
                    "must be installed in the probe's Python")
        elif probe_key.startswith("cmd:") and re.search(
                r"can't open file|No such file or directory|ERROR: file or directory not found|can't cd to", tail):
            # the usual cause: a KL test added after --good is not in that commit's checkout
            hint = ("the probe's own file is missing at both endpoints: check its path in --probe-cmd (it runs "
                    "from the checkout's root); a test newer than the good commit must be copied outside the "
                    "repository" if at_both else
                    "the probe's own file is missing there: a test newer than the good commit must be copied "
                    "outside the repository and --probe-cmd pointed at the copy")
        else:
            hint = no_value_hint(probe_key, metric_regex, tail)
        exc = last_exception(tail)
        recent = runs[-cr.crashes:]
        if metric and recent and all(r.status == STATUS_FAILED and r.values for r in recent):
            # a test that asserts in its loop over labels stopped on an earlier label every time
            return KlbisectError(f"--metric {metric}: {where} {sha[:12]} stopped on its own assertion before "
                                 f"printing {metric} in {cr.crashes} runs (it printed "
                                 f"{', '.join(sorted({k for r in recent for k in r.values}))}): there that label "
                                 "cannot be measured; pick a label the test prints before it asserts, or leave "
                                 f"--metric out (the {over_labels(ws.worse)} over labels); log: {last.log_path if last else '?'}",
                                 EXIT_NO_SIGNAL, detail=tail)
        if other and recent and all(r.status == STATUS_FAILED and r.values for r in recent):
            # a test that asserts in its loop over labels stopped every time short of a label that
            # sets the max (min) in complete runs: the max cannot be read here, a label alone can
            printed = {k for r in recent for k in r.values}
            theirs = ws.store.runs(probe_key, [other])
            missed = missed_worse(recent[-1], typical_values(theirs, usual_labels(theirs)), ws.worse) or ["a label"]
            pair = (other, sha) if which == "bad" else (sha, other)
            cfg = BisectConfig(worse=ws.worse, metric_regex=metric_regex)
            return KlbisectError(f"{where} {sha[:12]} stopped on its own assertion in {cr.crashes} runs, each "
                                 f"after {', '.join(sorted(printed))} and short of {missed[0]}, which reads "
                                 f"{'lower' if ws.worse == 'lower' else 'higher'} in complete runs: its "
                                 f"{over_labels(ws.worse)} over labels cannot be read there"
                                 f"{label_hint(ws, probe_key, *pair, cfg)}; log: {last.log_path if last else '?'}",
                                 EXIT_NO_SIGNAL)
        if any(r.values for r in recent):
            # values, then a crash short of the labels the other runs print: said as such
            # (a run that exited 0 short of the labels did not crash: a tester's was said to)
            how = ("crashed part-way" if all(r.exit_code != 0 for r in recent) else "ended short of its labels")
            return KlbisectError(f"{where} {sha[:12]} {how} in {cr.crashes} runs: each printed some "
                                 "labels' values, then ended without an assertion before the rest (a run "
                                 "that fails its own assertion is measured); see why in the log: "
                                 f"{last.log_path if last else '?'}", EXIT_NO_SIGNAL, detail=tail)
        if exc and not missing_module and "can't open file" not in tail:
            # it crashed, and says why: a hint about unread values would mislead
            return KlbisectError(f"{where} {sha[:12]} crashed before printing a metric value in {cr.crashes} "
                                 f"runs{note}; the last ended on {exc}; log: "
                                 f"{last.log_path if last else '?'}", EXIT_NO_SIGNAL, detail=tail)
        if probe_key.startswith("sglang:") and last is not None and log_says(last.log_path, "not ready after"):
            hint += ("; its server was not ready in time: if it is only slow (a first download, a compile), "
                     "raise --launch-timeout")
        return KlbisectError(f"{where} {sha[:12]} printed no metric value in {cr.crashes} runs"
                             f"{note} ({hint}); log: "
                             f"{last.log_path if last else '?'}", EXIT_NO_SIGNAL, detail=tail)
    return None


def build_fix_hint(build_key: str | None) -> str:
    from .sglang import build_fix_hint as hint  # noqa: PLC0415 - the words depend on the builder
    return hint(build_key)


def no_value_hint(probe_key: str | None, metric_regex: str | None = None, log: str = "") -> str:
    from .sglang import no_value_hint as hint  # noqa: PLC0415 - --metric-regex is for --probe-cmd only
    return hint(probe_key, metric_regex, log)


NEVER_BUILT_LIMIT = 3  # failed builds, none ever good under this --build-cmd: the command is wrong


def disk_full(f: Failure) -> bool:
    """A failure of the disk's: no retry frees space, so the first one stops."""
    return f.errno in (errno.ENOSPC, errno.EDQUOT) or any(
        t in f.error for t in ("No space left on device", "the disk is full"))


def infrastructure_error(f: Failure) -> KlbisectError:
    """Three failures outside the probe at one commit: a full disk or a log
    folder klbisect may not write is storage (156), with what to do about it."""
    full = disk_full(f)
    denied = f.errno in (errno.EACCES, errno.EPERM, errno.EROFS) or any(
        t in f.error for t in ("Permission denied", "Read-only file system", "Operation not permitted"))
    fix = "free disk space, then " if full else "make the folder it names writable, then " if denied else ""
    times = "" if full else " 3 times"
    return KlbisectError(f"probing {f.sha[:12]} failed{times} for reasons outside the probe: {f.error}; "
                         f"finished runs are saved: {fix}rerun to resume",
                         EXIT_STORAGE if full or denied else EXIT_REPO_STATE)


def _disk_full(ws: Workspace, what: str, log_path: str | None) -> KlbisectError | None:
    """A build that failed on a full disk (its log often empty: it could not
    be written either) is the disk's failure, not the build command's."""
    if not gitrepo.nearly_full(ws.logs if ws.logs.exists() else ws.top):
        return None
    return KlbisectError(f"{what}: the disk is full (log: {log_path}); free disk space and rerun the same "
                         "command: the build is tried again and recorded runs are kept", EXIT_STORAGE)


def never_built(ws: Workspace, build_key: str | None, log_path: str | None,
                rerun: str = "rerun") -> KlbisectError | None:
    """A build command that has failed on every commit it was tried on.
    Endpoint runs reused from sessions with another --build-cmd skip the
    endpoint builds, so without this every interior commit would fail to
    build and the answer would be "one of N untestable commits"."""
    if not build_key:
        return None
    builds = ws.store.builds(build_key)
    if any(b["ok"] for b in builds) or len(builds) < NEVER_BUILT_LIMIT:
        return None
    tried = f"the build failed on all {len(builds)} commits it was tried on in this repository (any session)"
    full = _disk_full(ws, tried, log_path)
    if full:
        return full
    return KlbisectError(f"{tried} and has never "
                         f"succeeded here: {build_fix_hint(build_key)}, and {rerun}; log: {log_path}",
                         EXIT_NO_SIGNAL,
                         detail=log_tail(log_path or ""))


REBUILD_BATCH = 3   # endpoint runs a side per round when each switch of endpoint rebuilds


MOSTLY_CRASHES = 4   # crashes a value past which an endpoint's probe is broken there, not flaky


def mostly_crashes(ws: Workspace, which: str, sha: str, probe_key: str, now: CommitRuns, before: CommitRuns,
                   most: int) -> KlbisectError | None:
    """An endpoint that printed a value and crashes nearly every run since:
    its values count toward --max-endpoint-runs, its crashes did not, and a
    reviewer's spent all 2,000 of --max-total-runs there. Given up once
    this command's crashes there reach ``most`` and over MOSTLY_CRASHES
    times its values in this command (a crash rate over 80%): the same
    command, once what crashes is fixed, measures it again (a reviewer's
    rerun stopped on the old crashes before a run)."""
    crashes, values = now.crashes - before.crashes, len(now.values) - len(before.values)
    if not now.values or crashes < most or crashes < MOSTLY_CRASHES * max(values, 1):
        return None
    last = next((r for r in reversed(ws.store.runs(probe_key, [sha])) if r.status in CRASHED), None)
    log = last.log_path if last else "?"
    exc = last_exception(log_tail(log)) if last else None
    return KlbisectError(f"the {which} endpoint {sha[:12]} crashed in {crashes} of {crashes + values} runs "
                         f"of this command (a value in {values}; {len(now.values)} in all)"
                         + (f", the last with {exc}" if exc else "")
                         + f": the probe cannot measure it; fix what crashes there and rerun the same command, "
                         f"or pick another {which} commit; log: {log}", EXIT_NO_SIGNAL, detail=log_tail(log))


def calibrate_endpoints(ws: Workspace, cfg: BisectConfig, sid: int, good: str, bad: str, execute,
                        probe_key: str, build_key: str | None, progress: Progress, width: int = 1,
                        pooled: bool = True):
    """Probe both endpoints until the regression is confirmed and both sides
    are described well enough to judge other commits. Returns the model.
    ``width``: parallel slots, so each round asks for that many runs."""
    per_side = max(1, width // 2)
    before = commit_runs(ws, probe_key, build_key, [good, bad], cfg.timeout)
    limit = endpoint_crash_limit(cfg.crash_limit)

    def this_command(sha: str, now: CommitRuns) -> tuple[CommitRuns, str]:
        """An endpoint's runs as the crash checks read them. One with values from
        earlier commands but none from this one is judged on this command's runs
        alone: the environment broke, or --timeout was cut, since those values,
        and their count never grows, so the rounds would ask for more runs forever."""
        old = before[sha]
        if old.values and len(now.values) == len(old.values) and now.crashes > old.crashes:
            return (CommitRuns([], now.crashes - old.crashes, now.build_failed),
                    f" in this command (it printed {fmt_count(len(old.values), 'value')} in earlier ones: did "
                    "the environment or --timeout change?)")
        return since(now, old), ""

    def problem() -> KlbisectError | None:
        now = commit_runs(ws, probe_key, build_key, [good, bad], cfg.timeout)
        (g, g_note), (b, b_note) = this_command(good, now[good]), this_command(bad, now[bad])
        if not g.values and not b.values and min(g.crashes, b.crashes) >= (limit + 1) // 2:
            # neither endpoint has printed a value in half the limit each: the probe is
            # broken, not flaky (at a 15% crash rate this happens once in 100,000 starts)
            return endpoint_problem(ws, "good", good, probe_key, build_key, g, 1,
                                    note=f"{g_note}, nor the bad endpoint in {b.crashes}",
                                    metric_regex=cfg.metric_regex, at_both=True)
        # runs that passed silently while every run with a value failed (pytest without -s) are
        # no flaky environment: the other side's silent passes do not buy this side more runs
        silent = bool(silent_when_passing(ws, probe_key, [good, bad]))
        for which, sha, cr, note, other in (("good", good, g, g_note, b), ("bad", bad, b, b_note, g)):
            side_limit = endpoint_crash_limit(cfg.crash_limit, 0 if silent else other.crashes,
                                              other.crashes + len(other.values))
            err = endpoint_problem(ws, which, sha, probe_key, build_key, cr, side_limit, note=note,
                                   metric_regex=cfg.metric_regex, other=bad if sha == good else good) \
                or mostly_crashes(ws, which, sha, probe_key, now[sha], before[sha], max(cfg.max_endpoint_runs, side_limit))
            if err:
                # one endpoint that cannot be measured while the other can: a fact of that commit
                # (`run --all-commits` leaves a merge standing on it), not of the environment
                err.endpoint = which
                return err
        return None

    # an endpoint whose build failed in an earlier command is built once more
    # (the user may have fixed the environment, not the command)
    rebuild = [sha for sha in (good, bad) if before[sha].build_failed]
    while True:
        if rebuild:
            sha = rebuild.pop(0)
            progress(f"building the {'good' if sha == good else 'bad'} endpoint {sha[:12]} again: "
                     "its build failed in an earlier command")
            execute([sha])
            continue
        runs = commit_runs(ws, probe_key, build_key, [good, bad], cfg.timeout)
        g, b = runs[good], runs[bad]
        err = problem()
        if err:
            raise err
        step = None
        if cfg.threshold is not None:
            got = _classic_step(cfg, good, bad, g, b, progress)
        else:
            got, step = _learned_step(ws, cfg, sid, good, bad, g, b, probe_key, progress, per_side, width, pooled)
        if not isinstance(got, list):
            return got
        need = got
        # the batch fits in what is left of an endpoint's runs and of --max-total-runs (a
        # wide --parallel would otherwise ask hundreds of runs of each endpoint at once)
        room = cfg.runs_left(len(ws.store.session_runs(sid)))
        if room <= 0:
            raise OutOfRuns(f"stopped at --max-total-runs {cfg.max_total_runs} while calibrating the endpoints "
                            f"({len(g.values)}+{len(b.values)} values so far): raise it (it counts endpoint "
                            "runs too) and rerun the same command; runs are kept")
        if cfg.threshold is None:
            left = {sha: max(cfg.max_endpoint_runs - len(cr.values), 1) for sha, cr in ((good, g), (bad, b))}
            need = [s for i, s in enumerate(need) if need[:i].count(s) < left[s]]
        need = need[:room]
        so_far = ""
        if step is not None and step.separation is not None:
            # one run a side at a time can go on for a while: say where it stands
            so_far = (f"; {len(g.values)}+{len(b.values)} so far, p={step.separation.p_value:.2g}, "
                      f"at most {cfg.max_endpoint_runs} a side")
        for sha in dict.fromkeys(need):
            progress(f"calibrating {'good' if sha == good else 'bad'} endpoint {sha[:12]} "
                     f"({need.count(sha)} run{'s' if need.count(sha) > 1 else ''}{so_far})")
        # a batch stops early once an endpoint cannot be measured (a failed build, a
        # broken probe, a missing --metric): each run of a real probe costs minutes
        execute(need, lambda: problem() is not None)


def _classic_step(cfg: BisectConfig, good: str, bad: str, g: CommitRuns, b: CommitRuns, progress: Progress):
    """Endpoint calibration with --threshold and --votes: the model once the
    endpoints reproduce the failure, else the runs still wanted."""
    # the first --votes runs a side check the failure reproduces, as classic mode judges
    # a commit; at least MIN_ENDPOINT_RUNS a side then say how far a verdict can be trusted
    enough = max(cfg.votes, min(cfg.endpoint_runs, MIN_ENDPOINT_RUNS))
    if len(g.values) >= cfg.votes and len(b.values) >= cfg.votes:
        model = ThresholdModel(cfg.threshold, cfg.votes)
        vg = judge(g.values[:cfg.votes], 0, model, cfg.votes)
        vb = judge(b.values[:cfg.votes], 0, model, cfg.votes)
        if vg.decision == GOOD and vb.decision == BAD and min(len(g.values), len(b.values)) < enough:
            return [s for s, cr in ((good, g), (bad, b)) for _ in range(enough - len(cr.values))]
        elif vg.decision == GOOD and vb.decision == BAD:
            model = model.with_rates(g.values, b.values)
            up, down = model.verdict_log_lrs()
            failed = (f"good failed {int(sum(model.fails(g.values)))}/{len(g.values)} runs, bad "
                      f"{int(sum(model.fails(b.values)))}/{len(b.values)}")
            if up <= 0 or down >= 0:
                raise KlbisectError(
                    f"at threshold {cfg.threshold:g} the endpoints fail alike ({failed}): a majority "
                    "verdict would say nothing; leave --threshold and --votes out to judge runs by their "
                    "values", EXIT_NO_SIGNAL)
            progress(f"endpoints at threshold {cfg.threshold:g}: {failed}: a majority of {cfg.votes} that "
                     f"fails counts {math.exp(up):.3g}:1 for bad, one that passes {math.exp(-down):.3g}:1 "
                     "for good")
            return model
        else:
            raise KlbisectError(
                f"the endpoints do not reproduce the failure at threshold {cfg.threshold:g}: "
                f"good {fmt_vals(g.values[:cfg.votes])} ({vg.decision}), bad "
                f"{fmt_vals(b.values[:cfg.votes])} ({vb.decision}); a flaky test's bad commit passes "
                "some runs: leave --threshold and --votes out to judge runs by their values",
                EXIT_NO_SIGNAL)
    else:
        return [s for s, cr in ((good, g), (bad, b)) if len(cr.values) < cfg.votes]


def _learned_step(ws: Workspace, cfg: BisectConfig, sid: int, good: str, bad: str, g: CommitRuns, b: CommitRuns,
                  probe_key: str, progress: Progress, per_side: int, width: int, pooled: bool):
    """Endpoint calibration that learns good and bad from the runs: the model
    once they tell apart (or the reason they cannot, raised), else the runs
    still wanted; with the step that decided."""
    step = endpoint_step(g.values, b.values, cfg.endpoint_runs, cfg.max_endpoint_runs, pooled)
    sep = step.separation

    hint_of_labels = partial(label_hint, ws, probe_key, good, bad, cfg)
    finding = partial(label_finding, ws, probe_key, good, bad, cfg)
    if min(len(g.values), len(b.values)) >= cfg.endpoint_runs and all(map(broke, (*g.values, *b.values))):
        # the same at both ends, run after run: up to --max-endpoint-runs would say no more.
        # One label broken everywhere breaks the max over labels: the others may still tell.
        labelled = [r.values for r in ws.store.runs(probe_key, [good, bad]) if r.values]
        fine = sorted({k for v in labelled for k, x in v.items() if not broke(x)})
        if fine and not ws.metric:
            dead = sorted({k for v in labelled for k in v} - set(fine))
            raise NoDifference(
                f"every run at both endpoints printed nan or inf on {', '.join(dead) or 'some label'}, so "
                f"the {over_labels(ws.worse)} over labels is broken in each: rerun with --metric and one "
                f"of the labels that print numbers ({', '.join(fine)})")
        raise NoDifference(
            f"every run at both endpoints printed nan or inf ({len(g.values)}+{len(b.values)} runs, "
            f"{ws.metric or 'the ' + over_labels(ws.worse) + ' over labels'}): numerics broke at the good "
            "endpoint too, so nothing tells good from bad here; check the environment (driver, dtype, "
            "model files) with a run of the good endpoint, or pick an older --good")
    spikes = worse_tail(g.values, b.values, cfg.worse) if step.action == "ready" and goes_better(cfg, sep) \
        else 0
    if spikes and min(len(g.values), len(b.values)) < cfg.max_endpoint_runs:
        # the medians say "better", a bad run far past every good one says worse: the
        # medians' difference may be chance, and more runs tell which
        want = max(min(2 * OVERLAP_ENDPOINT_RUNS, cfg.max_endpoint_runs), min(len(g.values), len(b.values)) + 1)
        progress(f"the bad endpoint's runs sit {'higher' if sep.direction == 'up' else 'lower'} than the "
                 f"good one's (p={sep.p_value:.2g}), but {fmt_count(spikes, 'of its runs')} lie far past "
                 "every good run: measuring both further before calling it a fix")
        step = EndpointStep("more", max(want - len(g.values), 0), max(want - len(b.values), 0), sep)
    if step.action == "ready":
        check_direction(cfg, sep, finding, spikes)
        hint = hint_of_labels() if sep.p_value > SEPARATION_P else ""
        if hint:
            # the max only hints, one label is plain: a search on the max would be long, and
            # on a move that small it named a wrong commit once in 13 (a tester's)
            raise NoDifference(
                f"good and bad only hint at a difference {judged_on(ws)} (p={sep.p_value:.2g}): "
                f"good {fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}" + hint)
        silent = silent_when_passing(ws, probe_key, [good, bad])
        if silent:
            progress(f"warning: {silent}")
        same = repeated_runs(g.values, b.values)
        if same:
            progress(f"warning: {same}")
        model = Model.fit(g.values, b.values)
        # a search begun on a hint (OVERLAP_P) is no shown difference: a tester read
        # "endpoints differ" at p=0.19, and git bisect then spent 258 runs
        contact = (model.contact if sep.p_value <= SEPARATION_P else
                   f"only hint at a difference (p above {SEPARATION_P:g}), their runs overlapping")
        progress(f"endpoints {contact}: "
                 f"good {fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)} "
                 f"(p={sep.p_value:.2g}, {model.effect:.1f} spreads apart"
                 f"{'' if model.decisive else '; ' + model.regime})")
        clear = "" if model.separates else clearer_label(ws, probe_key, good, bad, cfg, sep.p_value)[1]
        if clear:
            progress(f"note: {clear}: stop (Ctrl-C) and rerun with it")
        return model, step
    if step.action == "more" and min(len(g.values), len(b.values)) >= DECISIVE_RUNS \
            and sep is not None and sep.p_value > OVERLAP_P:
        # one label plain while the max (or min) over labels shows nothing: the runs up
        # to --max-endpoint-runs would not change what to do (rerun with --metric)
        hint = hint_of_labels()
        if hint:
            # "at most 40 a side" was in the progress line: a tester read the stop at 10 as broken
            raise NoDifference(
                f"good and bad do not differ {judged_on(ws)} after {len(g.values)}+"
                f"{len(b.values)} runs (p={sep.p_value:.2g}; stopped short of --max-endpoint-runs "
                f"{cfg.max_endpoint_runs}, since one label shows what more runs would "
                f"not): good {fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}" + hint)
    if step.action == "fail":
        caveats = (spikes_note(g.values, b.values, cfg.worse) + hint_of_labels(weak=True) + unbuilt_sglang_hint(ws, cfg)
                   + "".join(f"; {n}" for n in (ended_on_errors(ws.store.runs(probe_key, [sha]), f"the {end} endpoint")
                                                for sha, end in ((good, "good"), (bad, "bad"))) if n))
        raise NoDifference(
            f"good and bad do not separate after {len(g.values)}+{len(b.values)} runs "
            f"(p={sep.p_value:.2g}): good {fmt_summary(sep.good)}, bad {fmt_summary(sep.bad)}; "
            "the regression does not reproduce at these endpoints, or needs more runs "
            "(--max-endpoint-runs)" + caveats,
            # alike: measured enough, and not even a hint apart (under --max-endpoint-runs 5 a
            # reviewer's p=0.032 the worse way also ended here)
            alike=not caveats and sep.p_value > OVERLAP_P and min(len(g.values), len(b.values)) >= DECISIVE_RUNS)
    # Spare slots measure the endpoints in parallel; alternate them so an
    # interrupted calibration leaves both sides measured alike. One slot
    # takes each endpoint's runs together: alternating there would check out
    # and rebuild the other endpoint, or relaunch its server, before every run.
    ng, nb = (max(m, per_side) if m else 0 for m in (step.more_good, step.more_bad))
    if width == 1 and (cfg.build_cmd or cfg.build or cfg.probe == "sglang"):
        # a few runs a side per round, the endpoint built last first: one rebuild per
        # round instead of two for every pair of runs
        ng, nb = (min(max(n, REBUILD_BATCH), max(cfg.max_endpoint_runs - len(cr.values), n)) if n else 0
                  for n, cr in ((ng, g), (nb, b)))
        last = [r.sha for r in ws.store.session_runs(sid) if r.sha in (good, bad)][-1:]
        return ([bad] * nb + [good] * ng if last == [bad] else [good] * ng + [bad] * nb), step
    return [sha for i in range(max(ng, nb)) for sha, n in ((good, ng), (bad, nb)) if i < n], step


def ended_on_errors(runs: list, where: str) -> str:
    """A note when every run that printed values then failed without an
    assertion of its own (a server that died mid-test): with no run that
    finished, nothing shows which labels it never reached, so their
    values are missing from its max unnoticed. "" otherwise."""
    valued = [r for r in runs if r.values and r.status in MEASURED]
    if len(valued) < 2 or any(r.exit_code == 0 or r.status == STATUS_FAILED for r in valued):
        return ""
    exc = last_exception(log_tail(valued[-1].log_path or "")) if valued[-1].log_path else None
    return (f"every run of {where} that printed values then failed without an assertion of its own"
            f"{f' (the last on {exc})' if exc else ''}: labels a run never reached are missing from its "
            f"values, and no run finished to show which; see {valued[-1].log_path}")


def unbuilt_sglang_hint(ws: Workspace, cfg: BisectConfig) -> str:
    """Endpoints alike in an SGLang checkout probed with no build: each
    commit's test most likely imported the one sglang installed (a tester
    bisected their own editable checkout, the same code at every commit)."""
    if cfg.build or cfg.build_cmd or cfg.probe == "sglang" or not (ws.top / "python" / "sglang").is_dir():
        return ""
    return ("; this is an SGLang checkout probed with no build: every commit's test may have imported the "
            "same installed sglang; add --build sglang (each probe then imports its own checkout)")


def log_says(path: str | None, text: str, limit: int = 1 << 20) -> bool:
    # the whole log, not its tail: the server's last lines (a ServerArgs line of kilobytes) follow it
    try:
        with open(path or "", "rb") as f:
            return text.encode() in f.read(limit)
    except OSError:
        return False
