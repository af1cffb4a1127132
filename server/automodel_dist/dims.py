"""What AutoModel 0.7.0 reads from a ``distributed:`` block at a world size, as one frozen typed object.

:func:`read_dims` is the only place a block's raw values become sizes and options: AutoModel's raw-value semantics
(``_degree``, its strategy aliases, its activation-checkpointing words, torch's schedule names) live inside it. The
rules that need resolved sizes, the estimate, suggest, the smoke runner and the dry run all take the
:class:`ParallelDims` it returns; :meth:`ParallelDims.layout` gives the meshes, :meth:`ParallelDims.to_block` the
minimal block that reads back to the same object, :meth:`ParallelDims.resolved` the JSON the reports carry.
Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

from .config.values import (
    SIZE_KEYS,
    STRATEGY_ALIASES,
    V_SCHEDULES,
    applied_ac,
    automodel_degree,
    dtype_name,
    is_nonneg_int,
    is_positive_int,
    is_single_stage,
    normalize_activation_checkpointing,
    schedule_class_name,
)
from .layout import Layout, StageError, dp_shard_of, ep_shard_size, infer_dp, virtual_stages

if TYPE_CHECKING:
    from .report import Resolved


@dataclass(frozen=True)
class MixedPrecision:
    """FSDP2's ``mp_policy`` as dtype names (AutoModel's default when the block gives none: bf16 params, fp32
    reduce)."""

    param_dtype: str | None = "bfloat16"
    reduce_dtype: str | None = "float32"
    output_dtype: str | None = None
    cast_forward_inputs: bool = False


FSDP2_DEFAULT_MP = MixedPrecision()
_DEGREE_OF = {"tp_size": "tp", "pp_size": "pp", "cp_size": "cp", "ep_size": "ep", "dp_replicate_size": "dp_replicate"}


def block_reshard(reshard_after_forward: bool | None, moe_reshard_after_forward: bool, ep: int) -> bool | None:
    """``reshard_after_forward`` of the FSDP2 blocks as AutoModel 0.7.0 wraps them; None for its dense default
    (every block but the last reshards). With ep_size > 1 its MoE parallelizer gives every block and the EP-sharded
    experts ``reshard_after_forward``, else ``moe.reshard_after_forward`` (default false). Its dense path's "keep
    blocks gathered under PP" default never engages (it looks for a ``pp`` dim in the data-parallel mesh, which has
    none), so PP changes nothing here."""
    if reshard_after_forward is not None:
        return reshard_after_forward
    return moe_reshard_after_forward if ep > 1 else None


@dataclass(frozen=True)
class ParallelDims:
    """AutoModel's reading of one ``distributed:`` block at ``world_size`` ranks.

    Degrees are what its mesh code uses (a value it cannot use reads as its default, as ``_degree`` does); which of
    them are errors is the rules' business. ``strategy`` is None for a strategy AutoModel does not know,
    ``activation_checkpointing`` None for a value it rejects, ``world_size`` None when it is not known.
    """

    strategy: str | None = "fsdp2"
    world_size: int | None = None
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp_size: int | None = None  # the block's explicit dp_size; dp is derived
    dp_replicate: int = 1
    sequence_parallel: bool = False
    activation_checkpointing: bool | str | None = False
    pp_schedule: str | None = None  # torch's class name, when pp > 1 and it is known
    pp_microbatch_size: int | None = None  # when pp > 1
    layers_per_stage: int | None = None  # pipeline.layers_per_stage, when pp > 1
    round_virtual_stages: str | None = None  # pipeline.round_virtual_stages_to_pp_multiple (up | down)
    # pipeline.pp_recv_buffer_pool's slack where AutoModel pools the receive buffers (1f1b only); None: not pooled
    recv_pool_slack: int | None = None
    reshard_after_forward: bool | None = None  # FSDP2; None: AutoModel's default
    defer_fsdp_grad_sync: bool = True  # FSDP2
    moe_reshard_after_forward: bool = False  # moe.reshard_after_forward, when ep > 1
    moe_wrap_outer_model: bool = True  # moe.wrap_outer_model, when ep > 1
    zero_dp_strategy: int = 3  # MegatronFSDP
    megatron_fp32_main_weights: bool = False  # MegatronFSDP's preserve_fp32_weights
    megatron_fp32_grads: bool = False  # MegatronFSDP's grad_reduce_in_fp32
    mp_policy: MixedPrecision | None = FSDP2_DEFAULT_MP  # FSDP2 only

    def degree(self, key: str) -> int:
        """The degree of a size key (``tp_size`` -> :attr:`tp`)."""
        return getattr(self, _DEGREE_OF[key])

    # ------------------------------------------------------------------ derived sizes
    @cached_property
    def dp(self) -> int | None:
        """AutoModel's data-parallel size: the explicit dp_size, else world // (tp*cp*pp); None if unknown."""
        if self.strategy is None:
            return None
        if self.world_size is not None:
            return infer_dp(
                self.strategy, world_size=self.world_size, tp=self.tp, cp=self.cp, pp=self.pp, dp_size=self.dp_size
            )
        return self.dp_size if self.strategy != "ddp" else None

    @property
    def dp_shard(self) -> int | None:
        """The FSDP shard group (dp // dp_replicate under HSDP); None where dp is unknown or does not split."""
        if self.dp is None or (self.strategy == "fsdp2" and self.dp % self.dp_replicate):
            return None
        return dp_shard_of(self.strategy, self.dp, self.dp_replicate) if self.strategy else None

    @property
    def ep_shard(self) -> int | None:
        """``dp*cp*tp // ep`` (1 without EP, and for the strategies without a moe mesh); None where dp is unknown
        or ep does not divide dp*cp*tp."""
        if self.dp is None:
            return None
        if self.ep <= 1 or self.strategy != "fsdp2":
            return 1
        if (self.dp * self.cp * self.tp) % self.ep:
            return None
        return ep_shard_size(dp=self.dp, cp=self.cp, tp=self.tp, ep=self.ep)

    @property
    def ac_applied(self) -> bool | str:
        """The checkpointing AutoModel really applies (megatron_fsdp on more than one rank skips it)."""
        return applied_ac(self.strategy, self.activation_checkpointing or False, self.world_size)

    @property
    def stages_per_rank(self) -> int:
        """Stages per pipeline rank without the model: 1 for single-stage schedules, else AutoModel's 2."""
        if self.pp <= 1:
            return 1
        return 1 if is_single_stage(self.pp_schedule or "1F1B") else 2

    def stages_per_rank_of(self, num_layers: int) -> int:
        """Stages per pipeline rank for a model of ``num_layers`` (``layers_per_stage`` and its rounding, as
        AutoModel's calculate_virtual_stages splits it; the model-free default where the split fails)."""
        if self.pp <= 1 or self.layers_per_stage is None:
            return self.stages_per_rank
        try:
            _, per_rank = virtual_stages(
                num_layers,
                pp=self.pp,
                single_stage=is_single_stage(self.pp_schedule or "1F1B"),
                layers_per_stage=self.layers_per_stage,
                round_to=self.round_virtual_stages,
                v_style=self.v_schedule,
            )
        except StageError:
            return self.stages_per_rank
        return per_rank

    @property
    def v_schedule(self) -> bool:
        return (self.pp_schedule or "") in V_SCHEDULES

    @property
    def blocks_reshard(self) -> bool:
        """Whether FSDP2 reshards the transformer blocks (and EP-sharded experts) after forward."""
        chosen = block_reshard(self.reshard_after_forward, self.moe_reshard_after_forward, self.ep)
        return True if chosen is None else chosen

    @property
    def data_parallel_mesh_size(self) -> int:
        """The ranks of the data-parallel mesh AutoModel shards over (dp * cp; dp taken as 1 where unknown): where it
        is 1, MegatronFSDP skips wrapping and the MoE parallelizer applies no FSDP."""
        return (self.dp or 1) * self.cp

    @property
    def megatron_wraps(self) -> bool:
        """Whether AutoModel wraps the model with MegatronFSDP: its strategy, on more than one rank, with more than
        one data-parallel rank (dp * cp); with one it logs 'MegatronFSDP DP shard group size is 1; skipping
        MegatronFSDP wrapping' and trains the tensor-parallel model as it is."""
        return self.strategy == "megatron_fsdp" and (self.world_size or 2) > 1 and self.data_parallel_mesh_size > 1

    def deferred_sync(self, backward_passes: int) -> bool:
        """Whether FSDP2 skips the gradient reduce-scatter on all but the last backward of a step (AutoModel's
        ``defer_fsdp_grad_sync``, default true) where an FSDP module wraps the whole model part: with gradient
        accumulation, and always under PP (torch's pipeline stages run every backward without sync and reduce once
        at the end). FSDP then keeps every block's gradients unsharded, upcast to the reduce dtype (fp32), until that
        last reduce-scatter. A model part that is no FSDP module (:attr:`model_part_unwrapped`) is the class's own
        business: estimate/memory.py ``grad_sync_deferred``."""
        return self.strategy == "fsdp2" and self.defer_fsdp_grad_sync and (self.pp > 1 or backward_passes > 1)

    @property
    def experts_outside_fsdp(self) -> bool:
        """Routed experts on a one-rank ``ep_shard`` mesh: AutoModel's MoE parallelizer leaves them out of FSDP
        (moe/parallelizer.py), so their gradients are plain ``.grad`` from their layer's backward to the optimizer
        step."""
        return self.ep > 1 and self.ep_shard == 1

    @property
    def model_part_unwrapped(self) -> bool:
        """AutoModel's MoE parallelizer (ep > 1) with ``moe.wrap_outer_model: false``: the inner model is the FSDP
        root and the model part (the causal LM around it) is no FSDP module, so neither train_ft's ``get_sync_ctx``
        nor torch's pipeline stage (a plain backward for such a module) turns the gradient sync off."""
        return self.strategy == "fsdp2" and self.ep > 1 and not self.moe_wrap_outer_model

    # ------------------------------------------------------------------ meshes
    @cached_property
    def layout(self) -> Layout | None:
        """AutoModel's meshes, when the strategy and world size are known and the sizes build."""
        if self.strategy is None or self.world_size is None:
            return None
        return _layout(self)

    @cached_property
    def tp_cp_layout(self) -> Layout | None:
        """:attr:`layout`, or, when only EP or HSDP keep it from building, one without them: the tp and cp groups
        depend on neither, so the node-placement checks still run."""
        if self.layout is not None or self.strategy is None or self.world_size is None:
            return self.layout
        if self.ep > 1 or self.dp_replicate > 1:
            return _layout(replace(self, ep=1, dp_replicate=1))
        return None

    # ------------------------------------------------------------------ views
    def resolved(self) -> Resolved:
        """The sizes a report states (DDP: no mesh, every rank a replica)."""
        from .report import Resolved

        if self.strategy is None:
            return Resolved(activation_checkpointing=self.activation_checkpointing)
        tp, pp, cp, ep = self.tp, self.pp, self.cp, self.ep
        rep = self.dp_replicate if self.strategy == "fsdp2" else 1
        shard = self.dp_shard
        if self.strategy == "ddp":
            tp = pp = cp = ep = 1
            rep, shard = self.dp, 1
        fields: dict[str, Any] = dict(
            strategy=self.strategy,
            activation_checkpointing=self.activation_checkpointing,
            dp=self.dp,
            dp_replicate=rep,
            dp_shard=shard,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            ep_shard=self.ep_shard if self.strategy == "fsdp2" else None,
            sequence_parallel=self.sequence_parallel,
            mesh_ranks=self.layout.mesh_ranks if self.layout is not None else None,
        )
        if pp > 1:
            fields.update(pp_schedule=self.pp_schedule, pp_microbatch_size=self.pp_microbatch_size)
        return Resolved(**fields)

    def to_block(self) -> dict[str, Any]:
        """The smallest ``distributed:`` block AutoModel reads back as this object (defaults left out)."""
        out: dict[str, Any] = {"strategy": self.strategy}
        fsdp2 = self.strategy == "fsdp2"
        if fsdp2 and self.dp_replicate > 1:
            out["dp_replicate_size"] = self.dp_replicate
        if self.dp_size is not None:
            out["dp_size"] = self.dp_size
        for key, value in (("tp_size", self.tp), ("cp_size", self.cp), ("pp_size", self.pp), ("ep_size", self.ep)):
            if value > 1:
                out[key] = value
        if self.sequence_parallel:
            out["sequence_parallel"] = True
        if self.activation_checkpointing:
            out["activation_checkpointing"] = self.activation_checkpointing
        if fsdp2 and not self.defer_fsdp_grad_sync:
            out["defer_fsdp_grad_sync"] = False
        if fsdp2 and self.reshard_after_forward is not None:
            out["reshard_after_forward"] = self.reshard_after_forward
        if fsdp2 and self.mp_policy != FSDP2_DEFAULT_MP:
            out["mp_policy"] = asdict(self.mp_policy) if self.mp_policy is not None else None
        if self.strategy == "megatron_fsdp" and self.zero_dp_strategy != 3:
            out["zero_dp_strategy"] = self.zero_dp_strategy
        if self.strategy == "megatron_fsdp" and self.megatron_fp32_main_weights:
            out["preserve_fp32_weights"] = True
        if self.strategy == "megatron_fsdp" and self.megatron_fp32_grads:
            out["grad_reduce_in_fp32"] = True
        if self.ep > 1 and (self.moe_reshard_after_forward or not self.moe_wrap_outer_model):
            out["moe"] = {"reshard_after_forward": True} if self.moe_reshard_after_forward else {}
            if not self.moe_wrap_outer_model:
                out["moe"]["wrap_outer_model"] = False
        if self.pp > 1:
            out["pipeline"] = {
                "pp_schedule": (self.pp_schedule or "1F1B").lower(),
                "pp_microbatch_size": self.pp_microbatch_size or 1,
            }
            if self.layers_per_stage is not None:
                out["pipeline"]["layers_per_stage"] = self.layers_per_stage
            if self.round_virtual_stages is not None:
                out["pipeline"]["round_virtual_stages_to_pp_multiple"] = self.round_virtual_stages
        return out

    def to_json(self) -> dict[str, Any]:
        """The fields as plain JSON values (what a smoke spec carries to its ranks)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ParallelDims:
        mp = data.get("mp_policy")
        return cls(**{**data, "mp_policy": MixedPrecision(**mp) if isinstance(mp, Mapping) else None})


def _layout(d: ParallelDims) -> Layout | None:
    try:
        return Layout.build(
            d.strategy or "fsdp2",
            world_size=d.world_size or 1,
            tp=d.tp,
            pp=d.pp,
            cp=d.cp,
            ep=d.ep,
            dp_size=d.dp_size,
            dp_replicate=d.dp_replicate,
        )
    except ValueError:
        return None


def _degrees(block: Mapping[str, Any]) -> dict[str, int | None]:
    """Each size key as AutoModel's mesh code reads it: ``_degree`` for tp/pp/cp/ep/dp_replicate (a value it cannot
    use is its default 1; a value from an unset environment variable is unknown, read as 1), dp_size as given."""
    from .config.load import Unresolved

    out: dict[str, int | None] = {}
    for key in SIZE_KEYS:
        raw = block.get(key)
        if key == "dp_size":
            out[key] = raw if is_positive_int(raw) and not isinstance(raw, Unresolved) else None
        elif raw is None or isinstance(raw, (Unresolved, bool)):
            out[key] = 1
        else:
            out[key] = automodel_degree(raw)
    return out


def _mixed_precision(raw: Any) -> MixedPrecision | None:
    """``mp_policy`` as FSDP2 gets it: absent or null is AutoModel's default, a mapping has torch's defaults."""
    if raw is None:
        return FSDP2_DEFAULT_MP
    if not isinstance(raw, Mapping):
        return None

    def name(key: str) -> str | None:
        value = raw.get(key)
        return dtype_name(value) if isinstance(value, str) else None

    return MixedPrecision(
        name("param_dtype"), name("reduce_dtype"), name("output_dtype"), raw.get("cast_forward_inputs", False) is True
    )


def read_dims(block: Mapping[str, Any], world_size: int | None = None) -> ParallelDims:
    """AutoModel 0.7.0's reading of ``block`` (a ``distributed:`` mapping after the loader's value semantics) at
    ``world_size`` ranks. Never raises: values AutoModel would reject read as its defaults (see the rules)."""
    raw = block.get("strategy", "fsdp2")
    strategy = STRATEGY_ALIASES.get(raw.lower()) if isinstance(raw, str) else None
    sizes = _degrees(block)
    try:
        ac: bool | str | None = normalize_activation_checkpointing(block.get("activation_checkpointing", False))
    except ValueError:
        ac = None
    pp = sizes["pp_size"] or 1
    pipe = block.get("pipeline")
    schedule = mbs = layers_per_stage = round_to = pool_slack = None
    if pp > 1 and isinstance(pipe, Mapping):
        name = pipe.get("pp_schedule", "1f1b")
        schedule = schedule_class_name(name) if isinstance(name, str) else None
        # AutoModel's autopipeline installs the pool only for a 1f1b schedule by name (no CSV schedule)
        slack = pipe.get("pp_recv_buffer_pool_slack", 2)
        if (
            pipe.get("pp_recv_buffer_pool") is True
            and isinstance(name, str)
            and name.lower() == "1f1b"
            and not pipe.get("pp_schedule_csv")
            and is_nonneg_int(slack)
        ):
            pool_slack = slack
        value = pipe.get("pp_microbatch_size", 1)
        mbs = value if is_positive_int(value) else None
        lps = pipe.get("layers_per_stage")
        layers_per_stage = lps if is_positive_int(lps) else None
        rounding = pipe.get("round_virtual_stages_to_pp_multiple")
        round_to = rounding if rounding in ("up", "down") else None
    fsdp2 = strategy == "fsdp2"
    moe = block.get("moe")
    reshard = block.get("reshard_after_forward") if fsdp2 else None
    zero = block.get("zero_dp_strategy", 3) if strategy == "megatron_fsdp" else 3
    return ParallelDims(
        strategy=strategy,
        world_size=world_size,
        tp=sizes["tp_size"] or 1,
        pp=pp,
        cp=sizes["cp_size"] or 1,
        ep=sizes["ep_size"] or 1,
        dp_size=sizes["dp_size"],
        dp_replicate=sizes["dp_replicate_size"] or 1,
        sequence_parallel=fsdp2 and block.get("sequence_parallel") is True,
        activation_checkpointing=ac,
        pp_schedule=schedule,
        pp_microbatch_size=mbs,
        layers_per_stage=layers_per_stage,
        round_virtual_stages=round_to,
        recv_pool_slack=pool_slack,
        reshard_after_forward=reshard if isinstance(reshard, bool) else None,
        defer_fsdp_grad_sync=bool(block.get("defer_fsdp_grad_sync", True)) if fsdp2 else True,
        moe_reshard_after_forward=(sizes["ep_size"] or 1) > 1
        and isinstance(moe, Mapping)
        and moe.get("reshard_after_forward", False) is True,
        moe_wrap_outer_model=not (
            (sizes["ep_size"] or 1) > 1 and isinstance(moe, Mapping) and moe.get("wrap_outer_model", True) is False
        ),
        zero_dp_strategy=zero if is_nonneg_int(zero) else 3,
        # (AutoModel's config takes them as given and its parallelizer tests their truth)
        megatron_fp32_main_weights=strategy == "megatron_fsdp" and bool(block.get("preserve_fp32_weights")),
        megatron_fp32_grads=strategy == "megatron_fsdp" and bool(block.get("grad_reduce_in_fp32")),
        mp_policy=_mixed_precision(block.get("mp_policy")) if fsdp2 else None,
    )


__all__ = ["ParallelDims", "MixedPrecision", "read_dims", "block_reshard", "FSDP2_DEFAULT_MP"]
