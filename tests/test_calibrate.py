"""`klbisect calibrate` end to end: a generated repository, its real probe,
the run store; what a maintainer reads before choosing a threshold."""
from __future__ import annotations

import json
import re
import subprocess

import numpy as np

from conftest import (HIDDEN_LABEL_PROBE, OVER_DRIVER, PY, SEPARATED, calibrate_wrapped, db_query, error_line, klb,
                      probe_cmd)
from klbisect.histgen import NoiseModel
from klbisect.calibrate import (MAX_LABEL, Calibration, format_calibration, label_stats, raise_to_labels,
                                runs_for_bound)
from klbisect.decide import recommend_threshold
from klbisect.metric import NONFINITE


def test_calibrate_reports_labels_thresholds_and_bisect_cost(history):
    h = history(n_commits=40, seed=8)
    p = klb("calibrate", "--rev", h.good, "--runs", "8", "--bad-rev", h.bad, "--commits", "200",
            "--thresholds", "0.005,0.01", "--probe-cmd", probe_cmd(), "--json", cwd=h.path)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["sha"] == h.good and res["bad_sha"] == h.bad and res["runs"] == 8
    # per label: percentiles in order, and exceedance counts with an upper bound on the rate
    moving = next(ls for ls in res["labels"] if ls["label"] == "prefill_cache_hit")
    s = moving["summary"]
    assert s["n"] == 8 and s["min"] <= s["p25"] <= s["median"] <= s["p75"] <= s["max"]
    above_01 = next(e for e in moving["exceedances"] if e["threshold"] == 0.01)
    assert above_01["runs"] == 8 and above_01["above"] == 0       # good runs sit in 0.003-0.006
    assert 0 < above_01["rate_upper_bound"] < 1
    bad_moving = next(ls for ls in res["bad_labels"] if ls["label"] == "prefill_cache_hit")
    assert bad_moving["summary"]["min"] > s["max"]                     # the moving label separates
    # a bad commit gets no threshold of its own: how often it fails the good commit's
    catch = bad_moving["catch"]
    assert bad_moving["recommended"] is None and catch["threshold"] == moving["recommended"]
    bad_values = [json.loads(r["vals"])["prefill_cache_hit"]
                  for r in db_query(h.path, "SELECT vals FROM runs WHERE sha = ?", (h.bad,))]
    assert catch["runs"] == 8 == len(bad_values)
    assert catch["above"] == sum(v >= catch["threshold"] for v in bad_values)
    assert 0 <= catch["rate_lower_bound"] <= catch["above"] / 8
    # the test fails when any label fails: the last row is the max over labels, the value a bisect judges
    whole = res["labels"][-1]
    assert whole["label"] == "(max over labels)" and len(res["labels"]) > 2
    runs = [json.loads(r["vals"]) for r in db_query(h.path, "SELECT vals FROM runs WHERE sha = ?", (h.good,))]
    assert whole["summary"]["max"] == max(max(v.values()) for v in runs)
    assert whole["recommended"] >= whole["summary"]["max"] >= max(ls["summary"]["max"] for ls in res["labels"][:-1])
    # 30 good runs (22 more, the 8 reused) narrow it: one CI run catches the regression often
    # (19-29 times in 30 over ten tries; a third is asked)
    more = klb("calibrate", "--rev", h.good, "--runs", "30", "--bad-rev", h.bad, "--commits", "200",
               "--probe-cmd", probe_cmd(), cwd=h.path)
    assert more.returncode == 0, more.stderr
    bad_part = more.stdout.split("Bad commit")[1]
    assert "recommended threshold for" not in bad_part
    line = next(ln for ln in bad_part.split("[prefill_cache_hit]")[1].splitlines() if "fails this label's" in ln)
    k = int(line.split(" in ")[1].split("/")[0])
    assert k >= 10 and "/30 runs (true rate >= 0." in line and "how often one CI run catches" not in line
    # the whole test's catch rate: the max's row, at the test's one threshold (a tester read a label's as it)
    whole = next(ln for ln in bad_part.split("[(max over labels)]")[1].splitlines() if "fails the recommended" in ln)
    assert "how often one CI run catches this regression" in whole, whole
    # without --thresholds, the bad commit's runs are counted at the good commit's lines, row by row
    same = json.loads(klb("calibrate", "--rev", h.good, "--runs", "30", "--bad-rev", h.bad, "--commits", "200",
                          "--probe-cmd", probe_cmd(), "--json", cwd=h.path).stdout)
    lines = {ls["label"]: [e["threshold"] for e in ls["exceedances"]] for ls in same["labels"]}
    for ls in same["bad_labels"]:
        assert [e["threshold"] for e in ls["exceedances"]] == lines[ls["label"]] != []
    # the cost of a bisect replays the real search on resampled runs
    cost = res["cost"]
    assert cost["commits"] == 200 and cost["simulated_accuracy"] >= 0.9
    assert cost["lower_bound_runs"] < cost["simulated_mean_runs"] < 60


