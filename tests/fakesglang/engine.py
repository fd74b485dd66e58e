"""A fake SGLang server for klbisect's tests: SGLang's HTTP shapes, a tiny model.

Copied into a generated repository as ``python/sglang/engine.py``. It speaks
``/health_generate``, ``/generate``, ``/flush_cache`` and ``/get_server_info``
with the request and response fields of SGLang's native API, and runs a
2-layer torch transformer with a real KV-cache decode path, a separate
prefill path (whose numerics ``sglang.numerics`` sets) and a token-level
prefix cache that reports ``cached_tokens``.

The HTTP server listens before torch is imported, answering 503 on
``/health_generate`` until the model is ready, so that a launch costs about
as much as importing torch.

Test hooks, read from the environment:
  FAKE_SGLANG_PIDFILE     append "pid" lines for the server and its helper
  FAKE_SGLANG_NEVER_READY stay at 503 forever (launch timeout)
  FAKE_SGLANG_GENERATE_DELAY  seconds to sleep in every /generate
  FAKE_SGLANG_READY_AFTER seconds from start before /health_generate answers 200 (0.5)
  FAKE_SGLANG_DAEMON      start a worker that leaves the tree (setsid, its parent
                          gone), its command line holding this value
  FAKE_SGLANG_DAEMON_NOENV  that worker also clears its environment (klbisect's
                          marker with it)
  FAKE_SGLANG_EXIT_AFTER_FLUSHES  exit 0 on this many /flush_cache calls (a server
                          that quits cleanly mid-test)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

# Fields of SGLang's GenerateReqInput (python/sglang/srt/managers/io_struct.py)
# that this fake accepts; anything else is rejected so that a typo in a probe's
# payload fails loudly here instead of being ignored.
GENERATE_FIELDS = {
    "text", "input_ids", "sampling_params", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs", "stream",
    "rid", "log_metrics", "lora_path", "session_params", "custom_logit_processor",
    "return_hidden_states", "priority", "extra_key", "bootstrap_host", "bootstrap_port",
    "bootstrap_room", "data_parallel_rank", "input_embeds", "image_data",
}
SAMPLING_FIELDS = {
    "temperature", "max_new_tokens", "ignore_eos", "top_p", "top_k", "min_p",
    "stop", "stop_token_ids", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "min_new_tokens", "n", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "json_schema", "regex", "ebnf",
    "custom_params", "sampling_seed",
}

VOCAB = 512
# Input ids a real tokenizer's range allows (the multi-turn tests' random
# suffixes draw 1..30000); the tiny model reads id % VOCAB and samples below VOCAB.
INPUT_IDS = 32000
EOS_ID = 0
D_MODEL = 64
N_HEADS = 4
N_LAYERS = 2
LOGIT_SCALE = 2.0


class TinyLM:
    """Two pre-norm attention+MLP blocks; weights from a seed, never trained."""

    def __init__(self, seed: int):
        import torch

        self.torch = torch
        g = torch.Generator().manual_seed(seed)

        def w(*shape, scale=1.0):
            return torch.randn(*shape, generator=g) * scale / math.sqrt(shape[0])

        self.emb = torch.randn(VOCAB, D_MODEL, generator=g)
        self.layers = [
            dict(qkv=w(D_MODEL, 3 * D_MODEL), o=w(D_MODEL, D_MODEL),
                 up=w(D_MODEL, 4 * D_MODEL), down=w(4 * D_MODEL, D_MODEL))
            for _ in range(N_LAYERS)
        ]
        self.unemb = w(D_MODEL, VOCAB, scale=LOGIT_SCALE)
        self.err = w(D_MODEL, VOCAB)
        self.hd = D_MODEL // N_HEADS
        inv = 1.0 / (10000 ** (torch.arange(0, D_MODEL, 2).float() / D_MODEL))
        self.inv_freq = inv

    def _pos(self, start: int, n: int):
        torch = self.torch
        t = torch.arange(start, start + n).float()[:, None] * self.inv_freq[None, :]
        return torch.cat([t.sin(), t.cos()], dim=-1)

    def forward(self, ids: list[int], past: list, prefill: bool):
        """Logits for every position of ``ids`` after ``past`` (per layer (K, V),
        [heads, P, hd]) and the new K/V per layer. ``prefill`` selects the
        prefill kernels' numerics."""
        import sglang.numerics as num

        torch = self.torch
        n = len(ids)
        start = past[0][0].shape[1] if past else 0
        x = self.emb[torch.tensor(ids) % VOCAB] + self._pos(start, n)
        new_kv = []
        for li, L in enumerate(self.layers):
            h = _norm(x)
            qkv = _mm(h, L["qkv"], prefill)
            q, k, v = (t.reshape(n, N_HEADS, self.hd).transpose(0, 1) for t in qkv.split(D_MODEL, -1))
            new_kv.append((k, v))
            if past:
                k = torch.cat([past[li][0], k], dim=1)
                v = torch.cat([past[li][1], v], dim=1)
            att = (q @ k.transpose(1, 2)) / math.sqrt(self.hd)
            total = start + n
            mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=start)
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(0, 1).reshape(n, D_MODEL)
            x = x + _mm(y, L["o"], prefill)
            x = x + _mm(torch.nn.functional.gelu(_mm(_norm(x), L["up"], prefill)), L["down"], prefill)
        h = _norm(x)
        logits = _mm(h, self.unemb, prefill)
        if prefill and num.PREFILL_ACCUM_ERROR:
            # A deterministic function of the hidden state, like a kernel's
            # accumulation-order error: the same input gives the same logits.
            logits = logits + num.PREFILL_ACCUM_ERROR * (h @ self.err)
        return logits, new_kv


