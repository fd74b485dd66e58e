"""decide.py with plain numbers: the learned good/bad model, clipped
likelihood ratios, SPRT verdicts, classic threshold/votes, separation."""
from __future__ import annotations

import math

import numpy as np
import pytest

from klbisect.decide import (BAD, DECISIVE_EFFECT, DEFAULT_MAX_RUNS, GAP_LR, GOOD, MIN_ENDPOINT_RUNS, contradicts,
                             OVERLAP_MAX_RUNS, OVERLAP_P, RUN_LR_CAP, SKIP,
                             UNDECIDED, VERDICT_LR, Model, ThresholdModel, endpoint_step,
                             exceedance_lower_bound,
                             exceedance_upper_bound,
                             exceedances, fmt_odds, info_per_run, judge, label_separations, labels_apart, recommend_threshold, runs_lower_bound,
                             runs_per_commit, separation, summarize, worse_tail)

CAP = math.log(RUN_LR_CAP)
GOODV = [0.004, 0.0045, 0.005, 0.0042, 0.0048, 0.0046, 0.0043]
BADV = [0.009, 0.011, 0.012, 0.010, 0.0095, 0.0105, 0.0102]


@pytest.fixture
def model() -> Model:
    return Model.fit(GOODV, BADV)


def issue_values(rng, n, bad):
    """What the acceptance probe yields: the max of three labels, one of
    which moves from U(0.003, 0.006) to U(0.007, 0.013)."""
    out = []
    for _ in range(n):
        labels = list(rng.uniform(0.003, 0.006, 2))
        labels.append(rng.uniform(0.007, 0.013) if bad else rng.uniform(0.003, 0.006))
        out.append(max(labels))
    return out


# ---- the model ---------------------------------------------------------------

def test_fit_in_log_space_around_medians(model):
    assert model.log_space
    assert model.mu_good == pytest.approx(math.log(np.median(GOODV)))
    assert model.mu_bad == pytest.approx(math.log(np.median(BADV)))
    assert model.scale > 0
    assert model.n_good == model.n_bad == 7
    assert model.centre(GOOD) == pytest.approx(np.median(GOODV))
    assert model.centre(BAD) == pytest.approx(np.median(BADV))


def test_log_space_is_scale_invariant(model):
    m10 = Model.fit(np.array(GOODV) * 10, np.array(BADV) * 10)
    assert m10.scale == pytest.approx(model.scale)
    assert m10.mu_good - model.mu_good == pytest.approx(math.log(10))
    for v in (0.003, 0.0045, 0.0067, 0.009, 0.02):
        assert m10.log_lr([10 * v])[0] == pytest.approx(model.log_lr([v])[0], abs=1e-9)


def test_boundary_is_geometric_midpoint_and_neutral(model):
    b = model.boundary()
    assert b == pytest.approx(math.sqrt(max(GOODV) * min(BADV)))  # halfway across the gap
    assert model.log_lr([b])[0] == pytest.approx(0.0, abs=1e-9)
    # monotone around it: below says good, above says bad
    assert model.log_lr([b * 0.8])[0] < 0 < model.log_lr([b * 1.25])[0]


def test_linear_space_when_a_value_is_not_positive():
    m = Model.fit([-1.0, 0.0, 1.0], [5.0, 6.0, 7.0])
    assert not m.log_space
    assert m.mu_good == pytest.approx(0.0) and m.mu_bad == pytest.approx(6.0)
    assert m.boundary() == pytest.approx(3.0)
    assert m.log_lr([0.0])[0] < 0 < m.log_lr([6.0])[0]


def test_fit_needs_both_sides():
    with pytest.raises(ValueError):
        Model.fit([], [1.0])
    with pytest.raises(ValueError):
        Model.fit([1.0], [])


def test_few_runs_mean_wide_tails():
    rng = np.random.default_rng(1)
    few = Model.fit(GOODV[:3], BADV[:3])
    many = Model.fit(list(rng.uniform(0.004, 0.005, 20)), list(rng.uniform(0.009, 0.012, 20)))
    assert few.df < many.df
    assert few.df == pytest.approx(4.0)
    assert many.df == pytest.approx(38.0)


def test_one_outlier_among_endpoint_runs_does_not_spoil_the_model(model):
    spoiled = Model.fit(GOODV + [0.5], BADV)
    # the median ignores it and the trimmed spread barely moves
    assert spoiled.mu_good == pytest.approx(np.median(np.log(GOODV + [0.5])))
    assert spoiled.scale < 2 * model.scale
    assert judge([0.0045, 0.0046], 0, spoiled, 10).decision == GOOD
    assert judge([0.011, 0.012], 0, spoiled, 10).decision == BAD


def test_to_dict_round_trip(model):
    again = Model.from_dict(model.to_dict())
    assert again == model
    t = ThresholdModel(0.01, 3)
    back = Model.from_dict(t.to_dict())
    assert isinstance(back, ThresholdModel) and back.threshold == 0.01 and back.votes == 3


