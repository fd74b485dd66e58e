"""SGLang integration: a probe that launches the commit's server and measures
KL like SGLang's own KL tests, and a builder that knows SGLang's packaging.

The probe drives the native HTTP API (``/generate``, ``/flush_cache``) the way
``python/sglang/test/kl_test_utils.py`` does: sample with logprobs, flush the
cache, replay prompt + output as a cold prefill, and compare the two logprobs
of every sampled token with the k3 estimator. It prints the KL tests' lines
(``[label] ...``, ``kl_divs=...``, ``avg_kl_div=...``) into the run log, so
``metric.parse_values`` reads its values like any other probe's output.

A launch costs minutes on real hardware, so runs of the same commit in the
same slot share one server (``runs_per_launch``). A server is keyed by its
checkout path and that checkout's HEAD sha: it never serves another commit.
Every server is also registered with ``proc``'s set of active process groups,
so the executor's Ctrl-C handling kills it with everything else.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import math
import os
import random
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence
from urllib.parse import unquote, urlparse

import psutil
import requests

from . import proc
from .build import DEFAULT_BUILD_TIMEOUT, BuildResult, matches_any
from .errors import EXIT_USAGE, KlbisectError, shown
from .metric import JSON_PREFIX, REGEX_FLAGS, fmt_count
from .probe import DEFAULT_TIMEOUT, RunResult, Slot, config_key
from .runs import STATUS_CRASH, STATUS_NOSERVER, STATUS_OK, STATUS_TIMEOUT
from .proc import child_environ, kill_tree, log_tail, run_logged
from .redact import env_secrets, flag_secrets, redact
from .repo import head_sha

LABELS = ("logprobs_match", "prefill_cache_hit", "decode_cache_hit")
DEFAULT_LAUNCH_TIMEOUT = 1800.0      # popen_launch_server: 600 s, 3000 on Blackwell and AMD CI, x3 for DCP tests
DEFAULT_REQUEST_TIMEOUT = 1800.0
DEFAULT_MAX_NEW_TOKENS = 512
HOST = "127.0.0.1"
PORTS_PER_SLOT = 8                   # tried from slot.port_base when the first is taken
MIN_HIT_FRACTION = 0.5               # the KL tests' "too few cache hits" bound

# ---------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------


def load_prompts(path: str | Path) -> list[list[int]]:
    """A JSON list of token-id lists (what ``get_input_ids`` caches); any other
    shape is a one-line usage error, found before a server is launched."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise KlbisectError(f"cannot read prompts file {p}: {e.strerror or e}", EXIT_USAGE) from None
    except ValueError as e:
        raise KlbisectError(f"prompts file {p} is not JSON: {e}", EXIT_USAGE) from None
    if not isinstance(data, list) or not data:
        raise KlbisectError(f"prompts file {p} must hold a non-empty JSON list of token-id lists", EXIT_USAGE)
    for i, item in enumerate(data):
        if (not isinstance(item, list) or not item
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in item)):
            raise KlbisectError(f"prompts file {p}: item {i} is not a non-empty list of token ids "
                                "(non-negative integers)", EXIT_USAGE)
    return data


def make_prompts(text_file: str | Path, tokenizer_path: str, out: str | Path,
                 num_samples: int = 18, max_tokens: int = 3000,
                 trust_remote_code: bool = False) -> tuple[int, list[int]]:
    """Write a prompts file from text: one sample per line of a ``.jsonl`` file
    (field ``text``, or ``context`` + ``question`` as in LongBench), else
    consecutive ``max_tokens`` windows of the whole text.

    Needs ``transformers`` (optional; imported only here) and the model's
    tokenizer, so prompts match what the server tokenizes. Returns the count,
    and the token ids of "," that the tests put between decode_cache_hit's
    turns (``--turn-separator``).
    """
    # checked first: a negative count would slice prompts off the end, 0 tokens loop forever
    for option, n in (("--num-samples", num_samples), ("--max-tokens", max_tokens)):
        if not _is_int(n) or n < 1:
            raise KlbisectError(f"{option} {n}: give a whole number, at least 1", EXIT_USAGE)
    try:
        from transformers import AutoTokenizer  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise KlbisectError("make-prompts needs the 'transformers' package: pip install transformers",
                            EXIT_USAGE) from None
    src = Path(text_file)
    try:
        text = src.read_text()
    except OSError as e:
        raise KlbisectError(f"cannot read {src}: {e.strerror or e}", EXIT_USAGE) from None
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust_remote_code)
    except ValueError as e:
        if trust_remote_code or "trust_remote_code" not in str(e):
            raise
        raise KlbisectError(f"the tokenizer {tokenizer_path} ships its own code: add --trust-remote-code "
                            "(as the KL tests load it)", EXIT_USAGE) from None
    prompts: list[list[int]] = []
    if src.suffix == ".jsonl":
        for line in text.splitlines():
            if len(prompts) >= num_samples:
                break
            if not line.strip():
                continue
            obj = json.loads(line)
            sample = obj.get("text") or f"{obj.get('context', '')} {obj.get('question', '')}".strip()
            ids = tok.encode(sample)[:max_tokens]
            if ids:
                prompts.append(ids)
    else:
        ids = tok.encode(text, add_special_tokens=False)
        prompts = [ids[i:i + max_tokens] for i in range(0, len(ids), max_tokens)][:num_samples]
        prompts = [p for p in prompts if p]
    if not prompts:
        raise KlbisectError(f"{src} gave no tokens", EXIT_USAGE)
    Path(out).write_text(json.dumps(prompts))
    # decode_cache_hit's second turn: the tests append tokenizer.encode(",") (a BOS with it, for many)
    return len(prompts), list(tok.encode(","))


# ---------------------------------------------------------------------------
# KL, the way SGLang's compare_kl_divergence computes it
# ---------------------------------------------------------------------------


def k3_kl(prefill: Sequence[float], decode: Sequence[float]) -> float:
    """Mean over tokens of ``(exp(logr) - 1) - logr``, ``logr = prefill - decode``
    (an unbiased, always non-negative KL estimate from sampled tokens)."""
    if len(prefill) != len(decode) or not decode:
        raise ValueError(f"need equal, non-empty logprob lists (got {len(prefill)} and {len(decode)})")
    total = 0.0
    for a, b in zip(prefill, decode):
        r = a - b
        total += math.expm1(r) - r
    return total / len(decode)


def avg_kl(kl_divs: Sequence[float]) -> float:
    return sum(kl_divs) / len(kl_divs)


# ---------------------------------------------------------------------------
# Requests (field names of GenerateReqInput, python/sglang/srt/managers/io_struct.py)
# ---------------------------------------------------------------------------


def generate_payload(input_ids: list[list[int]], max_new_tokens: int, *, return_logprob: bool,
                     logprob_start_len: int = -1, temperature: float = 1.0) -> dict:
    """One batched ``/generate`` request. Temperature is always explicit:
    otherwise the server may take it from the model's generation config."""
    payload: dict = {
        "input_ids": input_ids,
        "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens,
                            "ignore_eos": True},
    }
    if return_logprob:
        payload.update(return_logprob=True, return_text_in_logprobs=False,
                       logprob_start_len=logprob_start_len)
    return payload


class ProtocolError(Exception):
    """The server answered, but not with what the KL measurement needs."""


@dataclass
class Client:
    """The few endpoints the measurement needs, with timeouts on every call."""

    base_url: str
    timeout: float = DEFAULT_REQUEST_TIMEOUT
    deadline: float | None = None     # time.monotonic() by which the run must end
    session: requests.Session = field(default_factory=requests.Session)
    api_key: str | None = None        # the server's --api-key: sent as a bearer token, as SGLang's clients do
    # its --admin-api-key: SGLang's admin-optional endpoints (/flush_cache) take only that one when it is set
    admin_api_key: str | None = None

    def __post_init__(self) -> None:
        self.session.trust_env = False  # never send loopback traffic through a proxy
        if self.api_key:
            self.session.headers["Authorization"] = f"Bearer {self.api_key}"

    def _admin(self) -> dict:
        return {"Authorization": f"Bearer {self.admin_api_key}"} if self.admin_api_key else {}

    @staticmethod
    def _refused(r: requests.Response, what: str) -> ProtocolError:
        why = (": the server checks an API key and refused this one (--server-args --api-key KEY is the key "
               "klbisect sends; --admin-api-key KEY for /flush_cache)" if r.status_code == 401
               else f": {shown(redact(r.content.decode('utf-8', 'replace'))[:300], one_line=True)}")
        return ProtocolError(f"{what} answered {r.status_code}{why}")

    def _timeout(self) -> float:
        if self.deadline is None:
            return self.timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise requests.Timeout("the run's time limit was reached")
        return min(self.timeout, left)

    def generate(self, payload: dict) -> list[dict]:
        r = self.session.post(self.base_url + "/generate", json=payload, timeout=self._timeout())
        if r.status_code != 200:
            raise self._refused(r, "/generate")
        out = r.json()
        out = out if isinstance(out, list) else [out]
        if len(out) != len(payload["input_ids"]):
            raise ProtocolError(f"/generate returned {len(out)} results for {len(payload['input_ids'])} inputs")
        return out

    def flush_cache(self, attempts: int = 20) -> None:
        # 400 while requests are still running: wait for them, like the tests' retries.
        for _ in range(attempts):
            r = self.session.post(self.base_url + "/flush_cache", timeout=self._timeout(), headers=self._admin())
            if r.status_code == 200:
                return
            if r.status_code == 401:
                raise self._refused(r, "/flush_cache")
            time.sleep(0.5)
        raise ProtocolError(f"/flush_cache kept answering {r.status_code}")

    def server_info(self) -> dict:
        # /server_info is the name since /get_server_info was deprecated; older commits have only the latter
        for path in ("/server_info", "/get_server_info"):
            r = self.session.get(self.base_url + path, timeout=self._timeout())
            if r.status_code == 401 and self.admin_api_key:
                r = self.session.get(self.base_url + path, timeout=self._timeout(), headers=self._admin())
            if r.status_code == 200:
                return r.json()
        return {}