def _norm(x):
    return x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()


def _mm(a, b, prefill: bool):
    # The prefill GEMMs take bfloat16 inputs (or FP8 ones, when the hook is
    # on) and accumulate in float32; decode stays in float32.
    if prefill:
        import torch
        import sglang.numerics as num

        if num.PREFILL_FP8_GEMM:
            return _fp8(a) @ _fp8(b)
        return a.to(torch.bfloat16).float() @ b.to(torch.bfloat16).float()
    return a @ b


def _fp8(t):
    import torch

    scale = t.abs().amax().clamp(min=1e-12) / 448.0
    return (t / scale).to(torch.float8_e4m3fn).float() * scale


class PrefixCache:
    """Token-level trie of per-position K/V: a small stand-in for the radix cache."""

    MAX_NODES = 500_000

    def __init__(self):
        self.flush()

    def flush(self) -> None:
        self.root: dict = {}
        self.nodes = 0

    def match(self, ids: list[int], limit: int) -> list:
        """K/V entries for the longest cached prefix of ``ids[:limit]``."""
        out, node = [], self.root
        for t in ids[:limit]:
            nxt = node.get(t)
            if nxt is None:
                break
            out.append(nxt[0])
            node = nxt[1]
        return out

    def insert(self, ids: list[int], start: int, kvs: list) -> None:
        """Add ``kvs`` (entries of ``ids[start:]``) under the cached ``ids[:start]``."""
        if self.nodes + len(kvs) > self.MAX_NODES:
            self.flush()
        node = self.root
        for pos, t in enumerate(ids):
            nxt = node.get(t)
            if nxt is None:
                if pos < start:
                    return  # the prefix was evicted meanwhile
                nxt = node[t] = (kvs[pos - start], {})
                self.nodes += 1
            node = nxt[1]


