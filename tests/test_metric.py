"""metric.py: KL values out of a probe's output, whatever its exit code."""
from __future__ import annotations

import math
import os
import subprocess
import sys

from klbisect.metric import DEFAULT_LABEL, JSON_PREFIX, NONFINITE, broke, fmt_value, parse_values, scalar

SGLANG = """\
[server] launching on 127.0.0.1:30000
[logprobs_match] 18 samples, 2 turns
kl_divs=[0.00723732, 0.00315103, 0.00278546]
avg_kl_div=0.00357962
[prefill_cache_hit] 18 samples, 2 turns
kl_divs=[0.0108935, 0.017515]
avg_kl_div=0.0118668
[decode_cache_hit] 18 samples, 2 turns
kl_divs=[0.00252088, 0.00494584]
avg_kl_div=0.00397411
"""


def test_sglang_format_with_labels():
    v = parse_values(SGLANG)
    assert v == {"logprobs_match": 0.00357962, "prefill_cache_hit": 0.0118668,
                 "decode_cache_hit": 0.00397411}
    # kl_divs=[...] lists are not values
    assert len(v) == 3


def test_labels_in_any_script():
    """A tester's [résumé_1] and [ü] were not read as labels: their values
    went to the label before them."""
    v = parse_values("[alpha]\navg_kl_div=0.004\n[résumé_1]\navg_kl_div=0.011\n[ü]\navg_kl_div=0.005\n")
    assert v == {"alpha": 0.004, "résumé_1": 0.011, "ü": 0.005}


def test_value_without_label_and_number_forms():
    assert parse_values("avg_kl_div=0.004\n") == {DEFAULT_LABEL: 0.004}
    assert parse_values("avg_kl_div: 1.5e-3") == {DEFAULT_LABEL: 0.0015}
    assert parse_values("avg_kl_div = .25") == {DEFAULT_LABEL: 0.25}
    assert parse_values("[a.b:c/d-e_f] x\navg_kl_div=2E-2") == {"a.b:c/d-e_f": 0.02}


def test_a_label_printed_again_keeps_every_value():
    """A reviewer's: SGLang's Mamba KL file runs the multi-turn kit in three
    test classes (HiCache before RadixCache), each printing the same labels;
    the last class's values replaced the others', and a regression on the
    HiCache path was invisible in the run's max."""
    classes = "".join(f"[decode_cache_hit] 9 samples, 3 turns\navg_kl_div={d}\n"
                      f"[prefill_cache_hit] 9 samples, 3 turns\navg_kl_div={p}\n"
                      for d, p in ((0.0042, 0.0047), (0.0012, 0.0013)))
    got = parse_values(classes)
    assert got == {"decode_cache_hit": 0.0042, "prefill_cache_hit": 0.0047,
                   "decode_cache_hit#2": 0.0012, "prefill_cache_hit#2": 0.0013}
    assert scalar(got) == 0.0047 and scalar(got, "decode_cache_hit#2") == 0.0012
    # so do a regex's label group and the JSON lines
    assert parse_values("x=0.1 x=0.2", r"(?P<label>x)=(?P<value>[0-9.]+)") == {"x": 0.1, "x#2": 0.2}
    assert parse_values(f'{JSON_PREFIX}{{"label": "x", "value": 0.1}}\n{JSON_PREFIX}{{"label": "x", "value": 0.3}}\n') \
        == {"x": 0.1, "x#2": 0.3}


def test_a_label_line_names_only_the_value_after_it():
    """A reviewer's: SGLang's bit-exact KL file runs one multi-turn class
    (labelled) and then single-turn classes, whose helpers print no label:
    their values all went to decode_cache_hit, the last replacing the rest,
    and a failing single-turn KL of 5.6e-06 (threshold 1e-9) read as 0."""
    text = ("[decode_cache_hit] 9 samples, 3 turns\navg_kl_div=0.0\n"
            "Running test_input_output_logprobs_match with 32 prompts\navg_kl_div=5.56e-06\n"
            "Running test_prefill_cache_hit with 32 prompts\navg_kl_div=0.0\n")
    got = parse_values(text)
    assert got == {"decode_cache_hit": 0.0, DEFAULT_LABEL: 5.56e-06, f"{DEFAULT_LABEL}2": 0.0}
    assert scalar(got) == 5.56e-06


def test_the_dp_attention_tests_avg_kl_line():
    """SGLang's DP-attention CUDA-graph KL tests print "avg KL: 0.003100"."""
    out = "per-sample KL: [0.0021, 0.0041]\navg KL: 0.003100\nKL threshold: 0.0025\n"
    assert parse_values(out) == {DEFAULT_LABEL: 0.0031}