# ---- clipped likelihood ratios --------------------------------------------------

def test_every_run_is_clipped(model):
    values = np.geomspace(1e-9, 1e6, 400)
    llr = model.log_lr(values)
    assert np.all(np.abs(llr) <= CAP + 1e-12)
    # clearly good and clearly bad values are worth the cap, no more
    assert model.log_lr([0.0045])[0] == pytest.approx(-CAP)
    assert model.log_lr([0.011])[0] == pytest.approx(CAP)


def test_wild_outliers_are_evidence_of_nothing(model):
    # far outside both groups the broad outlier component dominates both sides
    for v in (1.0, 1000.0, 1e-7):
        assert abs(model.log_lr([v])[0]) < 0.1


def test_empty_log_lr(model):
    assert model.log_lr([]).size == 0


# ---- SPRT verdicts ---------------------------------------------------------------

def test_one_run_cannot_decide(model):
    for v in (0.0045, 0.011, 0.013, 1.0, 100.0, 1e-6):
        v1 = judge([v], 0, model, max_runs=10)
        assert v1.decision == UNDECIDED, (v, v1)
    assert CAP < math.log(VERDICT_LR)


def test_two_agreeing_runs_decide(model):
    vb = judge([0.011, 0.012], 0, model, 10)
    assert vb.decision == BAD and vb.log_lr >= math.log(VERDICT_LR)
    assert "for bad" in vb.lr_text
    vg = judge([0.0045, 0.0044], 0, model, 10)
    assert vg.decision == GOOD and vg.log_lr <= -math.log(VERDICT_LR)
    assert "for good" in vg.lr_text
    # crashes beside them are said, and not as evidence (a tester read "is GOOD: 2 runs" under
    # three crash lines as the crashes counted)
    vc = judge([0.0045, 0.0044], 3, model, 10)
    assert vc.decision == GOOD and vc.reason.startswith("2 runs (3 more crashed, not evidence), likelihood"), vc
    assert "crashed" not in vg.reason


def test_one_outlier_never_flips_a_verdict(model):
    # a good commit with one huge value: still not bad, and good once confirmed
    assert judge([0.0045, 0.0044, 100.0], 0, model, 10).decision != BAD
    assert judge([0.0045, 0.0044, 0.0046, 100.0], 0, model, 10).decision == GOOD
    # one value that looks exactly like bad among good ones cannot flip either
    assert judge([0.0045, 0.0044, 0.0046, 0.011], 0, model, 10).decision == GOOD
    # symmetric: a bad commit with one tiny value stays bad
    assert judge([0.011, 0.012, 0.0115, 1e-6], 0, model, 10).decision == BAD
    assert judge([0.011, 0.012, 0.0115, 0.0045], 0, model, 10).decision == BAD


def test_conflicting_runs_stay_undecided_until_max_runs(model):
    v = judge([0.0045, 0.011, 0.0044, 0.012], 0, model, max_runs=10)
    assert v.decision == UNDECIDED
    capped = judge([0.0045, 0.011, 0.0044, 0.012], 0, model, max_runs=4)
    assert capped.decision == SKIP and "max-runs" in capped.reason


def test_crashes_are_never_bad(model):
    assert judge([], 1, model, 10).decision == UNDECIDED
    v = judge([], 2, model, 10, crash_limit=2)
    assert v.decision == SKIP and "crashed" in v.reason
    for crashes in range(0, 30):
        assert judge([], crashes, model, 10).decision != BAD
    # crashes around real values change nothing
    assert judge([0.011, 0.012], 7, model, 10).decision == BAD


def test_verdict_lr_is_a_parameter(model):
    lr = 1.5 * RUN_LR_CAP ** 2                 # more than two capped runs can give
    assert judge([0.011, 0.012], 0, model, 10, verdict_lr=lr).decision == UNDECIDED
    assert judge([0.011, 0.012, 0.0115], 0, model, 10, verdict_lr=lr).decision == BAD


def test_sprt_on_issue_noise_is_right():
    """The acceptance noise, seeded: every verdict reached is right."""
    rng = np.random.default_rng(7)
    m = Model.fit(issue_values(rng, 5, False), issue_values(rng, 5, True))
    wrong = 0
    for trial in range(300):
        bad = trial % 2 == 1
        vals: list[float] = []
        while True:
            vals += issue_values(rng, 1, bad)
            v = judge(vals, 0, m, max_runs=10)
            if v.decision != UNDECIDED:
                break
        wrong += v.decision == (GOOD if bad else BAD)
    assert wrong == 0


# ---- classic mode: threshold and votes ------------------------------------------

def test_threshold_single_vote():
    t = ThresholdModel(0.01, votes=1)
    assert judge([0.02], 0, t, 10).decision == BAD
    assert judge([0.01], 0, t, 10).decision == BAD        # "at or above"
    assert judge([0.0099], 0, t, 10).decision == GOOD
    assert t.boundary() == 0.01


