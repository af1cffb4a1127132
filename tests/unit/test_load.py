"""Loading: line numbers for every key, merge keys, AutoModel's value semantics, hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from automodel_dist.config.load import MAX_BYTES, load_path, load_text
from automodel_dist.config.values import translate_value


def test_lines_for_nested_keys_and_list_items():
    doc = load_text("a:\n  b:\n    c: 1\n  d: [1, 2]\nlist:\n  - x: 1\n  - y: 2\n")
    assert doc.line(("a",)) == 1 and doc.line(("a", "b", "c")) == 3 and doc.line(("a", "d")) == 4
    assert doc.line(("list", 1, "y")) == 7
    assert doc.line(("a", "b", "missing")) == 2  # nearest ancestor


def test_merge_keys_follow_yaml_and_keep_explicit_values():
    doc = load_text("base: &b {tp_size: 2, cp_size: 2}\ndistributed:\n  <<: *b\n  cp_size: 4\n")
    assert doc.data["distributed"] == {"tp_size": 2, "cp_size": 4}
    assert not doc.findings


def test_duplicate_keys_reported_with_both_lines():
    doc = load_text("x: 1\ny: 2\nx: 3\n")
    assert doc.data == {"x": 3, "y": 2}  # PyYAML keeps the last, so do we
    (f,) = doc.findings
    assert f.rule == "yaml-duplicate-key" and f.line == 3 and "lines 1 and 3" in f.message


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("none", None),
        ("None", None),
        ("true", True),
        ("False", False),
        ("2", 2),
        ("1e-5", 1e-5),
        ("[1, 2]", [1, 2]),
        ("{'a': 1}", {"a": 1}),
        ("-3", -3),
        ("bfloat16", "bfloat16"),
        ("1f1b", "1f1b"),
        ("__import__('os')", "__import__('os')"),
        ("2 + 2", "2 + 2"),
        ("[" * 100 + "]" * 100, "[" * 100 + "]" * 100),
    ],
)
def test_translate_value_matches_automodel_semantics(raw, expected):
    assert translate_value(raw) == expected


@given(st.text(max_size=60))
def test_translate_value_agrees_with_automodel(text):
    oracle = pytest.importorskip("nemo_automodel.components.config.loader")
    try:
        theirs = oracle.translate_value(text)
    except (RecursionError, MemoryError):  # ast.literal_eval can blow the stack; we never do
        return
    assert translate_value(text) == theirs or (theirs != theirs)  # NaN compares unequal


_NAME_PARTS = st.sampled_from(
    [
        "ddp",
        "fsdp2",
        "torch",
        "bfloat16",
        "None",
        "True",
        "false",
        "none",
        "if",
        "not",
        "lambda",
        "__debug__",
        "_target_",
        "x1",
        "1x",
        "",
        " ",
        "\u00e9t\u00e9",
        "\ufb01",
        "b'x'",
        "r''",
        "...",
        "inf",
        "nan",
        "e5",
        "0x1",
    ]
)


@given(st.lists(_NAME_PARTS, min_size=1, max_size=4), st.sampled_from(["", " ", "\t", "  "]))
def test_translate_value_of_name_like_strings_agrees_with_automodel(parts, lead):
    """Dotted names skip the literal parse; that shortcut must agree with AutoModel on every such string."""
    oracle = pytest.importorskip("nemo_automodel.components.config.loader")
    text = lead + ".".join(parts)
    theirs = oracle.translate_value(text)
    assert translate_value(text) == theirs or (theirs != theirs)


_SCALARS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.from_regex(r"\A[+-]?(0|0b[01_]+|0x[0-9a-f_]+|0[0-7_]+|[1-9][0-9_]*|[0-9]+(:[0-5][0-9])+)\Z"),
    st.sampled_from(["1.5", "1e3", ".inf", "-.NaN", "~", "null", "yes", "No", "on", "2024-01-01", "0o17", "١٢"]),
    st.text(alphabet="0123456789_-+.:exobXO", min_size=1, max_size=12),
)


@given(st.lists(_SCALARS, min_size=1, max_size=6))
def test_plain_scalars_load_as_pyyaml_reads_them(values):
    """The loader's scalar shortcuts (str, int) agree with PyYAML's own constructors, then AutoModel's semantics."""
    import yaml

    from automodel_dist.config.load import from_mapping

    text = "".join(f"k{i}: {v}\n" for i, v in enumerate(values))
    try:
        expected = from_mapping(yaml.safe_load(text)).data
    except (yaml.YAMLError, ValueError):
        assert load_text(text).findings
        return
    doc = load_text(text)
    assert not [f for f in doc.findings if f.severity == "error"]
    assert doc.data == expected or doc.data != doc.data or repr(doc.data) == repr(expected)  # NaN != NaN


def test_value_semantics_in_yaml():
    doc = load_text('d:\n  tp_size: "2"\n  dp_size: none\n  lr: 1e-5\n  _target_: "2"\n  loss_fn: "3"\n')
    assert doc.data["d"] == {"tp_size": 2, "dp_size": None, "lr": 1e-5, "_target_": "2", "loss_fn": "3"}


def test_env_vars_are_not_read_from_this_machine(monkeypatch):
    monkeypatch.setenv("TP_FROM_ENV", "8")
    doc = load_text("tp_size: ${TP_FROM_ENV}\ncp_size: ${CP,2}\n")
    assert doc.data["cp_size"] == 2
    assert doc.data["tp_size"] == "${TP_FROM_ENV}"  # unresolved marker, value not read
    assert [f.severity for f in doc.findings] == ["warning", "info"] or [f.severity for f in doc.findings] == [
        "info",
        "warning",
    ]


def test_alias_bomb_is_bounded():
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, cur in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]")
    doc = load_text("\n".join(lines) + "\n")
    assert doc.data is None and doc.findings[0].rule == "yaml-too-complex"


def test_deep_nesting_and_size_cap_and_bad_bytes(tmp_path):
    assert load_text("[" * 5000 + "]" * 5000).findings[0].rule in ("yaml-syntax", "yaml-too-deep")
    assert load_text("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 80))).findings[0].rule == "yaml-too-deep"
    assert load_text("x: 1\n" * (MAX_BYTES // 4)).findings[0].rule == "yaml-too-large"
    assert load_text(b"tp_size: \xff\xfe\n").findings[0].rule == "yaml-not-utf8"
    assert load_path(tmp_path).findings[0].rule == "file-unreadable"  # a directory
    assert load_path(tmp_path / "missing.yaml").findings[0].rule == "file-unreadable"