def _output_logprobs(result: dict) -> list[float]:
    lps = [x[0] for x in result["meta_info"]["output_token_logprobs"]]
    if any(v is None for v in lps):
        raise ProtocolError("output_token_logprobs holds a null logprob")
    return lps


def _replay(client: Client, seqs: list[list[int]], decode_lps: list[list[float]],
            batch_size: int | None = None, temperature: float = 1.0) -> list[float]:
    """Cold-prefill logprobs of each sequence's last tokens; per-sequence KL.
    ``batch_size``: sequences a request, each request after a flush (the
    multi-turn tests replay one at a time); None: all in one."""
    step = batch_size or max(len(seqs), 1)
    results = []
    for i in range(0, len(seqs), step):
        client.flush_cache()
        results += client.generate(generate_payload(seqs[i:i + step], 0, return_logprob=True, logprob_start_len=0,
                                                    temperature=temperature))
    kl_divs = []
    for res, dec in zip(results, decode_lps):
        pre = [x[0] for x in res["meta_info"]["input_token_logprobs"]][-len(dec):]
        if len(pre) != len(dec) or any(v is None for v in pre):
            raise ProtocolError("input_token_logprobs does not cover the generated tokens")
        kl_divs.append(k3_kl(pre, dec))
    return kl_divs


@dataclass
class LabelResult:
    label: str
    kl_divs: list[float]
    samples: int
    turns: int
    note: str = ""

    @property
    def value(self) -> float | None:
        return avg_kl(self.kl_divs) if self.kl_divs else None

    def lines(self, max_new_tokens: int) -> list[str]:
        head = (f"[{self.label}] {self.samples} samples, {self.turns} turns, "
                f"max_new_tokens={max_new_tokens}, {len(self.kl_divs)} measured")
        if self.note:
            head += f"; {self.note}"
        if not self.kl_divs:
            return [head]
        return [head, f"kl_divs={[round(k, 8) for k in self.kl_divs]}", f"avg_kl_div={self.value}"]


def measure_label(client: Client, label: str, prompts: list[list[int]], max_new_tokens: int,
                  turn_separator: Sequence[int] = (), temperature: float = 1.0) -> LabelResult:
    """One label of SGLang's KL tests; see kl_test_utils.py for the originals."""
    n = len(prompts)
    if label == "logprobs_match":
        client.flush_cache()
        res = client.generate(generate_payload(prompts, max_new_tokens, return_logprob=True, temperature=temperature))
        seqs = [p + r["output_ids"] for p, r in zip(prompts, res)]
        return LabelResult(label, _replay(client, seqs, [_output_logprobs(r) for r in res],
                                          temperature=temperature), n, 1)
    if label not in ("prefill_cache_hit", "decode_cache_hit"):
        raise ValueError(f"unknown label {label!r}; known: {', '.join(LABELS)}")
    if client.server_info().get("disable_radix_cache"):
        return LabelResult(label, [], n, 1, "skipped: the radix cache is disabled")
    client.flush_cache()
    if label == "prefill_cache_hit":
        client.generate(generate_payload(prompts, 0, return_logprob=False, temperature=temperature))  # seed the cache
        inputs, turns = prompts, 1
        res = client.generate(generate_payload(inputs, max_new_tokens, return_logprob=True, temperature=temperature))
        hit = [r["meta_info"].get("cached_tokens", 0) > 0 for r in res]
    else:
        # The second turn extends the first turn's prompt + output, so its
        # prefix is KV the decode steps wrote.
        # the test asks this turn for logprobs and never reads them; asking changes no KV the second turn
        # reads, and the runs stored before keep their key
        first = client.generate(generate_payload(prompts, max_new_tokens, return_logprob=False, temperature=temperature))
        inputs = [p + r["output_ids"] + list(turn_separator) for p, r in zip(prompts, first)]
        turns = 2
        res = client.generate(generate_payload(inputs, max_new_tokens, return_logprob=True, temperature=temperature))
        hit = [r["meta_info"].get("cached_tokens", 0) > len(p) + 1 for p, r in zip(prompts, res)]
    keep = [i for i in range(n) if hit[i]]
    note = f"cache hits {len(keep)}/{n}"
    if len(keep) <= MIN_HIT_FRACTION * n:
        return LabelResult(label, [], n, turns, note + ": too few, no value")
    seqs = [inputs[i] + res[i]["output_ids"] for i in keep]
    return LabelResult(label, _replay(client, seqs, [_output_logprobs(res[i]) for i in keep], temperature=temperature),
                       n, turns, note)


# ---------------------------------------------------------------------------
# The multi-turn flow of the unified-radix-tree KL tests
# (python/sglang/test/kl_multiturn_utils.py, driven by
# python/sglang/test/kits/unified_radix_cache_kit.py)
# ---------------------------------------------------------------------------

KL_FLOWS = ("single", "multiturn")
# the kit's shape: three turns, three groups of three branches over a 512-token
# prefix, random suffix tokens from Python's random.Random(seed), so the same
# ids as the test's for the same seeds
MT_SAMPLES = 4                       # logprobs_match: input_ids[:4]
MT_GROUPS = 3
MT_BRANCHES = 3
MT_PREFIX_LEN = 512
MT_TURN_SUFFIX_LENS = (512, 256)     # turns 2 and 3
MT_BRANCH_SUFFIX = (256, 64)         # prefill_cache_hit: branch b's own suffix is 256 + 64 b tokens
MT_TOKEN_IDS = (1, 30000)            # random.randint's bounds, both included
MT_SEEDS = {"logprobs_match": (100, 200), "prefill_cache_hit": (789, 890), "decode_cache_hit": (300, 400)}
MT_BRANCH_SEED = 456


def random_suffixes(n: int, length: int, seed: int) -> list[list[int]]:
    """The kit's ``_random_suffixes``: ``n`` lists of ``length`` token ids."""
    rng = random.Random(seed)
    return [[rng.randint(*MT_TOKEN_IDS) for _ in range(length)] for _ in range(n)]


def interleave_order(n: int, per_group: int) -> list[int] | None:
    """Submission order that puts branch b of every group before branch b + 1
    of any (``_interleave_order``): competing branches stress the radix tree."""
    if per_group <= 0 or per_group >= n:
        return None
    groups = n // per_group
    order = [g * per_group + b for b in range(per_group) for g in range(groups)]
    return order + list(range(groups * per_group, n))


@dataclass
class MultiturnPlan:
    """What one label of the multi-turn flow sends: pure data, so the kit's
    construction is checked without a server."""

    first: list[list[int]]                  # turn 1's inputs
    suffixes: list[list[list[int]]]         # suffixes[t][i]: appended before turn t + 2
    seed_prefixes: list[list[int]] | None   # generated with 0 new tokens first (prefill_cache_hit)
    order: list[int] | None                 # submission order of turns 2 and 3


def multiturn_plan(label: str, prompts: list[list[int]], prefix_len: int = MT_PREFIX_LEN) -> MultiturnPlan:
    if label not in MT_SEEDS:
        raise ValueError(f"unknown label {label!r}; known: {', '.join(LABELS)}")
    seeds = MT_SEEDS[label]
    if label == "logprobs_match":
        first = [list(p) for p in prompts[:MT_SAMPLES]]
        return MultiturnPlan(first, [random_suffixes(len(first), n, s)
                                     for n, s in zip(MT_TURN_SUFFIX_LENS, seeds)], None, None)
    n = MT_GROUPS * MT_BRANCHES
    suffixes = [random_suffixes(n, length, s) for length, s in zip(MT_TURN_SUFFIX_LENS, seeds)]
    prefixes = [list(prompts[g][:prefix_len]) for g in range(MT_GROUPS) for _ in range(MT_BRANCHES)]
    if label == "decode_cache_hit":
        return MultiturnPlan(prefixes, suffixes, None, interleave_order(n, MT_BRANCHES))
    rng = random.Random(MT_BRANCH_SEED)
    base, step = MT_BRANCH_SUFFIX
    full = [prefixes[i] + [rng.randint(*MT_TOKEN_IDS) for _ in range(base + (i % MT_BRANCHES) * step)]
            for i in range(n)]
    return MultiturnPlan(full, suffixes, prefixes, interleave_order(n, MT_BRANCHES))


