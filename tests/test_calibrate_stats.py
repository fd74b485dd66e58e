"""`klbisect calibrate`'s numbers on plain inputs: what a statistician
checked of the recommended threshold and the information limit."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats

import klbisect.calibrate as cal
import klbisect.decide as decide
from klbisect.calibrate import Calibration, CostEstimate, format_calibration, label_stats
from klbisect.metric import NONFINITE, fmt_value


def lognormal_runs(n: int, seed: int, median: float = 0.004, sigma: float = 0.3) -> list[float]:
    return [float(v) for v in np.random.default_rng(seed).lognormal(math.log(median), sigma, n)]


def text(labels: list, runs: int = 20, **kw) -> str:
    return format_calibration(Calibration("HEAD", "0" * 40, runs, 0, labels, 0.01, 0.95, **kw))


def test_runs_that_print_nan_count_against_the_false_failure_rate():
    """Every nan run fails any threshold: with 5% of them, a threshold "for
    0.01 false failures" fitted to the finite runs alone fails good commits
    over 5% of the time."""
    vals = lognormal_runs(19, 1)
    ls, = label_stats([{"kl": v} for v in vals] + [{"kl": NONFINITE}], None, 0.01, 0.95)
    assert ls.recommended is None
    assert ls.recommended_how == ("1 of 20 runs printed nan or inf, which fail any threshold: at that share (0.05) "
                                  "no threshold can reach 0.01 false failures")
    out = text([ls])
    assert "no threshold recommended: 1 of 20" in out and "needs at least" not in out   # more runs will not help
    # a share below the rate, but its upper bound is not: more runs can tell, and how many
    vals = lognormal_runs(199, 2)
    ls, = label_stats([{"kl": v} for v in vals] + [{"kl": NONFINITE}], None, 0.01, 0.95)
    hi = stats.beta.ppf(0.95, 2, 199)
    assert ls.recommended is None and ls.recommended_how.startswith(
        f"1 of 200 runs printed nan or inf, which fail any threshold: their share (0.005) may be as high as {hi:.2g} "
        "(95% confidence), so no threshold can reach 0.01 false failures from these runs; at that share ")
    more = int(re.search(r"nine times in ten \(--runs (\d+)\)", ls.recommended_how).group(1))
    # "nine times in ten": a rerun that draws nan a little over the share seen still gets one (a
    # tester's, at the bare share, drew one too many half the time); at half as many runs, it does not
    for m, nan, enough in ((more, int(stats.binom.ppf(0.85, more, 1 / 200)), True),
                           (more // 2, int(stats.binom.ppf(0.85, more // 2, 1 / 200)), False)):
        t, _ = decide.recommend_threshold(lognormal_runs(m - nan, 3), 0.01, 0.95, nonfinite=nan)
        assert (t is not None) == enough, (m, nan)
    assert "needs at least" not in text([ls])
    # a label that printed nan in every run: no threshold, and the max is not lent another label's
    runs = [{"a": NONFINITE, "b": v} for v in lognormal_runs(400, 4)]
    a, b, whole = label_stats(runs, None, 0.01, 0.95)
    assert a.recommended is None and whole.recommended is None and b.recommended is not None
    assert a.exceedances == [] and whole.exceedances == []     # no lines drawn from nan's stand-in
    assert a.recommended_how == ("every one of the 400 runs printed nan or inf, which fail any threshold: no threshold "
                                 "can reach 0.01 false failures")
    # the max fails whenever any label prints nan: past the rate on its own, it is not raised to a label's
    runs = [{"a": x, "b": y} for x, y in zip(lognormal_runs(200, 10), lognormal_runs(200, 11))]
    runs[0]["a"] = runs[1]["b"] = runs[2]["b"] = NONFINITE
    a, b, whole = label_stats(runs, None, 0.01, 0.95)
    assert a.recommended is None and b.recommended is None and whole.recommended is None
    assert whole.recommended_how.startswith("3 of 200 runs printed nan or inf")
    # enough runs for an order statistic: the nan runs are runs above every value
    vals = lognormal_runs(1200, 3)
    t, how = decide.recommend_threshold(vals, 0.01, 0.95, nonfinite=4)
    assert how == ("order statistic 1198 of 1204 runs, the 4 that printed nan or inf counted as failing any "
                   "threshold (distribution-free)")
    assert t == pytest.approx(sorted(vals)[1197]) and t > decide.recommend_threshold(vals, 0.01, 0.95)[0]


def test_a_threshold_with_nan_runs_keeps_its_confidence():
    """A tester's coverage check: good runs log-normal but 2% nan, a
    threshold for 0.05 false failures at 95% confidence. Their share, taken
    as exact, left its true rate over 0.05 in 20-30% of calibrations; it
    must be at most about 5% of them, counting calibrations that recommend
    nothing as kept."""
    rng = np.random.default_rng(7)
    mu, sigma, nan_share, rate = math.log(0.004), 0.3, 0.02, 0.05
    for n in (60, 150, 400):
        over = 0
        for _ in range(300):
            k = int(rng.binomial(n, nan_share))
            t, _ = decide.recommend_threshold(rng.lognormal(mu, sigma, n - k), rate, 0.95, nonfinite=k)
            true = 1.0 if t is None else nan_share + (1 - nan_share) * stats.norm.sf((math.log(t) - mu) / sigma)
            over += t is not None and true > rate
        assert over <= 0.08 * 300, (n, over)


def test_runs_that_stand_apart_are_named_beside_a_tail_fit():
    """5% of good runs 3-10x the rest put the fit's threshold "for 0.01" at
    4% true false failures, and one such run among 40 did not refute it:
    a generalized ESD test on the logs says the top runs stand apart."""
    rng = np.random.default_rng(3)
    vals = rng.lognormal(math.log(0.005), 0.3, 40)
    assert decide.high_outliers(vals) == 0
    vals[5] *= 6
    assert decide.high_outliers(vals) == 1
    vals[9] *= 8
    assert decide.high_outliers(vals) == 2        # the second one does not mask the first
    ls, = label_stats([{"kl": float(v)} for v in vals], None, 0.01, 0.95)
    assert ls.recommended_bound["outliers"] == 2
    assert "the top 2 runs stand apart from the rest (generalized ESD on the logs, p < 0.01)" in text([ls], 40)
    # clean log-normal samples: rarely named
    false = sum(decide.high_outliers(rng.lognormal(0, 0.3, 30)) > 0 for _ in range(300))
    assert false <= 9
    # a deterministic test: said, not fitted
    t, how = decide.recommend_threshold([0.1] * 6, 0.01, 0.95)
    assert t == pytest.approx(0.1) and t > 0.1 and how.startswith("every one of the 6 runs read the same value")
    for x in (0.0123, 0.8, 3e-5):    # exp(log(x)) an ulp under x read as a threshold every run failed
        ls, = label_stats([{"kl": x}] * 30, None, 0.01, 0.95)
        assert ls.recommended > x and ls.recommended_bound["above"] == 0, ls
        assert "if the test stays deterministic: " in text([ls], 30) and "log-normal" not in text([ls], 30)


def test_values_at_or_below_zero_are_named_as_why_there_is_no_tail_fit():
    vals = lognormal_runs(20, 4)
    vals[3], vals[7] = 0.0, -0.001
    assert decide.recommend_threshold(vals, 0.01, 0.95) == (None, "2 of 20 values are <= 0: no log-normal tail fit")
    assert decide.recommend_threshold(vals[:4], 0.01, 0.95) == (None, "too few runs (4)")
    # enough runs: the distribution-free order statistic needs no positive values
    many = lognormal_runs(300, 5)
    many[0] = 0.0
    t, how = decide.recommend_threshold(many, 0.01, 0.95)
    assert how.startswith("order statistic") and t >= max(many)


def test_the_tail_fit_uses_the_exact_normal_tolerance_factor():
    """The approximate factor's 95% covered 94.6% at 200 runs; the exact
    one is the noncentral t's (3.295 at 20 runs for 0.01 at 95%, as
    tables of one-sided tolerance factors give)."""
    for n, k in ((20, 3.2952), (200, None)):
        y = np.random.default_rng(n).standard_normal(n)
        y = (y - y.mean()) / y.std(ddof=1) * 0.3 + math.log(0.004)           # mean log(0.004), sd 0.3 exactly
        if k is None:
            k = stats.nct.ppf(0.95, n - 1, stats.norm.ppf(0.99) * math.sqrt(n)) / math.sqrt(n)
        t, how = decide.recommend_threshold(np.exp(y), 0.01, 0.95)
        assert "log-normal tail fit" in how
        assert math.log(t) == pytest.approx(math.log(0.004) + k * 0.3, abs=2e-5)


def test_a_recommended_threshold_is_rounded_up_where_it_is_printed():
    """0.0068834315 as the top run printed 0.006883: a CI that fails at or
    above that number fails the run the threshold was chosen to clear."""
    vals = [v * 0.0068834315 / 0.0079 for v in np.linspace(0.002, 0.0079, 300)]
    ls, = label_stats([{"kl": v} for v in vals], None, 0.01, 0.95)
    assert float(fmt_value(ls.recommended)) == ls.recommended >= max(vals)
    assert ls.recommended_bound["above"] == 0
    assert f"{fmt_value(ls.recommended)} (0/300 runs at or above it" in text([ls], 300)
    assert cal.round_up(0.0068834315) == 0.006884 and fmt_value(cal.round_up(0.0068834315)) == "0.006884"
    assert cal.round_up(0.006884) == 0.006884 and cal.round_up(12345.6) == 12350.0
    assert cal.round_up(-0.0012341) == -0.001234 and cal.round_up(0.0) == 0.0


def test_bits_count_nan_runs_as_their_own_outcome_and_take_the_capacity():
    """A good commit that always prints a value and a bad one that prints
    nan in 10% of its runs, its values otherwise the same: a Z channel,
    whose capacity is log2(1 + (1 - p) p^(p / (1 - p))) with p = 0.9, above
    its information at P(bad) = 1/2. The nan stand-in (1e9) inside a kernel
    density took the bits instead."""
    x = lognormal_runs(90, 6)
    bits, disjoint = decide.sample_bits(x, x + [NONFINITE] * 10)
    p = 0.9
    at_half = 0.5 * (0.05 * math.log2(1 / 0.05)) + 0.95 * math.log2(1 / 0.95) - 0.5 * (
        -0.1 * math.log2(0.1) - 0.9 * math.log2(0.9))
    assert not disjoint and bits == pytest.approx(math.log2(1 + (1 - p) * p ** (p / (1 - p))), abs=5e-4)
    assert bits > at_half + 2e-3
    # the same share of nan on both sides says nothing, and takes nothing from what the values say
    g, b = lognormal_runs(100, 7), lognormal_runs(100, 8, median=0.006)
    clean = decide.sample_bits(g, b)[0]
    with_nan = decide.sample_bits(g[:90] + [NONFINITE] * 10, b[:90] + [NONFINITE] * 10)[0]
    assert with_nan == pytest.approx(0.9 * clean, rel=0.15)
    lo, hi = decide.bits_interval(g, b)
    assert 0 <= lo < clean < hi <= 1 and decide.bits_interval(g, b) == (lo, hi)          # seeded


def cost(**kw) -> CostEstimate:
    return CostEstimate(**{"commits": 1000, "bits_per_run": 0.2, "lower_bound_runs": 44.6,
                           "simulated_mean_runs": 180.0, "simulated_p95_runs": 270.0, "simulated_accuracy": 1.0,
                           "trials": 40, "model_bits": 0.0, "disjoint": False, **kw})


def test_the_information_limit_reads_as_an_estimate_and_the_model_bits_as_what_they_are():
    def line(k: CostEstimate) -> str:
        return text([], bad_sha="1" * 40, cost=k).splitlines()[-1]
    out = line(cost())
    assert ("a run can tell at most about 0.20 bits (capacity, a kernel-density estimate from the two commits' "
            "runs), so Fano's information limit is about 44.6 runs;") in out
    assert "at least" not in out
    # spikes with no median shift: the model is a location model, not an outlier cap
    assert ("its model credits a run with 0.00 bits, simulating runs that differ only in their median: a change "
            "of spread or tail (spikes) counts for nothing there") in out
    assert "guard against outliers" not in out and "caps" not in out
    # the bootstrap range of the bits, and of the limit with it
    assert ("estimate from the two commits' runs; 90% bootstrap range 0.10-0.30), so Fano's information limit is "
            "about 44.6 runs (30-89 over that range)") in line(cost(bits_interval=[0.1, 0.3]))
    assert "(30-no limit over that range)" in line(cost(bits_interval=[0.0, 0.3]))
    # never-overlapping runs: one bit is all a run can hold, so the limit is a bound; the cap is what lowers the model
    out = line(cost(disjoint=True, bits_per_run=1.0, lower_bound_runs=8.9, model_bits=0.8))
    assert "a run is worth up to 1 bit, and it needs at least 8.9 runs" in out and "it caps what one run" in out


def test_commits_that_do_not_separate_on_few_runs_are_not_called_inseparable():
    ls, = label_stats([{"kl": v} for v in lognormal_runs(3, 9)], None, 0.01, 0.95)
    out = text([ls], 3, bad_sha="1" * 40)
    assert "do not separate: these 3 runs a side do not show a difference; more runs may" in out
    assert "(the same command with --runs 30 keeps these and adds to them)" in out     # and how many to try
    assert "no bisect could" not in out
    assert "these 3 and 5 runs do not show" in text([ls], 3, bad_sha="1" * 40, bad_runs=5)


def test_the_header_counts_crashes_among_the_runs_it_counts_values_from():
    class R:
        def __init__(self, v):
            self.value = v
    runs = [R(None), R(1.0), R(None), R(None), R(2.0), R(None), R(3.0)]
    counted = [r for r in runs if r.value is not None]
    assert cal.crashes_among(runs, counted, 2) == 3          # after the 1.0 left out
    assert cal.crashes_among(runs, counted, 3) == 4          # every run
    assert cal.crashes_among(runs, counted, 5) == 4


def test_the_cost_estimate_draws_fresh_values_where_the_sides_overlap_and_counts_crashes():
    """A tester's: the estimate drew the measured runs themselves and left
    crashes out, and real bisects spent a quarter more (57 estimated, 70
    spent). Overlapping runs are drawn through a kernel now; runs that never
    overlap as measured (a kernel's tails would cross their gap); a nan's
    stand-in as it is; and crashed runs are spent as a session spends them."""
    from klbisect.calibrate import resampler, simulate_cost
    rng = np.random.default_rng(1)
    runs = [0.004, 0.005, 0.006, NONFINITE]
    smooth = [resampler(runs, rng)() for _ in range(400)]
    assert len(set(smooth) - set(runs)) > 250 and NONFINITE in smooth
    assert all(v > 0 for v in smooth)
    assert set(resampler(runs, rng, smooth=False)() for _ in range(100)) <= set(runs)
    good = list(0.004 * np.exp(0.1 * rng.standard_normal(30)))
    bad = list(0.012 * np.exp(0.1 * rng.standard_normal(30)))
    calm, crashing = simulate_cost(good, bad, 200), simulate_cost(good, bad, 200, crash_rate=0.3)
    assert calm.disjoint and crashing.simulated_mean_runs > calm.simulated_mean_runs * 1.2


def test_a_few_outliers_do_not_widen_the_kernel_over_every_run():
    """A tester's good and bad runs had 5% outliers 3-8x out: the kernel's
    width from their standard deviation blurred every ordinary run, the
    replays overlapped far more than real runs, and the estimate read 590
    runs for a bisect that took 334. The spread is the interquartile
    range's where that is smaller."""
    from klbisect.calibrate import resampler
    rng = np.random.default_rng(2)
    runs = list(0.004 * np.exp(0.1 * rng.standard_normal(57))) + [0.02, 0.025, 0.03]

    def ordinary_spread(robust: bool) -> float:
        draw = resampler(runs, np.random.default_rng(3), robust=robust)
        logs = np.log([v for v in (draw() for _ in range(4000)) if v < 0.008])
        return float(np.std(logs))
    assert ordinary_spread(robust=True) < 0.13 < 0.2 < ordinary_spread(robust=False)


def test_a_cost_estimate_can_end_early_and_says_when_bisects_ran_to_the_cap():
    """A tester waited 12 minutes, with nothing printed, on 40 simulated
    bisects of overlapping runs that each went to the 2,000-run cap: the
    caller may end the trials after any of them, and an estimate whose
    bisects hit the cap says its mean is a floor."""
    from klbisect.calibrate import cost_line, simulate_cost
    rng = np.random.default_rng(2)
    good = list(0.005 * np.exp(0.3 * rng.standard_normal(40)))
    bad = list(0.0058 * np.exp(0.3 * rng.standard_normal(40)))
    seen: list[int] = []
    k = simulate_cost(good, bad, 200, max_runs=60, after_trial=lambda runs: seen.append(len(runs)) or len(runs) >= 3)
    assert seen == [1, 2, 3] and k.trials == 3
    assert k.capped == 3 and k.simulated_mean_runs == 60
    assert "3 of the 3 stopped at the 60-run cap" in cost_line(k) and "the mean is a floor" in cost_line(k)
    calm = simulate_cost(list(0.004 * np.exp(0.1 * rng.standard_normal(20))),
                         list(0.012 * np.exp(0.1 * rng.standard_normal(20))), 100, trials=5)
    assert calm.capped == 0 and calm.trials == 5 and "run cap" not in cost_line(calm)


def test_a_cost_estimate_from_few_runs_says_a_real_bisect_may_take_more():
    """A tester priced a bisect from 10 runs a side that held none of the
    good commit's 5% outliers: "p95 26", then four of six real bisects took
    32-53 runs. Under 30 runs a side the estimate says what it cannot see."""
    from klbisect.calibrate import cost_line, simulate_cost
    rng = np.random.default_rng(3)
    few = simulate_cost(list(rng.uniform(0.003, 0.006, 10)), list(rng.uniform(0.007, 0.013, 12)), 120, trials=5)
    assert few.sample == 10 and "from as few as 10 runs a side" in cost_line(few)
    assert "budget on 30 runs a side" in cost_line(few)
    many = simulate_cost(list(rng.uniform(0.003, 0.006, 30)), list(rng.uniform(0.007, 0.013, 40)), 120, trials=5)
    assert many.sample == 30 and "budget on" not in cost_line(many)


def test_a_tail_fit_that_its_own_runs_contradict_says_so():
    """A tester's good runs were log-normal with 8% outliers 2-4x: the fit
    recommended 0.0102 for 1% false failures, which fails 5.5% of good
    runs, while 3 of the 100 runs already lay above it, and nothing said
    so. Runs that are log-normal get no such line."""
    from klbisect.calibrate import label_stats, recommendation_lines
    rng = np.random.default_rng(1)
    clean = 0.004 * np.exp(0.2 * rng.standard_normal(100))
    spiky = clean.copy()
    hit = rng.random(100) < 0.08
    spiky[hit] *= rng.uniform(2, 4, hit.sum())
    for values, contradicted in ((clean, False), (spiky, True)):
        ls, = label_stats([{"kl": float(x)} for x in values], None, 0.01, 0.95)
        text = "\n".join(recommendation_lines(ls, 0.01, 0.95))
        assert "log-normal tail fit" in text
        assert ("the runs contradict the tail fit" in text) is contradicted, text


def test_a_model_that_credits_a_run_more_than_the_runs_show_says_why():
    """A tester's: "a run can tell at most about 0.55 bits" and then "its
    model credits a run with 0.75 bits", unexplained, read as an
    overconfident search. Either way round the line says why."""
    from klbisect.calibrate import CostEstimate, cost_line
    more = CostEstimate(200, 0.55, 14.0, 51.6, 67, 1.0, 40, model_bits=0.75)
    assert "0.75 bits, more than the runs show: it draws runs from its fitted centres" in cost_line(more)
    less = CostEstimate(200, 0.55, 14.0, 51.6, 67, 1.0, 40, model_bits=0.35)
    assert "0.35 bits, simulating runs that differ only in their median" in cost_line(less)


def test_every_label_lists_the_thresholds_the_tests_tail_suggests():
    """A test fails when any label passes its threshold: a tester's CI line
    of 0.01 was on the moving label's rows but not on the quiet one's, whose
    own values stop at 0.004."""
    rng = np.random.default_rng(3)
    runs = [{"mean_kl": float(v), "max_kl": float(w)}
            for v, w in zip(rng.lognormal(np.log(0.0045), 0.2, 40), rng.lognormal(np.log(0.003), 0.1, 40))]
    stats_ = {ls.label: [e["threshold"] for e in ls.exceedances] for ls in label_stats(runs, None, 0.01, 0.95)}
    assert 0.01 in stats_["mean_kl"] and 0.01 not in cal.default_thresholds([r["max_kl"] for r in runs])
    assert set(stats_["(max over labels)"]) <= set(stats_["max_kl"]), stats_
    assert stats_["max_kl"] == sorted(stats_["max_kl"])


def test_few_runs_show_no_tail_percentiles():
    """p5 and p95 of three runs are lines drawn between two of them."""
    few = label_stats([{"kl": v} for v in (0.004, 0.005, 0.006)], None, 0.01, 0.95)
    text = format_calibration(Calibration("v1", "a" * 40, 3, 0, few, 0.01, 0.95))
    assert "median 0.005" in text and " p5 " not in text and " p95 " not in text, text
    many = label_stats([{"kl": 0.004 + i * 1e-4} for i in range(cal.FEW_FOR_TAILS)], None, 0.01, 0.95)
    text = format_calibration(Calibration("v1", "a" * 40, cal.FEW_FOR_TAILS, 0, many, 0.01, 0.95))
    assert " p5 " in text and " p95 " in text, text
