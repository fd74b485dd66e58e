"""SGLang probe, builder helpers and GitHub client, against a fake SGLang.

The fake server (tests/fakesglang/) speaks SGLang's native HTTP API over
loopback and runs a tiny torch model on CPU; the generated history
(tests/sglang_repo.py) plants an FP8 prefill change that doubles the KL.
"""
from __future__ import annotations

import _thread
import dataclasses
import importlib.util
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from klbisect import github
from klbisect.cli import cli as cli_main
from klbisect.errors import EXIT_USAGE, KlbisectError
from klbisect.runs import cut_short
from klbisect.metric import parse_values
from klbisect.probe import Slot
from klbisect.sglang import (
    KERNEL_NOTE, LABELS, Client, LabelResult, ProtocolError, SGLangBuilder, SGLangProbe, SGLangServer, _port_free,
    avg_kl, build_commands, classify_changes, generate_payload, interleave_order, k3_kl, kernel_note, load_prompts,
    make_prompts, multiturn_plan,
    parse_pins, pick_port, pins_to_install, server_argv, server_env,
)


def _load_helper():
    # by path: works whether or not tests/ is a package
    spec = importlib.util.spec_from_file_location("sglang_repo", Path(__file__).with_name("sglang_repo.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sglang_repo"] = mod
    spec.loader.exec_module(mod)
    return mod


make_sglang_repo = _load_helper().make_sglang_repo

# GenerateReqInput fields, copied from sgl-project/sglang
# python/sglang/srt/managers/io_struct.py (only the stable ones a probe may send).
GENERATE_REQ_FIELDS = {
    "rid", "text", "input_ids", "input_embeds", "image_data", "sampling_params", "return_logprob",
    "logprob_start_len", "top_logprobs_num", "token_ids_logprob", "return_text_in_logprobs", "stream",
    "log_metrics", "return_hidden_states", "modalities", "session_params", "lora_path",
    "custom_logit_processor", "bootstrap_host", "bootstrap_port", "bootstrap_room", "priority",
}
# SamplingParams fields, from python/sglang/srt/sampling/sampling_params.py
SAMPLING_PARAMS_FIELDS = {
    "max_new_tokens", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "custom_params", "stream_interval",
    "logit_bias", "sampling_seed",
}

# ---------------------------------------------------------------------------
# (a) pure helpers
# ---------------------------------------------------------------------------

PYPROJECT_OLD = '''
[project.optional-dependencies]
srt = [
    "sglang[runtime_common]",
    "sgl-kernel==0.3.7",
    "torch==2.8.0",
    "flashinfer_python==0.3.0rc1",
]
blackwell = ["sglang[runtime_common]", "sgl-kernel", "flashinfer_python==0.3.0rc1"]
'''
PYPROJECT_NEW = '''
dependencies = [
    "sglang-kernel==0.4.4 ; platform_machine == 'x86_64'",
    "flashinfer-python[cu13]==0.6.1",
    "torch==2.9.1",
]
'''


def test_parse_pins_across_renames():
    assert parse_pins(PYPROJECT_OLD) == {"sgl-kernel": "0.3.7", "flashinfer-python": "0.3.0rc1"}
    assert parse_pins(PYPROJECT_NEW) == {"sglang-kernel": "0.4.4", "flashinfer-python": "0.6.1"}
    assert parse_pins('dependencies = ["sgl-kernel>=0.3", "requests"]') == {}


def test_pins_to_install_and_commands():
    pins = {"sglang-kernel": "0.4.4", "flashinfer-python": "0.6.1"}
    assert pins_to_install({"sglang-kernel": "0.4.4", "flashinfer-python": None}, pins) == {
        "flashinfer-python": "0.6.1"}
    assert pins_to_install(pins, pins) == {}
    cmds = build_commands("/py", {"sglang-kernel": "0.4.4"}, ("--extra-index-url", "https://x"))
    assert cmds == [
        ["/py", "-m", "pip", "install", "--no-deps", "--extra-index-url", "https://x", "sglang-kernel==0.4.4"],
        ["/py", "-m", "pip", "install", "--no-deps", "--extra-index-url", "https://x", "-e", "python"],
    ]


def test_server_info_under_its_new_name_and_its_old():
    """/get_server_info is deprecated for /server_info (a reviewer's, from
    SGLang's http_server.py): once it goes, a disabled radix cache would
    no longer be seen. Commits before the rename have only the old name."""
    from conftest import fake_github
    for served in ("/server_info", "/get_server_info"):
        with fake_github(404, b'{"detail": "Not Found"}', routes={served: (200, b'{"disable_radix_cache": true}')}) \
                as (url, _):
            assert Client(url).server_info() == {"disable_radix_cache": True}


def test_changed_path_classification_and_kernel_note():
    kinds = classify_changes(["python/pyproject.toml", "sgl-kernel/csrc/attn.cu", "python/sglang/srt/x.py",
                              "docs/a.md", "python/sglang/srt/native/lib.rs"])
    assert kinds.packaging == ["python/pyproject.toml", "python/sglang/srt/native/lib.rs"]
    assert kinds.kernel_sources == ["sgl-kernel/csrc/attn.cu"]
    # a reviewer's, from SGLang's tree: the Rust extensions setup.py builds from ../rust (the radix
    # tree's core), and the kernel wheel's sources where they moved
    kinds = classify_changes(["rust/mem-cache/src/unified_tree_core.rs", "proto/sglang/api.proto",
                              "python/sglang/kernels/aot/csrc/attention/merge_attn_states.cu",
                              "python/sglang/kernels/aot/pyproject.toml"])
    assert kinds.packaging == ["rust/mem-cache/src/unified_tree_core.rs", "proto/sglang/api.proto"]
    assert kinds.kernel_sources == ["python/sglang/kernels/aot/csrc/attention/merge_attn_states.cu",
                                    "python/sglang/kernels/aot/pyproject.toml"]
    assert SGLangBuilder().needs_build(["rust/mem-cache/src/unified_tree_core.rs"])
    assert kernel_note(["sgl-kernel/csrc/attn.cu", "sgl-kernel/CMakeLists.txt"], False) == KERNEL_NOTE
    assert kernel_note(["sgl-kernel/csrc/attn.cu"], True) == ""
    assert kernel_note(["sgl-kernel/csrc/attn.cu", "python/sglang/a.py"], False).startswith(KERNEL_NOTE)
    assert kernel_note(["python/sglang/a.py"], False) == ""
    b = SGLangBuilder()
    assert b.needs_build(None) and b.needs_build(["python/pyproject.toml"])
    assert not b.needs_build(["python/sglang/srt/server.py", "sgl-kernel/csrc/attn.cu", "docs/x.md"])


def test_builder_runs_pins_then_editable(tmp_path):
    # A stand-in interpreter that records its argv and reports nothing installed.
    fake_py = tmp_path / "py"
    record = tmp_path / "argv.txt"
    fake_py.write_text(f"#!{sys.executable}\nimport json, sys\n"
                       f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + chr(10))\n"
                       "print('{}')\n")
    fake_py.chmod(0o755)
    checkout = tmp_path / "co"
    (checkout / "python").mkdir(parents=True)
    (checkout / "python" / "pyproject.toml").write_text(PYPROJECT_NEW)
    res = SGLangBuilder(python=str(fake_py)).build(checkout, tmp_path / "build.log", Slot(0, checkout))
    assert res.ok, Path(res.log_path).read_text()
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls[0][0] == "-c" and calls[0][2:] == ["sglang"]   # where sglang came from, before any change
    assert calls[1][0] == "-c" and calls[1][2:] == ["sglang-kernel", "flashinfer-python"]  # versions query
    assert calls[2:] == [["-m", "pip", "install", "--no-deps", "flashinfer-python==0.6.1"],
                         ["-m", "pip", "install", "--no-deps", "sglang-kernel==0.4.4"],
                         ["-m", "pip", "install", "--no-deps", "-e", "python"]]
    assert "installed sglang-kernel==0.4.4" in res.note


def test_parallel_slots_take_turns_at_pip_in_their_one_python(tmp_path):
    """A reviewer's: two slots building at once ran two `pip install -e
    python` into the one Python; they remove and write the same dist-info
    and one failed now and then (3 of 40), an endpoint's failure ending the
    bisect. Each pip here records when it ran: none may overlap another."""
    fake_py = tmp_path / "py"
    record = tmp_path / "spans.txt"
    fake_py.write_text(f"#!{sys.executable}\nimport json, sys, time\n"
                       "if sys.argv[1] == '-c':\n    print('{}'); sys.exit(0)\n"
                       "start = time.time(); time.sleep(0.3)\n"
                       f"open({str(record)!r}, 'a').write(json.dumps([start, time.time()]) + chr(10))\n")
    fake_py.chmod(0o755)
    builder = SGLangBuilder(python=str(fake_py))
    results = []

    def build(k: int) -> None:
        checkout = tmp_path / f"co{k}"
        (checkout / "python").mkdir(parents=True)
        (checkout / "python" / "pyproject.toml").write_text(PYPROJECT_NEW)
        results.append(builder.build(checkout, tmp_path / f"build{k}.log", Slot(k, checkout)))

    threads = [threading.Thread(target=build, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.ok for r in results), [Path(r.log_path).read_text() for r in results]
    spans = sorted(json.loads(line) for line in record.read_text().splitlines())
    assert len(spans) == 9                                      # two pins and the package, three slots
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans


def test_a_slot_halted_by_ctrl_c_launches_no_server(tmp_path):
    """A reviewer's: Ctrl-C while a slot was still checking out its commit
    killed nothing of that slot's (it ran nothing yet), and the slot went
    on to launch its server, loading a model on its GPUs for minutes after
    klbisect had begun to stop. A halted slot launches none, and one halted
    while its server starts stops waiting for it."""
    from klbisect import proc as klbproc
    tag = uuid.uuid4().hex
    argv = [sys.executable, "-c", "import sys, time; time.sleep(300)", tag]
    got = {}

    def slot(go: threading.Event, halted_at_start: bool) -> None:
        go.wait()
        server = SGLangServer(argv, tmp_path, klbproc.child_environ(), 1, tmp_path / f"s{halted_at_start}.log",
                              launch_timeout=30)
        t0 = time.monotonic()
        try:
            server.start()
            got[halted_at_start] = "started"
        except KeyboardInterrupt:
            got[halted_at_start] = f"stopped after {time.monotonic() - t0:.1f} s"
        finally:
            server.stop()

    early, late = threading.Event(), threading.Event()
    threads = [threading.Thread(target=slot, args=(early, True)), threading.Thread(target=slot, args=(late, False))]
    for t in threads:
        t.start()
    late.set()
    time.sleep(1.0)                   # the second slot's server is starting
    klbproc.kill_all_active()         # what a Ctrl-C does to the slots
    early.set()
    for t in threads:
        t.join(60)
    assert got[True].startswith("stopped after 0."), got
    assert got[False].startswith("stopped"), got
    assert not [p for p in psutil.process_iter(["cmdline"]) if tag in (p.info["cmdline"] or [])]


def test_an_interrupted_restore_names_everything_still_to_put_back(tmp_path, capsys):
    """A tester's Ctrl-C while the session put the interpreter back said
    "put back to no sglang (it now has no sglang)": the pinned wheel that
    had changed (flashinfer-python) was what was left to put back."""
    from klbisect.sglang import InstallOrigin, _Before
    fake_py = tmp_path / "py"
    fake_py.write_text(f"#!{sys.executable}\nimport json, sys\n"
                       "print(json.dumps({n: '0.2.9' for n in sys.argv[2:]}) if 'flashinfer-python' in sys.argv "
                       "else '{}')\n")
    fake_py.chmod(0o755)
    builder = SGLangBuilder(python=str(fake_py))

    def interrupted(*args, **kw):
        raise KeyboardInterrupt
    builder._run = interrupted
    before = _Before(InstallOrigin(None), tmp_path, {"flashinfer-python": None})
    with pytest.raises(KeyboardInterrupt):
        builder._restore(before)
    err = capsys.readouterr().err
    assert "interrupted before" in err and "no flashinfer-python" in err and "it now has" not in err, err


def test_ctrl_c_while_a_server_stops_kills_it_at_once_and_says_nothing_at_exit(tmp_path):
    """A tester's Ctrl-C just after a `klbisect probe` verdict landed in the
    server's stop at interpreter exit: "Exception ignored in atexit
    callback" and a traceback, and the stop's grace cut short before its
    SIGKILL. Now a Ctrl-C there kills the tree at once, and the exit hook
    stays quiet."""
    from klbisect import proc as klbproc
    from klbisect.sglang import _LIVE, _stop_all
    stubborn = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "time.sleep(300)"]

    def launched() -> SGLangServer:
        server = SGLangServer(stubborn, tmp_path, klbproc.child_environ(), 1, tmp_path / "s.log")
        server.proc = subprocess.Popen(stubborn, preexec_fn=klbproc._child_setup)
        time.sleep(0.3)
        return server

    with klbproc.interrupt_on_stop_signals():
        server = launched()
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            server.stop()
        assert time.monotonic() - t0 < 4.0 and server.proc.poll() is not None   # not the whole 5 s grace
        klbproc._signalled.clear()
        server = launched()
        _LIVE.add(server)
        threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        _stop_all()                                                    # no exception escapes the exit hook
        assert server.proc.poll() is not None
        klbproc._signalled.clear()