def test_threshold_votes_give_a_commit_no_evidence_until_its_majority():
    m = ThresholdModel(0.01, votes=5)
    assert m.commit_log_lr([0.02]) == 0.0 and m.commit_log_lr([0.02, 0.02, 0.02, 0.02]) == 0.0
    assert m.commit_log_lr([0.02, 0.005, 0.02, 0.005, 0.02]) > 0          # 3 of 5 fail
    assert m.commit_log_lr([0.02, 0.005, 0.005, 0.005, 0.02, 0.02, 0.02]) < 0   # the first five decide
    assert ThresholdModel(0.01).commit_log_lr([0.02]) > 0                  # one vote: one run


def test_threshold_majority_of_votes():
    t = ThresholdModel(0.01, votes=3)
    assert judge([0.02], 0, t, 10).decision == UNDECIDED
    assert judge([0.02, 0.001], 0, t, 10).decision == UNDECIDED
    assert judge([0.02, 0.001, 0.03], 0, t, 10).decision == BAD
    assert judge([0.001, 0.002], 0, t, 10).decision == GOOD
    assert judge([0.02, 0.001, 0.002], 0, t, 10).decision == GOOD
    assert judge([], 2, t, 10).decision == SKIP


def test_threshold_log_lr_signs():
    t = ThresholdModel(0.01)
    llr = t.log_lr([0.001, 0.02])
    assert llr[0] < 0 < llr[1]
    assert math.isnan(t.effect)


# ---- separation of the endpoints -------------------------------------------------

def test_separated_endpoints():
    rng = np.random.default_rng(3)
    g, b = list(rng.uniform(0.003, 0.006, 5)), list(rng.uniform(0.007, 0.013, 5))
    s = separation(g, b)
    assert s.separated and s.p_value <= 0.05 and s.direction == "up" and s.effect > 1
    assert s.good["n"] == 5 and s.bad["n"] == 5
    assert s.good["median"] == pytest.approx(np.median(g))


def test_regression_downwards_is_detected():
    s = separation(BADV, GOODV)
    assert s.separated and s.direction == "down"


def test_identical_endpoints_do_not_separate():
    s = separation(GOODV, GOODV)
    assert not s.separated and s.p_value > 0.05
    assert not separation([0.005] * 6, [0.005] * 6).separated


def test_odds_past_a_million_are_not_printed_as_a_precise_number():
    assert fmt_odds(math.log(40)) == "40:1 for bad" and fmt_odds(-math.log(500)) == "500:1 for good"
    assert fmt_odds(-41.5) == "over 1e+06:1 for good"    # a tester's "1.03e+18:1 for good"


def test_interleaved_endpoints_do_not_separate():
    g = [0.0040, 0.0050, 0.0060, 0.0045, 0.0055]
    b = [0.0042, 0.0052, 0.0058, 0.0047, 0.0053]
    assert not separation(g, b).separated


def test_one_label_apart_while_the_max_is_not():
    rng = np.random.default_rng(4)
    noisy = lambda n: list(rng.uniform(0.002, 0.02, n))     # noqa: E731 - sets every run's max
    good = {"a": noisy(30), "b": noisy(30), "c": list(rng.uniform(0.0040, 0.0045, 30))}
    bad = {"a": noisy(30), "b": noisy(30), "c": list(rng.uniform(0.0047, 0.0052, 30))}
    maxes = lambda d: [max(v) for v in zip(*d.values())]    # noqa: E731
    assert not separation(maxes(good), maxes(bad)).separated
    apart = labels_apart(good, bad)
    assert [lab for lab, _ in apart] == ["c"] and apart[0][1] < 1e-6
    # looking at many labels is paid for: a p that one label alone would pass does not pass among 50
    assert labels_apart({"x": [1.0, 2.0, 3.0, 4.0]}, {"x": [5.0, 6.0, 7.0, 8.0]}, alpha=0.05)
    many = {f"l{i}": [1.0, 2.0, 3.0, 4.0] for i in range(50)}
    assert labels_apart(many, {k: [5.0, 6.0, 7.0, 8.0] for k in many}, alpha=0.05) == []
    # every label's own p, most apart first, whether or not it passes; one run a side is no test
    seps = label_separations({**good, "d": [1.0, 2.0]}, {**bad, "d": [5.0]})
    assert [lab for lab, _ in seps][0] == "c" and len(seps) == 3 and seps[1][1] > 0.01


def test_too_few_runs_do_not_separate():
    assert not separation([0.004], [0.011, 0.012]).separated
    assert not separation([], []).separated


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_constant_but_different_endpoints_separate():
    s = separation([0.004] * 3, [0.011] * 3)
    assert s.separated and s.direction == "up"


