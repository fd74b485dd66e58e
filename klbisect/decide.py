"""Judge commits from their runs: what good and bad look like, and how sure.

Pure numpy/scipy. Values are modelled in log space when they are all
positive (KL values are positive and skewed). Good and bad are Student-t
distributions around their medians with one pooled robust scale: the
predictive distribution of a new value when the spread is estimated from few
runs, so two endpoint runs give wide tails and twenty give nearly normal
ones. A broad outlier component and a per-run clip on the likelihood ratio
mean one wild value can never decide, or flip, a verdict alone.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np

from .metric import broke

RUN_LR_CAP = 40.0        # no single run counts for more than 40:1 (a verdict needs two)
VERDICT_LR = 500.0       # a verdict needs 500:1 (so at least two agreeing runs)
OUTLIER_WEIGHT = 0.02
OUTLIER_SCALE = 3.0      # in log space: covers values 20x off either way
MIN_ENDPOINT_RUNS = 6    # runs per endpoint before the first look
DECISIVE_RUNS = 6        # runs per side (endpoint and pooled interior) before the plug-in model may answer
DECISIVE_EFFECT = 3.0    # endpoints this far apart, with no overlap, are judged by the plug-in model
GAP_FLOOR = 0.2
PRIOR_RUNS = 3           # weight of the pooled spread in each side's own spread
OVERLAP_ENDPOINT_RUNS = 10  # overlapping endpoints anchor every later judgement: measure them well
MAX_ENDPOINT_RUNS = 40   # a 0.7-spread shift needs ~40 per side to show reliably
SEPARATION_P = 0.05
DEFAULT_MAX_RUNS = 10    # runs per commit when one run nearly decides it
OVERLAP_MAX_RUNS = 100   # and when they overlap: a 0.7-spread shift can need that many
# --confidence above this is refused: the search stops asking a commit whose
# side is certain to 1e-6 (search.Posterior.choose), so a mark past 1 - 1e-5
# is never met and the search gives up (at 0.999999 on 30% of clean bisects)
MAX_CONFIDENCE = 0.99999
MAX_TOTAL_RUNS = 2000     # a safety stop for a whole search: overlapping sides need a few hundred runs
UNDECIDED_LIMIT = 2      # commits `probe` left undecided at --max-runs before it stops git bisect
OVERLAP_P = 0.2          # enough of a hint to start an integrated search (endpoint_step)
DISJOINT_MARGIN = 0.75   # "disjoint" needs a gap of this many spreads between the closest runs
#                          (0.25 let log-normal tails reach across a gap that looked clean)
GAP_LR = 3.0             # the most a run between the good and the bad runs counts for
STRAY_SHARE = 0.15       # ... once this share of each side's runs (at least one) is set aside
CAP_PRIOR_RUNS = 20.0    # the 1/RUN_LR_CAP stray rate counts as this many runs (Model.fit)
FENCE_SPREADS = 4.0      # Model.fence: runs this far past both centres are outliers to the integrated search
FENCE_CENTRE_REACH = 2.0  # ... the bad centre counted at most this many spreads from the good one
PAIR_SPREAD_FLOOR = 0.7   # Model.mad is at least this share of _pair_spread
PAIR_SPREAD_MOST = 200    # _pair_spread: runs per side it compares pairwise (200 -> 19,900 pairs)

GOOD, BAD, UNDECIDED, SKIP = "good", "bad", "undecided", "skip"
STALE_CHECK_RUNS = 2     # runs of its own a session takes at a boundary commit measured only by earlier ones
STALE_RUN_LR = 3.0       # ... earlier runs leaning one way this far can be contradicted,
STALE_SUM_LR = 1000.0    # ... by new runs weighing this much against them together,
STALE_P = 0.005          # ... or sitting nearer the other side than they do, by rank, at this one-sided p;
STALE_SUSPECT_P = 0.05   # ... at this p (or STALE_RUN_LR:1 against), with fewer than STALE_MAX_RUNS, one more run
STALE_MAX_RUNS = 4
UNDECIDED_SKIP = "undecided after"   # how judge's reason for a skip at --max-runs starts


def _stats():
    # scipy.stats costs ~2 s to import; `klbisect probe` runs once per commit
    # and needs only the closed-form densities below.
    from scipy import stats  # noqa: PLC0415
    return stats


def _t_logpdf(y: np.ndarray, df: float, loc: float, scale: float) -> np.ndarray:
    z = (y - loc) / scale
    return (math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
            - math.log(scale) - (df + 1) / 2 * np.log1p(z * z / df))


def _norm_logpdf(y: np.ndarray, loc: float, scale: float) -> np.ndarray:
    z = (y - loc) / scale
    return -0.5 * z * z - math.log(scale) - 0.5 * math.log(2 * math.pi)


def _arr(values: Iterable[float]) -> np.ndarray:
    return np.asarray(list(values), dtype=float)


@dataclass
class Model:
    """What good and bad runs look like, learned from known-good and known-bad runs."""

    log_space: bool
    mu_good: float
    mu_bad: float
    scale: float
    df: float
    n_good: int = 0
    n_bad: int = 0
    cap: float = RUN_LR_CAP
    kind: str = "learned"
    # Each side's own spread (shrunk towards the pooled one for few runs):
    # a regression often widens the distribution as well as moving it.
    scale_good: float = 0.0
    scale_bad: float = 0.0
    disjoint: bool = False   # no good endpoint run on the bad side of any bad one
    # (min, max) of the good and of the bad runs, transformed, strays left out:
    # set when disjoint, so a run is judged by where it falls among them.
    good_range: tuple = ()
    bad_range: tuple = ()
    # The most one run counts for bad (a value in the bad range) and for good:
    # ``cap`` unless the good runs themselves land in the bad range more often
    # than 1 in ``cap`` (or bad runs in the good range). 0 means ``cap``.
    bad_cap: float = 0.0
    good_cap: float = 0.0
    # The runs' median absolute deviation from their own side's centre (as
    # a normal's sigma), both sides pooled, floored by PAIR_SPREAD_FLOOR of
    # _pair_spread: what the fence is measured in, since spikes or outliers
    # in a handful of runs inflate a standard deviation. 0: not recorded.
    mad: float = 0.0
    # Good endpoint runs that printed nan/inf (metric.NONFINITE): while
    # there are none, a nan run counts for bad like a value past every bad
    # run (a nan KL fails the test; its stand-in is far out in the tails,
    # where both sides' outlier components make it evidence of nothing).
    nan_good: int = 0

    @classmethod
    def fit(cls, good: Sequence[float], bad: Sequence[float], cap: float | None = None,
            strays_within: bool = False) -> "Model":
        cap = RUN_LR_CAP if cap is None else cap
        g, b = _arr(good), _arr(bad)
        if len(g) < 1 or len(b) < 1:
            raise ValueError("need at least one good and one bad value")
        log_space = bool(np.all(g > 0) and np.all(b > 0))
        tg, tb = _transform(g, log_space), _transform(b, log_space)
        mu_g, mu_b = float(np.median(tg)), float(np.median(tb))
        resid = np.concatenate([tg - mu_g, tb - mu_b])
        n = len(g) + len(b)
        # A handful of runs can bunch up by chance: no side is trusted to be
        # narrower than a fifth of the gap between the centres.
        floor = max(GAP_FLOOR * abs(mu_b - mu_g), 1e-3 if log_space else 1e-12)
        pooled = max(_pooled_scale(resid, n - 2), floor)
        # Predictive spread for a new value: sigma * sqrt(1 + 1/n_group).
        inflate = math.sqrt(1.0 + 2.0 / n)

        def own(r: np.ndarray) -> float:
            k = PRIOR_RUNS  # the pooled spread counts as this many runs of each side
            raw = _pooled_scale(r, max(len(r) - 1, 1)) if len(r) > 1 else pooled
            return math.sqrt((len(r) * max(raw, floor) ** 2 + k * pooled ** 2) / (len(r) + k)) * inflate

        disjoint, g_range, b_range = _ranges(tg, tb, DISJOINT_MARGIN * pooled, strays_within)
        bad_cap = good_cap = cap
        if disjoint:
            bad_cap = _stray_cap(np.sum((tg >= b_range[0]) & (tg <= b_range[1])), len(tg), cap)
            good_cap = _stray_cap(np.sum((tb >= g_range[0]) & (tb <= g_range[1])), len(tb), cap)
        # Not floored by the gap: spikes that pulled the bad median out would
        # widen the fence around them. The residuals' MAD of six runs a side
        # falls under 0.3 of the true spread in 2.3% of draws (the middle
        # two runs' residuals are small by construction), putting the fence
        # inside the bulk and stalling the search; the pairs' spread, which
        # spikes inflate more, floors it (0.5% of draws).
        # The good side is clean of the regression by definition: where the
        # bad side's spikes widen the pooled spread, the good side's own
        # (floored by its pairs) caps it, so the spikes land past the fence.
        own_good = max(_resid_sd(tg - mu_g), PAIR_SPREAD_FLOOR * _pair_spread(tg))
        mad = max(min(_resid_sd(resid), own_good), PAIR_SPREAD_FLOOR * _pair_spread(tg, tb),
                  1e-3 if log_space else 1e-12)
        return cls(log_space, mu_g, mu_b, float(pooled * inflate), float(max(n - 2, 1)), len(g), len(b),
                   cap, "learned", own(tg - mu_g), own(tb - mu_b), disjoint, g_range, b_range,
                   bad_cap, good_cap, mad, int(np.sum(broke(g))))

    def transform(self, values: Iterable[float]) -> np.ndarray:
        return _transform(_arr(values), self.log_space)

    def _logpdf(self, y: np.ndarray, mu: float, scale: float) -> np.ndarray:
        core = _t_logpdf(y, self.df, mu, scale or self.scale)
        mid = 0.5 * (self.mu_good + self.mu_bad)
        broad = _norm_logpdf(y, mid, max(OUTLIER_SCALE, 4 * self.scale))
        return np.logaddexp(np.log1p(-OUTLIER_WEIGHT) + core, math.log(OUTLIER_WEIGHT) + broad)

    def commit_log_lr(self, values: Sequence[float]) -> float:
        """A commit's evidence: its runs' log likelihood ratios, summed."""
        return float(np.sum(self.log_lr(values))) if len(values) else 0.0

    def log_lr(self, values: Iterable[float]) -> np.ndarray:
        """Per-run log likelihood ratio, bad over good, clipped to +-log(cap)."""
        x = _arr(values)
        y = _transform(x, self.log_space)
        if y.size == 0:
            return y
        llr = self._logpdf(y, self.mu_bad, self.scale_bad) - self._logpdf(y, self.mu_good, self.scale_good)
        # Unequal spreads make the ratio turn back in the far tails: a value
        # beyond the good centre (away from bad) is never evidence of bad,
        # and one beyond the bad centre never evidence of good.
        up = self.mu_bad >= self.mu_good
        beyond_good = y < self.mu_good if up else y > self.mu_good
        beyond_bad = y > self.mu_bad if up else y < self.mu_bad
        llr = np.where(beyond_good, np.minimum(llr, 0.0), np.where(beyond_bad, np.maximum(llr, 0.0), llr))
        cb, cg = math.log(self.bad_cap or self.cap), math.log(self.good_cap or self.cap)
        llr = np.clip(llr, -cg, cb)
        if self.disjoint and self.good_range and self.bad_range:
            llr = self._by_ranges(y, llr, cb, cg)
        if not self.nan_good:
            llr = np.where(broke(x), np.maximum(llr, _past_all(cb, self.n_bad)), llr)
        return llr

    def _by_ranges(self, y: np.ndarray, llr: np.ndarray, cb: float, cg: float) -> np.ndarray:
        """Separated runs judged by where they fall among the runs seen: like
        a good run, like a bad run, or in the gap between them, where the
        evidence is weak (at most GAP_LR:1 at either edge, falling linearly
        to even halfway across): a run beyond all n good runs and short of
        all m bad runs is about as rare under either. The fitted tails
        cannot be trusted there: a handful of runs of a skewed metric put its
        centre and spread far from its near edge, and a bad run just past the
        good ones would otherwise count 40:1 for good."""
        (g_lo, g_hi), (b_lo, b_hi) = self.good_range, self.bad_range
        up = b_lo > g_hi
        inner_g, inner_b = (g_hi, b_lo) if up else (g_lo, b_hi)
        t = (y - inner_g) / (inner_b - inner_g)          # 0 at the good edge, 1 at the bad edge
        in_good = (y >= g_lo) & (y <= g_hi)
        in_bad = (y >= b_lo) & (y <= b_hi)
        in_gap = (t > 0) & (t < 1)
        g = math.log(GAP_LR)
        out = np.where(in_good, -cg, np.where(in_bad, cb, np.where(in_gap, g * (2 * t - 1), llr)))
        # Far beyond the bad runs (more than either side's range) is where a
        # good run's 3-10x outliers land as well as the bad ones': weak
        # evidence, like the gap.
        w = max(b_hi - b_lo, g_hi - g_lo)
        far = (y > b_hi + w) if up else (y < b_lo - w)
        out = np.where(far, np.minimum(out, g), out)
        # Above every run seen is where only the upper side's own tail
        # lands, 1 run in n + 1 of it whatever its shape, or the other
        # side's outliers (a divergence's outliers are large values), 1 in
        # the cap: a run there counts for no more than cap / (n + 1). Below
        # every run only the lower side's tail goes, and the fitted tails
        # stand.
        if up:
            return np.where(y > b_hi, np.minimum(out, _past_all(cb, self.n_bad)), out)
        return np.where(y > g_hi, np.maximum(out, -_past_all(cg, self.n_good)), out)

    @property
    def effect(self) -> float:
        """Separation of good and bad in units of the run-to-run spread."""
        return abs(self.mu_bad - self.mu_good) / self.scale

    @property
    def decisive(self) -> bool:
        """Good and bad barely overlap, and enough runs show it that the
        estimate is not a lucky draw: then one run nearly decides a commit and
        the learned distributions can be plugged in. Otherwise the search
        integrates them out (search.integrated_parts)."""
        return self.separates and min(self.n_good, self.n_bad) >= DECISIVE_RUNS

    @property
    def separates(self) -> bool:
        """The runs seen so far do not overlap and sit far apart: enough to
        start a plug-in search, which pools interior runs into each side
        until the model is ``decisive`` and may answer."""
        return self.disjoint and self.effect >= DECISIVE_EFFECT

    @property
    def regime(self) -> str:
        """How the search judges runs with this model, for progress and status."""
        if self.decisive:
            return "they separate cleanly: each run is judged against them"
        if self.separates:
            return (f"they separate on {min(self.n_good, self.n_bad)} runs a side: interior runs the search "
                    f"places on a side join it, and it answers once each side has {DECISIVE_RUNS}")
        if self.disjoint:
            return ("no run of one side fell among the other's, but they sit close for their spread: "
                    "the search integrates over both distributions")
        # not disjoint: runs of one side fell among the other's, or the
        # closest ones stand under DISJOINT_MARGIN spreads apart
        return ("they overlap, or their closest runs stand under 3/4 of a spread apart: the search integrates "
                "over both distributions")

    @property
    def contact(self) -> str:
        """How the endpoints' runs relate, in the words of a progress line."""
        if self.separates:
            return "separate"
        return "differ, but sit close for their spread" if self.disjoint else "differ, but their runs overlap or nearly touch"

    def fence(self, spreads: float | None = None) -> tuple[float, float]:
        """(low, high) values beyond which a run is far outside both sides'
        bulk: ``spreads`` robust spreads (``mad``) past the outer centre.
        The integrated search counts such runs only by how often each side
        throws them (search.integrated_parts), since on a squared-distance
        model one 10x outlier would outweigh twenty ordinary runs, and a
        regression that shows only as spikes is seen best as a rate. A
        fence set by a spread the spikes inflated would let them all in.
        ``spreads`` defaults to FENCE_SPREADS, read at the call."""
        spreads = FENCE_SPREADS if spreads is None else spreads
        gap = abs(self.mu_bad - self.mu_good)
        if self.mad:
            # An overlapping bad side whose centre sits this far out is a mix
            # whose median landed on its spikes: measure from its bulk instead.
            unit, reach = self.mad, min(gap, FENCE_CENTRE_REACH * self.mad)
        else:   # a model stored before ``mad`` was recorded keeps its old fence
            unit, reach = max(self.scale_good or self.scale, self.scale_bad or self.scale), gap
        inner = self.mu_good
        lo, hi = (inner - reach, inner) if self.mu_bad < self.mu_good else (inner, inner + reach)
        lo, hi = lo - spreads * unit, hi + spreads * unit
        if self.log_space:
            return float(math.exp(lo)), float(math.exp(hi))
        return float(lo), float(hi)

    def boundary(self) -> float:
        """The value where a run is equally likely good or bad (for plots)."""
        mid = 0.5 * (self.mu_good + self.mu_bad)
        if self.decisive and self.good_range and self.bad_range:
            # _by_ranges is neutral halfway across the gap between the runs seen
            up = self.bad_range[0] > self.good_range[1]
            mid = 0.5 * ((self.good_range[1] + self.bad_range[0]) if up
                         else (self.good_range[0] + self.bad_range[1]))
        return float(math.exp(mid)) if self.log_space else float(mid)

    def centre(self, which: str) -> float:
        mu = self.mu_good if which == GOOD else self.mu_bad
        return float(math.exp(mu)) if self.log_space else float(mu)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Model":
        if d.get("kind") == "threshold":
            return ThresholdModel.from_dict(d)  # type: ignore[return-value]
        return cls(**{k: d[k] for k in ("log_space", "mu_good", "mu_bad", "scale", "df",
                                         "n_good", "n_bad", "cap", "kind", "scale_good", "scale_bad",
                                         "disjoint", "good_range", "bad_range", "bad_cap", "good_cap",
                                         "mad", "nan_good")
                   if k in d})