def test_k3_matches_sglang_formula():
    assert k3_kl([-1.0, -2.0], [-1.0, -2.0]) == 0.0
    r = math.log(2.0)
    assert k3_kl([r - 1.0], [-1.0]) == pytest.approx(1.0 - r)       # (e^r - 1) - r
    assert k3_kl([-1.0, -1.0], [-1.0 + r, -1.0 - r]) == pytest.approx(((0.5 - 1 + r) + (2 - 1 - r)) / 2)
    assert avg_kl([0.002, 0.004]) == pytest.approx(0.003)
    with pytest.raises(ValueError):
        k3_kl([-1.0], [])


def test_label_lines_parse_like_sglang_output():
    text = "\n".join(LabelResult("prefill_cache_hit", [0.003, 0.005], 3, 1, "cache hits 2/3").lines(64)
                     + LabelResult("decode_cache_hit", [], 3, 2, "too few").lines(64)
                     + LabelResult("logprobs_match", [0.001], 1, 1).lines(64))
    assert parse_values(text) == {"prefill_cache_hit": pytest.approx(0.004), "logprobs_match": 0.001}


@pytest.mark.parametrize("content, fragment", [
    (None, "cannot read"),
    ("{not json", "is not JSON"),
    ("{}", "non-empty JSON list"),
    ("[]", "non-empty JSON list"),
    ('[[1, 2], ["a"]]', "item 1"),
    ("[[1, true]]", "item 0"),
    ("[[1, -2]]", "item 0"),
    ("[[]]", "item 0"),
])
def test_load_prompts_rejects_with_one_line(tmp_path, content, fragment):
    p = tmp_path / "prompts.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(KlbisectError) as e:
        load_prompts(p)
    assert e.value.code == EXIT_USAGE and fragment in e.value.message and "\n" not in e.value.message


def test_load_prompts_ok(tmp_path):
    p = tmp_path / "prompts.json"
    p.write_text("[[1, 2, 3], [4]]")
    assert load_prompts(p) == [[1, 2, 3], [4]]


def test_make_prompts_asks_for_trust_remote_code_where_the_tokenizer_ships_code(tmp_path, monkeypatch):
    """Kimi's tokenizer is code of its own: transformers refuses it unless told,
    and the KL tests' get_input_ids passes trust_remote_code=True."""
    def load(path, trust_remote_code=False):
        if not trust_remote_code:
            raise ValueError(f"The repository for {path} contains custom code which must be executed to correctly "
                             "load the model. Please pass the argument `trust_remote_code=True`.")
        return type("Tok", (), {"encode": lambda self, text, add_special_tokens=True: [7, 8]})()

    fake = type(sys)("transformers")
    fake.AutoTokenizer = type("AutoTokenizer", (), {"from_pretrained": staticmethod(load)})
    monkeypatch.setitem(sys.modules, "transformers", fake)
    text = tmp_path / "book.txt"
    text.write_text("words")
    with pytest.raises(KlbisectError, match="add --trust-remote-code") as e:
        make_prompts(text, "moonshotai/Kimi", tmp_path / "p.json", num_samples=1, max_tokens=8)
    assert e.value.code == EXIT_USAGE
    assert make_prompts(text, "moonshotai/Kimi", tmp_path / "p.json", num_samples=1, max_tokens=8,
                        trust_remote_code=True) == (1, [7, 8])


def test_make_prompts_with_a_stand_in_tokenizer(tmp_path, monkeypatch):
    class Tok:
        def encode(self, text, add_special_tokens=True):
            return ([1] if add_special_tokens else []) + [len(w) for w in text.split()]

    fake = type(sys)("transformers")
    fake.AutoTokenizer = type("AutoTokenizer", (), {"from_pretrained": staticmethod(
        lambda path, trust_remote_code=False: Tok())})
    monkeypatch.setitem(sys.modules, "transformers", fake)
    text = tmp_path / "book.txt"
    text.write_text("a bb ccc dddd " * 5)
    assert make_prompts(text, "tok", tmp_path / "p.json", num_samples=3, max_tokens=8) == (3, [1, 1])
    assert load_prompts(tmp_path / "p.json") == [[1, 2, 3, 4] * 2, [1, 2, 3, 4] * 2, [1, 2, 3, 4]]
    jl = tmp_path / "lb.jsonl"
    jl.write_text(json.dumps({"context": "x yy", "question": "zzz"}) + "\n\n" + json.dumps({"text": "q"}) + "\n")
    assert make_prompts(jl, "tok", tmp_path / "q.json", num_samples=5, max_tokens=3) == (2, [1, 1])
    assert load_prompts(tmp_path / "q.json") == [[1, 1, 2], [1, 1]]


@pytest.mark.parametrize("url, slug", [
    ("https://github.com/sgl-project/sglang.git", "sgl-project/sglang"),
    ("https://github.com/sgl-project/sglang", "sgl-project/sglang"),
    ("git@github.com:sgl-project/sglang.git", "sgl-project/sglang"),
    ("ssh://git@github.com/sgl-project/sglang.git", "sgl-project/sglang"),
    ("https://x-access-token:abc@github.com/o/r.git", "o/r"),
    ("https://gitlab.com/o/r.git", None),
    ("https://github.com/o", None),
    ("", None),
])
def test_parse_slug(url, slug):
    assert github.parse_slug(url) == slug