def test_older_tests_without_labels_keep_every_value():
    """SGLang commits older than the [label] lines print one avg_kl_div per
    test: the run's value must be the worst of them, not the last."""
    text = "avg_kl_div=0.004\n.\navg_kl_div=0.012\n.\navg_kl_div=0.005\nOK\n"
    got = parse_values(text)
    assert got == {DEFAULT_LABEL: 0.004, f"{DEFAULT_LABEL}2": 0.012, f"{DEFAULT_LABEL}3": 0.005}
    assert scalar(got) == 0.012
    # a label names the one value after it: a second is unlabelled
    assert parse_values("[a]\navg_kl_div=0.1\navg_kl_div=0.2\n") == {"a": 0.1, DEFAULT_LABEL: 0.2}


def test_nan_and_inf_are_the_worst_value_whichever_way_is_worse():
    """NaN logprobs (an FP8 overflow, say) are the clearest regression there
    is: SGLang's assertLess fails on them, and so must the bisect's value.
    For an accuracy (--worse lower) the worst is the lowest: read as the
    highest, a nan made the bad endpoint look better and the bisect was
    refused as a fix; under the min over labels it was hidden."""
    text = "[a]\navg_kl_div=nan\n[b]\navg_kl_div=inf\n[c]\navg_kl_div=0.003\n[d]\navg_kl_div=-inf\n"
    assert parse_values(text) == {"a": NONFINITE, "b": NONFINITE, "c": 0.003, "d": NONFINITE}
    assert scalar(parse_values(text)) == NONFINITE > 1e6
    assert parse_values("avg_kl_div=NaN") == {DEFAULT_LABEL: NONFINITE}
    # float32's overflow, or a value whose square overflows a spread: broken too
    assert parse_values("[a]\navg_kl_div=3.4e38\n[b]\navg_kl_div=-1e300\n") == {"a": NONFINITE, "b": NONFINITE}
    acc = parse_values("[gsm8k]\navg_kl_div=0.85\n[mmlu]\navg_kl_div=nan\n")
    assert scalar(acc, worse="lower") == -NONFINITE
    assert scalar(acc, "mmlu", worse="lower") == -NONFINITE and scalar(acc, "gsm8k", worse="lower") == 0.85
    assert broke(scalar(acc, worse="lower")) and not broke(0.85) and fmt_value(-NONFINITE) == "nan"


def test_colour_codes_and_numpy_scalars_are_read():
    assert parse_values("\x1b[32m[a] 3 samples\x1b[0m\n\x1b[32mavg_kl_div=0.0074\x1b[0m\n") == {"a": 0.0074}
    assert parse_values("avg_kl_div=np.float64(0.0082)\n") == {DEFAULT_LABEL: 0.0082}


def test_no_value_is_empty():
    assert parse_values("") == {}
    assert parse_values("Traceback (most recent call last):\nRuntimeError: CUDA error\n") == {}
    assert parse_values("kl_divs=[0.1, 0.2]\n") == {}


def test_regex_named_groups():
    text = "metric logprobs 0.004\nmetric prefill 0.012\nother 5\n"
    rx = r"metric (?P<label>\w+) (?P<value>[0-9.eE+-]+)"
    assert parse_values(text, rx) == {"logprobs": 0.004, "prefill": 0.012}


def test_regex_first_group_or_whole_match():
    assert parse_values("KL is 0.5 today", r"KL is ([0-9.]+)") == {DEFAULT_LABEL: 0.5}
    assert parse_values("0.25", r"[0-9.]+") == {DEFAULT_LABEL: 0.25}
    # a value group that does not parse is skipped
    assert parse_values("KL is abc", r"KL is (\w+)") == {}


def test_regex_without_a_label_keeps_every_match():
    # SGLang prints one avg_kl_div per label: a plain regex must not keep only the last one
    text = "[a]\navg_kl_div=0.004\n[b]\navg_kl_div=0.012\n[c]\navg_kl_div=0.005\n"
    got = parse_values(text, r"avg_kl_div=([0-9.]+)")
    assert got == {DEFAULT_LABEL: 0.004, f"{DEFAULT_LABEL}2": 0.012, f"{DEFAULT_LABEL}3": 0.005}
    assert scalar(got) == 0.012


def test_regex_anchors_match_at_every_line():
    """A new user's anchored regex (^ at each label line) read the first of three
    labels, and the run's min was over that one alone."""
    text = "[gsm8k] Accuracy: 0.780\n[mmlu] Accuracy: 0.620\n[arc] Accuracy: 0.850\n"
    rx = r"^\[(?P<label>\w+)\] Accuracy: (?P<value>[0-9.]+)$"
    assert parse_values(text, rx) == {"gsm8k": 0.78, "mmlu": 0.62, "arc": 0.85}