def _past_all(log_cap: float, n: int) -> float:
    """log of cap / (n + 1), never below even: a run beyond all n runs of a side."""
    return max(log_cap - math.log(n + 1), 0.0)


def _stray_cap(strays: int, n: int, cap: float) -> float:
    """The most one run in a side's range may count for, when ``strays`` of
    the other side's ``n`` runs landed there: one over the rate at which
    they do, estimated with 1/cap as a prior worth CAP_PRIOR_RUNS runs. A
    metric whose good runs throw 5% outliers into the bad range makes two
    such outliers in a row at one good commit a 1-in-400 event, not the
    1-in-1,600 that a 40:1 cap claims, and an answer resting on them must
    wait for a third run."""
    rate = (strays + CAP_PRIOR_RUNS / cap) / (n + CAP_PRIOR_RUNS)
    return float(min(cap, max(1.0 / rate, GAP_LR)))


def _ranges(tg: np.ndarray, tb: np.ndarray, margin: float,
            strays_within: bool = False) -> tuple[bool, tuple, tuple]:
    """(disjoint, good (min, max), bad (min, max)) of transformed runs.

    Disjoint: the sides leave a gap wider than ``margin`` between them once
    outliers are set aside, at most one for a handful of runs or STRAY_SHARE
    of many, so that a 3-10x outlier does not make a clean regression look
    like an overlapping one. An endpoint run is an outlier only beyond every
    run of the other side: one that merely reaches into it is what an
    overlapping regression looks like, and six runs each of one come out
    disjoint by chance in about 1 trial in 40 when such runs are set aside
    (measured on the benchmark's model b, each time naming a confident wrong
    commit). ``strays_within`` (the refit from interior runs, which an
    outlier-prone metric fills with them) also sets aside runs beyond the
    other side's median."""
    up = np.median(tg) <= np.median(tb)
    lo, hi = np.sort(tg if up else tb), np.sort(tb if up else tg)

    def allowed(a: np.ndarray) -> int:
        return max(1, math.ceil(STRAY_SHARE * a.size)) if a.size > 3 else 0
    if strays_within:
        lo_keep, hi_keep = lo[lo <= np.median(hi)], hi[hi >= np.median(lo)]
    else:
        lo_keep, hi_keep = lo[lo <= hi[-1]], hi[hi >= lo[0]]
    if lo.size - lo_keep.size > allowed(lo) or hi.size - hi_keep.size > allowed(hi):
        return False, (), ()
    if not lo_keep.size or not hi_keep.size or hi_keep[0] - lo_keep[-1] <= margin:
        return False, (), ()
    lo_keep = _trim_far_end(lo_keep, allowed(lo), low_end=True)
    hi_keep = _trim_far_end(hi_keep, allowed(hi), low_end=False)
    lo_r = (float(lo_keep[0]), float(lo_keep[-1]))
    hi_r = (float(hi_keep[0]), float(hi_keep[-1]))
    return (True, lo_r, hi_r) if up else (True, hi_r, lo_r)


