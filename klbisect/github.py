"""Pull-request metadata for reports, and comments for nightly results.

Everything here is optional decoration: offline, rate-limited or on a
missing PR, ``fetch_pr`` returns None and the report goes without a title.
The token is sent only in the Authorization header and is removed from
every message this module produces or raises.
"""
from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Protocol
from urllib.parse import urlsplit

import requests

from .errors import EXIT_USAGE, KlbisectError, shown
from .redact import MASK

DEFAULT_API = "https://api.github.com"
API_ENV = "KLBISECT_GITHUB_API"   # GitHub Enterprise's API, or (in tests) a loopback server
ACTIONS_API_ENV = "GITHUB_API_URL"   # what GitHub Actions sets, on github.com and Enterprise alike
log = logging.getLogger(__name__)

_SSH = re.compile(r"^(?:ssh://)?git@github\.com[:/](?P<slug>[^/\s]+/[^/\s]+?)(?:\.git)?/?$")
_HTTPS = re.compile(r"^(?:https?|git)://(?:[^@/\s]+@)?github\.com(?::\d+)?/(?P<slug>[^/\s]+/[^/\s]+?)(?:\.git)?/?$")


@dataclass
class PRMeta:
    number: int
    title: str
    author: str
    url: str
    merged_at: str | None   # ISO 8601, None when not merged


class PRCache(Protocol):
    """Where fetched PRs are kept (the state DB); ``put`` gets ``asdict(PRMeta)``."""

    def get(self, pr: int) -> dict | None: ...

    def put(self, pr: int, meta: dict) -> None: ...


class GitHubError(KlbisectError):
    pass


def api_base() -> str:
    return (os.environ.get(API_ENV) or os.environ.get(ACTIONS_API_ENV) or DEFAULT_API).rstrip("/")


def check_api_base() -> None:
    """Refuse an API address that cannot be one before hours of probing
    (a tester's "not a url" was reported as a post that "may have arrived")."""
    base = api_base()
    name = API_ENV if os.environ.get(API_ENV) else ACTIONS_API_ENV
    try:
        parts = urlsplit(base)
        parts.port          # raises on a port that is not a number
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise GitHubError(f"{name}={base!r} is not an http(s) address of a GitHub API (like https://api.github.com "
                          "or https://HOST/api/v3): fix or unset it", EXIT_USAGE)
    if parts.scheme == "http" and parts.hostname not in ("localhost", "127.0.0.1", "::1"):
        raise GitHubError(f"{name}={base!r} is plain http: the token would cross the network unencrypted; "
                          "use its https address", EXIT_USAGE)


def _same_origin(url: str, base: str) -> bool:
    a, b = urlsplit(url), urlsplit(base)
    default = {"http": 80, "https": 443}
    try:
        return (a.scheme, a.hostname, a.port or default.get(a.scheme)) == \
            (b.scheme, b.hostname, b.port or default.get(b.scheme))
    except ValueError:      # a port that is not a number
        return False


_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")\]]+|Name or service not known|timed out|Connection refused")


def _cause(e: requests.RequestException) -> str:
    """The part of a requests error a user can act on: its text nests
    urllib3's pool and retry wrappers around the OS error, and a message
    cut to one line lost that last."""
    text = f"{type(e).__name__}: {e}"
    found = _ERRNO.findall(text)
    return f"{type(e).__name__}: {found[-1].strip()}" if found else text[:200]


def parse_slug(remote_url: str | None) -> str | None:
    """``owner/name`` of a GitHub remote (https, ssh or scp-like), else None."""
    url = (remote_url or "").strip()
    m = _SSH.match(url) or _HTTPS.match(url)
    return m.group("slug") if m else None


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, MASK) if token else text


def _headers(token: str | None) -> dict[str, str]:
    h = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
         "User-Agent": "klbisect"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def _request(method: str, url: str, token: str | None, session: requests.Session | None, timeout: float,
             retries: int, backoff: float, json_body: dict | None = None,
             why: list[str] | None = None) -> requests.Response | None:
    """One call with retries on connection errors and 5xx; None when every
    attempt failed to get an answer (the last error appended to ``why``).
    Never lets the token reach a message. A POST is not idempotent: it is
    retried only when it could not have arrived (the connection failed),
    and a 5xx is its answer, since the comment may exist all the same."""
    s = session or requests
    last = ""
    once = method != "GET"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff * 2 ** (attempt - 1))
        try:
            r = s.request(method, url, headers=_headers(token), json=json_body, timeout=timeout)
        except requests.RequestException as e:
            last = _redact(_cause(e), token)
            log.debug("%s %s failed: %s", method, url, last)
            if once and (isinstance(e, requests.ReadTimeout) or not isinstance(e, requests.ConnectionError)):
                last = f"no answer in time, so it may have arrived ({last})"
                break
            continue
        if r.status_code >= 500 and not once:
            last = f"HTTP {r.status_code}"
            log.debug("%s %s answered %s", method, url, r.status_code)
            continue
        return r
    log.debug("%s %s gave up after %d attempts: %s", method, url, retries + 1, last)
    if why is not None:
        why.append(last)
    return None