def test_calibrate_resumes_from_the_run_store(history):
    h = history(n_commits=30, seed=9)
    first = klb("calibrate", "--rev", h.good, "--runs", "4", "--probe-cmd", probe_cmd(), cwd=h.path)
    assert first.returncode == 0, first.stderr
    assert "runs at or above" in first.stdout
    assert "no threshold recommended: too few runs (4)" in first.stdout   # not the sample maximum
    assert len(db_query(h.path, "SELECT * FROM runs")) == 4
    again = klb("calibrate", "--rev", h.good, "--runs", "6", "--probe-cmd", probe_cmd(), cwd=h.path)
    assert again.returncode == 0, again.stderr
    assert len(db_query(h.path, "SELECT * FROM runs")) == 6          # two new runs, four reused
    # said, not silent: a calibration that reuses every run reads as if it had measured
    assert f"{h.good[:12]}: reusing 4 of the 4 runs with a value recorded earlier" in again.stderr, again.stderr
    assert "reusing" not in first.stderr
    assert "6 runs with values" in again.stdout
    assert "log-normal tail fit" in again.stdout                       # beyond six runs' reach
    # status shows the latest calibration, not an empty bisect
    st = klb("status", cwd=h.path)
    assert st.returncode == 0, st.stderr
    assert "(calibrate, done)" in st.stdout and "2 probe runs (+4 recorded earlier at this commit)" in st.stdout and "candidate" not in st.stdout
    assert "6 runs with values" in st.stdout and "runs at or above" in st.stdout
    # a later session's runs at the commit are not the earlier calibration's (a tester's "+36 reused")
    sid = re.search(r"Session (\d+)", st.stdout).group(1)
    assert klb("calibrate", "--rev", h.good, "--runs", "9", "--probe-cmd", probe_cmd(), cwd=h.path).returncode == 0
    assert "2 probe runs (+4 recorded earlier at this commit)" in klb("status", "--session", sid, cwd=h.path).stdout
    # a calibration that counts 3 of the 9 runs there: status and log say those 3 (a tester's said
    # "+44 reused" and listed 44 runs beside a table of 3)
    assert klb("calibrate", "--rev", h.good, "--runs", "3", "--probe-cmd", probe_cmd(), cwd=h.path).returncode == 0
    assert "0 probe runs (+3 recorded earlier at this commit)" in klb("status", cwd=h.path).stdout
    three = json.loads(klb("log", "--json", cwd=h.path).stdout)
    assert len(three) == 3 and all(r["counted"] for r in three), three
    # its runs name their commit's subject, as a bisect's do
    subject = subprocess.run(["git", "log", "-1", "--format=%s", h.good], cwd=h.path, capture_output=True,
                             text=True).stdout.strip()
    logged = json.loads(klb("log", "--json", cwd=h.path).stdout)
    assert subject and {r["subject"] for r in logged} == {subject}, logged


def test_status_shows_the_run_that_resumed_an_older_session_not_a_calibration_before_it(history):
    """status shows the session last worked on: a `run` that resumed its
    session after a calibration began is the one a user just watched (it
    showed the calibration, a tester's)."""
    h = history(n_commits=30, seed=9, noise=SEPARATED)
    args = ("run", "--good", h.good, "--bad", h.bad, "--probe-cmd", probe_cmd())
    assert klb(*args, "--max-total-runs", "14", cwd=h.path).returncode == 157
    assert klb("calibrate", "--rev", h.good, "--runs", "3", "--probe-cmd", probe_cmd(), cwd=h.path).returncode == 0
    assert "(calibrate, done)" in klb("status", cwd=h.path).stdout
    resumed = klb(*args, cwd=h.path)
    assert resumed.returncode == 0 and "resuming session 1" in resumed.stderr, resumed.stderr
    st = klb("status", cwd=h.path).stdout
    assert st.startswith("Session 1 (run, done)") and h.culprit in st, st


def test_calibrate_unknown_revision_is_one_clear_line(history):
    h = history(n_commits=20, seed=10)
    p = klb("calibrate", "--rev", "no-such-rev", "--probe-cmd", probe_cmd(), cwd=h.path)
    line = error_line(p, 151)                                        # EXIT_REVISION
    assert "no-such-rev" in line


def test_calibrate_bad_options_are_refused_before_any_run(history):
    """A rate or size out of range used to surface as an internal error after
    every probe run had been spent; now it is one line, before the first."""
    h = history(n_commits=20, seed=11)
    for opts, words in ((["--runs", "0"], "--runs 0"),
                        # a typo's count: it probed until Ctrl-C (a tester's)
                        (["--runs", "99999999999999999999"], "from 1 to 1,000,000"),
                        (["--false-fail-rate", "2"], "--false-fail-rate 2"),
                        (["--confidence", "1.5"], "--confidence 1.5"),
                        (["--bad-rev", h.bad, "--commits", "1"], "--commits 1"),
                        # both commits were run, then 154 with no report: a bisect's cost needs 2 a side
                        (["--bad-rev", h.bad, "--runs", "1"], "--runs 1 with --bad-rev"),
                        (["--thresholds", "0.01,-1,0"], "--thresholds -1,0")):
        p = klb("calibrate", "--rev", h.good, "--runs", "3", *opts, "--probe-cmd", probe_cmd(), cwd=h.path)
        assert words in error_line(p, 150)                             # EXIT_USAGE
    p = klb("calibrate", "--rev", h.bad, "--bad-rev", "HEAD", "--runs", "3", "--probe-cmd", probe_cmd(), cwd=h.path)
    assert "same commit" in error_line(p, 151)                         # EXIT_REVISION
    assert db_query(h.path, "SELECT * FROM runs") == []