def test_server_command_and_env(tmp_path):
    argv = server_argv("/py", "org/model", 31000, ["--tp-size", "2"])
    assert argv == ["/py", "-m", "sglang.launch_server", "--model-path", "org/model", "--host", "127.0.0.1",
                    "--port", "31000", "--tp-size", "2"]
    env = server_env(tmp_path, {"CUDA_VISIBLE_DEVICES": "1"}, base={"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"] == f"{tmp_path.resolve()}/python:/elsewhere"
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_probe_options_and_key(tmp_path):
    prompts = tmp_path / "p.json"
    prompts.write_text("[[1, 2]]")
    opts = {"model_path": "m", "prompts": str(prompts), "runs_per_launch": 2, "labels": "logprobs_match"}
    p = SGLangProbe.from_options(opts, timeout=99)
    assert (p.runs_per_launch, p.labels, p.timeout) == (2, ("logprobs_match",), 99)
    assert p.key == SGLangProbe.from_options({**opts, "runs_per_launch": 5}).key   # same measurement
    assert p.key != SGLangProbe.from_options({**opts, "server_args": "--tp 2"}).key
    with pytest.raises(KlbisectError, match="--prompts"):
        SGLangProbe.from_options({"model_path": "m"})
    with pytest.raises(KlbisectError, match="may not set --port"):
        SGLangProbe(model_path="m", prompts=prompts, server_args="--tp 2 --port=3000")
    with pytest.raises(KlbisectError, match="unknown SGLang label"):
        SGLangProbe(model_path="m", prompts=prompts, labels=("kl",))


def test_the_multiturn_flow_sends_what_the_unified_radix_kit_sends():
    """The kit's shape (unified_radix_cache_kit.py): logprobs_match on the
    first four prompts; three groups of three branches over each prompt's
    first 512 tokens; turn suffixes of 512 and 256 random ids, drawn as the
    kit draws them, so the same ids as the test's."""
    prompts = [[g * 1000 + t for t in range(600)] for g in range(5)]
    lm = multiturn_plan("logprobs_match", prompts)
    assert lm.first == prompts[:4] and lm.seed_prefixes is None and lm.order is None
    assert [[len(s) for s in turn] for turn in lm.suffixes] == [[512] * 4, [256] * 4]
    # random.Random(100).randint(1, 30000) is 4774 on every CPython: the test's first suffix id
    assert lm.suffixes[0][0][0] == 4774 and lm.suffixes == multiturn_plan("logprobs_match", prompts).suffixes
    pc = multiturn_plan("prefill_cache_hit", prompts)
    assert pc.seed_prefixes == [prompts[g][:512] for g in range(3) for _ in range(3)]
    assert [len(f) - 512 for f in pc.first] == [256, 320, 384] * 3
    assert all(f[:512] == p for f, p in zip(pc.first, pc.seed_prefixes))
    assert pc.first[0][512] == 24518        # random.Random(456)'s first draw, the kit's branch seed
    assert pc.order == [0, 3, 6, 1, 4, 7, 2, 5, 8]
    dc = multiturn_plan("decode_cache_hit", prompts)
    assert dc.first == pc.seed_prefixes and dc.seed_prefixes is None and dc.order == pc.order
    assert dc.suffixes != pc.suffixes != lm.suffixes      # each test method has its own seeds
    assert interleave_order(10, 3) == [0, 3, 6, 1, 4, 7, 2, 5, 8, 9] and interleave_order(3, 3) is None
    short = multiturn_plan("prefill_cache_hit", prompts, prefix_len=64)      # --prefix-len
    assert short.seed_prefixes == [prompts[g][:64] for g in range(3) for _ in range(3)]
    assert short.first[0][64:] == pc.first[0][512:]


def test_multiturn_options_refuse_what_it_cannot_use(tmp_path):
    prompts = tmp_path / "p.json"
    prompts.write_text("[[1, 2], [3, 4], [5, 6]]")
    single = SGLangProbe(model_path="m", prompts=prompts)
    multi = SGLangProbe(model_path="m", prompts=prompts, kl_flow="multiturn", labels=("decode_cache_hit",))
    # runs of the two flows are never pooled; runs stored before the option keep their key
    assert multi.key != SGLangProbe(model_path="m", prompts=prompts, labels=("decode_cache_hit",)).key
    assert single.key == SGLangProbe(model_path="m", prompts=prompts, kl_flow="single").key
    assert len(multi.load()) == 3 and "multi-turn flow" in multi.describe()
    with pytest.raises(KlbisectError, match=r"needs 4 prompts .* gives 3"):
        SGLangProbe(model_path="m", prompts=prompts, kl_flow="multiturn").load()
    with pytest.raises(KlbisectError, match="--turn-separator is for --kl-flow single"):
        SGLangProbe(model_path="m", prompts=prompts, kl_flow="multiturn", turn_separator=(1,))
    with pytest.raises(KlbisectError, match="unknown --kl-flow 'multi'"):
        SGLangProbe(model_path="m", prompts=prompts, kl_flow="multi")
    with pytest.raises(KlbisectError, match="--prefix-len is for --kl-flow multiturn"):
        SGLangProbe(model_path="m", prompts=prompts, prefix_len=64)
    for kw in ({"temperature": 0.0}, {"prefix_len": 64}):
        assert multi.key != dataclasses.replace(multi, **kw).key
    assert "temperature 0" in dataclasses.replace(multi, temperature=0.0).describe()
    repo = _tiny_repo(tmp_path / "r")
    for args, fragment in ((["--kl-flow", "multiturn"], "needs 4 prompts (logprobs_match takes the first 4"),
                           (["--kl-flow", "multiturn", "--turn-separator", "11"], "--turn-separator is for"),
                           (["--kl-flow", "multi"], "--kl-flow"),
                           (["--prefix-len", "64"], "--prefix-len is for --kl-flow multiturn")):
        res = CliRunner().invoke(cli_main, ["run", "--repo", str(repo), "--good", "HEAD~1", "--bad", "HEAD",
                                            "--probe", "sglang", "--model-path", "m", "--prompts", str(prompts),
                                            *args])
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == EXIT_USAGE and len(lines) == 1 and fragment in lines[0], res.stderr


# ---------------------------------------------------------------------------
# numeric options: usage errors (exit 150) before anything runs
# ---------------------------------------------------------------------------

def _tiny_repo(path: Path) -> Path:
    path.mkdir()
    for args in (("init", "-q"), ("commit", "-q", "--allow-empty", "-m", "a"),
                 ("commit", "-q", "--allow-empty", "-m", "b")):
        subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", *args], cwd=path, check=True)
    return path


def test_more_samples_than_the_prompts_file_holds_is_a_usage_error(tmp_path):
    """A tester's --num-samples 999 of an 8-prompt file ran as "999 of
    prompts.json", its runs keyed apart from the same runs without it."""
    repo = _tiny_repo(tmp_path / "r")
    prompts = tmp_path / "p.json"
    prompts.write_text("[[1, 2, 3], [4, 5]]")
    res = CliRunner().invoke(cli_main, ["run", "--repo", str(repo), "--good", "HEAD~1", "--bad", "HEAD",
                                        "--probe", "sglang", "--model-path", "m", "--prompts", str(prompts),
                                        "--num-samples", "999"])
    assert res.exit_code == EXIT_USAGE and res.stderr.strip().splitlines() == [
        f"klbisect: error: --num-samples 999: {prompts} holds 2 prompts; give at most 2, or leave it out to use "
        "them all"], res.stderr


@pytest.mark.parametrize("command, args", [
    ("run", ["--launch-timeout", "-1"]), ("run", ["--request-timeout", "-3"]),
    ("run", ["--max-new-tokens", "-5"]), ("run", ["--max-new-tokens", "0"]),
    ("run", ["--launch-timeout", "0"]), ("run", ["--launch-timeout", "nan"]),
    ("run", ["--num-samples", "-1"]), ("run", ["--num-samples", "0"]),
    ("run", ["--runs-per-launch", "-1"]), ("run", ["--kl-threshold", "0"]),
    ("run", ["--turn-separator", "11,-1"]), ("run", ["--timeout", "inf"]), ("run", ["--temperature", "-1"]),
    ("run", ["--temperature", "nan"]), ("run", ["--prefix-len", "0"]),
    ("run", ["--gpus-per-probe", "-1"]), ("run", ["--parallel", "0"]), ("run", ["--max-total-runs", "0"]), ("run", ["--threshold", "nan"]),
    ("start", ["--max-new-tokens", "-5"]), ("calibrate", ["--launch-timeout", "-1"]),
    ("nightly", ["--request-timeout", "-3"]),
])
def test_bad_numbers_are_usage_errors_before_anything_runs(tmp_path, command, args):
    """They used to launch a server per run and end on "printed no metric
    value" (exit 154), or be replaced by a default without a word."""
    repo = _tiny_repo(tmp_path / "r")
    prompts = tmp_path / "p.json"
    prompts.write_text("[[1, 2, 3]]")
    rng = {"run": ["--good", "HEAD~1", "--bad", "HEAD"], "start": ["--good", "HEAD~1", "--bad", "HEAD"],
           "calibrate": ["--rev", "HEAD"], "nightly": []}[command]
    res = CliRunner().invoke(cli_main, [command, "--repo", str(repo), *rng, "--probe", "sglang",
                                        "--model-path", "m", "--prompts", str(prompts), *args])
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == EXIT_USAGE, res.stderr
    assert len(lines) == 1 and lines[0].startswith("klbisect: error:") and args[0] in lines[0], res.stderr
    assert not (repo / ".git" / "klbisect").exists()    # no session, no run, no server


@pytest.mark.parametrize("args", [["--num-samples", "-1"], ["--num-samples", "0"], ["--max-tokens", "0"]])
def test_make_prompts_bad_counts_are_usage_errors(tmp_path, args):
    """--num-samples -1 used to drop the last prompt without a word."""
    text = tmp_path / "t.txt"
    text.write_text("some text")
    res = CliRunner().invoke(cli_main, ["make-prompts", str(text), "--tokenizer", "x",
                                        "--out", str(tmp_path / "o.json"), *args])
    assert res.exit_code == EXIT_USAGE and args[0] in res.stderr, res.stderr
    assert not (tmp_path / "o.json").exists()


def test_probe_rejects_bad_numbers_from_any_caller(tmp_path):
    """A stored session or the API builds probes without the CLI's option types."""
    prompts = tmp_path / "p.json"
    prompts.write_text("[[1, 2]]")
    for kw, fragment in (({"max_new_tokens": -5}, "--max-new-tokens -5"), ({"num_samples": -1}, "--num-samples"),
                         ({"temperature": -0.5}, "--temperature -0.5"), ({"prefix_len": 0}, "--prefix-len 0"),
                         ({"launch_timeout": float("nan")}, "--launch-timeout"),
                         ({"request_timeout": 0}, "--request-timeout"), ({"turn_separator": (3, -1)}, "3,-1")):
        with pytest.raises(KlbisectError, match=re.escape(fragment)) as e:
            SGLangProbe(model_path="m", prompts=prompts, **kw)
        assert e.value.code == EXIT_USAGE


def test_failure_hints_name_the_option_in_use(tmp_path):
    """--build sglang has no --build-cmd to fix, --probe sglang no output for
    --metric-regex to read."""
    from klbisect.build import CommandBuilder
    from klbisect.probe import CommandProbe
    from klbisect.sglang import build_fix_hint, no_value_hint
    prompts = tmp_path / "p.json"
    prompts.write_text("[[1, 2]]")
    sglang_build, sglang_probe = SGLangBuilder().key, SGLangProbe(model_path="m", prompts=prompts).key
    assert "--build-cmd" not in build_fix_hint(sglang_build) and "--pip-args" in build_fix_hint(sglang_build)
    assert "--metric-regex" not in no_value_hint(sglang_probe) and "--model-path" in no_value_hint(sglang_probe)
    assert build_fix_hint(CommandBuilder("make").key) == "fix --build-cmd"
    assert "--metric-regex" in no_value_hint(CommandProbe("true").key)
    # a KL under another name is pointed at (a new user's "prefill avg_kl=0.0041" got the generic line)
    said = no_value_hint(CommandProbe("true").key, None, "loading\nprefill avg_kl=0.004094\n")
    assert said.startswith("its log has 'prefill avg_kl=0.004094', which is not read"), said
    assert no_value_hint(CommandProbe("true").key, None, "skills=3\n").startswith("expected avg_kl_div")


# ---------------------------------------------------------------------------
# --build sglang: the user's environment is put back at the end
# ---------------------------------------------------------------------------

def test_install_origin_from_pip_metadata():
    from klbisect.sglang import InstallOrigin, pin_restore_commands, restore_command
    O = InstallOrigin.from_metadata
    assert O(None) == InstallOrigin(None)
    editable = O({"version": "0.5.1", "direct_url": {"url": "file:///src/sg%20lang/python",
                                                     "dir_info": {"editable": True}}})
    assert editable == InstallOrigin("0.5.1", editable="/src/sg lang/python")
    vcs = O({"version": "0.5.1", "direct_url": {"url": "https://github.com/sgl-project/sglang",
                                                "vcs_info": {"vcs": "git", "commit_id": "abc"},
                                                "subdirectory": "python"}})
    assert vcs.url == "git+https://github.com/sgl-project/sglang@abc#subdirectory=python"
    wheel = O({"version": "0.5.1", "direct_url": {"url": "file:///gone/sglang-0.5.1-py3-none-any.whl",
                                                  "archive_info": {}}})
    index = O({"version": "0.5.1", "direct_url": None, "path": "/v/lib/site-packages/sglang-0.5.1.dist-info"})
    develop = O({"version": "0.5.1", "direct_url": None, "path": "/src/sglang/python/sglang.egg-info"})
    assert (index, develop.editable) == (InstallOrigin("0.5.1"), "/src/sglang/python")
    pip = ["/py", "-m", "pip"]
    assert restore_command(InstallOrigin(None), "/py") == pip + ["uninstall", "-y", "sglang"]
    assert restore_command(editable, "/py") is None                       # its directory is gone
    assert restore_command(vcs, "/py", ("-q",)) == pip + ["install", "--no-deps", "-q", "--force-reinstall",
                                                         f"sglang @ {vcs.url}"]
    # a local wheel that is gone: the same version from the index
    assert restore_command(wheel, "/py")[-2:] == ["--force-reinstall", "sglang==0.5.1"]
    assert restore_command(index, "/py")[-1] == "sglang==0.5.1"
    assert pin_restore_commands({"sglang-kernel": "0.3.1", "flashinfer-python": None, "x": "1"},
                                {"sglang-kernel": "0.3.2", "flashinfer-python": "0.6.1", "x": "1"}, "/py") == [
        pip + ["uninstall", "-y", "flashinfer-python"], pip + ["install", "--no-deps", "sglang-kernel==0.3.1"]]


# An interpreter that only pretends: it keeps "installed" state in a JSON file,
# answers klbisect's metadata queries from it and applies pip install/uninstall.
FAKE_PIP = """\
import json, os, sys
state_file, args = os.environ["FAKE_PIP_STATE"], sys.argv[1:]
st = json.load(open(state_file))
with open(state_file + ".calls", "a") as f:
    f.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_PIP_FAIL") and os.environ["FAKE_PIP_FAIL"] in args:
    sys.exit(1)
if args[0] == "-c":
    if "direct_url" in args[1]:
        print(json.dumps(st["sglang"]))
    else:
        print(json.dumps({n: st["pkgs"].get(n) for n in args[2:]}))
elif args[2] == "install":
    for i, a in enumerate(args):
        if a == "-e":
            url = "file://" + os.path.abspath(args[i + 1])
            st["sglang"] = {"version": "0.0.1", "direct_url": {"url": url, "dir_info": {"editable": True}}}
        elif "==" in a:
            name, ver = a.split("==")
            if name == "sglang":
                st["sglang"] = {"version": ver, "direct_url": None}
            else:
                st["pkgs"][name] = ver
elif args[2] == "uninstall":
    if args[-1] == "sglang":
        st["sglang"] = None
    else:
        st["pkgs"].pop(args[-1], None)
json.dump(st, open(state_file, "w"))
"""


def test_build_sglang_puts_back_pinned_wheels_and_an_index_install(tmp_path, monkeypatch):
    """A build also swaps the pinned kernel/flashinfer wheels, which the server
    checks at start-up: they go back too, and a restore that fails says how."""
    fake_py = tmp_path / "py"
    fake_py.write_text(f"#!{sys.executable}\n{FAKE_PIP}")
    fake_py.chmod(0o755)
    state = tmp_path / "state.json"
    before = {"sglang": {"version": "0.4.0", "direct_url": None,
                         "path": "/v/lib/python3/site-packages/sglang-0.4.0.dist-info"},
              "pkgs": {"sglang-kernel": "0.4.3"}}
    state.write_text(json.dumps(before))
    monkeypatch.setenv("FAKE_PIP_STATE", str(state))
    checkout = tmp_path / "co"
    (checkout / "python").mkdir(parents=True)
    (checkout / "python" / "pyproject.toml").write_text(PYPROJECT_NEW)
    for attempt in ("fails", "works"):
        builder = SGLangBuilder(python=str(fake_py))
        assert builder.build(checkout, tmp_path / "logs" / "build.log", Slot(0, checkout)).ok
        assert json.loads(state.read_text())["pkgs"] == {"sglang-kernel": "0.4.4", "flashinfer-python": "0.6.1"}
        if attempt == "fails":       # offline: the index version cannot be fetched
            monkeypatch.setenv("FAKE_PIP_FAIL", "sglang==0.4.0")
            [line] = builder.close(lambda line: None)
            assert line.startswith(f"klbisect: could not put {fake_py} back to sglang 0.4.0 from a package index")
            assert f"now has sglang 0.0.1, an editable install of {checkout / 'python'}" in line
            assert line.endswith(f"restore it with: {fake_py} -m pip uninstall -y flashinfer-python && "
                                 f"{fake_py} -m pip install --no-deps sglang-kernel==0.4.3 && "
                                 f"{fake_py} -m pip install --no-deps --force-reinstall sglang==0.4.0"), line
            monkeypatch.delenv("FAKE_PIP_FAIL")
            state.write_text(json.dumps(before))
        else:
            [line] = builder.close(lambda line: None)
            after = json.loads(state.read_text())
            assert after["pkgs"] == before["pkgs"] and after["sglang"]["version"] == "0.4.0", line
            assert after["sglang"]["direct_url"] is None                       # not an editable install
            assert line.startswith(f"klbisect: {fake_py} is back to sglang 0.4.0 from a package index; "
                                   "no flashinfer-python; sglang-kernel==0.4.3 (log: "), line


def test_pinned_wheels_a_killed_session_installed_are_put_back(tmp_path, monkeypatch):
    """A tester's kill -9 after a --build sglang build: the pinned wheels'
    earlier versions were in memory until the build was recorded, so the
    next command put sglang back and left the kernel wheels installed (or
    "restored" the killed session's). They are on disk before pip runs."""
    fake_py = tmp_path / "py"
    fake_py.write_text(f"#!{sys.executable}\n{FAKE_PIP}")
    fake_py.chmod(0o755)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"sglang": None, "pkgs": {}}))
    monkeypatch.setenv("FAKE_PIP_STATE", str(state))
    checkout = tmp_path / "co"
    (checkout / "python").mkdir(parents=True)
    (checkout / "python" / "pyproject.toml").write_text(PYPROJECT_NEW)
    logs = tmp_path / "logs" / "s1"
    first = SGLangBuilder(python=str(fake_py))
    first.remember_origin(logs)                      # as the session's start stores it
    stored = json.dumps(first.saved_origin())
    assert first.build(checkout, logs / "build.log", Slot(0, checkout)).ok
    assert json.loads(state.read_text())["pkgs"] == {"sglang-kernel": "0.4.4", "flashinfer-python": "0.6.1"}
    # killed here: the store holds what the session's start found, no pins
    nxt = SGLangBuilder(python=str(fake_py))
    nxt.adopt_origin(json.loads(stored))
    [line] = nxt.close(lambda line: None)
    assert json.loads(state.read_text()) == {"sglang": None, "pkgs": {}}, line
    assert "no flashinfer-python; no sglang-kernel" in line, line
    # a reviewer's: a file an earlier command left is not a later record's (it uninstalled the
    # wheels the user installed since)
    assert not (logs / "pins_before.json").exists()          # the restore done, the file goes
    later = SGLangBuilder(python=str(fake_py))
    later.remember_origin(logs)
    (logs / "pins_before.json").write_text(json.dumps({"token": "an-earlier-one", "pins": {"sglang-kernel": None}}))
    again = SGLangBuilder(python=str(fake_py))
    again.adopt_origin(later.saved_origin())
    assert again.saved_origin()["pins"] == {}


