"""Secrets out of everything klbisect prints, and out of the commands it writes.

A probe command often carries a token (``HF_TOKEN=hf_... python3 test.py``,
``--server-args "--api-key sk-..."``): klbisect echoes commands in progress
lines, advice to paste, error lines and log tails, run-log headers, and
reports that go to GitHub. The session store keeps the command as given,
since `klbisect probe` must run it again; what a probe itself writes to its
log is kept as written, in a file only its user can read (``proc.private_log``).
"""
from __future__ import annotations

import json
import os
import re

MASK = "<redacted>"

_NAME = r"(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|(?:SECRET|PRIVATE)_?KEY|CREDENTIALS?)"
# a value: quoted (also as JSON escapes its quotes, and as shlex.quote writes a ' inside '...': the
# advice `klbisect run --probe-cmd 'KEY='"'"'v'"'"' ...'`), or up to a quote, space, backslash, ;, , or
# a ) that ends it (a repr's closing parenthesis: ServerArgs(..., api_key=None)); one inside is kept
_VALUE = (r"""('"'"'.*?'"'"'|\\"(?:[^"\\]|\\[^"])*\\"|"[^"]*"|'[^']*'"""
          r"""|(?:[^\s'"\\;,)]|\)(?=[^\s'"\\;,]))+)""")
# NAME=value where the name ends in what a secret is called (HF_TOKEN, OPENAI_API_KEY; not MAX_TOKENS)
_ASSIGN = re.compile(r"\b([A-Za-z0-9_]*" + _NAME + ")=" + _VALUE, re.I)
_ENV_NAME = re.compile(r"[A-Za-z0-9_]*" + _NAME, re.I)
# a key that names a secret, whole: api_key, hf-token, password, token (not eos_token, kl_per_token)
_KEY = (r"(?:[A-Za-z0-9_-]*[-_])?(?:api[-_]?key|access[-_]?key|private[-_]?key|secret(?:[-_]?key)?|password|"
        r"passwd|credentials?|(?:hf|gh|github|hub|auth|access|api|bearer|refresh|session|id|slack|openai|wandb)"
        r"[-_]?token)|token")
_KEY_NAME = re.compile(_KEY, re.I)
# "api_key": "v" and 'token': 'v', also JSON-escaped (\"api_key\": \"v\"), inside a line: both quoted,
# so that prose ("token: expected an int", "GITHUB_TOKEN: set") and YAML are left alone
_QUOTED_PAIR = re.compile(r"""(\\"|"|')(""" + _KEY + r""")\1(\s*:\s*)(\\"|"|')((?:(?!\4)[^\n])*)\4""", re.I)
# --api-key VALUE, --token=VALUE, --hf_token VALUE, '--api-key', 'VALUE' (not --max-new-tokens, nor prose:
# "per-token FP8"), also after an escaped newline or tab (a repr or JSON inside a log line)
_FLAG = re.compile(r"(?:(?<![\w-])|(?<=\\[nrt]))(--?(?:[A-Za-z0-9_-]*[-_])?(?:token|secret|password|passwd|api[-_]?key|access[-_]?key))"
                   r"(=|\s+|['\"],\s*(?=['\"]))" + _VALUE, re.I)   # the last: an argv list's next item
# well-known token shapes wherever they stand (long enough not to be a label: hf_logprobs, sk-learn)
_SHAPES = re.compile(r"\b(?:hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
                     r"|sk-[A-Za-z0-9_-]{20,}|xox[abprs]-[A-Za-z0-9-]{10,})")
_HEADER = re.compile(r"\b(Authorization|X-Api-Key|Api-Key|Private-Token)(\s*:\s*)(?:(Bearer|Basic|token)\s+)?"
                     r"[^\s'\"\\;,]+", re.I)
_URL_CREDENTIALS = re.compile(r"(://[^/\s:@'\"]+:)[^/\s@'\"]+@")
# a token alone as the user (https://TOKEN@pypi.fury.io/..., deploy tokens): long enough not to be
# a user name (ssh://git@github.com)
_URL_TOKEN = re.compile(r"(://)[^/\s:@'\"]{12,}@")


_SECRET_VAR = re.compile(r"[A-Za-z0-9_]*" + _NAME + r"$", re.I)


def _secret_values() -> list[str]:
    """The values of this process's variables named like secrets: a probe
    that prints its environment (or ``echo $MY_TOKEN``) shows them bare.
    Read at each call: every printed line pays a scan of the environment,
    not a compile, and a variable set later is still covered."""
    return sorted({v for k, v in os.environ.items() if _SECRET_VAR.match(k) and len(v) >= 10},
                  key=len, reverse=True)


# a mask a report escaped for HTML or markdown (&lt;redacted&gt;), held whole while the patterns run: its
# ";" ended a value, and a second pass left "password=<redacted>;redacted&gt;" in a commit's subject
_ESCAPED_MASK = "&lt;redacted&gt;"
_HELD_MASK = "\x00redacted\x00"