def test_a_failed_calibration_does_not_hide_the_bisect_from_status(history):
    h = history(n_commits=30, seed=12)
    run = klb("run", "--good", h.good, "--bad", h.bad, "--probe-cmd", probe_cmd(), "--json", cwd=h.path)
    assert run.returncode == 0, run.stderr
    p = klb("calibrate", "--rev", h.good, "--runs", "3", "--probe-cmd", "no-such-probe-xyz", cwd=h.path)
    error_line(p, 155)                                                 # EXIT_PROBE_MISSING
    st = klb("status", "--json", cwd=h.path)
    assert st.returncode == 0, st.stderr
    assert json.loads(st.stdout)["kind"] == "run" and json.loads(st.stdout)["culprit"] == h.culprit
    assert "(run, done)" in klb("status", cwd=h.path).stdout


def test_status_of_a_calibration_that_stopped_says_why_and_how_to_go_on(history):
    """A tester's failed and Ctrl-C'd calibrations both read "(calibrate,
    ended): rev X, 6 probe runs", nothing more. They say what stopped them
    and that the same command resumes; `log` does not call a run that
    exited 0 without a value "exit=0 crash"."""
    h = history(n_commits=10, seed=12)
    p = klb("calibrate", "--rev", h.good, "--runs", "3", "--probe-cmd", "echo hello", cwd=h.path)
    line = error_line(p, 154)
    st = klb("status", "--session", "1", cwd=h.path)
    assert st.returncode == 0, st.stderr
    head = st.stdout.splitlines()[0]
    assert head.startswith("Session 1 (calibrate, ended; stopped: ") and line.split(": ", 2)[-1][:40] in head, head
    logged = klb("log", "--session", "1", cwd=h.path).stdout
    assert "no value printed" in logged and "exit=0 crash" not in logged, logged


def test_calibrate_of_swapped_revisions_says_so_and_metric_picks_one_label(history):
    """The better commit given as --bad-rev: a bisect would stop with 154,
    so the cost is not offered as if it were a regression. --metric shows
    the label a bisect would judge, not every one."""
    h = history(n_commits=40, seed=8)
    p = klb("calibrate", "--rev", h.bad, "--runs", "8", "--bad-rev", h.good, "--commits", "200",
            "--metric", "prefill_cache_hit", "--probe-cmd", probe_cmd(), cwd=h.path)
    assert p.returncode == 0, p.stderr
    assert "Note: the bad rev's runs are LOWER than --rev's" in p.stdout and "stops on this range with 154" in p.stdout
    assert "--worse" not in p.stdout                # calibrate has no such option: the note named one
    assert "[prefill_cache_hit]" in p.stdout and "[logprobs_match]" not in p.stdout
    assert "(max over labels)" not in p.stdout
    # the separated runs are worth a full bit: the bound is Fano's at one bit, not the search's capped weight
    assert "never overlap: a run is worth up to 1 bit" in p.stdout
    res = json.loads(klb("calibrate", "--rev", h.bad, "--runs", "8", "--bad-rev", h.good, "--commits", "200",
                         "--metric", "prefill_cache_hit", "--probe-cmd", probe_cmd(), "--json", cwd=h.path).stdout)
    assert res["cost"]["bits_per_run"] == 1.0 and res["cost"]["model_bits"] < 1.0 and res["cost"]["disjoint"]
    crashed = db_query(h.path, "SELECT COUNT(*) AS n FROM runs WHERE sha = ? AND value IS NULL", (h.good,))[0]["n"]
    assert res["bad_crashes"] == crashed


CUT_SHORT = '''import os, random, sys
rng = random.Random(os.urandom(8))
labels = ("logprobs_match", "prefill_cache_hit", "decode_cache_hit")
n = sys.argv[1]
k = sum(1 for _ in open(n)) if os.path.exists(n) else 0
open(n, "a").write("run\\n")
for i, lab in enumerate(labels):
    print(f"[{lab}]")
    print(f"avg_kl_div={0.001 if i == 0 else rng.uniform(0.004, 0.006):.6g}")
    if k % 3 == 1:
        sys.exit("CUDA error: an illegal memory access was encountered")   # after the first label
'''


def test_calibrate_counts_a_run_cut_off_short_of_its_labels_as_a_crash(history, tmp_path):
    """A run that died after its first label printed that label's (low)
    value: counted, it drew the max row's minimum from one label and
    understated the false-failure rate calibrate exists to measure."""
    res = json.loads(calibrate_wrapped(history(n_commits=6, seed=4, merges=0), tmp_path, CUT_SHORT, 6).stdout)
    assert res["runs"] == 6 and res["crashes"] >= 2
    # every label and the max over them from the same six whole runs
    assert {ls["summary"]["n"] for ls in res["labels"]} == {6}
    whole = res["labels"][-1]
    assert whole["label"] == "(max over labels)" and whole["summary"]["min"] >= 0.004


