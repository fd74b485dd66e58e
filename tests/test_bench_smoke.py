"""The benchmark script runs end to end in a tiny configuration and prints its table."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_smoke(tmp_path):
    out_rst = tmp_path / "bench.rst"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--trials", "3", "--commits", "100",
         "--models", "seed", "--strategies", "klbisect,plain", "--jobs", "1",
         "--write-docs", str(out_rst)],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout
    assert "mean runs" in text and "p95 runs" in text and "bound" in text
    rows = [ln.split() for ln in text.splitlines() if ln.startswith("seed ")]
    assert {row[2] for row in rows} == {"klbisect", "plain"}
    for row in rows:
        assert row[1] == "100" and row[3] == "3"
    klb = next(row for row in rows if row[2] == "klbisect")
    assert klb[4] == "100.0%"                 # three easy trials: all right
    assert "C = 1.000" in text                # non-overlapping values carry one bit per run
    assert out_rst.read_text().startswith("command: python scripts/bench_bisect.py")
    # progress is on stderr, one line per row; the table alone on stdout
    assert "seed N=100 klbisect: 3 trials, 100.0% right" in r.stderr and "trials in 2 rows" in r.stderr
    assert "right," not in text and "right," not in out_rst.read_text()


def test_bench_variants_and_unknown_model():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--set", "variants", "--trials", "2",
         "--commits", "100", "--models", "heavy-10pct", "--strategies", "klbisect", "--jobs", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert any(ln.split()[:3] == ["heavy-10pct", "100", "klbisect"] for ln in r.stdout.splitlines())
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--models", "heavy-10pct"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "unknown model 'heavy-10pct'" in bad.stderr


def test_bench_confidence_reaches_the_search():
    """--confidence is klbisect's stopping mark: a lower one stops an overlapping search sooner."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_bisect as bb
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    opts = dict(endpoint_runs=None)
    spent = {c: bb._job(bb.job("main", "overlap", 100, "klbisect", 0, 1, dict(opts, confidence=c)))[4]
             for c in (0.6, 0.99)}
    assert spent[0.6] < spent[0.99]
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--trials", "1", "--commits", "100",
         "--models", "seed", "--strategies", "klbisect", "--confidence", "0.95", "--jobs", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "confidence 0.95 (git-bayesect 0.95)" in r.stdout


def test_bench_own_model_as_a_new_user_would():
    """--model runs a noise model nobody tuned for; a malformed one is one line and exit 2."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--trials", "2", "--commits", "100",
         "--strategies", "klbisect,plain", "--jobs", "1",
         "--model", "name=mine good=0.001,0.004 bad=0.005,0.05 labels=5 crashes=0.05 untestable=1,2"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "'name=mine good=0.001,0.004" in r.stdout        # the command line, quoted to paste back
    klb = next(ln.split() for ln in r.stdout.splitlines() if ln.split()[:3] == ["mine", "100", "klbisect"])
    assert klb[3] == "2" and klb[4] == "100.0%"
    for spec, says in (("good=1", "good takes two numbers"), ("kind=gamma", "kind=gamma is not"),
                       ("colour=red", "not key=value"), ("good=0.006,0.003", "0 < lo < hi"),
                       ("crashes=1.5", "0 <= crashes < 1"), ("labels=0", "give 1 to 64 labels"),
                       ("untestable=5,2", "0 <= lo <= hi"), ("outliers=0.1 outlier-mult=3,2", "0 < lo <= hi")):
        bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--model", spec],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr


def test_bench_help_says_what_each_model_key_does():
    """--help gives every --model key a phrase, and says how lognormal's bad= differs."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_bisect as bb
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--help"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    keys = r.stdout.split("--model keys")[1]
    said = {ln.split()[0] for ln in keys.splitlines()[1:] if ln[:2] == "  " and ln[2:3].strip()}
    assert said == {k + "=" for k in bb.MODEL_KEYS}
    flat = " ".join(keys.split())
    for phrase in ("ONE label is U(LO,HI) instead", "a FACTOR range LO,HI on the median",
                   "EVERY label moves", "needs kind=uniform", "MEDIAN,SIGMA", "a run's value is their max",
                   "share of BAD commits' runs", "at any commit", "build-broken commits right before the culprit"):
        assert phrase in flat, phrase


