"""Synthetic git histories with a planted KL regression.

Tests, benchmarks and acceptance trials need many repositories that look like
a real serving engine's history (squash subjects with PR numbers, reverts,
``--no-ff`` merges, broken builds, crashing commits) and whose ground truth is
known.  Spawning git once per commit would make a 1,000-commit history take
tens of seconds, so the whole history is rendered in memory and streamed into
a single ``git fast-import``; the result is bit-for-bit reproducible for a
given seed.

The regression lives in a data file (``python/kvserve/numerics.json``) that
the culprit commit edits; the committed ``probe.py`` reads it and prints KL
values in SGLang's format, drawn afresh on every run according to the noise
spec committed as ``.probe_noise.json``.
"""
from __future__ import annotations

import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

LABELS = ("logprobs_match", "prefill_cache_hit", "decode_cache_hit")
NUMERICS_PATH = "python/kvserve/numerics.json"
KERNELS_PATH = "python/kvserve/kernels.json"
NOISE_PATH = ".probe_noise.json"
BUILD_PATHS = ("pyproject.toml", "setup.py")
CRASH_KEY, CRASH_OK, CRASH_BAD = "decode_attention", "flashinfer", "triton_splitk"
WINDOW = 10  # broken/crashing commits land this close before the culprit


@dataclass
class NoiseModel:
    """How a commit's KL values are drawn per probe run."""

    kind: str = "uniform"   # "uniform" | "lognormal"
    good: tuple[float, float] = (0.003, 0.006)   # uniform bounds, or (median, sigma_log)
    bad: tuple[float, float] = (0.007, 0.013)
    outlier_rate: float = 0.0       # fraction of runs multiplied by U(3, 10)
    crash_rate: float = 0.0         # fraction of runs that crash before printing a value
    moving_label: str = "prefill_cache_hit"  # the one label (of three) that regresses
    threshold: float = 0.01          # probe exits 1 when any label >= threshold

    def __post_init__(self) -> None:
        if self.kind not in ("uniform", "lognormal"):
            raise ValueError(f"unknown noise kind {self.kind!r}")
        if self.moving_label not in LABELS:
            raise ValueError(f"moving_label must be one of {LABELS}")
        for name in ("outlier_rate", "crash_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        self.good = tuple(float(x) for x in self.good)
        self.bad = tuple(float(x) for x in self.bad)


@dataclass
class History:
    """A generated repository and its ground truth."""

    path: Path
    shas: list[str]          # first-parent chain, oldest first: shas[0] good, shas[-1] bad (main)
    culprit: str             # first bad sha (on the first-parent chain)
    culprit_index: int       # index into shas
    good: str
    bad: str
    build_broken: list[str]  # shas whose build fails
    crashing: list[str]      # shas whose probe always crashes (no value)
    merges: list[str]        # merge commits on the chain
    probe_cmd: str           # run from the repo root
    build_cmd: str
    subjects: dict[str, str]  # every commit, side-branch commits included
    prs: dict[str, int]       # chain commits that carry a PR number
    side_commits: list[str] = field(default_factory=list)  # commits of merged branches
    build_paths: list[str] = field(default_factory=lambda: list(BUILD_PATHS))
    noise: NoiseModel = field(default_factory=NoiseModel)
    seed: int = 0

    def index(self, sha: str) -> int:
        """Position of a (possibly abbreviated) chain sha."""
        for i, s in enumerate(self.shas):
            if s.startswith(sha):
                return i
        raise KeyError(sha)

    @property
    def expected_block(self) -> list[str]:
        """The commits a correct bisect must report, oldest first.

        Untestable commits directly before the culprit cannot be told apart
        from it, so they form one block with it.
        """
        untestable = set(self.build_broken) | set(self.crashing)
        i = self.culprit_index
        while i - 1 > 0 and self.shas[i - 1] in untestable:
            i -= 1
        return self.shas[i:self.culprit_index + 1]

    @property
    def expected_culprit(self) -> str | None:
        """The single culprit a correct bisect names, or None when it must report a block."""
        return self.culprit if len(self.expected_block) == 1 else None


# --------------------------------------------------------------------------
# vocabulary

_AUTHORS = [
    ("Ada Chen", "ada.chen@example.com", "+0800"),
    ("Bo Li", "bo.li@example.com", "+0800"),
    ("Carlos Mendez", "cmendez@example.org", "-0700"),
    ("Dana Whitfield", "dana.w@example.net", "-0400"),
    ("Emre Yilmaz", "emre.yilmaz@example.com", "+0300"),
    ("Fatima Rahman", "frahman@example.com", "+0000"),
    ("Gao Ming", "gaoming@example.cn", "+0800"),
    ("Hiro Tanaka", "htanaka@example.jp", "+0900"),
    ("Ingrid Olsen", "ingrid.olsen@example.no", "+0100"),
    ("Jun Park", "jpark@example.kr", "+0900"),
    ("Kavya Iyer", "kavya.iyer@example.in", "+0530"),
    ("Liam O'Brien", "liam.obrien@example.ie", "+0000"),
    ("Mei Wu", "mei.wu@example.com", "-0800"),
    ("Nikolai Petrov", "npetrov@example.org", "+0200"),
]
_GITHUB = ("GitHub", "noreply@github.com", "+0000")

_VERBS = ["get", "compute", "build", "update", "apply", "init", "handle", "flush", "evict",
          "merge", "split", "schedule", "alloc", "free", "load", "check", "prepare",
          "resolve", "pad", "normalize", "capture", "dispatch", "release", "prefetch"]
_NOUNS = ["prefix", "cache", "batch", "req", "tokens", "pages", "kv", "logits", "lora",
          "spec", "chunk", "graph", "stream", "node", "seq", "backend", "scales", "weights",
          "mask", "positions", "metadata", "buffer", "slots", "expert"]
_ARGS = ["req", "batch", "num_tokens", "page_size", "node", "dtype", "device", "max_len",
         "scale", "indices", "seq_lens", "forward_mode", "config", "out", "tp_rank"]
_CONSTS = ["DEFAULT_CHUNK_SIZE", "MAX_PREFILL_TOKENS", "EVICT_BATCH", "PAGE_SIZE",
           "CUDA_GRAPH_MAX_BS", "LOG_INTERVAL", "HEALTH_TIMEOUT_S", "WATERMARK_RATIO_PCT",
           "MAX_LORAS", "RETRACT_DECODE_STEPS", "SPEC_NUM_STEPS", "PREFETCH_THRESHOLD"]
_PROBLEMS = ["crash", "race condition", "off-by-one", "memory leak", "wrong dtype", "hang",
             "incorrect output", "NaN", "deadlock", "OOM", "shape mismatch", "stale state"]
_FEATURES = ["page_size > 1", "FP8 KV cache", "LoRA", "speculative decoding",
             "pipeline parallelism", "DP attention", "chunked prefill", "multimodal inputs",
             "HiCache", "torch.compile", "MTP", "two-batch overlap"]
_QUALS = ["", "", "", "", " for DP attention", " in overlap mode", " when page_size > 1",
          " with spec decoding", " on Blackwell", " for hybrid models",
          " under high concurrency", " with --enable-hierarchical-cache",
          " for Qwen3-Next", " for DeepSeek-V3", " on AMD"]
_RENAMES = ["kl_nightly", "server_args", "mem_cache", "layers.attention", "sgl_kernel",
            "srt.utils", "model_executor"]
_HW = ["H100", "H200", "B200", "MI300X", "L40S", "GB200"]
_MODEL_NAMES = ["llama4", "qwen3_next", "kimi_linear", "deepseek_v3", "glm4_moe", "gpt_oss",
                "mimo", "ernie4_5", "minimax_m2", "step3", "gemma3", "phi4", "mistral_large",
                "olmo2", "internlm3", "granite", "hunyuan", "bailing_moe"]
_SENT_SUBJ = ["The scheduler", "The radix cache", "Each request", "The attention backend",
              "HiCache", "The model runner", "Chunked prefill", "The server",
              "CUDA graph capture", "FP8 quantization", "The KL accuracy test"]
_SENT_VERB = ["keeps", "evicts", "reuses", "splits", "captures", "limits", "tracks",
              "prefetches", "quantizes", "validates", "reports"]
_SENT_OBJ = ["prefix pages", "the KV cache", "long prompts", "decode batches",
             "per-token scales", "request metadata", "cached tokens", "the logprobs"]
_SENT_TAIL = ["", " when memory is tight", " across turns", " for every batch",
              " by default", " unless --disable-radix-cache is set",
              " on Hopper and Blackwell GPUs"]

# (numerics key, good value, bad value, module the culprit also edits, PR title)
_CULPRITS = [
    ("prefill_quant", "bf16", "fp8", "attention.py",
     "Route prefill through FP8 Q/K/V quantization hook in backend resolution"),
    ("kv_cache_dtype", "auto", "fp8_e5m2", "model_runner.py",
     "Default to fp8_e5m2 KV cache when the attention backend supports it"),
    ("rope_cache_dtype", "float32", "bfloat16", "model_runner.py",
     "[Perf] Build the rope cos/sin cache in model dtype"),
    ("splitkv_softmax_accum", "fp32", "bf16", "attention.py",
     "[Perf] Accumulate split-KV softmax in bf16 for decode"),
    ("sampling_logits_dtype", "float32", "bfloat16", "sampling.py",
     "Skip the float32 upcast of logits before sampling"),
]

_PY_MODULES = {
    "radix_cache.py": ("Radix tree over token ids for prefix caching.",
                       ["radix cache", "HiCache", "prefix matching", "radix cache eviction",
                        "unified radix tree"]),
    "scheduler.py": ("Continuous-batching scheduler.",
                     ["scheduler", "overlap scheduler", "chunked prefill", "request queue",
                      "DP attention scheduling"]),
    "attention.py": ("Attention backend selection and thin kernel wrappers.",
                     ["attention backend resolution", "FA3 backend", "flashinfer backend",
                      "MLA decode", "sliding window attention"]),
    "quantization.py": ("Weight and activation quantization methods.",
                        ["FP8 GEMM", "block-wise FP8 quantization", "W4A8 MoE",
                         "quantization config loading"]),
    "sampling.py": ("Sampling and logprob computation.",
                    ["top-p sampling", "penalizers", "logprob computation", "min-p sampling",
                     "sampling params"]),
    "server.py": ("HTTP entry points.",
                  ["HTTP server", "/generate endpoint", "health check",
                   "OpenAI-compatible API", "server args"]),
    "model_runner.py": ("Runs one forward pass; owns memory pools and CUDA graphs.",
                        ["CUDA graph capture", "model runner", "weight loading",
                         "memory pool init", "torch.compile path"]),
    "utils.py": ("Small helpers shared across the engine.",
                 ["utils", "logging", "env var parsing", "port allocation"]),
}
_TESTS = {
    "test/test_radix_cache.py": "radix cache",
    "test/test_sampling.py": "sampling",
    "test/test_scheduler.py": "scheduler",
    "test/test_kl_accuracy.py": "KL accuracy test",
}
_DOCS = {
    "README.md": "kvserve",
    "docs/index.md": "kvserve documentation",
    "docs/quantization.md": "Quantization",
    "docs/radix_cache.md": "Radix cache and HiCache",
    "docs/benchmarks.md": "Benchmarks",
}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40].rstrip("-")