def test_a_first_calibration_cut_short_is_listed_by_log_and_named_by_status(history, driver_probe):
    """A tester's: right after the repository's first `calibrate` was
    interrupted, `log` and `status` said "no klbisect session", with its
    runs in the store."""
    from conftest import interrupted
    h = history(n_commits=10, seed=13)
    args = ("calibrate", "--rev", h.good, "--runs", "8", "--probe-cmd", driver_probe)
    first, _ = interrupted(*args, cwd=h.path, env={"KL_DRIVER_SLEEP": "1.0"}, after=2)
    assert first.returncode == 130
    kept = len(db_query(h.path, "SELECT id FROM runs"))
    rows = json.loads(klb("log", "--json", cwd=h.path).stdout)
    assert len(rows) == kept and {r["sha"] for r in rows} == {h.good}, rows
    st = klb("status", cwd=h.path)      # the session, and why it stopped (it said 150, "no session")
    assert st.returncode == 0, st.stderr
    assert st.stdout.startswith("Session 1 (calibrate, ended; stopped: interrupted; rerun the same `klbisect "
                                "calibrate` command to resume"), st.stdout
    # one finished, then another Ctrl-C'd: `log` lists the runs just made (a reviewer's listed the older)
    done = klb("calibrate", "--rev", h.bad, "--runs", "2", "--probe-cmd", driver_probe, cwd=h.path)
    assert done.returncode == 0, done.stderr
    second, _ = interrupted(*args[:2], h.shas[3], *args[3:], cwd=h.path, env={"KL_DRIVER_SLEEP": "1.0"},
                            after=kept + 2 + 1)
    assert second.returncode == 130
    rows = json.loads(klb("log", "--json", cwd=h.path).stdout)
    assert {r["sha"] for r in rows} == {h.shas[3]}, rows


def test_a_stopped_calibration_counts_the_earlier_runs_its_resume_reuses(history, driver_probe):
    """A tester's Ctrl-C'd `--runs 3` at a commit with 8 earlier runs said
    "+8 recorded earlier" and listed all 8, where the resume reused 3."""
    from conftest import interrupted
    h = history(n_commits=10, seed=14)
    assert klb("calibrate", "--rev", h.good, "--runs", "6", "--probe-cmd", driver_probe, cwd=h.path).returncode == 0
    stopped, _ = interrupted("calibrate", "--rev", h.good, "--bad-rev", h.bad, "--runs", "3", "--probe-cmd",
                             driver_probe, cwd=h.path, env={"KL_DRIVER_SLEEP": "1.0"}, after=7)
    assert stopped.returncode == 130
    st = klb("status", "--session", "2", cwd=h.path).stdout
    assert "Session 2 (calibrate, ended; stopped: interrupted" in st and "(+3 recorded earlier at these commits)" in st, st
    logged = json.loads(klb("log", "--session", "2", "--json", cwd=h.path).stdout)
    assert len([r for r in logged if r["sha"] == h.good]) == 3, logged


def test_calibrate_fresh_counts_only_the_new_environment_and_resumes_when_interrupted(history, driver_probe):
    """After a new driver, the old runs would blur the threshold: --fresh
    leaves them out, and Ctrl-C loses none of the new ones."""
    from conftest import interrupted
    h = history(n_commits=20, seed=13)
    old = klb("calibrate", "--rev", h.good, "--runs", "5", "--probe-cmd", driver_probe, "--json", cwd=h.path)
    assert old.returncode == 0, old.stderr
    old_max = json.loads(old.stdout)["labels"][-1]["summary"]["max"]
    new_driver = {"KL_DRIVER_SCALE": "10"}               # every value ten times the old ones
    # a second per run: the Ctrl-C below lands with four runs still to go, however loaded the machine
    slow = {**new_driver, "KL_DRIVER_SLEEP": "1.0"}
    args = ("calibrate", "--rev", h.good, "--runs", "6", "--probe-cmd", driver_probe, "--fresh", "--json")
    first, err = interrupted(*args, cwd=h.path, env=slow, after=7)
    assert first.returncode == 130 and "Traceback" not in err, err
    done_before = len(db_query(h.path, "SELECT id FROM runs")) - 5
    # status still shows the finished calibration, saying first that this one was cut short
    st = klb("status", cwd=h.path).stdout
    assert st.startswith(f"(A later calibrate of {h.good[:12]}, session 2, stopped after {done_before} runs of its "
                         "own (--runs 6), before its report; the same command resumes it. Shown below: session 1.)"), st
    # the runs --fresh leaves out are not its own (a reviewer's said "+5 recorded earlier")
    own = klb("status", "--session", "2", cwd=h.path).stdout.splitlines()[0]
    assert own.endswith(f"{done_before} probe runs"), own
    again = klb(*args, cwd=h.path, env=new_driver)
    assert again.returncode == 0, again.stderr
    assert "--fresh: leaving out the 5 runs" in again.stderr and "resuming the interrupted --fresh" in again.stderr
    res = json.loads(again.stdout)
    assert res["runs"] == 6 and res["labels"][-1]["summary"]["min"] > old_max
    assert len(db_query(h.path, "SELECT id FROM runs")) == 5 + 6     # the interrupted runs were kept
    assert done_before >= 2
    # finished, the next --fresh calibration starts anew; without --fresh every run counts
    anew = klb(*args, cwd=h.path, env=new_driver)
    assert "leaving out the 11 runs" in anew.stderr and json.loads(anew.stdout)["runs"] == 6
    every = json.loads(klb("calibrate", "--rev", h.good, "--runs", "30", "--probe-cmd", driver_probe, "--json",
                           cwd=h.path, env=new_driver).stdout)
    assert every["labels"][-1]["summary"]["min"] <= old_max


