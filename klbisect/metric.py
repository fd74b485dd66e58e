"""Read metric values out of a probe's output, whatever its exit code.

Pure functions: the output of SGLang's KL tests is the default format; a
regex or JSON lines cover other tools.
"""
from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable, Iterator

from rich.cells import cell_len, set_cell_size

from .errors import EXIT_USAGE, KlbisectError

# unittest writes its progress marks (". F E s x") to stderr, so a label line
# read from the combined output can start with them: ".[logprobs_match] ..."
# A label is a word in any script (a tester's [résumé_1] was not read), with . : / - inside.
_LABEL = re.compile(r"^[\s.FEsx]*\[([\w.:/-]+)\]")
# A verbose runner writes the test's name without a newline, so the test's
# first print continues that line: unittest -v "test_x (mod.Cls.test_x) ... "
# (to stderr), pytest -v -s "file.py::Cls::test_x ". Mid-line, only SGLang's
# own label line "[label] N samples, ..." after such a prefix counts: other
# bracketed text mid-line (log prefixes, "[Cls] GSM8K accuracy") does not.
_RUNNER_LABEL = re.compile(r"^(?:.* \.\.\. |\S+::\S+ )\[([\w.:/-]+)\] \d+ samples\b")
# Only a line that starts with avg_kl_div (optionally after its [label]) is a
# measurement: SGLang's assertion messages repeat "avg_kl_div=..." mid-line.
# numpy 2 prints an f"{x=}" of a numpy scalar as "np.float64(0.004)"
_AVG_KL = re.compile(r"^\s*(?:\[[^\]]*\][^\n]*?\s)?(?:avg_kl_div|avg KL)\s*[=:]\s*(?:np\.float\d+\()?"
                     r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?nan|[-+]?inf)", re.IGNORECASE)
# A --metric-regex's ^ and $ match at every line of the log: matched against the
# whole text, '^\[(?P<label>\w+)\] ...' read only the first label of three (a new user's)
REGEX_FLAGS = re.MULTILINE
# colour codes a test runner or logger wraps around the line
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
JSON_PREFIX = "KLBISECT "  # JSON-lines form: KLBISECT {"label": "x", "value": 0.004}
DEFAULT_LABEL = "value"
# What a NaN or +-inf stands as: a metric that broke is the worst value a run
# can print (KL grows as numerics fail; no real KL is -inf), larger than any
# real KL, and finite so that medians, log space and sqlite take it. For a
# metric worse lower, ``scalar`` reads it as -NONFINITE, the low end.
NONFINITE = 1e9
BROKEN_MAGNITUDE = 1e30


def _lines(text: str | Iterable[str]) -> Iterator[str]:
    """A text's lines, or an open log's one at a time (a probe's log may be
    hundreds of megabytes: read whole, a tester's 700 MB one ran out of
    memory), without colour codes."""
    for line in (text.splitlines() if isinstance(text, str) else text):
        yield _ANSI.sub("", line).rstrip("\r\n")


def parse_values(text: str | Iterable[str], regex: str | None = None) -> dict[str, float]:
    """Return label -> value for every metric the output printed.

    Without ``regex``: every ``avg_kl_div=<float>`` line (or ``avg KL:``,
    as SGLang's DP-attention tests print it), labelled by the ``[label]``
    line before it (SGLang's format; also its ``[label] N samples`` line
    after a ``unittest -v`` or ``pytest -v -s`` test-name prefix), plus
    JSON lines ``KLBISECT {"label": ..., "value": ...}``. A label line
    names the one value that follows it: values with no label line of
    their own (older tests, SGLang's single-turn helpers, even after a
    labelled class in the same file) are value, value2, ... in order. With
    ``regex``: a named group ``value`` (or the first group) and an optional
    named group ``label``; without one, the matches are value, value2, ...
    in order. A label printed again (one kit run by several test classes of
    a file) keeps every value: ``label``, ``label#2``, ... in order, so a
    run's value is the worst over all of them, not over the last class's.
    NaN, +-inf and magnitudes of BROKEN_MAGNITUDE or more (numerics that
    broke) stand as NONFINITE, the worst value. ANSI colour codes are
    ignored.
    """
    values: dict[str, float] = {}
    unlabelled = 0

    def positional(raw) -> None:
        nonlocal unlabelled
        unlabelled += 1
        _put(values, DEFAULT_LABEL if unlabelled == 1 else f"{DEFAULT_LABEL}{unlabelled}", raw)

    if regex:
        pattern = re.compile(regex, REGEX_FLAGS)
        # the user's pattern may span lines: it reads the whole text
        for m in pattern.finditer(text if isinstance(text, str) else "".join(text)):
            groups = m.groupdict()
            raw = groups.get("value") if "value" in groups else (m.group(1) if m.groups() else m.group(0))
            # without a label group each match is its own label ("value", "value2", ...), so
            # that a run's value is the max over every match, as with SGLang's lines
            if groups.get("label"):
                _add(values, groups["label"], raw)
            else:
                positional(raw)
        return values
    label = None      # the label line's, until a value takes it
    for line in _lines(text):
        if line.startswith(JSON_PREFIX):
            try:
                obj = json.loads(line[len(JSON_PREFIX):])
                _add(values, str(obj.get("label", DEFAULT_LABEL)), obj["value"])
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
            continue
        m = _LABEL.match(line) or _RUNNER_LABEL.match(line)
        if m:
            label = m.group(1)
        hit = _AVG_KL.match(line)
        if hit and label is None:
            positional(hit.group(1))
        elif hit:
            _add(values, label, hit.group(1))
            label = None
    return values


