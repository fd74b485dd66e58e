"""Where is the culprit? A posterior over its position from every run so far.

Pure numpy. Commits are indexed 0..N along the candidate list: 0 is the
known-good endpoint, N the known-bad one, and ``B`` in 1..N is the first bad
commit. A run at commit i with log likelihood ratio l (bad over good) adds l
to every hypothesis B <= i, so ``log P(B=b) = sum_{i>=b} s_i + log prior(b)``
with s_i the summed evidence of commit i. Nothing is final: a later run at
any commit moves the whole posterior, so an early misleading value gets
overturned (probabilistic bisection, Horstein; Waeber et al. 2013).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .decide import (MAX_CRASH_SKIP, MAX_ENDPOINT_RUNS, OVERLAP_MAX_RUNS, Model, lost_separation, normal_scores,
                     runs_per_commit, separation)
from .metric import fmt_count


def _block_ends(untestable: np.ndarray) -> np.ndarray:
    """The last index of each block over 1..N: a testable commit, or N."""
    n = untestable.size - 1
    ends = np.flatnonzero(~untestable[1:]) + 1
    return ends if ends.size and ends[-1] == n else np.append(ends, n)


@dataclass
class Block:
    """Commits the data cannot tell apart: a run of untestable commits and
    the testable commit after them. If the first bad commit is in here, no
    probe can say which one it is."""

    indices: list[int]
    mass: float

    @property
    def first(self) -> int:
        return self.indices[0]

    @property
    def last(self) -> int:
        return self.indices[-1]


class Posterior:
    def __init__(self, evidence: Sequence[float], untestable: Sequence[bool] | None = None,
                 log_prior: Sequence[float] | None = None):
        s = np.asarray(evidence, dtype=float)
        if s.size < 2:
            raise ValueError("need at least the two endpoints")
        self.n = s.size - 1
        self.evidence = s
        self.untestable = np.zeros(s.size, bool) if untestable is None else np.asarray(untestable, bool)
        # tail[b] = sum_{i>=b} s_i, for b = 1..N
        tail = np.cumsum(s[::-1])[::-1][1:]
        logp = tail + (0.0 if log_prior is None else np.asarray(log_prior, float))
        logp = logp - logp.max()
        p = np.exp(logp)
        self.p_first_bad = np.concatenate([[0.0], p / p.sum()])   # index b -> P(B=b)
        self.p_bad = np.minimum(np.cumsum(self.p_first_bad), 1.0)  # index i -> P(commit i bad); no 1 + 4e-15

    def _spans(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each block's first and last index and its mass, in arrays: the
        search asks for the top block after every run, over up to 10,000
        commits (a loop in Python was most of a simulated bisect's time)."""
        ends = _block_ends(self.untestable)
        starts = np.concatenate([[1], ends[:-1] + 1])
        return starts, ends, np.add.reduceat(self.p_first_bad[1:], starts - 1)

    def _block(self, start: int, end: int, mass: float) -> Block:
        return Block(list(range(int(start), int(end) + 1)), float(mass))

    def blocks(self) -> list[Block]:
        return [self._block(*t) for t in zip(*self._spans())]

    def top(self) -> Block:
        starts, ends, mass = self._spans()
        j = int(np.argmax(mass))
        return self._block(starts[j], ends[j], mass[j])

    def top_blocks(self, k: int = 5) -> list[Block]:
        starts, ends, mass = self._spans()
        return [self._block(starts[j], ends[j], mass[j]) for j in np.argsort(-mass, kind="stable")[:k]]

    def choose(self, k: int = 1, excluded: Sequence[bool] | None = None,
               pending: Sequence[int] = ()) -> list[int]:
        """Commits to probe next: for one slot the posterior median (the
        most informative binary question); for k slots the k-ary split
        points at quantiles j/(k+1). A commit may be chosen twice when it is
        still the best question. Commits already in flight count as asked."""
        can = ~self.untestable.copy()
        can[0] = can[self.n] = False
        if excluded is not None:
            can &= ~np.asarray(excluded, bool)
        idx = np.flatnonzero(can)
        if idx.size == 0:
            return []
        p = self.p_bad[idx]
        # Probing a commit whose state is already certain tells nothing.
        useful = (p > 1e-6) & (p < 1 - 1e-6)
        if not useful.any():
            return []
        idx, p = idx[useful], p[useful]
        targets = [(j + 1) / (k + len(pending) + 1) for j in range(k + len(pending))]
        picks: list[int] = []
        taken = list(pending)
        for t in targets:
            order = np.argsort(np.abs(p - t), kind="stable")
            choice = next((int(idx[o]) for o in order if int(idx[o]) not in taken), int(idx[order[0]]))
            taken.append(choice)
            picks.append(choice)
        # targets nearest to pending probes are already covered: drop as many picks
        for q in pending:
            if picks and len(picks) > k:
                nearest = min(range(len(picks)), key=lambda j: abs(self.p_bad[picks[j]] - self.p_bad[q]))
                picks.pop(nearest)
        return picks[:k]