def _trim_far_end(a: np.ndarray, limit: int, low_end: bool) -> np.ndarray:
    """Drop up to ``limit`` runs at a side's far end (away from the other
    side) that stand further from the next run than the rest of the side
    spans: a 3-10x outlier must not stretch the range where a run counts
    40:1, or a good run's outlier would land inside the bad range."""
    k = 0
    while k < limit and a.size - k >= 4:
        rest = a[k + 1:] if low_end else a[:a.size - k - 1]
        gap = (rest[0] - a[k]) if low_end else (a[a.size - k - 1] - rest[-1])
        if gap <= rest[-1] - rest[0]:
            break
        k += 1
    return a[k:] if low_end else a[:a.size - k]


def _transform(x: np.ndarray, log_space: bool) -> np.ndarray:
    return np.log(np.maximum(x, 1e-300)) if log_space else x


def _pooled_scale(resid: np.ndarray, dof: int) -> float:
    """Robust pooled spread: MAD when there are enough runs, else a
    trimmed standard deviation (MAD of a handful of residuals is mostly the
    zeros the medians produce)."""
    if resid.size >= 12:
        mad = 1.4826 * float(np.median(np.abs(resid - np.median(resid))))
        if mad > 0:
            return mad
    r = np.sort(np.abs(resid))
    if r.size > 4:
        r = r[:-1]  # one outlier among endpoint runs must not inflate the spread
    dof = max(dof, 1)
    return float(math.sqrt(np.sum(r ** 2) / dof))


def _resid_sd(resid: np.ndarray) -> float:
    """Residuals' median absolute size (from centres already taken out), as
    a normal's sigma."""
    return 1.4826 * float(np.median(np.abs(resid)))


def _pair_spread(*sides: np.ndarray) -> float:
    """Robust spread (as a normal's sigma) from the differences between two
    runs of the same side, the given sides' pairs pooled: their median, as in
    Shamos's estimator. Unlike the residuals' MAD it needs no centre, so it
    does not collapse on six runs, whose median sits between the middle
    two. 0 when no side has two runs. Sides are thinned evenly to
    PAIR_SPREAD_MOST runs."""
    diffs = []
    for t in sides:
        if t.size > PAIR_SPREAD_MOST:
            t = t[np.linspace(0, t.size - 1, PAIR_SPREAD_MOST).round().astype(int)]
        i, j = np.triu_indices(t.size, 1)
        diffs.append(np.abs(t[i] - t[j]))
    d = np.concatenate(diffs)
    # |x - y| of two normal runs is sqrt(2) sigma |Z|, whose median is 0.6745
    return float(np.median(d)) / (math.sqrt(2) * 0.6744897501960817) if d.size else 0.0


