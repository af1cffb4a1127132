"""AutoModel 0.7.0's value semantics, as pure functions (no torch).

Each function here mirrors one piece of AutoModel code so that the rules can ask
"what would AutoModel do with this value?" without importing it:

- ``translate_value``: ``components/config/loader.py::translate_value`` (YAML scalars)
- ``automodel_degree``: ``components/distributed/mesh_utils.py::_degree``
- ``normalize_activation_checkpointing``: ``recipes/_dist_utils.py``
- ``normalize_ac_scope``: ``components/distributed/config.py``
- ``dtype_name``: ``shared/utils.py::dtype_from_str``
- ``schedule_class_name``: torch's ``pipelining.schedules.get_schedule_class``
- ``import_path_problem``: ``components/config/loader.py::_resolve_target`` (``_target_``, ``*_fn``)
"""

from __future__ import annotations

import ast
from pathlib import PurePosixPath
from typing import Any


def clip(text: str, limit: int = 40) -> str:
    """``text`` shortened for a message (huge values must not flood a report)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


# --------------------------------------------------------------------------- strategy
STRATEGY_ALIASES: dict[str, str] = {
    "fsdp2": "fsdp2",
    "megatron_fsdp": "megatron_fsdp",
    "megatron-fsdp": "megatron_fsdp",
    "mfsdp": "megatron_fsdp",
    "ddp": "ddp",
}
STRATEGIES: tuple[str, ...] = ("fsdp2", "megatron_fsdp", "ddp")

SIZE_KEYS: tuple[str, ...] = ("tp_size", "pp_size", "cp_size", "ep_size", "dp_size", "dp_replicate_size")
SIZE_DEFAULTS: dict[str, int | None] = {
    "tp_size": 1,
    "pp_size": 1,
    "cp_size": 1,
    "ep_size": 1,
    "dp_size": None,
    "dp_replicate_size": None,
}
HYDRA_KEYS: tuple[str, ...] = ("_target_", "_recursive_", "_convert_")
# Keys parse_distributed_section pops before the strategy options are forwarded.
TOP_LEVEL_KEYS: tuple[str, ...] = ("strategy", *SIZE_KEYS, "pipeline", "moe", "activation_checkpointing", *HYDRA_KEYS)

# The manager classes real configs still name in ``_target_`` (AutoModel ignores it).
MANAGER_TARGETS: dict[str, str] = {
    "nemo_automodel.components.distributed.fsdp2.FSDP2Manager": "fsdp2",
    "nemo_automodel.components.distributed.megatron_fsdp.MegatronFSDPManager": "megatron_fsdp",
    "nemo_automodel.components.distributed.ddp.DDPManager": "ddp",
}


def import_path_problem(value: str) -> str | None:
    """Why AutoModel's loader can never resolve ``value`` as a ``_target_`` / ``*_fn`` import path.

    ``ConfigNode`` resolves these strings when the recipe is loaded: ``pkg.mod.attr`` (longest
    importable prefix, then attributes) or ``path/to/file.py:attr``. Whether a well-formed path
    resolves depends on the machine that runs the recipe, so only paths that fail everywhere are
    reported. Nothing is imported here.
    """
    if ":" in value:
        file_part, attr = value.split(":", 1)
        if PurePosixPath(file_part).suffix != ".py":
            return "the part before ':' must be a .py file (AutoModel raises AssertionError)"
        if not attr.isidentifier():
            return f"{attr!r} after ':' is not an attribute name"
        if attr.startswith("_"):
            return f"{attr!r} is private: AutoModel's loader refuses private attributes of a file (ImportError)"
        return None
    if not all(part.isidentifier() for part in value.split(".")):
        return "it is not a dotted import path (ImportError: Cannot resolve target)"
    if "." not in value:  # only a top-level module can match, and a module is neither a class nor a function
        return (
            "a bare name with no dots can only resolve to a top-level module, never a class or function "
            "(ImportError: Cannot resolve target, or a module AutoModel then cannot call)"
        )
    return None


def automodel_degree(value: Any) -> int:
    """``mesh_utils._degree``: a positive int is kept, anything else silently becomes 1.

    ``True`` is an ``int`` in Python, so AutoModel keeps it (and later fails in torch).
    """
    return value if isinstance(value, int) and value > 0 else 1


def is_positive_int(value: Any) -> bool:
    """A real positive integer (not a bool, not a float such as 2.0)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def is_nonneg_int(value: Any) -> bool:
    """A real integer >= 0 (not a bool, not a float such as 2.0)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --------------------------------------------------------------------------- YAML scalars
_SPECIAL = {"none": None, "None": None, "true": True, "True": True, "false": False, "False": False}
_MAX_LITERAL_CHARS = 1000  # AutoModel skips literal parsing above this length
_MAX_LITERAL_DEPTH = 32


class _NotLiteral(Exception):
    pass


def _literal(node: ast.AST, depth: int = 0) -> Any:
    """Evaluate a literal-only AST (the subset ``ast.literal_eval`` accepts), bounded in depth.

    Nothing is executed: only constants, containers and signed numbers are walked.
    """
    if depth > _MAX_LITERAL_DEPTH:
        raise _NotLiteral
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_literal(e, depth + 1) for e in node.elts]
        if isinstance(node, ast.List):
            return items
        if isinstance(node, ast.Tuple):
            return tuple(items)
        try:
            return set(items)
        except TypeError as exc:  # unhashable element
            raise _NotLiteral from exc
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _NotLiteral
        try:
            return {_literal(k, depth + 1): _literal(v, depth + 1) for k, v in zip(node.keys, node.values)}
        except TypeError as exc:
            raise _NotLiteral from exc
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        operand = _literal(node.operand, depth + 1)
        if isinstance(operand, (int, float, complex)) and not isinstance(operand, bool):
            return +operand if isinstance(node.op, ast.UAdd) else -operand
        raise _NotLiteral
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        left, right = _literal(node.left, depth + 1), _literal(node.right, depth + 1)
        if isinstance(left, (int, float)) and isinstance(right, complex):
            return left + right if isinstance(node.op, ast.Add) else left - right
        raise _NotLiteral
    raise _NotLiteral


def _plain_name(text: str) -> bool:
    """True for ``name`` or ``a.b.c``, which Python parses as a name or an attribute, never a literal."""
    return text not in _SPECIAL and all(part.isidentifier() for part in text.split("."))


def translate_value(value: Any) -> Any:
    """AutoModel's ``translate_value``: how its YAML loader reads a string scalar.

    ``none``/``None`` -> None, ``true``/``false`` -> bool, Python literals ("2", "1e-5",
    "[1, 2]") -> their value, anything else stays a string. Non-strings pass through.
    """
    if not isinstance(value, str):
        return value
    if value in _SPECIAL:
        return _SPECIAL[value]
    if value.isidentifier():  # the usual case (fsdp2, interleaved1f1b): a name, never a literal
        return value
    if len(value) > _MAX_LITERAL_CHARS:
        return value
    text = value.lstrip(" \t")
    if _plain_name(text):  # a (dotted) name such as ddp or torch.bfloat16 is never a literal: skip the parse
        return value
    try:
        tree = ast.parse(text, mode="eval")
        return _literal(tree.body)
    except (SyntaxError, ValueError, _NotLiteral, RecursionError, MemoryError, OverflowError):
        return value


# --------------------------------------------------------------------------- activation checkpointing
AC_FALSE = frozenset({"false", "off", "none", "disabled", "no"})
AC_TRUE = frozenset({"true", "on", "full", "enabled", "yes"})
AC_STRATEGIES_SELECTIVE = frozenset({"fsdp2", "ddp"})


def normalize_activation_checkpointing(value: Any) -> bool | str:
    """Mirror of ``_normalize_activation_checkpointing``; raises ``ValueError`` like AutoModel."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        normalized = value.lower().replace("-", "_")
        if normalized in AC_FALSE:
            return False
        if normalized in AC_TRUE:
            return True
        if normalized == "selective":
            return "selective"
    raise ValueError("distributed.activation_checkpointing must be a boolean or one of 'full', 'selective', 'false'.")