def _generate_in_order(client: Client, inputs: list[list[int]], max_new_tokens: int,
                       order: list[int] | None, temperature: float) -> list[dict]:
    """One batched request in ``order`` (None: as given); results back in the inputs' order."""
    order = order or list(range(len(inputs)))
    results = client.generate(generate_payload([inputs[i] for i in order], max_new_tokens, return_logprob=True,
                                               temperature=temperature))
    out: list = [None] * len(results)
    for k, i in enumerate(order):
        out[i] = results[k]
    return out


def measure_multiturn(client: Client, label: str, prompts: list[list[int]], max_new_tokens: int,
                      temperature: float = 1.0, prefix_len: int = MT_PREFIX_LEN) -> LabelResult:
    """One label of the unified-radix-tree tests: turn 1 (after seeding the
    prefixes, for prefill_cache_hit), two more turns each extending the last
    turn's input + output by a random suffix, then a replay of the last
    turn one sequence a request.

    The tests' exact ``cached_tokens`` assertions depend on the cache kind
    (a page, a mamba chunk); the label's line counts instead the requests
    whose cached prefix reached past the previous turn's input, into the KV
    its decode steps wrote (a hit on the shared prefix alone is not one)."""
    plan = multiturn_plan(label, prompts, prefix_len)
    n, turns = len(plan.first), 1 + len(plan.suffixes)
    if label != "logprobs_match" and client.server_info().get("disable_radix_cache"):
        return LabelResult(label, [], n, turns, "skipped: the radix cache is disabled")
    client.flush_cache()
    note = ""
    if plan.seed_prefixes is not None:
        client.generate(generate_payload(plan.seed_prefixes, 0, return_logprob=False, temperature=temperature))
    current = plan.first
    results = _generate_in_order(client, current, max_new_tokens, None, temperature)    # turn 1 as given
    if plan.seed_prefixes is not None:
        hit = sum(r["meta_info"].get("cached_tokens", 0) > 0 for r in results)
        note = f"prefix hits {hit}/{n}, "
    hits = 0
    for suffixes in plan.suffixes:
        before = [len(c) for c in current]
        current = [current[i] + results[i]["output_ids"] + suffixes[i] for i in range(n)]
        results = _generate_in_order(client, current, max_new_tokens, plan.order, temperature)
        hits += sum(r["meta_info"].get("cached_tokens", 0) > b for r, b in zip(results, before))
    seqs = [current[i] + results[i]["output_ids"] for i in range(n)]
    kl_divs = _replay(client, seqs, [_output_logprobs(r) for r in results], batch_size=1, temperature=temperature)
    return LabelResult(label, kl_divs, n, turns, f"{note}decode hits {hits}/{n * len(plan.suffixes)}")


# ---------------------------------------------------------------------------
# Server process
# ---------------------------------------------------------------------------

# PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, and
# the executor runs every measurement in a fresh thread. Forking servers from
# one long-lived thread makes "parent died" mean "klbisect died", so a server
# can outlive the run that launched it and be reused.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="klbisect-sglang-spawn")
_LIVE: "set[SGLangServer]" = set()
_LIVE_LOCK = threading.Lock()


def _stop_all() -> None:
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for s in servers:
        try:
            s.stop()
        except KeyboardInterrupt:   # at exit there is no one to tell: the tree got its SIGKILL
            continue


atexit.register(_stop_all)


class ServerStartError(Exception):
    def __init__(self, message: str, exit_code: int | None):
        super().__init__(message)
        self.exit_code = exit_code


def server_argv(python: str, model_path: str, port: int, server_args: Sequence[str]) -> list[str]:
    return [python, "-m", "sglang.launch_server", "--model-path", model_path,
            "--host", HOST, "--port", str(port), *server_args]