RATE_QUANTILE = 0.9   # classic mode: how cautiously the endpoints' fail rates are read (ThresholdModel)


@dataclass
class ThresholdModel:
    """Classic mode: a run fails when its value reaches the CI threshold;
    a commit's verdict is the majority of ``votes`` runs.

    ``git bisect`` trusts each verdict without limit (``cap``). With the
    endpoints' fail rates (``fail_good``, ``fail_bad``, from ``with_rates``),
    a verdict weighs what they say a majority is worth: where a bad commit
    passes half its runs, a majority of three reads bad at about 2:1, and
    the answer's confidence says so instead of 0.99999 (a tester's classic
    runs named wrong commits at that)."""

    threshold: float
    votes: int = 1
    kind: str = "threshold"
    cap: float = 1e6
    fail_good: float | None = None
    fail_bad: float | None = None

    def with_rates(self, good: Sequence[float], bad: Sequence[float], q: float = RATE_QUANTILE) -> "ThresholdModel":
        """The fail rates of the endpoints' runs, each taken at the cautious
        end of its Jeffreys interval (the good side's high, the bad side's
        low, at ``q``): six runs a side say little, and plug-in rates let a
        few verdicts pass for sure and named wrong commits."""
        beta = _stats().beta

        def rate(values: Sequence[float], upper: bool) -> float:
            k, n = float(np.sum(self.fails(values))), len(values)
            return float(beta.ppf(q if upper else 1 - q, k + 0.5, n - k + 0.5))
        return dataclasses.replace(self, fail_good=rate(good, True), fail_bad=rate(bad, False))

    def fails(self, values: Iterable[float]) -> np.ndarray:
        return _arr(values) >= self.threshold

    def _majority(self, p: float) -> float:
        """P(a majority of ``votes`` runs fail) when one fails with ``p``."""
        return float(_stats().binom.sf(self.votes // 2, self.votes, p))

    def verdict_log_lrs(self, votes: int | None = None) -> tuple[float, float]:
        """Evidence, bad over good, of a failing and of a passing verdict (a
        majority of ``votes`` runs): without rates, +-log(cap)."""
        cap = math.log(self.cap)
        if self.fail_good is None or self.fail_bad is None:
            return cap, -cap
        m = self if votes is None else dataclasses.replace(self, votes=votes)
        a, b = m._majority(self.fail_bad), m._majority(self.fail_good)
        return (float(np.clip(math.log(a / b), -cap, cap)),
                float(np.clip(math.log((1 - a) / (1 - b)), -cap, cap)))

    def log_lr(self, values: Iterable[float]) -> np.ndarray:
        up, down = self.verdict_log_lrs(votes=1)
        return np.where(self.fails(values), up, down)

    def commit_log_lr(self, values: Sequence[float]) -> float:
        """A commit's evidence as classic mode has it: with ``votes`` > 1,
        none until it has that many runs, then one majority verdict per
        ``votes`` runs (summing single runs would let the first one decide)."""
        if self.votes <= 1:
            return float(np.sum(self.log_lr(values)))
        up, down = self.verdict_log_lrs()
        total = 0.0
        for start in range(0, len(values) - self.votes + 1, self.votes):
            failed = int(np.sum(self.fails(list(values)[start:start + self.votes])))
            total += up if 2 * failed > self.votes else down
        return total

    def boundary(self) -> float:
        return self.threshold

    @property
    def effect(self) -> float:
        return float("nan")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ThresholdModel":
        return cls(threshold=d["threshold"], votes=d.get("votes", 1), fail_good=d.get("fail_good"),
                   fail_bad=d.get("fail_bad"))


ODDS_SHOWN = 1e6   # odds past this read as "over 1e+06:1": a run count, not 1.03e+18:1, is what they rest on


def fmt_odds(log_lr: float) -> str:
    """Evidence as odds, "40:1 for bad" (log_lr > 0, else for good)."""
    ratio = math.exp(min(abs(log_lr), 700))
    side = "bad" if log_lr >= 0 else "good"
    return f"over {ODDS_SHOWN:.0e}:1 for {side}" if ratio > ODDS_SHOWN else f"{ratio:.3g}:1 for {side}"


@dataclass
class Verdict:
    decision: str            # good | bad | undecided | skip
    n_values: int
    n_crashes: int
    log_lr: float            # summed (clipped) evidence, bad over good
    reason: str = ""

    @property
    def lr_text(self) -> str:
        return fmt_odds(self.log_lr)


def normal_scores(values: np.ndarray) -> np.ndarray:
    """Rank-based normal scores (Blom): the values' order, nothing of their
    shape. A 10x outlier scores like the largest ordinary value, and skewed
    or heavy-tailed metrics need no parametric model."""
    x = np.asarray(values, float)
    n = x.size
    if n == 0:
        return x
    order = np.argsort(x, kind="stable")
    ranks = np.empty(n)
    ranks[order] = np.arange(1, n + 1)
    # ties share their average rank
    uniq, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    if uniq.size < n:
        sums = np.bincount(inv, weights=ranks)
        ranks = (sums / counts)[inv]
    from scipy.special import ndtri  # noqa: PLC0415 - scipy loads slowly; `klbisect probe` may not plan
    return ndtri((ranks - 0.375) / (n + 0.25))


def predictive_log_lr(values: Sequence[float], good: Sequence[float], bad: Sequence[float]) -> float:
    """A commit's evidence, bad over good, from its runs and the two sides'
    runs: the log Bayes factor that its runs share the bad side's
    distribution rather than the good one's. All runs become rank normal
    scores (an outlier or skew carries no weight of its own) and a normal
    model of the scores has both centres and the common spread integrated
    out (flat and 1/sigma priors), as ``search.integrated_parts`` does. It
    knows how little 10-20 runs a side say about where the sides lie."""
    x, g, b = (np.asarray(v, float) for v in (values, good, bad))
    m, ng, nb = x.size, g.size, b.size
    if m == 0 or ng < 2 or nb < 2:
        return 0.0
    z = normal_scores(np.concatenate([x, g, b]))
    zx, zg, zb = z[:m], z[m:m + ng], z[m + ng:]

    def ss(a: np.ndarray) -> float:
        return float(np.sum((a - a.mean()) ** 2))

    dof = (m + ng + nb - 2) / 2.0
    as_good = -0.5 * math.log(ng + m) - 0.5 * math.log(nb) - dof * math.log(ss(np.concatenate([zx, zg])) + ss(zb))
    as_bad = -0.5 * math.log(ng) - 0.5 * math.log(nb + m) - dof * math.log(ss(zg) + ss(np.concatenate([zx, zb])))
    return float(as_bad - as_good)


@dataclass
class PredictiveModel:
    """The verdict of one commit (``klbisect probe``) when good and bad
    overlap. A model fitted to the sides' runs and plugged in does not know
    how unsure its own centres and tails are: its verdicts at 500:1 were
    wrong 4-17% of the time on a 1.35-1.45x shift at a 0.23-0.3 spread (an
    acceptance tester's histories; git then named a wrong commit). This one
    needs ``predictive_log_lr``, against the runs themselves, to agree:
    ``scripts/verdict_errors.py`` measures both, at the cost of more runs
    and more commits skipped undecided (a block git reports, not a wrong
    answer)."""

    good: tuple
    bad: tuple
    fitted: Model          # the plug-in fit: centres for messages

    def commit_log_lr(self, values: Sequence[float]) -> float:
        """The weaker of the two, when they agree; nothing when they do not.
        On rank scores, a good commit's 3-10x outliers rank with the bad
        runs, where the fit knows them for outliers; the fit, for its part,
        trusts tails it has barely seen."""
        if not len(values):
            return 0.0
        a, b = self.parts(values)
        return math.copysign(min(abs(a), abs(b)), a) if a * b > 0 else 0.0

    def parts(self, values: Sequence[float]) -> tuple[float, float]:
        """(the rank test's log LR against the sides' runs, the fitted model's)."""
        return predictive_log_lr(values, self.good, self.bad), self.fitted.commit_log_lr(values)

    def explain(self, values: Sequence[float]) -> str:
        """Both tests' odds, for a verdict's reason: status shows the fitted
        model's alone, which reads as a contradiction beside "undecided"."""
        rank, fit = self.parts(values)

        return f"the fitted model {fmt_odds(fit)}, the rank test against the ends' runs {fmt_odds(rank)}"


def verdict_model(good: Sequence[float], bad: Sequence[float]) -> "Model | PredictiveModel":
    """The model a verdict per commit is judged by, fitted to the runs of
    the commits known good and bad: plugged in where they separate, and
    against the runs themselves (``PredictiveModel``) where they overlap."""
    fitted = Model.fit(good, bad)
    return fitted if fitted.separates else PredictiveModel(tuple(good), tuple(bad), fitted)


def contradicts(model, earlier: Sequence[float], now: Sequence[float]) -> bool | None:
    """Do runs measured now at one commit read against the runs earlier
    sessions recorded there? Runs are matched by the probe command alone,
    so this is what a new driver, wheel or machine looks like at a commit an
    answer rests on. True: the earlier runs lean one way (STALE_RUN_LR:1 or
    more) and either the new runs together weigh STALE_SUM_LR:1 against that
    side (under a right model, runs of an unchanged commit do that at most
    once in STALE_SUM_LR) or they sit nearer the other side than the earlier
    runs do, by rank (one-sided Mann-Whitney at STALE_P). The rank test
    needs no model: runs between the sides are where a model fitted to a
    few endpoint runs is least sure, even of which side they are on. None:
    leaning the other way, not yet sure; measure again (up to
    STALE_MAX_RUNS). False: they agree, or nothing to compare."""
    if len(now) < STALE_CHECK_RUNS or not len(earlier):
        return False if not len(earlier) else None
    side = model.commit_log_lr(list(earlier))
    if abs(side) < math.log(STALE_RUN_LR):
        return False
    strength = -model.commit_log_lr(list(now)) * np.sign(side)   # log LR of the new runs against it
    if -strength >= math.log(STALE_SUM_LR):
        # the new runs read the same side as the earlier ones, plainly: lower in the bad
        # range than they were is no changed environment, and the answer stands on them
        # (a tester's: four bad runs under the earlier twelve stopped a right answer, 1 in 21)
        return False
    # are the new runs further toward the other side than the earlier ones: higher, when that side is
    toward = "greater" if _bad_is_higher(model) == (side < 0) else "less"
    p_rank = float(_stats().mannwhitneyu(list(now), list(earlier), alternative=toward).pvalue)
    if strength >= math.log(STALE_SUM_LR) or p_rank <= STALE_P:
        return True
    if (strength >= math.log(STALE_RUN_LR) or p_rank <= STALE_SUSPECT_P) and len(now) < STALE_MAX_RUNS:
        return None
    return False


def _bad_is_higher(model) -> bool:
    if isinstance(model, PredictiveModel):
        model = model.fitted
    return not isinstance(model, Model) or model.mu_bad >= model.mu_good


def is_undecided_skip(decision: str, reason: str) -> bool:
    """A skip because --max-runs ran out before a verdict (``judge``), as
    opposed to one for a failed build or crashes."""
    return decision == SKIP and reason.startswith(UNDECIDED_SKIP)


def runs_per_commit(model: "Model | ThresholdModel | PredictiveModel", max_runs: int | None = None) -> int:
    """``--max-runs``, or by default (None): 10 runs when the sides separate
    (one run nearly decides), OVERLAP_MAX_RUNS when they overlap. Then the
    search itself moves on once a commit is settled; a cap set from the
    endpoints' apparent effect would strand a boundary commit half-judged
    whenever the endpoint samples overstate it."""
    if max_runs is not None:
        return max_runs
    if isinstance(model, PredictiveModel):
        return OVERLAP_MAX_RUNS
    if not isinstance(model, Model) or model.separates:
        return DEFAULT_MAX_RUNS
    return OVERLAP_MAX_RUNS


def judge(values: Sequence[float], crashes: int, model: "Model | ThresholdModel | PredictiveModel",
          max_runs: int | None, crash_limit: int = 2, verdict_lr: float = VERDICT_LR) -> Verdict:
    """Verdict on one commit from its runs so far (Wald's SPRT), or undecided
    while more runs would help. ``skip`` when it cannot be measured."""
    n = len(values)
    max_runs = runs_per_commit(model, max_runs)
    # "is GOOD: 2 runs" under three crash lines read as the crashes counted for good (a tester's)
    crashed = f" ({crashes} more crashed, not evidence)" if crashes else ""
    if isinstance(model, ThresholdModel):
        fails = int(np.sum(model.fails(values)))
        passes = n - fails
        need = model.votes // 2 + 1
        llr = float((fails - passes) * math.log(model.cap)) if n else 0.0
        if fails >= need:
            return Verdict(BAD, n, crashes, llr, f"{fails}/{n} runs at or above {model.threshold:g}{crashed}")
        if passes >= need:
            return Verdict(GOOD, n, crashes, llr, f"{passes}/{n} runs below {model.threshold:g}{crashed}")
    else:
        llr = model.commit_log_lr(values)
        bound = math.log(verdict_lr)
        both = f" (the weaker of {model.explain(values)})" if isinstance(model, PredictiveModel) and n else ""
        if llr >= bound:
            return Verdict(BAD, n, crashes, llr,
                           f"{n} runs{crashed}, likelihood ratio {fmt_odds(llr)}{both}")
        if llr <= -bound:
            return Verdict(GOOD, n, crashes, llr,
                           f"{n} runs{crashed}, likelihood ratio {fmt_odds(llr)}{both}")
    if n == 0 and crashes >= crash_limit:
        return Verdict(SKIP, n, crashes, 0.0, f"{crashes} runs crashed or timed out without a usable value")
    if n >= max_runs:
        short = (f": {model.explain(values)}; a verdict for git needs both at {verdict_lr:g}:1, the same way"
                 if isinstance(model, PredictiveModel) and n else "")
        return Verdict(SKIP, n, crashes, llr, f"{UNDECIDED_SKIP} {n} runs (--max-runs){short}")
    if crashes >= max_runs + crash_limit:
        return Verdict(SKIP, n, crashes, llr, f"{crashes} crashed runs")
    return Verdict(UNDECIDED, n, crashes, llr)


@dataclass
class Separation:
    separated: bool
    p_value: float
    effect: float
    direction: str          # "up" when bad values are higher
    good: dict = field(default_factory=dict)
    bad: dict = field(default_factory=dict)


def separation(good: Sequence[float], bad: Sequence[float]) -> Separation:
    """Do the endpoints differ? Welch's t on the (log) values and Mann-Whitney
    U; the smaller p counts, as in Pinpoint's comparison."""
    stats = _stats()
    g, b = _arr(good), _arr(bad)
    sg, sb = summarize(g), summarize(b)
    if len(g) < 2 or len(b) < 2:
        return Separation(False, 1.0, 0.0, "up", sg, sb)
    m = Model.fit(g, b)
    tg, tb = m.transform(g), m.transform(b)
    if np.ptp(np.concatenate([tg, tb])) == 0:
        return Separation(False, 1.0, 0.0, "up", sg, sb)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        # identical values on a side (every bad run a nan's stand-in) make scipy
        # warn of precision loss; the Mann-Whitney p below covers that case
        warnings.simplefilter("ignore", RuntimeWarning)
        p_t = stats.ttest_ind(tg, tb, equal_var=False).pvalue
    p_u = stats.mannwhitneyu(tg, tb, alternative="two-sided").pvalue
    p = float(np.nanmin([p_t, p_u]))
    if not np.isfinite(p):
        # zero spread in both groups but different values: a clean step
        p = 0.0 if np.median(tg) != np.median(tb) else 1.0
    direction = "up" if m.mu_bad >= m.mu_good else "down"
    return Separation(p <= SEPARATION_P, p, m.effect, direction, sg, sb)


def label_separations(good: dict[str, Sequence[float]],
                      bad: dict[str, Sequence[float]]) -> list[tuple[str, float]]:
    """Each label's own endpoint separation as (label, p), most apart first,
    over the labels with two runs a side."""
    labels = sorted(k for k in good if len(good[k]) >= 2 and len(bad.get(k, ())) >= 2)
    return sorted(((lab, separation(good[lab], bad[lab]).p_value) for lab in labels), key=lambda x: x[1])


def labels_apart(good: dict[str, Sequence[float]], bad: dict[str, Sequence[float]],
                 alpha: float = 0.01) -> list[tuple[str, float]]:
    """The labels whose own runs separate the endpoints when their max does
    not (one label of five moved 15%: the others' noise sets the max), as
    (label, p) by p, each tested at ``alpha`` over the number of labels, so
    looking at several is paid for. What a "do not separate" suggests."""
    seps = label_separations(good, bad)
    return [(lab, p) for lab, p in seps if p <= alpha / len(seps)]


def endpoint_crash_limit(crash_limit: int, other_crashes: int = 0, other_runs: int = 0) -> int:
    """Crashes with no value before an endpoint is given up: never fewer
    than DECISIVE_RUNS (the default first batch), so starting on fewer runs a side
    (``--endpoint-runs``) does not give up on a flaky probe sooner; more when
    the other endpoint's runs (``other_crashes`` of ``other_runs``) show the
    probe crashing often where it works. At a 50% crash rate six crashes in a
    row end one start in 32; that the other side crashes too says flaky, not
    broken (a tester's held-out model lost 3% of its bisects here)."""
    flaky = crash_skip_limit(other_crashes, other_runs, crash_limit) if other_crashes else 0
    return max(crash_limit, DECISIVE_RUNS, flaky)


SKIP_ERROR = 0.002   # how often `klbisect probe` may skip a commit it could measure, for crashes alone
MAX_CRASH_SKIP = 12  # crashes in a row that always end a commit, whatever the crash rate
CRASH_RATE_Z = 1.2816  # the crash rate's one-sided 90% upper bound


def crash_skip_limit(crashes: int, runs: int, crash_limit: int) -> int:
    """Crashes with no value before ``klbisect probe`` skips a commit, from
    the crash rate of ``runs`` runs seen so far (the endpoints'): enough
    that a commit the probe can measure is skipped under SKIP_ERROR of the
    time. With a probe that crashes 40% of the time, two crashes in a row
    (the fixed --crash-limit) skip a testable commit one time in six, and a
    skipped culprit leaves git a block where a commit was findable. Never
    fewer than ``crash_limit``. The rate is taken at its 90% upper bound
    (Wilson): two crashes in fourteen endpoint runs are also what a 30%
    crash rate often shows, and at the point estimate (14%) four crashes in
    a row skipped a testable culprit 1 time in 120."""
    z2 = CRASH_RATE_Z ** 2
    n = max(runs, 1)
    p = min(crashes / n, 1.0)
    rate = (p + z2 / (2 * n) + CRASH_RATE_Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))) / (1 + z2 / n)
    k = math.ceil(math.log(SKIP_ERROR) / math.log(rate)) if rate < 1 else MAX_CRASH_SKIP
    return max(crash_limit, min(k, MAX_CRASH_SKIP))


