"""KL accuracy test: decode-time logprobs against a cold prefill of the same tokens.

Measured as SGLang's KL tests do: sample with the KV cache at temperature 1,
replay prompt + output as one cold prefill, and per sampled token take the k3
estimator ``(exp(logr) - 1) - logr`` with ``logr = prefill_logprob -
decode_logprob``; mean per sequence, then over sequences. Prompts are fresh
random tokens on every run (``--seed`` pins them), so the value is noisy.

    python -m tinyserve.kl_test [--device cpu|cuda] [--seed N] [unittest args]

Prints, per label, ``[label] ...``, ``kl_divs=[...]`` and ``avg_kl_div=...``,
then fails the label's test if avg_kl_div >= the threshold.
"""
from __future__ import annotations

import argparse
import os
import sys
import unittest
from dataclasses import dataclass

import torch

from tinyserve.config import ServerArgs
from tinyserve.engine import Engine

KL_THRESHOLD = 0.01
LABELS = ("logprobs_match", "prefill_cache_hit", "decode_cache_hit")


@dataclass
class Options:
    device: str = os.environ.get("TINYSERVE_DEVICE", "cpu")
    seed: int | None = None
    num_samples: int = 8
    max_new_tokens: int = 48
    prompt_len: int = 32
    threshold: float = KL_THRESHOLD


OPTIONS = Options()


def k3(replay_logprobs: torch.Tensor, decode_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean of the k3 KL estimator over the sampled tokens."""
    logr = replay_logprobs.double() - decode_logprobs.double()
    return (torch.expm1(logr) - logr).mean(dim=1)


def run_label(engine: Engine, label: str, seed: int, opts: Options) -> list[float]:
    """Generate, replay cold, and return one KL value per sequence."""
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.model_config.vocab_size
    n, new = opts.num_samples, opts.max_new_tokens
    if label == "logprobs_match":
        prompts = torch.randint(vocab, (n, opts.prompt_len), generator=gen)
        out = engine.generate(prompts, new, gen)
        full = torch.cat([prompts, out.output_ids], 1)
    elif label == "prefill_cache_hit":
        # A shared prefix (a "system prompt") is cached first; each request only
        # prefills its own suffix on top of it.
        shared = opts.prompt_len * 3 // 4
        prefix = torch.randint(vocab, (1, shared), generator=gen)
        suffix = torch.randint(vocab, (n, opts.prompt_len - shared), generator=gen)
        warm = engine.new_cache(1)
        engine.extend(prefix, warm)
        out = engine.generate(suffix, new, gen, cache=warm.expand(n))
        full = torch.cat([prefix.expand(n, -1), suffix, out.output_ids], 1)
    elif label == "decode_cache_hit":
        # Turn two reuses the cache of turn one, including its decoded tokens.
        prompts = torch.randint(vocab, (n, opts.prompt_len // 2), generator=gen)
        first = engine.generate(prompts, new // 4, gen)
        user = torch.randint(vocab, (n, 8), generator=gen)
        turn2 = torch.cat([first.output_ids[:, -1:], user], 1)
        out = engine.generate(turn2, new, gen, cache=first.cache)
        full = torch.cat([prompts, first.output_ids, user, out.output_ids], 1)
    else:
        raise ValueError(f"unknown label {label!r}")
    replay = engine.score(full, full.shape[1] - new)
    return k3(replay, out.output_logprobs).tolist()


def describe(label: str, opts: Options, seed: int) -> str:
    turns = 2 if label == "decode_cache_hit" else 1
    return (
        f"[{label}] {opts.num_samples} samples, {turns} turn{'s' if turns > 1 else ''}, "
        f"{opts.max_new_tokens} new tokens, "
        f"temperature 1.0, device {opts.device}, seed {seed}"
    )


class TestKLAccuracy(unittest.TestCase):
    engine: Engine
    seed: int

    @classmethod
    def setUpClass(cls) -> None:
        cls.engine = Engine(server_args=ServerArgs(device=OPTIONS.device))
        cls.seed = OPTIONS.seed if OPTIONS.seed is not None else int.from_bytes(os.urandom(4), "little")

    def check_label(self, label: str) -> None:
        seed = self.seed + 1000003 * LABELS.index(label)
        kl_divs = run_label(self.engine, label, seed, OPTIONS)
        avg_kl_div = sum(kl_divs) / len(kl_divs)
        print(describe(label, OPTIONS, self.seed))
        print("kl_divs=[" + ", ".join(f"{x:.5f}" for x in kl_divs) + "]")
        print(f"avg_kl_div={avg_kl_div:.6f}", flush=True)
        self.assertLess(avg_kl_div, OPTIONS.threshold)

    def test_logprobs_match(self) -> None:
        self.check_label("logprobs_match")

    def test_prefill_cache_hit(self) -> None:
        self.check_label("prefill_cache_hit")

    def test_decode_cache_hit(self) -> None:
        self.check_label("decode_cache_hit")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=OPTIONS.device, help="cpu, cuda, cuda:N (env TINYSERVE_DEVICE)")
    parser.add_argument("--seed", type=int, default=None, help="pin the prompts and sampling")
    parser.add_argument("--num-samples", type=int, default=OPTIONS.num_samples)
    parser.add_argument("--max-new-tokens", type=int, default=OPTIONS.max_new_tokens)
    parser.add_argument("--threshold", type=float, default=OPTIONS.threshold)
    parser.add_argument(
        "--threads", type=int, default=int(os.environ.get("TINYSERVE_THREADS", "1")),
        help="torch CPU threads (env TINYSERVE_THREADS)",
    )
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    OPTIONS.device, OPTIONS.seed, OPTIONS.threshold = args.device, args.seed, args.threshold
    OPTIONS.num_samples, OPTIONS.max_new_tokens = args.num_samples, args.max_new_tokens
    torch.set_num_threads(max(1, args.threads))
    unittest.main(module=__name__, argv=[sys.argv[0], *rest])


if __name__ == "__main__":
    main()