@pytest.fixture
def venv(tmp_path):
    """A fresh interpreter environment with pip and setuptools from this one
    (so editable installs build offline, with --no-build-isolation)."""
    v = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(v)], check=True)
    py = v / "bin" / "python"
    probe = subprocess.run([str(py), "-c", "import setuptools, importlib.util as u; "
                            "assert u.find_spec('pip') and u.find_spec('sglang') is None"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("needs pip and setuptools, and no sglang, in this interpreter's site-packages")
    return py


def _sglang_project(root: Path, where: str) -> Path:
    """A git checkout whose python/ is an installable sglang that says where it lives."""
    pkg = root / "python" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"WHERE = {where!r}\n")
    (root / "python" / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "sglang"\nversion = "0.0.1"\n[tool.setuptools]\npackages = ["sglang"]\n')
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-q", "-m", "sglang")):
        subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", *args], cwd=root, check=True)
    return root


def _where(py: Path, cwd: Path) -> str | None:
    out = subprocess.run([str(py), "-c", "import importlib.util as u\n"
                          "s = u.find_spec('sglang')\n"
                          "print(__import__('sglang').WHERE if s else None)"],
                         cwd=cwd, capture_output=True, text=True, check=True)
    return None if out.stdout.strip() == "None" else out.stdout.strip()


def _build_in_worktree(builder: SGLangBuilder, user: Path, tmp_path: Path, name: str) -> None:
    """What a session does: build a worktree, then delete it."""
    wt = tmp_path / name
    subprocess.run(["git", "-C", str(user), "worktree", "add", "-q", "--detach", str(wt), "HEAD"], check=True)
    (wt / "python" / "sglang" / "__init__.py").write_text("WHERE = 'worktree'\n")
    res = builder.build(wt, tmp_path / "logs" / f"build-{name}.log", Slot(0, wt))
    assert res.ok, Path(res.log_path).read_text()
    assert _where(builder.python, tmp_path) == "worktree"
    subprocess.run(["git", "-C", str(user), "worktree", "remove", "--force", str(wt)], check=True)


def test_build_sglang_puts_the_users_sglang_back(venv, tmp_path):
    """--build sglang `pip install -e`s each worktree into the user's
    interpreter, and the worktree is deleted when the session ends: without
    close(), `import sglang` failed afterwards."""
    user = _sglang_project(tmp_path / "mine", "user checkout")
    said: list[str] = []
    # no sglang before: none after
    builder = SGLangBuilder(python=str(venv), pip_args=("--no-build-isolation",))
    _build_in_worktree(builder, user, tmp_path, "wt1")
    lines = builder.close(said.append)
    assert _where(venv, tmp_path) is None, lines
    assert len(lines) == 1 and "is back to no sglang" in lines[0] and said == lines
    # the maintainer's own editable install: back to it, and a second close does nothing
    subprocess.run([str(venv), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                    str(user / "python")], check=True, cwd=tmp_path)
    builder = SGLangBuilder(python=str(venv), pip_args=("--no-build-isolation",))
    _build_in_worktree(builder, user, tmp_path, "wt2")
    lines = builder.close(lambda line: None)
    assert _where(venv, tmp_path) == "user checkout", lines
    assert len(lines) == 1 and f"an editable install of {user / 'python'}" in lines[0], lines
    assert builder.close(lambda line: None) == []
    # a builder that never built leaves the environment alone
    assert SGLangBuilder(python=str(venv)).close(lambda line: None) == []


def test_git_bisect_run_with_build_sglang_puts_the_environment_back_at_reset(venv, tmp_path):
    """Under `git bisect run` every `klbisect probe` is its own process and
    installs the checkout into the user's interpreter: `klbisect reset`
    puts back what the first probe found (here: no sglang at all)."""
    from conftest import child_env, klb, klbisect_script
    user = _sglang_project(tmp_path / "mine", "user checkout")
    (user / "probe.py").write_text(
        "import os, pathlib\n"
        "bad = pathlib.Path('level.txt').read_text().strip() == 'bad'\n"
        "u = int.from_bytes(os.urandom(4), 'little') / 2**32\n"
        "print('avg_kl_div=%.5f' % ((0.007 + 0.006 * u) if bad else (0.003 + 0.003 * u)))\n")
    env = child_env()
    for i in range(8):
        (user / "level.txt").write_text("bad\n" if i >= 5 else "good\n")
        (user / "python" / "sglang" / "__init__.py").write_text(f"WHERE = 'commit {i}'\n")
        subprocess.run(["git", "add", "-A"], cwd=user, check=True, env=env)
        subprocess.run(["git", "commit", "-q", "-m", f"change {i} (#{100 + i})"], cwd=user, check=True, env=env)
    good = subprocess.run(["git", "rev-parse", "HEAD~7"], cwd=user, capture_output=True, text=True,
                          check=True).stdout.strip()
    build = ["--build", "sglang", "--sglang-python", str(venv), "--pip-args", "--no-build-isolation"]
    st = klb("start", "--good", good, "--bad", "HEAD", "--probe-cmd", "python probe.py", *build, cwd=user)
    assert st.returncode == 0, st.stderr
    assert _where(venv, tmp_path) is None, st.stderr          # start put its endpoint builds back itself
    run = subprocess.run(["git", "bisect", "run", *klbisect_script(), "probe"], cwd=user, env=env,
                         capture_output=True, text=True, timeout=600)
    assert "change 5 (#105)" in run.stdout, run.stdout + run.stderr
    assert _where(venv, tmp_path) is not None                 # the probes installed the checkout
    rs = klb("reset", cwd=user)
    assert rs.returncode == 0, rs.stderr
    assert _where(venv, tmp_path) is None, rs.stdout + rs.stderr
    assert "is back to no sglang" in rs.stdout, rs.stdout
    assert "nothing to reset" in klb("reset", cwd=user).stdout


def test_an_interrupted_run_with_build_sglang_puts_back_what_it_first_found(venv, tmp_path):
    """Ctrl-C (or a kill) mid-run left the user's interpreter on a removed
    worktree, and the run that resumed took that for the original (a
    tester's: their "no sglang" was lost). What the first command found is
    in the session's store: the rerun puts that back, and so would `reset`."""
    from conftest import klb
    user = _levelled_sglang(tmp_path)
    args = ("run", "--good", "HEAD~5", "--bad", "HEAD", "--probe-cmd", "python probe.py", *_build_args(venv))
    _signalled_after_a_build(args, user, venv, tmp_path)
    # a tester's `import sglang` failed after such a kill, and status said nothing of it
    assert f"Note: {venv} has this session's --build sglang install" in klb("status", cwd=user).stdout
    again = klb(*args, cwd=user, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "is back to no sglang" in again.stderr and "no longer exists" not in again.stderr, again.stderr
    assert _where(venv, tmp_path) is None
    assert "--build sglang install" not in klb("status", cwd=user).stdout


def test_one_ctrl_c_puts_the_interpreter_back_before_exit(venv, tmp_path):
    """A tester's one Ctrl-C mid-run left the venv's sglang an editable
    install of a deleted worktree: the stop signal, still noted, refused
    the restore's first pip ("interrupted before ... was put back")."""
    user = _levelled_sglang(tmp_path)
    args = ("run", "--good", "HEAD~5", "--bad", "HEAD", "--probe-cmd", "python probe.py", *_build_args(venv))
    code, err = _signalled_after_a_build(args, user, venv, tmp_path, signal.SIGINT)
    assert code == 130 and "is back to no sglang" in err and "interrupted before" not in err, err
    assert "finished runs of this range saved" in err, err
    shown = subprocess.run([str(venv), "-m", "pip", "show", "sglang"], capture_output=True, text=True)
    assert shown.returncode != 0, shown.stdout      # not installed, as before the run


@pytest.mark.parametrize("then", ["start again", "a run with another probe command"])
def test_what_an_interrupted_session_found_is_put_back_by_the_next(venv, tmp_path, then):
    """Two ways a tester lost their sglang after a Ctrl-C: `start` kept
    nothing of what it found before its endpoint builds (`run` did), and a
    new session (the probe command fixed and run again) took the half-built
    state for the original and "restored" that."""
    from conftest import klb
    user = _levelled_sglang(tmp_path)
    ends = ("--good", "HEAD~5", "--bad", "HEAD")
    first = (("start", *ends, "--probe-cmd", "python probe.py") if then == "start again"
             else ("run", *ends, "--probe-cmd", "python probe.py"))
    _signalled_after_a_build((*first, *_build_args(venv)), user, venv, tmp_path)
    nxt = first if then == "start again" else ("run", *ends, "--probe-cmd", "python ./probe.py")
    again = klb(*nxt, *_build_args(venv), cwd=user, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "is back to no sglang" in again.stderr and "no longer exists" not in again.stderr, again.stderr
    assert _where(venv, tmp_path) is None


def _levelled_sglang(tmp_path: Path) -> Path:
    """A user's sglang checkout with six commits; the probe reads bad from the fourth on."""
    user = _sglang_project(tmp_path / "mine", "user checkout")
    (user / "probe.py").write_text(
        "import os, pathlib, time\n"
        "time.sleep(0.3)\n"
        "bad = pathlib.Path('level.txt').read_text().strip() == 'bad'\n"
        "u = int.from_bytes(os.urandom(4), 'little') / 2**32\n"
        "print('avg_kl_div=%.5f' % ((0.007 + 0.006 * u) if bad else (0.003 + 0.003 * u)))\n")
    for i in range(6):
        (user / "level.txt").write_text("bad\n" if i >= 3 else "good\n")
        (user / "python" / "sglang" / "__init__.py").write_text(f"WHERE = 'commit {i}'\n")
        for args in (("add", "-A"), ("commit", "-q", "-m", f"change {i} (#{100 + i})")):
            subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", *args], cwd=user, check=True)
    return user


def _build_args(venv: Path) -> tuple[str, ...]:
    return ("--build", "sglang", "--sglang-python", str(venv), "--pip-args", "--no-build-isolation")


def _signalled_after_a_build(args: tuple, user: Path, venv: Path, tmp_path: Path,
                             sig: int = signal.SIGKILL) -> tuple[int, str]:
    """``klbisect ARGS`` sent ``sig`` once a build has installed a checkout
    (SIGKILL: no chance to put anything back); its exit code and stderr."""
    from conftest import klb_popen, reaped
    with reaped(klb_popen(*args, cwd=user)) as first:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not _where_or_none(venv, tmp_path):
            time.sleep(0.2)
        assert _where_or_none(venv, tmp_path), "no build happened"
        first.send_signal(sig)
        _, err = first.communicate(timeout=120)
    return first.returncode, err if isinstance(err, str) else err.decode()


def _where_or_none(py: Path, cwd: Path) -> str | None:
    try:
        return _where(py, cwd)
    except subprocess.CalledProcessError:   # mid-install
        return None


def test_ray_nodes_put_their_sglang_back_when_the_executor_closes(venv, tmp_path, capfd):
    """--executor ray with --build sglang installs each node's worktree into
    that node's interpreter: closing the executor puts every node back."""
    ray = pytest.importorskip("ray")
    from klbisect.probe import CommandProbe
    from klbisect.ray_executor import RayExecutor
    user = _sglang_project(tmp_path / "mine", "user checkout")
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=user, capture_output=True, text=True,
                         check=True).stdout.strip()
    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        probe = CommandProbe(f"{sys.executable} -c \"print('avg_kl_div=0.004')\"")
        builder = SGLangBuilder(python=str(venv), pip_args=("--no-build-isolation",))
        ex = RayExecutor(1, 0, str(user), tmp_path / "logs", probe=probe, builder=builder, probe_key=probe.key,
                         build_key=builder.key, cache_dir=str(tmp_path / "ray-cache"))
        ex.submit(sha)
        [out] = ex.wait()
        assert out.build is not None and out.build.ok, out
        assert _where(venv, tmp_path) == "user checkout"        # the node's worktree of it, installed
        ex.close()
    finally:
        ray.shutdown()
    assert _where(venv, tmp_path) is None
    assert "is back to no sglang" in capfd.readouterr().err


def test_build_sglang_says_how_to_restore_what_it_cannot(venv, tmp_path):
    user = _sglang_project(tmp_path / "mine", "user checkout")
    subprocess.run([str(venv), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
                    str(user / "python")], check=True, cwd=tmp_path)
    builder = SGLangBuilder(python=str(venv), pip_args=("--no-build-isolation",))
    _build_in_worktree(builder, user, tmp_path, "wt")
    (user / "python").rename(user / "moved")       # the editable install's directory is gone
    lines = builder.close(lambda line: None)
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("klbisect: ") and f"{user / 'python'}, which no longer exists" in line
    assert f"now has sglang 0.0.1, an editable install of {tmp_path / 'wt' / 'python'}" in line
    assert f"{venv} -m pip install --no-deps -e" in line


# ---------------------------------------------------------------------------
# (e) payloads against SGLang's request dataclasses
# ---------------------------------------------------------------------------

def _sglang_fields() -> tuple[set[str], set[str]]:
    try:  # the real thing when SGLang is installed
        from sglang.srt.managers.io_struct import GenerateReqInput  # type: ignore
        from sglang.srt.sampling.sampling_params import SamplingParams  # type: ignore
        return ({f.name for f in dataclasses.fields(GenerateReqInput)},
                set(getattr(SamplingParams, "__struct_fields__", ())) or set(vars(SamplingParams())))
    except Exception:
        return GENERATE_REQ_FIELDS, SAMPLING_PARAMS_FIELDS


def test_payloads_use_sglang_field_names():
    req_fields, sp_fields = _sglang_fields()
    for payload in (generate_payload([[1, 2]], 8, return_logprob=True),
                    generate_payload([[1, 2]], 0, return_logprob=True, logprob_start_len=0),
                    generate_payload([[1, 2]], 0, return_logprob=False)):
        assert set(payload) <= req_fields
        assert set(payload["sampling_params"]) <= sp_fields
        assert payload["sampling_params"]["temperature"] == 1.0      # explicit, never the model default
        assert payload["sampling_params"]["ignore_eos"] is True


# ---------------------------------------------------------------------------
# the fake server's generated history
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    return make_sglang_repo(tmp_path_factory.mktemp("sglang"))


def _worktree(repo, path: Path, sha: str) -> Path:
    subprocess.run(["git", "-C", str(repo.path), "worktree", "add", "-q", "--detach", str(path), sha], check=True)
    return path


def _checkout(path: Path, sha: str) -> None:
    subprocess.run(["git", "-C", str(path), "checkout", "-q", "--detach", sha], check=True)


def _pids(pidfile: Path) -> list[int]:
    return [int(x) for x in pidfile.read_text().split()] if pidfile.exists() else []


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _assert_nothing_left(pidfile: Path, port: int | None = None) -> None:
    pids = _pids(pidfile)
    assert pids, "the fake server never started"
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), f"left running: {[p for p in pids if not _gone(p)]}"
    kids = [c for c in psutil.Process().children(recursive=True) if not _gone(c.pid)]
    assert not kids, f"children of the test process left: {kids}"
    if port is not None:
        assert _port_free(port), f"port {port} is still taken"


def _probe(repo, **kw) -> SGLangProbe:
    kw.setdefault("max_new_tokens", 24)
    kw.setdefault("launch_timeout", 60)
    return SGLangProbe(model_path="fake-tiny", prompts=repo.prompts, **kw)


# ---------------------------------------------------------------------------
# (b) good vs culprit through the real HTTP path
# ---------------------------------------------------------------------------

def test_a_server_that_never_starts_stops_the_run_after_two_launches(repo, tmp_path):
    """A tester's: a server that never became healthy was launched six
    times at the good endpoint before the run gave up, each launch up to
    --launch-timeout (ten minutes by default: an hour)."""
    from conftest import db_query, error_line, klb, state_dir
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True)
    p = klb("run", "--good", repo.good, "--bad", repo.bad, "--probe", "sglang", "--model-path", "fake-tiny",
            "--prompts", str(repo.prompts), "--launch-timeout", "2", cwd=clone, env={"FAKE_SGLANG_NEVER_READY": "1"})
    line = error_line(p, 154)
    assert "printed no metric value in 2 runs" in line and "raise --launch-timeout" in line, line
    assert [r["status"] for r in db_query(clone, "SELECT status FROM runs")] == ["noserver", "noserver"]
    assert "no value (its server did not start)" in p.stderr
    log = klb("log", cwd=clone)
    assert log.stdout.count("no server") == 2 and "its server did not start" in log.stdout, log.stdout
    assert "exit=None" not in log.stdout
    st = klb("status", cwd=clone)
    assert "2 run(s) gave no value: its server did not start" in st.stdout, st.stdout
    # the store keeps --server-args as given (an --api-key among them): only its user reads it
    assert all(f.stat().st_mode & 0o077 == 0 for f in state_dir(clone).glob("state.db*"))


def test_a_refused_api_key_or_a_missing_endpoint_keeps_the_servers_advice():
    # a reviewer's: every 4xx was blamed on --prompts, a wrong --api-key's 401 too
    from klbisect.sglang import no_value_hint
    for code in (401, 404):
        hint = no_value_hint("sglang:x", None, f"/generate answered {code}: unauthorized")
        assert "--prompts" not in hint and "--server-args" in hint, hint
    assert "check --prompts" in no_value_hint("sglang:x", None, "/generate answered 422: bad field")


def test_prompts_the_server_refuses_are_blamed_on_the_prompts_not_the_server(repo, tmp_path):
    """A tester's prompts file held ids past the vocabulary: every request
    answered 400, and the line said to check --model-path, --server-args
    and --sglang-python."""
    from conftest import error_line, klb
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True)
    bad = tmp_path / "other_tokenizer.json"
    bad.write_text("[[1, 2, 3], [99999999]]")
    p = klb("run", "--good", repo.good, "--bad", repo.bad, "--probe", "sglang", "--model-path", "fake-tiny",
            "--prompts", str(bad), "--max-new-tokens", "8", "--labels", "logprobs_match", cwd=clone)
    line = error_line(p, 154)
    assert "the server refused klbisect's requests (/generate answered 400" in line, line
    assert "token id out of range" in line and "check --prompts" in line and "--model-path" not in line, line


