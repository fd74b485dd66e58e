"""The everyday commits of the demo history: docs, tests, backends, CI, benchmarks.

They make the history look like a real project's squash merges (and give a
bisect plenty of innocent commits that touch engine files) without ever
changing the engine's numerics.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import TypeVar

from klbisect.demo.story import Change, HistoryError, Tree, append_text, replace_once

T = TypeVar("T")

FAQ: list[tuple[str, str]] = [
    (
        "Why does prefill use a different backend than decode?",
        "Prefill processes many tokens at once and is compute bound; decode reads the\n"
        "whole KV cache for one token and is memory bound. The `hybrid` backend lets\n"
        "each phase use the kernel that suits it.",
    ),
    (
        "What does `kv_cache_dtype=fp8_e4m3` change?",
        "K and V are rounded to float8_e4m3fn (with the checkpoint's `kv_cache_scale`)\n"
        "when they are written to the cache. Decode reads them back, so decode sees\n"
        "the rounded values while a prefill's own tokens use the exact ones.",
    ),
    (
        "Why is `avg_kl_div` different on every run?",
        "The prompts are drawn at random on every run and the outputs are sampled at\n"
        "temperature 1. Pass `--seed` to pin both.",
    ),
    (
        "How do I add an attention backend?",
        "Subclass `AttentionBackend`, decorate it with `@register_backend(\"name\")` and\n"
        "import its module in `tinyserve/attention/__init__.py`.",
    ),
    (
        "Where do the model weights come from?",
        "They are generated from `ModelConfig.weight_seed` on the CPU and then moved to\n"
        "the device, so every device serves bit-identical weights.",
    ),
    (
        "Can I run on a GPU?",
        "Yes: `--device cuda` (or `TINYSERVE_DEVICE=cuda`).",
    ),
    (
        "What is a prefill hook?",
        "A function registered for a backend name that may transform Q, K and V before a\n"
        "prefill's attention, for instance to quantize them for a kernel that wants FP8\n"
        "inputs.",
    ),
    (
        "Why is the KV cache allocated with `torch.empty`?",
        "Only positions below `length` are ever read; zero-filling megabytes on every\n"
        "request was a measurable part of short runs.",
    ),
    (
        "What does `kv_cache_scale` mean?",
        "The scale an FP8 KV cache divides K and V by before rounding. Checkpoints ship\n"
        "it; a poorly calibrated scale makes the cache noticeably lossy.",
    ),
    (
        "Why is sampling done on the CPU?",
        "The sampling generator lives on the CPU so that a given seed picks the same\n"
        "tokens on every device.",
    ),
    (
        "How long does one KL test run take?",
        "About a second of compute on a laptop CPU, plus interpreter and torch start-up.",
    ),
    (
        "Which positions does the KL replay score?",
        "Only the generated tokens: the prompt's logprobs have no decode-time\n"
        "counterpart.",
    ),
    (
        "Does batching change the results?",
        "All sequences of a batch have the same length, so there is no padding; results\n"
        "can still differ in the last bits between batch sizes.",
    ),
    (
        "How do I pin the prompts of a KL run?",
        "`python -m tinyserve.kl_test --seed 1234`.",
    ),
]

DOCS: list[tuple[str, str, str]] = [
    ("docs/architecture.md", "Forward modes",
     "`ForwardMode.EXTEND` runs new tokens on top of whatever the cache holds (a\n"
     "prefill is an extend on an empty cache); `ForwardMode.DECODE` runs exactly one\n"
     "token per sequence."),
    ("docs/architecture.md", "KV cache layout",
     "One `[batch, heads, max_len, head_dim]` tensor per layer for K and one for V.\n"
     "`KVCache.length` is the number of valid positions."),
    ("docs/architecture.md", "Sampling",
     "Logits are divided by the temperature and normalised with `log_softmax`; the\n"
     "sampled token's logprob is returned with it."),
    ("docs/architecture.md", "Weights",
     "Generated from a fixed seed with `torch.randn`, scaled by `1/sqrt(fan_in)`."),
    ("docs/architecture.md", "Rotary embeddings",
     "Standard RoPE with `rope_theta = 10000`, applied to Q and K before attention."),
    ("docs/attention_backends.md", "Writing a backend",
     "A backend writes the new K/V into `fb.cache` and returns the attention output\n"
     "for the new tokens. `causal_attention` in `attention/base.py` does the math."),
    ("docs/attention_backends.md", "Testing a backend",
     "Compare its output with `torch_native` on random inputs, for extend and decode."),
    ("docs/kl_tests.md", "Thresholds",
     "The threshold is 0.01 for every label. Raise it only from statistics over many\n"
     "runs (\"N runs, k above x\"), never from one failure."),
    ("docs/kl_tests.md", "Reading the output",
     "`kl_divs` lists one value per sequence; `avg_kl_div` is their mean and is what\n"
     "the test asserts on."),
    ("docs/kl_tests.md", "Running on CUDA",
     "`python -m tinyserve.kl_test --device cuda`. TF32 is not used; all compute is\n"
     "float32, so CPU and GPU give the same distribution of values."),
    ("docs/quantization.md", "FP8 formats",
     "`float8_e4m3fn`: 4 exponent bits, 3 mantissa bits, no infinities, max 448."),
    ("docs/quantization.md", "Per-tensor scales",
     "`quantize_per_tensor` maps the tensor's absolute maximum to 448."),
    ("docs/quantization.md", "FP8 KV cache",
     "With `kv_cache_dtype=fp8_e4m3` K/V are stored as FP8 with a static scale."),
    ("docs/contributing.md", "Pull requests",
     "One topic per PR; the PR title becomes the squash commit's subject."),
    ("docs/contributing.md", "Running the tests",
     "`pip install -e .[dev] && pytest tests`"),
]

BACKENDS: list[tuple[str, str, str]] = [
    ("triton_sim", "TritonSim", "Stand-in for a Triton kernel"),
    ("flashinfer_sim", "FlashInferSim", "Stand-in for FlashInfer's paged kernels"),
    ("flex_sim", "FlexSim", "Stand-in for torch flex attention"),
    ("aiter_sim", "AiterSim", "Stand-in for ROCm aiter kernels"),
    ("wave_sim", "WaveSim", "Stand-in for Wave kernels"),
    ("cutlass_sim", "CutlassSim", "Stand-in for CUTLASS MLA kernels"),
]

SERVER_ARGS: list[tuple[str, str, str]] = [
    ("max_running_requests", "int", "64"),
    ("chunked_prefill_size", "int", "2048"),
    ("log_level", "str", '"info"'),
    ("random_seed", "int | None", "None"),
    ("disable_cuda_graph", "bool", "False"),
    ("mem_fraction_static", "float", "0.8"),
    ("page_size", "int", "1"),
    ("schedule_policy", "str", '"fcfs"'),
    ("enable_metrics", "bool", "False"),
    ("stream_interval", "int", "1"),
    ("tokenizer_path", "str | None", "None"),
    ("watchdog_timeout", "float", "300.0"),
]

BENCH_SCRIPTS: dict[str, tuple[str, str]] = {
    "decode": ("Add decode throughput benchmark", '''"""Decode throughput of the built-in model."""
import argparse
import time

import torch

from tinyserve.config import ServerArgs
from tinyserve.engine import Engine

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--tokens", type=int, default=64)
args = parser.parse_args()

engine = Engine(server_args=ServerArgs(device=args.device))
prompts = torch.randint(engine.model_config.vocab_size, (args.batch, 16))
start = time.perf_counter()
engine.generate(prompts, args.tokens, torch.Generator().manual_seed(0))
elapsed = time.perf_counter() - start
print(f"{args.batch * args.tokens / elapsed:.1f} tok/s")
'''),
    "prefill": ("Add prefill latency benchmark", '''"""Prefill latency of the built-in model."""
import argparse
import time

import torch

from tinyserve.config import ServerArgs
from tinyserve.engine import Engine

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cpu")
parser.add_argument("--length", type=int, default=256)
args = parser.parse_args()

engine = Engine(server_args=ServerArgs(device=args.device))
ids = torch.randint(engine.model_config.vocab_size, (1, args.length))
start = time.perf_counter()
engine.score(ids, 1)
print(f"{(time.perf_counter() - start) * 1e3:.1f} ms")
'''),
    "fp8_quant": ("Add FP8 quantization micro-benchmark", '''"""Cost of FP8 fake quantization per tensor."""
import time

import torch

from tinyserve.quant.fp8 import fake_quant_per_tensor

x = torch.randn(8, 4, 128, 32)
start = time.perf_counter()
for _ in range(100):
    fake_quant_per_tensor(x)
print(f"{(time.perf_counter() - start) * 1e4:.1f} us per call")
'''),
    "kv_cache": ("Add KV cache write benchmark", '''"""Cost of writing to the KV cache in each dtype."""
import time

import torch

from tinyserve.kv_cache import KV_CACHE_DTYPES, KVCache

for dtype in KV_CACHE_DTYPES:
    cache = KVCache(4, 8, 4, 32, 512, dtype, "cpu")
    k = torch.randn(8, 4, 1, 32)
    start = time.perf_counter()
    for pos in range(256):
        cache.write(0, pos, k, k)
    print(f"{dtype}: {(time.perf_counter() - start) / 256 * 1e6:.1f} us per write")
'''),
    "sampling": ("Add sampling benchmark", '''"""Cost of sampling one token per row."""
import time

import torch

from tinyserve.engine import sample

logits = torch.randn(8, 512)
gen = torch.Generator().manual_seed(0)
start = time.perf_counter()
for _ in range(1000):
    sample(logits, 1.0, gen)
print(f"{(time.perf_counter() - start) * 1e3:.1f} us per call")
'''),
}

EXAMPLES: dict[str, tuple[str, str]] = {
    "generate": ("Add a minimal generation example", '''"""Generate a few tokens from random prompts."""
import torch

from tinyserve.engine import Engine

engine = Engine()
prompts = torch.randint(engine.model_config.vocab_size, (2, 16))
out = engine.generate(prompts, 8, torch.Generator().manual_seed(0))
print(out.output_ids.tolist())
'''),
    "prefix_cache": ("Add a prefix caching example", '''"""Reuse a cached shared prefix for several requests."""
import torch

from tinyserve.engine import Engine

engine = Engine()
prefix = torch.randint(engine.model_config.vocab_size, (1, 24))
cache = engine.new_cache(1)
engine.extend(prefix, cache)
suffix = torch.randint(engine.model_config.vocab_size, (4, 8))
out = engine.generate(suffix, 8, torch.Generator().manual_seed(0), cache=cache.expand(4))
print(out.output_ids.tolist())
'''),
    "multi_turn": ("Add a multi-turn example", '''"""Two turns of a conversation sharing one KV cache."""
import torch

from tinyserve.engine import Engine

engine = Engine()
gen = torch.Generator().manual_seed(0)
first = engine.generate(torch.randint(512, (1, 16)), 8, gen)
turn2 = torch.cat([first.output_ids[:, -1:], torch.randint(512, (1, 4))], 1)
second = engine.generate(turn2, 8, gen, cache=first.cache)
print(first.output_ids.tolist(), second.output_ids.tolist())
'''),
    "custom_backend": ("Add a custom attention backend example", '''"""Register and use a custom attention backend."""
import torch

from tinyserve.attention.registry import register_backend
from tinyserve.attention.torch_native import TorchNativeBackend
from tinyserve.config import ServerArgs
from tinyserve.engine import Engine


@register_backend("my_backend")
class MyBackend(TorchNativeBackend):
    pass


engine = Engine(server_args=ServerArgs(attention_backend="my_backend", kv_cache_dtype="auto"))
out = engine.generate(torch.randint(512, (1, 8)), 4, torch.Generator().manual_seed(0))
print(out.output_ids.tolist())
'''),
}

_WORKFLOW = """name: tests
on:
  pull_request:
  push:
    branches: [main]