AC_SCOPES = ("all", "language", "vision", "audio", "multimodal")


def normalize_ac_scope(value: Any) -> tuple[str, ...]:
    """Mirror of ``normalize_activation_checkpointing_scope``; raises ``ValueError``."""
    if value is None:
        return ("all",)
    if isinstance(value, str):
        raw_parts = value.lower().replace("-", "_").replace("+", ",").split(",")
    elif isinstance(value, (list, tuple, set)):
        raw_parts = []
        for item in value:
            if not isinstance(item, str):
                raise ValueError("activation_checkpointing_scope entries must be strings.")
            raw_parts.extend(item.lower().replace("-", "_").replace("+", ",").split(","))
    else:
        raise ValueError("activation_checkpointing_scope must be a string or list of strings.")
    scopes: list[str] = []
    for part in raw_parts:
        scope = part.strip()
        if not scope:
            continue
        if scope in {"default", "auto"}:
            scope = "all"
        if scope not in AC_SCOPES:
            raise ValueError(
                f"activation_checkpointing_scope must use only: {', '.join(sorted(AC_SCOPES))}. Got {part!r}."
            )
        if scope not in scopes:
            scopes.append(scope)
    if not scopes:
        return ("all",)
    if "all" in scopes and len(scopes) > 1:
        raise ValueError("activation_checkpointing_scope='all' cannot be combined with other scopes.")
    return tuple(scopes)


