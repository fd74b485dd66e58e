"""Which recorded runs count as measurements, and how a run is shown
(``klbisect.runs``): plain records, no repository."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from klbisect.runs import STATUS_CRASH, STATUS_FAILED, STATUS_OK, STATUS_TIMEOUT, run_shown, usual_labels, valued_runs
from klbisect.store import Run


def run_of(exit_code, status: str, value, **values) -> Run:
    return Run(1, 1, "cmd:x", "f" * 40, 0.0, 1.0, exit_code, status, values, value, None, None)


def test_a_timeout_and_a_crash_short_of_a_label_do_not_count_but_an_assertion_does():
    """A value printed before a timeout, or before a crash short of the
    labels complete runs print, would hide the label that moved; a test's
    own assertion after its first label over the threshold is a
    measurement (the labels it never reached could only raise its max)."""
    complete = [run_of(0, STATUS_OK, 0.005, a=0.004, b=0.005)] * 3
    timed_out = run_of(None, STATUS_TIMEOUT, 0.004, a=0.004, b=0.004)
    crashed = run_of(1, STATUS_OK, 0.004, a=0.004)
    asserted = run_of(1, STATUS_FAILED, 0.012, a=0.012)
    kept = valued_runs(complete + [timed_out, crashed, asserted], None)
    assert kept == complete + [asserted]
    assert run_shown(crashed, frozenset("ab"), None, {"a": 0.004, "b": 0.005}) == (
        "0.004 from 1 of 2 labels, then exit 1: counted as a crash", True)
    # judged on one label (--metric a), a run that printed it counts
    assert valued_runs([crashed], "a") == [crashed]
    # no value: a crash says so, a clean exit that printed none says that instead (a tester's)
    assert run_shown(run_of(3, STATUS_CRASH, None), frozenset("ab"), None) == ("no value (crash)", True)
    assert run_shown(run_of(0, STATUS_CRASH, None), frozenset("ab"), None) == ("no value (exit 0, printed none)", True)


def test_a_run_its_assertion_stopped_names_the_label_that_would_have_made_it_worse():
    """A reviewer's: the line named the first label a run missed, in
    alphabetical order, as the one that "reads lower in complete runs",
    where another had that typical value."""
    usual, typical = frozenset({"a", "b", "c"}), {"a": 0.85, "b": 0.95, "c": 0.7}

    def run(**values):
        return run_of(1, STATUS_FAILED, min(values.values()), **values)
    shown, crashed = run_shown(run(a=0.9), usual, None, typical, "lower")
    assert crashed and "short of c, which reads lower in complete runs" in shown, shown
    # only b missed, which reads higher: the run's min stands as a measurement
    assert run_shown(run(a=0.9, c=0.7), usual, None, typical, "lower") == ("0.7", False)


def test_the_labels_of_a_complete_run_are_voted_by_clean_exits():
    """A broken NCCL killed every run of a night after its first label; those
    runs outvoted three nights of complete ones. Runs that exited 0 vote
    when there are any (a run klbisect stopped, exit None, is not one);
    where none did, every run with values votes, as before."""

    def runs(labels: str, exit_code, n: int) -> list:
        return [run_of(exit_code, STATUS_OK, 0.004, **{k: 0.004 for k in labels})] * n
    assert usual_labels(runs("abc", 0, 3) + runs("a", 1, 7)) == frozenset("abc")
    assert usual_labels(runs("abc", 1, 5) + runs("a", None, 2)) == frozenset("abc")
    assert usual_labels(runs("abc", 1, 3) + runs("a", 1, 7)) == frozenset("a")


def test_a_commit_measured_before_any_model_shows_its_runs():
    """A tester's: status of a `start` killed while calibrating said "3
    probe runs" and listed both endpoints with none."""
    from klbisect.result import explain_commit
    said = explain_commit({"index": 0, "values": [0.005779, 0.005183], "verdict": "good",
                           "reason": "good endpoint"}, None)
    assert said.startswith("2 run(s) [0.005779, 0.005183], median 0.005481; no model weighs them (the endpoints' "
                           "runs have not been shown to differ)"), said


