"""The direct reader of plain block mappings gives exactly what the full PyYAML path gives, or declines."""

from __future__ import annotations

import yaml
from fuzzing import same_value
from hypothesis import example, given, settings
from hypothesis import strategies as st

from automodel_dist.config.load import load_text
from automodel_dist.config.simple_yaml import read_simple

_KEYS = ["distributed", "tp_size", "pipeline", "pp_schedule", "_target_", "a-b", "on", "yes", "null", "No", "y",
         "x_", "True", "key"]
_VALUES = [
    # plain words and numbers, as PyYAML 1.1 resolves them
    "2", "2.0", "0", "017", "09", "0x1F", "1_000", "1e3", "1e-5", "1.0e-5", "1.5e+3", "-1e-3", ".inf", "-.NaN", ".",
    "...", "~", "null", "Null", "none", "None", "yes", "off", "True", "fsdp2", "megatron-fsdp", "interleaved1f1b",
    "-1", "+2", "-x", "+.5", "a.b/c", "_x", "~x", "a+b", "x-", "1-2", "meta-llama/Llama-3.2-1B", "a/*.txt", "x*",
    # quoted strings and flow collections
    '"2"', '"a b # c"', "'x'", "'it''s'", '"\\t"', "{}", "[]", "[ ]", "[0.9, 0.999]", "[1,2]", "[ a , b ]",
    "[on, off, ~]", "[-1, +2, 1e-5]", "[x*y]", "[a b]", "[1, 2,]", "[2024-01-01]", "[[1]]", "{a: 1}",
    # what the direct reader must leave to the full loader
    "2024-01-01", "1:30", "a b", "$VAR", "${VAR,2}", "x#y", "&a 1", "*a", "!!str 2", "|", ">", "- 1", "-", "a: b", "",
]
_COMMENTS = ["", " # note", "  #", "# no space"]


@st.composite
def _texts(draw) -> str:
    lines = []
    for _ in range(draw(st.integers(0, 9))):
        kind = draw(st.sampled_from(["kv", "kv", "kv", "open", "open", "comment", "blank", "odd"]))
        indent = " " * draw(st.sampled_from([0, 0, 2, 2, 4, 1, 3, 6]))
        if kind == "kv":
            lines.append(f"{indent}{draw(st.sampled_from(_KEYS))}: {draw(st.sampled_from(_VALUES))}"
                         f"{draw(st.sampled_from(_COMMENTS))}")
        elif kind == "open":
            lines.append(f"{indent}{draw(st.sampled_from(_KEYS))}:{draw(st.sampled_from(['', '  ', ' # c']))}")
        elif kind == "comment":
            lines.append(f"{indent}# {draw(st.sampled_from(_KEYS))}: 1")
        elif kind == "blank":
            lines.append(indent)
        else:
            lines.append(indent + draw(st.sampled_from(["- 1", "---", "...", "\tk: 1", "k:\t1", "k: 1\r", "é: 1",
                                                        "k :1", "k:1", "[a]: 1", "? k", "%YAML 1.1"])))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n\n"]))


_SAFE_VALUES = [v for v in _VALUES if v not in {"{a: 1}", "a b", "$VAR", "${VAR,2}", "x#y", "&a 1", "*a",
                                                 "!!str 2", "|", ">", "- 1", "-", "a: b", "2024-01-01", "1:30",
                                                 "'it''s'", '"\\t"'}]


@st.composite
def _trees(draw, depth: int = 0) -> list[tuple[str, object]]:
    """A mapping as (key, value) pairs: a value is a scalar's text, None (`key:`) or a nested mapping."""
    pool = _KEYS[:6] + ["dp_size", "cp_size", "ep_size", "moe", "dtype"]
    keys = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=5, unique=True))
    if draw(st.integers(0, 7)) == 0:
        keys.append(keys[0])  # a duplicate key
    pairs = []
    for key in keys:
        if depth < 3 and draw(st.integers(0, 3)) == 0:
            pairs.append((key, draw(_trees(depth + 1))))
        else:
            pairs.append((key, draw(st.sampled_from(_SAFE_VALUES + [None]))))
    return pairs


@st.composite
def _block_texts(draw) -> str:
    """Mostly well-formed nested block mappings (consistent indentation, comments, blank lines)."""
    step = draw(st.sampled_from([2, 2, 4, 1, 3]))
    out: list[str] = []

    def render(pairs, indent):
        for key, value in pairs:
            if draw(st.integers(0, 6)) == 0:
                out.append(" " * draw(st.integers(0, 8)) + draw(st.sampled_from(["", "# c", "#"])))
            comment = draw(st.sampled_from(["", "", "", "", "", "", " # note", "  #", "# glued"]))
            if isinstance(value, list):
                out.append(f"{' ' * indent}{key}:{comment}")
                render(value, indent + step)
            else:
                out.append(f"{' ' * indent}{key}:{'' if value is None else ' ' + value}{comment}")

    render(draw(_trees()), 0)
    return "\n".join(out) + "\n"


@settings(max_examples=1500, deadline=None)
@given(st.one_of(_texts(), _block_texts()))
@example("distributed:\n  tp_size: 2\n  pipeline:\n    pp_schedule: 1f1b\n  cp_size:\nmodel:\n  x: 1\n")
@example("a:\nb:\n")
@example("a:\n    b: 1\n  c: 2\n")
def test_direct_reader_equals_pyyaml(text):
    direct = read_simple(text)
    full = load_text(text, simple=False)
    if direct is None:
        return
    data, lines = direct
    assert not [f for f in full.findings if f.rule.startswith("yaml-")], (text, full.findings)
    assert same_value(data, yaml.load(text, Loader=yaml.SafeLoader))  # PyYAML itself, before AutoModel's semantics
    assert lines == full.lines
    fast = load_text(text)
    assert same_value(fast.data, full.data) and fast.lines == full.lines and fast.findings == full.findings


def test_the_usual_configs_are_read_directly():
    """Plain blocks, comments, quotes, empty flow mappings and nesting take the direct path; the rest do not."""
    accepted = [
        "distributed:\n  strategy: ddp\n",
        "distributed:  # the block\n  tp_size: 2\n  pipeline: {}\n\n  moe:\n    reshard_after_forward: false\n",
        "# recipe\nstep_scheduler:\n  local_batch_size: 8\ndistributed:\n  pp_size: 4\n  pipeline:\n"
        "    pp_schedule: 'interleaved1f1b'\n    dtype: \"bfloat16\"\n  cp_size: ~\n",
        "model:\n  pretrained_model_name_or_path: meta-llama/Llama-3.2-1B\noptimizer:\n  betas: [0.9, 0.999]\n"
        "  lr: 1.0e-5\n  paths: /data/shard_*.bin\n",
    ]
    for text in accepted:
        assert read_simple(text) is not None, text
    declined = ["a:\n  - 1\n", "a: &x 1\nb: *x\n", "a: 1\na: 2\n", "on: 1\n", "a: |\n  x\n", "---\na: 1\n",
                "a: 2024-01-01\n", "a: [x y]\n", "a: [1, [2]]\n", "a:\tb\n", "a: é\n", "  a: 1\n", "", "# only\n", "a: 1:30\n"]
    for text in declined:
        assert read_simple(text) is None, text