# ---- the recommended threshold, on plain numbers -------------------------------------------------

def recommendation(labels: list, label: str, runs: int, confidence: float = 0.95) -> list[str]:
    text = format_calibration(Calibration("HEAD", "0" * 40, runs, 0, labels, 0.01, confidence))
    block = text.split(f"[{label}]")[1].splitlines()
    return [ln.strip() for ln in block if "recommended threshold" in ln or "needs at least" in ln]


def test_runs_for_bound_is_the_order_statistic_count():
    assert runs_for_bound(0.01, 0.99) == 459 and runs_for_bound(0.01, 0.95) == 299
    for rate, conf in ((0.01, 0.99), (0.05, 0.95), (0.001, 0.9), (0.5, 0.5)):
        n = runs_for_bound(rate, conf)
        assert 1 - (1 - rate) ** n >= conf > 1 - (1 - rate) ** (n - 1)
    # it is where the recommendation turns from a tail fit into an order statistic
    vals = list(np.linspace(0.001, 0.002, 299))
    assert "order statistic" in recommend_threshold(vals, 0.01, 0.95)[1]
    assert "log-normal" in recommend_threshold(vals[:298], 0.01, 0.95)[1]


def test_raise_to_labels():
    assert raise_to_labels(0.0071, {"a": 0.0084, "b": 0.005}) == (0.0084, "a")
    assert raise_to_labels(0.009, {"a": 0.0084, "b": None}) == (0.009, None)
    assert raise_to_labels(None, {"a": 0.003}) == (0.003, "a")
    assert raise_to_labels(None, {"a": None}) == (None, None)


def test_no_label_is_recommended_a_threshold_above_the_max_rows():
    """The tester's 0.0084 for a label against 0.0071 for the max: each row
    had its own estimate, and a log-normal fit to the max of a wide label
    and a narrow higher one misses the wide one's tail (its threshold
    failed the whole test about 9% of the time, not 1%)."""
    rng = np.random.default_rng(5)
    wide, narrow = rng.lognormal(np.log(0.002), 0.8, 30), rng.lognormal(np.log(0.004), 0.1, 30)
    runs = [{"a": float(a), "b": float(b)} for a, b in zip(wide, narrow)]
    own, _ = recommend_threshold([max(d.values()) for d in runs], 0.01, 0.95)
    stats = {ls.label: ls for ls in label_stats(runs, None, 0.01, 0.95)}
    assert own < stats["a"].recommended                               # the defect, left alone
    whole = stats.pop(MAX_LABEL)
    assert whole.recommended == stats["a"].recommended > stats["b"].recommended
    assert whole.recommended_how.startswith("[a]'s: the max fails whenever [a] does")
    # a nan in [a] fails the max too: at 300 runs, neither can bound 0.01 with it, and the max
    # is not raised to [b]'s order statistic, which would claim a bound the max lacks
    a, b = rng.lognormal(np.log(0.002), 0.3, 300), rng.lognormal(np.log(0.003), 0.1, 300)
    runs = [{"a": float(x), "b": float(y)} for x, y in zip(a, b)]
    runs[0] = {"a": NONFINITE, "b": 0.01}
    stats = {ls.label: ls for ls in label_stats(runs, None, 0.01, 0.95)}
    whole = stats.pop(MAX_LABEL)
    assert stats["b"].recommended >= 0.01 and stats["a"].recommended is None and whole.recommended is None
    assert whole.recommended_how.startswith("1 of 300 runs printed nan or inf, which fail any threshold: their share")


def test_the_recommendation_says_what_bound_it_carries():
    """30 runs of a heavy-tailed probe that drew no outlier: the tail fit's
    threshold read as one "for <= 0.01 false failures" while its true rate
    was about 3%. It is now an estimate beside what the runs alone bound,
    with the runs a distribution-free bound would need."""
    rng = np.random.default_rng(2)
    runs = [{"kl": float(v)} for v in rng.lognormal(np.log(0.002), 0.25, 30)]
    fit, = label_stats(runs, None, 0.01, 0.95)
    first, second = recommendation([fit], "kl", 30)
    assert "for 0.01 false failures, a bound only if the tail is log-normal: " in first and "<= 0.01 false" not in first
    assert "(log-normal tail fit, its 95% upper confidence value" in first
    assert "); 0/30 runs at or above it, so true rate <= 0.095" in first
    # and the fit's own estimate of the level beside it, lower (a tester took the bound for the level)
    point = float(re.search(r"the fit's own estimate of the level is ([0-9.e-]+)", first).group(1))
    assert point < fit.recommended
    assert second == "a bound at 0.01 from the runs alone (95% confidence, any distribution) needs at least 299 runs " \
                     "(--runs 299)"
    fit99, = label_stats(runs, None, 0.01, 0.99)
    assert "needs at least 459 runs" in recommendation([fit99], "kl", 30, 0.99)[1]
    # enough runs: the threshold is an order statistic and its line states the bound
    runs = [{"kl": float(v)} for v in rng.lognormal(np.log(0.002), 0.25, 300)]
    line, = recommendation(label_stats(runs, None, 0.01, 0.95), "kl", 300)
    assert "for <= 0.01 false failures" in line and "any distribution; order statistic 300 of 300 runs)" in line
    # too few runs for any threshold: how many would do
    few, = label_stats(runs[:4], None, 0.01, 0.95)
    assert "no threshold recommended: too few runs (4); a bound at 0.01 from the runs alone" in \
        format_calibration(Calibration("HEAD", "0" * 40, 4, 0, [few], 0.01, 0.95))
    # a calibration stored before the bound was kept still shows (status reads it back)
    old = {k: v for k, v in fit.__dict__.items() if k != "recommended_bound"}
    stored = Calibration.from_json({**Calibration("HEAD", "0" * 40, 30, 0, [fit], 0.01, 0.95).to_json(),
                                    "labels": [old]})
    assert "recommended threshold for <= 0.01 false failures" in format_calibration(stored)


