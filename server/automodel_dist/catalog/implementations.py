"""Which implementation AutoModel 0.7.0 builds for a Hugging Face architecture, and what it can shard.

AutoModel uses its own model class when ``_transformers/registry.py`` lists the architecture
(``MODEL_ARCH_MAPPING``, 71 names), else the Hugging Face one. Right after building it,
``_transformers/capabilities.validate_for_mesh`` raises for a parallelism the class lacks: TP needs a plan
(``optimized_tp_plans.PARALLELIZE_FUNCTIONS`` or a ``_tp_plan`` attribute, which every transformers class has), PP
a ``_pp_plan`` or the MoE mixin, EP the ``MoEFSDPSyncMixin``, and CP, for AutoModel's own classes, one of the
attention backends in ``cp_attn`` (with hybrid layers, ``cp_attn_hybrid``); Hugging Face classes need SDPA and no
hybrid layers. Some classes pass that gate and fail when they are parallelized (``tp_plan_error``).

The table is GENERATED from the installed AutoModel by ``tools/gen_capabilities.py`` into ``capabilities.json``
(never edited by hand); ``tests/oracle/test_capabilities.py`` regenerates it and checks the engine's verdicts against
``validate_for_mesh`` for every row. ``model.force_hf: true`` makes AutoModel build the Hugging Face class instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

TABLE = Path(__file__).with_name("capabilities.json")
AUTOMODEL_VERSION = "0.7.0"  # the release the table was generated from (capabilities.json says it too)


@dataclass(frozen=True)
class Implementation:
    """AutoModel 0.7.0's class for one architecture and the parallelisms it accepts."""

    architecture: str
    module: str  # where the class lives: nemo_automodel.components.models.* (custom) or transformers.models.*
    tp: bool
    pp: bool
    ep: bool
    cp_attn: frozenset[str] | None = None  # backend.attn values CP accepts (AutoModel's classes); None: no backend
    cp_attn_hybrid: frozenset[str] | None = None  # the same when the layers mix attention with other mixers
    cp_plain: bool = True  # Hugging Face classes: CP accepted (SDPA) without hybrid layers
    cp_hybrid: bool = False  # ... and with them
    sequence_parallel: bool = True  # False: its own parallelizer raises for sequence_parallel: true (FSDP2 path)
    mamba_cp: bool = False  # CP shards its Mamba layers by heads (MambaContextParallel's divisibility asserts)
    own_fsdp2: bool = False  # its own FSDP2 parallelizer (ep_size 1) installs none of AutoModel's FSDP patches
    tp_plan_error: str | None = None  # what parallelizing raises at tp > 1 although the gate passes
    keeps_own_forward: bool = False  # _pp_keep_self_forward: its forward is kept under PP
    returns_hidden_states: bool = False  # _pp_return_hidden_states_supported
    logits_to_keep: bool = True  # its forward takes logits_to_keep
    # it mixes in MoEFSDPSyncMixin: AutoModel's hooks that turn FSDP's gradient sync off on its inner units
    # (moe/fsdp_mixin.py), without PP where backend.enable_fsdp_optimizations asks, and in its patched pipeline backward
    moe_sync_mixin: bool = False
    sidecar: str | None = None  # its own parallelizer class (Gemma4ModelParallelizer, ...)

    @property
    def custom(self) -> bool:
        return self.module.startswith("nemo_automodel.")

    def describe(self) -> str:
        where = "AutoModel's own" if self.custom else "the Hugging Face"
        return f"{where} {self.architecture} ({self.module})"

    def cp_backends(self, hybrid: bool) -> frozenset[str] | None:
        """The backend.attn values its CP accepts for a model with (or without) hybrid layers; None: it has no
        backend (a Hugging Face class: see :meth:`cp_ok`)."""
        return self.cp_attn_hybrid if hybrid else self.cp_attn

    def cp_ok(self, hybrid: bool) -> bool:
        """Hugging Face classes: whether CP is accepted at all (SDPA, and no hybrid layers)."""
        return self.cp_hybrid if hybrid else self.cp_plain