def server_env(checkout: Path, slot_env: Mapping[str, str],
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The slot's environment with ``<checkout>/python`` first on PYTHONPATH,
    so the commit under test is imported even when an editable install of
    another worktree is on sys.path."""
    env = child_environ(base)
    env.update(slot_env)
    src = str(Path(checkout).resolve() / "python")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is not "taken"
        try:
            s.bind((HOST, port))
            return True
        except OSError:
            return False


def pick_port(port_base: int) -> int:
    """The first free port of the slot's range, or any free port the system
    gives: the range keeps parallel slots apart, and another program holding
    all of it (a shared box) is no reason to fail the run (a tester's runs
    failed as "check --model-path" while the log said the ports were taken)."""
    if port_base:
        for port in range(port_base, port_base + PORTS_PER_SLOT):
            if _port_free(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class SGLangServer:
    """One launched server and its whole process tree.

    As a context manager it is started on entry and killed on every exit
    path; ``stop`` is idempotent and also runs at interpreter exit.
    """

    def __init__(self, argv: list[str], cwd: Path, env: Mapping[str, str], port: int, log_path: Path,
                 launch_timeout: float = DEFAULT_LAUNCH_TIMEOUT, pid_dir: Path | None = None):
        self.argv, self.cwd, self.env, self.port = argv, Path(cwd), dict(env), port
        self.log_path, self.launch_timeout, self.pid_dir = Path(log_path), launch_timeout, pid_dir
        self.proc: subprocess.Popen | None = None
        self._mark = ""
        self._pid_file: Path | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._counted = False     # in proc's runs in flight, whose last to end sweeps unmarked orphans
        self._noted: set[int] = set()
        self.launch_seconds = 0.0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __enter__(self) -> "SGLangServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, deadline: float | None = None) -> None:
        """Launch and wait for ``/health_generate``; raises ServerStartError
        (after killing the tree) when the server exits or is never ready."""
        t0 = time.monotonic()
        # before the server starts: a kill -9 of klbisect from then on leaves its watchdog to reap it
        proc.watch(self.pid_dir)
        # a slot past its checkout when Ctrl-C came would load a model on its GPUs for minutes
        proc.refuse_if_stopping()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with proc.private_log(self.log_path, "ab") as log:
                log.write(("$ " + redact(shlex.join(self.argv), flag_secrets(self.argv)) + "\n").encode())
                log.flush()
                # its own marker: a worker that left the tree (setsid, its parent gone) still carries it;
                # one that also cleared its environment is an unmarked orphan, swept when it stops
                self._mark = uuid.uuid4().hex
                with proc._unkillable_cleanup():    # counted once, and known to be (a Ctrl-C waits)
                    proc.begin_running()
                    self._counted = True
                fut = _SPAWNER.submit(
                    subprocess.Popen, self.argv, cwd=str(self.cwd), env={**self.env, proc.MARK: self._mark},
                    stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, preexec_fn=proc._child_setup)
                try:
                    self.proc = fut.result()
                except BaseException:
                    # interrupted while the spawner forks: kill what it forks
                    fut.add_done_callback(lambda f: f.exception() is None and kill_tree(f.result().pid))
                    raise
            with _LIVE_LOCK:
                _LIVE.add(self)
            proc._ACTIVE.add(self.proc.pid)   # killed by the executor's Ctrl-C path too
            proc.refuse_if_stopping()          # halted while it forked: kill_all_active may have missed it
            if self.pid_dir is not None:
                self._pid_file = proc.write_pid_file(self.pid_dir, self.proc.pid)
            limit = t0 + self.launch_timeout
            self._wait_ready(limit if deadline is None else min(limit, deadline))
        except BaseException:
            self.stop()
            raise
        self.launch_seconds = time.monotonic() - t0

    def _wait_ready(self, deadline: float) -> None:
        session = requests.Session()
        session.trust_env = False
        started, delay = time.monotonic(), 0.1
        while True:
            proc.refuse_if_stopping()
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(f"server exited with code {code} before it was ready", code)
            try:
                r = session.get(self.url + "/health_generate", timeout=5)
                # Another process on our port would answer too: the listener
                # must belong to the tree we launched.
                if r.status_code == 200 and self._owns_port():
                    self.note_descendants()
                    return
            except requests.RequestException:
                pass
            if time.monotonic() >= deadline:
                raise ServerStartError(f"server not ready after {time.monotonic() - started:.0f} s "
                                       f"(GET /health_generate on port {self.port})", None)
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 1.0)

    def _owns_port(self) -> bool:
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return False
        for p in procs:
            try:
                # net_connections is psutil >= 6; connections before
                list_conns = getattr(p, "net_connections", None) or p.connections
                conns = list_conns(kind="inet")
            except psutil.AccessDenied:
                return True   # cannot tell; the exit check above still applies
            except psutil.NoSuchProcess:
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port for c in conns):
                return True
        return False

    def note_descendants(self) -> None:
        """Its tree in its pid file, for the watchdog or the next command
        after a kill -9: a worker that cleared its environment and left the
        tree is found by nothing else."""
        if self._pid_file is not None and self.proc is not None:
            proc.note_descendants(self._pid_file, self.proc.pid, self._noted)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self, timeout: float = 10.0) -> bool:
        if not self.alive():
            return False
        self.note_descendants()    # asked before each reuse: what it started since is noted too
        try:
            s = requests.Session()
            s.trust_env = False
            return s.get(self.url + "/health_generate", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc else None

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            proc.end_running()

    def stop(self) -> None:
        # a Ctrl-C during the grace turns it into SIGKILL now, and is raised once the tree is gone
        with self._lock, proc._unkillable_cleanup():
            if self.proc is None or self._stopped:
                self._uncount()     # a spawn that failed was counted all the same
                return
            self._stopped = True
            kill_tree(self.proc.pid, grace=5.0)
            # adopted by klbisect (the subreaper), out of the server's tree: a GPU worker would
            # hold its memory until the next klbisect command reaped it
            if self._mark:
                proc.kill_marked(self._mark)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            proc._ACTIVE.discard(self.proc.pid)
            self._uncount()
            if self._pid_file is not None:
                self._pid_file.unlink(missing_ok=True)
                self._pid_file = None
            with _LIVE_LOCK:
                _LIVE.discard(self)


# ---------------------------------------------------------------------------
# Probe
# ---------------------------------------------------------------------------


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return str(path)


def _head(checkout: Path) -> str | None:
    try:
        return head_sha(checkout)
    except Exception:  # not a git checkout: no reuse
        return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


# option -> (attribute, test, what it takes): the CLI's option types say the same
# before anything runs; these hold for probes built from a stored session or the API
_NUMBERS = (
    ("--max-new-tokens", "max_new_tokens", lambda v: _is_int(v) and v >= 1, "a whole number, at least 1"),
    ("--num-samples", "num_samples", lambda v: v is None or (_is_int(v) and v >= 1),
     "a whole number, at least 1"),
    ("--runs-per-launch", "runs_per_launch", lambda v: _is_int(v) and v >= 0,
     "a whole number, 0 or more (0: all runs of a commit)"),
    ("--launch-timeout", "launch_timeout", _positive, "seconds, above 0"),
    ("--request-timeout", "request_timeout", _positive, "seconds, above 0"),
    ("--timeout", "timeout", _positive, "seconds, above 0"),
    ("--kl-threshold", "kl_threshold", lambda v: v is None or _positive(v), "a KL value above 0"),
    ("--turn-separator", "turn_separator", lambda v: all(_is_int(t) and t >= 0 for t in v),
     "token ids (integers from 0)"),
    ("--temperature", "temperature",
     lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0,
     "a sampling temperature, 0 or more"),
    ("--prefix-len", "prefix_len", lambda v: _is_int(v) and v >= 1, "a whole number, at least 1"),
)


def number_problem(probe: "SGLangProbe") -> str | None:
    """The first numeric setting a run could not use, as one line; None when
    all are fine. A negative --max-new-tokens would otherwise launch a server
    per run and end on "printed no metric value"."""
    for option, attr, ok, wants in _NUMBERS:
        value = getattr(probe, attr)
        if not ok(value):
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else value
            return f"{option} {shown}: give {wants}"
    return None


@dataclass
class _Held:
    server: SGLangServer
    identity: tuple
    runs: int = 0


@dataclass
class SGLangProbe:
    """Launch ``sglang.launch_server`` from the checkout and measure the KL
    labels of SGLang's KL tests through its HTTP API."""

    model_path: str
    prompts: Path
    server_args: str = ""
    labels: tuple[str, ...] = LABELS
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    num_samples: int | None = None           # first N prompts; None: all
    launch_timeout: float = DEFAULT_LAUNCH_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    timeout: float = DEFAULT_TIMEOUT          # one run's requests, once its server is ready
    runs_per_launch: int = 0                  # 0: every run of the commit in this slot; 1: relaunch per run
    python: str = sys.executable
    turn_separator: tuple[int, ...] = ()     # token ids between turns (the tests add a comma)
    kl_threshold: float | None = None        # exit code 1 at or above it, like the tests' assertion
    server_env: tuple[str, ...] = ()          # "NAME=VALUE" for the server (the tests' popen env=)
    kl_flow: str = "single"                   # "multiturn": the unified-radix-tree tests' flow
    temperature: float = 1.0                  # of every request, the replay's too (the tests' sampling_temperature)
    prefix_len: int = MT_PREFIX_LEN           # multiturn: the branching labels' shared prefix (the kit's prefix_len)
    # a console line when a server launches (minutes on a GPU box; the run log has the rest): workspace.say_building
    on_launch: Callable[[str], None] | None = field(default=None, init=False, repr=False, compare=False)
    _held: dict[int, _Held] = field(default_factory=dict, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)
    _prompts_cache: list[list[int]] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.prompts = Path(self.prompts)
        self.labels = tuple(self.labels)
        unknown = [lb for lb in self.labels if lb not in LABELS]
        if unknown or not self.labels:
            raise KlbisectError(f"unknown SGLang label(s) {', '.join(unknown) or '(none given)'}; "
                                f"known: {', '.join(LABELS)}", EXIT_USAGE)
        try:
            args = shlex.split(self.server_args)
        except ValueError as e:
            raise KlbisectError(f"--server-args: {e}", EXIT_USAGE) from None
        owned = sorted({a.split("=")[0] for a in args} & {"--model-path", "--host", "--port"})
        if owned:
            raise KlbisectError(f"--server-args may not set {', '.join(owned)}: the probe sets them "
                                "(use --model-path; ports come from the slot)", EXIT_USAGE)
        problem = number_problem(self)
        if problem:
            raise KlbisectError(problem, EXIT_USAGE)
        self.temperature = float(self.temperature) + 0.0    # 0, 0.0 and -0.0: one key
        if self.kl_flow not in KL_FLOWS:
            raise KlbisectError(f"unknown --kl-flow {self.kl_flow!r}; use {' or '.join(KL_FLOWS)}", EXIT_USAGE)
        if self.kl_flow != "multiturn" and self.prefix_len != MT_PREFIX_LEN:
            raise KlbisectError("--prefix-len is for --kl-flow multiturn (its branching labels' shared prefix): "
                                "pass --kl-flow multiturn, or leave it out", EXIT_USAGE)
        if self.kl_flow == "multiturn" and self.turn_separator:
            raise KlbisectError("--turn-separator is for --kl-flow single (its decode_cache_hit's second turn); the "
                                "multi-turn flow puts the tests' random suffixes between turns: leave it out",
                                EXIT_USAGE)
        self.server_env = tuple(self.server_env)
        names: set[str] = set()
        for item in self.server_env:
            name, eq, _ = item.partition("=")
            if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                # only what reads as a name is shown: the rest may be a secret typed with ':' for '='
                shown = re.match(r"[A-Za-z0-9_]*", item).group(0)
                raise KlbisectError(f"--server-env {shown + '...' if shown != item else repr(item)}: give NAME=VALUE "
                                    "(an environment variable for the server, e.g. "
                                    "SGLANG_ENABLE_UNIFIED_RADIX_TREE=1)", EXIT_USAGE)
            if name in names:
                # the last would win, and two orders of the same pair would share one key
                raise KlbisectError(f"--server-env sets {name} twice: give it once", EXIT_USAGE)
            names.add(name)

    @classmethod
    def from_options(cls, options: Mapping, timeout: float = DEFAULT_TIMEOUT) -> "SGLangProbe":
        """From the CLI's ``sglang`` option dict (unknown keys are ignored, so
        builder options may share it)."""
        opts = dict(options)
        if not opts.get("model_path"):
            raise KlbisectError("--probe sglang needs --model-path", EXIT_USAGE)
        if not opts.get("prompts"):
            raise KlbisectError("--probe sglang needs --prompts FILE (a JSON list of token-id lists; "
                                "`klbisect make-prompts` writes one)", EXIT_USAGE)
        known = {k: v for k, v in opts.items() if k in cls.__dataclass_fields__ and not k.startswith("_")}
        if isinstance(known.get("labels"), str):
            known["labels"] = tuple(x.strip() for x in known["labels"].split(",") if x.strip())
        if "turn_separator" in known:
            known["turn_separator"] = tuple(known["turn_separator"])
        if "server_env" in known:
            known["server_env"] = tuple(known["server_env"] or ())
        known.setdefault("timeout", timeout)
        probe = cls(**known)
        probe.load()   # a bad prompts file is a usage error now, not a crash per run
        return probe

    @property
    def secrets(self) -> list[str]:
        """What --server-args gives secret-named flags, and --server-env secret-named
        variables: never written to a log."""
        return flag_secrets(shlex.split(self.server_args)) + env_secrets(self.server_env)

    def _server_arg(self, flag: str) -> str | None:
        """The last value --server-args gives ``flag``."""
        args = shlex.split(self.server_args)
        keys = [a.partition("=")[2] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
                for i, a in enumerate(args) if a.partition("=")[0] == flag]
        return keys[-1] if keys and keys[-1] else None

    @property
    def api_key(self) -> str | None:
        return self._server_arg("--api-key")

    @property
    def admin_api_key(self) -> str | None:
        return self._server_arg("--admin-api-key")

    @property
    def key(self) -> str:
        return config_key("sglang", model=self.model_path, args=shlex.split(self.server_args),
                          prompts=_file_digest(self.prompts), n=self.num_samples,
                          max_new_tokens=self.max_new_tokens, labels=list(self.labels),
                          sep=list(self.turn_separator), python=self.python,
                          # only when given: runs recorded before --server-env and --kl-flow keep their key
                          **({"env": sorted(self.server_env)} if self.server_env else {}),
                          **({"flow": self.kl_flow} if self.kl_flow != "single" else {}),
                          **({"temperature": self.temperature} if self.temperature != 1.0 else {}),
                          **({"prefix": self.prefix_len} if self.prefix_len != MT_PREFIX_LEN else {}))

    def describe(self) -> str:
        args = f" {self.server_args}" if self.server_args else ""
        if self.server_env:
            args += f" (environment {' '.join(self.server_env)})"
        n = f"{self.num_samples} of " if self.num_samples else ""
        flow = (f"; multi-turn flow, prefix {self.prefix_len}" if self.kl_flow == "multiturn" else "") + \
            (f"; temperature {self.temperature:g}" if self.temperature != 1.0 else "")
        return (f"sglang.launch_server --model-path {self.model_path}{args}; {n}{self.prompts.name} "
                f"x {self.max_new_tokens} new tokens; labels {','.join(self.labels)}{flow}")

    def load(self) -> list[list[int]]:
        if self._prompts_cache is None:
            prompts = load_prompts(self.prompts)
            if self.num_samples and self.num_samples > len(prompts):
                # taken as given, the header said "999 of prompts.json" and the runs were keyed
                # apart from the same runs without it (a tester's)
                raise KlbisectError(f"--num-samples {self.num_samples}: {self.prompts} holds "
                                    f"{fmt_count(len(prompts), 'prompt')}; give at most {len(prompts)}, or leave "
                                    "it out to use them all", EXIT_USAGE)
            prompts = prompts[: self.num_samples] if self.num_samples else prompts
            need = MT_SAMPLES if "logprobs_match" in self.labels else MT_GROUPS
            if self.kl_flow == "multiturn" and len(prompts) < need:
                raise KlbisectError(f"--kl-flow multiturn needs {need} prompts (logprobs_match takes the first "
                                    f"{MT_SAMPLES}, the branching labels one prompt for each of {MT_GROUPS} "
                                    f"groups); {self.prompts} gives {len(prompts)}"
                                    f"{' after --num-samples' if self.num_samples else ''}", EXIT_USAGE)
            self._prompts_cache = prompts
        return self._prompts_cache

    # -- server lifecycle ---------------------------------------------------

    def _identity(self, checkout: Path, slot: Slot) -> tuple | None:
        sha = _head(checkout)
        if sha is None:
            return None
        return (str(Path(checkout).resolve()), sha, self.python, self.model_path, self.server_args,
                tuple(sorted(slot.env.items())), self.server_env)

    @property
    def env_vars(self) -> dict[str, str]:
        """--server-env as a mapping (a slot's own CUDA_VISIBLE_DEVICES wins over it)."""
        return dict(item.split("=", 1) for item in self.server_env)

    def _server_for(self, checkout: Path, log_path: Path, slot: Slot, deadline: float | None,
                    say: Callable[[str], None]) -> _Held:
        identity = self._identity(checkout, slot)
        with self._lock:
            held = self._held.get(slot.index)
        if held is not None:
            if identity is not None and held.identity == identity and held.server.healthy():
                say(f"reusing server pid {held.server.pid} on port {held.server.port} "
                    f"(run {held.runs + 1} of this launch; log {held.server.log_path})")
                return held
            self._release(slot.index)
        port = pick_port(slot.port_base)
        server_log = log_path.with_name(log_path.stem + ".server.log")
        server = SGLangServer(server_argv(self.python, self.model_path, port, shlex.split(self.server_args)),
                              checkout, server_env(checkout, {**self.env_vars, **slot.env}), port, server_log,
                              self.launch_timeout, slot.pid_dir)
        say(f"launching: {redact(shlex.join(server.argv))}")
        say(f"server log: {server_log}")
        where = f"  {identity[1][:12]}: " if identity is not None else "  "
        if self.on_launch is not None:
            self.on_launch(f"{where}launching the server (up to --launch-timeout {self.launch_timeout:g} s; log: "
                           f"{server_log})")
        server.start(deadline)
        say(f"server ready on port {port} after {server.launch_seconds:.1f} s (pid {server.pid})")
        if self.on_launch is not None:
            self.on_launch(f"{where}server ready after {server.launch_seconds:.0f} s")
        held = _Held(server, identity if identity is not None else ("unkeyed", id(server)))
        with self._lock:
            self._held[slot.index] = held
        return held

    def _release(self, slot_index: int) -> None:
        with self._lock:
            held = self._held.pop(slot_index, None)
        if held is not None:
            held.server.stop()

    def release_checkout(self, slot_index: int, checkout: Path) -> None:
        """Stop the server ``slot_index`` holds, if it runs from ``checkout``:
        another slot is about to check out and build there (a pool of
        worktrees), under a server that would otherwise be reused later."""
        with self._lock:
            held = self._held.get(slot_index)
            mine = held is not None and held.identity[0] == str(Path(checkout).resolve())
            if mine:
                self._held.pop(slot_index)
        if mine:
            held.server.stop()

    def close(self) -> None:
        """Kill every server this probe holds (end of a session)."""
        with self._lock:
            indexes = list(self._held)
        for i in indexes:
            self._release(i)

    # -- one run --------------------------------------------------------------

    def run(self, checkout: Path, log_path: Path, slot: Slot) -> RunResult:
        start = time.monotonic()
        prompts = self.load()
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        values: dict[str, float] = {}
        status, exit_code = STATUS_CRASH, None
        ready, measured = start, 0.0
        with proc.private_log(log_path, "w") as log:
            def say(line: str) -> None:
                log.write(line + "\n")
                log.flush()

            say(f"klbisect sglang probe: {redact(self.describe(), self.secrets)}")
            say(f"checkout: {checkout}")
            held: _Held | None = None
            try:
                held = self._server_for(Path(checkout), log_path, slot, None, say)
                # --timeout bounds the measuring; the launch has --launch-timeout of its own (a cold
                # 4-GPU start loads weights and captures CUDA graphs for many minutes)
                ready = time.monotonic()
                deadline = ready + self.timeout
                client = Client(held.server.url, self.request_timeout, deadline, api_key=self.api_key,
                                admin_api_key=self.admin_api_key)
                for label in self.labels:
                    t0 = time.monotonic()
                    res = (measure_multiturn(client, label, prompts, self.max_new_tokens, self.temperature,
                                             self.prefix_len)
                           if self.kl_flow == "multiturn"
                           else measure_label(client, label, prompts, self.max_new_tokens, self.turn_separator,
                                              self.temperature))
                    for line in res.lines(self.max_new_tokens):
                        say(line)
                    say(f"({label} took {time.monotonic() - t0:.1f} s)")
                    if res.value is not None:
                        values[label] = res.value
                exit_code = 0
                if self.kl_threshold is not None:
                    over = [f"{k} avg_kl_div={v:.6g}" for k, v in values.items() if v >= self.kl_threshold]
                    # the test's assertion as its unittest prints it; a pass, which the test keeps quiet, said too
                    if over:
                        say(f"AssertionError: {', '.join(over)} >= kl_threshold {self.kl_threshold:g}")
                    elif values:
                        say(f"pass: every label under kl_threshold {self.kl_threshold:g}")
                    exit_code = 1 if over else 0
                status = STATUS_OK if values else STATUS_CRASH
            except ServerStartError as e:
                say(f"server failed to start: {e}")
                self._say_tail(say, log_path.with_name(log_path.stem + ".server.log"))
                status, exit_code = STATUS_NOSERVER, e.exit_code
            except requests.Timeout as e:
                say(f"timed out: {e}")
                status = STATUS_TIMEOUT
                # what --timeout counts, the requests (not the launch, nor the stop below): a longer
                # --timeout then runs it again (runs.cut_short), whatever its launch took
                measured = time.monotonic() - ready
                self._fail(slot, held, say)
            except (requests.RequestException, ProtocolError, KeyError, TypeError, IndexError, ValueError) as e:
                # A server that died or answered nonsense mid-run: no value for the rest.
                say(f"request failed: {type(e).__name__}: {e}")
                # a server that exited 0 mid-test did not finish it: a clean exit would make the labels
                # it never reached skipped on purpose (runs.cut_off), its partial max a measurement
                exit_code = self._fail(slot, held, say) or None
            except BaseException:
                # Ctrl-C or a bug in klbisect: nothing recorded, nothing left running.
                say("interrupted; killing the server")
                self._release(slot.index)
                raise
            finally:
                self._count_run(slot.index, held)
            if values and status not in (STATUS_OK, STATUS_TIMEOUT):
                # values printed before a server failure still count; a run stopped at
                # --timeout is a crash whatever it printed, as for --probe-cmd (a longer
                # --timeout runs it again)
                status = STATUS_OK
        return RunResult(values, exit_code, status,
                         measured if status == STATUS_TIMEOUT else time.monotonic() - start, str(log_path))

    def _count_run(self, slot_index: int, held: _Held | None) -> None:
        """A server that has served ``runs_per_launch`` runs goes."""
        with self._lock:
            current = held is not None and self._held.get(slot_index) is held
        if current:
            held.runs += 1
            if self.runs_per_launch and held.runs >= self.runs_per_launch:
                self._release(slot_index)

    def _fail(self, slot: Slot, held: _Held | None, say: Callable[[str], None]) -> int | None:
        """Drop the server after a failed run; its exit code if it had died."""
        code = held.server.returncode if held is not None else None
        self._release(slot.index)
        if held is not None:
            self._say_tail(say, held.server.log_path)
        return code

    def _say_tail(self, say: Callable[[str], None], server_log: Path) -> None:
        tail = log_tail(server_log, 30)
        if tail:
            say(f"--- last lines of {server_log} ---")
            for line in tail.splitlines():
                # prefixed, so a server line can never pass for a label or a value; SGLang
                # logs its ServerArgs, --api-key's value among them
                say(f"server| {redact(line, self.secrets)}")


# ---------------------------------------------------------------------------
# Builder
# ---------------------------------------------------------------------------

PYPROJECT = "python/pyproject.toml"   # where a commit pins its kernel wheels
KERNEL_PACKAGES = ("sgl-kernel", "sglang-kernel")
PINNED_PACKAGES = KERNEL_PACKAGES + ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")
# pinned beside them, and never installed by --build sglang (--no-deps): a range that moves them is warned of
UNFOLLOWED_PINS = ("torch", "torchaudio", "torchvision", "transformers")
PACKAGING_PATHS = (
    "python/pyproject.toml", "python/setup.py", "python/setup.cfg", "python/MANIFEST.in",
    "python/*Cargo.toml", "python/*Cargo.lock", "python/*.rs",
)
# the kernel wheel's sources (sgl-kernel/, moved to python/sglang/kernels/aot/ as sglang-kernel): the
# pinned prebuilt wheel runs, never these
KERNEL_SOURCE_DIRS = ("sgl-kernel/", "python/sglang/kernels/aot/")
# what `pip install -e python` builds besides Python: setup.py's Rust extensions (the radix tree's
# core among them) from ../rust, and their protobuf definitions
EXTENSION_SOURCE_DIRS = ("rust/", "proto/")
KERNEL_NOTE = "kernel source change not exercised by this probe"

_PIN = re.compile(r"""["']\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)""")


def normalize_name(name: str) -> str:
    """PEP 503: sgl_kernel, SGL.Kernel and sgl-kernel are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(pyproject_text: str, packages: Sequence[str] = PINNED_PACKAGES) -> dict[str, str]:
    """``name -> version`` for every ``name==version`` requirement of the given
    packages in ``python/pyproject.toml`` (first pin wins when extras repeat it)."""
    wanted = {normalize_name(p) for p in packages}
    pins: dict[str, str] = {}
    for m in _PIN.finditer(pyproject_text):
        name = normalize_name(m.group(1))
        if name in wanted and name not in pins:
            pins[name] = m.group(2)
    return pins


def pins_to_install(installed: Mapping[str, str | None], pins: Mapping[str, str]) -> dict[str, str]:
    """The pins whose installed version differs (or that are not installed)."""
    return {name: ver for name, ver in pins.items() if installed.get(name) != ver}


@dataclass
class ChangeKinds:
    packaging: list[str]
    kernel_sources: list[str]
    other: list[str]


def classify_changes(changed: Sequence[str]) -> ChangeKinds:
    """Split changed paths: packaging metadata and the Rust extensions'
    sources (need a reinstall, which builds them), kernel wheel sources
    (never exercised: the pinned wheel runs), everything else (pure Python,
    tests, docs)."""
    kinds = ChangeKinds([], [], [])
    for p in changed:
        if p.startswith(KERNEL_SOURCE_DIRS):
            kinds.kernel_sources.append(p)
        elif p.startswith(EXTENSION_SOURCE_DIRS) or (matches_any(p, PACKAGING_PATHS) and p.startswith("python/")):
            kinds.packaging.append(p)
        else:
            kinds.other.append(p)
    return kinds


def kernel_note(changed: Sequence[str], pins_changed: bool) -> str:
    """A note for a commit whose kernel source changes the probe cannot see.

    ``changed``: the commit's own diff against its parent. A kernel change
    reaches the probe only through a new pin of the prebuilt wheel."""
    kinds = classify_changes(changed)
    if not kinds.kernel_sources or pins_changed:
        return ""
    if kinds.packaging or kinds.other:
        return KERNEL_NOTE + " (its other changes are)"
    return KERNEL_NOTE


_VERSIONS_SCRIPT = (
    "import json, sys\n"
    "from importlib.metadata import version, PackageNotFoundError\n"
    "out = {}\n"
    "for n in sys.argv[1:]:\n"
    "    try:\n"
    "        out[n] = version(n)\n"
    "    except PackageNotFoundError:\n"
    "        out[n] = None\n"
    "print(json.dumps(out))\n"
)


def installed_versions(python: str, names: Sequence[str], timeout: float = 60.0) -> dict[str, str | None]:
    """Versions installed in ``python``'s environment (None: not installed).

    The environment is the record of what is installed: no state file to go
    stale when someone runs pip by hand."""
    if not names:
        return {}
    try:
        out = subprocess.run([python, "-c", _VERSIONS_SCRIPT, *names], capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL)
        return json.loads(out.stdout) if out.returncode == 0 else {n: None for n in names}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {n: None for n in names}


def build_commands(python: str, to_install: Mapping[str, str], pip_args: Sequence[str] = (),
                   editable: bool = True) -> list[list[str]]:
    """pip argv lists, run from the checkout's root: pinned wheels first (the
    server checks their versions at start-up), then the editable install."""
    pip = [python, "-m", "pip", "install", "--no-deps", *pip_args]
    cmds = [pip + [f"{name}=={ver}"] for name, ver in sorted(to_install.items())]
    if editable:
        cmds.append(pip + ["-e", "python"])
    return cmds


# ---------------------------------------------------------------------------
# The environment before a session, and putting it back
# ---------------------------------------------------------------------------

# Where pip says a distribution came from (PEP 610's direct_url.json; a legacy
# `setup.py develop` leaves only an .egg-info in the project instead).
_ORIGIN_SCRIPT = (
    "import json, sys\n"
    "from importlib.metadata import distribution, PackageNotFoundError\n"
    "try:\n"
    "    d = distribution(sys.argv[1])\n"
    "except PackageNotFoundError:\n"
    "    print('null'); sys.exit(0)\n"
    "try:\n"
    "    url = json.loads(d.read_text('direct_url.json') or 'null')\n"
    "except ValueError:\n"
    "    url = None\n"
    "path = getattr(d, '_path', None)\n"
    "print(json.dumps({'version': d.version, 'direct_url': url, 'path': str(path) if path else None}))\n"
)


@dataclass(frozen=True)
class InstallOrigin:
    """Where an interpreter's ``sglang`` came from: what `--build sglang`
    replaces with an editable install of a worktree that is deleted after
    the session, and what its end puts back."""

    version: str | None            # None: not installed
    editable: str | None = None    # project directory of an editable install
    url: str | None = None         # a pip requirement URL (local wheel, directory, archive, vcs)

    @classmethod
    def from_metadata(cls, raw: Mapping | None) -> "InstallOrigin":
        """From ``_ORIGIN_SCRIPT``'s output (None: not installed)."""
        if not raw or not raw.get("version"):
            return cls(None)
        direct = raw.get("direct_url") or {}
        url = direct.get("url") if isinstance(direct, Mapping) else None
        if url:
            if (direct.get("dir_info") or {}).get("editable"):
                return cls(raw["version"], editable=_file_path(url) or url)
            vcs = direct.get("vcs_info") or {}
            if vcs.get("vcs"):
                rev = vcs.get("commit_id") or vcs.get("requested_revision")
                url = f"{vcs['vcs']}+{url}" + (f"@{rev}" if rev else "")
            if direct.get("subdirectory"):
                url += f"#subdirectory={direct['subdirectory']}"
            return cls(raw["version"], url=url)
        path = Path(raw.get("path") or "")
        if path.suffix == ".egg-info" and path.parent.name not in ("site-packages", "dist-packages"):
            return cls(raw["version"], editable=str(path.parent))   # setup.py develop / egg-link
        return cls(raw["version"])

    def describe(self) -> str:
        if self.version is None:
            return "no sglang"
        if self.editable:
            gone = "" if Path(self.editable).is_dir() else ", which no longer exists"
            return f"sglang {self.version}, an editable install of {self.editable}{gone}"
        return f"sglang {self.version} from {self.url or 'a package index'}"