# --------------------------------------------------------------------------- dtypes
_DTYPE_LUT: dict[str, str] = {
    "torch.float": "float32",
    "torch.float32": "float32",
    "torch.float64": "float64",
    "torch.double": "float64",
    "torch.complex64": "complex64",
    "torch.cfloat": "complex64",
    "torch.float16": "float16",
    "torch.half": "float16",
    "torch.bfloat16": "bfloat16",
    "torch.uint8": "uint8",
    "torch.int8": "int8",
    "torch.int16": "int16",
    "torch.short": "int16",
    "torch.int32": "int32",
    "torch.int": "int32",
    "torch.int64": "int64",
    "torch.long": "int64",
    "torch.bool": "bool",
    "bf16": "bfloat16",
}
FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def dtype_name(value: str) -> str | None:
    """``dtype_from_str`` for strings: the canonical torch dtype name, or None if AutoModel raises."""
    low = value.lower()
    if low in _DTYPE_LUT:
        return _DTYPE_LUT[low]
    return _DTYPE_LUT.get("torch." + low)


def dtype_spellings() -> list[str]:
    """The dtype spellings AutoModel accepts (without the optional ``torch.`` prefix)."""
    return sorted({k.removeprefix("torch.") for k in _DTYPE_LUT})


# --------------------------------------------------------------------------- pipeline schedules
# torch.distributed.pipelining.schedules.get_schedule_class (torch 2.6 .. 2.13), case-insensitive.
SCHEDULES: dict[str, str] = {
    name.lower(): name
    for name in (
        "1F1B",
        "Interleaved1F1B",
        "GPipe",
        "LoopedBFS",
        "InterleavedZeroBubble",
        "PipelineScheduleSingle",
        "PipelineScheduleMulti",
        "ZBVZeroBubble",
        "DualPipeV",
    )
}
ABSTRACT_SCHEDULES = frozenset({"PipelineScheduleSingle", "PipelineScheduleMulti"})
SINGLE_STAGE_SCHEDULES = frozenset({"1F1B", "GPipe", "PipelineScheduleSingle"})
V_SCHEDULES = frozenset({"ZBVZeroBubble", "DualPipeV"})  # exactly 2 stages per rank, V placement
RUNNABLE_SCHEDULES: tuple[str, ...] = (
    "1F1B",
    "GPipe",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)


def schedule_class_name(value: str) -> str | None:
    """The torch schedule class name ``get_schedule_class`` maps ``value`` to, or None."""
    return SCHEDULES.get(value.lower())


def is_single_stage(schedule: str) -> bool:
    return schedule in SINGLE_STAGE_SCHEDULES


def applied_ac(strategy: str | None, ac: Any, world_size: int | None) -> Any:
    """The activation checkpointing AutoModel really applies: megatron_fsdp on more than one rank skips it
    (components/distributed/megatron_fsdp.py logs 'not yet supported with MegatronFSDP. Skipping.')."""
    return False if strategy == "megatron_fsdp" and ac and world_size != 1 else ac
