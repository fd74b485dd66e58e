"""Click commands ``report``, ``nightly`` and ``history``; the main group
loads them when named (``Cli.lazy``). Everything they do is reachable without click:
``report.write_report``, ``nightly.run_nightly``, ``nightly.history``.
"""
from __future__ import annotations

import click

from .cli import REVISION, SESSION_ID, _emit_json, make_config, probe_options, repo_option, search_options


@click.command("report")
@repo_option
@click.option("--format", "fmt", type=click.Choice(["md", "html", "json"]), default=None,
              help="md: one GitHub comment; html: one self-contained file; json: result + commits "
                   "(default: from -o's extension, .html or .json, else md).")
@click.option("-o", "--output", "out", default=None, metavar="FILE",
              help="Write the report here (default: stdout); the plot goes next to it as .png (html "
                   "embeds it instead).")
@click.option("--session", "session_id", type=SESSION_ID, default=None,
              help="Session id (default: the current or last bisect).")
@click.option("--plot", default=None, metavar="PNG", help="Where to write the plot.")
@click.option("--offline", is_flag=True, help="Do not ask GitHub for PR titles (cached ones are used).")
def report(repo, fmt, out, session_id, plot, offline):
    """A report of a bisect a maintainer can paste: culprit, PR, KL before
    and after, probed commits, cost, and a plot of every run."""
    from .report import write_report
    rep = write_report(repo, fmt=fmt, out=out, session_id=session_id, plot=plot, offline=offline)
    if rep["data"].get("via"):
        click.echo(f"klbisect: {rep['data']['via']}", err=True)
    if rep["path"]:
        click.echo(f"klbisect: wrote {rep['path']}" + (f" (plot {rep['plot']})" if rep["plot"] else ""), err=True)
    else:
        click.echo(rep["text"])
        if rep["plot"]:
            click.echo(f"klbisect: plot {rep['plot']}", err=True)
    return 0


@click.command("nightly")
@repo_option
@click.option("--branch", default="main", show_default=True, type=REVISION,
              help="Branch (or rev) whose head is measured.")
@click.option("--runs", type=int, default=3, show_default=True, help="Probe runs of the head per night.")
@click.option("--baseline-nights", type=int, default=5, show_default=True,
              help="Compare with the pooled runs of this many recent good nightly heads.")
@click.option("--alpha", type=float, default=0.001, show_default=True,
              help="Level of the one-sided Mann-Whitney U test.")
@click.option("--min-effect", type=float, default=0.1, show_default=True,
              help="The head's median must be at least (1 + this) x the baseline's.")
@click.option("--night", default=None, help="Name of this night (default: today's UTC date).")
@click.option("--format", "fmt", type=click.Choice(["md", "html", "json"]), default=None,
              help="Format of the report written on a regression (default: from -o's extension, .html or "
                   ".json, else md).")
@click.option("-o", "--output", "out", default=None, metavar="FILE", help="Report file on a regression.")
@click.option("--post-to", default=None, metavar="OWNER/REPO#N", help="Post the report as a comment on this issue (API: $KLBISECT_GITHUB_API, else "
                   "$GITHUB_API_URL, else api.github.com).")
@click.option("--post-issue", type=click.IntRange(min=1), default=None, metavar="N",
              help="Post to issue N of the origin remote's GitHub repository.")
@click.option("--dry-run", is_flag=True, help="Print what would be posted instead of posting.")
@click.option("--offline", is_flag=True, help="Do not ask GitHub for PR titles.")
@click.option("--json", "as_json", is_flag=True,
              help='End stdout with {"regressed", "verdict", "culprit", "pr", "report", "posted"}.')
@probe_options
@search_options(worse=("higher",))
def nightly(repo, branch, runs, baseline_nights, alpha, min_effect, night, fmt, out, post_to, post_issue,
            dry_run, offline, as_json, **kw):
    """Measure the branch head (the caller updates the repo), compare with
    recent good nightlies, and on a regression bisect, report and post.
    GITHUB_TOKEN (from the environment) is used for posting."""
    from .nightly import NightlyOptions, exit_code, format_night, run_nightly, summary
    from .report import format_of
    cfg = make_config({**kw, "good": "", "bad": ""})
    # a tester's -o n5.html held Markdown, where `report -o` writes HTML
    opts = NightlyOptions(branch=branch, runs=runs, baseline_nights=baseline_nights, alpha=alpha,
                          min_effect=min_effect, night=night, report_format=fmt or format_of(out), report_path=out,
                          post_to=post_to, post_issue=post_issue, dry_run=dry_run, offline=offline)
    rec = run_nightly(repo, cfg, opts)
    click.echo(format_night(rec), err=as_json)
    out = summary(rec)
    if out.get("error"):
        # the night's answer stands (printed above); the exit code says what did not happen
        click.echo(f"klbisect: error: {out['error']}", err=True)
    if as_json:
        _emit_json(out)
    return exit_code(rec)


@click.command("history")
@repo_option
@click.option("--label", default=None, help="Only this label.")
@click.option("-o", "--output", "out", default=None, metavar="PNG",
              help="Plot file (default: <git dir>/klbisect/reports/history.png; with --probe-cmd, "
                   "history-<series>.png).")
@click.option("--probe-cmd", default=None, help="The nights of this probe command (default: the latest night's).")
@click.option("--json", "as_json", is_flag=True)
def history(repo, label, out, probe_cmd, as_json):
    """The metric's trend per label over nightly heads: a table and a plot."""
    from .nightly import history as get_history, history_table, series_text
    trend = get_history(repo, label=label, plot=out, probe_cmd=probe_cmd)
    if as_json:
        _emit_json(trend)
        return 0
    import sys

    from rich.console import Console
    console = Console() if sys.stdout.isatty() else Console(width=60 + 34 * len(trend["labels"]))
    console.print(history_table(trend))
    click.echo(f"plot: {trend['plot']}")
    if trend["other_series"]:
        click.echo(f"other nightly series here, of other probe commands: {series_text(trend['other_series'])}")
    return 0