@pytest.mark.parametrize("noenv", [False, True])
def test_a_server_worker_that_left_its_tree_goes_with_the_server(repo, tmp_path, noenv):
    """A reviewer's: a worker that called setsid and lost its parent is
    adopted by klbisect, out of the server's tree, and lived on (holding
    its GPU) until the next klbisect command reaped it. Another's: one that
    also cleared its environment carries no marker; it outlived every
    launch of a calibration (one per run) and the command itself."""
    from conftest import klb, processes_with
    tag = f"klbdaemon{uuid.uuid4().hex[:10]}"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True)
    env = {"FAKE_SGLANG_DAEMON": tag, **({"FAKE_SGLANG_DAEMON_NOENV": "1"} if noenv else {})}
    try:
        p = klb("calibrate", "--rev", repo.good, "--runs", "2", "--runs-per-launch", "1", "--probe", "sglang",
                "--model-path", "fake-tiny", "--prompts", str(repo.prompts), cwd=clone, env=env)
        assert p.returncode == 0, p.stderr
        assert not processes_with(tag), "the server's setsid worker outlived the command"
    finally:
        for q in processes_with(tag):
            q.kill()


def test_a_server_that_exits_cleanly_mid_test_gives_no_measurement(repo, tmp_path):
    """A reviewer's: the server's exit 0 became the run's, so the labels it
    never reached read as skipped on purpose and the one it did as the
    run's value: a partial max, which may read good on a bad commit."""
    wt = _worktree(repo, tmp_path / "wt", repo.culprit)
    probe = _probe(repo)
    try:
        run = probe.run(wt, tmp_path / "r.log", Slot(0, wt, env={"FAKE_SGLANG_EXIT_AFTER_FLUSHES": "3"}))
    finally:
        probe.close()
    text = Path(run.log_path).read_text()
    assert "request failed" in text and 0 < len(run.values) < len(LABELS), text
    assert run.exit_code != 0
    from klbisect.runs import cut_off
    assert cut_off(run, frozenset(LABELS))