def fetch_pr(pr: int, slug: str, token: str | None = None, session: requests.Session | None = None,
             timeout: float = 10, retries: int = 2, cache: PRCache | None = None,
             backoff: float = 0.5) -> PRMeta | None:
    """Title, author, link and merge time of a pull request; None when it
    cannot be had (offline, 404, rate limit, malformed answer)."""
    if cache is not None:
        hit = cache.get(pr)
        if hit:
            try:
                return PRMeta(**hit)
            except TypeError:
                pass
    r = _request("GET", f"{api_base()}/repos/{slug}/pulls/{int(pr)}", token, session, timeout, retries, backoff)
    if r is None or r.status_code != 200:
        return None
    try:
        d = r.json()
        meta = PRMeta(int(d["number"]), str(d["title"]), str((d.get("user") or {}).get("login", "")),
                      str(d["html_url"]), d.get("merged_at"))
    except (ValueError, KeyError, TypeError):
        return None
    if cache is not None:
        cache.put(pr, asdict(meta))
    return meta


_REFUSED_HINTS = {
    401: "check GITHUB_TOKEN: GitHub does not accept it (expired, revoked or mistyped)",
    403: "check GITHUB_TOKEN's rights: it must be allowed to comment on issues of that repository "
         "(classic: repo or public_repo scope; fine-grained: Issues read and write), or the rate limit was hit",
    404: "no such issue, or GITHUB_TOKEN cannot see that repository",
}


def post_comment(slug: str, issue_number: int, body: str, token: str, session: requests.Session | None = None,
                 timeout: float = 10, retries: int = 2, backoff: float = 0.5) -> str:
    """Comment on an issue or PR; returns the comment's URL. Raises
    GitHubError with a message that never contains the token."""
    if not token:
        raise GitHubError("posting to GitHub needs a token (GITHUB_TOKEN)", EXIT_USAGE)
    url = f"{api_base()}/repos/{slug}/issues/{int(issue_number)}/comments"
    why: list[str] = []
    r = _request("POST", url, token, session, timeout, retries, backoff, json_body={"body": body}, why=why)
    if r is None and why and "may have arrived" in why[-1]:
        raise GitHubError(f"GitHub at {api_base()} took the comment on {slug}#{issue_number} but gave "
                          f"{why[-1]}: the next nightly run looks for it before posting again", EXIT_USAGE)
    if r is None:
        raise GitHubError(f"could not reach GitHub at {api_base()} to comment on {slug}#{issue_number}: "
                          f"{why[-1] if why else '?'}", EXIT_USAGE)
    if r.status_code != 201:
        # redact first: a cut could split the token; one line, whatever the server's page holds
        # (as UTF-8: requests guesses a charset-less page's encoding, and read an HTML error as UTF-16)
        detail = shown(_redact(r.content.decode("utf-8", "replace"), token)[:200], one_line=True)
        hint = _REFUSED_HINTS.get(r.status_code, "")
        raise GitHubError(f"GitHub refused the comment on {slug}#{issue_number}: HTTP {r.status_code} {detail}"
                          + (f" ({hint})" if hint else ""), EXIT_USAGE)
    try:
        return str(r.json().get("html_url", ""))
    except ValueError:
        return ""


def find_comment(slug: str, issue_number: int, marker: str, token: str, since: float | None = None,
                 session: requests.Session | None = None, timeout: float = 10, retries: int = 2,
                 backoff: float = 0.5, pages: int = 10) -> str | None:
    """The URL of a comment on the issue whose body holds ``marker`` (made
    since ``since``, a time), "" for one without a URL, None when there is
    none or the comments cannot be read: a POST that got no answer in time
    or a 5xx may have made its comment all the same."""
    url = f"{api_base()}/repos/{slug}/issues/{int(issue_number)}/comments?per_page=100"
    if since is not None:
        url += "&since=" + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    for _ in range(pages):
        r = _request("GET", url, token, session, timeout, retries, backoff)
        if r is None or r.status_code != 200:
            return None
        try:
            items = r.json()
        except ValueError:
            return None
        for c in items if isinstance(items, list) else []:
            if isinstance(c, dict) and marker in str(c.get("body") or ""):
                return str(c.get("html_url") or "")
        url = (r.links.get("next") or {}).get("url")
        if not url or not _same_origin(url, api_base()):
            return None     # the token goes to the API it was given for, nowhere a server points
    return None
