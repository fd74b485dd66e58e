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

from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np


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
        self.p_bad = np.cumsum(self.p_first_bad)                    # index i -> P(commit i bad)

    def blocks(self) -> list[Block]:
        out: list[Block] = []
        pending: list[int] = []
        for i in range(1, self.n + 1):
            pending.append(i)
            if not self.untestable[i] or i == self.n:
                out.append(Block(pending, float(self.p_first_bad[pending].sum())))
                pending = []
        return out

    def top(self) -> Block:
        return max(self.blocks(), key=lambda b: b.mass)

    def top_blocks(self, k: int = 5) -> list[Block]:
        return sorted(self.blocks(), key=lambda b: -b.mass)[:k]

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
    inv_cdf = NormalDist().inv_cdf
    return np.array([inv_cdf(p) for p in (ranks - 0.375) / (n + 0.25)])


def integrated_loglik(values: Sequence[Sequence[float]]) -> np.ndarray | None:
    """log P(all runs | B=b) for b = 1..N with good and bad each a normal
    distribution of the runs' normal scores whose means and common spread
    are unknown and integrated out (flat priors on the means, 1/sigma on
    the spread), as git-bayesect integrates out its failure rates.

    Nothing is plugged in, so nothing is over-trusted: with few runs the
    unknown centres keep the evidence modest, and as runs accumulate at
    interior commits they sharpen both sides (the endpoint calibration is
    refined by every run). Closed form:
    ``-1/2 log(n_G n_B) - (n-2)/2 log(SS_within(b))``.
    Returns None until both endpoints have a value and n >= 4.
    """
    counts = np.array([len(v) for v in values])
    n = int(counts.sum())
    if counts[0] == 0 or counts[-1] == 0 or n < 4:
        return None
    flat = np.concatenate([np.asarray(v, float) for v in values if len(v)])
    z = normal_scores(flat)
    owner = np.repeat(np.arange(len(values)), counts)
    s1 = np.bincount(owner, weights=z, minlength=len(values))
    s2 = np.bincount(owner, weights=z * z, minlength=len(values))
    # good group of hypothesis b: commits 0..b-1; bad: b..N
    cn, c1, c2 = np.cumsum(counts)[:-1], np.cumsum(s1)[:-1], np.cumsum(s2)[:-1]
    bn, b1, b2 = n - cn, s1.sum() - c1, s2.sum() - c2
    ss = (c2 - c1 ** 2 / cn) + (b2 - b1 ** 2 / bn)
    ss = np.maximum(ss, 1e-12 * max(float(np.sum(z * z)), 1e-12))
    return -0.5 * np.log(cn * bn) - 0.5 * (n - 2) * np.log(ss)


@dataclass
class CommitRuns:
    """What is known about one candidate commit."""

    values: list[float]
    crashes: int = 0
    build_failed: bool = False


@dataclass
class Plan:
    posterior: Posterior
    model: object                 # decide.Model or decide.ThresholdModel
    done: Block | None            # the answer, once a block holds --confidence
    next: list[int]               # commits to probe now
    untestable: np.ndarray
    exhausted: np.ndarray


def plan(commits: Sequence[CommitRuns], model, confidence: float = 0.99, k: int = 1,
         max_runs: int = 10, crash_limit: int = 2, pending: Sequence[int] = (),
         refine: bool = True, boundary_runs: int = 2) -> Plan:
    """One step of the search, from everything seen so far.

    ``commits[0]`` and ``commits[-1]`` are the endpoints: their runs define
    the model. With ``refine``, interior commits the posterior already
    places firmly on one side add their runs to the model (one EM step), so
    a few endpoint runs are enough to start and the model sharpens as the
    search goes.
    """
    from .decide import Model  # pure; imported here to keep the module graph flat

    n = len(commits) - 1
    untestable = np.array([c.build_failed or (not c.values and c.crashes >= crash_limit)
                           for c in commits], bool)
    untestable[0] = untestable[n] = False

    def evidence(m) -> np.ndarray:
        s = np.zeros(n + 1)
        for i in range(1, n):
            if commits[i].values:
                s[i] = float(np.sum(m.log_lr(commits[i].values)))
        return s

    integrated = None
    # When good and bad overlap, plugging in the endpoint estimates over-trusts
    # every run (they are shared by all runs, and a lucky early separation
    # inflates them): integrate the unknown distributions out instead.
    if isinstance(model, Model) and not model.decisive:
        integrated = integrated_loglik([c.values for c in commits])
    if integrated is not None:
        post = Posterior(np.zeros(n + 1), untestable, log_prior=integrated)
    else:
        post = Posterior(evidence(model), untestable)
    if refine and isinstance(model, Model):
        good = list(commits[0].values)
        bad = list(commits[n].values)
        for i in range(1, n):
            if commits[i].values:
                if post.p_bad[i] < 0.001:
                    good += commits[i].values
                elif post.p_bad[i] > 0.999:
                    bad += commits[i].values
        if len(good) + len(bad) > len(commits[0].values) + len(commits[n].values):
            model = Model.fit(good, bad, cap=model.cap)
            if integrated is None:
                post = Posterior(evidence(model), untestable)
    exhausted = np.array([len(c.values) >= max_runs or c.crashes >= max_runs + crash_limit
                          for c in commits], bool)
    done = decided(post, confidence)
    nxt: list[int] = []
    if done and boundary_runs > 1:
        # The answer rests on the commits either side of the boundary: each
        # must have been seen more than once, so one outlier cannot decide it.
        before = max((i for i in range(done.first) if not untestable[i]), default=0)
        thin = [i for i in (before, done.last) if 0 < i < n and len(commits[i].values) < boundary_runs
                and not exhausted[i]]
        if thin:
            done, nxt = None, [i for i in thin if i not in pending][:k]
    if done is None and not nxt:
        nxt = post.choose(k, excluded=exhausted, pending=pending)
    return Plan(post, model, done, nxt, untestable, exhausted)
