"""PNG plots for reports and nightly history (matplotlib, Agg backend).

matplotlib is imported inside the functions: it costs about a second and
only ``report``, ``nightly`` and ``history`` need it.
"""
from __future__ import annotations

import atexit
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path

from .errors import EXIT_USAGE, KlbisectError
from .metric import broke, fmt_confidence, fmt_value

GOOD_C, BAD_C, UNK_C, CULPRIT_C = "#2b7bba", "#d62728", "#7f7f7f", "#ff7f0e"


def _plt():
    if "matplotlib" not in sys.modules and "MPLCONFIGDIR" not in os.environ and not _writable_config():
        # matplotlib would make a temp dir itself, with two long warnings on stderr per command (a
        # tester's read-only HOME). Set for its import only: probes started later inherit os.environ
        d = tempfile.mkdtemp(prefix="klbisect-mpl-")
        atexit.register(shutil.rmtree, d, True)
        os.environ["MPLCONFIGDIR"] = d
        try:
            return _import_plt()
        finally:
            os.environ.pop("MPLCONFIGDIR", None)
    return _import_plt()


def _import_plt():
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415
    return plt


def _writable_config() -> bool:
    """Can matplotlib keep its config and font cache where it looks first?
    (XDG folders on Linux and BSD, ~/.matplotlib elsewhere; nothing is made.)"""
    if sys.platform.startswith(("linux", "freebsd")):
        dirs = [Path(os.environ.get(var) or os.path.expanduser(default)) / "matplotlib"
                for var, default in (("XDG_CONFIG_HOME", "~/.config"), ("XDG_CACHE_HOME", "~/.cache"))]
    else:
        dirs = [Path(os.path.expanduser("~/.matplotlib"))]
    for d in dirs:
        while not os.path.lexists(d) and d != d.parent:
            d = d.parent          # the folder matplotlib would make it in
        if not (d.is_dir() and os.access(d, os.W_OK | os.X_OK)):
            return False
    return True


def _save(fig, out: str | Path | None) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    data = buf.getvalue()
    if out is not None:
        write_out(out, data)
    return data


def check_writable(out: str | Path, option: str = "-o") -> None:
    """Fail before the work, not after it: a nightly job's -o is written
    only on the night a regression is found, hours into its runs."""
    p = Path(out).absolute()
    why = None
    if p.is_dir():
        why = "it is a directory"
    elif p.exists():
        why = None if os.access(p, os.W_OK) else "permission denied"
    else:
        # the nearest folder that exists must be one, and writable: the rest is made when
        # the report is written (nothing is created now, for a night that may write none)
        up = p.parent
        while not up.exists() and up != up.parent:
            up = up.parent
        if not up.is_dir():
            why = f"{up} is not a directory"
        else:
            try:
                tempfile.TemporaryFile(dir=up).close()    # root passes os.access even in /proc
            except OSError as e:
                # "/proc: No such file or directory" read as /proc missing (a tester's)
                why = f"no file can be created in {up} ({e.strerror or e})"
    if why:
        raise KlbisectError(f"cannot write {out}: {why}; give {option} a path you can write", EXIT_USAGE)


def write_out(out: str | Path, data: bytes, option: str = "-o") -> Path:
    """Write a file the user named with -o (its folders made): a path that
    cannot be written is the user's to change, said in one line."""
    p = Path(out)
    try:
        if p.is_dir():
            raise IsADirectoryError(21, "it is a directory")
        up = p.parent
        while not up.exists() and up != up.parent:
            up = up.parent
        if not up.is_dir():   # mkdir would say "File exists"
            raise NotADirectoryError(20, f"{up} is not a directory")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    except OSError as e:
        raise KlbisectError(f"cannot write {out}: {e.strerror or e}; give {option} a path you can write",
                            EXIT_USAGE) from None
    return p


