#!/usr/bin/env python3
"""How many builds a pool of worktrees costs a parallel run, against the
fewest any choice of worktree could have cost.

Replays the runs of a finished ``klbisect run --parallel P`` session, in the
order and with the durations they had, through a pool of checkouts, and
counts the builds where every commit needs its own (``--build-paths '*'``).
A repeat of the commit a free checkout last had is no build; a fresh
checkout is taken before a used one. The policies differ only in which used
checkout a commit that needs a build evicts:

* ``lru``: the one idle longest (what ``executors.LocalExecutor`` does);
* ``window W``: the one whose commit was asked least in the last W runs;
* ``oracle``: the one whose commit is asked next furthest in the future
  (Belady's rule: the fewest builds of any rule, knowing the future).

    python scripts/pool_replay.py REPO --parallel 3 [--session ID]

The gap between ``lru`` and ``oracle`` is all that a better eviction rule
could save; the rest are commits the search asks for the first time or
after the pool has moved on.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import git  # noqa: E402

from klbisect import repo as gitrepo  # noqa: E402
from klbisect.store import Store  # noqa: E402


def replay(runs: list[tuple[str, float, float]], checkouts: int, evict: str, window: int = 0) -> int:
    """Builds for ``runs`` ((sha, started, duration) in start order)."""
    order = [sha for sha, _, _ in runs]
    later: dict[str, list[int]] = collections.defaultdict(list)
    for j in range(len(order) - 1, -1, -1):
        later[order[j]].append(j)      # popped from the end: the next use first
    last: dict[int, str] = {}
    used: dict[int, int] = {}
    busy_until: dict[int, float] = {}
    builds = 0
    for j, (sha, started, duration) in enumerate(runs):
        later[sha].pop()
        free = [c for c in range(checkouts) if busy_until.get(c, -1.0) <= started]
        c = next((c for c in free if last.get(c) == sha), None)
        if c is None:
            builds += 1
            fresh = [c for c in free if c not in last]
            old = [c for c in free if c in last]
            if fresh or not old:
                c = fresh[0] if fresh else min(busy_until, key=busy_until.get)
            elif evict == "lru":
                c = min(old, key=used.get)
            elif evict == "window":
                asked = collections.Counter(order[max(0, j - window):j])
                c = min(old, key=lambda c: (asked[last[c]], used[c]))
            else:
                c = max(old, key=lambda c: later[last[c]][-1] if later[last[c]] else len(order))
        last[c], used[c], busy_until[c] = sha, j, started + duration
    return builds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("repo", help="the repository a `klbisect run --parallel P` finished in")
    ap.add_argument("--parallel", type=int, required=True, help="the run's P (its pool has 2P + 1 checkouts)")
    ap.add_argument("--session", type=int, help="default: the latest run session")
    args = ap.parse_args()
    store = Store(gitrepo.common_dir(git.Repo(args.repo)) / "klbisect" / "state.db")
    sid = args.session or store.latest_session(("run",)).id
    runs = sorted(((r.sha, r.started, r.duration or 0.0) for r in store.session_runs(sid)), key=lambda r: r[1])
    built = store.db.execute("SELECT COUNT(*) FROM builds WHERE started BETWEEN ? AND ?",
                             (runs[0][1] - 600, max(s + d for _, s, d in runs))).fetchone()[0]
    pool = 2 * args.parallel + 1
    print(f"session {sid}: {len(runs)} runs of {len({r[0] for r in runs})} commits, "
          f"{pool} checkouts; builds recorded: {built}")
    print(f"  lru (klbisect)   {replay(runs, pool, 'lru')}")
    for w in (20, 80, 320):
        print(f"  window {w:<9} {replay(runs, pool, 'window', w)}")
    print(f"  oracle           {replay(runs, pool, 'oracle')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