@dataclass
class EndpointStep:
    """What endpoint calibration should do next."""

    action: str                         # "more" | "ready" | "fail"
    more_good: int = 0
    more_bad: int = 0
    separation: Separation | None = None


def endpoint_step(good: Sequence[float], bad: Sequence[float], n_min: int = MIN_ENDPOINT_RUNS,
                  n_max: int = MAX_ENDPOINT_RUNS, pooled: bool = True) -> EndpointStep:
    """The endpoint policy, shared by the session, `calibrate` and the
    benchmarks. n_min runs each first.

    Under DECISIVE_RUNS a side: with ``pooled`` (the search that follows
    adds the runs of commits it places on a side to that side, and answers
    only once each holds DECISIVE_RUNS: ``search.plan``), sides that
    already ``separate`` start it, and otherwise one more run each, since
    most regressions that show on a few runs are clean. Without (a verdict
    per commit, ``klbisect probe``, has no pool) both go to DECISIVE_RUNS.

    From DECISIVE_RUNS a side: a clean separation is ready at once.
    Otherwise up to OVERLAP_ENDPOINT_RUNS each, because a lucky low good
    sample would anchor every later judgement, and then ready as soon as the
    endpoints differ at OVERLAP_P: the search integrates over what they look
    like and measures them again when that is worth more than an interior
    run, so it needs a hint of a difference here, not proof. One more each
    until then; "fail" (no signal) only at n_max each. Without ``pooled``,
    twice OVERLAP_ENDPOINT_RUNS each first."""
    ng, nb = len(good), len(bad)
    if ng < n_min or nb < n_min:
        return EndpointStep("more", max(n_min - ng, 0), max(n_min - nb, 0))
    sep = separation(good, bad)
    m = Model.fit(good, bad)
    if min(ng, nb) < DECISIVE_RUNS:
        if pooled and m.separates:
            return EndpointStep("ready", separation=sep)
        want = min(min(ng, nb) + 1 if pooled else DECISIVE_RUNS, n_max)
        if ng >= want and nb >= want:
            return EndpointStep("fail", separation=sep)         # --max-endpoint-runs under DECISIVE_RUNS
        return EndpointStep("more", max(want - ng, 0), max(want - nb, 0), sep)
    if m.decisive and sep.separated:
        return EndpointStep("ready", separation=sep)
    # a verdict per commit (no pool) is judged against the endpoints' runs alone
    # (PredictiveModel): ten a side leave most commits undecided at 100 runs
    want = min(OVERLAP_ENDPOINT_RUNS if pooled else 2 * OVERLAP_ENDPOINT_RUNS, n_max)
    if ng < want or nb < want:
        return EndpointStep("more", max(want - ng, 0), max(want - nb, 0), sep)
    if sep.p_value <= OVERLAP_P:
        return EndpointStep("ready", separation=sep)
    if ng >= n_max and nb >= n_max:
        return EndpointStep("fail", separation=sep)
    return EndpointStep("more", int(ng < n_max), int(nb < n_max), sep)