def test_probe_separates_good_and_culprit(repo, tmp_path):
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    pidfile = tmp_path / "pids"
    slot = Slot(0, wt, env={"FAKE_SGLANG_PIDFILE": str(pidfile)})
    probe = _probe(repo)
    try:
        good = [probe.run(wt, tmp_path / f"good{i}.log", slot) for i in range(2)]
        good_server = _pids(pidfile)[0]
        _checkout(wt, repo.culprit)
        bad = probe.run(wt, tmp_path / "bad.log", slot)
        # a server is never reused across commits: the good one is gone
        assert _gone(good_server)
    finally:
        probe.close()
    _assert_nothing_left(pidfile)
    for r in good + [bad]:
        assert r.status == "ok" and r.exit_code == 0, Path(r.log_path).read_text()
        assert set(r.values) == set(LABELS)
        assert parse_values(Path(r.log_path).read_text()) == r.values
    logs = [Path(r.log_path).read_text() for r in good + [bad]]
    assert "launching:" in logs[0] and "reusing server" in logs[1] and "launching:" in logs[2]
    assert len(_pids(pidfile)) == 4          # two launches, each a server and its helper
    for label in LABELS:
        g = [r.values[label] for r in good]
        # 80 in-process runs each: good 0.0041 +- 0.0004 (max 0.0053), bad 0.0096 +- 0.0009 (min 0.0081)
        assert max(g) < 0.006 < bad.values[label], (label, g, bad.values[label])


def test_the_multiturn_flow_separates_good_and_culprit_and_replays_one_sequence_a_request(repo, tmp_path):
    """--kl-flow multiturn: three turns over branching prefixes, as the
    unified-radix-tree tests measure; the replay flushes and prefills one
    sequence a request (kl_multiturn_utils' replay_batch_size=1)."""
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    slot = Slot(0, wt)
    probe = _probe(repo, kl_flow="multiturn", max_new_tokens=16, kl_threshold=0.0065)
    try:
        good = [probe.run(wt, tmp_path / f"good{i}.log", slot) for i in range(2)]
        _checkout(wt, repo.culprit)
        bad = probe.run(wt, tmp_path / "bad.log", slot)
    finally:
        probe.close()
    logs = [Path(r.log_path).read_text() for r in good + [bad]]
    for r, log in zip(good + [bad], logs):
        assert r.status == "ok" and set(r.values) == set(LABELS), log
        assert parse_values(log) == r.values
        assert "[logprobs_match] 4 samples, 3 turns, max_new_tokens=16, 4 measured; decode hits 8/8" in log
        assert "[prefill_cache_hit] 9 samples, 3 turns" in log and "prefix hits 9/9, decode hits 18/18" in log
        assert "[decode_cache_hit] 9 samples, 3 turns" in log and "decode hits 18/18" in log
    # 15 runs each, 16 new tokens: good 0.0029-0.0051 a label, bad 0.0074-0.0137; a run's mean of three is steadier
    mean = [sum(r.values.values()) / 3 for r in good + [bad]]
    assert max(mean[:2]) < 0.0062 < mean[2], mean
    # --kl-threshold: the test's assertion in the log, naming what crossed it; the values count all the same
    over = [k for k, v in bad.values.items() if v >= 0.0065]
    assert bad.exit_code == 1 and over and f"AssertionError: {over[0]} avg_kl_div=" in logs[2], logs[2]
    under = [(r, log) for r, log in zip(good, logs) if max(r.values.values()) < 0.0065]
    assert under and all(r.exit_code == 0 and "pass: every label under kl_threshold 0.0065" in log
                         for r, log in under)
    # one flush to start each label and one before each replayed sequence: 5 + 10 + 10 a run
    server_log = Path(good[0].log_path).with_name("good0.server.log").read_text()
    assert server_log.count("/flush_cache") == 2 * 25, server_log.count("/flush_cache")


@pytest.mark.parametrize("flow", ["single", "multiturn"])
def test_temperature_reaches_every_request(repo, tmp_path, flow):
    """--temperature 0, as the DeepSeek V4 classes run: greedy tokens, so
    two runs of one launch read the same KL to the last digit (at 1 they
    differ); at 0.5 the replay is scaled as the decode was (here 0.006-0.010,
    sharper logits; a replay at 1 against a decode at 0.5 reads 0.4)."""
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    slot = Slot(0, wt)
    values = {}
    for t in (0.0, 0.5, 1.0):
        probe = _probe(repo, kl_flow=flow, labels=("logprobs_match",), max_new_tokens=8, temperature=t)
        try:
            values[t] = [probe.run(wt, tmp_path / f"t{t}-{i}.log", slot).values["logprobs_match"] for i in range(2)]
        finally:
            probe.close()
    assert values[0.0][0] == values[0.0][1] and values[1.0][0] != values[1.0][1], values
    assert max(values[0.5]) < 0.05, values


def test_temperature_0_from_the_command_line_is_kept(repo, tmp_path):
    """A reviewer's: the command line's --temperature 0 was dropped with the
    empty settings (0 == 0.0) and the runs sampled at 1, stored as such."""
    from conftest import error_line, klb
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True)
    p = klb("calibrate", "--rev", repo.good, "--runs", "2", "--probe", "sglang", "--temperature", "0",
            "--labels", "logprobs_match", "--max-new-tokens", "8", "--model-path", "fake-tiny",
            "--prompts", str(repo.prompts), cwd=clone)
    assert p.returncode == 0, p.stderr
    logs = json.loads(klb("log", "--json", cwd=clone).stdout)
    texts = [Path(r["log_path"]).read_text() for r in logs]
    assert len(texts) == 2 and all("; temperature 0" in t for t in texts), texts[0][:400]
    assert len({r["values"]["logprobs_match"] for r in logs}) == 1, logs
    idle = klb("run", "--good", repo.good, "--bad", repo.bad, "--probe-cmd", "true", "--temperature", "0",
               cwd=clone)
    assert "--temperature is an option of --probe sglang" in error_line(idle, 150)


def test_calibrate_with_the_multiturn_flow_from_the_command_line(repo, tmp_path):
    from conftest import klb
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True)
    p = klb("calibrate", "--rev", repo.good, "--runs", "2", "--probe", "sglang", "--kl-flow", "multiturn",
            "--labels", "prefill_cache_hit,decode_cache_hit", "--max-new-tokens", "8", "--model-path", "fake-tiny",
            "--prompts", str(repo.prompts), cwd=clone)
    assert p.returncode == 0 and "launching the server" in p.stderr, p.stderr
    assert "prefill_cache_hit" in p.stdout and "decode_cache_hit" in p.stdout, p.stdout
    log = klb("log", cwd=clone).stdout
    assert log.count("prefill_cache_hit=") == 2 and "logprobs_match" not in log, log
    # the same probe again reuses both runs; the single-turn flow is another measurement (a launch for one run)
    again = klb("calibrate", "--rev", repo.good, "--runs", "2", "--probe", "sglang", "--kl-flow", "multiturn",
                "--labels", "prefill_cache_hit,decode_cache_hit", "--max-new-tokens", "8", "--model-path",
                "fake-tiny", "--prompts", str(repo.prompts), cwd=clone)
    assert again.returncode == 0 and "launching the server" not in again.stderr, again.stderr
    single = klb("calibrate", "--rev", repo.good, "--runs", "1", "--probe", "sglang", "--labels",
                 "prefill_cache_hit,decode_cache_hit", "--max-new-tokens", "8", "--model-path", "fake-tiny",
                 "--prompts", str(repo.prompts), cwd=clone)
    assert single.returncode == 0 and "launching the server" in single.stderr, single.stderr


def test_a_server_launched_with_an_api_key_is_measured_and_the_key_stays_out_of_klbisects_lines(repo, tmp_path):
    """A tester's --server-args "--api-key ...": the key went to the
    server but no request carried it (401 on every run: "measured
    nothing"), and every run log and server log header held it in plain
    text, as did the server lines copied into run logs (SGLang logs its
    ServerArgs)."""
    key = "mysglangkey12345"
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    pidfile = tmp_path / "pids"
    slot = Slot(0, wt, env={"FAKE_SGLANG_PIDFILE": str(pidfile)})
    # ... and an --admin-api-key, the only key SGLang's /flush_cache takes once it is set (a reviewer's)
    probe = _probe(repo, server_args=f"--api-key {key} --admin-api-key adminkey98765 --random-seed 3")
    try:
        r = probe.run(wt, tmp_path / "good.log", slot)
        server_log = tmp_path / "good.server.log"
        copied: list[str] = []
        probe._say_tail(copied.append, server_log)     # what a failed run copies into its log
        bare = Client(probe._held[0].server.url)       # a client without the key is refused, and told why
        with pytest.raises(ProtocolError, match="checks an API key"):
            bare.flush_cache()
    finally:
        probe.close()
    _assert_nothing_left(pidfile)
    run_log = Path(r.log_path).read_text()
    assert r.status == "ok" and set(r.values) == set(LABELS), run_log
    assert key not in run_log and "--api-key <redacted>" in run_log and "adminkey98765" not in run_log
    assert server_log.read_text().splitlines()[0].startswith("$ ") and key not in server_log.read_text().splitlines()[0]
    assert f"api_key='{key}'" in server_log.read_text()          # the server's own output, kept as written,
    assert server_log.stat().st_mode & 0o077 == 0                   # where only its user can read it
    assert Path(r.log_path).stat().st_mode & 0o077 == 0
    assert any("ServerArgs" in line for line in copied) and not any(key in line for line in copied), copied
    # a bare mention, which no pattern knows for a secret: --server-args says it is one
    assert "server| [fake sglang] requests need the bearer token <redacted>" in copied, copied


# ---------------------------------------------------------------------------
# (c) a server that dies at start
# ---------------------------------------------------------------------------

def test_a_commit_whose_own_sglang_fails_to_import_is_not_told_to_install_sglang(repo, tmp_path):
    """A tester's: a commit's stale import (No module named 'sglang.srt')
    read "sglang is not importable by the --sglang-python interpreter:
    install it there"; sglang imported fine, the commit's code did not."""
    from conftest import klb
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo.path), str(clone)], check=True)
    p = klb("run", "--good", repo.broken, "--bad", repo.bad, "--probe", "sglang", "--model-path", "fake-tiny",
            "--prompts", str(repo.prompts), "--launch-timeout", "20", cwd=clone)
    # the server's own traceback is shown, from its log; klbisect's one line says whose import failed
    line = next((ln for ln in p.stderr.splitlines() if ln.startswith("klbisect: error:")), "")
    assert p.returncode == 154 and "could not import sglang." in line, p.stderr
    assert "pick a good commit whose server starts" in line and "install it there" not in line, line


def test_server_crash_at_start_is_a_crash(repo, tmp_path):
    wt = _worktree(repo, tmp_path / "wt", repo.broken)
    pidfile = tmp_path / "pids"
    port = pick_port(0)
    slot = Slot(0, wt, env={"FAKE_SGLANG_PIDFILE": str(pidfile)}, port_base=port)
    probe = _probe(repo)
    res = probe.run(wt, tmp_path / "run.log", slot)
    text = Path(res.log_path).read_text()
    assert res.status == "noserver" and res.values == {} and res.exit_code == 1, text
    assert "server failed to start: server exited with code 1" in text
    assert "server| ModuleNotFoundError" in text          # the server's log tail, prefixed
    assert parse_values(text) == {}
    # what status says of the commit's crashes (a tester found it in the log files alone)
    from klbisect.result import crash_cause
    assert crash_cause(res.log_path) == "ModuleNotFoundError: No module named 'sglang.srt'", text
    # the broken launcher dies before it writes a pid file: check the tree and port
    assert not [c for c in psutil.Process().children(recursive=True) if not _gone(c.pid)]
    assert _port_free(port)
    probe.close()