# --------------------------------------------------------------------------
# file models: each owns paths, renders them from an immutable state, and
# edits itself; immutable states make a revert a plain assignment.

class _Model:
    paths: tuple[str, ...]
    state: object

    def render(self) -> dict[str, str]:
        raise NotImplementedError


class _PyFile(_Model):
    def __init__(self, rng: random.Random, path: str, doc: str, areas: list[str],
                 test: bool = False):
        self.paths = (path,)
        self.areas = areas
        self.test = test
        if test:
            self.header = (f'"""Tests for the {areas[0]}."""\n\nimport math\n\n'
                           f'import pytest\n\n\n')
        else:
            self.header = (f'"""{doc}"""\n\nfrom __future__ import annotations\n\n'
                           f'import logging\nimport math\n\nlogger = logging.getLogger(__name__)\n\n\n')
        blocks = [self._const(rng)] if not test else []
        blocks += [self._func(rng) for _ in range(rng.randint(4, 7))]
        self.state = tuple(blocks)  # ((name, text), ...)

    def render(self) -> dict[str, str]:
        return {self.paths[0]: self.header + "\n\n\n".join(t for _, t in self.state) + "\n"}

    def _const(self, rng: random.Random, name: str | None = None) -> tuple[str, str]:
        name = name or rng.choice(_CONSTS)
        return name, f"{name} = {rng.choice([2, 4, 8, 16, 32, 64, 128, 256, 512]) * rng.randint(1, 64)}"

    def _func(self, rng: random.Random, name: str | None = None) -> tuple[str, str]:
        taken = {n for n, _ in getattr(self, "state", ())}
        if name is None:
            name = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
            if self.test:
                name = "test_" + name
            while name in taken:
                name += f"_{rng.randint(2, 9)}"
        k, k2 = rng.randint(1, 64), rng.randint(1, 64)
        if self.test:
            body = rng.choice([
                f"    value = {k}\n    assert value + {k2} == {k + k2}",
                f"    assert math.isclose({k} / {k2}, {k / k2!r}, rel_tol=1e-6)",
                f"    with pytest.raises(ZeroDivisionError):\n        _ = {k} / 0",
                f"    pages = list(range({k}))\n    assert len(pages[::{k2}]) == {len(range(k)[::k2])}",
            ])
            return name, f"def {name}():\n{body}"
        args = rng.sample(_ARGS, rng.randint(1, 3))
        a, b = args[0], args[-1]
        noun = name.split("_", 1)[-1]
        stmts = rng.sample([
            f"if {a} is None:\n        return None",
            f"{noun}_len = len({b}) if {b} else 0",
            f'logger.debug("{name}: %s", {a})',
            f'assert {a} is not None, "{noun} must be set"',
            f'total = sum(getattr(x, "{noun}", 0) for x in ({b} or []))',
            f"limit = math.ceil({k} / max(1, {k2}))",
        ], rng.randint(1, 3))
        ret = rng.choice([a, "None", str(k), f"({a}, {b})"])
        doc = f'    """{name.split("_")[0].capitalize()} the {noun} for one {rng.choice(_NOUNS)}."""\n'
        return name, (f"def {name}({', '.join(args)}):\n{doc}    "
                      + "\n    ".join(stmts) + f"\n    return {ret}")

    def edit(self, rng: random.Random) -> tuple[str, str]:
        """Change the module; return (kind, detail) for the subject."""
        blocks = list(self.state)
        funcs = [i for i, (n, t) in enumerate(blocks) if t.startswith("def ")]
        consts = [i for i, (n, t) in enumerate(blocks) if not t.startswith("def ")]
        op = rng.choices(["body", "add", "tune", "remove", "rename"], [45, 20, 15, 10, 10])[0]
        if op == "tune" and self.test:
            op = "body"
        if op == "remove" and len(funcs) <= 5:
            op = "add"
        if op == "add" and len(funcs) >= 12:
            op = "body"
        if op == "body":
            i = rng.choice(funcs)
            blocks[i] = self._func(rng, blocks[i][0])
            detail = blocks[i][0]
        elif op == "add":
            new = self._func(rng)
            blocks.insert(rng.randint(len(consts), len(blocks)), new)
            detail = new[0]
        elif op == "tune":
            if consts:
                i = rng.choice(consts)
                blocks[i] = self._const(rng, blocks[i][0])
            else:
                blocks.insert(0, self._const(rng))
                i = 0
            detail = blocks[i][0]
        elif op == "remove":
            detail = blocks.pop(rng.choice(funcs))[0]
        else:
            i = rng.choice(funcs)
            old = blocks[i][0]
            new = self._func(rng)[0]
            blocks[i] = (new, blocks[i][1].replace(f"def {old}(", f"def {new}(", 1))
            detail = f"{old} to {new}"
        self.state = tuple(blocks)
        return op, detail