def test_runs_that_all_die_after_their_first_label_are_noted(history):
    """A server that dies mid-test in every run (a tester's): each run printed
    its first label and ended on a ConnectionError, so no run shows that two
    labels were never measured. calibrate says so instead of a quiet table."""
    h = history(n_commits=10, seed=3, noise=SEPARATED)
    dies = ("echo '[logprobs_match]'; echo avg_kl_div=0.004; "
            "echo 'requests.exceptions.ConnectionError: Remote end closed connection' >&2; exit 1")
    p = klb("calibrate", "--rev", h.good, "--runs", "3", "--probe-cmd", dies, cwd=h.path)
    assert p.returncode == 0, p.stderr
    assert "Note: every run of" in p.stdout and "the last on requests.exceptions.ConnectionError" in p.stdout, \
        p.stdout
    # runs that finish (exit 0) with the same one label are a one-label test: nothing to say
    p = klb("calibrate", "--rev", h.good, "--runs", "3", "--probe-cmd", "echo '[only]'; echo avg_kl_div=0.004",
            cwd=h.path)
    assert p.returncode == 0 and "Note: every run" not in p.stdout, p.stdout


CRASHES_FIRST = '''import os, random, sys
n = sys.argv[1]
k = sum(1 for _ in open(n)) if os.path.exists(n) else 0
open(n, "a").write("run\\n")
if k < int(sys.argv[2]):
    sys.exit("RuntimeError: server died")          # (no traceback: error_line looks for one)
print("[kl]")
print(f"avg_kl_div={random.uniform(0.004, 0.006):.6g}")
'''


def test_calibrate_is_as_patient_with_crashes_as_run_and_counts_them_beside_its_values(history, tmp_path):
    """Two crashes in a row before any value ended a calibration with 154
    (a probe crashing 30% of its runs lost 9% of them), calling the commit
    an endpoint; and the header counted every crash ever recorded beside
    the last N values."""
    h = history(n_commits=6, seed=4, merges=0)
    probe = tmp_path / "crashes_first.py"
    probe.write_text(CRASHES_FIRST)
    cmd = f"{PY} {probe} {tmp_path / 'n'} 3"
    p = klb("calibrate", "--rev", h.good, "--runs", "3", "--probe-cmd", cmd, cwd=h.path)
    assert p.returncode == 0, p.stderr
    assert "3 runs with values, 3 without" in p.stdout
    # the last two values came after the crashes: none of them in the header
    p = klb("calibrate", "--rev", h.good, "--runs", "2", "--probe-cmd", cmd, cwd=h.path)
    assert p.returncode == 0 and "2 runs with values, 0 without" in p.stdout, p.stdout
    # status and log show the runs the header counts (a tester's left out its crashes)
    p = klb("calibrate", "--rev", h.good, "--runs", "3", "--probe-cmd", cmd, cwd=h.path)
    assert p.returncode == 0 and "3 runs with values, 3 without" in p.stdout, p.stdout
    assert "0 probe runs (+6 recorded earlier at this commit)" in klb("status", cwd=h.path).stdout
    assert len(json.loads(klb("log", "--json", cwd=h.path).stdout)) == 6
    # a commit that never prints a value is given up as `run` gives up an endpoint, and named as what it is
    p = klb("calibrate", "--rev", h.bad, "--runs", "3", "--probe-cmd", f"{PY} {probe} {tmp_path / 'm'} 99",
            cwd=h.path)
    line = error_line(p, 154)                                          # EXIT_NO_SIGNAL
    assert f"the calibrated commit {h.bad[:12]} crashed before printing a metric value in 6 runs" in line, line
    assert "endpoint" not in line


def test_calibrate_progress_counts_a_run_that_timed_out_as_a_crash(history):
    """A run that printed a value and then hung past --timeout is a crash
    (its later labels are missing): calibrate's progress said "0.0037 (1/2
    values)" for each, then stopped with "no value" (a tester's)."""
    h = history(n_commits=10, seed=35)
    hang = f"{PY} -c \"import time; print('avg_kl_div=0.0037', flush=True); time.sleep(30)\""
    p = klb("calibrate", "--rev", h.good, "--runs", "2", "--timeout", "2", "--probe-cmd", hang, cwd=h.path)
    error_line(p, 154)
    assert "then timed out: counted as a crash (0/2 values)" in p.stderr, p.stderr
    assert "(1/2 values)" not in p.stderr