def test_bench_model_whose_bad_is_not_above_good_is_one_line():
    """Bad values at or below good ones, and other nonsense, stop before any trial
    (they used to run 2,000 runs a trial for 0%); variance-only and spike-only models pass."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_bisect as bb
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for spec, says in (("bad=0.001,0.002", "bad=0.001,0.002 is not above good=0.003,0.006 (the default)"),
                       ("good=0.003,0.01 bad=0.004,0.008", "give bad hi > good hi"),
                       ("kind=lognormal bad=0.8,0.9", "give 1 <= lo <= hi with hi > 1"),
                       ("kind=lognormal bad=0.9,1.5", "give 1 <= lo"),
                       ("kind=lognormal good=0.004,0.2 bad=1,1", "hi = 1 only with spikes="),
                       ("bad=-0.02,0.01", "0 < lo < hi"), ("bad=0.02,0.01", "0 < lo < hi"),
                       ("crashes=-0.1", "0 <= crashes < 1"), ("spikes=1", "0 <= spikes < 1"),
                       ("outliers=nan", "give finite numbers"), ("good=0.003,inf", "give finite numbers"),
                       ("threshold=-1", "threshold takes a KL value > 0"), ("labels=2.5", "a whole number"),
                       ("untestable=0.5,2", "whole numbers"), ("spikes=0.2 spike-mult=0.5,2", "1 <= lo <= hi"),
                       ("name=a name=b", "given twice"), ("name=", "name= is empty"),
                       ("", "the spec is empty"), ("labels=100000000000", "give 1 to 64 labels"),
                       ("kind=lognormal good=0.004,60", "give sigma <= 3")):
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--commits", "100",
                            "--trials", "1", "--jobs", "1", "--model", spec],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and says in r.stderr.splitlines()[-1], (spec, r.stderr[-500:])
        assert "Traceback" not in r.stderr and "trials in" not in r.stderr and not r.stdout
    for spec in ("name=varonly good=0.003,0.006 bad=0.0015,0.0075 labels=1",
                 "name=spk30u good=0.003,0.006 bad=0.003,0.006 spikes=0.3",
                 "name=spikes kind=lognormal good=0.004,0.2 bad=1,1 spikes=0.3 threshold=0.01",
                 "name=ln kind=lognormal good=0.004,0.3 bad=1,1.5 untestable=1,3"):
        bb.parse_model(spec)


def test_bench_random_models_are_valid_and_repeatable():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_bisect as bb
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    specs = [bb.random_model(k, 3) for k in range(40)]
    assert specs == [bb.random_model(k, 3) for k in range(40)] != [bb.random_model(k, 4) for k in range(40)]
    models = [bb.parse_model(s) for s in specs]
    assert {m.kind for m in models} == {"uniform", "lognormal"}
    assert any(m.outlier_rate for m in models) and any(m.crash_rate for m in models)
    assert any(m.untestable[1] for m in models)


def test_known_noise_search_weighs_runs_by_the_true_likelihood_ratio():
    """The 'known' row's ratio is a real likelihood ratio: on overlapping values
    a good run's e^llr averages 1, and values only one side gives are decisive."""
    import numpy as np
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_bisect as bb
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    rng = np.random.default_rng(5)
    overlap = bb.SCENARIOS["overlap"]
    llr = overlap.log_lr({"factor": 1.25})
    good = overlap.draw(rng, False, {"factor": 1.25}, 20000)
    bad = overlap.draw(rng, True, {"factor": 1.25}, 20000)
    assert abs(np.mean([np.exp(llr(v)) for v in good]) - 1) < 0.05
    assert np.mean([llr(v) for v in bad]) > 0.1 > -0.1 > np.mean([llr(v) for v in good])
    seed = bb.SCENARIOS["seed"].log_lr({})
    assert seed(0.0045) == -bb.LLR_CLIP and seed(0.011) == bb.LLR_CLIP and seed(None) == 0.0
    # outliers that read low (a factor under 1, a tester's model, which crashed the known rows): a bad
    # run brought down into the good range counts for good a little, not decisively, either way
    low = bb.parse_model("name=low kind=lognormal good=0.004,0.2 bad=1.6,1.6 outliers=0.1 outlier-mult=0.3,0.6")
    llr = low.log_lr({"factor": 1.6})
    assert abs(np.mean([np.exp(llr(v)) for v in low.draw(rng, False, {"factor": 1.6}, 20000)]) - 1) < 0.05
    assert llr(0.0064) > 2 and -bb.LLR_CLIP < llr(0.0025) < 0    # a bad run read low is not a sure good one
    # the same on the uniform kind (another tester's): the grid stopped at the top value times 0.7,
    # under most bad values, and the known rows were right 81% of the time
    low = bb.parse_model("name=lowread labels=3 good=0.003,0.006 bad=0.007,0.012 outliers=0.3 outlier-mult=0.3,0.7")
    llr = low.log_lr({})
    # E_good[LR] is the bad runs' share on the good runs' values: here 0.24, not 1
    shared = np.mean([llr(v) < bb.LLR_CLIP for v in low.draw(rng, True, {}, 20000)])
    assert abs(np.mean([np.exp(llr(v)) for v in low.draw(rng, False, {}, 20000)]) - shared) < 0.03, shared
    assert llr(0.011) == bb.LLR_CLIP and -bb.LLR_CLIP < llr(0.0045) < 0
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--trials", "4", "--commits", "1000",
         "--models", "seed", "--strategies", "known", "--jobs", "1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    row = next(ln.split() for ln in r.stdout.splitlines() if ln.split()[:3] == ["seed", "1,000", "known"])
    assert row[4] == "100.0%" and 9.0 <= float(row[5]) <= 11.0     # one decisive run per halving