jobs:
  unit:
    runs-on: ubuntu-latest
    strategy:
      matrix:
        python: ["3.10", "3.11"]
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: ${{ matrix.python }}
      - run: pip install torch --index-url https://download.pytorch.org/whl/cpu
      - run: pip install -e .[dev]
      - run: pytest tests
"""

_NIGHTLY = """name: kl-nightly
on:
  schedule:
    - cron: "0 3 * * *"
jobs:
  kl:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"
      - run: pip install torch --index-url https://download.pytorch.org/whl/cpu
      - run: python -m tinyserve.kl_test --device cpu
"""

_TESTS_YML = ".github/workflows/tests.yml"
_NIGHTLY_YML = ".github/workflows/kl-nightly.yml"


def _ci_steps() -> list[tuple[str, list[tuple[str, str | None, str]]]]:
    """(subject, [(path, old or None to create, new)]) in the order they must land."""
    return [
        ("[CI] Run unit tests on pull requests", [(_TESTS_YML, None, _WORKFLOW)]),
        ("[CI] Test on Python 3.12", [(_TESTS_YML, 'python: ["3.10", "3.11"]', 'python: ["3.10", "3.11", "3.12"]')]),
        ("[CI] Cache pip downloads", [(_TESTS_YML, "          python-version: ${{ matrix.python }}\n",
                                       "          python-version: ${{ matrix.python }}\n          cache: pip\n")]),
        ("[CI] Add nightly KL accuracy job", [(_NIGHTLY_YML, None, _NIGHTLY)]),
        ("[CI] Add a timeout to the unit test job", [(_TESTS_YML, "    runs-on: ubuntu-latest\n    strategy:",
                                                      "    runs-on: ubuntu-latest\n    timeout-minutes: 20\n    strategy:")]),
        ("[CI] Bump actions/checkout to v5", [(_TESTS_YML, "actions/checkout@v4", "actions/checkout@v5"),
                                             (_NIGHTLY_YML, "actions/checkout@v4", "actions/checkout@v5")]),
        ("[CI] Run the KL nightly three times", [(_NIGHTLY_YML, "      - run: python -m tinyserve.kl_test --device cpu\n",
                                                  "      - run: for i in 1 2 3; do python -m tinyserve.kl_test --device cpu; done\n")]),
    ]


README_SECTIONS: list[tuple[str, str]] = [
    ("Installation", "```\npip install -e .\n```\n\ntinyserve needs torch >= 2.4 (CPU or CUDA)."),
    ("Configuration", "`ModelConfig` describes the model, `ServerArgs` how it is served\n"
                      "(attention backends, KV cache dtype, device)."),
    ("Attention backends", "See `docs/attention_backends.md`."),
    ("Development", "```\npip install -e .[dev]\npytest tests\n```"),
    ("Benchmarks", "Scripts live in `benchmarks/`; recent numbers in `docs/benchmarks.md`."),
    ("License", "Apache-2.0."),
]

PEOPLE: list[tuple[str, str]] = [
    ("Mei Lin", "meilin-dev"), ("Arjun Rao", "arjunr"), ("Sofia Petrova", "spetrova"),
    ("Kenji Watanabe", "kwatanabe"), ("Lena Fischer", "lfischer"), ("Diego Alvarez", "dalvarez"),
    ("Priya Natarajan", "priyan"), ("Tom Okafor", "tokafor"), ("Hannah Berg", "hberg"),
    ("Wei Zhang", "zhangwei-ml"), ("Omar Haddad", "ohaddad"), ("Julia Novak", "jnovak"),
    ("Ravi Menon", "rmenon"), ("Chloe Martin", "cmartin"), ("Yuki Tanaka", "ytanaka"),
    ("Marco Rossi", "mrossi"), ("Aisha Bello", "abello"), ("Lukas Wagner", "lwagner"),
    ("Nora Lindqvist", "nlindqvist"), ("Sam Carter", "scarter"), ("Ibrahim Kaya", "ikaya"),
    ("Elena Costa", "ecosta"), ("Jun Park", "junpark"), ("Ana Silva", "asilva"),
]

CODEOWNER_DIRS = ["/tinyserve/attention/", "/tinyserve/quant/", "/tinyserve/kv_cache.py",
                  "/tinyserve/hooks.py", "/docs/", "/benchmarks/", "/.github/"]

DEVICES = ["H200", "H100", "B200", "A100", "cpu (2 cores)"]


def insert_after_last(text: str, pattern: str, new_line: str) -> str:
    """Insert ``new_line`` after the last line matching ``pattern`` (a regex)."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if re.match(pattern, line)]
    if not hits:
        raise HistoryError(f"no line matches {pattern!r}")
    lines.insert(hits[-1] + 1, new_line)
    return "".join(lines)