def _file_path(url: str) -> str | None:
    """The local path of a file:// URL; None for any other URL."""
    parts = urlparse(url)
    return unquote(parts.path) if parts.scheme == "file" else None


def read_origin(python: str, cwd: Path | None = None, timeout: float = 60.0) -> InstallOrigin | None:
    """Where ``python``'s sglang comes from; None when the interpreter cannot
    tell (then nothing is restored: guessing could break a working setup)."""
    try:
        out = subprocess.run([python, "-c", _ORIGIN_SCRIPT, "sglang"], capture_output=True, text=True,
                             timeout=timeout, stdin=subprocess.DEVNULL, cwd=cwd)
        return InstallOrigin.from_metadata(json.loads(out.stdout)) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def restore_command(origin: InstallOrigin, python: str, pip_args: Sequence[str] = ()) -> list[str] | None:
    """The pip argv that puts ``origin`` back; None when nothing can (an
    editable project directory that is gone). Non-editable installs are
    forced: the worktree's editable install may carry the same version."""
    pip = [python, "-m", "pip"]
    if origin.version is None:
        return pip + ["uninstall", "-y", "sglang"]
    install = pip + ["install", "--no-deps", *pip_args]
    if origin.editable:
        return install + ["-e", origin.editable] if Path(origin.editable).is_dir() else None
    local = _file_path(origin.url) if origin.url else None
    if origin.url and (local is None or Path(local).exists()):
        return install + ["--force-reinstall", f"sglang @ {origin.url}"]
    # from an index, or a local wheel since deleted: the same version from the index
    return install + ["--force-reinstall", f"sglang=={origin.version}"]