class _DocFile(_Model):
    def __init__(self, rng: random.Random, path: str, title: str):
        self.paths = (path,)
        self.title = title
        self.state = tuple(self._para(rng) for _ in range(rng.randint(2, 5)))

    @staticmethod
    def _para(rng: random.Random) -> str:
        return " ".join(f"{rng.choice(_SENT_SUBJ)} {rng.choice(_SENT_VERB)} "
                        f"{rng.choice(_SENT_OBJ)}{rng.choice(_SENT_TAIL)}."
                        for _ in range(rng.randint(2, 4)))

    def render(self) -> dict[str, str]:
        return {self.paths[0]: f"# {self.title}\n\n" + "\n\n".join(self.state) + "\n"}

    def edit(self, rng: random.Random) -> tuple[str, str]:
        paras = list(self.state)
        op = rng.choice(["rewrite", "add", "remove"] if len(paras) > 3 else ["rewrite", "add"])
        if op == "add" or len(paras) >= 10:
            op = "add" if len(paras) < 10 else "rewrite"
        if op == "rewrite":
            paras[rng.randrange(len(paras))] = self._para(rng)
        elif op == "add":
            paras.insert(rng.randint(0, len(paras)), self._para(rng))
        else:
            paras.pop(rng.randrange(len(paras)))
        self.state = tuple(paras)
        return op, self.title


class _JsonFile(_Model):
    """A config file: only ``choices`` keys take part in ordinary edits."""

    def __init__(self, path: str, initial: dict, choices: dict[str, list]):
        self.paths = (path,)
        self.state = tuple(initial.items())
        self.choices = choices

    def get(self, key: str):
        return dict(self.state)[key]

    def set(self, key: str, value) -> None:
        d = dict(self.state)
        d[key] = value
        self.state = tuple(d.items())

    def render(self) -> dict[str, str]:
        return {self.paths[0]: json.dumps(dict(self.state), indent=2) + "\n"}

    def edit(self, rng: random.Random) -> tuple[str, str]:
        key = rng.choice(sorted(self.choices))
        cur = self.get(key)
        self.set(key, rng.choice([v for v in self.choices[key] if v != cur]))
        return key, str(self.get(key))


class _CiFile(_Model):
    def __init__(self, rng: random.Random):
        self.paths = (".github/workflows/pr-test.yml",)
        self.state = (("runner", "1-gpu-h100"), ("timeout", 30), ("suite", "per-commit"),
                      ("per_file", 600))

    def render(self) -> dict[str, str]:
        s = dict(self.state)
        return {self.paths[0]: (
            "name: PR Test\n\non:\n  pull_request:\n    branches: [main]\n\njobs:\n"
            f"  unit-test:\n    runs-on: {s['runner']}\n    timeout-minutes: {s['timeout']}\n"
            "    steps:\n      - uses: actions/checkout@v4\n"
            '      - run: pip install -e "python[test]"\n'
            f"      - run: cd test && python3 run_suite.py --suite {s['suite']} "
            f"--timeout-per-file {s['per_file']}\n")}

    def edit(self, rng: random.Random) -> tuple[str, str]:
        s = dict(self.state)
        key = rng.choice(["runner", "timeout", "per_file"])
        if key == "runner":
            s[key] = rng.choice([r for r in ("1-gpu-h100", "1-gpu-h200", "4-gpu-b200",
                                             "1-gpu-5090") if r != s[key]])
        elif key == "timeout":
            s[key] = rng.choice([20, 30, 40, 45, 60, 90])
        else:
            s[key] = rng.choice([300, 600, 900, 1200])
        self.state = tuple(s.items())
        return key, str(s[key])