def test_bad_run_just_past_the_good_runs_counts_for_bad():
    """A skewed, wide bad side: six runs put its fitted centre far from its
    near edge. A run above every good run and inside the bad runs' range is
    bad evidence, whatever the fitted tails say."""
    good = np.exp([-5.37, -5.35, -5.64, -5.46, -5.34, -5.41])
    bad = np.exp([-3.98, -5.08, -4.10, -3.95, -4.21, -4.05])
    m = Model.fit(good, bad)
    assert m.decisive
    near_edge, in_gap_high, in_gap_low, typical_good = m.log_lr(np.exp([-5.02, -5.12, -5.30, -5.45]))
    assert near_edge == pytest.approx(math.log(RUN_LR_CAP))
    assert 0 < in_gap_high < math.log(RUN_LR_CAP)
    assert -math.log(RUN_LR_CAP) < in_gap_low < 0
    assert typical_good == pytest.approx(-math.log(RUN_LR_CAP))


def test_overlapping_endpoints_start_the_search_on_a_hint():
    """Overlapping sides: 10 runs each, then ready at p <= OVERLAP_P; the
    search measures the endpoints again when that is worth most."""
    rng = np.random.default_rng(11)
    g, b = list(rng.normal(0, 1, 6)), list(rng.normal(0.8, 1, 6))
    g, b = [math.exp(x * 0.26 - 6.2) for x in g], [math.exp(x * 0.26 - 6.2) for x in b]
    step = endpoint_step(g, b)
    assert step.action == "more" and step.more_good == step.more_bad == 4
    g += [math.exp(x * 0.26 - 6.2) for x in rng.normal(0, 1, 4)]
    b += [math.exp(x * 0.26 - 6.2) for x in rng.normal(0.8, 1, 4)]
    step = endpoint_step(g, b)
    assert (step.action == "ready") == (step.separation.p_value <= OVERLAP_P)


def test_endpoints_without_a_difference_fail_only_at_the_cap():
    rng = np.random.default_rng(5)
    g, b = list(rng.uniform(1, 2, 12)), list(rng.uniform(1, 2, 12))
    step = endpoint_step(g, b, n_max=12)
    assert step.separation.p_value > OVERLAP_P and step.action == "fail"
    assert endpoint_step(g, b, n_max=13).action == "more"


def test_two_runs_a_side_far_apart_start_a_pooled_search_but_not_a_verdict_per_commit():
    """``--endpoint-runs 2``: `run` pools interior runs into each side, so
    two runs a side that separate widely may start it; `start` judges each
    commit on its own and measures both endpoints on to DECISIVE_RUNS."""
    g, b = [0.0042, 0.0047], [0.0105, 0.0118]
    m = Model.fit(g, b)
    assert m.separates and not m.decisive
    assert endpoint_step(g, b, 2).action == "ready"
    per_commit = endpoint_step(g, b, 2, pooled=False)
    assert (per_commit.action, per_commit.more_good, per_commit.more_bad) == ("more", 4, 4)


def test_a_few_runs_that_do_not_separate_yet_step_up_one_a_side():
    g, b = [0.0042, 0.0098], [0.0105, 0.0118]        # a good run close to the bad ones
    step = endpoint_step(g, b, 2)
    assert (step.action, step.more_good, step.more_bad) == ("more", 1, 1)
    step = endpoint_step(g + [0.0045], b, 2)          # only the side behind catches up
    assert (step.action, step.more_good, step.more_bad) == ("more", 0, 1)
    # the default first batch never takes the few-runs path
    assert endpoint_step(g, b).more_good == MIN_ENDPOINT_RUNS - 2


def test_a_max_endpoint_runs_under_decisive_runs_ends_in_fail_not_more_runs():
    g, b = [0.005, 0.0051, 0.0049], [0.005, 0.0052, 0.0048]
    step = endpoint_step(g, b, 2, n_max=3)
    assert step.action == "fail" and step.separation is not None


def test_runs_per_commit_default_follows_the_model():
    assert runs_per_commit(Model.fit(GOODV, BADV)) == DEFAULT_MAX_RUNS
    overlapping = Model.fit([1.0, 1.2, 1.1, 1.3, 0.9], [1.1, 1.3, 1.2, 1.4, 1.0])
    assert not overlapping.decisive and runs_per_commit(overlapping) == OVERLAP_MAX_RUNS
    assert runs_per_commit(overlapping, 7) == 7


# ---- calibration helpers -----------------------------------------------------------

def test_summarize():
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s["n"] == 5 and s["median"] == 3.0 and s["min"] == 1.0 and s["max"] == 5.0
    assert summarize([]) == {"n": 0}


def test_exceedances_and_bounds():
    assert exceedances([0.001, 0.02, 0.03], [0.01, 0.025]) == [(0.01, 2, 3), (0.025, 1, 3)]
    assert exceedance_upper_bound(0, 0) == 1.0
    ub = exceedance_upper_bound(0, 100)
    assert 0 < ub < 0.05
    assert exceedance_upper_bound(1, 100) > ub
    # a bad commit that failed all 40 runs fails at least 0.05 ** (1/40) = 92.8% of the time
    assert exceedance_lower_bound(40, 40) == pytest.approx(0.05 ** (1 / 40))
    assert exceedance_lower_bound(0, 40) == 0.0 == exceedance_lower_bound(0, 0)
    assert exceedance_lower_bound(26, 40) < 26 / 40 < exceedance_upper_bound(26, 40)