TAIL_SPREADS = 4.0   # a bad run this many of the good runs' spreads past all of them (worse_tail)


def worse_tail(good: Sequence[float], bad: Sequence[float], worse: str = "higher") -> int:
    """How many bad runs lie far past every good run the worse way: a
    regression that shows only as occasional spikes (a race, a flaky
    kernel) leaves the medians where they were, and a chance dip of the
    bad median must not read as a fix then (a tester's: 3 of 11 sessions
    said "swapped" or "no regression" with a bad run 5x every good one).
    Far: TAIL_SPREADS of the good runs' own spread (log scale where the
    values allow), beyond the good runs' extreme."""
    g, b = _arr(good), _arr(bad)
    if len(g) < 2 or not len(b):
        return 0
    log_space = bool(np.all(g > 0) and np.all(b > 0))
    tg, tb = _transform(g, log_space), _transform(b, log_space)
    if worse == "lower":
        tg, tb = -tg, -tb
    spread = max(_resid_sd(tg - np.median(tg)), _pair_spread(tg))
    if not np.isfinite(spread) or spread <= 0:
        return 0
    return int(np.sum(tb > tg.max() + TAIL_SPREADS * spread))


LOST_ENDPOINT_RUNS = 30  # runs a side (unequal counts weighed as their harmonic mean) ...
LOST_P = 0.5             # ... after which a p-value above this ends an integrated search