def test_fence_spread_script_measures_the_fence_unit_and_runs_searches():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "fence_spread.py"), "--draws", "300",
                        "--bisects", "2", "--commits", "50"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {(ln.split()[0], ln.split()[1]): ln.split()[2:] for ln in r.stdout.splitlines()
            if ln.split()[1:2] in (["resid-MAD"], ["pairs"], ["floored"], ["Model.mad"])}
    assert len(rows) == 12
    def under(spiking, name):   # share of draws whose unit fell under 0.3 of the true spread
        return float(rows[spiking, name][1].rstrip("%"))
    # without spikes the floor rescues most draws whose residuals' MAD collapsed
    assert under("0%", "Model.mad") < under("0%", "resid-MAD") / 2
    # when half the bad runs spike, the good side's cap keeps far more of them past the fence
    def past(spiking, name):
        return float(rows[spiking, name][3].rstrip("%"))
    assert past("50%", "Model.mad") > past("50%", "floored") + 10
    assert r.stdout.count("culprit") == 2 and "right" in r.stdout.splitlines()[-1]


def test_bench_constant_is_an_ablation_the_workers_see():
    """--constant changes one of klbisect's constants in every worker and says so in the
    header: without the stricter mark an overlapping search stops sooner."""
    def mean_runs(*extra):
        r = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--trials", "2", "--commits", "100",
             "--models", "overlap", "--strategies", "klbisect", "--jobs", "2", *extra],
            capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        row = next(ln.split() for ln in r.stdout.splitlines() if ln.startswith("overlap "))
        return float(row[5]), r.stdout

    base, text = mean_runs()
    assert "ablation:" not in text
    loose, text = mean_runs("--constant", "search.INTEGRATED_STRICTNESS=1")
    assert "ablation: search.INTEGRATED_STRICTNESS=1" in text
    assert loose < base
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"),
                          "--constant", "search.NO_SUCH=1"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--constant 'search.NO_SUCH=1'" in bad.stderr
    assert "Traceback" not in bad.stderr
    half = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"),
                           "--constant", "decide.MIN_ENDPOINT_RUNS=4.5"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert half.returncode == 2 and "give a whole number" in half.stderr


def test_bound_uses_the_capacity_where_the_sides_differ_in_kind():
    """A search picks P(bad) by picking the commit, so Fano's C is the maximum over it:
    equal to I at 1/2 when both sides share a shape, above it for a spike regression."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_bisect as bb
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert abs(bb.SCENARIOS["overlap"].bits_per_run(n=200_000) - 0.1207) < 0.005
    spikes = bb.VARIANTS["spikes"].bits_per_run(n=200_000)
    # a Z-channel: good never spikes, bad spikes 30% of the time -> capacity 0.177, I(1/2) 0.169
    assert 0.173 < spikes < 0.181


def test_target_floor_says_which_targets_no_method_can_meet(tmp_path):
    """On the spike model a quarter of git-bayesect's runs is under Fano's bound;
    on a clean separated model the told search meets it."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import target_floor as tf
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert tf.verdict(50.0, 33.0, 64.0) == "under the bound"
    assert tf.verdict(50.0, 60.0, 64.0) == "under known"
    assert tf.verdict(9.0, 19.0, 10.0) == "open"
    assert tf.cheapest_sure({0.99: ([1] * 98 + [0] * 2, [60] * 100),
                             0.999: ([1] * 100, [70] * 100)}) == (0.999, 70.0, 1.0)
    out = tmp_path / "floor.rst"
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "target_floor.py"), "--sets", "variants",
         "--models", "spikes,seed-tight", "--known-trials", "6", "--bayesect-trials", "3", "--jobs", "1",
         "--write-docs", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {ln.split()[1]: ln for ln in r.stdout.splitlines() if ln.startswith("variants ")}
    assert rows["spikes"].endswith("under the bound") and rows["seed-tight"].endswith("open")
    assert out.read_text().startswith("command: python scripts/target_floor.py")
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "target_floor.py"), "--sets", "nope"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "unknown set 'nope'" in bad.stderr and "Traceback" not in bad.stderr
    mine = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "target_floor.py"), "--model",
         "name=mine good=0.003,0.006 bad=0.007,0.013 labels=3", "--known-trials", "4", "--bayesect-trials", "2",
         "--jobs", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert mine.returncode == 0, mine.stderr[-2000:]
    row = next(ln.split() for ln in mine.stdout.splitlines() if ln.startswith("custom "))
    assert row[1] == "mine" and row[2] == "8.9" and row[-1] == "open"      # the seed case as a user's model


