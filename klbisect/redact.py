"""Secrets out of everything klbisect prints or writes for people to read.

A probe command often carries a token (``HF_TOKEN=hf_... python3 test.py``,
``--server-args "--api-key sk-..."``): klbisect echoes commands in progress
lines, advice to paste, error lines, run logs and reports that go to
GitHub. The session store keeps the command as given, since `klbisect
probe` must run it again.
"""
from __future__ import annotations

import re

MASK = "<redacted>"

# a value: quoted (also as JSON escapes its quotes), or up to a quote, space, backslash, ; or ,
_VALUE = r"""(\\"(?:[^"\\]|\\[^"])*\\"|"[^"]*"|'[^']*'|[^\s'"\\;,]+)"""
# NAME=value where the name ends in what a secret is called (HF_TOKEN, OPENAI_API_KEY; not MAX_TOKENS)
_ASSIGN = re.compile(r"\b([A-Za-z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|CREDENTIALS?))"
                     "=" + _VALUE, re.I)
# --api-key VALUE, --token=VALUE, --hf-token VALUE (not --max-new-tokens)
_FLAG = re.compile(r"(--?(?:[A-Za-z0-9-]*-)?(?:token|secret|password|passwd|api-?key|access-?key))"
                   r"(=|\s+)" + _VALUE, re.I)
# well-known token shapes wherever they stand
_SHAPES = re.compile(r"\b(?:hf_[A-Za-z0-9]{8,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
                     r"|sk-[A-Za-z0-9_-]{8,}|xox[abprs]-[A-Za-z0-9-]{10,})")
_BEARER = re.compile(r"\b(Bearer|token)\s+[A-Za-z0-9._~+/-]{12,}=*", re.I)


def redact(text: str) -> str:
    """``text`` with every secret-looking value replaced by ``<redacted>``."""
    if not text:
        return text
    text = _ASSIGN.sub(lambda m: f"{m.group(1)}={MASK}", text)
    text = _FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    return _SHAPES.sub(MASK, text)


class RedactingStream:
    """A text stream that redacts what is written to it: the klbisect
    command wraps stdout and stderr in it, so no line of any command (a
    progress line, an error's log tail, a result) can print a token."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