class _Packaging(_Model):
    """pyproject.toml, setup.py and the version file, with an optional breakage."""

    def __init__(self, rng: random.Random):
        self.paths = ("pyproject.toml", "setup.py", "python/kvserve/version.py")
        self.state = ((0, 4, rng.randint(0, 9)),
                      (("numpy", ">=1.26"), ("torch", "==2.5.1"),
                       ("kvserve-kernel", "==0.1.12"), ("flashinfer-python", "==0.2.5"),
                       ("transformers", "==4.51.0")),
                      None, None)  # (version, pins, broken kind, package whose pin line breaks)

    @property
    def version(self) -> str:
        return ".".join(map(str, self.state[0]))

    @property
    def broken(self) -> str | None:
        return self.state[2]

    def render(self) -> dict[str, str]:
        _, pins, broken, broken_pkg = self.state
        deps = []
        for name, pin in pins:
            line = f'    "{name}{pin}",'
            if broken == "quote" and name == broken_pkg:
                line = f'    "{name}{pin},'  # unterminated string
            deps.append(line)
        close = "" if broken == "bracket" else "]\n"
        pyproject = (
            '[build-system]\nrequires = ["setuptools>=61.0", "wheel"]\n'
            'build-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "kvserve"\nversion = "{self.version}"\n'
            'description = "A small LLM serving engine"\nrequires-python = ">=3.9"\n'
            "dependencies = [\n" + "\n".join(deps) + "\n" + close + "\n"
            '[project.optional-dependencies]\ntest = ["pytest", "numpy"]\n'
            'bench = ["pandas", "matplotlib"]\n')
        setup = ('from setuptools import find_packages, setup\n\nsetup(\n'
                 '    package_dir={"": "python"},\n    packages=find_packages("python"),\n'
                 '    package_data={"kvserve": ["*.json"]},\n'
                 + ("" if broken == "paren" else ")\n"))
        return {"pyproject.toml": pyproject, "setup.py": setup,
                "python/kvserve/version.py": f'__version__ = "{self.version}"\n'}

    def bump_pin(self, rng: random.Random, pkg: str | None = None) -> tuple[str, str]:
        version, pins, broken, bpkg = self.state
        pins = dict(pins)
        pkg = pkg or rng.choice([p for p in pins if p != "numpy"])
        parts = pins[pkg].lstrip("=").split(".")
        parts[-1] = str(int(parts[-1]) + rng.randint(1, 3))
        pins[pkg] = "==" + ".".join(parts)
        self.state = (version, tuple(pins.items()), broken, bpkg)
        return pkg, pins[pkg].lstrip("=")

    def bump_version(self) -> str:
        v = self.state[0]
        self.state = ((v[0], v[1], v[2] + 1),) + self.state[1:]
        return self.version

    def set_broken(self, kind: str | None, pkg: str | None = None) -> None:
        self.state = self.state[:2] + (kind, pkg)


# --------------------------------------------------------------------------
# committed helper scripts

_PROBE = r'''"""KL accuracy probe for kvserve (simulated).

Stands in for the KL accuracy tests: prints what they print and fails the way
they fail, with values drawn afresh on every run from .probe_noise.json.
"""
import hashlib
import json
import math
import os
import random
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))
CRASHES = [
    "CUDA error: an illegal memory access was encountered",
    "Server process exited unexpectedly with code -9 (OOM killer?)",
    "NCCL error: unhandled system error, NCCL version 2.21.5",
    "Timed out waiting for /health_generate after 600 s",
]


def _load(rel):
    with open(os.path.join(ROOT, rel)) as f:
        return json.load(f)


def _matches(rule):
    try:
        return _load(rule["path"]).get(rule["key"]) == rule["value"]
    except (OSError, ValueError):
        return False


def _packaging_hash():
    h = hashlib.sha256()
    for rel in ("pyproject.toml", "setup.py"):
        with open(os.path.join(ROOT, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _launch_server(spec, rng):
    print("[server] launching kvserve on 127.0.0.1:30000 (tp=1, dtype=bfloat16)", flush=True)
    if spec.get("require_build"):
        try:
            stamp = _load(".build/stamp")
        except (OSError, ValueError):
            raise ImportError("kvserve is not installed; run `python build.py` first")
        if stamp.get("packaging") != _packaging_hash():
            raise ImportError("kvserve-kernel version mismatch: the installed build does not "
                              "match pyproject.toml; reinstall with `python build.py`")
    if _matches(spec["crash_when"]):
        raise RuntimeError(CRASHES[0] + "\nCUDA kernel errors might be asynchronously "
                           "reported at some other API call.")
    if rng.random() < spec["crash_rate"]:
        raise RuntimeError(rng.choice(CRASHES))
    print("[server] ready (#running-req: 0, #queue-req: 0, token usage: 0.00)", flush=True)


def _draw(rng, spec, bad):
    a, b = spec["bad"] if bad else spec["good"]
    if spec["kind"] == "lognormal":
        value = a * math.exp(b * rng.gauss(0.0, 1.0))
    else:
        value = rng.uniform(a, b)
    if rng.random() < spec["outlier_rate"]:
        value *= rng.uniform(3.0, 10.0)
    return value


def _draws_of_this_commit(folder):
    """"HEAD:n" for the nth run of this checkout's commit that draws from
    ``folder``: counted per commit, so a commit's draws do not depend on the
    order in which runs of other commits came (parallel slots)."""
    import fcntl
    import subprocess
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip() or "HEAD"
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, head), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write("x")
        f.flush()
        return f"{head}:{f.tell()}"


def main():
    spec = _load(".probe_noise.json")
    # KVSERVE_PROBE_DRAWS (a folder): the nth run of each commit draws the same on every replay (a
    # test suite's runs), KVSERVE_PROBE_SEED picking which; the seed alone: every run draws the same
    seed = os.environ.get("KVSERVE_PROBE_SEED")
    if os.environ.get("KVSERVE_PROBE_DRAWS"):
        nth = _draws_of_this_commit(os.environ["KVSERVE_PROBE_DRAWS"])
        seed = f"{seed}:{nth}" if seed else nth
    rng = random.Random(seed or os.urandom(16))
    _launch_server(spec, rng)
    bad = _matches(spec["bad_when"])
    n, results = spec["samples"], {}
    for label in spec["labels"]:
        avg = _draw(rng, spec, bad and label == spec["moving_label"])
        weights = [math.exp(0.4 * rng.gauss(0.0, 1.0)) for _ in range(n)]
        total = sum(weights)
        kl_divs = [avg * w * n / total for w in weights]
        avg = float("%.6g" % avg)
        print(f"[{label}] {n} samples, {spec['turns']} turns")
        print("kl_divs=[" + ", ".join("%.6g" % x for x in kl_divs) + "]")
        print(f"avg_kl_div={avg}")
        results[label] = avg
    sys.stdout.flush()
    for label, avg in results.items():
        if avg >= spec["threshold"]:
            raise AssertionError(f"{label}: avg_kl_div={avg} >= kl_threshold={spec['threshold']}")


if __name__ == "__main__":
    main()
'''