def test_recommend_threshold():
    rng = np.random.default_rng(0)
    vals = list(rng.uniform(0.003, 0.006, 500))
    t, how = recommend_threshold(vals, false_fail_rate=0.01)
    assert t is not None and t >= np.percentile(vals, 99) and "order statistic" in how
    t2, how2 = recommend_threshold(vals[:20], false_fail_rate=0.01)
    assert t2 is not None and t2 > max(vals[:20]) and "log-normal" in how2
    assert recommend_threshold([])[0] is None


def test_bits_read_from_the_runs_not_from_the_capped_model():
    from klbisect.decide import sample_bits
    rng = np.random.default_rng(3)
    good, bad = rng.uniform(0.003, 0.006, 30), rng.uniform(0.007, 0.013, 30)
    assert sample_bits(good, bad) == (1.0, True)          # never overlapping: the full bit
    assert info_per_run(Model.fit(good, bad)) < 1.0          # the search's own weight is capped
    near = sample_bits(rng.lognormal(-6, 0.26, 300), rng.lognormal(-6 + 0.22, 0.26, 300))
    same = sample_bits(rng.lognormal(-6, 0.26, 300), rng.lognormal(-6, 0.26, 300))
    assert not near[1] and 0.05 < near[0] < 0.4 and same[0] < near[0]
    assert np.isnan(sample_bits([0.004], [0.008])[0])


def test_information_and_lower_bound(model):
    bits = info_per_run(model)
    assert 0 < bits <= 1
    assert runs_lower_bound(1000, bits) > runs_lower_bound(1000, 1.0) > 0
    assert runs_lower_bound(1000, 0) == float("inf")
    assert math.isnan(info_per_run(ThresholdModel(0.01)))


def test_a_good_run_reaching_into_the_bad_runs_is_no_outlier():
    """Six runs each of an overlapping regression: one good run among the bad
    ones, the rest apart. That is what overlap looks like, not an outlier,
    so the plug-in model must not take over; a 3x outlier beyond every bad
    run is still set aside."""
    good = [1.49e-3, 1.61e-3, 1.49e-3, 1.68e-3, 1.80e-3, 3.16e-3]
    bad = [4.12e-3, 2.04e-3, 2.00e-3, 3.48e-3, 2.69e-3, 2.80e-3]
    assert not Model.fit(good, bad).decisive
    apart = [4.12e-3, 3.04e-3, 3.00e-3, 3.48e-3, 2.69e-3, 2.80e-3]
    assert Model.fit(good[:5] + [3 * 4.12e-3], apart).decisive


def test_a_gap_narrower_than_the_spread_is_not_decisive():
    """Six runs each of a log-normal regression can leave a gap by chance; a
    gap well under one run-to-run spread is what a tail about to reach
    across looks like (the benchmark's ``--model`` log-normal x1.6-2.5 named
    wrong commits 1 trial in 160 when such a gap counted as clean)."""
    good = [2.89e-3, 3.44e-3, 3.81e-3, 4.21e-3, 4.65e-3, 5.54e-3]
    bad = [6.43e-3, 7.66e-3, 8.47e-3, 9.36e-3, 10.34e-3, 12.32e-3]   # 3.3 spreads apart, gap 0.6
    m = Model.fit(good, bad)
    assert m.effect > DECISIVE_EFFECT and not m.decisive
    assert Model.fit(good, [1.1 * v for v in bad]).decisive              # gap 0.9 spreads


def test_a_far_outlier_neither_stretches_the_bad_range_nor_decides():
    """Heavy tails: one bad endpoint run 5x the rest must not widen the range
    where a run counts 40:1 for bad, and a good run's 4x outlier, far beyond
    every bad run, is weak evidence either way."""
    good = [5.9e-3, 5.1e-3, 5.3e-3, 5.2e-3, 5.7e-3, 5.4e-3, 5.2e-3, 4.8e-3, 4.8e-3]
    bad = [10.2e-3, 7.9e-3, 7.5e-3, 7.4e-3, 11.6e-3, 11.2e-3, 7.0e-3, 55.0e-3, 7.8e-3, 7.7e-3]
    m = Model.fit(good, bad)
    assert m.decisive
    assert math.exp(m.bad_range[1]) == pytest.approx(11.6e-3)
    inside, far = m.log_lr([9.0e-3, 23.0e-3])
    assert inside == pytest.approx(math.log(RUN_LR_CAP))
    assert 0 <= far <= math.log(GAP_LR)