def add_server_arg(tree: Tree, name: str, typ: str, default: str) -> None:
    text = tree["tinyserve/config.py"]
    head, sep, body = text.partition("class ServerArgs:")
    if not sep:
        raise HistoryError("config.py: no ServerArgs")
    body = insert_after_last(body, r"^    \w+: .+ = .+$", f"    {name}: {typ} = {default}\n")
    tree["tinyserve/config.py"] = head + sep + body


def registered_modules(tree: Tree) -> list[str]:
    line = re.search(r"^from tinyserve\.attention import (.+?)  # noqa", tree["tinyserve/attention/__init__.py"], re.M)
    if line is None:
        raise HistoryError("attention/__init__.py: no registration import")
    return [m.strip() for m in line.group(1).split(",")]


def add_backend(tree: Tree, name: str, cls: str, desc: str) -> None:
    path = f"tinyserve/attention/{name}.py"
    if path in tree:
        raise HistoryError(f"{path}: already exists")
    tree[path] = f'''"""{desc}: numerically the torch_native reference for now."""
from __future__ import annotations

from tinyserve.attention.registry import register_backend
from tinyserve.attention.torch_native import TorchNativeBackend


@register_backend("{name}")
class {cls}Backend(TorchNativeBackend):
    """{desc}."""
'''
    modules = registered_modules(tree)
    old = f"from tinyserve.attention import {', '.join(modules)}  # noqa"
    new = f"from tinyserve.attention import {', '.join(sorted(modules + [name]))}  # noqa"
    replace_once(tree, "tinyserve/attention/__init__.py", old, new)
    docs = tree["docs/attention_backends.md"]
    row = f"| `{name}`{' ' * max(1, 13 - len(name))}| yes     | yes    | {desc.lower():40s}|\n"
    tree["docs/attention_backends.md"] = insert_after_last(docs, r"^\| `", row)


