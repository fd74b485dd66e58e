"""What a user reads: the summary of a bisect, the status of a session."""
from __future__ import annotations

import math

from .session import Result


def _range(s: dict) -> str:
    if not s or not s.get("n"):
        return "no runs"
    return f"{s['median']:.4g} [{s['min']:.4g}, {s['max']:.4g}] n={s['n']}"


def pr_text(pr: int | None) -> str:
    return f"#{pr}" if pr else "no PR number"


def format_result(res: Result | dict) -> str:
    r = res if isinstance(res, dict) else res.to_json()
    lines = []
    if r["culprit"]:
        lines.append(f"First bad commit: {r['culprit']}")
        lines.append(f"  {r['subject']}  ({pr_text(r['pr'])})")
    else:
        lines.append(f"First bad commit is one of {len(r['candidates'])} commits "
                     "that cannot be told apart (untestable ones are in the way):")
        for c in r.get("candidate_info", []):
            lines.append(f"  {c['sha'][:12]}  {c['subject']}  ({pr_text(c['pr'])}; {c['why']})")
    conf = r["confidence"]
    lines.append(f"Confidence: {conf:.4f}{'' if r['complete'] else '  (NOT reached: ' + r['reason'] + ')'}")
    lines.append(f"Probe runs: {r['probe_runs']} ({r['probe_seconds']:.0f}s probing"
                 + (f", {r['build_seconds']:.0f}s building" if r.get("build_seconds") else "")
                 + f") over {r['n_commits']} candidate commits")
    if r.get("labels"):
        lines.append("KL before -> after (median [min, max] n):")
        for lab, s in r["labels"].items():
            lines.append(f"  {lab:<20} {_range(s['before'])}  ->  {_range(s['after'])}")
    for note in r.get("notes", []):
        lines.append(f"Note: {note}")
    return "\n".join(lines)


def format_status(st: dict) -> str:
    if not st.get("session"):
        return "No klbisect session in this repository."
    lines = [f"Session {st['session']} ({st['kind']}, {st['state']}): good {str(st['good'])[:12]} "
             f"bad {str(st['bad'])[:12]}, {st.get('n_commits', '?')} candidate commits, "
             f"{st.get('probe_runs', 0)} probe runs"]
    m = st.get("model")
    if m and m.get("kind") == "learned":
        f = math.exp if m["log_space"] else (lambda x: x)
        lines.append(f"Learned from the endpoints: good around {f(m['mu_good']):.4g}, bad around "
                     f"{f(m['mu_bad']):.4g} ({abs(m['mu_bad'] - m['mu_good']) / m['scale']:.1f} run-to-run "
                     f"spreads apart{', log scale' if m['log_space'] else ''})")
    elif m and m.get("kind") == "threshold":
        lines.append(f"Classic mode: a run fails at or above {m['threshold']:g}; majority of {m['votes']} runs")
    for c in st.get("commits", []):
        vals = ", ".join(f"{v:.4g}" for v in c["values"][:8]) + (" ..." if len(c["values"]) > 8 else "")
        extra = []
        if c["crashes"]:
            extra.append(f"{c['crashes']} crashed")
        if c["build_failed"]:
            extra.append("build failed")
        verdict = c.get("verdict")
        p = c.get("p_bad")
        ev = c.get("log_lr", 0.0)
        why = (f"LR {math.exp(min(abs(ev), 700)):.3g}:1 for {'bad' if ev > 0 else 'good'}" if c["values"] else "")
        head = f"  [{c['index']:>4}] {c['sha'][:12]} {c['subject'][:50]:<50}"
        lines.append(head + (f" {verdict.upper():<5}" if verdict else "      ")
                     + (f" P(bad)={p:.3f}" if p is not None else ""))
        lines.append(f"         values [{vals}] {'; '.join(extra)} {why}" + (f"; {c['reason']}" if c.get("reason") else ""))
    if st.get("top"):
        lines.append("Most likely first bad commit:")
        for t in st["top"][:3]:
            names = ", ".join(s[:12] for s in t["candidates"])
            lines.append(f"  {t['mass']:.4f}  {names}  {t['subjects'][-1][:60]}")
    if st.get("result"):
        lines.append("")
        lines.append(format_result(st["result"]))
    return "\n".join(lines)