def pin_restore_commands(before: Mapping[str, str | None], now: Mapping[str, str | None], python: str,
                         pip_args: Sequence[str] = ()) -> list[list[str]]:
    """pip argvs that put back the pinned wheels a session changed (the server
    checks their versions at start-up, so a stale pin breaks it)."""
    cmds = []
    for name, ver in sorted(before.items()):
        if now.get(name) == ver:
            continue
        cmds.append([python, "-m", "pip", "uninstall", "-y", name] if ver is None
                    else [python, "-m", "pip", "install", "--no-deps", *pip_args, f"{name}=={ver}"])
    return cmds


PINS_FOUND = "pins_before.json"    # in a session's log folder: the pinned wheels' versions before its builds


def _pins_found(saved: Mapping) -> dict:
    """The pins a ``saved_origin()``'s builds wrote to disk before installing
    them (see ``_remember_pins``), when the file is that record's."""
    try:
        found = json.loads((Path(saved["log_dir"]) / PINS_FOUND).read_text())
        return dict(found["pins"]) if saved.get("token") and found.get("token") == saved["token"] else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


@dataclass
class _Before:
    """The environment as the first build of a session found it."""

    origin: InstallOrigin | None
    log_dir: Path
    pins: dict[str, str | None] = field(default_factory=dict)   # only those a build changed
    # names this record in PINS_FOUND: a file an earlier command left (its own restore done) or
    # another node wrote is not this record's (a reviewer's stale file uninstalled the user's wheels)
    token: str = field(default_factory=lambda: os.urandom(8).hex())