_TEST_FILES: dict[str, str] = {
    "tests/test_registry.py": "from tinyserve.attention.registry import available_backends, get_backend_class\n",
    "tests/test_fp8.py": "import torch\n\nfrom tinyserve.quant.fp8 import fake_quant_per_tensor, fake_quant_static\n",
    "tests/test_kv_cache.py": "import torch\n\nfrom tinyserve.kv_cache import KVCache\n",
    "tests/test_engine.py": "import torch\n\nfrom tinyserve.engine import Engine\n",
    "tests/test_hybrid.py": (
        "from tinyserve.attention import create_backend, resolve_backend\n"
        "from tinyserve.config import ServerArgs\n"
        "from tinyserve.forward_batch import ForwardMode\n"
    ),
    "tests/test_hooks.py": "from tinyserve.attention import paged_fp8\nfrom tinyserve.hooks import get_prefill_hooks\n",
    "tests/test_sampling.py": "import torch\n\nfrom tinyserve.engine import sample\n",
    "tests/test_layers.py": (
        "import torch\n\nfrom tinyserve.config import ModelConfig\n"
        "from tinyserve.model import apply_rope, rms_norm, rope_tables\n"
    ),
    "tests/test_attention.py": "import torch\n\nfrom tinyserve.attention.base import causal_attention\n",
}