def test_good_runs_landing_among_the_bad_ones_lower_what_one_run_counts_for():
    """An outlier-prone metric: 3 of 30 good runs (seen at commits the search
    has placed) landed among the bad runs. Two bad-looking runs at one
    commit are then a 1-in-200 accident of a good commit, not 1 in 1,600,
    and must not settle it; without such strays they do."""
    rng = np.random.default_rng(5)
    good = list(rng.uniform(0.0035, 0.0055, 27))
    bad = list(rng.uniform(0.008, 0.013, 10))
    clean = Model.fit(good, bad, strays_within=True)
    assert clean.bad_cap == RUN_LR_CAP
    assert judge([0.0115, 0.011], 0, clean, 10).decision == BAD
    strays = Model.fit(good + [0.0112, 0.0118, 0.0121], bad, strays_within=True)
    assert strays.disjoint
    assert 3.0 < strays.bad_cap < RUN_LR_CAP / 2
    assert strays.good_cap == RUN_LR_CAP
    assert judge([0.0115, 0.011], 0, strays, 10).decision == UNDECIDED
    assert judge([0.0115, 0.011, 0.0112], 0, strays, 10).decision == BAD
    assert Model.from_dict(strays.to_dict()).bad_cap == strays.bad_cap


def test_a_run_above_every_run_seen_counts_for_less_than_one_among_them(model):
    """Past the largest of n bad runs a bad commit lands 1 time in n + 1,
    whatever its distribution: a good commit's outlier there is no 40:1
    evidence (two such outliers named a wrong commit on a 5%-outlier
    model). Outliers of a divergence are large values, so this holds above
    every run seen, whichever side is on top."""
    inside, beyond = model.log_lr([0.011, 0.014])
    assert inside == pytest.approx(CAP)
    assert 0 < beyond <= math.log(RUN_LR_CAP / (len(BADV) + 1)) + 1e-9
    assert judge([0.014, 0.0135], 0, model, 10).decision == UNDECIDED
    # below every good run only good runs go: a strong good run still
    assert model.log_lr([0.0036])[0] == pytest.approx(-CAP)
    # a regression that lowers the metric: above every good run, weak for good
    down = Model.fit(BADV, GOODV)
    assert down.log_lr([0.011])[0] == pytest.approx(-CAP)
    assert -math.log(RUN_LR_CAP / (len(BADV) + 1)) - 1e-9 <= down.log_lr([0.014])[0] < 0


def test_a_model_stored_before_the_robust_spread_keeps_its_old_fence():
    """A session saved by an older klbisect has no ``mad``: its fence stays
    four of the wider side's spreads past the outer centre, so resuming it
    judges the runs already stored as it did."""
    rng = np.random.default_rng(3)
    m = Model.fit(list(np.exp(-6 + 0.25 * rng.standard_normal(10))),
                  list(np.exp(-5.2 + 0.25 * rng.standard_normal(10))))   # 3 spreads apart
    old = m.to_dict()
    del old["mad"]
    lo, hi = Model.from_dict(old).fence()
    s = 4 * max(m.scale_good, m.scale_bad)
    assert math.log(lo) == pytest.approx(min(m.mu_good, m.mu_bad) - s)
    assert math.log(hi) == pytest.approx(max(m.mu_good, m.mu_bad) + s)
    assert Model.from_dict(m.to_dict()).fence() == m.fence() != (lo, hi)


def test_runs_whose_middle_values_nearly_tie_do_not_shrink_the_fence_into_the_bulk():
    """Six runs a side put each median between the middle two, so when
    those nearly tie, most residuals are tiny and their MAD says the runs
    barely vary. The differences between runs of a side still see the
    spread, and keep the fence past the bulk."""
    z = np.array([-1.5, -0.06, -0.02, 0.02, 0.06, 1.5])        # in units of 0.25 log
    good, bad = np.exp(-5.5 + 0.25 * z), np.exp(-5.5 + math.log(2) + 0.25 * z)
    resid_mad = 1.4826 * np.median(np.abs(np.concatenate([0.25 * z, 0.25 * z])))
    m = Model.fit(list(good), list(bad))
    assert resid_mad < 0.05 and 0.2 < m.mad < 0.4
    lo, hi = m.fence()
    assert lo < good.min() and hi > bad.max() * math.exp(0.4)


def test_half_of_six_bad_endpoint_runs_spiking_stay_past_the_fence():
    """Three of six bad endpoint runs spiked x6-8, so the bad side's
    residuals are half spikes and its spread says little about the bulk.
    The good side, clean of the regression, caps the fence's unit: every
    spike lies past the fence and every ordinary run inside it (measured
    in the pooled spread, the fence reached 0.18 and held all three)."""
    good = [0.0036, 0.0040, 0.0043, 0.0038, 0.0045, 0.0041]
    bad = [0.0039, 0.0044, 0.0037, 0.024, 0.028, 0.030]
    lo, hi = Model.fit(good, bad).fence()
    assert lo < min(good + bad) and max(good + bad[:3]) * 1.5 < hi < min(bad[3:])


