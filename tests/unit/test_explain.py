"""explain_error on text as people paste it: every rule's message survives the ways a paste changes it, and a
collective timeout inside a checkpoint save is explained as the save's straggler."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable
from re import _constants as C  # noqa: PLC2701 (the parser the examples are built from)
from re import _parser as sre  # noqa: PLC2701

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from automodel_dist.explain import explain_error, normalise, tolerant
from automodel_dist.rules import RULES

PATTERNS = [pytest.param(r.id, p, id=f"{r.id}:{i}") for r in RULES.values() for i, p in enumerate(r.patterns)]
_CATEGORY = {
    C.CATEGORY_DIGIT: r"\d",
    C.CATEGORY_NOT_DIGIT: r"\D",
    C.CATEGORY_SPACE: r"\s",
    C.CATEGORY_NOT_SPACE: r"\S",
    C.CATEGORY_WORD: r"\w",
    C.CATEGORY_NOT_WORD: r"\W",
}


def _in_class(ch: str, items: list) -> bool:
    negate, hit = False, False
    for op, value in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            hit |= ch == chr(value)
        elif op is C.RANGE:
            hit |= value[0] <= ord(ch) <= value[1]
        elif op is C.CATEGORY:
            hit |= re.fullmatch(_CATEGORY[value], ch) is not None
    return hit != negate


def _member(items: list) -> str:
    """A plain character of the class: its own first literal, else a letter, digit or separator it allows."""
    own = [chr(v) for op, v in items if op is C.LITERAL] if all(op is not C.NEGATE for op, _ in items) else []
    for ch in [*own, *"a1x_-./:", " "]:
        if _in_class(ch, items):
            return ch
    raise AssertionError(f"no plain member in {items}")


def _emit(items) -> str:
    out = []
    for op, av in items:
        if op is C.LITERAL:
            out.append(chr(av))
        elif op is C.NOT_LITERAL:
            out.append("y" if chr(av) == "x" else "x")
        elif op is C.ANY:
            out.append("x")
        elif op is C.IN:
            out.append(_member(av))
        elif op in (C.MAX_REPEAT, C.MIN_REPEAT, C.POSSESSIVE_REPEAT):
            low, high, sub = av
            out.append(_emit(sub) * (max(low, 1) if high else 0))
        elif op is C.SUBPATTERN:
            out.append(_emit(av[-1]))
        elif op is C.BRANCH:
            out.append(_emit(av[1][0]))
        elif op in (C.AT, C.ASSERT, C.ASSERT_NOT):
            continue
        else:
            raise AssertionError(f"example generator: unhandled {op}")
    return "".join(out)


def example(pattern: str) -> str:
    """The plainest text the pattern matches (one repetition, first alternative, letters for classes)."""
    text = _emit(sre.parse(pattern))
    assert re.search(pattern, text), (pattern, text)
    return text


def _lines(f: Callable[[str], str]) -> Callable[[str], str]:
    return lambda text: "\n".join(f(line) for line in text.split("\n"))


def _curly(text: str) -> str:
    text = re.sub(r"'([^'\n]*)'", "\u2018\\1\u2019", text)
    text = re.sub(r'"([^"\n]*)"', "\u201c\\1\u201d", text)
    return text.replace("'", "\u2019")


RETYPED = ("quotes dropped", "quotes swapped", "curly quotes", "retyped with a colon")
PASTES: dict[str, Callable[[str, int, int], str]] = {
    "quotes dropped": lambda t, w, r: re.sub("['\"`]", "", t),
    "quotes swapped": lambda t, w, r: t.translate(str.maketrans({"'": '"', '"': "'"})),
    "curly quotes": lambda t, w, r: _curly(t),
    "retyped with a colon": lambda t, w, r: re.sub(r" ['\"`]([^'\"`\s]*)['\"`]", r": \1", t),
    "wrapped": lambda t, w, r: _lines(lambda line: textwrap.fill(line, width=w, break_long_words=False))(t),
    "ANSI colours": lambda t, w, r: _lines(lambda line: f"\x1b[1;31m{line}\x1b[0m")(t),
    "[rankN]:": lambda t, w, r: _lines(lambda line: f"[rank{r}]: {line}")(t),
    "[defaultN]:": lambda t, w, r: _lines(lambda line: f"[default{r}]:{line}")(t),
    "srun -l": lambda t, w, r: _lines(lambda line: f"{r}: {line}")(t),
    "ISO timestamp": lambda t, w, r: _lines(lambda line: f"2026-12-02T05:25:54.123456Z {line}")(t),
    "AutoModel log": lambda t, w, r: _lines(lambda line: f"2026-12-02 05:25:54 | ERROR | root | {line}")(t),
    "glog": lambda t, w, r: _lines(lambda line: f"[E1202 05:25:54.123456 {r}771 ProcessGroupNCCL.cpp:1682] {line}")(t),
    "bracketed time": lambda t, w, r: _lines(lambda line: f"[05:25:54] {line}")(t),
}


@pytest.mark.parametrize("rule,pattern", PATTERNS)
@given(
    pastes=st.lists(st.sampled_from(sorted(PASTES)), max_size=4, unique=True),
    width=st.integers(12, 100),
    rank=st.integers(0, 1023),
)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_every_message_survives_pasting(rule, pattern, pastes, width, rank):
    text = example(pattern)
    # what a person does to the message (retyping, quotes) comes before what the log adds around it (rank
    # prefixes, wrapping, colours): a quote retyped as a colon after a "0: " prefix would rewrite the prefix itself
    for name in sorted(pastes, key=lambda n: n not in RETYPED):
        text = PASTES[name](text, width, rank)
    found = {m.rule for m in explain_error(f"Traceback (most recent call last):\n{text}\n").matches}
    assert rule in found, f"{pastes}: {text!r}"


def test_every_paste_alone_on_every_message():
    """Each way of pasting, on its own and at a narrow width, on every pattern (no sampling)."""
    missed = []
    for param in PATTERNS:
        rule, pattern = param.values
        for name, paste in PASTES.items():
            text = paste(example(pattern), 16, 3)
            if rule not in {m.rule for m in explain_error(text).matches}:
                missed.append((rule, name, text))
    assert not missed


def test_a_retyped_schedule_name_is_found_with_its_value():
    for text in (
        "Unknown schedule name: interleaved_1f1b",
        "ValueError: Unknown schedule name 'interleaved_1f1b'",
        "Unknown schedule name \u201cinterleaved_1f1b\u201d",
        "Unknown schedule name interleaved_1f1b",
    ):
        (match,) = explain_error(text).matches
        assert match.rule == "pp-schedule-unknown"
        assert match.matched.strip("'\"").endswith("interleaved_1f1b"), text


def test_prefixes_leave_lines_and_ranks_as_pasted():
    log = (
        "\x1b[32m2026-12-02 05:25:54 | INFO | root | step 1 | epoch 0 | loss 2.1\x1b[0m\n"
        "\x1b[31m[default6]:[rank6]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\x1b[0m\n"
    )
    (match,) = explain_error(log).matches
    assert (match.rule, match.line, match.ranks) == ("runtime-oom", 2, [6])
    assert match.matched == "CUDA out of memory"
    assert normalise(log).split("\n")[1].startswith("torch.OutOfMemoryError")


@pytest.mark.parametrize(
    "pattern,pasted,expected",
    [
        (r"name '([^']*)'", "name: pp", "pp"),
        (r"name '([^']*)' x", "name `pp`, x", "pp"),
        (r"Cuda failure '?out of memory", 'Cuda failure "out of memory', None),
        (r"a *b", "a  b", None),
        (r"a\ b\'c\'", 'a b"c"', None),
        (r"[]'] z", "' z", None),
        (r"pp-size", "pp-\n  size", None),
    ],
)
def test_tolerant_patterns(pattern, pasted, expected):
    m = re.search(tolerant(pattern), pasted)
    assert m, (tolerant(pattern), pasted)
    if expected is not None:
        assert m.group(1) == expected


def test_tolerant_keeps_every_rule_pattern_compilable_and_matching_its_original_text():
    for param in PATTERNS:
        _, pattern = param.values
        assert re.search(tolerant(pattern), example(pattern)), pattern


SAVE_START = (
    "2026-12-02 05:00:00 | INFO | nemo_automodel.recipes.base_recipe | Saving checkpoint to "
    "/ckpt/epoch_0_step_999\n"
    "2026-12-02 05:00:01 | INFO | nemo_automodel.components.checkpoint._backports.consolidate_hf_safetensors | "
    "Consolidating safetensors files from /ckpt/epoch_0_step_999/model to /ckpt/epoch_0_step_999/model/consolidated.\n"
)


def _watchdog(rank: int, op: str = "BROADCAST") -> str:
    return (
        f"[rank{rank}]:[E1202 05:01:01.123456 1234 ProcessGroupNCCL.cpp:632] [Rank {rank}] Watchdog caught "
        f"collective operation timeout: WorkNCCL(SeqNum=5123, OpType={op}, NumelIn=1, NumelOut=1, "
        "Timeout(ms)=60000) ran for 60012 milliseconds before timing out.\n"
    )


def test_a_timeout_inside_a_save_is_the_save_straggler_not_a_failing_rank():
    report = explain_error(SAVE_START + "".join(_watchdog(r) for r in (1, 2, 3)))
    first, then = report.matches
    assert (first.rule, first.consequence, first.line, first.ranks) == (
        "runtime-checkpoint-straggler",
        False,
        2,
        [1, 2, 3],
    )
    assert first.matched == "Consolidating safetensors files from /ckpt/epoch_0_step_999/model"
    assert "OpType=BROADCAST with NumelIn=1 is DCP's final broadcast" in first.cause
    assert "single_rank_consolidation" in first.cause
    assert "The NCCL timeout was 1 min (the recipes' dist_env.timeout_minutes default)" in first.cause
    assert "Ranks [1, 2, 3] timed out waiting; none of them is the cause." in first.cause
    assert "save_consolidated: false" in first.fix and "dist_env.timeout_minutes" in first.fix
    assert (then.rule, then.consequence) == ("runtime-collective-timeout", True)


def test_a_barrier_timeout_in_a_save_names_rank_zero_file_work():
    text = SAVE_START.split("\n")[0] + "\n" + _watchdog(4, "ALLREDUCE")
    first = explain_error(text).matches[0]
    assert first.rule == "runtime-checkpoint-straggler" and first.line == 1
    assert "rank 0 did its own filesystem work" in first.cause and "max_recent_checkpoints" in first.cause


def test_the_gloo_consolidation_timeout_is_the_straggler():
    gloo = (
        "[rank9]: RuntimeError: Failed to synchronize safetensors consolidation status across ranks. A peer may have "
        "exited before reporting its original exception; inspect the first failing rank's traceback. Synchronization "
        "error: RuntimeError: [../gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 1800000ms for send "
        "operation to complete\n"
    )
    alone = explain_error(gloo).matches
    assert alone[0].rule == "runtime-checkpoint-straggler" and alone[0].ranks == [9]
    in_save = explain_error(SAVE_START + gloo).matches[0]
    assert in_save.rule == "runtime-checkpoint-straggler" and in_save.line == 2
    assert "consolidation_timeout_minutes (30 by default)" in in_save.cause


@pytest.mark.parametrize(
    "between",
    [
        "2026-12-02 05:03:00 | INFO | nemo_automodel.components.checkpoint.checkpointing | Successfully exported "
        "consolidated HF safetensors to /ckpt/epoch_0_step_999/model/consolidated.\n",
        "2026-12-02 05:04:00 | INFO | root | step 1000 | epoch 0 | loss 1.2345 | grad_norm 0.5 | lr 1.00e-05\n",
    ],
)
def test_a_timeout_after_the_save_finished_is_not_blamed_on_it(between):
    rules = [m.rule for m in explain_error(SAVE_START + between + _watchdog(1)).matches]
    assert rules == ["runtime-collective-timeout"]