# The line naming the exception a Python run ended on: a traceback's last line,
# pytest's "E   SomeError: ..." or "E   assert ...", unittest's summary.
_EXC_LINE = re.compile(r"^(?:E\s+)?(?:[A-Za-z_][\w.]*\.)?([A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit))(?::|$)")
_PYTEST_ASSERT = re.compile(r"^E\s+assert\b")
_UNITTEST_SUMMARY = re.compile(r"^FAILED \(([^)]*)\)")


def failed_its_check(text: str | Iterable[str]) -> bool:
    """Did the run end on an assertion of its own (a test that printed a KL
    and then failed ``assert kl < threshold``), not a crash? Such a run
    stopped because a value it printed was too high, so the values it did
    print are measurements even when it never reached its later labels.
    unittest's summary decides when there is one (failures only, no
    errors); otherwise the last exception line does."""
    last = None
    for line in _lines(text):
        m = _UNITTEST_SUMMARY.match(line)
        if m:
            return "failures=" in m.group(1) and "errors=" not in m.group(1)
        if _PYTEST_ASSERT.match(line):
            last = "AssertionError"
            continue
        m = _EXC_LINE.match(line)
        if m:
            last = m.group(1)
    return last == "AssertionError"


def last_exception(text: str) -> str | None:
    """The last exception line a run printed ("RuntimeError: CUDA error:
    ..."), cut to one short line: what a crash message names, so that a
    probe that crashed is not taken for one whose values went unread."""
    last = None
    for line in _ANSI.sub("", text).splitlines():
        if _EXC_LINE.match(line.strip()) and not line.startswith((" ", "\t")):
            last = line.strip()
    if last and len(last) > 160:
        last = last[:157] + "..."
    return last


def check_regex(regex: str) -> None:
    """A --metric-regex that cannot work, refused before the first run."""
    try:
        pattern = re.compile(regex, REGEX_FLAGS)
    except re.error as e:
        raise KlbisectError(f"--metric-regex {shlex.quote(regex)} is not a valid regular expression ({e})",
                            EXIT_USAGE) from None
    shown = shlex.quote(regex)
    if not pattern.groups:
        raise KlbisectError(f"--metric-regex {shown} has no group for the number: write it as "
                            "(?P<value>...), e.g. 'avg_kl_div=(?P<value>[0-9.eE+-]+)'", EXIT_USAGE)
    if "value" not in pattern.groupindex and (pattern.groups > 1 or "label" in pattern.groupindex):
        # the first group would be read as the number: a label, as often as not
        raise KlbisectError(f"--metric-regex {shown} has {fmt_count(pattern.groups, 'group')} and none named "
                            "value: name the "
                            "number's group (?P<value>...) (and the label's (?P<label>...))", EXIT_USAGE)


def _add(values: dict[str, float], label: str, raw) -> None:
    """``label``'s value, or ``label#2``, ``label#3`` ... when it has one."""
    n, name = 1, label
    while name in values:
        n += 1
        name = f"{label}#{n}"
    _put(values, name, raw)


def _put(values: dict[str, float], label: str, raw) -> None:
    try:
        v = float(raw)
    except (TypeError, ValueError):
        return
    # a magnitude no real metric has (float32's overflow prints 3.4e38) broke too, and
    # squaring 1e300 in a spread overflowed
    values[label] = v if math.isfinite(v) and abs(v) < BROKEN_MAGNITUDE else NONFINITE