def test_a_nan_run_counts_for_bad_unless_good_runs_print_nan_too():
    """A commit whose runs print nan (an overflow) fails the KL test: with
    finite endpoints its runs are judged bad in a few runs, not left at
    'undecided after 10 runs' because the stand-in sits far in both tails."""
    from klbisect.metric import NONFINITE
    rng = np.random.default_rng(4)
    good, bad = rng.uniform(0.003, 0.006, 6), rng.uniform(0.007, 0.013, 6)
    m = Model.fit(good, bad)
    assert m.nan_good == 0
    runs = []
    for _ in range(DEFAULT_MAX_RUNS):
        runs.append(NONFINITE)
        v = judge(runs, 0, m, None)
        if v.decision != "undecided":
            break
    assert v.decision == BAD and len(runs) <= 4, (v, len(runs))
    assert Model.from_dict(m.to_dict()).nan_good == 0
    # nan on a good endpoint run: a nan is no longer a sign of the regression by itself
    flaky = Model.fit([*good[:5], NONFINITE], bad)
    assert flaky.nan_good == 1 and Model.from_dict(flaky.to_dict()).nan_good == 1
    assert float(flaky.log_lr([NONFINITE])[0]) < float(m.log_lr([NONFINITE])[0])


def test_endpoints_close_for_their_spread_are_not_said_to_overlap():
    """All good runs below all bad ones, but under three spreads apart: the
    words must not claim the runs overlap."""
    good = [0.0031, 0.0036, 0.0042, 0.0047, 0.0052, 0.0058, 0.0060, 0.0044, 0.0039, 0.0055]
    bad = [0.0071, 0.0076, 0.0083, 0.0090, 0.0096, 0.0104, 0.0112, 0.0122, 0.0079, 0.0093]
    m = Model.fit(good, bad)
    assert m.disjoint and not m.separates, (m.disjoint, m.effect)
    assert "overlap" not in m.contact and "overlap" not in m.regime
    m2 = Model.fit([0.003, 0.008, 0.004, 0.006], [0.005, 0.009, 0.007, 0.010])
    assert not m2.disjoint and "overlap" in m2.contact


def test_the_direction_check_names_no_change_when_the_endpoints_barely_differ():
    """A hint (p <= 0.2) the better way is most likely no change at all,
    not a fix: the message says so before it suggests --worse."""
    from klbisect.decide import separation
    from klbisect.errors import KlbisectError
    from klbisect.config import BisectConfig
    from klbisect.labels import check_direction
    cfg = BisectConfig(good="a", bad="b", probe_cmd="true")
    clear = separation([0.012, 0.013, 0.0125, 0.0128, 0.0131, 0.0122], [0.004, 0.0042, 0.0039, 0.0041, 0.0043, 0.0038])
    with pytest.raises(KlbisectError) as e:
        check_direction(cfg, clear)
    assert e.value.code == 154 and "the range holds a fix" in e.value.message
    hint = separation([0.0050, 0.0046, 0.0052, 0.0041, 0.0048, 0.0044, 0.0049, 0.0043, 0.0051, 0.0047],
                      [0.0045, 0.0042, 0.0049, 0.0039, 0.0046, 0.0041, 0.0047, 0.0040, 0.0048, 0.0043])
    assert 0.05 < hint.p_value <= 0.2 and hint.direction == "down"
    with pytest.raises(KlbisectError) as e:
        check_direction(cfg, hint)
    assert "most likely there is no regression" in e.value.message and "fix" not in e.value.message
    check_direction(BisectConfig(good="a", bad="b", probe_cmd="true", worse="lower"), clear)   # no error


def test_a_verdict_on_overlapping_sides_is_not_the_plugged_in_fit_alone():
    """`klbisect probe` on a 1.45x shift at a 0.23 spread (max of three
    labels, 3% outliers), ten endpoint runs a side: the fitted model's
    verdicts at 500:1 were wrong several times in 200, and git then named a
    wrong commit. Judged against the runs themselves too, none is."""
    import random

    from klbisect.decide import PredictiveModel
    rng = random.Random(7)

    def draw(bad):
        vals = [m * (1.45 if bad and k == 1 else 1.0) * math.exp(rng.gauss(0, 0.23))
                * (rng.uniform(3, 10) if rng.random() < 0.03 else 1.0)
                for k, m in enumerate((0.0030, 0.0045, 0.0038))]
        return max(vals)

    wrong = {"plugin": 0, "predictive": 0}
    for t in range(200):
        truth_bad = t % 2 == 0
        g, b = [draw(False) for _ in range(10)], [draw(True) for _ in range(10)]
        fitted = Model.fit(g, b)
        runs = [draw(truth_bad) for _ in range(100)]
        for kind in wrong:
            model = fitted if kind == "plugin" or fitted.separates else PredictiveModel(tuple(g), tuple(b), fitted)
            n = 0
            while (v := judge(runs[:n], 0, model, 100)).decision == "undecided":
                n += 1
            wrong[kind] += v.decision == ("good" if truth_bad else "bad")
    assert wrong["plugin"] >= 3 and wrong["predictive"] == 0, wrong