# ---------------------------------------------------------------------------
# (d) Ctrl-C, launch timeout and request timeout kill the whole tree
# ---------------------------------------------------------------------------

def _interrupt_when(pidfile: Path, n: int) -> threading.Thread:
    def watch():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(_pids(pidfile)) < n:
            time.sleep(0.05)
        time.sleep(0.2)
        _thread.interrupt_main()
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_server_env_reaches_the_server_and_a_slow_launch_is_not_the_runs_timeout(repo, tmp_path):
    """A reviewer's: the KL tests launch with environment variables of their
    own (SGLANG_ENABLE_UNIFIED_RADIX_TREE=1 picks the cache under test), and
    a 4-GPU server loads for many minutes, which counted against --timeout
    (default 1800 s) and read as a server that never started. --server-env
    reaches the server and its runs' key; --timeout counts from ready."""
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    pidfile = tmp_path / "pids"
    slot = Slot(0, wt, env={"FAKE_SGLANG_PIDFILE": str(pidfile)})
    probe = _probe(repo, server_env=("FAKE_SGLANG_READY_AFTER=6",), timeout=5, labels=("logprobs_match",),
                   max_new_tokens=8)
    said: list[str] = []
    probe.on_launch = said.append      # a tester's console was silent for the whole launch
    try:
        r = probe.run(wt, tmp_path / "run.log", slot)
        env = psutil.Process(probe._held[0].server.pid).environ()
    finally:
        probe.close()
    _assert_nothing_left(pidfile)
    log = Path(r.log_path).read_text()
    assert r.status == "ok" and "logprobs_match" in r.values, log
    assert env.get("FAKE_SGLANG_READY_AFTER") == "6"
    assert len(said) == 2 and said[0].startswith(f"  {repo.good[:12]}: launching the server (up to"), said
    assert said[1].startswith(f"  {repo.good[:12]}: server ready after"), said
    assert probe.key != _probe(repo, timeout=5, labels=("logprobs_match",), max_new_tokens=8).key
    with pytest.raises(KlbisectError, match="give NAME=VALUE") as e:
        _probe(repo, server_env=("SGLANG_ENABLE_UNIFIED_RADIX_TREE",))
    assert e.value.code == EXIT_USAGE
    with pytest.raises(KlbisectError, match="give NAME=VALUE") as e:      # a tester's typo, ':' for '='
        _probe(repo, server_env=("HF_TOKEN:hf_colonSECRET1",))
    assert "hf_colonSECRET1" not in e.value.message and "HF_TOKEN..." in e.value.message
    with pytest.raises(KlbisectError, match="sets A twice"):
        _probe(repo, server_env=("A=1", "A=2"))
    # a secret given as a variable is known, so a server echoing it bare is masked
    assert "hf_abcdefgh123" in _probe(repo, server_env=("HF_TOKEN=hf_abcdefgh123", "SGLANG_X=1")).secrets
    # a run --timeout stopped (the requests slower than it) lasted what --timeout counts, so a longer
    # --timeout measures it again however long its launch took (the reviewer's)
    slow = _probe(repo, server_env=("FAKE_SGLANG_READY_AFTER=4",), timeout=1, labels=("logprobs_match",),
                  max_new_tokens=8)
    slot = Slot(0, wt, env={"FAKE_SGLANG_PIDFILE": str(pidfile), "FAKE_SGLANG_GENERATE_DELAY": "3"})
    try:
        t = slow.run(wt, tmp_path / "slow.log", slot)
    finally:
        slow.close()
    assert t.status == "timeout" and t.duration < 1.98 and cut_short(t, 2.0), (t, Path(t.log_path).read_text())


def test_ctrl_c_during_launch_kills_the_tree(repo, tmp_path):
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    pidfile = tmp_path / "pids"
    port = pick_port(0)
    slot = Slot(0, wt, env={"FAKE_SGLANG_PIDFILE": str(pidfile), "FAKE_SGLANG_NEVER_READY": "1"},
                port_base=port)
    probe = _probe(repo)
    _interrupt_when(pidfile, 2)
    with pytest.raises(KeyboardInterrupt):
        probe.run(wt, tmp_path / "run.log", slot)
    _assert_nothing_left(pidfile, port)
    assert not probe._held


def test_launch_timeout_is_a_crash_and_kills_the_tree(repo, tmp_path):
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    pidfile = tmp_path / "pids"
    slot = Slot(0, wt, env={"FAKE_SGLANG_PIDFILE": str(pidfile), "FAKE_SGLANG_NEVER_READY": "1"})
    res = _probe(repo, launch_timeout=1.5).run(wt, tmp_path / "run.log", slot)
    text = Path(res.log_path).read_text()
    assert res.status == "noserver" and res.exit_code is None and "not ready after" in text
    port = int(re.search(r"--port (\d+)", text).group(1))
    _assert_nothing_left(pidfile, port)


def test_request_timeout_kills_the_tree(repo, tmp_path):
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    pidfile = tmp_path / "pids"
    slot = Slot(0, wt, env={"FAKE_SGLANG_PIDFILE": str(pidfile), "FAKE_SGLANG_GENERATE_DELAY": "30"})
    probe = _probe(repo, request_timeout=1.0)
    res = probe.run(wt, tmp_path / "run.log", slot)
    text = Path(res.log_path).read_text()
    assert res.status == "timeout" and res.exit_code is None and res.values == {}, text
    assert not probe._held
    port = int(re.search(r"--port (\d+)", text).group(1))
    _assert_nothing_left(pidfile, port)


def test_a_run_cut_off_by_timeout_after_one_label_is_a_timeout(repo, tmp_path):
    """A run that hit --timeout after its first label was stored as a full
    measurement: a longer --timeout did not run it again, and its max
    missed the label it never reached."""
    wt = _worktree(repo, tmp_path / "wt", repo.good)
    slot = Slot(0, wt, env={"FAKE_SGLANG_GENERATE_DELAY": "2"})
    probe = _probe(repo, max_new_tokens=8, labels=("logprobs_match", "prefill_cache_hit"), timeout=300)
    try:
        full = probe.run(wt, tmp_path / "r1.log", slot)     # launches the server: both labels
        assert full.status == "ok" and sorted(full.values) == ["logprobs_match", "prefill_cache_hit"]
        probe.timeout = 6.0    # the server is reused: the first label fits, the second does not
        cut = probe.run(wt, tmp_path / "r2.log", slot)
        assert cut.status == "timeout" and list(cut.values) == ["logprobs_match"], Path(cut.log_path).read_text()
    finally:
        probe.close()


# ---------------------------------------------------------------------------
# (f) GitHub, against a loopback server
# ---------------------------------------------------------------------------

TOKEN = "ghp_SECRETsecretSECRET123"