def test_where_the_runs_go_adds_up_and_shows_the_endpoint_runs():
    """--where splits each row's runs by commit: klbisect's six runs per endpoint
    before any search, none for the search told the noise; the parts add up."""
    import numpy as np
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import bench_bisect as bb
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    # a culprit at commit 1: the last good commit is the good endpoint, counted once
    o = bb.Oracle(bb.SCENARIOS["seed"], bb.Truth(10, 1, frozenset(), {}), np.random.default_rng(0))
    for i in (0, 0, 1, 5, 10):
        o.run(i)
    assert o.roles() == (2, 1, 0, 1, 1)
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--trials", "3", "--commits", "1000",
         "--models", "seed", "--strategies", "klbisect,known", "--jobs", "1", "--where"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    main, where = r.stdout.split("where the runs go")
    mean = {ln.split()[2]: float(ln.split()[5]) for ln in main.splitlines() if ln.startswith("seed ")}
    parts = {ln.split()[2]: [float(x) for x in ln.split()[3:8]] for ln in where.splitlines()
             if ln.startswith("seed ")}
    for strat in ("klbisect", "known"):
        assert abs(sum(parts[strat]) - mean[strat]) < 0.11
    assert parts["klbisect"][0] >= 6 and parts["klbisect"][1] >= 6
    assert parts["known"][:2] == [0.0, 0.0]


def _bench(*args: str) -> str:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--commits", "100",
                        "--models", "seed", "--jobs", "1", *args],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_wrong_lists_the_trials_that_replay_alike():
    """--wrong names each wrong trial; --trial T runs that trial alone, with
    the same answer and runs, so a miss in a table can be traced."""
    text = _bench("--strategies", "plain,klbisect", "--trials", "8", "--wrong")
    wrong = [ln.strip() for ln in text.splitlines() if ln.startswith("  seed N=100 ")]
    assert wrong and all(" plain trial " in ln for ln in wrong)   # git bisect at the threshold misses
    assert len(wrong) == 8 - round(8 * float(next(
        ln.split()[4] for ln in text.splitlines() if ln.split()[:3] == ["seed", "100", "plain"]).rstrip("%")) / 100)
    first = wrong[0]
    trial = first.split(" trial ")[1].split(":")[0]
    again = _bench("--strategies", "plain", "--trials", "8", "--trial", trial, "--wrong")
    assert first in [ln.strip() for ln in again.splitlines()]
    row = next(ln.split() for ln in again.splitlines() if ln.split()[:3] == ["seed", "100", "plain"])
    assert row[3] == "1" and row[4] == "0.0%"
    right = _bench("--strategies", "klbisect", "--trials", "3", "--wrong")
    assert "wrong trials: none" in right
    # a search that gives up says why, as its session would exit (a tester saw only "gave up")
    same = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--commits", "100",
                           "--strategies", "klbisect", "--trials", "2", "--wrong",
                           "--model", "name=same kind=lognormal good=0.004,0.2 bad=1,1.001"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert "gave up (154, the endpoints " in same.stdout, same.stdout
    none = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--commits", "100",
                           "--models", "seed", "--strategies", "klbisect", "--trials", "3", "--trial", "5"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert none.returncode == 2 and "--trial 5: no row has that trial" in none.stderr


