"""klbisect report: markdown that fits one GitHub comment, self-contained
HTML with the plot embedded, JSON, the PNG plot, PR metadata from the cache
or GitHub (loopback), on real generated repositories and real sqlite state."""
from __future__ import annotations

import base64
import dataclasses
import html
import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from unittest import mock

import click
import numpy as np
import pytest
from click.testing import CliRunner

from conftest import json_tail, klb, probe_cmd
from klbisect.cli_report import history, nightly, report
from klbisect.decide import Model
from klbisect.errors import KlbisectError
from klbisect.histgen import NoiseModel, make_history
from klbisect.metric import fmt_confidence
from klbisect.report import GITHUB_COMMENT_LIMIT, format_result, render_html, report_data, write_report
from klbisect.config import BisectConfig, make_probe
from klbisect.session import run_bisect
from klbisect.workspace import Workspace

PY = sys.executable
PNG = b"\x89PNG\r\n\x1a\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def bisected(tmp_path_factory):
    """A 80-commit history bisected for real (subprocess probes)."""
    h = make_history(tmp_path_factory.mktemp("rep") / "repo", n_commits=80, culprit_index=51, seed=8,
                     merges=4, build_broken_before=1, crash_before=1)
    cfg = BisectConfig(good=h.good, bad=h.bad, probe_cmd=f"{PY} probe.py", build_cmd=f"{PY} build.py")
    # the same draws every time (conftest's same_draws starts after a module's fixtures): one
    # in twelve drew no commit placed by the search, which test_markdown_report looks for
    with mock.patch.dict(os.environ, {"KVSERVE_PROBE_DRAWS": str(tmp_path_factory.mktemp("draws"))}):
        res = run_bisect(h.path, cfg, progress=lambda m: None)
    assert res.complete and res.culprit == h.culprit
    return h, res


def group() -> click.Group:
    g = click.Group()
    for c in (report, nightly, history):
        g.add_command(c)
    return g


def test_markdown_report(bisected, tmp_path):
    h, res = bisected
    out = tmp_path / "r.md"
    rep = write_report(h.path, fmt="md", out=str(out), offline=True)
    text = out.read_text()
    assert rep["path"] == str(out) and len(text) <= GITHUB_COMMENT_LIMIT
    title = re.sub(r"\s*\(#\d+\)$", "", h.subjects[h.culprit])
    assert f"**First bad commit:** `{h.culprit[:12]}` {title} (#{h.prs[h.culprit]})" in text
    conf = re.search(r"\*\*Confidence:\*\* (> )?([0-9.]+)", text)
    assert conf and float(conf.group(2)) >= 0.99
    assert f"{res.probe_runs} probe runs" in text
    # KL before/after per label: median [min, max] (n)
    assert re.search(r"\| `prefill_cache_hit` \| [0-9.e-]+ \[[0-9.e-]+, [0-9.e-]+\] \(\d+\) \|", text)
    # the value the search judged (the max over labels) has its own row, so the two labels
    # that held at x1.0 do not leave the reader guessing which one moved the verdict
    judged = re.search(r"^\| \(max over labels\) \| .* \| x([0-9.]+) \|$", text, re.M)
    assert judged and float(judged.group(1)) > 1.25, text   # about x1.8; random runs gave x1.48 once
    # the probed-commit table: endpoints and culprit with their values and verdicts
    rows = [ln for ln in text.splitlines() if re.match(r"^\| \d+ \| `", ln)]
    assert rows[0].startswith("| 0 | ") and "| good |" in rows[0]
    assert rows[-1].startswith("| 79 | ") and "| bad |" in rows[-1]
    assert any(ln.startswith(f"| 51 | `{h.culprit[:10]}`") for ln in rows)
    # commits the search placed on runs too few for a verdict of their own: starred, as in status
    assert not re.search(r"\| undecided \| (0\.00\d|0\.99\d|1\.000) \|$", text, re.M), text
    assert any(re.search(r"\| (good|bad)\\\* \|", ln) for ln in rows) and "\\* placed by the search" in text
    plot = Path(rep["plot"])
    assert plot == out.with_suffix(".png") and plot.read_bytes()[:8] == PNG
    assert plot.stat().st_size > 5000
    assert text.startswith(f"### KL regression: first bad commit {h.culprit[:12]}")
    # the plot is named from where the report lies, wherever it was written from
    deeper = tmp_path / "sub" / "r.md"
    write_report(h.path, fmt="md", out=str(deeper), offline=True)
    assert "plot (attach it): `r.png`" in deeper.read_text()