def lost_separation(good: Sequence[float], bad: Sequence[float]) -> Separation | None:
    """The endpoints' difference, when it has gone: an integrated search
    starts on a hint (p <= OVERLAP_P at OVERLAP_ENDPOINT_RUNS a side, which
    a range with no regression in it gives often, looked at run after run)
    and measures the endpoints again as it goes. With LOST_ENDPOINT_RUNS a
    side and p above LOST_P, the two look alike: there is nothing between
    them to find, and the search would spend --max-total-runs on noise.
    docs/statistics.rst ("A range with no regression") measures both sides
    of it: searches of noise cut short, and real overlapping shifts kept."""
    if not good or not bad:
        return None
    # the search re-measures whichever endpoint is worth more: unequal counts
    # weigh as this many a side (a difference's standard error is the same)
    n = 2.0 / (1.0 / len(good) + 1.0 / len(bad))
    if n < LOST_ENDPOINT_RUNS:
        return None
    sep = separation(good, bad)
    return sep if sep.p_value > LOST_P else None


# ---- calibration statistics (klbisect calibrate, status) -------------------

def summarize(values: Sequence[float]) -> dict:
    v = _arr(values)
    if v.size == 0:
        return {"n": 0}
    q = np.percentile(v, [5, 25, 50, 75, 95])
    return {"n": int(v.size), "min": float(v.min()), "p5": float(q[0]), "p25": float(q[1]),
            "median": float(q[2]), "p75": float(q[3]), "p95": float(q[4]), "max": float(v.max())}


def exceedances(values: Sequence[float], thresholds: Sequence[float]) -> list[tuple[float, int, int]]:
    """(threshold, runs at or above it, runs) for each candidate threshold."""
    v = _arr(values)
    return [(float(t), int(np.sum(v >= t)), int(v.size)) for t in thresholds]


def exceedance_upper_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """Clopper-Pearson upper bound on the true exceedance rate after k of n."""
    if n == 0:
        return 1.0
    if k >= n:
        return 1.0
    return float(_stats().beta.ppf(confidence, k + 1, n - k))


def exceedance_lower_bound(k: int, n: int, confidence: float = 0.95) -> float:
    """Clopper-Pearson lower bound on the true exceedance rate after k of n:
    how often, at least, a bad commit fails a threshold."""
    if n == 0 or k <= 0:
        return 0.0
    return float(_stats().beta.ppf(1.0 - confidence, k, n - k + 1))


NO_THRESHOLD_REACHES = "no threshold can reach"   # more runs will not help: calibrate leaves out its run count
OUTLIER_ALPHA = 0.01    # generalized ESD on the log values: a warning, so rarely on a clean log-normal sample


def _order_statistic(total: int, rate: float, confidence: float) -> int:
    """The rank j (0-based) at which the sorted runs' x[j] is a distribution-free
    upper confidence bound on the (1 - rate) quantile: P(Binomial(total, 1 - rate)
    < j + 1) >= confidence. At j = total, no run is high enough."""
    return int(_stats().binom.ppf(confidence, total, 1.0 - rate))


NAN_COUNT_MARGIN = 1.28   # standard deviations: the runs suggested are enough for nine draws in ten


def _nan_runs_for_bound(k: int, total: int, rate: float, confidence: float) -> int | None:
    """Runs at which nan or inf at the share seen (k of total) leave the order
    statistic on a finite run; None where that share is the rate or more."""
    share = k / total

    def enough(m: int) -> bool:
        # the share's exact upper bound at a fractional count (rounding k made the test saw-toothed
        # in m, a reviewer's), with the count drawn a little high: at the share itself, a rerun
        # with that many runs drew one nan too many about half the time (a tester's)
        k = share * m + NAN_COUNT_MARGIN * math.sqrt(m * share * (1 - share))
        return float(_stats().beta.ppf(confidence, k + 1, max(m - k, 1e-9))) < rate
    if share >= rate:
        return None
    lo, hi = total, total
    while not enough(hi):
        lo, hi = hi, hi * 2
        if hi > 10**8:
            return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if enough(mid) else (mid + 1, hi)
    return lo