def test_status_shows_an_earlier_session_asked_for(history):
    """`log` and `report` took --session, `status` did not (a tester's)."""
    h = history(n_commits=20, seed=12, noise=SEPARATED)
    assert klb("run", "--good", h.good, "--bad", h.bad, "--probe-cmd", probe_cmd(), cwd=h.path).returncode == 0
    assert klb("calibrate", "--rev", h.good, "--runs", "2", "--probe-cmd", probe_cmd(), cwd=h.path).returncode == 0
    assert klb("status", cwd=h.path).stdout.startswith("Session 2 (calibrate")
    first = klb("status", "--session", "1", cwd=h.path)
    assert first.returncode == 0 and first.stdout.startswith("Session 1 (run"), first.stdout
    assert "no klbisect session 9" in error_line(klb("status", "--session", "9", cwd=h.path), 150)
    # while a command works on the repository, only the session it works on is "running"
    from klbisect.workspace import Workspace  # noqa: PLC0415
    ws = Workspace(h.path)
    try:
        with ws.locked():
            assert json.loads(klb("status", "--json", cwd=h.path).stdout)["running"] is True
            assert json.loads(klb("status", "--session", "1", "--json", cwd=h.path).stdout)["running"] is False
    finally:
        ws.close()


def test_calibrate_of_an_accuracy_counts_runs_at_or_below(history):
    """An accuracy fails low: calibrate had no --worse, counted runs at or
    above thresholds, recommended one above every good run, and called the
    bad commit's lower accuracy a swap (a reviewer's)."""
    h = history(n_commits=30, seed=8, noise=NoiseModel(good=(0.012, 0.014), bad=(0.003, 0.004)))
    args = ("calibrate", "--rev", h.good, "--runs", "12", "--bad-rev", h.bad, "--commits", "100", "--probe-cmd",
            probe_cmd(), "--worse", "lower", "--json")
    p = klb(*args, cwd=h.path)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    assert res["worse"] == "lower" and not any("swapped" in n for n in res["notes"]), res["notes"]
    runs = [json.loads(r["vals"]) for r in db_query(h.path, "SELECT vals FROM runs WHERE sha = ?", (h.good,))]
    moving = next(ls for ls in res["labels"] if ls["label"] == "prefill_cache_hit")
    assert moving["summary"]["min"] == min(v["prefill_cache_hit"] for v in runs)
    for e in moving["exceedances"]:
        assert e["above"] == sum(v["prefill_cache_hit"] <= e["threshold"] for v in runs), e
    assert moving["recommended"] <= moving["summary"]["min"]      # below every good run
    # the test fails when any label does: its last row is the min over labels
    whole = res["labels"][-1]
    assert whole["label"] == "(min over labels)" and whole["summary"]["min"] == min(min(v.values()) for v in runs)
    bad = next(ls for ls in res["bad_labels"] if ls["label"] == "prefill_cache_hit")
    assert bad["catch"]["above"] == bad["catch"]["runs"] == 12         # every bad run fails it
    for good_row, bad_row in zip(res["labels"], res["bad_labels"]):  # one threshold, printed alike in both rows
        assert bad_row["catch"]["threshold"] == good_row["recommended"], (good_row, bad_row)
    assert "12/12 runs at or below" in p.stderr and "at or above" not in p.stderr, p.stderr
    # --thresholds in the metric's own terms
    res = json.loads(klb(*args, "--thresholds", "0.012,0.013", cwd=h.path).stdout)
    moving = next(ls for ls in res["labels"] if ls["label"] == "prefill_cache_hit")
    assert [e["threshold"] for e in moving["exceedances"]] == [0.012, 0.013]
    assert [e["above"] for e in moving["exceedances"]] == [
        sum(v["prefill_cache_hit"] <= t for v in runs) for t in (0.012, 0.013)]


def test_calibrate_names_a_label_the_max_hides(history, tmp_path):
    """A re-tester's: one label fell at the bad commit while the others set
    every run's min; calibrate said only "do not separate", where `run`
    names the label and its --metric."""
    h = history(n_commits=20, seed=5, noise=SEPARATED)
    wrapper = tmp_path / "hidden.py"
    wrapper.write_text(HIDDEN_LABEL_PROBE)
    p = klb("calibrate", "--rev", h.good, "--bad-rev", h.bad, "--runs", "8", "--commits", "50", "--probe-cmd",
            f"{PY} {wrapper}", cwd=h.path)
    assert p.returncode == 0, p.stderr
    assert "do not separate" in p.stdout and "label steady alone differs" in p.stdout \
        and "--metric steady" in p.stdout, p.stdout
    # it announced a cost estimate: the label's is given, the max's has none (a tester saw neither)
    assert "estimating a bisect over 50 commits" in p.stderr
    assert "a bisect with --metric steady:" in p.stdout and "runs on average" in p.stdout, p.stdout
    # after the note that names the label it prices, counting the endpoints' runs, which a bisect of
    # this range reuses (a tester budgeted 317 runs where `run` measured 66 new ones)
    notes = [ln for ln in p.stdout.splitlines() if ln.startswith("Note: ")]
    named = next(i for i, ln in enumerate(notes) if "label steady alone differs" in ln)
    priced = next(i for i, ln in enumerate(notes) if ln.startswith("Note: a bisect with --metric steady:"))
    assert named < priced and "endpoint runs included" in notes[priced], notes
    assert any(f"a `klbisect run` from {h.good[:12]} to {h.bad[:12]} with this probe command reuses the 16 runs "
               "recorded at them" in ln for ln in notes), notes