def test_an_answer_short_of_the_mark_is_not_titled_as_the_culprit(bisected):
    """Pasted into an issue, the title names the PR to blame: not on a guess."""
    h, res = bisected
    data = report_data(h.path, offline=True)
    data["result"] = {**data["result"], "complete": False, "confidence": 0.76,
                      "reason": "stopped at --max-total-runs 40"}
    from klbisect.report import render_markdown
    title = render_markdown(data).splitlines()[0]
    assert title.startswith(f"### KL regression: most likely first bad commit {h.culprit[:12]}")
    assert "0.7600, not reached" in title
    # a tester's: 0.9883 against a 0.99 mark read "confidence 0.99, not reached"
    data["result"]["confidence"] = 0.9883
    assert "(confidence 0.9883, not reached)" in render_markdown(data).splitlines()[0]
    # a weak guess is no title to blame a PR with
    data["result"]["confidence"] = 0.05
    title = render_markdown(data).splitlines()[0]
    assert title == f"### KL regression: not found yet (best guess {h.culprit[:12]} at 0.0500)"
    # a tester's Ctrl-C before any commit inside was probed: one of 79 tied commits, named as "most likely"
    data["result"]["confidence"] = 1 / 80
    text = render_markdown(data)
    assert text.splitlines()[0] == "### KL regression: not found yet (no commit stands out)"
    assert "**No commit stands out yet:** the likeliest place holds 0.0125" in text
    assert "Most likely" not in text and f"#{h.prs[h.culprit]}" not in text.split("Probed commits")[0]
    html = render_html({**data, "result": dict(data["result"])})
    assert "<b>No commit stands out yet:</b>" in html and "Most likely" not in html
    assert "No commit stands out yet: the likeliest place" in format_result(data["result"])
    assert "Stopped: at --max-total-runs 40" in format_result(data["result"])
    assert "Confidence:" not in format_result(data["result"])
    # a reviewer's: a block of five untestable commits holds 5/80 with no evidence at all, and was
    # "most likely"; a block that does stand out, short of the mark, is not stated as the answer
    block = {**data["result"], "culprit": None, "candidates": [h.culprit] * 5, "confidence": 0.09}
    assert render_markdown({**data, "result": block}).splitlines()[0] == \
        "### KL regression: not found yet (no commit stands out)"
    assert "any 5 commits of the 79" in format_result(block)
    block["confidence"] = 0.4
    assert render_markdown({**data, "result": block}).splitlines()[0] == \
        "### KL regression: most likely one of 5 commits that cannot be told apart (confidence 0.4000, not reached)"
    assert format_result(block).startswith("Most likely (NOT sure), the first bad commit is one of 5 commits")
    # by its odds against the rest, not its mass: a block of half a small range at 0.97 stands out
    from klbisect.report import stands_out
    assert stands_out(0.97, 6, 3) and stands_out(0.95, 2) and not stands_out(0.999, 4, 4)
    # and a search that stopped because the ends no longer differ names no one, nor a confidence in it
    data["result"]["confidence"] = 0.02
    text = render_markdown({**data, "no_signal": True})
    assert text.splitlines()[0].startswith("### KL regression: none shown between good")
    assert "**No first bad commit:**" in text and "KL at the good → the bad end, per label" in text
    assert f"#{h.prs[h.culprit]}" not in text.split("Probed commits")[0]
    assert "**Stopped:** at --max-total-runs 40" in text
    assert "**Confidence:**" not in text


def test_the_command_a_report_says_to_run_is_whole(bisected):
    """The reason an answer fell short ends with the command that finishes
    it: cut at 200 characters, with its backticks turned to quotes, it
    could not be pasted."""
    h, res = bisected
    data = report_data(h.path, offline=True)
    cmd = ("klbisect run --good 309ffa9fba8a --bad e1e6d1cd2de8 --probe-cmd 'python3 test/test_kl.py "
           "--labels logprobs_match,prefill_cache_hit,decode_cache_hit' --build-cmd 'make -C csrc -j8'")
    data["result"] = {**data["result"], "complete": False, "confidence": 0.9883,
                      "reason": f"git bisect stopped short of the mark; to finish it: `{cmd}`"}
    from klbisect.report import render_markdown
    assert f"`{cmd}`" in render_markdown(data)
    # inside the backticks every character as it is: a tester's pasted regex read (?P&lt;value&gt;...)
    cmd += r" --metric-regex 'accuracy: (?P<value>[0-9.]+)|x\d' --worse lower"
    data["result"]["reason"] = f"stopped <early>; to finish it: `{cmd}`"
    text = render_markdown(data)
    assert f"stopped &lt;early&gt;; to finish it: `{cmd}`" in text, text


def test_a_report_says_how_values_were_read(tmp_path):
    """A tester's accuracy bisect (--metric-regex, --worse lower): the
    report named the probe command alone, so a reader could neither measure
    it again nor tell that lower was worse."""
    h = make_history(tmp_path / "repo", n_commits=12, culprit_index=6, seed=4, merges=0)
    regex = r"\[(?P<label>\w+)\][^\n]*\n[^\n]*\navg_kl_div=(?P<value>[0-9.eE+-]+)"
    cfg = BisectConfig(good=h.good, bad=h.bad, probe_cmd=f"{PY} probe.py", metric_regex=regex,
                       metric="prefill_cache_hit")
    assert run_bisect(h.path, cfg, progress=lambda m: None).complete
    text = (tmp_path / "r.md")
    write_report(h.path, fmt="md", out=str(text), offline=True)
    assert f"**Values read with:** `--metric-regex '{regex}' --metric prefill_cache_hit`" in text.read_text()


