"""One user-facing error type and the exit codes every command shares.

Codes at or above 128 make ``git bisect run`` abort instead of counting a
misconfiguration as a bad commit; 0/1/125 are reserved for verdicts.
"""
from __future__ import annotations

import re

EXIT_GOOD = 0
EXIT_BAD = 1
EXIT_SKIP = 125
EXIT_INTERRUPTED = 130
EXIT_USAGE = 150          # bad option, missing probe, no session
EXIT_REVISION = 151       # not a repository, unknown revision, bad range
EXIT_REPO_STATE = 152     # dirty tree, bisect already in progress
EXIT_BUSY = 153           # another klbisect holds this repository
EXIT_NO_SIGNAL = 154      # endpoints give no value or do not separate; a build that never works
EXIT_PROBE_MISSING = 155  # the probe command is not found
EXIT_STORAGE = 156        # disk full or state not writable
EXIT_NOT_SURE = 157       # search ended without reaching --confidence
EXIT_POST_FAILED = 158    # nightly found a regression but could not post its report
EXIT_INTERNAL = 159       # a bug in klbisect: never 1, so git bisect aborts

EXIT_CODES = {
    EXIT_GOOD: "good (probe) / success",
    EXIT_BAD: "bad (probe only)",
    EXIT_SKIP: "skip: build failed, probe crashed, no value, or undecided (probe only)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, SIGTERM or SIGHUP); rerun the same command to resume",
    EXIT_USAGE: "usage: a bad or missing option, or no klbisect session",
    EXIT_REVISION: "not a git repository, unknown revision, or good/bad not a valid range",
    EXIT_REPO_STATE: "repository state: dirty working tree or a git bisect already in progress",
    EXIT_BUSY: "busy: another klbisect is working on this repository",
    EXIT_NO_SIGNAL: ("the endpoints print no value, good and bad do not separate (or stop differing), the "
                     "build never succeeds, the environment broke mid-search, or (nightly) the head printed "
                     "no value"),
    EXIT_PROBE_MISSING: "the probe command was not found",
    EXIT_STORAGE: "state could not be written (disk full, read-only, damaged or deleted); recorded runs are kept",
    EXIT_NOT_SURE: ("the search stopped before reaching --confidence (its reason says which cap to raise); "
                    "probe: it stopped git bisect, commits undecided or --max-total-runs spent"),
    EXIT_POST_FAILED: "nightly: a report it owed (a regression or its fix, tonight's or an earlier night's) "
                      "could not be posted",
    EXIT_INTERNAL: "internal error in klbisect (a bug; the message says where)",
}


class KlbisectError(Exception):
    """An error the user can act on: printed as one line, never a traceback."""

    def __init__(self, message: str, code: int = EXIT_USAGE, detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.detail = detail  # optional extra lines (e.g. a log tail) shown after the message
        self.endpoint: str | None = None   # "good" or "bad": the one endpoint that cannot be measured


class NoDifference(KlbisectError):
    """The endpoints, measured, do not differ the way a regression would:
    no regression, one too small to bisect, or a fix. A nightly check that
    called the head regressed takes this as "not confirmed", not a failure."""

    def __init__(self, message: str, detail: str | None = None, alike: bool = False):
        super().__init__(message, EXIT_NO_SIGNAL, detail)
        # measured to the end and alike (not a fix, not broken numerics, not one label's hint)
        self.alike = alike


class OutOfRuns(KlbisectError):
    """--max-total-runs spent before the endpoints were measured enough:
    under `run --all-commits`, a side branch's search that ran out leaves
    the merge above it named, not sure."""

    def __init__(self, message: str):
        super().__init__(message, EXIT_NOT_SURE)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) with what was kept: the command's one line.
    Still a KeyboardInterrupt, so nothing that catches errors catches it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def json_failure(nightly: bool, error: str, code: int, partial: dict | None = None) -> dict:
    """The --json object of a command that failed: the keys its success
    would have, so a script reads one shape whatever happened. ``partial``:
    what was decided before it failed (a nightly judged regressed, then
    interrupted in its bisect, is still a regression)."""
    keys = ({"regressed": None, "verdict": "error", "culprit": None, "pr": None, "report": None, "posted": False}
            if nightly else {"culprit": None, "complete": False})
    return {**keys, **(partial or {}), "error": error, "exit_code": code}


# C0 and C1 controls, and the bidi overrides that reorder what a terminal shows
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_OR_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(m: re.Match) -> str:
    c = ord(m.group())
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(m.group()) or (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}")


def shown(text: str, one_line: bool = False) -> str:
    """Text from elsewhere (a probe's log tail, a server's answer) as an
    error may show it: escape sequences (a title, a clear screen, binary
    junk) shown, not played on the user's terminal; with ``one_line``,
    line breaks too, so the error stays one line."""
    return (_CONTROL_OR_LINE if one_line else _CONTROL).sub(_escaped, text)