def test_an_anchored_regex_starts_a_new_series_of_runs():
    """Runs an anchored regex recorded before anchors matched at every line
    were read from the whole text: the probe's identity changes, so they are
    not mixed with runs read the new way; an unanchored regex keeps its own."""
    from klbisect.probe import CommandProbe, config_key
    for rx, changed in ((r"^kl=(?P<value>[0-9.]+)$", True), (r"kl=(?P<value>[0-9.]+)", False)):
        before = config_key("cmd", cmd="python probe.py", regex=rx)
        assert (CommandProbe("python probe.py", metric_regex=rx).key != before) is changed


def test_regex_disables_the_default_format():
    assert parse_values("avg_kl_div=0.1\nscore=0.7", r"score=(?P<value>[0-9.]+)") == {DEFAULT_LABEL: 0.7}


def test_json_lines():
    text = (f'{JSON_PREFIX}{{"label": "a", "value": 0.004}}\n'
            f'{JSON_PREFIX}{{"label": "b", "value": "0.012"}}\n'
            f'{JSON_PREFIX}{{"value": 0.5}}\n'
            f'{JSON_PREFIX}not json\n'
            f'{JSON_PREFIX}{{"label": "c"}}\n'
            f'{JSON_PREFIX}[1, 2]\n'
            f'{JSON_PREFIX}{{"label": "d", "value": NaN}}\n')
    assert parse_values(text) == {"a": 0.004, "b": 0.012, DEFAULT_LABEL: 0.5, "d": NONFINITE}


def test_json_lines_mix_with_sglang():
    text = SGLANG + f'{JSON_PREFIX}{{"label": "extra", "value": 0.001}}\n'
    v = parse_values(text)
    assert v["extra"] == 0.001 and v["prefill_cache_hit"] == 0.0118668


def test_scalar_max_or_chosen_label():
    v = parse_values(SGLANG)
    assert scalar(v) == 0.0118668
    assert scalar(v, "decode_cache_hit") == 0.00397411
    assert scalar(v, "missing") is None
    assert scalar({}) is None
    assert scalar({}, "x") is None


def test_values_are_finite_floats():
    v = parse_values(SGLANG)
    assert all(isinstance(x, float) and math.isfinite(x) for x in v.values())


def test_assertion_message_does_not_overwrite_the_last_label():
    """SGLang's assertion messages quote avg_kl_div=... again, and unittest
    prints them after every label: they are not measurements."""
    text = SGLANG + ("Traceback (most recent call last):\n"
                     "AssertionError: 0.0118668 not less than 0.01 : "
                     "avg_kl_div=0.0118668 >= threshold=0.01 for model prefill_cache_hit\n")
    assert parse_values(text) == parse_values(SGLANG)


def test_label_and_value_on_one_line():
    assert parse_values("[prefill] avg_kl_div=0.012\n[decode] n=3 avg_kl_div=0.004") == {
        "prefill": 0.012, "decode": 0.004}


def test_labels_after_unittest_progress_marks():
    """unittest's dots land on the next label line when stdout and stderr mix."""
    out = ("[decode_cache_hit] 8 samples\navg_kl_div=0.009\n"
           ".[logprobs_match] 8 samples\navg_kl_div=0.004\n"
           "F.[prefill_cache_hit] 8 samples\navg_kl_div=0.0105\nF\n")
    assert parse_values(out) == {"decode_cache_hit": 0.009, "logprobs_match": 0.004,
                                 "prefill_cache_hit": 0.0105}


# SGLang's kl_multiturn_utils prints "[label] N samples, T turns, max_new_tokens=M"
UNITTEST_FILE = """\
import unittest


def measure(label, value):
    print(f"[{label}] 18 samples, 2 turns, max_new_tokens=512")
    print(f"kl_divs={[value, value]}")
    print(f"avg_kl_div={value}")


class TestKL(unittest.TestCase):
    def test_decode_cache_hit(self):
        measure("decode_cache_hit", 0.0098)

    def test_logprobs_match(self):
        \"\"\"Helper 1: a docstring moves the name to its own line.\"\"\"
        measure("logprobs_match", 0.0047)

    def test_prefill_cache_hit(self):
        measure("prefill_cache_hit", 0.0045)
        self.assertLess(0.0045, 0.001, "avg_kl_div=0.0045 >= 0.001")


unittest.main()
"""