def test_runs_measured_now_that_read_against_a_commits_earlier_runs_contradict_them(model):
    """A commit measured good by an earlier session reads bad now, run after
    run: the environment changed (decide.contradicts); one stray, or new
    runs that agree, do not."""
    earlier_good = [0.0040, 0.0045, 0.0050, 0.0042]
    assert contradicts(model, earlier_good, [0.0110, 0.0120])
    assert not contradicts(model, earlier_good, [0.0110])                  # one run is not enough
    assert not contradicts(model, earlier_good, [0.0110, 0.0044])          # one of them agrees
    assert not contradicts(model, earlier_good, [0.0041, 0.0047])
    assert not contradicts(model, [], [0.0110, 0.0120])                    # nothing earlier to contradict
    assert contradicts(model, [0.0110, 0.0120, 0.0105], [0.0040, 0.0045])  # and the other way
    # forty earlier runs: two new ones above them all differ by rank, even where the
    # model weighs each at less than 3:1 (between the good and the bad runs)
    forty = list(np.linspace(0.0038, 0.0060, 40))
    gap = [0.0068, 0.0070]
    assert all(abs(model.commit_log_lr([v])) < math.log(3) for v in gap)
    assert contradicts(model, forty, gap)
    # two at the top of the earlier runs: one more run, which settles it
    assert contradicts(model, forty, [0.0059, 0.0060]) is None
    assert contradicts(model, forty, [0.0059, 0.0060, 0.0047]) is False
    # leaning the other way without proof yet: one more run (None), then an answer
    assert contradicts(model, forty, [0.0080, 0.0058]) is None
    assert contradicts(model, forty, [0.0080, 0.0058, 0.0050, 0.0045]) is False
    # two earlier runs, too few for ranks: new runs that weigh 1000:1 against them together
    # contradict them, though one of them sits between the sides (each-run 3:1 let this pass)
    two = [0.0045, 0.0050]
    assert contradicts(model, two, [0.0120, 0.0075]) is None
    assert contradicts(model, two, [0.0120, 0.0075, 0.0110]) is True
    # new runs lower in the bad range than the earlier twelve, each still plainly bad: the
    # same side, not a changed environment (by rank alone they read "toward good" at
    # p < 0.005, and a right answer stopped with 154 in 1 of 21 of a tester's sessions)
    seed = Model.fit([0.0050, 0.0055, 0.0058, 0.0047, 0.0059, 0.0053, 0.0056, 0.0052],     # max of U(.003, .006)
                     [0.0075, 0.0090, 0.0120, 0.0105, 0.0081, 0.0128, 0.0098, 0.0112])    # U(.007, .013)
    twelve = [0.0112, 0.0118, 0.0123, 0.0081, 0.0126, 0.0109, 0.0115, 0.0120, 0.0104, 0.0111, 0.0125, 0.0117]
    low_bad = [0.007813, 0.00869, 0.007583, 0.007335]
    assert seed.commit_log_lr(low_bad) > math.log(1000)
    assert contradicts(seed, twelve, low_bad) is False
    assert contradicts(seed, twelve, [0.0052, 0.0049]) is True       # runs that read good do
    # new runs between the sides, above every earlier run: the model may weigh them either
    # way (a fit to few endpoint runs is least sure there), the ranks are clear
    ten = list(np.linspace(0.0043, 0.0059, 10))
    between = [0.0070, 0.0090, 0.0074]
    assert contradicts(model, ten, between[:2]) is None
    assert contradicts(model, ten, between) is True
    unsure = Model.fit(GOODV + [0.0058, 0.0055], [0.011, 0.012, 0.0115, 0.0125, 0.0118, 0.0122, 0.0113])
    assert unsure.commit_log_lr([0.0070, 0.0072]) < 0           # this fit calls them good
    assert contradicts(unsure, ten, [0.0070, 0.0072, 0.0071]) is True
    # ... and nearer the earlier side than the earlier runs are is no contradiction
    assert contradicts(model, ten, [0.0040, 0.0041, 0.0040, 0.0042]) is False
    # earlier runs that hardly lean either way are nothing to contradict
    assert contradicts(model, [0.0065], [0.0110, 0.0120, 0.0115]) is False


def test_worse_tail_counts_runs_far_past_every_good_one_the_worse_way():
    """Spikes of a bad commit, five times a good run, against the good runs'
    own spread; a bad run just past the good max is not one; an accuracy's
    spikes point down."""
    rng = np.random.default_rng(5)
    good = list(0.004 * np.exp(0.1 * rng.standard_normal(20)))
    bad = list(0.0035 * np.exp(0.1 * rng.standard_normal(20)))
    assert worse_tail(good, bad) == 0
    assert worse_tail(good, bad + [max(good) * 5, max(good) * 4]) == 2
    assert worse_tail(good, bad + [max(good) * 1.05]) == 0
    assert worse_tail(good, bad + [max(good) * 5], "lower") == 0
    acc_good = list(0.8 + 0.005 * rng.standard_normal(20))
    assert worse_tail(acc_good, [0.79, 0.81, 0.5], "lower") == 1
    assert worse_tail(acc_good, [0.79, 0.81, 0.5]) == 0
    assert worse_tail([0.004], [0.1]) == 0              # one good run shows no spread