def build_fix_hint(build_key: str | None) -> str:
    """What a failed build asks the user to fix, in terms of the option in use."""
    if build_key and build_key.startswith("sglang-build:"):
        return ("see the build log for the failing pip command (--build sglang: --pip-args adds an "
                "index or --no-build-isolation, --sglang-python picks the interpreter)")
    return "fix --build-cmd"


_PYTEST_CHROME = re.compile(r"^(?:[.sxX]+\s*(?:\[\s*\d+%\])?|=+.*=+|.*\b\d+ (?:passed|skipped|warnings?)\b.*"
                            r"|platform .*|rootdir: .*|configfile: .*|plugins: .*|collected \d+ items?|\S+\.py [.sxX]+.*)$")


def _pytest_kept_quiet(log: str) -> bool:
    """Did pytest pass with nothing but its own lines: a test's prints
    kept to itself (no -s), not a test that printed a value in another
    form?"""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip() and not ln.startswith("$ ")]
    return (any(re.search(r"\b\d+ passed\b", ln) for ln in lines) and not any("failed" in ln for ln in lines)
            and all(_PYTEST_CHROME.match(ln) for ln in lines))


# a KL under another name: "avg_kl=", "kl_div:", "mean_kl =", "KL divergence: " (not kl_weight, klass)
_KL_NAMED = re.compile(r"(?<![a-z])(?:avg_|mean_)?kl(?:[ _]div(?:ergence)?)?\s*[=:]\s*[-+]?(?:\d|\.\d|nan|inf)",
                       re.IGNORECASE)


def no_value_hint(probe_key: str | None, metric_regex: str | None = None, log: str = "") -> str:
    """What to check when a commit printed no value: --metric-regex applies to
    --probe-cmd output only, the SGLang probe writes its own lines. ``log``:
    the run's last lines, where a KL line in another form is quoted."""
    if probe_key and probe_key.startswith("sglang:"):
        # 400 (a token id out of range, a prompt past the context), 413, 422: the request itself;
        # not 401 (the API key) or 404 (the server), which have their own advice in the log line
        refused = re.search(r"(/generate answered (?:400|413|422)\b.*)", log)
        if refused:
            # a prompts file made with another tokenizer was blamed on the server (a tester's)
            answer = redact(refused.group(1).strip())[:300]
            return (f"the server refused klbisect's requests ({answer}): one it refuses once it refuses every time; "
                    "check --prompts (token ids of this model's tokenizer, e.g. from "
                    "`klbisect make-prompts`, within its context length) and --max-new-tokens")
        return ("the SGLang probe measured nothing: its log says why, at server start or in a request, and "
                "the server's own log lies beside it; check --model-path, --server-args and --sglang-python")
    if _pytest_kept_quiet(log):
        return ("pytest passed and printed nothing: it keeps a passing test's output to itself; add -s (or "
                "--capture=no) to the pytest command, so every run shows its value, not only failing ones")
    if metric_regex:
        shown = shlex.quote(metric_regex)
        m = None
        with contextlib.suppress(re.error):
            m = re.search(metric_regex, log, REGEX_FLAGS)
        if m is not None:
            raw = m.groupdict().get("value") if "value" in m.re.groupindex else (m.group(1) if m.re.groups else m[0])
            return (f"--metric-regex {shown} matched {m[0][:80]!r}, but its value {raw!r} is not a number: "
                    "make the group match the number alone, e.g. (?P<value>[0-9.eE+-]+)")
        return (f"--metric-regex {shown} matched no line of its output: compare it with the log, "
                "and put the number in a group (named value where the regex has others, beside one named label)")
    bad_json = next((ln.strip() for ln in log.splitlines() if ln.startswith(JSON_PREFIX)), "")
    if bad_json:
        return (f"its log has {bad_json[:80]!r}, which is not read: a KLBISECT line is a JSON object with a "
                'number "value" and a "label", e.g. KLBISECT {"label": "kl", "value": 0.004}')
    # a KL printed under another name ("prefill avg_kl=0.0041", "kl_div: 0.004"): a tester's format
    near = next((ln.strip() for ln in log.splitlines() if "avg_kl_div" in ln), "") or next(
        (ln.strip() for ln in log.splitlines() if _KL_NAMED.search(ln)), "")
    if near:
        return (f"its log has {near[:80]!r}, which is not read: a value line starts with avg_kl_div=, after an "
                "optional [label] (print \"[label]\" on its own line or at the start of the value's), or set "
                "--metric-regex with a group named value (and one named label)")
    return "expected avg_kl_div=... lines, or set --metric-regex"


def _say_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


_PIP_TURNS: dict[str, threading.RLock] = {}
_PIP_TURNS_LOCK = threading.Lock()


def _pip_turn(python: str) -> threading.RLock:
    """One pip at a time into one Python: parallel slots share it, and two
    pips at once remove and write the same dist-info, ``.pth`` and
    ``__pycache__`` (a reviewer's: 3 of 40 concurrent builds failed, an
    endpoint's failure stopping the bisect with 154)."""
    with _PIP_TURNS_LOCK:
        # not realpath: a venv's python links to the base interpreter, and venvs are separate
        return _PIP_TURNS.setdefault(os.path.abspath(python), threading.RLock())