def _kept(value: str, name: str = "") -> bool:
    # a reference ($HF_TOKEN, $(cat ~/.hf)) is no secret, nor a count (num_token=32,
    # --max-tokens 64); a key or password of digits is one (--api-key 12345678)
    bare = value.strip("\"'\\")
    count = not name or re.search(r"(?:num|max|min|top|n)[-_]?(?:new[-_])?tokens?$|tokens$", name, re.I) is not None
    # nor an unset one (SGLang's ServerArgs(..., api_key=None) read as if a key were set)
    # nor argparse's placeholder in a usage text, "[--api-key API_KEY]" (a tester's lost its "]")
    metavar = name.lstrip("-").upper().replace("-", "_")
    return (bare.startswith("$") or bare in ("", "None", "null", MASK, _HELD_MASK)
            or (count and re.fullmatch(r"[\d.]+", bare) is not None)
            or (bool(metavar) and bare.rstrip("]").rstrip(".,;") == metavar))


_FLAG_NAME = re.compile(r"--?(?:[A-Za-z0-9_-]*[-_])?(?:token|secret|password|passwd|api[-_]?key|access[-_]?key)",
                        re.I)


def flag_secrets(argv) -> list[str]:
    """The values an argv gives its secret-named flags (``--api-key K``,
    ``--token=K``): a server that echoes its arguments (SGLang logs its
    ServerArgs) shows them bare, where no pattern would know them."""
    out = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if not _FLAG_NAME.fullmatch(name):
            continue
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if len(value) >= KNOWN_MIN and not _kept(value, name):
            out.append(value)
    return out


def env_secrets(assignments) -> list[str]:
    """The values of ``NAME=VALUE`` items whose name is a secret's (HF_TOKEN,
    WANDB_API_KEY): known, so that a server echoing one bare is masked too."""
    out = []
    for item in assignments:
        name, eq, value = item.partition("=")
        if eq and _ENV_NAME.fullmatch(name) and len(value) >= KNOWN_MIN and not _kept(value, name):
            out.append(value)
    return out


KNOWN_MIN = 6   # a secret klbisect was given this short is masked only as a whole word anyway


def redact(text: str, known=()) -> str:
    """``text`` with every secret-looking value replaced by ``<redacted>``,
    and every one of ``known`` (secrets klbisect was given) wherever it is."""
    if not text:
        return text
    held = _ESCAPED_MASK in text
    if held:
        text = text.replace(_ESCAPED_MASK, _HELD_MASK)
    for v in _secret_values():
        text = text.replace(v, MASK)
    for v in sorted(set(known), key=len, reverse=True):
        # as a whole word: an --api-key of "testkey" must not eat "testkeys_passed"
        text = re.sub(r"(?<![\w-])" + re.escape(v) + r"(?![\w-])", MASK, text)
    text = _ASSIGN.sub(lambda m: m.group(0) if _kept(m.group(2), m.group(1)) else f"{m.group(1)}={MASK}", text)
    text = _QUOTED_PAIR.sub(lambda m: m.group(0) if _kept(m.group(5), m.group(2))
                            else f"{m.group(1)}{m.group(2)}{m.group(1)}{m.group(3)}{m.group(4)}{MASK}{m.group(4)}",
                            text)
    text = _FLAG.sub(lambda m: m.group(0) if _kept(m.group(3), m.group(1)) else f"{m.group(1)}{m.group(2)}{MASK}",
                     text)
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{m.group(3) + ' ' if m.group(3) else ''}{MASK}", text)
    text = _URL_CREDENTIALS.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _URL_TOKEN.sub(lambda m: f"{m.group(1)}{MASK}@", text)
    text = _SHAPES.sub(MASK, text)
    return text.replace(_HELD_MASK, _ESCAPED_MASK) if held else text


def redact_json(obj, keys: bool = True):
    """Every string in a JSON-able object redacted on its own: a pattern run
    over the serialized text could reach across a string's end. ``keys``:
    the dict keys too (``False`` for data a program reads on: two labels
    could redact to one key)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        # {"api_key": "v"}: the value alone names nothing
        return {(redact_json(k) if keys else k):
                MASK if isinstance(k, str) and isinstance(v, str) and _KEY_NAME.fullmatch(k) and not _kept(v, k)
                else redact_json(v, keys) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact_json(v, keys) for v in obj]
    return obj


def redact_text(text: str) -> str:
    """``redact``, but a JSON text stays valid JSON (``redact_json``)."""
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            obj = json.loads(stripped)
        except (ValueError, RecursionError):   # a probe's log tail of '[[[[...'
            pass
        else:
            clean = redact_json(obj)
            if clean == obj:
                return text
            return json.dumps(clean, indent=1 if "\n" in stripped else None, default=str) \
                + text[len(text.rstrip()):]
    return redact(text)


class RedactingStream:
    """A text stream that redacts what is written to it: the klbisect
    command wraps stdout and stderr in it, so no line of any command (a
    progress line, an error's log tail, a result) can print a token. A
    JSON object written whole is redacted string by string, so it stays
    valid JSON.

    Output is best effort: once it cannot be written (``| head``, a closed
    ``tee``, ``2>>log`` on a full disk) writes are dropped. A BrokenPipeError
    let through became click's exit 1, and a full disk's error a traceback's
    exit 1, which ``git bisect run`` records as a bad commit; the exit code
    is the verdict and must not depend on where the lines go."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        self._guarded(self._stream.write, redact_text(text))
        return len(text)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def _guarded(self, op, *args) -> None:
        try:
            op(*args)
        except OSError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        # the fd itself goes to /dev/null: buffered bytes and the interpreter's
        # own flush at exit then succeed instead of raising again
        try:
            fd = self._stream.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError, AttributeError):
            pass

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)