_BUILD = r'''"""Simulated `pip install -e python` for kvserve.

Fails like a real install when the packaging metadata is broken; on success it
leaves .build/stamp, which probe.py checks when the noise spec asks it to.
"""
import hashlib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))


def _read(rel):
    with open(os.path.join(ROOT, rel), "rb") as f:
        return f.read()


def _check_toml(text):
    try:
        import tomllib
    except ImportError:  # Python < 3.11: a crude check that catches the same breakages
        for n, line in enumerate(text.splitlines(), 1):
            if line.count('"') % 2:
                return f"unterminated string at line {n}"
        if text.count("[") != text.count("]"):
            return "unbalanced brackets"
        return None
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        return str(exc)
    return None


def main():
    print("Obtaining file://" + ROOT)
    print("  Installing build dependencies ... done")
    print("  Checking if build backend supports build_editable ... done", flush=True)
    pyproject, setup = _read("pyproject.toml"), _read("setup.py")
    err = _check_toml(pyproject.decode())
    if err:
        print("  Getting requirements to build editable ... error", file=sys.stderr)
        print(f"  error: invalid pyproject.toml config: {err}", file=sys.stderr)
        print("error: metadata-generation-failed", file=sys.stderr)
        return 1
    try:
        compile(setup, "setup.py", "exec")
    except SyntaxError as exc:
        print("  error: subprocess-exited-with-error", file=sys.stderr)
        print(f'    File "setup.py", line {exc.lineno}', file=sys.stderr)
        print(f"  SyntaxError: {exc.msg}", file=sys.stderr)
        print("error: metadata-generation-failed", file=sys.stderr)
        return 1
    version = re.search(rb'^version = "([^"]+)"', pyproject, re.M).group(1).decode()
    os.makedirs(os.path.join(ROOT, ".build"), exist_ok=True)
    tmp = os.path.join(ROOT, ".build", "stamp.tmp")
    with open(tmp, "w") as f:
        json.dump({"packaging": hashlib.sha256(pyproject + setup).hexdigest(),
                   "version": version}, f)
    os.replace(tmp, os.path.join(ROOT, ".build", "stamp"))
    print(f"Successfully installed kvserve-{version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''

_GITIGNORE = ".build/\n__pycache__/\n*.pyc\n*.egg-info/\n"


# --------------------------------------------------------------------------
# generation

def _plan(rng: random.Random, n: int, culprit_index: int | None, build_broken_before: int,
          crash_before: int, crash_right_before: bool, merges: int):
    """Choose the culprit, the untestable commits before it and the merge positions."""
    if n < 2:
        raise ValueError("n_commits must be at least 2 (good endpoint and culprit)")
    if build_broken_before < 0 or crash_before < 0 or merges < 0:
        raise ValueError("counts must not be negative")
    need = build_broken_before + crash_before
    # untestable commits go in [1, c-2]: c-1 must stay testable unless
    # crash_right_before, otherwise the culprit could not be isolated
    lo = need + 2 if need else (2 if crash_right_before else 1)
    if culprit_index is None:
        if lo > n - 1:
            raise ValueError(f"n_commits={n} is too small for the requested scenario")
        c = rng.randint(lo, n - 1)
    else:
        c = culprit_index
        if not lo <= c <= n - 1:
            raise ValueError(f"culprit_index must be within [{lo}, {n - 1}] for this scenario")
    pool = list(range(max(1, c - WINDOW), c - 1))
    if len(pool) < need:
        pool = list(range(1, c - 1))
    picks = rng.sample(pool, need)
    broken = set(picks[:build_broken_before])
    crash = set(picks[build_broken_before:])
    if crash_right_before:
        crash.add(c - 1)
    special = broken | crash | {c}
    eligible = [p for p in range(1, n) if p not in special and p - 1 not in broken | crash]
    merge_pos = set(rng.sample(eligible, min(merges, len(eligible))))
    return c, broken, crash, merge_pos


class _Generator:
    def __init__(self, rng: random.Random, n: int, culprit: int, broken: set[int],
                 crash: set[int], merges: set[int], style: str, noise: NoiseModel,
                 require_build: bool):
        self.rng, self.n, self.c = rng, n, culprit
        self.broken, self.crash, self.merge_pos = broken, crash, merges
        self.squash = style == "squash"
        self.out: list[bytes] = []
        self.mark = 0
        self.chain_marks: list[int] = []
        self.side_marks: list[int] = []
        self.subject_of: dict[int, str] = {}
        self.pr_of: dict[int, int] = {}
        self.pr = rng.randint(20000, 30000)
        self.time = 1735689600 + rng.randint(0, 30 * 86400)
        self.content: dict[str, str] = {}
        self.last_mod: dict[str, int] = {}
        self.recent: list[tuple[str, list]] = []  # revertable commits: (subject, records)
        self.break_pr: int | None = None
        self.model_counter = 0
        self.variant = rng.choice(_CULPRITS)
        self.noise, self.require_build = noise, require_build
        self._init_models()

    # -- models ----------------------------------------------------------
    def _init_models(self) -> None:
        rng = self.rng
        self.py = {name: _PyFile(rng, f"python/kvserve/{name}", doc, areas)
                   for name, (doc, areas) in _PY_MODULES.items()}
        self.models_dir: dict[str, _PyFile] = {}
        for name in ("llama", "qwen2"):
            self.models_dir[name] = _PyFile(rng, f"python/kvserve/models/{name}.py",
                                            f"{name} model definition.", [f"{name} model"])
        self.tests = {p: _PyFile(rng, p, "", [area], test=True) for p, area in _TESTS.items()}
        self.docs = {p: _DocFile(rng, p, title) for p, title in _DOCS.items()}
        self.ci = _CiFile(rng)
        numerics = {k: good for k, good, _, _, _ in _CULPRITS}
        numerics.update(chunked_prefill_size=8192, page_size=1, max_running_requests=256,
                        mem_fraction_static=0.85)
        self.numerics = _JsonFile(NUMERICS_PATH, numerics, {
            "chunked_prefill_size": [2048, 4096, 8192, 16384],
            "page_size": [1, 16, 32, 64],
            "max_running_requests": [128, 256, 512, 1024],
            "mem_fraction_static": [0.8, 0.85, 0.88, 0.9]})
        self.kernels = _JsonFile(KERNELS_PATH, {
            CRASH_KEY: CRASH_OK, "prefill_attention": "flashinfer", "moe_runner": "triton",
            "cuda_graph_max_bs": 160, "use_fused_rope": True}, {
            "prefill_attention": ["flashinfer", "fa3", "triton"],
            "moe_runner": ["triton", "cutlass", "deep_gemm"],
            "cuda_graph_max_bs": [80, 160, 256, 512],
            "use_fused_rope": [True, False]})
        self.packaging = _Packaging(rng)

    def _code_models(self) -> list[_Model]:
        """Models that ordinary commits and side branches edit freely."""
        return (list(self.py.values()) + list(self.models_dir.values())
                + list(self.tests.values()) + list(self.docs.values()))

    def _static_files(self) -> dict[str, str]:
        key, good, bad, _, _ = self.variant
        spec = asdict(self.noise)
        spec.update(good=list(self.noise.good), bad=list(self.noise.bad), labels=list(LABELS),
                    samples=18, turns=2, require_build=self.require_build,
                    bad_when={"path": NUMERICS_PATH, "key": key, "value": bad},
                    crash_when={"path": KERNELS_PATH, "key": CRASH_KEY, "value": CRASH_BAD})
        return {
            ".gitignore": _GITIGNORE,
            NOISE_PATH: json.dumps(spec, indent=2) + "\n",
            "probe.py": _PROBE,
            "build.py": _BUILD,
            "python/kvserve/__init__.py": "from kvserve.version import __version__\n",
            "python/kvserve/models/__init__.py": "",
            "test/run_suite.py": ('"""Run a named suite of test files."""\nimport sys\n\n'
                                  'import pytest\n\nsys.exit(pytest.main(sys.argv[1:]))\n'),
        }

    def _touch(self, model: _Model, changes: dict[str, str | None], idx: int) -> None:
        for path, text in model.render().items():
            if self.content.get(path) != text:
                self.content[path] = text
                self.last_mod[path] = idx
                changes[path] = text

    # -- stream ----------------------------------------------------------
    def _emit(self, subject: str, body: str, changes: dict[str, str | None], parent: int | None,
              merge: int | None = None, github: bool = True,
              author: tuple[str, str, str] | None = None) -> int:
        rng = self.rng
        self.mark += 1
        self.time += rng.randint(300, 4 * 3600)
        name, email, tz = author or rng.choice(_AUTHORS)
        cname, cemail, ctz = _GITHUB if github and self.squash else (name, email, tz)
        authored = self.time - (rng.randint(600, 3 * 86400) if github else rng.randint(0, 600))
        msg = (subject + "\n" + (f"\n{body}\n" if body else "")).encode()
        head = (f"commit refs/heads/main\nmark :{self.mark}\n"
                f"author {name} <{email}> {authored} {tz}\n"
                f"committer {cname} <{cemail}> {self.time} {ctz}\n"
                f"data {len(msg)}\n").encode()
        parts = [head, msg, b"\n"]
        if parent is not None:
            parts.append(f"from :{parent}\n".encode())
        if merge is not None:
            parts.append(f"merge :{merge}\n".encode())
        for path in sorted(changes):
            text = changes[path]
            if text is None:
                parts.append(f"D {path}\n".encode())
            else:
                data = text.encode()
                parts += [f"M 100644 inline {path}\ndata {len(data)}\n".encode(), data, b"\n"]
        parts.append(b"\n")
        self.out += parts
        self.subject_of[self.mark] = subject
        return self.mark

    def _title(self, title: str) -> tuple[str, int | None]:
        """PR-style subject for a squash commit, and its PR number."""
        if not self.squash:
            return title, None
        self.pr += self.rng.randint(1, 25)
        return f"{title} (#{self.pr})", self.pr

    def _body(self) -> str:
        rng = self.rng
        if not self.squash or rng.random() < 0.55:
            return ""
        name, email, _ = rng.choice(_AUTHORS)
        return f"Co-authored-by: {name} <{email}>"

    # -- commits ---------------------------------------------------------
    def run(self) -> bytes:
        self.out.append(b"feature done\n")
        for idx in range(self.n):
            if idx == 0:
                self._root()
            elif idx in self.merge_pos:
                self._merge(idx)
            else:
                self._mainline(idx)
        self.out.append(b"done\n")
        return b"".join(self.out)

    def _root(self) -> None:
        changes: dict[str, str | None] = dict(self._static_files())
        self.content.update(changes)
        for m in self._code_models() + [self.ci, self.numerics, self.kernels, self.packaging]:
            self._touch(m, changes, 0)
        subject = f"Release v{self.packaging.version}"
        subject, pr = self._title(subject)
        mark = self._emit(subject, "", changes, None)
        self._chain(mark, pr)

    def _chain(self, mark: int, pr: int | None) -> None:
        self.chain_marks.append(mark)
        if pr is not None:
            self.pr_of[mark] = pr

    def _mainline(self, idx: int) -> None:
        rng = self.rng
        changes: dict[str, str | None] = {}
        titles: list[str] = []
        pk = self.packaging
        if idx in self.broken:
            if idx - 1 not in self.broken:
                kind = rng.choice(["quote", "bracket", "paren"])
                if kind == "paren":
                    pk.set_broken(kind)
                    titles.append("Declare package data for json configs in setup.py")
                else:
                    pkg, ver = pk.bump_pin(rng)
                    pk.set_broken(kind, pkg)
                    titles.append(f"Bump {pkg} to {ver}")
            else:
                pkg, ver = pk.bump_pin(rng)
                titles.append(f"Update {pkg} pin to {ver}")
        elif idx - 1 in self.broken:
            what = "setup.py" if pk.broken == "paren" else "pyproject.toml"
            pk.set_broken(None)
            titles.append(f"Fix broken {what} from #{self.break_pr}" if self.squash
                          else f"Fix broken {what}")
        self._touch(pk, changes, idx)

        if idx in self.crash and idx - 1 not in self.crash:
            self.kernels.set(CRASH_KEY, CRASH_BAD)
            self._touch(self.kernels, changes, idx)
            self._edit(self.py["attention.py"], changes, idx)
            titles.insert(0, rng.choice(["[Perf] Use split-K triton decode kernel for small batches",
                                         "Enable triton split-K decode attention by default"]))
        elif idx not in self.crash and idx - 1 in self.crash:
            self.kernels.set(CRASH_KEY, CRASH_OK)
            self._touch(self.kernels, changes, idx)
            titles.append("Fix illegal memory access in split-K decode; fall back to flashinfer")

        if idx == self.c:
            key, _, bad, module, title = self.variant
            self.numerics.set(key, bad)
            self._touch(self.numerics, changes, idx)
            self._edit(self.py[module], changes, idx)
            titles.insert(0, title)

        if titles:
            subject, pr = self._title(titles[0])
            self._chain(self._emit(subject, self._body(), changes, self.chain_marks[-1]), pr)
            if idx in self.broken and idx - 1 not in self.broken:
                self.break_pr = pr
        else:
            self._ordinary(idx)

    def _edit(self, model: _Model, changes: dict, idx: int) -> tuple[str, str]:
        kind_detail = model.edit(self.rng)
        self._touch(model, changes, idx)
        return kind_detail

    def _ordinary(self, idx: int) -> None:
        rng = self.rng
        changes: dict[str, str | None] = {}
        records: list[tuple[_Model, object, dict[str, str] | None]] = []

        def edit(model: _Model) -> tuple[str, str]:
            before = model.state
            out = self._edit(model, changes, idx)
            records.append((model, before, None))
            return out

        kind = rng.choices(["py", "test", "doc", "ci", "model", "numerics", "kernels",
                            "packaging", "revert"], [45, 15, 12, 3, 3, 2, 2, 3, 4])[0]
        if kind == "revert" and self._revert(idx):
            return
        if kind == "model" and len(self.models_dir) >= 40:
            kind = "py"
        if kind in ("py", "revert"):
            model = rng.choice(list(self.py.values()) + list(self.models_dir.values()))
            title = self._code_subject(model, *edit(model))
        elif kind == "test":
            model = rng.choice(list(self.tests.values()))
            op, detail = edit(model)
            title = rng.choice([f"[CI] Fix flaky {detail}", f"Add unit test for {model.areas[0]}",
                                f"[CI] Skip {detail} on {rng.choice(_HW)}",
                                f"Increase tolerance in {detail}",
                                f"[CI] Fix {detail} after {rng.choice(_RENAMES)} rename"])
        elif kind == "doc":
            model = rng.choice(list(self.docs.values()))
            edit(model)
            title = rng.choice([f"[Doc] Update {model.title} docs",
                                f"Fix typo in {model.paths[0]}",
                                f"docs: document {rng.choice(_FEATURES)}",
                                f"[Doc] Add {rng.choice(_FEATURES)} section to {model.title}"])
        elif kind == "ci":
            key, val = edit(self.ci)
            title = {"runner": f"[CI] Move unit tests to {val} runners",
                     "timeout": f"[CI] Set pr-test timeout to {val} min",
                     "per_file": f"[CI] Raise per-file timeout to {val} s"}[key]
        elif kind == "model":
            self.model_counter += 1
            base = rng.choice(_MODEL_NAMES)
            name = base if base not in self.models_dir else f"{base}_v{self.model_counter}"
            pretty = name.replace("_", "-").title()
            model = _PyFile(rng, f"python/kvserve/models/{name}.py",
                            f"{pretty} model definition.", [f"{pretty} model"])
            self.models_dir[name] = model
            self._touch(model, changes, idx)
            records.append((model, None, None))
            title = rng.choice([f"[Model] Support {pretty}", f"Add {pretty} model",
                                f"Support {pretty} with {rng.choice(_FEATURES)}"])
        elif kind == "numerics":
            key, val = edit(self.numerics)
            title = rng.choice([f"Set default {key} to {val}", f"Tune {key} default{rng.choice(_QUALS)}"])
        elif kind == "kernels":
            key, val = edit(self.kernels)
            title = f"Change default {key} to {val}"
        else:
            before = self.packaging.state
            if rng.random() < 0.4:
                title = f"Bump version to {self.packaging.bump_version()}"
            else:
                pkg, ver = self.packaging.bump_pin(rng)
                title = rng.choice([f"Bump {pkg} to {ver}", f"Upgrade {pkg} to {ver}"])
            self._touch(self.packaging, changes, idx)
            records.append((self.packaging, before, None))
        # realistic PRs often touch a test or a doc alongside
        while rng.random() < 0.3 and len(records) < 4:
            edit(rng.choice(self._code_models()))
        subject, pr = self._title(title)
        mark = self._emit(subject, self._body(), changes, self.chain_marks[-1])
        self._chain(mark, pr)
        after = [(m, b, {p: self.content[p] for p in m.paths}) for m, b, _ in records]
        self.recent.append((subject, after))
        del self.recent[:-60]

    def _code_subject(self, model: _PyFile, op: str, detail: str) -> str:
        rng = self.rng
        area, qual = rng.choice(model.areas), rng.choice(_QUALS)
        options = {
            "body": [f"Fix {rng.choice(_PROBLEMS)} in {area}{qual}",
                     f"[Bugfix] Fix {rng.choice(_PROBLEMS)} in {detail}",
                     f"[Perf] Optimize {area}{qual}", f"Speed up {detail}{qual}",
                     f"Fix stale import after {rng.choice(_RENAMES)} rename"],
            "add": [f"Support {rng.choice(_FEATURES)} in {area}",
                    f"[Feature] Add {rng.choice(_FEATURES)} support to {area}",
                    f"Add {detail} helper for {area}"],
            "tune": [f"Tune default {detail} for {rng.choice(_HW)}",
                     f"[Perf] Adjust {detail}{qual}"],
            "remove": [f"Remove unused {detail}", f"Clean up {area}",
                       f"[Refactor] Drop dead code in {area}"],
            "rename": [f"Rename {detail}", f"Refactor {area}{qual}",
                       f"[Refactor] Simplify {area}"],
        }[op]
        return rng.choice(options)

    def _revert(self, idx: int) -> bool:
        """Revert a recent ordinary commit whose files nobody touched since."""
        rng = self.rng
        for _ in range(5):
            if not self.recent:
                return False
            k = rng.randrange(len(self.recent))
            subject, records = self.recent[k]
            if all(self.content.get(p) == t for _, _, after in records for p, t in after.items()):
                break
        else:
            return False
        del self.recent[k]
        changes: dict[str, str | None] = {}
        for model, before, _ in reversed(records):
            if before is None:  # the commit created this file
                for p in model.paths:
                    changes[p] = None
                    self.content.pop(p, None)
                    self.last_mod.pop(p, None)
                self.models_dir = {n: m for n, m in self.models_dir.items() if m is not model}
            else:
                model.state = before
                self._touch(model, changes, idx)
        title, pr = self._title(f'Revert "{subject}"')
        self._chain(self._emit(title, "", changes, self.chain_marks[-1]), pr)
        return True

    def _merge(self, idx: int) -> None:
        """A --no-ff merge of a 1-3 commit branch forked a few commits back."""
        rng = self.rng
        fork = idx - 1 - rng.randint(0, min(3, idx - 1))
        free = [m for m in self._code_models()
                if all(self.last_mod.get(p, 0) <= fork for p in m.paths)]
        if not free:
            fork, free = idx - 1, self._code_models()
        author = rng.choice(_AUTHORS)
        merged: dict[str, str | None] = {}
        parent = self.chain_marks[fork]
        title = ""
        for j in range(rng.randint(1, 3)):
            model = rng.choice(free)
            changes: dict[str, str | None] = {}
            op, detail = self._edit(model, changes, idx)
            if j == 0:
                title = (self._code_subject(model, op, detail) if isinstance(model, _PyFile)
                         and not model.test else f"Update {model.paths[0]}")
                subject = title
            else:
                subject = rng.choice(["address review comments", "fix lint", "add test",
                                      "apply suggestions from code review",
                                      f"Update {model.paths[0]}"])
            merged.update(changes)
            parent = self._emit(subject, "", changes, parent, github=False, author=author)
            self.side_marks.append(parent)
        branch = _slug(title) or "patch"
        if self.squash:
            self.pr += rng.randint(1, 25)
            pr: int | None = self.pr
            subject = f"Merge pull request #{pr} from {author[1].split('@')[0]}/{branch}"
            body = title
        else:
            pr, subject, body = None, f"Merge branch '{branch}'", ""
        mark = self._emit(subject, body, merged, self.chain_marks[-1], merge=parent)
        self._chain(mark, pr)


def _git_env() -> dict[str, str]:
    """The caller's environment without variables that would redirect git (e.g. inside a hook)."""
    drop = {"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
            "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_COMMON_DIR", "GIT_NAMESPACE",
            "GIT_CEILING_DIRECTORIES", "GIT_PREFIX"}
    return {k: v for k, v in os.environ.items() if k not in drop}


# The generated probe as another driver, wheel or machine sees it. KL_DRIVER_SCALE
# multiplies every value; KL_DRIVER_HIDE=1 maps the moving label's bad range onto
# the good one (a uniform model's): a regression this machine never shows.
DRIVER_PROBE = r'''import json, os, re, subprocess, sys, time
scale = float(os.environ.get("KL_DRIVER_SCALE", "1"))
time.sleep(float(os.environ.get("KL_DRIVER_SLEEP", "0")))   # a slow machine, for tests that interrupt
spec = json.load(open(".probe_noise.json"))
(g0, g1), (b0, b1) = spec["good"], spec["bad"]
label = None