class Engine:
    def __init__(self, model_path: str, seed: int | None, radix: bool):
        import torch

        torch.set_num_threads(1)
        self.torch = torch
        self.model = TinyLM(seed=sum(model_path.encode()) % 10_000)
        self.cache = PrefixCache()
        self.radix = radix
        self.gen = torch.Generator()
        self.gen.manual_seed(seed if seed is not None else int.from_bytes(os.urandom(4), "little"))

    def _stack(self, entries: list):
        """Per-position cache entries -> per-layer (K, V) of shape [heads, P, hd]."""
        torch = self.torch
        if not entries:
            return []
        return [(torch.stack([e[li][0] for e in entries], dim=1),
                 torch.stack([e[li][1] for e in entries], dim=1)) for li in range(N_LAYERS)]

    @staticmethod
    def _split(kv, start: int, end: int) -> list:
        return [[(k[:, i], v[:, i]) for (k, v) in kv] for i in range(start, end)]

    def generate_one(self, ids: list[int], sp: dict, return_logprob: bool, start_len: int) -> dict:
        torch = self.torch
        if not ids:
            raise ValueError("empty input")
        if any((not isinstance(t, int)) or t < 0 or t >= INPUT_IDS for t in ids):
            raise ValueError(f"token id out of range [0, {INPUT_IDS})")
        temperature = float(sp.get("temperature", 1.0))
        max_new = int(sp.get("max_new_tokens", 128))
        ignore_eos = bool(sp.get("ignore_eos", False))
        t0 = time.monotonic()
        limit = len(ids) - 1  # the last prompt token is always computed
        if return_logprob and start_len >= 0:
            # the logprob of position p comes from the logits of p - 1
            limit = min(limit, max(start_len - 1, 0))
        cached = self.cache.match(ids, limit) if self.radix else []
        n_cached = len(cached)
        past = self._stack(cached)
        with torch.no_grad():
            logits, new_kv = self.model.forward(ids[n_cached:], past, prefill=True)
        kv = [(torch.cat([p[0], n[0]], 1), torch.cat([p[1], n[1]], 1)) for p, n in zip(past, new_kv)] \
            if past else new_kv
        input_lp = None
        # SGLang serves temperature 0 as top_k 1 at temperature 1 (sampling_params.py): greedy
        # tokens, their logprobs those of the unscaled distribution; other temperatures scale
        # the input logprobs as they scale the sampled tokens' (the tests replay at the same one)
        scale = temperature if temperature > 1e-6 else 1.0
        if return_logprob and start_len >= 0:
            lps = torch.log_softmax(logits.double() / scale, -1)
            input_lp = []
            for pos in range(start_len, len(ids)):
                if pos == 0:
                    input_lp.append([None, ids[0], None])
                else:
                    input_lp.append([float(lps[pos - 1 - n_cached, ids[pos] % VOCAB]), ids[pos], None])
        out_ids: list[int] = []
        out_lp: list = []
        last = logits[-1]
        finish = {"type": "length", "length": max_new}
        for step in range(max_new):
            lp = torch.log_softmax(last.double() / scale, -1)
            if temperature <= 1e-6:
                tok = int(lp.argmax())
            else:
                tok = int(torch.multinomial(lp.exp(), 1, generator=self.gen))
            out_ids.append(tok)
            out_lp.append([float(lp[tok]), tok, None])
            if tok == EOS_ID and not ignore_eos:
                finish = {"type": "stop", "matched": EOS_ID}
                break
            if step + 1 == max_new:
                break
            with torch.no_grad():
                step_logits, step_kv = self.model.forward([tok], kv, prefill=False)
            kv = [(torch.cat([p[0], n[0]], 1), torch.cat([p[1], n[1]], 1)) for p, n in zip(kv, step_kv)]
            last = step_logits[-1]
        if self.radix:
            # K/V exist for every token but the last sampled one
            full = (ids + out_ids)[: kv[0][0].shape[1]]
            self.cache.insert(full, n_cached, self._split(kv, n_cached, len(full)))
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(out_ids),
            "cached_tokens": n_cached,
            "e2e_latency": time.monotonic() - t0,
        }
        if return_logprob:
            meta["input_token_logprobs"] = input_lp or []
            meta["output_token_logprobs"] = out_lp
        return {"text": "".join(f"<{t}>" for t in out_ids), "output_ids": out_ids, "meta_info": meta}


def _tokenize(text: str) -> list[int]:
    return [1 + b % (VOCAB - 1) for b in text.encode()]


class State:
    def __init__(self, args):
        self.args = args
        self.engine: Engine | None = None
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.in_flight = 0
        self.count_lock = threading.Lock()
        self.flushes = 0
        self.listen_fd = -1
        self.never_ready = bool(os.environ.get("FAKE_SGLANG_NEVER_READY"))
        self.delay = float(os.environ.get("FAKE_SGLANG_GENERATE_DELAY", "0") or 0)
        self.ready_after = float(os.environ.get("FAKE_SGLANG_READY_AFTER", "0.5") or 0.5)

    def ready(self) -> bool:
        return (self.engine is not None and not self.never_ready
                and time.monotonic() - self.started >= self.ready_after)


def _batch(body: dict) -> tuple[list[list[int]], bool]:
    if body.get("input_ids") is not None:
        ids = body["input_ids"]
        if ids and isinstance(ids[0], list):
            return ids, True
        return [ids], False
    text = body.get("text")
    if text is None:
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if isinstance(text, list):
        return [_tokenize(t) for t in text], True
    return [_tokenize(text)], False