def decided(post: Posterior, confidence: float) -> Block | None:
    top = post.top()
    return top if top.mass >= confidence else None




def _flat(values: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Every run's value in commit order, and each commit's run count."""
    counts = np.array([len(v) for v in values])
    return np.concatenate([np.asarray(v, float) for v in values]), counts


def _scored(flat: np.ndarray, counts: np.ndarray):
    """Per-commit run counts and sums of normal scores (and of squares), of
    runs given flat in commit order with ``counts`` per commit."""
    z = normal_scores(flat)
    owner = np.repeat(np.arange(counts.size), counts)
    s1 = np.bincount(owner, weights=z, minlength=counts.size)
    s2 = np.bincount(owner, weights=z * z, minlength=counts.size)
    return counts, s1, s2, z


def _changepoint_loglik(cn, c1, c2, n, t1, t2, floor):
    """The closed form of integrated_parts's values channel from prefix
    sums (cn, c1, c2 at b - 1 for b = 1..N: the good group's count, sum and
    sum of squares) and totals; broadcasts over leading axes (the information gain asks many
    what-ifs at once)."""
    bn, b1, b2 = n - cn, t1 - c1, t2 - c2
    ss = (c2 - c1 ** 2 / cn) + (b2 - b1 ** 2 / bn)
    ss = np.maximum(ss, floor)
    return -0.5 * np.log(cn * bn) - 0.5 * (n - 2) * np.log(ss)


def _fenced(flat: np.ndarray, lengths: np.ndarray, fence: tuple[float, float] | None):
    """(the runs inside the fence, flat, and their count per commit; counts
    below it, counts above it, run counts), or None when there is no fence
    or it would leave an endpoint without a run inside (then every run is
    scored)."""
    if fence is None:
        return None
    lo, hi = fence
    owner = np.repeat(np.arange(lengths.size), lengths)
    ins = (flat >= lo) & (flat <= hi)
    per = np.bincount(owner[ins], minlength=lengths.size)
    if not per[0] or not per[-1]:
        return None
    below = np.bincount(owner[flat < lo], minlength=lengths.size)
    above = np.bincount(owner[flat > hi], minlength=lengths.size)
    return (flat[ins], per), below, above, lengths


def _scored_inside(values: Sequence[Sequence[float]], fence: tuple[float, float] | None):
    """(the fence split or None, then _scored's counts, sums, squares and
    scores of the runs inside the fence, and their number), or None while
    an endpoint has no scored run or there are fewer than four: the
    integrated model has nothing to say yet."""
    flat, lengths = _flat(values)
    split = _fenced(flat, lengths, fence)
    counts, s1, s2, z = _scored(*(split[0] if split is not None else (flat, lengths)))
    n = int(counts.sum())
    if counts[0] == 0 or counts[-1] == 0 or n < 4:
        return None
    return split, counts, s1, s2, z, n


def _rate_loglik(k: np.ndarray, m: np.ndarray) -> np.ndarray:
    """log P(outside counts | B=b) for b = 1..N, up to a constant: the two
    sides throw runs past the fence at one shared unknown rate or at two
    (even odds, Jeffreys priors, integrated out). Outliers that both sides
    throw alike move nothing; a regression that shows as spikes does."""
    two, shared = _rate_parts(k, m)
    return np.logaddexp(two, shared)


def _rate_parts(k: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, float]:
    """(log P(counts | two rates, B=b) for b = 1..N, log P(counts | one
    shared rate)), with the rates integrated out under Jeffreys's
    Beta(1/2, 1/2), as git-bayesect does. Unlike a uniform prior it keeps
    real mass near a rate of 0: a good side that never spikes is the usual
    case, and a uniform prior charged every spike-free run at a good
    commit as if spikes were common there (v7 spikes: 178 runs a search,
    145 with Jeffreys)."""
    j = np.arange(0.0, m.sum() + 2)
    lg = np.concatenate([[0.0], np.cumsum(np.log(j[1:]))])                     # lg[j] = log j!
    lh = np.concatenate([[0.5 * math.log(math.pi)], 0.5 * math.log(math.pi) + np.cumsum(np.log(j[:-1] + 0.5))])
    # lh[j] = log Gamma(j + 1/2)

    def betaln(a, b):   # log B(a + 1/2, b + 1/2) / B(1/2, 1/2) for integer a, b >= 0
        return lh[a] + lh[b] - lg[a + b] - math.log(math.pi)

    K, M = int(k.sum()), int(m.sum())
    kg, mg = np.cumsum(k)[:-1], np.cumsum(m)[:-1]
    return betaln(kg, mg - kg) + betaln(K - kg, (M - mg) - (K - kg)), float(betaln(K, M - K))


def _side_rates(k: np.ndarray, m: np.ndarray, post: np.ndarray) -> tuple[float, float]:
    """Each side's predictive chance that its next run lands past the fence
    (counts ``k`` of ``m`` runs per commit), averaged over the posterior of
    B and over the shared-or-two-rates question, so a side with ten runs
    and none past is not credited a Jeffreys 1 in 22."""
    two, shared = _rate_parts(k, m)
    w = 1.0 / (1.0 + np.exp(np.clip(shared - two, -700, 700)))    # P(two rates | counts, B=b)
    K, M = float(k.sum()), float(m.sum())
    kg, mg = np.cumsum(k)[:-1], np.cumsum(m)[:-1]
    one = (K + 0.5) / (M + 1)
    good = w * (kg + 0.5) / (mg + 1) + (1 - w) * one
    bad = w * (K - kg + 0.5) / (M - mg + 1) + (1 - w) * one
    return float(np.sum(post * good)), float(np.sum(post * bad))


def integrated_parts(values: Sequence[Sequence[float]],
                     fence: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray | float] | None:
    """log P(all runs | B=b) for b = 1..N, in its two channels: (the runs
    inside the fence, by their normal scores; the counts past it, 0.0
    without a fence). Their sum is the integrated model's log likelihood
    (``_parts_posterior``); the stopping rule trusts them differently
    (``tempered``).

    Inside the fence, good and bad are each a normal distribution of the
    runs' normal scores whose means and common spread are unknown and
    integrated out (flat priors on the means, 1/sigma on the spread), as
    git-bayesect integrates out its failure rates. Nothing is plugged in,
    so nothing is over-trusted: with few runs the unknown centres keep the
    evidence modest, and as runs accumulate at interior commits they
    sharpen both sides (the endpoint calibration is refined by every run).
    Closed form: ``-1/2 log(n_G n_B) - (n-2)/2 log(SS_within(b))``.
    Returns None until both endpoints have a value and n >= 4.

    With a ``fence`` (decide.Model.fence) the runs beyond it are scored
    apart, by how often each side throws them past each end
    (_rate_loglik), so that an outlier at a good commit next to the
    boundary costs the answer a little, not the twenty ordinary runs it
    outweighs on squared distances.
    """
    scored = _scored_inside(values, fence)
    if scored is None:
        return None
    split, counts, s1, s2, z, n = scored
    cn, c1, c2 = np.cumsum(counts)[:-1], np.cumsum(s1)[:-1], np.cumsum(s2)[:-1]
    ll = _changepoint_loglik(cn, c1, c2, n, s1.sum(), s2.sum(), _ss_floor(z))
    return ll, (_outside_loglik(*split[1:]) if split is not None else 0.0)


def tempered(parts: tuple[np.ndarray, np.ndarray | float], confidence: float,
             untestable: Sequence[bool] | None = None) -> Posterior:
    """The integrated posterior the stopping rule reads at ``confidence``:
    the values' channel raised to a power under 1, the counts' as it is.

    The values' channel is a normal model of rank scores with one common
    spread: with a few dozen runs, neighbouring commits whose samples ran
    high or low by chance can lend a wrong boundary 99.9% of it. Its
    evidence is discounted (a power posterior) so that, on its own, it must
    reach 1 - (1 - confidence) * INTEGRATED_STRICTNESS (0.9997 for 0.99).
    The counts past the fence are Bernoulli trials with their rates
    integrated out, exact for exchangeable runs, so a regression that
    shows only as spikes is held to the user's mark."""
    ll_in, ll_out = parts
    power = _logit(confidence) / _logit(_strict(confidence))
    return Posterior(np.zeros(len(ll_in) + 1), untestable, log_prior=power * ll_in + ll_out)


def _parts_posterior(parts: tuple[np.ndarray, np.ndarray | float],
                     untestable: Sequence[bool] | None = None) -> Posterior:
    """The integrated posterior itself, both channels at full weight."""
    return Posterior(np.zeros(len(parts[0]) + 1), untestable, log_prior=parts[0] + parts[1])


def _strict(confidence: float) -> float:
    """The mark the values' channel must reach for ``confidence``."""
    return 1 - (1 - confidence) * INTEGRATED_STRICTNESS


integrated_mark = _strict


def _outside_loglik(below: np.ndarray, above: np.ndarray, m: np.ndarray) -> np.ndarray | float:
    """The fence's two rate channels, below and above apart: a good side's
    low tail and a bad side's high one are evidence, where pooled they
    would cancel. A channel no run has reached yet adds nothing."""
    return sum((_rate_loglik(k, m) for k in (below, above) if k.any()), 0.0)


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _ss_floor(z: np.ndarray) -> float:
    return 1e-12 * max(float(np.sum(z * z)), 1e-12)


# Gauss-Hermite nodes for the predictive value of one more run
_GH_X, _GH_W = np.polynomial.hermite.hermgauss(6)
_GH_X, _GH_W = _GH_X * math.sqrt(2.0), _GH_W / math.sqrt(math.pi)


def _block_entropy(logp: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Entropy (bits) of the block masses, for each row of log P(B=b)."""
    w = np.exp(logp - logp.max(axis=-1, keepdims=True))
    m = np.add.reduceat(w, starts, axis=-1)
    m = m / m.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.sum(np.where(m > 0, m * np.log2(m), 0.0), axis=-1)


def information_gain(values: Sequence[Sequence[float]], candidates: Sequence[int],
                     untestable: Sequence[bool] | None = None,
                     fence: tuple[float, float] | None = None) -> np.ndarray | None:
    """Expected bits about where the culprit is that one more run at each
    candidate commit would give, under the integrated model.

    Unlike the posterior median this values the endpoints too: when
    interior runs sit halfway between the endpoint samples, the two
    readings ("the good endpoint ran low" or "the bad one ran high") are
    settled only by measuring the endpoints again, and no interior run can
    tell them apart. The new run's normal score is drawn from the
    predictive mixture of the good and bad score distributions (their
    centres and spread averaged over the posterior) and integrated by
    Gauss-Hermite quadrature; ranks of the old runs are held fixed. With a
    ``fence`` the run may also land below or above it, at each side's
    posterior-averaged rate: a regression that shows only as spikes is
    worth probing for those alone.
    """
    scored = _scored_inside(values, fence)
    if scored is None:
        return None
    split, counts, s1, s2, z, n = scored
    nb = len(values) - 1
    unt = np.zeros(nb + 1, bool) if untestable is None else np.asarray(untestable, bool)
    # block starts over b = 1..N (position b - 1): a block ends at a testable commit
    ends = _block_ends(unt)
    starts = np.concatenate([[0], ends[:-1]])
    cn, c1, c2 = np.cumsum(counts)[:-1], np.cumsum(s1)[:-1], np.cumsum(s2)[:-1]
    t1, t2, floor = float(s1.sum()), float(s2.sum()), _ss_floor(z)
    ll_in = _changepoint_loglik(cn, c1, c2, n, t1, t2, floor)
    ll = ll_in + (_outside_loglik(*split[1:]) if split is not None else 0.0)
    post = np.exp(ll - ll.max())
    post /= post.sum()
    h_now = float(_block_entropy(ll, starts))
    bn = n - cn
    m_good = float(np.sum(post * c1 / cn))
    m_bad = float(np.sum(post * (t1 - c1) / bn))
    ss = (c2 - c1 ** 2 / cn) + ((t2 - c2) - (t1 - c1) ** 2 / bn)
    sd = math.sqrt(max(float(np.sum(post * ss)) / max(n - 2, 1), 1e-6))
    if split is not None:
        below, above, m = split[1:]
        (lo_g, lo_b), (hi_g, hi_b) = _side_rates(below, m, post), _side_rates(above, m, post)
    else:
        lo_g = lo_b = hi_g = hi_b = 0.0
    p_bad = np.concatenate([[0.0], np.cumsum(post)])       # commit i bad iff B <= i
    j = np.arange(nb)                                        # position of b = j + 1
    gains = np.zeros(len(candidates))
    for k, i in enumerate(candidates):
        pb = float(np.clip(p_bad[i], 0.0, 1.0))
        zq = np.concatenate([m_good + sd * _GH_X, m_bad + sd * _GH_X])
        wq = np.concatenate([(1 - pb) * (1 - lo_g - hi_g) * _GH_W, pb * (1 - lo_b - hi_b) * _GH_W])
        inc = (j >= i).astype(float)                         # commit i is in the good group of b > i
        cn_q = cn + inc
        c1_q = c1 + zq[:, None] * inc
        c2_q = c2 + (zq ** 2)[:, None] * inc
        llq = _changepoint_loglik(cn_q, c1_q, c2_q, n + 1, t1 + zq[:, None], t2 + (zq ** 2)[:, None], floor)
        expected = 0.0
        if split is not None:
            m1 = m.copy()
            m1[i] += 1
            llq = llq + _outside_loglik(below, above, m1)
            for w, lo, hi in (((1 - pb) * lo_g + pb * lo_b, 1, 0), ((1 - pb) * hi_g + pb * hi_b, 0, 1)):
                b1, a1 = below.copy(), above.copy()
                b1[i] += lo
                a1[i] += hi
                expected += w * float(_block_entropy(ll_in + _outside_loglik(b1, a1, m1), starts))
        gains[k] = h_now - float(np.sum(wq * _block_entropy(llq, starts))) - expected
    return gains


@dataclass
class CommitRuns:
    """What is known about one candidate commit."""

    values: list[float]
    crashes: int = 0
    build_failed: bool = False


def crashes_to_give_up(commits: Sequence[CommitRuns], crash_limit: int = 2,
                       false_alarm: float | None = None) -> int:
    """Crashes in a row, with no value, that make a commit untestable:
    ``crash_limit``, or more when crashes are common at commits that do work
    (8% flaky crashes give two in a row at 1 commit in 150, and a culprit
    marked untestable is a wrong answer)."""
    return _crashes_for(_flaky_crash_rate(commits), crash_limit,
                        GIVE_UP_FALSE_ALARM if false_alarm is None else false_alarm)


def _flaky_crash_rate(commits: Sequence[CommitRuns]) -> float:
    """Crashes per run at commits that do print values, counting half a
    crash more than seen, so a short clean history does not look crash-free."""
    crashes = sum(c.crashes for c in commits if c.values)
    runs = sum(c.crashes + len(c.values) for c in commits if c.values)
    return (crashes + 0.5) / (runs + 1)


def _crashes_for(rate: float, crash_limit: int, false_alarm: float, cap: int | None = None) -> int:
    # up to `klbisect probe`'s cap: at a 50% crash rate six crashes in a row (the
    # old cap) wrote off a testable commit beside the culprit one time in 64
    k = crash_limit
    while rate ** k > false_alarm and k < (cap or MAX_CRASH_SKIP):
        k += 1
    return k


@dataclass
class Plan:
    posterior: Posterior
    model: object                 # decide.Model or decide.ThresholdModel
    done: Block | None            # the answer, once a block holds --confidence
    next: list[int]               # commits to probe now
    untestable: np.ndarray
    exhausted: np.ndarray
    integrated: bool = False      # judged by the integrated model (the sides overlap)
    lost: object = None           # decide.Separation: the endpoints' difference faded (stop, no signal)
    unproven: object = None       # decide.Separation: an answer of the whole range waits for the endpoints to differ
    widening: bool = False        # nothing inside is left to run: ``next`` measures the endpoints again
    held: tuple = ()              # commits the likeliest answer rests on that hold all the runs they may get
    held_cap: int = 0             # ... that many (a --max-runs to raise); not those stopped by crashes
    # why the integrated model judges though ``model`` separates (its answer was not trusted), for status
    took_over: str = ""


def _posterior(commits: Sequence[CommitRuns], model, untestable: np.ndarray, refine: bool):
    """The posterior over the culprit's place, and the model it came from:
    ``(model, posterior, integrated parts or None, fence)``. With ``refine``
    the model is fitted again to the endpoints' runs and those of commits
    already placed firmly on a side; where good and bad overlap, the unknown
    distributions are integrated out instead of plugged in."""
    n = len(commits) - 1
    def evidence(m) -> np.ndarray:
        s = np.zeros(n + 1)
        for i in range(1, n):
            if commits[i].values:
                s[i] = m.commit_log_lr(commits[i].values)
        return s

    fence = model.fence() if isinstance(model, Model) else None
    if fence is not None and model.mad and (len(commits[0].values) + len(commits[n].values)
                                            > model.n_good + model.n_bad):
        # the search runs the endpoints again when they are worth it: their
        # runs since calibration sharpen the fence (a model stored before
        # ``mad`` keeps its old fence, so a resumed session judges alike)
        fence = Model.fit(commits[0].values, commits[n].values).fence()
    integrated = None     # the integrated model's two channels, once it judges
    values = [c.values for c in commits]
    # When good and bad overlap, plugging in the endpoint estimates over-trusts
    # every run (they are shared by all runs, and a lucky early separation
    # inflates them): integrate the unknown distributions out instead.
    if isinstance(model, Model) and not model.separates:
        integrated = integrated_parts(values, fence)
    if integrated is not None:
        post = _parts_posterior(integrated, untestable)
    else:
        post = Posterior(evidence(model), untestable)
    if refine and isinstance(model, Model):
        good = list(commits[0].values)
        bad = list(commits[n].values)
        # A model started on a few endpoint runs a side (``separates`` but
        # not yet ``decisive``) grows fast only from a looser pool; its
        # answers wait until the pooled runs make it decisive.
        pool = POOL_P if model.decisive or not model.separates else PROVISIONAL_POOL_P
        for i in range(1, n):
            if commits[i].values:
                if post.p_bad[i] < pool:
                    good += commits[i].values
                elif post.p_bad[i] > 1 - pool:
                    bad += commits[i].values
        # Endpoint runs the search added count too: a model kept from a dozen
        # calibration runs told `status` that hundreds of the good endpoint's
        # own runs looked bad (a range with no regression, started on a hint).
        ends = len(commits[0].values) + len(commits[n].values)
        if len(good) + len(bad) > ends or ends > model.n_good + model.n_bad:
            model = Model.fit(good, bad, cap=model.cap, strays_within=True)
            # Interior runs can show what lucky endpoint samples hid: the
            # sides overlap after all. Then no single run is near-decisive.
            if integrated is None and not model.separates:
                integrated = integrated_parts(values, fence)
                if integrated is not None:
                    post = _parts_posterior(integrated, untestable)
            if integrated is None:
                post = Posterior(evidence(model), untestable)
    return model, post, integrated, fence


def plan(commits: Sequence[CommitRuns], model, confidence: float = 0.99, k: int = 1,
         max_runs: int | None = None, crash_limit: int = 2, pending: Sequence[int] = (),
         refine: bool = True, max_endpoint_runs: int | None = None) -> Plan:
    """One step of the search, from everything seen so far.

    ``commits[0]`` and ``commits[-1]`` are the endpoints: their runs define
    the model. With ``refine``, interior commits the posterior already
    places firmly on one side add their runs to the model (one EM step), so
    a few endpoint runs are enough to start and the model sharpens as the
    search goes. ``max_endpoint_runs`` caps the endpoint runs spent proving
    that an answer of the whole range is a regression (the user's
    --max-endpoint-runs; default ``decide.MAX_ENDPOINT_RUNS``).
    """
    n = len(commits) - 1
    # A commit the answer would have to include as "untestable" gets more
    # chances than one far from it: two flaky crashes in a row at the culprit
    # would otherwise widen the answer to a block.
    rate = _flaky_crash_rate(commits)
    # ... at the rate of the end that crashes more: when only bad commits crash
    # (a regression that runs out of memory 40% of the time), the rate pooled
    # over both sides is half the culprit's, and a culprit that crashed six
    # times in a row was written off as untestable (a tester's 98.7% right).
    # Not on one crash: smoothed over a few runs, it doubled the runs spent on
    # a commit that never works (a reviewer's).
    answer_rate = max([rate] + [c.crashes / (c.crashes + len(c.values)) for c in (commits[0], commits[n])
                                if c.values and c.crashes >= 2])
    answer_limit = _crashes_for(answer_rate, crash_limit, ANSWER_FALSE_ALARM, cap=ANSWER_MAX_CRASHES)
    crash_limit = _crashes_for(rate, crash_limit, GIVE_UP_FALSE_ALARM)
    untestable = np.array([c.build_failed or (not c.values and c.crashes >= crash_limit)
                           for c in commits], bool)
    untestable[0] = untestable[n] = False

    model, post, integrated, fence = _posterior(commits, model, untestable, refine)
    values = [c.values for c in commits]
    # The integrated posterior is exact only under its flat priors: with a
    # few dozen runs, endpoint samples that ran high or low by chance can
    # lend a wrong boundary 99%. Its values' channel must reach a stricter mark.
    done = decided(post, confidence) if integrated is None else _integrated_done(integrated, post, confidence)
    took_over = ""
    if done and integrated is None and isinstance(model, Model):
        # Endpoint runs of an overlapping regression can look separated by
        # chance, and the plug-in model then names a confident wrong commit,
        # typically next to an endpoint with every interior run on one side.
        # So a plug-in answer needs runs of its own on both sides, and a
        # second opinion that assumes nothing of the values' shape must give
        # it a chance; otherwise the integrated model takes over.
        second = integrated_parts(values, fence)
        sides = (sum(len(commits[i].values) for i in range(1, done.first)),
                 sum(len(commits[i].values) for i in range(done.first, n)))
        if second is not None:
            alt = _parts_posterior(second, untestable)
            if min(sides) < MIN_SIDE_RUNS:
                took_over = (f"its answer rests on {fmt_count(min(sides), 'run')} of commits inside the range on "
                             f"one side ({MIN_SIDE_RUNS} needed)")
            elif float(alt.p_first_bad[done.indices].sum()) < SECOND_OPINION:
                took_over = (f"a rank-based second opinion gives its answer only "
                             f"{float(alt.p_first_bad[done.indices].sum()):.2g} (under {SECOND_OPINION:g})")
            if took_over:
                integrated, post = second, alt
                done = _integrated_done(integrated, post, confidence)
    stretch = max_runs is None and integrated is not None     # the default cap, not the user's --max-runs
    if max_runs is None:
        max_runs = OVERLAP_MAX_RUNS if integrated is not None else runs_per_commit(model)
    exhausted = np.array([len(c.values) >= max_runs or c.crashes >= max_runs + crash_limit
                          for c in commits], bool)
    if done is None and integrated is not None:
        # The stricter mark guards against a few dozen runs that fell high or
        # low by chance. Once both commits the answer rests on hold all the
        # runs they may get, more runs elsewhere cannot settle it: the
        # search would spend the rest on an endpoint. The user's mark is met.
        user = decided(post, confidence)
        if user and all(exhausted[i] or i in (0, n) for i in resting_on(user, untestable)):
            done = user
    # the commits the likeliest answer rests on, but not those its crashes stopped
    resting = [i for i in resting_on(post.top(), untestable)
               if 0 < i < n and commits[i].crashes < max_runs + crash_limit]
    held_cap = max_runs * (RESTING_MAX_RUNS if stretch else 1)
    if done is None and stretch:
        # Short of the user's mark, those two are where runs settle it: at the
        # default cap they would go ten commits away, at P(bad) = 0.000 (a
        # tester's 300 runs there, "NOT sure" at 0.95, where --max-runs 400
        # settled it in 222 more).
        for i in resting:
            exhausted[i] = len(commits[i].values) >= held_cap
    nxt: list[int] = []
    unproven = None
    widening = False
    if done and integrated is None and isinstance(model, Model) and not model.decisive:
        # Separated, but on too few runs a side to trust the plug-in model
        # with an answer: the endpoints, which pool for certain, get more.
        done = None
        nxt = sorted((i for i in (0, n) if i not in pending), key=lambda i: len(commits[i].values))[:k]
    if done and BOUNDARY_RUNS > 1:
        # The answer rests on the commits either side of the boundary: each
        # must have been seen more than once, so one outlier cannot decide it.
        # The one on the high side more: a divergence's outliers are large, so
        # two of a good commit's can pass for a regression no endpoint run showed.
        last_good, first_bad = resting_on(done, untestable)
        up = not isinstance(model, Model) or model.mu_bad >= model.mu_good
        need = {last_good: BOUNDARY_RUNS + (0 if up else HIGH_SIDE_EXTRA),
                first_bad: BOUNDARY_RUNS + (HIGH_SIDE_EXTRA if up else 0)}
        thin = [i for i in (last_good, first_bad) if 0 < i < n and len(commits[i].values) < need[i]
                and not exhausted[i]]
        if thin:
            done, nxt = None, [i for i in thin if i not in pending][:k]
    if done and integrated is not None and all(untestable[i] or i in done.indices for i in range(1, n + 1)):
        # The answer is every commit there is (adjacent endpoints, say): the
        # posterior gives it everything whether or not anything changed, so
        # it rests on the endpoints alone, which began on a hint (p <= 0.2).
        # They must differ at the answer's own level first (p <= 0.01 for
        # 0.99): at 0.05, one null pair of endpoints in twenty passed.
        sep = separation(commits[0].values, commits[n].values)
        if sep.p_value > 1 - confidence:
            done, unproven = None, sep
            nxt = _endpoints_wanted(commits, pending, max_endpoint_runs or MAX_ENDPOINT_RUNS, crash_limit, k)
    if done and not nxt:
        retry = [i for i in done.indices[:-1] if not commits[i].build_failed and not commits[i].values
                 and commits[i].crashes < answer_limit]
        if retry:
            done, nxt = None, [i for i in retry if i not in pending][:k]
    if done is None and not nxt and unproven is None:
        nxt = post.choose(k, excluded=exhausted, pending=pending)
        if integrated is not None:
            nxt = _most_informative(commits, post, nxt, k, exhausted, untestable, pending,
                                    endpoint_max=max(4 * max_runs, 40), fence=fence)
        elif not nxt and isinstance(model, Model):
            # Every commit that could settle it holds all the runs it may get, judged by a
            # model of a few endpoint runs a side: those that ran narrow by chance leave a
            # culprit whose runs fall between the sides undecided (a new user's default
            # history: six bad runs of 0.0100-0.0129, the culprit's of 0.0071-0.0121, "NOT
            # sure" at 0.98). The endpoints pool for certain, and more of them widen the side.
            widening = True
            nxt = _endpoints_wanted(commits, pending, max_endpoint_runs or MAX_ENDPOINT_RUNS, crash_limit, k)
    lost = None
    if done is None and integrated is not None and LOST_CHECK:
        lost = lost_separation(commits[0].values, commits[n].values)
    held = tuple(i for i in resting if len(commits[i].values) >= held_cap) if done is None else ()
    return Plan(post, model, done, nxt, untestable, exhausted, integrated is not None, lost, unproven, widening,
                held, held_cap, took_over)


def _endpoints_wanted(commits: Sequence[CommitRuns], pending: Sequence[int], cap: int, crash_limit: int,
                      k: int) -> list[int]:
    """Endpoints to measure again, the one with fewer runs first: under
    ``cap`` runs each, and not one whose probe now mostly crashes (a broken
    environment would spend the whole --max-total-runs there, where the
    canary, which looks for crashes at several commits, does not look)."""
    n = len(commits) - 1
    return [i for i in sorted((0, n), key=lambda i: len(commits[i].values))
            if i not in pending and len(commits[i].values) < cap
            and commits[i].crashes < len(commits[i].values) + crash_limit][:k]


def _integrated_done(parts: tuple[np.ndarray, np.ndarray | float], post: Posterior,
                     confidence: float) -> Block | None:
    """The integrated model's answer: its posterior at the stricter mark,
    or at the user's once the values' channel is discounted (``tempered``),
    which on the values alone is never looser (a power under 1 of a sum is
    at most the sum of the powers) but lets the counts past the fence
    decide at the user's mark."""
    return (decided(post, _strict(confidence))
            or decided(tempered(parts, confidence, post.untestable), confidence))


def resting_on(block: Block, untestable: np.ndarray) -> tuple[int, int]:
    """The two commits an answer rests on: the last testable one before the
    block (good) and the block's last (bad)."""
    before = max((i for i in range(block.first) if not untestable[i]), default=0)
    return before, block.last


# Per-commit chance of calling a commit untestable because of flaky crashes
# alone: anywhere, and where the answer would rest on it.
GIVE_UP_FALSE_ALARM = 3e-3
ANSWER_FALSE_ALARM = 1e-4
# ... the latter up to this many crashes in a row: twelve (probe's cap) wrote off a
# culprit crashing 60% of its runs one time in 460 (a tester's 95-98.8% right)
ANSWER_MAX_CRASHES = 30
# Stop an integrated search whose endpoints no longer differ (decide.lost_separation).
LOST_CHECK = True
# Runs each commit beside an answer's boundary must have (plan).
BOUNDARY_RUNS = 2
# Under the default cap of overlapping values, the commits the likeliest answer rests on may take
# this many times the cap while it is short of the mark (plan); a --max-runs given is kept as given.
RESTING_MAX_RUNS = 4
HIGH_SIDE_EXTRA = 1      # ... and the one of them on the high side this many more (docs/benchmarks.rst: 2026-12-02)
# interior commits this sure of a side lend it their runs (plan's refine)
POOL_P = 0.001
PROVISIONAL_POOL_P = 0.02
# The integrated posterior's values' channel must reach 1 - (1 - confidence) * this.
INTEGRATED_STRICTNESS = 0.03
# A plug-in answer stands only if the integrated model gives it at least this
# much, and at least MIN_SIDE_RUNS interior runs sit on each side of it.
SECOND_OPINION = 0.05
MIN_SIDE_RUNS = 3

# where the information gain looks, besides the median: P(bad) quantiles
_GAIN_TARGETS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)


def _most_informative(commits: Sequence[CommitRuns], post: Posterior, picks: list[int], k: int,
                      exhausted: np.ndarray, untestable: np.ndarray, pending: Sequence[int],
                      endpoint_max: int, fence: tuple[float, float] | None = None) -> list[int]:
    """With overlapping values, ask the question worth the most bits: one
    commit among the posterior's quantiles and the two endpoints. With k
    slots the quantile split points stay, and an endpoint worth more than
    the weakest of them takes its place."""
    n = post.n
    cands = set(picks)
    for t in _GAIN_TARGETS if k == 1 and not pending else ():
        cands.update(post.choose(1, excluded=exhausted) if t == 0.5 else _nearest(post, t, exhausted))
    ends = [i for i in (0, n) if len(commits[i].values) < endpoint_max and i not in pending]
    cands.update(ends)
    cands -= set(pending)
    order = sorted(cands)
    if not order:
        return picks
    gains = information_gain([c.values for c in commits], order, untestable, fence)
    if gains is None:
        return picks
    g = dict(zip(order, gains))
    if k == 1 and not pending:
        return [max(order, key=lambda i: (g[i], -abs(post.p_bad[i] - 0.5)))]
    out = list(picks)
    for e in sorted(ends, key=lambda i: -g[i]):
        weakest = min(range(len(out)), key=lambda j: g.get(out[j], 0.0)) if out else None
        if weakest is None or len(out) < k:
            out.append(e)
        elif g[e] > g.get(out[weakest], 0.0):
            out[weakest] = e
    return out[:k]


def _nearest(post: Posterior, t: float, excluded: np.ndarray) -> list[int]:
    can = ~post.untestable & ~np.asarray(excluded, bool)
    can[0] = can[post.n] = False
    idx = np.flatnonzero(can)
    if idx.size == 0:
        return []
    return [int(idx[np.argmin(np.abs(post.p_bad[idx] - t))])]