def cp_attn_refused(impl: Implementation | None, hybrid: bool, attn: Any) -> frozenset[str] | None:
    """The ``model.backend.attn`` values AutoModel's class accepts under context parallelism, where the recipe's
    (``attn``; None: unset, BackendConfig's default of te with Transformer Engine on CUDA, else sdpa) is not one of
    them and validate_for_mesh raises after the build; None where its CP runs with it (or the class takes no
    backend, or the value is not a name)."""
    backends = impl.cp_backends(hybrid) if impl is not None else None
    if backends is None:
        return None
    if attn is None:
        return None if backends & {"te", "sdpa"} else backends
    return None if not isinstance(attn, str) or attn in backends else backends


# Facts the generator cannot read from a class without building it with a real config: Nemotron-H's own FSDP2
# parallelizer splits Mamba heads over CP and installs none of AutoModel's FSDP patches (tests/oracle/test_oracle_parity.py
# checks both against its code).
_EXTRA: dict[str, dict[str, Any]] = {"NemotronHForCausalLM": {"mamba_cp": True, "own_fsdp2": True}}


@cache
def _table() -> dict[str, Any]:
    return json.loads(TABLE.read_text(encoding="utf-8"))


def _frozen(value: list[str] | None) -> frozenset[str] | None:
    return frozenset(value) if value is not None else None


@cache
def implementations() -> dict[str, Implementation]:
    """Every architecture the table knows: AutoModel's registry, then the Hugging Face classes it builds."""
    data = _table()
    out: dict[str, Implementation] = {}
    for arch, row in data["hf_classes"].items():
        out[arch] = Implementation(
            arch,
            row["module"],
            tp=row["tp"],
            pp=row["pp"],
            ep=row["ep"],
            cp_plain=row["cp"],
            cp_hybrid=row["cp_hybrid"],
        )
    for arch, row in data["architectures"].items():
        without = row.get("cp_without_backend") or {}
        out[arch] = Implementation(
            arch,
            row["module"],
            tp=row["tp"],
            pp=row["pp"],
            ep=row["ep"],
            cp_attn=_frozen(row["cp_attn"]),
            cp_attn_hybrid=_frozen(row["cp_attn_hybrid"]),
            cp_plain=without.get("plain", True),
            cp_hybrid=without.get("hybrid", False),
            sequence_parallel=row["sequence_parallel"],
            tp_plan_error=row["tp_plan_error"],
            keeps_own_forward=row["keeps_own_forward"],
            returns_hidden_states=row["returns_hidden_states"],
            logits_to_keep=row["logits_to_keep"],
            moe_sync_mixin=row["moe_sync_mixin"],
            sidecar=row["sidecar"],
            **_EXTRA.get(arch, {}),
        )
    return out


def implementation(architecture: str | None) -> Implementation | None:
    """The implementation AutoModel builds for ``architecture`` (None when neither its registry nor transformers
    has the name: a trust_remote_code class, or a typo)."""
    return implementations().get(architecture) if architecture else None


def builds_own_class(architecture: str | None, force_hf: bool) -> bool:
    """Whether AutoModel builds a class of its own for ``architecture`` (not transformers', which ``model.force_hf``
    asks for)."""
    impl = implementation(architecture)
    return impl is not None and impl.custom and not force_hf


def registered(architecture: str | None) -> bool:
    """Whether AutoModel's registry maps ``architecture`` to a class of its own."""
    return bool(architecture) and architecture in _table()["architectures"]


def table_versions() -> dict[str, str]:
    data = _table()
    return {"nemo_automodel": data["nemo_automodel"], "transformers": data["transformers"]}


def __getattr__(name: str) -> Any:
    if name == "IMPLEMENTATIONS":  # the mapping, for callers that iterate it
        return implementations()
    raise AttributeError(name)


# AutoModel's own classes whose pipeline stages pass more than the hidden state between them, so that AutoModel's
# generic stage forward (pipeline.patch_inner_model / patch_causal_lm_model, on by default) breaks them: DeepSeek-V4's
# hc_mult hyper-connection streams ([B, S, hc_mult, hidden]; its own forward takes them on a later stage). Measured by
# the dry run of AutoModel's class: patched, the next stage's first hyper-connection fails on [B, S, hidden].
PP_OWN_STAGE_FORWARD = frozenset({"DeepseekV4ForCausalLM"})
PP_PATCH_KEYS = ("patch_inner_model", "patch_causal_lm_model")