def scalar(values: dict[str, float], metric: str | None = None, worse: str = "higher") -> float | None:
    """One number per run: the chosen label, else the worst over labels (the
    max; the min when lower values are worse, as for an accuracy, so the
    label that got worse is the one judged)."""
    if not values:
        return None
    if worse == "lower":
        # a nan is the worst value whichever way is worse: the low end here, where the
        # min over labels keeps it (stored as NONFINITE, the high end, it read as a fix)
        values = {k: -NONFINITE if broke(v) else v for k, v in values.items()}
    if metric:
        return values.get(metric)
    return min(values.values()) if worse == "lower" else max(values.values())


def over_labels(worse: str = "higher") -> str:
    """What ``scalar`` takes over a run's labels without --metric, in words."""
    return "min" if worse == "lower" else "max"


def broke(value: float) -> bool:
    """Does this value stand for a nan or inf the probe printed? (Half of
    NONFINITE, or -NONFINITE for a metric worse lower: a centre computed in
    log space comes back a hair under it.)"""
    return abs(value) >= NONFINITE / 2


def fmt_value(value: float) -> str:
    """A metric value as people read it: a nan's stand-in reads as nan."""
    return "nan" if broke(value) else f"{value:.4g}"


def fmt_span(s: dict) -> str:
    """decide.summarize's median [min, max]."""
    return f"{fmt_value(s['median'])} [{fmt_value(s['min'])}, {fmt_value(s['max'])}]"


def fmt_summary(s: dict) -> str:
    """decide.summarize's numbers as one phrase: median [min, max] n=."""
    return f"median {fmt_span(s)} n={s['n']}" if s.get("n") else "no values"


def fmt_ratio(after: float, before: float) -> str:
    """after / before as "x1.83": blank with no positive before (a ratio of
    tiny or negative values means nothing), "x nan" where either stands for a
    nan the probe printed."""
    if broke(after) or broke(before):
        return "x nan"
    return f"x{after / before:.2f}" if before > 0 and after >= 0 else ""


def fmt_count(n: int, noun: str) -> str:
    """"1 candidate commit", "4 candidate commits"."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def fmt_confidence(p: float) -> str:
    """Four decimals, but never "1.0000": a posterior short of certainty
    must not read as certain."""
    return f"{p:.4f}" if p < 0.99995 else "> 0.9999"


def cells(s: str) -> int:
    """Terminal columns ``s`` takes: CJK characters take two, combining
    marks none (a subject in Chinese pushed `status`'s verdicts out of line)."""
    return cell_len(s)


def pad(s: str, width: int) -> str:
    """``s`` padded with spaces to ``width`` terminal columns."""
    return s + " " * max(width - cell_len(s), 0)


def _cut(s: str, width: int) -> str:
    """The longest start of ``s`` that fits ``width`` columns (rich's
    ``set_cell_size`` pads a wide character it splits with a space)."""
    return set_cell_size(s, width).rstrip(" ") if cell_len(s) > width else s


def fmt_subject(subject: str, limit: int = 60) -> str:
    """A subject cut to ``limit`` terminal columns without leaving half a PR
    number or a dangling bracket: "Route prefill through ... (#1" reads as PR 1."""
    s = (subject or "").replace("\n", " ")
    if cells(s) <= limit:
        return s
    pr = re.search(r"\s*\(#\d+\)$", s)
    if pr and len(pr.group()) < limit // 2:
        # the PR number is what a reader looks up: cut the words before it instead
        return fmt_subject(s[:pr.start()], limit - len(pr.group())) + pr.group()
    cut = _cut(s, limit - 1)
    open_at = cut.rfind("(")
    if open_at > limit // 2 and ")" not in cut[open_at:]:
        cut = cut[:open_at]
    return cut.rstrip() + "…"


def fmt_seconds(d: float | None) -> str:
    """A duration as a --timeout reads: 0.5 s stays 0.5 s, 1800 s stays whole."""
    d = d or 0.0
    return f"{d:.2g} s" if d < 0.1 else f"{d:.1f} s" if d < 10 else f"{d:.0f} s"


def fmt_vals(vals: list[float]) -> str:
    return "[" + ", ".join(fmt_value(v) for v in vals[:12]) + (", ..." if len(vals) > 12 else "") + "]"