@dataclass
class SGLangBuilder:
    """Reinstall only what a commit's diff requires.

    ``pip install -e python --no-deps`` when packaging metadata changed since
    the checkout's last build, and the pinned kernel (``sgl-kernel`` /
    ``sglang-kernel``) and flashinfer wheels whenever ``python/pyproject.toml``
    pins a version other than the one installed in ``python``'s environment.
    One environment is shared by all slots: ``run`` keeps to one slot where
    the range's pins change (``buildenv.slots_for_pins``).

    That environment is the user's: the first build records where its
    sglang (and each pinned wheel it changes) came from, and ``close()``
    puts them back, since the worktree the last build installed from is
    deleted when the session ends.
    """

    python: str = sys.executable
    pip_args: tuple[str, ...] = ()          # e.g. ("--extra-index-url", URL) for CUDA kernel wheels
    install_pins: bool = True
    editable: bool = True
    timeout: float = DEFAULT_BUILD_TIMEOUT
    _before: _Before | None = field(default=None, init=False, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    @classmethod
    def from_options(cls, options: Mapping) -> "SGLangBuilder":
        opts = {k: v for k, v in dict(options).items() if k in cls.__dataclass_fields__ and not k.startswith("_")}
        if isinstance(opts.get("pip_args"), str):
            try:
                opts["pip_args"] = tuple(shlex.split(opts["pip_args"]))
            except ValueError as e:
                raise KlbisectError(f"--pip-args: {e}", EXIT_USAGE) from None
        elif "pip_args" in opts:
            opts["pip_args"] = tuple(opts["pip_args"])
        return cls(**opts)

    def __getstate__(self) -> dict:
        # plain data for Ray: a node records and restores its own environment
        return {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_before")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _before=None, _lock=threading.Lock())

    @property
    def key(self) -> str:
        return config_key("sglang-build", python=self.python, pip_args=list(self.pip_args),
                          pins=self.install_pins, editable=self.editable)

    def needs_build(self, changed: Sequence[str] | None) -> bool:
        if changed is None:
            return True
        return bool(classify_changes(changed).packaging)

    def build(self, checkout: Path, log_path: Path, slot: Slot) -> BuildResult:
        start = time.monotonic()
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.remember_origin(log_path.parent)
        pyproject = Path(checkout) / PYPROJECT
        try:
            pins = parse_pins(pyproject.read_text()) if self.install_pins else {}
        except OSError:
            pins = {}
        with _pip_turn(self.python):   # what is installed, read while no other slot's pip changes it
            proc.refuse_if_stopping()   # a slot that waited here through a Ctrl-C
            installed = installed_versions(self.python, list(pins)) if pins else {}
            todo = pins_to_install(installed, pins)
            self._remember_pins({n: installed.get(n) for n in todo})
            with proc.private_log(log_path) as log:
                log.write(f"pins in python/pyproject.toml: {pins or 'none'}\n".encode())
                failed = self._run(build_commands(self.python, todo, self.pip_args, self.editable),
                                   Path(checkout), log, log_path, slot.env, slot.pid_dir)
        note_parts = [f"installed {n}=={v}" for n, v in sorted(todo.items())]
        if failed:
            return BuildResult(False, time.monotonic() - start, str(log_path), failed)
        return BuildResult(True, time.monotonic() - start, str(log_path), "; ".join(note_parts))

    def _run(self, argvs: list[list[str]], cwd: Path, log, log_path: Path, env: Mapping[str, str] | None = None,
             pid_dir: Path | None = None) -> str | None:
        """Run pip commands in order into ``log``; the first failure as
        "<pip args> exited N", or None when all succeeded."""
        with _pip_turn(self.python):
            return self._run_all(argvs, cwd, log, log_path, env, pid_dir)

    def _run_all(self, argvs: list[list[str]], cwd: Path, log, log_path: Path, env: Mapping[str, str] | None,
                 pid_dir: Path | None) -> str | None:
        for argv in argvs:
            part = log_path.with_name(log_path.name + ".part")
            res = run_logged(argv, cwd=cwd, log_path=part, timeout=self.timeout, env=env, pid_dir=pid_dir,
                             header="$ " + redact(shlex.join(argv)))
            log.write(part.read_bytes())
            log.flush()
            part.unlink(missing_ok=True)
            if res.exit_code != 0:
                return f"{redact(shlex.join(argv[3:]))} {'timed out' if res.timed_out else f'exited {res.exit_code}'}"
        return None

    # -- the user's environment -------------------------------------------------

    def remember_origin(self, log_dir: Path) -> None:
        """Before the session's first pip command (parallel builds wait here)."""
        with self._lock:
            if self._before is None:
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                self._before = _Before(read_origin(self.python, cwd=log_dir), Path(log_dir))

    def _remember_pins(self, versions: Mapping[str, str | None]) -> None:
        with self._lock:
            if self._before is not None:
                for name, ver in versions.items():
                    self._before.pins.setdefault(name, ver)
                if versions:
                    # on disk before pip changes them: the store learns them only after the build,
                    # and a kill -9 mid-build lost them (a tester's kernel wheels stayed installed)
                    with contextlib.suppress(OSError):
                        f = self._before.log_dir / PINS_FOUND
                        f.with_suffix(".tmp").write_text(json.dumps({"token": self._before.token,
                                                                     "pins": self._before.pins}))
                        os.replace(f.with_suffix(".tmp"), f)

    def saved_origin(self) -> dict | None:
        """What ``close()`` would put back, as JSON-able data: `git bisect
        run` starts one `klbisect probe` process per commit, so the
        environment the first of them found is kept in the store until
        `klbisect reset`."""
        with self._lock:
            b = self._before
            if b is None:
                return None
            origin = asdict(b.origin) if b.origin is not None else None
            return {"origin": origin, "log_dir": str(b.log_dir), "pins": dict(b.pins), "token": b.token}

    def adopt_origin(self, saved: Mapping | None) -> None:
        """Take over an earlier process's ``saved_origin()``: what it found
        comes first (with the pins a build killed mid-way noted on disk), pins
        this process changes later are added."""
        if not saved:
            return
        with self._lock:
            origin = saved.get("origin")
            before = _Before(InstallOrigin(**origin) if origin is not None else None, Path(saved["log_dir"]),
                             {**_pins_found(saved), **(saved.get("pins") or {})})
            if saved.get("token"):
                before.token = saved["token"]
            if self._before is not None:
                for name, ver in self._before.pins.items():
                    before.pins.setdefault(name, ver)
            self._before = before

    def close(self, say: Callable[[str], None] | None = None) -> list[str]:
        """End of a session: put back the sglang (and the pinned wheels) that
        ``python`` had before this builder's first build, and say so in one
        line; when that fails, one line with what the environment now points
        at and the command that restores it. Idempotent; returns the lines."""
        with self._lock:
            before, self._before = self._before, None
        if before is None:
            return []
        try:
            lines, done = self._restore(before)
            if done:
                with contextlib.suppress(OSError):
                    (before.log_dir / PINS_FOUND).unlink(missing_ok=True)
        except BaseException:
            done = False
            raise
        finally:
            if not done:
                # still to put back: saved_origin() keeps answering, so the session's store
                # keeps it for the command that resumes (or `klbisect reset`)
                with self._lock:
                    if self._before is None:
                        self._before = before
        for line in lines:
            (say or _say_stderr)(line)
        return lines

    def _restore(self, before: _Before) -> tuple[list[str], bool]:
        """The lines to say, and whether the environment is back (or was
        never known, so there is nothing to put back)."""
        py = self.python
        now = read_origin(py, cwd=before.log_dir)
        if before.origin is None:
            # unknown before (the interpreter did not answer): guessing could break a working setup
            return ([f"klbisect: could not tell where the sglang of {py} came from before the build; it now "
                     f"has {now.describe()}: reinstall yours if that is not it"] if now and now.version else []), True
        cmds = pin_restore_commands(before.pins, installed_versions(py, list(before.pins)), py, self.pip_args)
        restored = [f"no {c[-1]}" if c[3] == "uninstall" else c[-1] for c in cmds]   # pins: name==ver
        lines = []
        if now != before.origin:
            sglang_cmd = restore_command(before.origin, py, self.pip_args)
            if sglang_cmd is not None:
                cmds.append(sglang_cmd)
                restored.insert(0, before.origin.describe())
            else:
                lines.append(f"klbisect: {py} had {before.origin.describe()} before the build and now has "
                             f"{now.describe() if now else 'an unknown sglang'}; reinstall yours: "
                             f"{py} -m pip install --no-deps -e <your sglang checkout>/python")
        if not cmds:
            return lines, True
        before.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = before.log_dir / f"restore-env-{time.strftime('%Y%m%d-%H%M%S')}.log"
        try:
            with proc.private_log(log_path) as log:
                failed = self._run(cmds, before.log_dir, log, log_path)
        except KeyboardInterrupt:
            # the pip commands stop at the Ctrl-C too; what was found is kept (close() keeps
            # ``before``), so the line says which command puts it back, not a pip recipe
            # what was to be put back, all of it (a tester's line named only sglang, "put back to no
            # sglang (it now has no sglang)", where a pinned wheel had changed)
            _say_stderr(f"klbisect: interrupted before {py} was put back to {'; '.join(restored)}: `klbisect "
                        "reset`, or the command that resumes this session when it ends, puts it back")
            raise
        except Exception as e:  # noqa: BLE001 - the session is ending: say what to do, never mask its error
            failed = f"{type(e).__name__}: {e}"
        if failed:
            return lines + [self._not_restored(before, cmds, log_path, failed)], False
        return lines + [f"klbisect: {py} is back to {'; '.join(restored)} (log: {log_path})"], True

    def _not_restored(self, before: _Before, cmds: list[list[str]], log_path: Path, why: str) -> str:
        now = read_origin(self.python, cwd=before.log_dir)
        return (f"klbisect: could not put {self.python} back to {before.origin.describe()} ({why}; "
                f"log: {log_path}); it now has {now.describe() if now else 'an unknown sglang'}; restore it with: "
                + " && ".join(shlex.join(c) for c in cmds))