def _per_item(value, i: int, batch: bool):
    return value[i] if batch and isinstance(value, list) else value


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # one line per request, like uvicorn
            sys.stderr.write("INFO:     %s - %s\n" % (self.address_string(), fmt % args))

        def _send(self, code: int, obj) -> None:
            data = (obj if isinstance(obj, str) else json.dumps(obj)).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(obj, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}") if n else {}

        def _refused(self, path: str) -> bool:
            # SGLang's API-key middleware (srt/utils/auth.py): everything but /health* and /metrics needs
            # the bearer token; /flush_cache, admin-optional, takes only the admin key when there is one
            key = state.args.api_key
            if path == "/flush_cache" and state.args.admin_api_key:
                key = state.args.admin_api_key
            if not key or path.startswith("/health") or path == "/metrics" \
                    or self.headers.get("Authorization") == f"Bearer {key}":
                return False
            self._send(401, {"error": "Unauthorized"})
            return True

        def do_GET(self):
            path = urlsplit(self.path).path
            if self._refused(path):
                return
            if path in ("/health", "/health_generate"):
                if path == "/health_generate" and not state.ready():
                    return self._send(503, "")
                return self._send(200, "")
            if path in ("/get_server_info", "/server_info"):
                import sglang

                return self._send(200, {
                    "model_path": state.args.model_path, "port": state.args.port,
                    "disable_radix_cache": state.args.disable_radix_cache,
                    "version": sglang.__version__,
                })
            if path == "/flush_cache":
                return self._flush()
            self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            path = urlsplit(self.path).path
            if self._refused(path):
                return
            if path == "/flush_cache":
                self._body()
                return self._flush()
            if path != "/generate":
                return self._send(404, {"detail": "Not Found"})
            try:
                body = self._body()
            except ValueError as e:
                return self._send(400, {"error": {"message": f"invalid JSON: {e}"}})
            if not state.ready():
                return self._send(503, {"error": {"message": "server not ready"}})
            with state.count_lock:
                state.in_flight += 1
            try:
                return self._generate(body)
            finally:
                with state.count_lock:
                    state.in_flight -= 1

        def _flush(self):
            quit_after = int(os.environ.get("FAKE_SGLANG_EXIT_AFTER_FLUSHES", "0") or 0)
            with state.count_lock:
                state.flushes += 1
                if quit_after and state.flushes >= quit_after:
                    print(f"[fake sglang] exiting 0 on flush {state.flushes}", flush=True)
                    # the client notices only once the exit is over: a process holding the
                    # sockets outlives it by a second
                    subprocess.Popen(["sleep", "1"], pass_fds=(self.connection.fileno(), state.listen_fd))
                    os._exit(0)
                busy = state.in_flight > 0
            if busy or state.engine is None:
                return self._send(400, "Cache not flushed: requests are running.\n")
            with state.lock:
                state.engine.cache.flush()
            return self._send(200, "Cache flushed.\n")

        def _generate(self, body: dict):
            unknown = set(body) - GENERATE_FIELDS
            if unknown:
                return self._send(400, {"error": {"message": f"unknown fields {sorted(unknown)}"}})
            try:
                batch, is_batch = _batch(body)
                out = []
                if state.delay:
                    time.sleep(state.delay)
                for i, ids in enumerate(batch):
                    sp = _per_item(body.get("sampling_params") or {}, i, is_batch)
                    bad = set(sp) - SAMPLING_FIELDS
                    if bad:
                        raise ValueError(f"unknown sampling params {sorted(bad)}")
                    rl = bool(_per_item(body.get("return_logprob") or False, i, is_batch))
                    sl = _per_item(body.get("logprob_start_len"), i, is_batch)
                    sl = -1 if sl is None else int(sl)
                    with state.lock:
                        out.append(state.engine.generate_one(list(ids), sp, rl, sl))
            except (ValueError, TypeError) as e:
                return self._send(400, {"error": {"message": str(e)}})
            self._send(200, out if is_batch else out[0])

    return Handler


def serve(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--api-key", default=None)
    p.add_argument("--admin-api-key", default=None)
    args, unknown = p.parse_known_args(argv)
    # SGLang logs its ServerArgs at start, the API key among them
    print(f"server_args=ServerArgs(model_path={args.model_path!r}, port={args.port}, api_key={args.api_key!r})",
          flush=True)
    if args.api_key:
        print(f"[fake sglang] requests need the bearer token {args.api_key}", flush=True)
    if unknown:
        print(f"[fake sglang] ignoring server args {unknown}", flush=True)
    state = State(args)
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    httpd.daemon_threads = True
    state.listen_fd = httpd.fileno()
    # A helper process like SGLang's scheduler/detokenizer, so that tests see
    # whether the whole tree is killed, not just the launcher.
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    tag = os.environ.get("FAKE_SGLANG_DAEMON")
    if tag:
        middle = os.fork()
        if middle == 0:
            os.setsid()
            if os.fork() == 0:
                argv = [sys.executable, "-c", "import time; time.sleep(300)", tag]
                if os.environ.get("FAKE_SGLANG_DAEMON_NOENV"):
                    os.execve(sys.executable, argv, {})
                os.execv(sys.executable, argv)
            os._exit(0)
        os.waitpid(middle, 0)
    pidfile = os.environ.get("FAKE_SGLANG_PIDFILE")
    if pidfile:
        with open(pidfile, "a") as f:
            f.write(f"{os.getpid()}\n{helper.pid}\n")
    print(f"[fake sglang] listening on {args.host}:{args.port}", flush=True)

    def load():
        state.engine = Engine(args.model_path, args.random_seed, not args.disable_radix_cache)
        print("[fake sglang] The server is fired up and ready to roll!", flush=True)

    threading.Thread(target=load, daemon=True).start()
    try:
        httpd.serve_forever()
    finally:
        helper.kill()