def test_calibrate_warns_when_only_failing_runs_print(history, tmp_path):
    """pytest without -s shows a test's prints only when it fails: a
    calibration of such a probe measures the failing (high) runs alone,
    and its thresholds would sit above every typical run."""
    h = history(n_commits=10, seed=4, noise=SEPARATED)
    probe = tmp_path / "quiet_when_passing.py"
    probe.write_text(
        "import pathlib, random, sys\n"
        f"c = pathlib.Path({str(tmp_path / 'n')!r})\n"
        "n = int(c.read_text()) if c.exists() else 0\n"
        "c.write_text(str(n + 1))\n"
        "if n % 2:\n"
        "    print(f'avg_kl_div={random.uniform(0.011, 0.012):.6f}')\n"
        "    sys.exit(1)\n")
    p = klb("calibrate", "--rev", h.good, "--runs", "4", "--probe-cmd", f"{PY} {probe}", cwd=h.path)
    assert p.returncode == 0, p.stderr
    assert "printed no value, while every run with a value failed" in p.stdout and "add -s" in p.stdout, p.stdout


CLEARER_LABEL_PROBE = OVER_DRIVER + r"""# the max over labels moved a little under long_ctx's noise; decode moved far more, under it
print(f"[long_ctx]\navg_kl_div={random.lognormvariate(0, 0.3) * (0.0075 if bad else 0.005):.6f}")
print(f"[decode]\navg_kl_div={random.lognormvariate(0, 0.05) * (0.003 if bad else 0.001):.6f}")
"""


def test_calibrate_prices_the_label_that_moved_clearly_beside_the_max(history, tmp_path):
    """A tester's: the max over labels moved a little (a bisect of it costs
    hundreds of runs), one label far more clearly, and nothing said so.
    calibrate names the label and what a bisect of it alone would cost."""
    h = history(n_commits=20, seed=5, noise=SEPARATED)
    wrapper = tmp_path / "clearer.py"
    wrapper.write_text(CLEARER_LABEL_PROBE)
    p = klb("calibrate", "--rev", h.good, "--bad-rev", h.bad, "--runs", "30", "--commits", "40", "--probe-cmd",
            f"{PY} {wrapper}", "--json", cwd=h.path)
    assert p.returncode == 0, p.stderr
    res = json.loads(p.stdout)
    note = next(n for n in res["notes"] if "label decode alone separates the endpoints far more clearly" in n)
    assert "--metric decode" in note and "runs on average with it" in note, note
    alone = float(note.split("runs on average with it")[0].rsplit(": ", 1)[1])
    assert alone < res["cost"]["simulated_mean_runs"], (alone, res["cost"])


def test_ctrl_c_in_the_cost_estimate_keeps_the_report(history):
    """A tester's: every run was in when Ctrl-C came in the slow replay of
    the search, and the whole report was lost with it. The statistics are
    printed without the estimate, and the command still exits 130."""
    import signal  # noqa: PLC0415
    import time  # noqa: PLC0415
    from conftest import klb_popen, reaped  # noqa: PLC0415
    # apart enough to price (a pair of samples that did not separate has no estimate to cut short),
    # overlapping enough that each replay over 5,000 commits takes a while
    h = history(n_commits=12, seed=3, merges=0, noise=NoiseModel(good=(0.003, 0.006), bad=(0.0045, 0.008)))
    args = ("calibrate", "--rev", h.good, "--bad-rev", h.bad, "--runs", "12", "--commits", "5000",
            "--metric", "prefill_cache_hit", "--probe-cmd", f"{PY} probe.py", "--json", "--fresh")
    with reaped(klb_popen(*args, cwd=h.path)) as proc:
        said = []
        while not any(line.startswith("estimating a bisect") for line in said):
            line = proc.stderr.readline()
            assert line, "".join(said)
            said.append(line)
        time.sleep(0.5)     # inside the replays: overlapping runs over 5,000 commits take seconds each
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    err = "".join(said) + err
    assert "Traceback" not in err
    assert "the cost estimate was interrupted: the same command gives it" in err
    assert "klbisect: interrupted in the cost estimate; the report above is whole without it" in err
    # a cut-short estimate is no finding that the commits do not separate (a reviewer's)
    assert "do not separate" not in err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["interrupted"] and res["cost"] is None and res["exit_code"] == 130 and res["runs"] == 12
    assert res["bad_runs"] == 12 and res["labels"], res
    # under --fresh the same command resumes it, its runs counted, as any interrupted one
    from klbisect.store import Store  # noqa: PLC0415
    st = Store(h.path / ".git" / "klbisect" / "state.db")
    try:
        sess = st.interrupted_calibration(h.good, h.bad, st.latest_session(("calibrate",)).probe_key)
        assert sess is not None and sess.result["interrupted"]
    finally:
        st.close()