def session_plot(data: dict, out: str | Path | None = None) -> bytes:
    """KL value of every run of the candidates, in history order (x = index
    into the candidate list, 0 the good endpoint), coloured by what the
    search concluded about the commit; the learned boundary (or threshold)
    as a dashed line, the culprit (or candidate block) marked. Returns the
    PNG bytes and writes them to ``out`` when given."""
    plt = _plt()
    res = data["result"]
    n = int(res.get("n_commits", 0))
    runs = data.get("runs", [])
    fig, ax = plt.subplots(figsize=(10, 4.2))
    try:
        valued = [r for r in runs if r["value"] is not None and not broke(r["value"])]
        xs_v = [r["index"] for r in valued]
        ys_v = [r["value"] for r in valued]
        colors = [BAD_C if r.get("side") == "bad" else GOOD_C if r.get("side") == "good" else UNK_C
                  for r in valued]
        positive = bool(ys_v) and min(ys_v) > 0
        if ys_v:
            ax.scatter(xs_v, ys_v, s=14, c=colors, alpha=0.75, linewidths=0, zorder=3)
        nans = [r["index"] for r in runs if r["value"] is not None and broke(r["value"])]
        if nans:
            # on the axis's top edge: at 1e9 they would squash every real value flat
            ax.scatter(nans, [1.0] * len(nans), marker="^", s=22, c=BAD_C, alpha=0.8,
                       transform=ax.get_xaxis_transform(), clip_on=False, zorder=3,
                       label=f"nan or inf ({len(nans)} runs)")
        crashed = [r["index"] for r in runs if r["value"] is None]
        if crashed:
            ax.scatter(crashed, [0.0] * len(crashed), marker="x", s=18, c="k", alpha=0.6,
                       transform=ax.get_xaxis_transform(), clip_on=False, zorder=3,
                       label=f"no value ({len(crashed)} runs)")
        if positive:
            ax.set_yscale("log")
        b = data.get("boundary")
        if b is not None and (not positive or b > 0):
            what = "threshold" if data.get("model", {}).get("kind") == "threshold" else "learned boundary"
            ax.axhline(b, ls="--", lw=1, c="k", alpha=0.6, label=f"{what} {fmt_value(b)}")
        cands = [c["index"] for c in data.get("culprit_commits", [])]
        if cands:
            lo, hi = min(cands), max(cands)
            if lo == hi:
                ax.axvline(lo, c=CULPRIT_C, lw=1.5, alpha=0.9,
                           label=f"culprit {res['candidates'][0][:10]} (P={fmt_confidence(res['confidence'])})")
            else:
                ax.axvspan(lo - 0.5, hi + 0.5, color=CULPRIT_C, alpha=0.25,
                           label=f"candidate block ({len(cands)} commits, P={fmt_confidence(res['confidence'])})")
        ax.set_xlim(-0.5 - n * 0.01, n + 0.5 + n * 0.01)
        from matplotlib.ticker import MaxNLocator  # noqa: PLC0415
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(f"candidate index (0 = good {res['good'][:10]}, {n} = bad {res['bad'][:10]})")
        # a --metric-regex may read an accuracy: the value is the probe's, KL or not
        ax.set_ylabel("value per run" + (", lower is worse" if res.get("worse") == "lower" else "")
                      + (" (log scale)" if positive else ""))
        ax.set_title(f"klbisect session {res.get('session')}: {len(ys_v)} runs with a value")
        ax.scatter([], [], c=GOOD_C, s=14, label="good side")
        ax.scatter([], [], c=BAD_C, s=14, label="bad side")
        ax.legend(loc="upper left", fontsize=8, framealpha=0.8)
        ax.grid(alpha=0.25)
        fig.tight_layout()
        return _save(fig, out)
    finally:
        plt.close(fig)


def history_plot(trend: dict, out: str | Path | None = None) -> bytes:
    """Per label: median over each nightly head with its [min, max] range,
    in night order; regressed nights marked."""
    plt = _plt()
    rows = trend.get("nights", [])
    labels = trend.get("labels", [])
    fig, ax = plt.subplots(figsize=(10, 4.2))
    try:
        xs = list(range(len(rows)))
        any_pos = True
        for k, lab in enumerate(labels):
            pts = [(x, r["labels"].get(lab)) for x, r in zip(xs, rows) if r["labels"].get(lab)]
            if not pts:
                continue
            px = [x + (k - (len(labels) - 1) / 2) * 0.06 for x, _ in pts]
            med = [s["median"] for _, s in pts]
            lo = [s["median"] - s["min"] for _, s in pts]
            hi = [s["max"] - s["median"] for _, s in pts]
            any_pos = any_pos and min(s["min"] for _, s in pts) > 0
            ax.errorbar(px, med, yerr=[lo, hi], marker="o", ms=4, capsize=2, lw=1, label=lab)
        reg = [x for x, r in zip(xs, rows) if r.get("verdict") in ("regressed", "known")]
        for x in reg:
            ax.axvspan(x - 0.4, x + 0.4, color=BAD_C, alpha=0.12, lw=0)
        crashed = [x for x, r in zip(xs, rows) if r.get("verdict") == "crashed"]
        if crashed:
            ax.scatter(crashed, [0.0] * len(crashed), marker="x", c="k", s=24,
                       transform=ax.get_xaxis_transform(), clip_on=False, label="probe crashed")
        if any_pos and labels and rows:
            ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{r['night']}\n{r['head'][:7]}" for r in rows], fontsize=7,
                           rotation=45 if len(rows) > 12 else 0)
        ax.set_ylabel("KL value (median, [min, max])")
        ax.set_title("klbisect nightly: KL per label over nightly heads"
                     + (" (shaded: regressed)" if reg else ""))
        if labels:
            ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.25)
        fig.tight_layout()
        return _save(fig, out)
    finally:
        plt.close(fig)