def seen(line):
    global label
    m = re.match(r"\[(\w+)\]", line)
    label = m.group(1) if m else label
    m = re.match(r"avg_kl_div=([0-9.eE+-]+)", line)
    if not m:
        return line
    v = float(m.group(1))
    if os.environ.get("KL_DRIVER_HIDE") == "1" and label == spec["moving_label"] and v >= b0:
        v = g0 + (min(v, b1) - b0) / (b1 - b0) * (g1 - g0)
    return f"avg_kl_div={v * scale:.6g}\n"


p = subprocess.run([sys.executable, "probe.py"], capture_output=True, text=True)
sys.stdout.write("".join(seen(line) for line in p.stdout.splitlines(keepends=True)))
sys.stderr.write(p.stderr)
sys.exit(p.returncode)
'''


def write_driver_probe(path: Path) -> str:
    """Write DRIVER_PROBE to ``path``; returns the --probe-cmd that runs it in a checkout."""
    Path(path).write_text(DRIVER_PROBE)
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(path))}"


def make_history(path: Path, n_commits: int = 1000, culprit_index: int | None = None,
                 seed: int = 0, noise: NoiseModel | None = None, build_broken_before: int = 0,
                 crash_before: int = 0, crash_right_before: bool = False, merges: int = 10,
                 subject_style: str = "squash", *, probe_requires_build: bool = False) -> History:
    """Create a repository at ``path`` (absent or empty) with a planted KL regression.

    ``n_commits`` counts the first-parent chain, the good endpoint included.
    With ``probe_requires_build`` the probe refuses to run (ImportError, no
    value) unless ``build.py`` last succeeded on the same packaging files, as
    a real stale install would.
    """
    if subject_style not in ("squash", "plain"):
        raise ValueError("subject_style must be 'squash' or 'plain'")
    noise = noise or NoiseModel()
    path = Path(path).resolve()
    if path.exists() and any(path.iterdir()):
        raise ValueError(f"{path} exists and is not empty")
    rng = random.Random(seed)
    c, broken, crash, merge_pos = _plan(rng, n_commits, culprit_index, build_broken_before,
                                        crash_before, crash_right_before, merges)
    gen = _Generator(rng, n_commits, c, broken, crash, merge_pos, subject_style, noise,
                     probe_requires_build)
    stream = gen.run()

    path.mkdir(parents=True, exist_ok=True)
    env = _git_env()

    def git(*args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["git", *args], cwd=path, env=env, check=True,
                              capture_output=True, **kw)

    git("init", "-q", "-b", "main")
    # glibc otherwise trims the heap after nearly every object fast-import
    # writes; the resulting brk churn doubles its run time
    fi_env = dict(env, MALLOC_TRIM_THRESHOLD_="268435456", MALLOC_TOP_PAD_="67108864")
    with tempfile.TemporaryDirectory(prefix="klb-marks-") as tmp:
        marks_file = Path(tmp) / "marks"
        try:
            subprocess.run(["git", "fast-import", "--quiet", f"--export-marks={marks_file}"],
                           cwd=path, env=fi_env, check=True, capture_output=True, input=stream)
        except subprocess.CalledProcessError as exc:
            raise RuntimeError("git fast-import failed: "
                               + exc.stderr.decode(errors="replace")[-2000:]) from exc
        sha_of = {}
        for line in marks_file.read_text().splitlines():
            mark, sha = line.split()
            sha_of[int(mark[1:])] = sha
    git("reset", "-q", "--hard", "main")

    shas = [sha_of[m] for m in gen.chain_marks]
    return History(
        path=path, shas=shas, culprit=shas[c], culprit_index=c, good=shas[0], bad=shas[-1],
        build_broken=[shas[i] for i in sorted(broken)],
        crashing=[shas[i] for i in sorted(crash)],
        merges=[shas[i] for i in sorted(merge_pos)],
        probe_cmd="python probe.py", build_cmd="python build.py",
        subjects={sha_of[m]: s for m, s in gen.subject_of.items()},
        prs={sha_of[m]: pr for m, pr in gen.pr_of.items()},
        side_commits=[sha_of[m] for m in gen.side_marks],
        noise=noise, seed=seed)


def main(argv: list[str] | None = None) -> int:
    """``python -m klbisect.histgen PATH``: a history to try klbisect on.
    Prints the endpoints and commands; the answer goes to ``--answer FILE``
    so a trial can stay blind."""
    import argparse  # noqa: PLC0415
    import json  # noqa: PLC0415
    ap = argparse.ArgumentParser(prog="python -m klbisect.histgen",
                                 description="Make a git repository with a planted KL regression, a probe.py "
                                             "that prints its noisy KL and a build.py.")
    ap.add_argument("path", help="where to create it (absent or empty)")
    ap.add_argument("--commits", type=int, default=200, help="first-parent commits, good endpoint included")
    ap.add_argument("--culprit", type=int, default=None, help="index of the first bad commit (default: random)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--merges", type=int, default=10, help="merged side branches")
    ap.add_argument("--lognormal", action="store_true",
                    help="overlapping log-normal values (issue 3's model b) instead of the seed case's uniform")
    ap.add_argument("--outliers", type=float, default=0.0, help="share of runs 3-10x larger")
    ap.add_argument("--crashes", type=float, default=0.0, help="share of runs that crash before a value")
    ap.add_argument("--broken-builds", type=int, default=0,
                    help=f"commits that do not build (a later one fixes them) among the {WINDOW} before the "
                    "culprit, never the one right before it: the answer stays one commit")
    ap.add_argument("--answer", help="write the ground truth (culprit, block) here as JSON instead of printing it")
    a = ap.parse_args(argv)
    shape = dict(kind="lognormal", good=(0.002, 0.26), bad=(0.0025, 0.26)) if a.lognormal else {}
    try:
        noise = NoiseModel(outlier_rate=a.outliers, crash_rate=a.crashes, **shape)
        h = make_history(Path(a.path), n_commits=a.commits, culprit_index=a.culprit, seed=a.seed,
                         noise=noise, merges=a.merges, build_broken_before=a.broken_builds)
    except ValueError as e:
        ap.error(str(e))
    answer = {"culprit": h.culprit, "culprit_index": h.culprit_index, "block": h.expected_block,
              "pr": h.prs.get(h.culprit)}
    info = {"path": str(h.path), "good": h.good, "bad": h.bad, "probe_cmd": h.probe_cmd,
            "build_cmd": h.build_cmd, "try": f"cd {h.path} && klbisect run --good {h.good[:12]} --bad main "
                                            f"--probe-cmd '{h.probe_cmd}' --build-cmd '{h.build_cmd}'"}
    if a.answer:
        Path(a.answer).write_text(json.dumps(answer, indent=1) + "\n")
    else:
        info["answer"] = answer
    print(json.dumps(info, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