def test_html_is_self_contained_with_the_plot(bisected, tmp_path):
    h, res = bisected
    out = tmp_path / "r.html"
    write_report(h.path, fmt="html", out=str(out), offline=True)
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    m = re.search(r'<img [^>]*src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m and base64.b64decode(m.group(1))[:8] == PNG
    # nothing loaded from elsewhere
    assert not re.search(r'<(script|link)\b', page)
    assert not re.search(r'src="(?!data:)', page)
    assert h.culprit[:12] in page and f"#{h.prs[h.culprit]}" in page
    # as the Markdown says (which words depends on whether this draw's endpoints overlapped)
    md = write_report(h.path, fmt="md", offline=True)["text"]
    judged = re.search(r"\*\*Judged by:\*\* (.+)", md).group(1).strip()
    assert f"<b>Judged by:</b> {html.escape(judged)}" in page
    # and how it was measured, in both (a tester's report named no probe)
    probe = re.search(r"\*\*Probe:\*\* `(.+)`", md).group(1)
    assert "probe.py" in probe and f"<b>Probe:</b> <code>{html.escape(probe)}</code>" in page
    assert not out.with_suffix(".png").exists()           # the plot is inside: no file beside it


def test_json_report_and_cli(bisected, tmp_path):
    h, res = bisected
    r = CliRunner().invoke(group(), ["report", "--repo", str(h.path), "--format", "json", "--offline",
                                     "--plot", str(tmp_path / "p.png")])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["result"]["culprit"] == h.culprit and obj["result"]["pr"] == h.prs[h.culprit]
    assert obj["result"]["session"] == res.session
    idx = [c["index"] for c in obj["commits"]]
    assert idx == sorted(idx) and idx[0] == 0 and idx[-1] == 79
    assert all({"sha", "subject", "pr", "values", "verdict", "p_bad"} <= set(c) for c in obj["commits"])
    assert (tmp_path / "p.png").read_bytes()[:8] == PNG
    # markdown on stdout, the plot path on stderr
    r = CliRunner().invoke(group(), ["report", "--repo", str(h.path), "--offline", "--session",
                                     str(res.session), "--plot", str(tmp_path / "q.png")])
    assert r.exit_code == 0 and r.stdout.startswith("### KL regression: first bad commit")
    # -o FILE.html without --format: the extension picks the format
    r = CliRunner().invoke(group(), ["report", "--repo", str(h.path), "--offline", "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 0 and (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


def test_pr_title_and_link_from_cache_then_github(bisected, tmp_path, monkeypatch):
    h, res = bisected
    pr = h.prs[h.culprit]
    git(h.path, "remote", "add", "origin", "https://github.com/acme/kvserve.git")
    try:
        seen = []

        class Api(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                seen.append(self.path)
                if self.path == f"/repos/acme/kvserve/pulls/{pr}":
                    out = json.dumps({"number": pr, "title": "Use bf16 rope cache (the real PR title)",
                                      "user": {"login": "emre"}, "merged_at": "2025-01-09T00:00:00Z",
                                      "html_url": f"https://github.com/acme/kvserve/pull/{pr}"}).encode()
                    self.send_response(200)
                else:
                    out = b"{}"
                    self.send_response(404)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        srv = HTTPServer(("127.0.0.1", 0), Api)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        monkeypatch.setenv("KLBISECT_GITHUB_API", f"http://127.0.0.1:{srv.server_address[1]}")
        # offline: the subject, silently, with GitHub links
        text = write_report(h.path, fmt="md", out=str(tmp_path / "a.md"), offline=True)["text"]
        assert "real PR title" not in text and seen == []
        assert f"[#{pr}](https://github.com/acme/kvserve/pull/{pr})" in text
        assert f"https://github.com/acme/kvserve/commit/{h.culprit}" in text
        # online: fetched once, then served from the pr_meta cache
        text = write_report(h.path, fmt="md", out=str(tmp_path / "b.md"))["text"]
        assert "Use bf16 rope cache (the real PR title)" in text and "@emre" in text
        assert seen == [f"/repos/acme/kvserve/pulls/{pr}"]
        srv.shutdown()
        srv.server_close()
        text = write_report(h.path, fmt="md", out=str(tmp_path / "c.md"))["text"]
        assert "Use bf16 rope cache (the real PR title)" in text and len(seen) == 1
        ws = Workspace(h.path)
        try:
            assert ws.store.get_pr(pr)["title"] == "Use bf16 rope cache (the real PR title)"
            ws.store.db.execute("DELETE FROM pr_meta")
        finally:
            ws.close()
        # GitHub unreachable and nothing cached: the subject again, no error
        text = write_report(h.path, fmt="md", out=str(tmp_path / "d.md"))["text"]
        assert "real PR title" not in text and h.culprit[:12] in text
    finally:
        git(h.path, "remote", "remove", "origin")


def _long_session(root: Path, n: int = 2000, culprit: int = 1234):
    """A real 2,000-commit history with a session whose every commit was
    probed (runs written straight into the real sqlite store)."""
    h = make_history(root / "big", n_commits=n, culprit_index=culprit, seed=3, merges=10)
    cfg = BisectConfig(good=h.good, bad=h.bad, probe_cmd="python probe.py")
    from klbisect import repo as gitrepo
    ws = Workspace(h.path)
    try:
        cands = [(c.sha, c.subject, c.pr) for c in gitrepo.candidates(ws.repo, h.good, h.bad)]
        key = make_probe(cfg).key
        st = ws.store
        sid = st.create_session("run", h.good, h.bad, key, cfg.question(), cands)
        rows = []
        for i, (sha, _, _) in enumerate(cands):
            for k in range(3 if i in (0, len(cands) - 1) else 1):
                v = (0.010 if i >= culprit else 0.0045) * (1 + 0.05 * ((i * 7 + k * 3) % 5 - 2))
                rows.append((sid, key, sha, 1.0e9 + len(rows), 0.4, 0, "ok",
                             json.dumps({"prefill_cache_hit": v, "logprobs_match": 0.004}), v, None, 0))
        with st.tx() as db:
            db.executemany("INSERT INTO runs (session_id, probe_key, sha, started, duration, exit_code, status, "
                           "vals, value, log_path, slot) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
        model = Model.fit([0.0045, 0.0047, 0.0043], [0.010, 0.0105, 0.0098])
        st.update_session(sid, model=model.to_dict(), state="bisecting")
    finally:
        ws.close()
    return h, sid


def test_long_table_collapses_and_fits_one_comment(tmp_path):
    h, sid = _long_session(tmp_path)
    data = report_data(h.path, offline=True)        # the current (unfinished) session
    assert data["session"]["id"] == sid and len(data["commits"]) == 2000
    rep = write_report(h.path, fmt="md", out=str(tmp_path / "big.md"), data=data)
    text = rep["text"]
    assert len(text.encode("utf-8")) <= GITHUB_COMMENT_LIMIT
    assert len((tmp_path / "big.md").read_bytes()) <= GITHUB_COMMENT_LIMIT + 1  # + final newline
    assert "<details><summary>Probed commits (2000" in text and "</details>" in text
    assert "further probed commits omitted" in text
    # the rows kept are the endpoints and the neighbourhood of the culprit
    assert f"| 1234 | `{h.culprit[:10]}`" in text and "| 0 | `" in text and "| 1999 | `" in text
    assert data["result"]["culprit"] == h.culprit
    assert Path(rep["plot"]).read_bytes()[:8] == PNG
    # html has room for every row
    page = write_report(h.path, fmt="html", out=str(tmp_path / "big.html"), data=data)["text"]
    assert page.count("<tr class=") == 2000


def test_no_session_is_a_usage_error(tmp_path):
    h = make_history(tmp_path / "empty", n_commits=5, culprit_index=3, seed=1, merges=0)
    with pytest.raises(KlbisectError) as e:
        write_report(h.path)
    assert e.value.code == 150 and "klbisect run" in e.value.message
    # a script reading `--format json` from stdout reads the failure there too
    p = klb("report", "--format", "json", cwd=h.path)
    assert p.returncode == 150 and json.loads(p.stdout)["exit_code"] == 150


def test_confidence_never_reads_as_certain():
    from klbisect.report import fmt_confidence
    assert fmt_confidence(0.99123) == "0.9912"
    assert fmt_confidence(0.99996) == "> 0.9999" and fmt_confidence(1.0) == "> 0.9999"


def test_status_marks_commits_the_search_placed_without_a_verdict_of_their_own(bisected):
    """A commit probed once is undecided on its own runs (a verdict needs
    500:1) while the search's posterior has placed it: status says which."""
    from klbisect.report import format_status
    from klbisect.status import status
    h, _ = bisected
    st = status(h.path)
    text = format_status(st)
    placed = [c for c in st["commits"] if c.get("verdict") == "undecided"
              and c.get("p_bad") is not None and (c["p_bad"] <= 0.01 or c["p_bad"] >= 0.99)]
    assert placed, "a bisect of 80 commits probes some commits once"
    for c in placed:
        line = next(ln for ln in text.splitlines() if c["sha"][:12] in ln and "P(bad)=" in ln)
        assert ("GOOD*" if c["p_bad"] <= 0.01 else "BAD*") in line
    assert "UNDECIDED P(bad)=0.000" not in text and "UNDECIDED P(bad)=1.000" not in text
    assert "* placed by the search from every run" in text


def test_a_side_unlike_its_endpoint_gets_a_note():
    """One step is what the search assumes: interior runs before the answer
    that sit well above --good's (a drift, or an earlier second change)
    are said, not silently averaged into a confident single commit."""
    from types import SimpleNamespace as Run

    from klbisect.result import step_notes
    rng = np.random.default_rng(3)
    shas = [f"c{i}" for i in range(10)]

    def runs(sha, median, n):
        return [Run(sha=sha, value=float(v)) for v in rng.lognormal(np.log(median), 0.1, n)]
    good_end, bad_end = runs("c0", 0.004, 12), runs("c9", 0.010, 12)
    step = (good_end + runs("c3", 0.004, 6) + runs("c5", 0.004, 6), bad_end + runs("c7", 0.010, 6))
    assert step_notes([], shas, step, False) == []
    drift = (good_end + runs("c3", 0.006, 6) + runs("c5", 0.0065, 6), bad_end + runs("c7", 0.010, 6))
    [note] = step_notes([], shas, drift, True)
    assert note.startswith("the commits before the answer look unlike --good") and "drift" in note
    assert "max over labels" in note


def test_status_says_why_its_masses_and_the_answers_confidence_differ(bisected):
    """The masses are recomputed from every run stored now (later sessions'
    too); the Confidence is the answer's when it stopped. Two numbers that
    differ for the same commit come with why."""
    from klbisect.report import format_status
    from klbisect.status import status
    h, _ = bisected
    st = status(h.path)
    # the refitted model can move the mass by a little (0.9924 now against 0.9953 at the stop, one draw
    # in six): said exactly when it moved, and a single session's note names no later one
    # (a reviewer's 0.9939 and 0.9935 went unexplained: any difference the four decimals show)
    moved = f"{st['top'][0]['mass']:.4f}" != fmt_confidence(st["result"]["confidence"])
    assert ("recomputed now" in format_status(st)) == moved and "later sessions' too" not in format_status(st)
    st["result"]["confidence"] = st["top"][0]["mass"] - 0.01
    assert "recomputed now, from every run stored" in format_status(st)
    for t in st["top"][:3]:      # status lists three
        line = next(ln for ln in format_status(st).splitlines() if ln.startswith(f"  {t['mass']:.4f}"))
        assert not re.search(r"\(#\d*$", line), line        # never half a PR number


def test_a_report_made_after_a_later_session_does_not_call_its_runs_earlier(tmp_path):
    """A tester's nightly report, made again two nights later, said "31 runs
    reused from earlier sessions" where 15 came from a later one, beside
    per-label values that still counted the answer's own."""
    h = make_history(tmp_path / "repo", n_commits=30, culprit_index=17, seed=3)
    cfg = BisectConfig(good=h.good, bad=h.bad, probe_cmd=f"{PY} probe.py")
    first = run_bisect(h.path, cfg, progress=lambda m: None)
    before = write_report(h.path, fmt="md", session_id=first.session, offline=True)["text"]
    assert "later sessions" not in before and "reused from earlier sessions" not in before
    again = run_bisect(h.path, dataclasses.replace(cfg, fresh=True), progress=lambda m: None)
    assert again.session > first.session and again.culprit == first.culprit == h.culprit
    text = write_report(h.path, fmt="md", session_id=first.session, offline=True)["text"]
    assert "reused from earlier sessions" not in text, text
    # the session as it ended (a tester read a later session's runs as its own): left out, and said so
    later = re.search(r"\*(\d+) runs that later sessions recorded at commits of its range are left out: this is the "
                      r"session as it ended", text)
    assert later and int(later.group(1)) >= again.probe_runs - 4, text     # endpoints' runs may lie outside
    assert text.split("**Cost:**")[1].split("\n")[0] == before.split("**Cost:**")[1].split("\n")[0]
    # the --fresh session itself, the newest: the runs it left out were earlier, not later (the reviewer's)
    newest = write_report(h.path, fmt="md", session_id=again.session, offline=True)["text"]
    assert "left out" not in newest and "later sessions" not in newest, newest


def test_a_report_path_that_cannot_be_written_is_one_line(bisected, tmp_path):
    h, _ = bisected
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    p = klb("report", "--offline", "-o", blocker / "sub" / "r.md", cwd=h.path)
    assert p.returncode == 150 and "Traceback" not in p.stderr, p.stderr
    assert f"cannot write {blocker / 'sub' / 'r.md'}: {blocker} is not a directory" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    # a directory given as -o names it and leaves no plot beside it
    (tmp_path / "reports").mkdir()
    p = klb("report", "--offline", "-o", tmp_path / "reports", cwd=h.path)
    assert p.returncode == 150 and f"cannot write {tmp_path / 'reports'}:" in p.stderr, p.stderr
    assert not (tmp_path / "reports.png").exists() and not list((tmp_path / "reports").iterdir())


def test_the_github_api_is_klbisects_variable_then_the_one_actions_sets(monkeypatch):
    """GitHub Enterprise (and Actions on it) sets GITHUB_API_URL; the
    loopback tests and a deliberate override use KLBISECT_GITHUB_API."""
    from klbisect.github import api_base
    monkeypatch.delenv("KLBISECT_GITHUB_API", raising=False)
    monkeypatch.delenv("GITHUB_API_URL", raising=False)
    assert api_base() == "https://api.github.com"
    monkeypatch.setenv("GITHUB_API_URL", "https://ghe.example.com/api/v3/")
    assert api_base() == "https://ghe.example.com/api/v3"
    monkeypatch.setenv("KLBISECT_GITHUB_API", "http://127.0.0.1:9")
    assert api_base() == "http://127.0.0.1:9"


def test_a_post_github_refuses_says_what_to_check(monkeypatch):
    """A 401 said only "Bad credentials"; a connection error was urllib3's
    wrappers, cut before "Connection refused"."""
    from conftest import fake_github

    from klbisect.github import GitHubError, post_comment
    with fake_github(401, b'{"message": "Bad credentials"}') as (api, _):
        monkeypatch.setenv("KLBISECT_GITHUB_API", api)
        with pytest.raises(GitHubError) as e:
            post_comment("acme/kv", 7, "hi", "ghp_" + "x" * 36, backoff=0)
        assert "HTTP 401" in e.value.message and "check GITHUB_TOKEN" in e.value.message
    # the server is closed now: nothing listens at that port
    with pytest.raises(GitHubError) as e:
        post_comment("acme/kv", 7, "hi", "ghp_" + "x" * 36, backoff=0)
    assert "Connection refused" in e.value.message and "HTTPConnectionPool" not in e.value.message, e.value.message


def test_github_s_answers_stay_one_line_and_its_links_keep_the_token_home(monkeypatch):
    """A reviewer's: the comments' next page was followed wherever the
    server's Link header pointed, with the token. A tester's: an error
    page's line breaks and escapes reached the terminal as they were."""
    from conftest import fake_github

    from klbisect.github import GitHubError, find_comment, post_comment
    with fake_github() as (elsewhere, stolen):
        with fake_github(200, b"[]", headers={"Link": f'<{elsewhere}/steal?page=2>; rel="next"'}) as (api, got):
            monkeypatch.setenv("KLBISECT_GITHUB_API", api)
            assert find_comment("acme/kv", 7, "marker", "ghp_" + "x" * 36, backoff=0) is None
            assert len(got) == 1 and stolen == []
        with fake_github(500, b"<html>oops\n\x1b[31mred</html>") as (api, _):
            monkeypatch.setenv("KLBISECT_GITHUB_API", api)
            with pytest.raises(GitHubError) as e:
                post_comment("acme/kv", 7, "hi", "ghp_" + "x" * 36, retries=0, backoff=0)
    said = e.value.message
    assert "\n" not in said and "\x1b" not in said and "oops\\n\\x1b[31mred" in said, said


def test_judged_by_says_overlap_only_where_runs_of_one_side_fell_among_the_others():
    """A tester's report said "good and bad runs overlap" of runs where no
    good run was above any bad one (they sat close for their spread), and
    that every git verdict had needed two tests to agree, when four of six
    were given by the fitted model alone."""
    from klbisect.decide import Model
    from klbisect.report import judged_by
    close = Model.fit([0.0040, 0.0045, 0.0050, 0.0044, 0.0047, 0.0049], [0.0052, 0.0060, 0.0066, 0.0057, 0.0063,
                                                                       0.0055])
    assert not close.separates
    run = {"session": {"kind": "run"}, "boundary": 0.005}
    said = judged_by({**run, "model": close.to_dict()})
    assert "runs overlap," not in said and "sit under 3/4 of a spread apart" in said
    git = judged_by({**run, "session": {"kind": "gitbisect"}, "model": close.to_dict()})
    assert "overlap, so" not in git and "each verdict below says which" in git


def test_a_merge_commits_title_that_names_its_pr_is_not_followed_by_it_again():
    """"Merge pull request #29777 from eunji/fp8-prefill (#29777)" in a
    tester's report; a squash commit's "(#N)" moves from the title to the link."""
    from klbisect.report import _culprit_title, _pr_suffix
    merge = {"pr": 29777, "subject": "Merge pull request #29777 from eunji/fp8-prefill"}
    assert _pr_suffix(merge, {}, "sgl-project/sglang") == ""
    squash = {"pr": 29519, "subject": "Route prefill through FP8 QKV (#29519)"}
    assert _culprit_title(squash, {}) == "Route prefill through FP8 QKV"
    assert _pr_suffix(squash, {}, "sgl-project/sglang") == \
        " ([#29519](https://github.com/sgl-project/sglang/pull/29519))"


def test_status_of_an_overlapping_search_gives_the_evidence_it_used(history):
    """A tester's: in a search whose sides overlap, status said a commit's
    runs were 2.8e12 times likelier good, "verdict good: 42 runs, likelihood
    ratio 2.8e+12:1", beside P(bad) = 0.0003, while the search had weighed
    them with both sides' distributions integrated out, far more cautiously.
    It says so now, and each verdict is where P(bad) stands."""
    from klbisect.report import format_status
    from klbisect.status import status
    h = history(n_commits=16, seed=6, noise=NoiseModel(kind="lognormal", good=(0.004, 0.3), bad=(0.007, 0.3)))
    # the moving label: over the max of three, a draw of ten runs a side may not differ (a CI run's did)
    p = klb("run", "--good", h.good, "--bad", h.bad, "--probe-cmd", probe_cmd(), "--metric", "prefill_cache_hit",
            "--json", cwd=h.path)
    assert p.returncode == 0 and json_tail(p.stdout)["culprit"] == h.culprit, p.stderr
    st = status(h.path)
    text = format_status(st)
    assert "integrates over both distributions" in text
    interior = [c for c in st["commits"] if 0 < c["index"] < 16 and c["values"]]
    assert interior
    for c in interior:
        assert "times likelier" not in c["explain"] and "median" in c["explain"], c["explain"]
        want = "good" if c["p_bad"] < 0.01 else "bad" if c["p_bad"] > 0.99 else "undecided"
        assert c["verdict"] == want, c
    # no one commit's runs decide where the sides overlap: the runs either side of the answer do (a tester
    # found only "the two overlap" repeated at every commit, and no evidence for the boundary)
    ev = st["evidence"]
    assert ev["first_bad"] == h.culprit and ev["endpoints_p"] < 0.05 and ev["after"]["median"] > ev["before"]["median"]
    assert ev["before"]["runs"] + ev["after"]["runs"] == sum(len(c["values"]) for c in st["commits"])
    assert f"Evidence: the {ev['before']['runs']} runs of the" in text and f"before {h.culprit[:12]}" in text, text
    assert "the two overlap" not in text


def test_status_keeps_its_columns_under_subjects_in_chinese(bisected):
    """A subject in Chinese takes two columns a character: cut and padded
    by length, it pushed that commit's verdict out of line (and a long one
    past the terminal's width)."""
    import copy

    from klbisect.metric import cells
    from klbisect.report import format_status
    from klbisect.status import status
    h, _ = bisected
    st = copy.deepcopy(status(h.path))
    shown = [c for c in st["commits"] if c.get("p_bad") is not None]
    shown[0]["subject"] = "修复 FP8 量化在预填充阶段的精度回归并且更新了相关的测试用例和文档 (#23456)"
    shown[1]["subject"] = "优化 KV 缓存"
    lines = [ln for ln in format_status(st).splitlines() if "P(bad)=" in ln and ln.startswith("  [")]
    assert any("(#23456)" in ln for ln in lines) and any("优化 KV 缓存" in ln for ln in lines)
    assert len({cells(ln[:ln.index("P(bad)=")]) for ln in lines}) == 1, "\n".join(lines)


def test_an_answer_the_runs_are_sure_of_against_git_bisects_is_not_called_unsure():
    """git bisect followed a wrong hand-typed verdict; all the runs are sure
    of another answer. A tester read "Confidence: 0.9956 (NOT reached" as a
    contradiction; a reviewer found a block answer still "NOT sure"."""
    from klbisect.report import _headline, format_result
    from klbisect.result import GIT_ANSWER_DOUBTED
    a, b = "a" * 40, "b" * 40
    r = {"culprit": None, "candidates": [a, b], "pr": None, "subject": "x | y", "confidence": 0.995,
         "complete": False, "reason": f"{GIT_ANSWER_DOUBTED} cccccccccccc, on which all the runs put only 0.0%",
         "candidate_info": [{"sha": a, "subject": "x", "pr": None, "why": "untestable: every run crashed"},
                            {"sha": b, "subject": "y", "pr": None, "why": "first bad"}],
         "probe_runs": 9, "n_commits": 20, "probe_seconds": 1.0, "good": "g" * 40, "bad": "h" * 40}
    text = format_result(r)
    assert "by all the runs, not git bisect's:" in text and "NOT sure" not in text, text
    assert "Confidence: 0.9950  (NOT git bisect's answer: " in text and "NOT reached" not in text, text
    head = _headline({"result": r})
    assert head.endswith("(confidence 0.9950, not git bisect's answer)"), head
    one = {**r, "culprit": b, "candidates": [b], "subject": "y"}
    assert format_result(one).startswith("First bad commit by all the runs, not git bisect's: " + b)
    short = {**r, "reason": "git bisect finished, but all the runs put only 3.0% on its answer"}
    assert "NOT sure" in format_result(short) and "(NOT reached: " in format_result(short)


def test_status_says_once_that_no_commit_stands_out():
    """A tester's git bisect status, after a hand-typed verdict sent git the
    wrong way: the posterior's top and the answer were both flat, and the
    same "No commit stands out yet" line came twice."""
    from klbisect.report import format_status
    a = "a" * 40
    res = {"culprit": a, "candidates": [a], "pr": None, "subject": "x", "confidence": 0.07, "complete": False,
           "reason": "git bisect finished, but all the runs put only 0.0% on its answer", "probe_runs": 6,
           "n_commits": 15, "probe_seconds": 1.0, "good": "g" * 40, "bad": "h" * 40}
    st = {"session": 2, "kind": "gitbisect", "state": "bisecting", "good": "g" * 40, "bad": "h" * 40,
          "n_commits": 15, "probe_runs": 6, "commits": [], "result": res,
          "top": [{"candidates": [a], "mass": 0.07, "subjects": ["x"]}]}
    text = format_status(st)
    assert text.count("No commit stands out yet") == 1, text


def test_a_crash_cause_is_redacted_before_it_is_cut(tmp_path):
    """status and reports quote a crash's exception line from the run's log,
    which keeps what the probe printed; cut to one short line first, a
    token no longer looked like one and most of it would reach a report."""
    from klbisect.result import crash_cause
    token = "hf_" + "Q7x" * 12
    log = tmp_path / "run.log"
    # the token straddles the cut at 157 characters: its first 17 are kept, too few to look like one
    words = ("could not fetch the model config from the hub " * 3)[:126]
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   f"server| OSError: {words}with {token}\n")
    cause = crash_cause(str(log))
    assert cause.startswith("OSError: could not fetch") and token[:8] not in cause, cause


def test_a_verdict_surer_than_its_commits_p_bad_says_why():
    """A tester's git bisect status: "2 runs, likelihood ratio 1.6e+03:1
    for good" beside P(bad)=0.28 read as a contradiction."""
    from klbisect.result import explain_commit
    model = Model.fit([0.004, 0.0045, 0.005, 0.0052, 0.0048, 0.0055], [0.0095, 0.011, 0.012, 0.0102, 0.0118, 0.0125])
    entry = {"index": 18, "values": [0.0056, 0.0054], "crashes": 0, "verdict": "good", "p_bad": 0.28,
             "reason": "2 runs, likelihood ratio 1.6e+03:1 for good", "log_lr": -7.4}
    assert "P(bad) is less sure than that verdict" in explain_commit(entry, model)
    assert "less sure" not in explain_commit({**entry, "p_bad": 0.003}, model)


def test_an_sglang_probe_is_named_as_its_options_would_give_it():
    """A tester could not tell from a report which model, server arguments or
    environment were measured; a secret among them stays out of the page.
    The `klbisect run` advice spells the same options (each --server-env its
    own, not joined by commas)."""
    import shlex
    from klbisect.redact import redact
    cfg = BisectConfig(probe="sglang", sglang={
        "model_path": "org/model", "server_args": "--tp-size 4 --api-key k3y12345",
        "server_env": ["SGLANG_ENABLE_UNIFIED_RADIX_TREE=1", "HF_TOKEN=hf_secret123"],
        "turn_separator": [1, 29892], "python": "/opt/venv/bin/python"})
    line = shlex.join(cfg.probe_argv())
    assert line == ("--probe sglang --model-path org/model --server-args '--tp-size 4 --api-key k3y12345' "
                    "--server-env SGLANG_ENABLE_UNIFIED_RADIX_TREE=1 --server-env HF_TOKEN=hf_secret123 "
                    "--turn-separator 1,29892 --sglang-python /opt/venv/bin/python")
    assert "hf_secret123" not in redact(line) and "k3y12345" not in redact(line)
    assert cfg.run_command("g", "b").startswith(f"klbisect run --good g --bad b {line}")


def test_status_names_one_older_unfinished_session_in_the_singular(bisected):
    """A tester's three failed runs opened status with "(Sessions 1 are
    unfinished too, 1 run between them"."""
    from klbisect.report import format_status
    from klbisect.status import status
    h, _ = bisected
    st = status(h.path)
    left = [{"session": n, "kind": "run", "good": "a" * 40, "bad": "b" * 40, "runs": 1, "stopped": "no metric value"}
            for n in (9, 8, 7)]
    first = format_status({**st, "unfinished": left}).splitlines()[0]
    assert first == ("(Session 7 is unfinished too, with 1 run: `klbisect status --session 7` shows it, "
                     "`klbisect reset` ends it.)"), first
    first = format_status({**st, "unfinished": left + [{**left[0], "session": 6}]}).splitlines()[0]
    assert first.startswith("(Sessions 6, 7 are unfinished too, 2 runs between them: "), first


def test_plots_say_nothing_of_an_unwritable_home(tmp_path):
    """A tester's CI user with a read-only HOME: every report printed two
    long matplotlib warnings before the file it wrote."""
    (tmp_path / "file").touch()
    env = {k: v for k, v in os.environ.items() if k != "MPLCONFIGDIR"}
    env.update(HOME=str(tmp_path / "file" / "home"), XDG_CACHE_HOME=str(tmp_path / "file" / "cache"),
               XDG_CONFIG_HOME=str(tmp_path / "file" / "config"), TMPDIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", "import os; from klbisect import plots; plt = plots._plt(); "
                        "print(len(plots._save(plt.figure(), None)) > 0, 'MPLCONFIGDIR' in os.environ)"],
                       env=env, capture_output=True, text=True, timeout=120)
    # (and not left set for the probes klbisect starts after a plot)
    assert p.returncode == 0 and p.stdout.strip() == "True False" and p.stderr == "", p.stdout + p.stderr
    assert not [f for f in tmp_path.iterdir() if f.name != "file"], list(tmp_path.iterdir())   # nothing left