def test_labels_after_unittest_verbose_prefix(tmp_path):
    """`python3 test_x.py -v` writes "test_x (...) ... " to stderr with no
    newline, so the test's label lands mid-line; without reading it there,
    every value was "value" and the last label's KL won over the max."""
    test_file = tmp_path / "test_kl.py"
    test_file.write_text(UNITTEST_FILE)
    out = subprocess.run([sys.executable, str(test_file), "-v"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=tmp_path).stdout
    assert " ... [decode_cache_hit] 18 samples" in out, out   # the line the parser must read
    v = parse_values(out)
    assert v == {"decode_cache_hit": 0.0098, "logprobs_match": 0.0047, "prefill_cache_hit": 0.0045}, out
    assert scalar(v) == 0.0098


def test_labels_after_pytest_verbose_prefix():
    out = ("test_kl.py::TestKL::test_decode_cache_hit [decode_cache_hit] 18 samples, 2 turns, max_new_tokens=512\n"
           "avg_kl_div=0.0098\nPASSED\n"
           "test_kl.py::TestKL::test_logprobs_match [logprobs_match] 18 samples, 2 turns, max_new_tokens=512\n"
           "avg_kl_div=0.0047\nPASSED\n")
    assert parse_values(out) == {"decode_cache_hit": 0.0098, "logprobs_match": 0.0047}


def test_brackets_mid_line_are_not_labels():
    """Mid-line, only SGLang's "[label] N samples" after a test runner's
    prefix names a label: log prefixes and other bracketed text do not."""
    out = ("test_decode (x.T.test_decode) ... [decode_cache_hit] 18 samples, 2 turns\n"
           "avg_kl_div=0.0098\n"
           "test_gsm8k (x.T.test_gsm8k) ... [TestKL] GSM8K accuracy: 0.950 (threshold: 0.93)\n"
           "INFO 10:00:01 [logprobs_match] 18 samples, 2 turns\n"
           "server| [2026-01-01 10:00:02 TP0] [prefill_cache_hit] 18 samples\n"
           "test_x (x.T.test_x) ... [done] all samples\n"
           "avg_kl_div=0.0031\n")
    # none of the later lines named a label: the second value has none
    assert parse_values(out) == {"decode_cache_hit": 0.0098, DEFAULT_LABEL: 0.0031}


def test_a_run_that_failed_its_own_assertion_is_told_from_a_crash():
    from klbisect.metric import failed_its_check
    traceback = 'Traceback (most recent call last):\n  File "t.py", line 3, in <module>\n    assert v < 0.01\n'
    assert failed_its_check("avg_kl_div=0.02\n" + traceback + "AssertionError\n")
    assert failed_its_check(traceback + "AssertionError: 0.0123 not less than 0.01 : prefill_cache_hit\n")
    assert not failed_its_check(traceback + "RuntimeError: CUDA error: an illegal memory access\n")
    # the server's own assert crashed it, then the client failed on the lost connection
    assert not failed_its_check(traceback + "AssertionError\n" + traceback
                                + "requests.exceptions.ConnectionError: refused\n")
    # unittest's summary decides: failures only is the test's check, any error a crash
    assert failed_its_check("FAIL: test_kl (t.T.test_kl)\nAssertionError: 0.02 not less than 0.01\n"
                            "Ran 1 test in 3.1s\n\nFAILED (failures=1)\n")
    assert not failed_its_check("AssertionError: x\nFAILED (failures=1, errors=1)\n")
    assert failed_its_check("E       assert 0.0123 < 0.01\n")
    assert failed_its_check("E       AssertionError: kl too high\n")
    assert not failed_its_check("E       RuntimeError: CUDA error\n")
    assert not failed_its_check("avg_kl_div=0.004\n")


def test_a_crash_is_named_by_its_last_exception():
    from klbisect.metric import last_exception
    traceback = 'Traceback (most recent call last):\n  File "t.py", line 28, in setUpClass\n    raise X\n'
    log = ("setUpClass (__main__.TestKL) ... ERROR\n" + traceback
           + "RuntimeError: CUDA error: no kernel image is available for execution on the device\n\n"
           "Ran 0 tests in 0.000s\n\nFAILED (errors=1)\n")
    assert last_exception(log) == "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    # the one that ended the run, not an earlier one it led to
    assert last_exception(traceback + "AssertionError\n" + traceback
                          + "requests.exceptions.ConnectionError: refused\n") == \
        "requests.exceptions.ConnectionError: refused"
    assert last_exception("\x1b[31mValueError: bad\x1b[0m\n") == "ValueError: bad"
    assert len(last_exception("OSError: " + "x" * 500)) == 160
    # a probe that printed nothing of the kind names no exception
    assert last_exception("hello from the probe\nexit 3\n") is None


def test_a_long_subject_is_cut_before_its_pr_number():
    from klbisect.metric import fmt_subject
    cut = fmt_subject("[Perf] Route prefill Q/K/V through fp8 quant hook for DCP (#9844)", 60)
    assert cut == "[Perf] Route prefill Q/K/V through fp8 quant hook f… (#9844)" and len(cut) <= 60
    assert fmt_subject("short (#1)", 60) == "short (#1)"
    # a subject whose PR is cut off where it was typed still never shows half of one
    assert fmt_subject("Route prefill through the FP8 hook and more words here (#1", 40) == \
        "Route prefill through the FP8 hook and…"