def high_outliers(values: Sequence[float], alpha: float = OUTLIER_ALPHA) -> int:
    """How many of the top values stand apart from a log-normal rest
    (Rosner's generalized ESD, one-sided, on the logs; up to a tenth of the
    runs). A tail fit draws its sd from them, so its threshold lands below
    where they recur: 5% of runs at 3-10x put a fit's "0.01" at 0.04 (a
    tester's), and a single such run among 20 does not refute it."""
    stats = _stats()
    y = np.log(np.sort(_arr(values)))
    n = y.size
    if n < 8 or not np.all(np.isfinite(y)):
        return 0
    found = 0
    for i in range(1, max(1, n // 10) + 1):
        rest = y[: n - i + 1]
        sd = float(np.std(rest, ddof=1))
        if sd <= 0:
            break
        r = (rest[-1] - float(np.mean(rest))) / sd
        m = n - i + 1
        t = float(stats.t.ppf(1 - alpha / m, m - 2))
        if r > (m - 1) * t / math.sqrt((m - 2 + t * t) * m):
            found = i
    return found


def recommend_threshold(values: Sequence[float], false_fail_rate: float = 0.01,
                        confidence: float = 0.95, nonfinite: int = 0) -> tuple[float | None, str]:
    """Smallest threshold whose false-failure rate is at most ``false_fail_rate``
    with ``confidence``, from the empirical distribution; beyond the data, a
    log-normal tail fitted to the values. ``nonfinite``: runs besides
    ``values`` that printed nan or inf; each fails any threshold, and their
    true share is as uncertain as any rate, so the order statistic counts
    them as runs above every value and no fit stands in where it cannot
    reach: a fit aimed at what their share, taken as exact, left of the rate
    failed its confidence in 12-33% of a tester's calibrations. Returns
    (threshold, how)."""
    stats = _stats()
    v = np.sort(_arr(values))
    n = v.size
    if n == 0:
        # all nan: "no values ... needs 299 runs" let the max borrow another label's threshold
        return None, (f"every one of the {nonfinite} runs printed nan or inf, which fail any threshold: "
                      f"{NO_THRESHOLD_REACHES} {false_fail_rate:g} false failures" if nonfinite else "no values")
    total = n + nonfinite
    # a nan or inf sits above every value, so the rank must land among the finite ones
    j = _order_statistic(total, false_fail_rate, confidence)
    if j < n:
        return float(v[j]) * (1 + 1e-9), (
            f"order statistic {j + 1} of {total} runs, the {nonfinite} that printed nan or inf counted as failing "
            "any threshold (distribution-free)" if nonfinite else
            f"order statistic {j + 1} of {n} runs (distribution-free)")
    if nonfinite:
        # by the time their share's upper bound is under the rate, the order statistic is
        # there too: a fit has no room of its own
        share, share_hi = nonfinite / total, exceedance_upper_bound(nonfinite, total, confidence)
        said = f"{nonfinite} of {total} runs printed nan or inf, which fail any threshold"
        if share >= false_fail_rate:
            return None, (f"{said}: at that share ({share:.2g}) {NO_THRESHOLD_REACHES} {false_fail_rate:g} "
                          "false failures")
        more = _nan_runs_for_bound(nonfinite, total, false_fail_rate, confidence)
        return None, (f"{said}: their share ({share:.2g}) may be as high as {share_hi:.2g} ({confidence:.0%} "
                      f"confidence), so {NO_THRESHOLD_REACHES} {false_fail_rate:g} false failures from these runs"
                      + (f"; at that share {more} runs would, about nine times in ten (--runs {more})"
                         if more else ""))
    if n < 5:
        return None, f"too few runs ({n})"
    if v[0] == v[-1]:
        # just above it: exp(log(x)) can land an ulp under x, a threshold every run fails
        return float(v[-1]) * (1 + 1e-9), (f"every one of the {n} runs read the same value: no spread to fit a tail "
                                           "to, so this holds only while the test stays deterministic")
    if not np.all(v > 0):
        return None, f"{int(np.sum(v <= 0))} of {n} values are <= 0: no log-normal tail fit"
    y = np.log(v)
    mu, sd = float(np.mean(y)), float(np.std(y, ddof=1))
    # the exact one-sided normal tolerance factor: mu + k sd exceeds the (1 - rate)
    # quantile with probability ``confidence`` (an approximation covered 94% at 200 runs)
    zp = stats.norm.ppf(1 - false_fail_rate)
    k = float(stats.nct.ppf(confidence, n - 1, zp * math.sqrt(n))) / math.sqrt(n)
    # the fit's own estimate of the level, beside the bound: at 20 runs the bound sits
    # well above it (a tester read the two as one and lost most of the test's power)
    point = math.exp(mu + zp * sd)
    return float(math.exp(mu + k * sd)), (
        f"log-normal tail fit, its {confidence:.0%} upper confidence value: {n} runs are too few for a "
        f"distribution-free bound at {false_fail_rate:g}; the fit's own estimate of the level is "
        f"{point:.4g}, failing good commits {false_fail_rate:g} of the time if the fit is right")


def info_per_run(model: "Model", n_sim: int = 20000, seed: int = 0) -> float:
    """Mutual information (bits) between one run's value and good-vs-bad at
    p = 1/2, by Monte Carlo from the model itself (with its clip)."""
    if not isinstance(model, Model):
        return float("nan")
    rng = np.random.default_rng(seed)
    yg = model.mu_good + model.scale * rng.standard_t(model.df, n_sim)
    yb = model.mu_bad + model.scale * rng.standard_t(model.df, n_sim)
    to_val = (lambda y: np.exp(y)) if model.log_space else (lambda y: y)
    lg, lb = model.log_lr(to_val(yg)), model.log_lr(to_val(yb))
    # I = E[log2(2 f_x / (f_g + f_b))] averaged over both hypotheses
    ig = np.mean(np.log2(2.0 / (1.0 + np.exp(lg))))
    ib = np.mean(np.log2(2.0 / (1.0 + np.exp(-lb))))
    return float(max(0.0, 0.5 * (ig + ib)))


def _run_likelihoods(g: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, ...] | None:
    """Each side's likelihood of every good and every bad run: a run that
    printed nan or inf (metric.broke) is a category of its own, at the
    share of such runs on each side, and a finite value has that side's
    kernel density (log space when every value is positive) times its
    finite share. A nan's stand-in inside the density would widen its
    kernel to nothing, though a nan seen on one side only tells a lot.
    Returns (good at g, bad at g, good at b, bad at b), or None where a
    side's density cannot be estimated."""
    from scipy import stats  # noqa: PLC0415
    gn, bn = broke(g), broke(b)
    gf, bf = g[~gn], b[~bn]
    if len(gf) == 1 or len(bf) == 1:
        return None
    finite = np.concatenate([gf, bf])
    t = np.log if finite.size and finite.min() > 0 else (lambda x: x)

    def side(own: np.ndarray, nan: np.ndarray):
        q = float(np.mean(nan))
        kde = stats.gaussian_kde(t(own)) if len(own) else None
        return lambda x, isnan: np.where(isnan, q, (1 - q) * kde(t(x)) if kde else 0.0)
    try:
        pg, pb = side(gf, gn), side(bf, bn)
    except (np.linalg.LinAlgError, ValueError):    # every value equal on one side
        return None
    return pg(g, gn), pb(g, gn), pg(b, bn), pb(b, bn)


def _capacity(lik: tuple[np.ndarray, ...]) -> float:
    """The most one run can tell (bits), over the prior P(bad): mutual
    information at P(bad) = 1/2 understates it where the two differ in
    spread or tail, and Fano's limit is built on the most, not the mean."""
    from scipy.optimize import minimize_scalar  # noqa: PLC0415
    gg, bg, gb, bb = lik

    def info(pi: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            ig = np.mean(np.log2(gg / ((1 - pi) * gg + pi * bg)))
            ib = np.mean(np.log2(bb / ((1 - pi) * gb + pi * bb)))
        return float((1 - pi) * ig + pi * ib)
    best = minimize_scalar(lambda pi: -info(pi), bounds=(1e-4, 1 - 1e-4), method="bounded",
                           options={"xatol": 1e-4})
    return float(min(1.0, max(0.0, info(0.5), -best.fun)))


def _disjoint(g: np.ndarray, b: np.ndarray) -> bool:
    # a nan or inf fails any threshold: it sits above every finite value
    return bool(g.max() < b.min() or b.max() < g.min())


def sample_bits(good: Sequence[float], bad: Sequence[float]) -> tuple[float, bool]:
    """What one run can tell of good-vs-bad (bits, the capacity over
    P(bad)), read from the two samples rather than from the search's model,
    whose guard against outliers caps a run at RUN_LR_CAP and which weighs
    a shift of the centre only. Samples that never overlap are worth the
    full bit (as far as these runs show); otherwise each side's density is
    a kernel estimate (_run_likelihoods): a point estimate, biased up on few
    runs (bits_interval says how far it moves). Returns (bits, disjoint)."""
    g, b = _arr(good), _arr(bad)
    g, b = g[~np.isnan(g)], b[~np.isnan(b)]
    if len(g) < 2 or len(b) < 2:
        return float("nan"), False
    if _disjoint(g, b):
        return 1.0, True
    lik = _run_likelihoods(g, b)
    return (float("nan") if lik is None else _capacity(lik)), False


def bits_interval(good: Sequence[float], bad: Sequence[float], resamples: int = 200, level: float = 0.9,
                  seed: int = 0) -> tuple[float, float] | None:
    """A basic bootstrap interval of sample_bits (each side resampled with
    replacement): 2 x estimate - the resamples' upper and lower percentiles.
    A resample repeats runs, which a kernel estimate reads as more bits, so
    the plain percentile interval sits high: on a 0.06-bit shift at 40 runs
    a side it held the true bits 10 times in 20, this one 18. None when most
    resamples give no estimate."""
    g, b = _arr(good), _arr(bad)
    g, b = g[~np.isnan(g)], b[~np.isnan(b)]
    point = sample_bits(g, b)[0]
    if not np.isfinite(point):
        return None
    rng = np.random.default_rng(seed)
    got = [sample_bits(rng.choice(g, len(g)), rng.choice(b, len(b)))[0] for _ in range(resamples)]
    got = np.asarray([x for x in got if np.isfinite(x)])
    if len(got) < resamples / 2:
        return None
    lo, hi = np.percentile(got, [50 * (1 - level), 50 * (1 + level)])
    return float(min(1.0, max(0.0, 2 * point - hi))), float(min(1.0, max(0.0, 2 * point - lo)))


def runs_lower_bound(n_commits: int, bits_per_run: float, delta: float = 0.01) -> float:
    """Fano: runs needed to find one culprit among N with error <= delta."""
    if bits_per_run <= 0:
        return float("inf")
    return max(0.0, ((1 - delta) * math.log2(max(n_commits, 2)) - 1) / bits_per_run)