def test_a_commit_placed_by_the_integrated_search_says_its_place_decided_it():
    """A tester's overlapping history: "BAD P(bad)=1.000 / 1 run(s)
    [0.00228]", a value below the good side's median, and no word of why."""
    from klbisect.decide import Model
    from klbisect.result import explain_commit
    model = Model.fit([0.0024, 0.0025, 0.0023, 0.0026, 0.0024, 0.0025], [0.0029, 0.0030, 0.0028, 0.0031, 0.0029, 0.003])
    entry = {"index": 96, "values": [0.00228], "verdict": "bad", "reason": "", "p_bad": 0.9999, "integrated": True}
    said = explain_commit(entry, model)
    assert said.startswith("1 run(s) [0.00228], median 0.00228; verdict bad from where it sits, not from its own "
                           "runs alone: P(bad) = 1.000"), said
    # one judged on its own runs keeps the verdict it was given, and no such line
    assert "from where it sits" not in explain_commit({**entry, "reason": "3 runs, 40:1"}, model)
    # status says it once in a list, then points back to it (a tester read it under eleven commits);
    # the JSON keeps each commit's whole
    from klbisect.result import said_once
    whole = [explain_commit({**entry, "index": i}, model) for i in (96, 97)]
    first, second = said_once(whole)
    assert first == whole[0] and "weighs every commit's runs" in whole[1]
    assert second.endswith("from where it sits, not from its own runs alone (as above)"), second


def test_a_commit_beside_the_answer_with_many_runs_says_what_its_runs_alone_give():
    """A reviewer's: the two commits beside an overlapping answer held 236
    runs between them, and each read "from where it sits ... a commit's few
    runs say little alone". Their runs alone, against the runs of the
    commits placed on either side, decide them, and status says so."""
    from klbisect.decide import Model
    from klbisect.result import _own_evidence, explain_commit
    rng = np.random.default_rng(5)

    def entry(i, verdict, median, n):
        return {"index": i, "values": list(rng.lognormal(np.log(median), 0.26, n)), "verdict": verdict,
                "reason": "", "p_bad": 0.0 if verdict == "good" else 1.0, "integrated": True}
    commits = [entry(0, "good", 0.0025, 40), entry(4, "good", 0.0025, 8), entry(20, "good", 0.0025, 112),
               entry(21, "bad", 0.0031, 124), entry(30, "bad", 0.0031, 8), entry(39, "bad", 0.0031, 40)]
    _own_evidence(commits, 39)
    assert "own_log_lr" not in commits[0] and "own_log_lr" not in commits[-1]
    model = Model.fit(commits[0]["values"], commits[-1]["values"])
    beside = [explain_commit(c, model) for c in commits[2:4]]
    for said, side in zip(beside, ("good", "bad")):
        assert "its runs alone, against the runs of the commits placed good and of those placed bad (rank test): " \
            in said, said
        assert f":1 for {side}" in said and "from where it sits" not in said, said
    # a commit with a few runs that say little keeps the line about where it sits
    few = entry(10, "good", 0.0028, 2)
    _own_evidence([*commits, few], 39)
    assert "from where it sits" in explain_commit(few, model), explain_commit(few, model)


def test_the_pure_core_loads_no_git_process_or_network_module():
    """The statistics and the search are tested with plain numbers; runs.py
    once took its status names from probe.py and so loaded subprocess and
    psutil with them (a reviewer's)."""
    core = ("decide", "search", "simulate", "runs", "metric")
    shell = ("subprocess", "psutil", "git", "socket", "requests", "sqlite3", "klbisect.probe", "klbisect.proc")
    code = (f"import sys\nfor m in {core!r}: __import__('klbisect.' + m)\n"
            f"print(','.join(m for m in {shell!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "", loaded