def test_out_of_range_options_are_one_line_before_any_trial():
    """Sizes, counts and marks a new user might mistype: exit 2 and one line
    naming the option, from both scripts, never a traceback."""
    cases = [("bench_bisect.py", ["--trials", "0"], "--trials"),
             ("bench_bisect.py", ["--commits", "x"], "--commits 'x'"),
             ("bench_bisect.py", ["--commits", "5"], "at least 10"),
             ("bench_bisect.py", ["--confidence", "1.2"], "--confidence"),
             ("bench_bisect.py", ["--seed", "-1"], "--seed: give a seed of 0 or more"),
             ("bench_bisect.py", ["--constant", "decide.MIN_ENDPOINT_RUNS=-1"], "a finite value of 0 or more"),
             ("bench_bisect.py", ["--constant", "decide.MIN_ENDPOINT_RUNS=0"], "counts runs; give at least 1"),
             ("bench_bisect.py", ["--commits", "12", "--model", "name=x untestable=0,20"], "at least 22 commits"),
             # a tester's: each ran the whole benchmark first, or none of it, or for ever
             ("bench_bisect.py", ["--write-docs", "/nonexistent/dir/x.txt"], "does not exist"),
             ("bench_bisect.py", ["--write-docs", "/tmp"], "that is a directory"),
             ("bench_bisect.py", ["--strategies", ","], "name at least one of"),
             ("bench_bisect.py", ["--endpoint-runs", "100000"], "give 2 to 40 runs"),
             ("bench_bisect.py", ["--bayesect-max-runs", "0"], "--bayesect-max-runs"),
             ("bench_bisect.py", ["--random-models", "-1"], "--random-models"),
             ("bench_bisect.py", ["--random-models", "0"], "give 1 or more models"),
             ("bench_bisect.py", ["--jobs", "100000"], "--jobs: give at most"),
             ("bench_bisect.py", ["--confidence", "0.999999"], "at most 0.99999"),
             ("target_floor.py", ["--known-trials", "0"], "--known-trials"),
             ("target_floor.py", ["--commits", "12", "--model", "name=x untestable=0,20"], "at least 22 commits")]
    for script, args, says in cases:
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / script), *args],
                           capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert r.returncode == 2 and says in r.stderr.splitlines()[-1], (script, args, r.stderr[-500:])
        assert "Traceback" not in r.stderr


def test_nightly_power_script_compares_the_two_rules():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "nightly_power.py"), "--trials", "24",
                        "--factors", "3.0", "--nights", "2", "--good-nights", "4"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {ln.split()[0]: ln.split()[2:] for ln in r.stdout.splitlines() if ln.split()[1:2] == ["x3"]}
    assert set(rows) == {"suspect", "good-if-unsure"}
    # a tripled label is seen on the first night under either rule, almost always
    assert all(float(cells[0].rstrip("%")) >= 80 for cells in rows.values())
    assert r.stdout.count("false alarms:") == 2


def test_write_docs_never_replaces_a_file_it_did_not_write(tmp_path):
    notes = tmp_path / "notes.rst"
    notes.write_text("My notes: keep me\n")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_bisect.py"), "--trials", "1",
                        "--commits", "100", "--models", "seed", "--strategies", "klbisect", "--jobs", "1",
                        "--write-docs", str(notes)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 2 and "--write-docs" in r.stderr and "Traceback" not in r.stderr
    assert notes.read_text() == "My notes: keep me\n"


def test_heldout_shapes_smoke():
    """The held-out shapes' harness runs a shape with per-commit offsets and
    one without, and prints a row for each."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "heldout_shapes.py"), "--shapes", "offset3,ln60", "--commits", "30",
         "--trials", "2", "--jobs", "1"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines()[2:]}
    assert set(rows) == {"offset3", "ln60"}, r.stdout
    assert all(row[1].endswith("/2") for row in rows.values()), r.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "heldout_shapes.py"), "--shapes", "nosuch"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "unknown nosuch" in bad.stderr


def test_offset_ceiling_says_no_rule_reaches_99_percent_on_offset6():
    """Told every commit's median exactly, the best rule still misreads the
    commit beside the step whose own offset crosses the midpoint."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "offset_ceiling.py"), "--trials", "3000",
                        "--commits", "40"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    best = {line.split(":")[0]: float(line.split("best accuracy ")[1].split()[0]) for line in p.stdout.splitlines()[1:]}
    assert 0.95 < best["offset6"] < 0.985 and best["offset3"] > 0.999, p.stdout