@dataclass
class Fillers:
    """Draws filler commits; all randomness comes from ``rng``."""

    rng: random.Random
    faq: list[tuple[str, str]] = field(default_factory=lambda: list(FAQ))
    docs: list[tuple[str, str, str]] = field(default_factory=lambda: list(DOCS))
    backends: list[tuple[str, str, str]] = field(default_factory=lambda: list(BACKENDS))
    server_args: list[tuple[str, str, str]] = field(default_factory=lambda: list(SERVER_ARGS))
    bench: list[str] = field(default_factory=lambda: sorted(BENCH_SCRIPTS))
    examples: list[str] = field(default_factory=lambda: sorted(EXAMPLES))
    ci: list[tuple[str, list[tuple[str, str | None, str]]]] = field(default_factory=_ci_steps)
    readme: list[tuple[str, str]] = field(default_factory=lambda: list(README_SECTIONS))
    tests_done: set[str] = field(default_factory=set)
    owners_done: set[tuple[str, str]] = field(default_factory=set)
    since_version: int = 0
    day: int = 0

    def plan_kinds(self, count: int) -> list[str]:
        """The category of each of ``count`` filler commits, shuffled."""
        finite = (["faq"] * len(self.faq) + ["docs"] * len(self.docs) + ["backend"] * len(self.backends)
                  + ["server_arg"] * len(self.server_args) + ["bench"] * len(self.bench)
                  + ["example"] * len(self.examples) + ["ci"] * len(self.ci) + ["readme"] * len(self.readme))
        finite = finite[:count]
        rest = count - len(finite)
        unlimited = self.rng.choices(
            ["tests", "bench_results", "owners", "version", "revert"],
            weights=[50, 24, 13, 9, 4], k=rest,
        )
        kinds = finite + unlimited
        self.rng.shuffle(kinds)
        return kinds

    def make(self, kind: str, tree: Tree, revertible: list[tuple[str, int, dict[str, str | None]]]) -> Change:
        """A change of ``kind``; falls back to a test when that kind has nothing left."""
        self.since_version += 1
        change = getattr(self, f"_{kind}")(tree, revertible)
        if change is None:
            change = self._tests(tree, revertible)
        return change if change is not None else self._bench_results(tree, revertible)

    def _pop(self, items: list[T]) -> T:
        return items.pop(self.rng.randrange(len(items)))

    def _faq(self, tree: Tree, _r: object) -> Change | None:
        if not self.faq:
            return None
        q, a = self._pop(self.faq)
        verb = self.rng.choice(["Add FAQ entry:", "Docs: answer", "FAQ:"])
        return Change(f"{verb} {q.rstrip('?')}", lambda t: append_text(t, "docs/faq.md", f"\n## {q}\n\n{a}\n", "# FAQ\n"),
                      revertible=True)

    def _docs(self, tree: Tree, _r: object) -> Change | None:
        if not self.docs:
            return None
        path, title, text = self._pop(self.docs)
        header = "# " + path.rsplit("/", 1)[1][:-3].replace("_", " ").capitalize() + "\n"
        verb = self.rng.choice(["Document", "Docs: explain", "Add docs on"])
        return Change(f"{verb} {title.lower()}",
                      lambda t: append_text(t, path, f"\n## {title}\n\n{text}\n", header), revertible=True)

    def _backend(self, tree: Tree, _r: object) -> Change | None:
        if not self.backends:
            return None
        name, cls, desc = self.backends.pop(0)
        return Change(f"Add {name} attention backend", lambda t: add_backend(t, name, cls, desc),
                      body=f"{desc}. Registered, not used by default.\n")

    def _server_arg(self, tree: Tree, _r: object) -> Change | None:
        if not self.server_args:
            return None
        name, typ, default = self._pop(self.server_args)
        dash = name.replace("_", "-")
        return Change(f"Add --{dash} server argument", lambda t: add_server_arg(t, name, typ, default))

    def _bench(self, tree: Tree, _r: object) -> Change | None:
        if not self.bench:
            return None
        key = self._pop(self.bench)
        subject, text = BENCH_SCRIPTS[key]
        path = f"benchmarks/bench_{key}.py"
        return Change(subject, lambda t: t.__setitem__(path, text), revertible=True)

    def _example(self, tree: Tree, _r: object) -> Change | None:
        if not self.examples:
            return None
        key = self._pop(self.examples)
        subject, text = EXAMPLES[key]
        path = f"examples/{key}.py"
        return Change(subject, lambda t: t.__setitem__(path, text), revertible=True)

    def _ci(self, tree: Tree, _r: object) -> Change | None:
        if not self.ci:
            return None
        subject, steps = self.ci.pop(0)

        def apply(t: Tree) -> None:
            for path, old, new in steps:
                if old is None:
                    t[path] = new
                else:
                    replace_once(t, path, old, new)

        return Change(subject, apply)

    def _readme(self, tree: Tree, _r: object) -> Change | None:
        if not self.readme:
            return None
        title, text = self.readme.pop(0)
        return Change(f"README: add {title.lower()} section",
                      lambda t: append_text(t, "README.md", f"\n## {title}\n\n{text}\n"), revertible=True)

    def _bench_results(self, tree: Tree, _r: object) -> Change | None:
        self.day += self.rng.randint(1, 4)
        device = self.rng.choice(DEVICES)
        batch = self.rng.choice([1, 8, 32, 64])
        cpu = device.startswith("cpu")
        tok_s = self.rng.uniform(300, 900) if cpu else self.rng.uniform(9000, 60000) * (batch / 32) ** 0.5
        row = f"| day {self.day:3d} | {device:13s} | {batch:5d} | {tok_s:10.0f} |\n"
        header = ("# Benchmarks\n\nDecode throughput of the built-in model (`benchmarks/bench_decode.py`).\n\n"
                  "| when    | device        | batch | tok/s      |\n|---------|---------------|-------|------------|\n")
        subject = self.rng.choice([f"Update benchmark numbers for {device}", f"[Benchmark] Add {device} decode results",
                                   f"Refresh {device} throughput table"])
        return Change(subject, lambda t: append_text(t, "docs/benchmarks.md", row, header), revertible=True)

    def _owners(self, tree: Tree, _r: object) -> Change | None:
        free = [(d, h) for d in CODEOWNER_DIRS for _, h in PEOPLE if (d, h) not in self.owners_done]
        if not free:
            return None
        path, handle = self.rng.choice(free)
        self.owners_done.add((path, handle))

        def apply(t: Tree) -> None:
            text = t.get(".github/CODEOWNERS", "# Reviewers requested automatically, by path.\n")
            lines = text.splitlines(keepends=True)
            for i, line in enumerate(lines):
                if line.split(" ", 1)[0] == path:
                    lines[i] = line.rstrip("\n") + f" @{handle}\n"
                    break
            else:
                lines.append(f"{path} @{handle}\n")
            t[".github/CODEOWNERS"] = "".join(lines)

        return Change(f"Add @{handle} to CODEOWNERS for {path.strip('/')}", apply)

    def _version(self, tree: Tree, _r: object) -> Change | None:
        if self.since_version < 12:
            return None
        self.since_version = 0
        m = re.search(r'__version__ = "(\d+)\.(\d+)\.(\d+)"', tree["tinyserve/version.py"])
        if m is None:
            raise HistoryError("version.py: no version")
        major, minor, patch = (int(g) for g in m.groups())
        if self.rng.random() < 0.25:
            minor, patch = minor + 1, 0
            subject = f"Release v{major}.{minor}.{patch}"
        else:
            patch += 1
            subject = f"Bump version to {major}.{minor}.{patch}"
        text = f'__version__ = "{major}.{minor}.{patch}"\n'
        return Change(subject, lambda t: t.__setitem__("tinyserve/version.py", text))

    def _revert(self, tree: Tree, revertible: list[tuple[str, int, dict[str, str | None]]]) -> Change | None:
        # The planner keeps only recent docs-like commits whose files nobody touched since.
        if not revertible:
            return None
        subject, pr, before = self.rng.choice(revertible[-15:])
        reason = self.rng.choice(["superseded by a follow-up", "numbers were from a debug build",
                                  "wrong section, will redo"])
        return Change(f'Revert "{subject} (#{pr})"', lambda t: _restore(t, before), body=f"Reverts #{pr}: {reason}\n")

    def _tests(self, tree: Tree, _r: object) -> Change | None:
        for _ in range(60):
            change = self._one_test(tree)
            if change is not None:
                return change
        return None

    def _one_test(self, tree: Tree) -> Change | None:
        kind = self.rng.choice(["registry", "fp8", "kv_cache", "engine", "hybrid", "hooks", "fp8_static", "score",
                                "sample", "rope", "norm", "attention", "expand", "registry_error"])
        if kind == "registry":
            name = self.rng.choice(["torch_native", "paged_fp8"] + [m for m in registered_modules(tree)
                                                                   if m not in ("paged_fp8", "torch_native")])
            key, path, subject = f"reg-{name}", "tests/test_registry.py", f"Test that {name} is registered"
            body = f'''

def test_{name}_is_registered():
    assert "{name}" in available_backends()
    assert get_backend_class("{name}").name == "{name}"
'''
        elif kind == "fp8":
            a, b = self.rng.choice([4, 8, 16, 33, 64]), self.rng.choice([8, 32, 100, 128])
            key, path, subject = f"fp8-{a}x{b}", "tests/test_fp8.py", f"Test FP8 per-tensor round trip on {a}x{b}"
            body = f'''

def test_fp8_per_tensor_round_trip_{a}x{b}():
    x = torch.randn({a}, {b}, generator=torch.Generator().manual_seed({a * 1000 + b}))
    y = fake_quant_per_tensor(x)
    assert y.shape == x.shape
    assert (y - x).abs().max() <= x.abs().max() / 16
'''
        elif kind == "fp8_static":
            scale = self.rng.choice([1, 2, 4, 16, 56])
            key, path, subject = f"fp8s-{scale}", "tests/test_fp8.py", f"Test static-scale FP8 rounding (scale {scale})"
            body = f'''

def test_fp8_static_scale_{scale}():
    x = torch.linspace(-4, 4, 101)
    y = fake_quant_static(x, {scale}.0)
    assert torch.allclose(y, x, rtol=0.07, atol={scale} * 2.0**-9)
'''
        elif kind == "kv_cache":
            dtype = self.rng.choice(["auto", "bf16", "fp8_e4m3"])
            length = self.rng.choice([1, 3, 7, 16])
            rtol = {"auto": "0.0", "bf16": "0.01", "fp8_e4m3": "0.07"}[dtype]
            key, path = f"kv-{dtype}-{length}", "tests/test_kv_cache.py"
            subject = f"Test {dtype} KV cache writes of {length} token{'s' if length > 1 else ''}"
            body = f'''

def test_kv_cache_{dtype}_round_trip_{length}():
    cache = KVCache(2, 3, 2, 8, 32, "{dtype}", "cpu")
    k = torch.randn(3, 2, {length}, 8, generator=torch.Generator().manual_seed({length}))
    cache.write(1, 4, k, -k)
    k2, v2 = cache.read(1, 4 + {length})
    assert torch.allclose(k2[:, :, 4:], k, rtol={rtol}, atol=2.0**-9)
    assert torch.allclose(v2[:, :, 4:], -k, rtol={rtol}, atol=2.0**-9)
'''
        elif kind == "engine":
            seed = self.rng.choice([0, 1, 7, 42, 123, 2024, 31337])
            key, path, subject = f"eng-{seed}", "tests/test_engine.py", f"Test that generation is reproducible (seed {seed})"
            body = f'''

def test_generate_is_reproducible_{seed}():
    engine = Engine()
    prompts = torch.randint(engine.model_config.vocab_size, (2, 8), generator=torch.Generator().manual_seed({seed}))
    a = engine.generate(prompts, 4, torch.Generator().manual_seed({seed}))
    b = engine.generate(prompts, 4, torch.Generator().manual_seed({seed}))
    assert torch.equal(a.output_ids, b.output_ids)
    assert torch.equal(a.output_logprobs, b.output_logprobs)
'''
        elif kind == "hybrid":
            key, path, subject = "hybrid", "tests/test_hybrid.py", "Test hybrid backend resolution per forward mode"
            body = '''

def test_hybrid_resolves_per_mode():
    backend = create_backend(ServerArgs())
    assert resolve_backend(backend, ForwardMode.EXTEND).name == "torch_native"
    assert resolve_backend(backend, ForwardMode.DECODE).name == "paged_fp8"
'''
        elif kind == "score":
            length, start = self.rng.choice([4, 9, 16, 33]), self.rng.choice([1, 2, 3])
            key, path, subject = f"score-{length}-{start}", "tests/test_engine.py", f"Test score() shapes ({length} tokens from {start})"
            body = f'''

def test_score_shape_{length}_from_{start}():
    engine = Engine()
    ids = torch.randint(engine.model_config.vocab_size, (2, {length}), generator=torch.Generator().manual_seed({length}))
    logprobs = engine.score(ids, {start})
    assert logprobs.shape == (2, {length - start})
    assert bool((logprobs <= 0).all())
'''
        elif kind == "sample":
            temp = self.rng.choice(["0.5", "0.7", "1.0", "1.3", "2.0"])
            key, path, subject = f"sample-{temp}", "tests/test_sampling.py", f"Test sampling at temperature {temp}"
            body = f'''

def test_sample_temperature_{temp.replace(".", "_")}():
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    token, logprob = sample(logits, {temp}, torch.Generator().manual_seed(4))
    assert token.shape == (4,) and bool((token < 64).all())
    assert bool((logprob <= 0).all())
'''
        elif kind == "rope":
            pos = self.rng.choice([1, 17, 100, 500])
            key, path, subject = f"rope-{pos}", "tests/test_layers.py", f"Test that RoPE preserves norms at position {pos}"
            body = f'''

def test_rope_preserves_norm_at_{pos}():
    cos, sin = rope_tables(ModelConfig(), torch.device("cpu"))
    x = torch.randn(1, 2, 1, ModelConfig().head_dim)
    y = apply_rope(x, cos[{pos}:{pos + 1}], sin[{pos}:{pos + 1}])
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
'''
        elif kind == "norm":
            dim = self.rng.choice([8, 64, 128, 300])
            key, path, subject = f"norm-{dim}", "tests/test_layers.py", f"Test rms_norm output scale (dim {dim})"
            body = f'''

def test_rms_norm_unit_rms_{dim}():
    x = torch.randn(3, {dim}) * 7
    y = rms_norm(x, torch.ones({dim}))
    assert torch.allclose(y.pow(2).mean(-1), torch.ones(3), atol=1e-3)
'''
        elif kind == "attention":
            t = self.rng.choice([2, 5, 8, 13])
            key, path, subject = f"attn-{t}", "tests/test_attention.py", f"Test causal attention against a naive loop ({t} tokens)"
            body = f'''

def test_causal_attention_matches_naive_{t}():
    q, k, v = torch.randn(3, 1, 2, {t}, 8).unbind(0)
    out = causal_attention(q, k, v, 0)
    for i in range({t}):
        w = torch.softmax(q[:, :, i : i + 1] @ k[:, :, : i + 1].transpose(-1, -2) / 8**0.5, -1)
        assert torch.allclose(out[:, :, i : i + 1], w @ v[:, :, : i + 1], atol=1e-5)
'''
        elif kind == "expand":
            batch = self.rng.choice([2, 3, 8])
            key, path, subject = f"expand-{batch}", "tests/test_kv_cache.py", f"Test KVCache.expand to {batch} rows"
            body = f'''

def test_kv_cache_expand_{batch}():
    cache = KVCache(1, 1, 2, 8, 16, "auto", "cpu")
    k = torch.randn(1, 2, 5, 8)
    cache.write(0, 0, k, k)
    cache.length = 5
    wide = cache.expand({batch})
    assert wide.batch == {batch} and wide.length == 5
    assert torch.equal(wide.read(0, 5)[0], k.expand({batch}, -1, -1, -1))
'''
        elif kind == "registry_error":
            key, path, subject = "reg-error", "tests/test_registry.py", "Test the error for an unknown attention backend"
            body = '''

def test_unknown_backend_is_an_error():
    try:
        get_backend_class("no_such_backend")
    except ValueError as exc:
        assert "no_such_backend" in str(exc)
    else:
        raise AssertionError("expected ValueError")
'''
        else:
            key, path, subject = "hooks", "tests/test_hooks.py", "Test that paged_fp8 registers its FP8 Q/K/V hook"
            body = '''

def test_paged_fp8_has_qkv_hook():
    assert paged_fp8.fp8_qkv_quant_hook in get_prefill_hooks("paged_fp8")
    assert get_prefill_hooks("torch_native") == []
'''
        if key in self.tests_done:
            return None
        self.tests_done.add(key)
        header = _TEST_FILES[path]
        subject = self.rng.choice(["", "", "", "[Test] ", "tests: "]) + subject
        return Change(subject, lambda t: append_text(t, path, body, header))


def _restore(tree: Tree, before: dict[str, str | None]) -> None:
    for path, text in before.items():
        if text is None:
            tree.pop(path, None)
        else:
            tree[path] = text