class _GitHub(BaseHTTPRequestHandler):
    hits: dict[str, int] = {}
    auth: list[str] = []

    def log_message(self, *args):
        pass

    def _reply(self, code: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        n = self.hits[self.path] = self.hits.get(self.path, 0) + 1
        self.auth.append(self.headers.get("Authorization", ""))
        if self.path == "/repos/o/r/pulls/27168":
            return self._reply(200, {"number": 27168, "title": "Resolve the attention backend",
                                     "user": {"login": "dev4"}, "html_url": "https://github.com/o/r/pull/27168",
                                     "merged_at": "2025-10-10T08:53:20Z"})
        if self.path == "/repos/o/r/pulls/500" and n < 3:
            return self._reply(503, {"message": "unavailable"})
        if self.path == "/repos/o/r/pulls/500":
            return self._reply(200, {"number": 500, "title": "t", "user": {"login": "a"},
                                     "html_url": "u", "merged_at": None})
        if self.path.startswith("/repos/o/r/pulls/5"):
            return self._reply(502, {"message": "bad gateway"})
        self._reply(404, {"message": "Not Found"})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        # echo the header back, as a broken proxy might: it must not reach our messages
        self._reply(403, {"message": f"denied for {self.headers.get('Authorization')}"})


@pytest.fixture
def gh(monkeypatch):
    _GitHub.hits, _GitHub.auth = {}, []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _GitHub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv(github.API_ENV, f"http://127.0.0.1:{srv.server_port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    yield srv
    srv.shutdown()
    srv.server_close()


class _Cache:
    def __init__(self):
        self.d: dict[int, dict] = {}

    def get(self, pr):
        return self.d.get(pr)

    def put(self, pr, meta):
        self.d[pr] = meta


def test_fetch_pr_ok_cached_retry_404(gh, caplog):
    caplog.set_level(logging.DEBUG, logger="klbisect.github")
    cache = _Cache()
    meta = github.fetch_pr(27168, "o/r", TOKEN, cache=cache, backoff=0.01)
    assert meta == github.PRMeta(27168, "Resolve the attention backend", "dev4",
                                 "https://github.com/o/r/pull/27168", "2025-10-10T08:53:20Z")
    assert _GitHub.auth == [f"Bearer {TOKEN}"]
    assert github.fetch_pr(27168, "o/r", TOKEN, cache=cache) == meta and _GitHub.hits["/repos/o/r/pulls/27168"] == 1
    assert github.fetch_pr(500, "o/r", TOKEN, backoff=0.01).number == 500     # two 503s, then 200
    assert _GitHub.hits["/repos/o/r/pulls/500"] == 3
    assert github.fetch_pr(501, "o/r", TOKEN, retries=1, backoff=0.01) is None  # 5xx to the end
    assert _GitHub.hits["/repos/o/r/pulls/501"] == 2
    assert github.fetch_pr(9, "o/r", TOKEN, backoff=0.01) is None               # 404: no retry
    assert _GitHub.hits["/repos/o/r/pulls/9"] == 1
    assert TOKEN not in caplog.text


def test_fetch_pr_offline_is_silent(monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="klbisect.github")
    port = pick_port(0)   # nothing listens there
    monkeypatch.setenv(github.API_ENV, f"http://127.0.0.1:{port}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert github.fetch_pr(1, "o/r", TOKEN, retries=1, backoff=0.01, timeout=2) is None
    assert TOKEN not in caplog.text


def test_post_comment_error_never_shows_the_token(gh, caplog):
    caplog.set_level(logging.DEBUG, logger="klbisect.github")
    with pytest.raises(github.GitHubError) as e:
        github.post_comment("o/r", 12, "nightly: KL up", TOKEN, backoff=0.01)
    assert "HTTP 403" in str(e.value) and TOKEN not in str(e.value) and TOKEN not in caplog.text
    assert "denied for Bearer <redacted>" in str(e.value)          # masked as every other secret is
    assert TOKEN not in repr(e.value.__cause__ or "")


# ---------------------------------------------------------------------------
# end to end through the core
# ---------------------------------------------------------------------------

def test_bisect_finds_planted_sglang_commit(repo, tmp_path):
    from klbisect.config import BisectConfig
    from klbisect.session import run_bisect
    cfg = BisectConfig(
        good=repo.good, bad=repo.bad, probe="sglang", parallel=2, confidence=0.95,
        sglang={"model_path": "fake-tiny", "prompts": str(repo.prompts), "max_new_tokens": 16,
                "labels": "logprobs_match", "launch_timeout": 60},
    )
    said: list[str] = []
    result = run_bisect(repo.path, cfg, progress=said.append)
    assert result.culprit == repo.culprit, result
    assert not [c for c in psutil.Process().children(recursive=True) if not _gone(c.pid)]

    # each launch is said on the console, with its commit (a tester's was silent for minutes)
    assert f"  {repo.good[:12]}: launching the server (up to --launch-timeout 60 s; log: " in "\n".join(said), said


def test_one_slot_launches_a_server_per_endpoint_not_per_run(repo, tmp_path):
    """--probe sglang on one slot: the endpoints' runs are taken one side
    after the other, so the server launched for a side serves all its runs
    (alternating sides relaunched it for every run: minutes each)."""
    from klbisect.config import BisectConfig
    from klbisect.session import run_bisect
    from klbisect.workspace import Workspace
    # 12 new tokens: a probe of its own, so no earlier test's runs or finished session are reused
    cfg = BisectConfig(
        good=repo.good, bad=repo.bad, probe="sglang", parallel=1, confidence=0.95,
        sglang={"model_path": "fake-tiny", "prompts": str(repo.prompts), "max_new_tokens": 12,
                "labels": "logprobs_match", "launch_timeout": 60},
    )
    assert run_bisect(repo.path, cfg, progress=lambda msg: None).culprit == repo.culprit
    ws = Workspace(repo.path)
    try:
        ends = [r for r in ws.store.session_runs(ws.store.latest_session().id) if r.sha in (repo.good, repo.bad)]
    finally:
        ws.close()
    # the first twelve are the endpoints' calibration; when the sides overlap, the search
    # comes back to an endpoint later, between interior runs, and that needs a launch of its own
    launches = sum("launching:" in Path(r.log_path).read_text() for r in ends[:12])
    assert len(ends) >= 12 and launches <= 3, (len(ends), launches)


def test_a_probe_command_under_build_sglang_imports_its_own_checkout(tmp_path, monkeypatch):
    """--build sglang installs one checkout into the Python all slots share;
    SGLang's KL test imports sglang from wherever that install points. Each
    --probe-cmd run puts its own checkout's python/ first, as the server
    launch does, so parallel slots measure their own commits."""
    from klbisect.config import BisectConfig, make_probe
    installed = tmp_path / "site" / "sglang"            # what the last slot's build installed
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("KL = 0.011\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    checkout = tmp_path / "slot-0"
    (checkout / "python" / "sglang").mkdir(parents=True)
    (checkout / "python" / "sglang" / "__init__.py").write_text("KL = 0.004\n")
    cmd = f"{sys.executable} -c 'import sglang; print(\"avg_kl_div=%g\" % sglang.KL)'"
    slot = Slot(0, checkout, {}, 0, tmp_path / "pids")
    for build, kl in (("sglang", 0.004), (None, 0.011)):
        probe = make_probe(BisectConfig(probe_cmd=cmd, build=build))
        res = probe.run(checkout, tmp_path / f"run-{build}.log", slot)
        assert res.values == {"value": kl}, (build, Path(res.log_path).read_text())
    # so the two measure different code: their runs are not one probe's (a tester's runs
    # without --build measured the installed checkout at every commit, and were reused with it)
    keys = {make_probe(BisectConfig(probe_cmd=cmd, build=b)).key for b in ("sglang", None)}
    assert len(keys) == 2


def test_a_probe_commands_python3_under_build_sglang_is_the_sglang_python(venv, tmp_path):
    """A tester's `--probe-cmd "cd test && python3 ..."` ran PATH's python3
    while --build sglang installed into --sglang-python: on a box whose
    dependencies live only in that venv, every run would crash (or load
    another kernel wheel than the commit pins)."""
    from klbisect.config import BisectConfig, make_probe
    checkout = tmp_path / "slot-0"
    checkout.mkdir()
    cmd = ("python3 -c 'import sys; print(\"avg_kl_div=0.004\"); print(\"prefix=\" + sys.prefix)'; python -V; "
           "echo \"venv=$VIRTUAL_ENV\"; command -v python3.notthere || echo \"path=$PATH\"")
    slot = Slot(0, checkout, {}, 0, tmp_path / "pids")
    probe = make_probe(BisectConfig(probe_cmd=cmd, build="sglang", sglang={"python": str(venv)}))
    res = probe.run(checkout, tmp_path / "logs" / "run.log", slot)
    log = Path(res.log_path).read_text()
    # the venv's own interpreter, with its site-packages (its sglang): not the base Python a link reaches
    assert res.values == {"value": 0.004} and f"prefix={venv.parent.parent}\n" in log, log
    # then the venv's own bin/ (its pip, pytest, torchrun), as an activated venv has it
    path = log.split("path=")[1].split()[0].split(":")
    assert path[1] == str(venv.parent) and f"venv={venv.parent.parent}\n" in log, log
    # runs of PATH's python3 before are another probe's
    assert probe.key != make_probe(BisectConfig(probe_cmd=cmd, build="sglang")).key


def test_build_sglang_says_when_the_probes_python3_is_not_the_one_it_builds_into(venv, tmp_path, monkeypatch):
    """--build sglang with no --sglang-python installs each commit into
    klbisect's own Python: a probe command whose python3 is a venv's (not
    activated for klbisect, or klbisect from pipx) ran on what that venv
    has, and nothing said so."""
    from klbisect.buildenv import warn_probe_python
    from klbisect.config import BisectConfig, make_builder
    path = os.environ["PATH"]

    def said(cmd: str, first: Path, **sglang) -> list[str]:
        monkeypatch.setenv("PATH", os.pathsep.join([str(first), path]))
        cfg = BisectConfig(probe_cmd=cmd, build="sglang", sglang=sglang)
        out: list[str] = []
        warn_probe_python(cfg, make_builder(cfg), out.append)
        return out

    warned = said("cd test && python3 test_kl.py", venv.parent)
    assert len(warned) == 1 and f"--sglang-python {venv.parent / 'python3'}" in warned[0], warned
    assert not said("cd test && python3 test_kl.py", venv.parent, python=str(venv))
    assert not said("cd test && .venv/bin/python3 test_kl.py", venv.parent)
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "python3").write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    (ours / "python3").chmod(0o755)
    assert not said("python3 test_kl.py", ours)


def test_parallel_slots_share_one_python_so_a_pin_change_runs_one_slot(tmp_path):
    """--parallel with --build sglang: the pinned kernel wheel goes into the
    Python every slot shares, and a slot whose own checkout needed no build
    probed with the wheel another slot had just installed (a reviewer's
    slot saw sgl-kernel 0.3.2 at a commit pinning 0.3.1)."""
    import git as gitpython
    from klbisect.buildenv import slots_for_pins
    from klbisect.config import BisectConfig, make_builder
    repo = tmp_path / "pins"
    (repo / "python").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    shas = []
    for i, pin in enumerate(["0.3.1", "0.3.1", "0.3.2", "0.3.2"]):
        (repo / "python" / "pyproject.toml").write_text(
            f'[project]\nname = "sglang"\ndependencies = ["sgl-kernel=={pin}", "torch"]\n')
        (repo / "notes.txt").write_text(f"{i}\n")
        for args in (("add", "-A"), ("commit", "-q", "-m", f"change {i}")):
            subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", *args], cwd=repo, check=True)
        shas.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                   check=True).stdout.strip())
    said: list[str] = []
    cfg = BisectConfig(good=shas[0], bad=shas[3], probe_cmd="true", build="sglang", parallel=4)
    r = gitpython.Repo(repo)
    assert slots_for_pins(r, cfg, make_builder(cfg), shas[0], shas[3], said.append) == 1
    assert shas[2][:12] in said[0] and "sgl-kernel 0.3.1 -> 0.3.2" in said[0], said
    # one pin across the range: all four slots
    assert slots_for_pins(r, cfg, make_builder(cfg), shas[0], shas[1], said.append) == 4
    assert slots_for_pins(r, cfg, make_builder(cfg), shas[2], shas[3], said.append) == 4 and len(said) == 1
    # on Ray every slot stays: a node's tasks take turns (RayExecutor's take_turns) and nodes run in parallel
    ray_cfg = BisectConfig(good=shas[0], bad=shas[3], probe_cmd="true", build="sglang", parallel=4, executor="ray")
    assert slots_for_pins(r, ray_cfg, make_builder(ray_cfg), shas[0], shas[3], said.append) == 4
    assert "take turns" in said[-1] and "sgl-kernel 0.3.1 -> 0.3.2" in said[-1], said


def test_a_range_that_moves_the_torch_pin_is_warned_of_before_any_run(tmp_path):
    """A reviewer's: python/pyproject.toml pins torch and transformers beside
    the kernel wheels, which are built for one torch; --build sglang installs
    with --no-deps, so past a joint bump every commit may fail to import its
    kernels and read as a crash range. Said before the first run."""
    import git as gitpython
    from klbisect.buildenv import warn_build_paths
    from klbisect.config import BisectConfig, make_builder
    repo = tmp_path / "pins"
    (repo / "python").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    shas = []
    for i, (kernel, torch) in enumerate([("0.3.1", "2.8.0"), ("0.3.2", "2.8.0"), ("0.3.3", "2.9.1")]):
        (repo / "python" / "pyproject.toml").write_text(
            f'[project]\nname = "sglang"\ndependencies = ["sgl-kernel=={kernel}", "torch=={torch}"]\n')
        for args in (("add", "-A"), ("commit", "-q", "-m", f"change {i}")):
            subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", *args], cwd=repo, check=True)
        shas.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                                   check=True).stdout.strip())
    cfg = BisectConfig(good=shas[0], bad=shas[2], probe_cmd="true", build="sglang")
    said: list[str] = []
    warn_build_paths(gitpython.Repo(repo), make_builder(cfg), shas[0], shas[2], said.append)
    assert len(said) == 1 and f"{shas[2][:12]}: torch 2.8.0 -> 2.9.1" in said[0] and "--no-deps" in said[0], said
    said.clear()    # a kernel pin alone is what --build sglang installs: nothing to say
    warn_build_paths(gitpython.Repo(repo), make_builder(cfg), shas[0], shas[1], said.append)
    assert said == []


def test_alike_endpoints_in_an_sglang_checkout_probed_without_a_build_say_so(tmp_path):
    """A tester's probe imported their installed sglang at every commit (no
    --build): the endpoints looked alike, and nothing said why."""
    from conftest import error_line, klb
    user = _sglang_project(tmp_path / "mine", "user checkout")
    (user / "probe.py").write_text("print('avg_kl_div=0.004')\n")
    for i in range(4):
        (user / "level.txt").write_text(f"{i}\n")
        for args in (("add", "-A"), ("commit", "-q", "-m", f"change {i}")):
            subprocess.run(["git", "-c", "user.name=T", "-c", "user.email=t@e", *args], cwd=user, check=True)
    args = ("run", "--good", "HEAD~3", "--bad", "HEAD", "--probe-cmd", f"{sys.executable} probe.py",
            "--max-endpoint-runs", "4")
    line = error_line(klb(*args, cwd=user), 154)
    assert "do not separate" in line and "add --build sglang" in line, line
    # a build given: not this hint
    line = error_line(klb(*args, "--build-cmd", "true", cwd=user), 154)
    assert "do not separate" in line and "--build sglang" not in line, line


def test_a_slot_whose_ports_are_all_taken_gets_another_free_port():
    """A tester's shared box: another program held the slot's whole range,
    and every run failed with advice to check --model-path."""
    import socket
    from klbisect.sglang import PORTS_PER_SLOT
    held = []
    try:
        first = socket.socket()
        first.bind(("127.0.0.1", 0))
        base = first.getsockname()[1]
        held.append(first)
        for port in range(base + 1, base + PORTS_PER_SLOT):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()       # taken already: taken all the same
                continue
            held.append(s)
        for s in held:
            s.listen()
        got = pick_port(base)
        assert not base <= got < base + PORTS_PER_SLOT
        with socket.socket() as s:
            s.bind(("127.0.0.1", got))     # and free
    finally:
        for s in held:
            s.close()
