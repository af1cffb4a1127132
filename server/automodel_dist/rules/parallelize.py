"""Rules for the errors AutoModel 0.7.0 raises from the block alone, but only once it parallelizes the
built model, after launch: ``components/distributed/model_parallelizer.py`` sends ep_size > 1 to
``components/moe/parallelizer.py`` and everything else (fsdp2) to ``components/distributed/parallelizer.py``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..config.load import clip
from ..config.values import applied_ac
from ..environment import FSDP2_PATCH_REMOVED_IN, fsdp2_unusable, torch_release
from ..report import Finding
from .base import Context, finding, rule
from .helpers import flag_on as _on
from .model import own_fsdp2, sp_refused

F = "parallelize"


@rule(
    "tp-async-needs-sp",
    family=F,
    severity="error",
    title="Async TP without sequence parallelism",
    patterns=(r"enable_async_tensor_parallel=True requires sequence_parallel=True",),
    cause="With tp_size > 1 (and ep_size 1), AutoModel's FSDP2 parallelizer raises when "
    "enable_async_tensor_parallel is on and sequence_parallel is off; its docstring says SP is forced on, "
    "the 0.7.0 code raises.",
    fix="Add sequence_parallel: true, or remove enable_async_tensor_parallel.",
)
def tp_async_needs_sp(ctx: Context) -> Iterator[Finding]:
    tp = ctx.dims.tp
    if (
        ctx.dims.strategy == "fsdp2"
        and tp > 1
        and ctx.dims.ep == 1
        and _on(ctx, "enable_async_tensor_parallel")
        and not _on(ctx, "sequence_parallel")
    ):
        yield finding(
            ctx,
            ("enable_async_tensor_parallel",),
            f"enable_async_tensor_parallel: true with tp_size={tp} needs sequence_parallel: true; AutoModel's "
            "FSDP2 parallelizer raises 'enable_async_tensor_parallel=True requires sequence_parallel=True' "
            "when it parallelizes the model, after launch",
            "add sequence_parallel: true (async TP overlaps its reduce-scatters), or remove "
            "enable_async_tensor_parallel",
        )


def moe_tp_unplanned(tp: int, ep: int, tp_plan: Any = None) -> bool:
    """True when AutoModel's MoE path (ep > 1) gets tp > 1 with no tp_plan: it raises (no 0.7.0 MoE model has one)."""
    return tp > 1 and ep > 1 and tp_plan is None


@rule(
    "moe-tp",
    family=F,
    severity="error",
    title="TP settings AutoModel's MoE path rejects",
    patterns=(
        r"enable_async_tensor_parallel=True is not supported by the custom MoE TP path",
        r"sequence_parallel=True is not supported by the custom MoE TP path",
        r"No safe tensor-parallel plan is registered for custom MoE model",
    ),
    cause="With ep_size > 1 AutoModel parallelizes through its MoE path; with tp_size > 1 that path rejects "
    "enable_async_tensor_parallel and sequence_parallel, and needs an explicit tp_plan (no MoE model "
    "in 0.7.0 registers one).",
    fix="Use tp_size: 1 with ep_size > 1 (split with ep/cp/pp instead), or give tp_plan and turn "
    "sequence_parallel and enable_async_tensor_parallel off.",
)
def moe_tp(ctx: Context) -> Iterator[Finding]:
    tp, ep = ctx.dims.tp, ctx.dims.ep
    if ctx.dims.strategy != "fsdp2" or tp <= 1 or ep <= 1:
        return
    where = f"with ep_size={ep} and tp_size={tp} AutoModel parallelizes through its MoE path, which"
    if _on(ctx, "enable_async_tensor_parallel"):
        yield finding(
            ctx,
            ("enable_async_tensor_parallel",),
            f"enable_async_tensor_parallel: true: {where} raises 'enable_async_tensor_parallel=True is not "
            "supported by the custom MoE TP path' after launch",
            "remove enable_async_tensor_parallel (or use tp_size: 1)",
        )
    if _on(ctx, "sequence_parallel"):
        yield finding(
            ctx,
            ("sequence_parallel",),
            f"sequence_parallel: true: {where} keeps router and attention activations replicated and raises "
            "'sequence_parallel=True is not supported by the custom MoE TP path' after launch",
            "remove sequence_parallel (or use tp_size: 1)",
        )
    if moe_tp_unplanned(tp, ep, ctx.block.get("tp_plan")):
        yield finding(
            ctx,
            ("tp_size",),
            f"tp_size={tp} without tp_plan: with ep_size={ep} AutoModel parallelizes through its MoE path, "
            "which needs a TP plan for the non-expert modules; no AutoModel "
            "0.7.0 MoE model registers one, so it raises 'No safe tensor-parallel plan is registered for "
            "custom MoE model' after launch",
            "tp_size: 1 (split with ep_size/cp_size/pp_size instead), or give tp_plan: a dict or import path "
            "of the styles for attention/shared modules (routed experts stay EP-owned)",
        )


@rule(
    "tp-option-no-effect",
    family=F,
    severity="info",
    title="TP option that does nothing at tp_size 1",
    cause="sequence_parallel and enable_async_tensor_parallel act on the TP mesh only; with tp_size 1 AutoModel "
    "ignores them.",
    fix="Remove them, or set tp_size > 1.",
)
def tp_option_no_effect(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.strategy != "fsdp2" or ctx.dims.tp > 1 or not ctx.size_known("tp_size"):
        return
    for key in ("sequence_parallel", "enable_async_tensor_parallel"):
        if key == "sequence_parallel" and sp_refused(ctx) is not None:
            continue  # not harmless here: model-sp-unsupported reports it as the error it is
        if ctx.block.get(key) is True:
            yield finding(
                ctx,
                (key,),
                f"{key}: true has no effect with tp_size=1",
                f"remove {key}, or set tp_size > 1",
            )


@rule(
    "megatron-fsdp-ac-ignored",
    family=F,
    severity="warning",
    title="Activation checkpointing megatron_fsdp skips",
    patterns=(r"Activation checkpointing is not yet supported with MegatronFSDP",),
    cause="AutoModel 0.7.0's MegatronFSDP parallelizer logs 'Activation checkpointing is not yet supported with "
    "MegatronFSDP. Skipping.' and trains without it (on more than one rank): every activation is kept.",
    fix="Use strategy: fsdp2 for activation checkpointing, or budget the memory without it.",
)
def megatron_fsdp_ac_ignored(ctx: Context) -> Iterator[Finding]:
    if (
        ctx.dims.activation_checkpointing is True
        and applied_ac(ctx.dims.strategy, ctx.dims.activation_checkpointing, ctx.dims.world_size) is False
    ):
        yield finding(
            ctx,
            ("activation_checkpointing",),
            "activation_checkpointing: true with megatron_fsdp: AutoModel 0.7.0 logs 'Activation "
            "checkpointing is not yet supported with MegatronFSDP. Skipping.' and keeps every activation, "
            "so memory is as without checkpointing",
            "strategy: fsdp2 to checkpoint activations (estimate_memory shows the difference), or remove "
            "activation_checkpointing",
        )


@rule(
    "megatron-fsdp-unsharded",
    family=F,
    severity="warning",
    title="megatron_fsdp that shards nothing",
    patterns=(
        r"MegatronFSDP DP shard group size is 1; skipping MegatronFSDP wrapping",
        r"MegatronFSDP zero_dp_strategy is not 3\. Parameters will not be sharded",
    ),
    cause="With dp * cp = 1 AutoModel's MegatronFSDP path skips the MegatronFSDP wrapper and trains the "
    "TP-only model (nothing sharded, no data parallelism); with zero_dp_strategy below 3 parameters stay "
    "replicated (it logs both).",
    fix="Leave dp * cp > 1 ranks for sharding (fewer tp ranks), or zero_dp_strategy: 3 to shard parameters.",
)
def megatron_fsdp_unsharded(ctx: Context) -> Iterator[Finding]:
    if ctx.dims.strategy != "megatron_fsdp" or ctx.dims.world_size in (None, 1):
        return
    tp = ctx.dims.tp
    if tp > 1 and ctx.dims.dp is not None and not ctx.dims.megatron_wraps:
        smaller = "tp_size: 1" if tp == 2 else f"tp_size: {tp // 2} or less"
        yield finding(
            ctx,
            ("tp_size",),
            f"dp * cp = 1 (tp_size={tp} on {ctx.dims.world_size} ranks): AutoModel logs 'MegatronFSDP DP shard "
            "group size is 1; skipping MegatronFSDP wrapping' and trains the tensor-parallel model without "
            "any sharding",
            f"{smaller} to leave ranks for MegatronFSDP, or strategy: fsdp2",
        )
    zero = ctx.block.get("zero_dp_strategy", 3)
    if isinstance(zero, int) and not isinstance(zero, bool) and 0 <= zero < 3:
        yield finding(
            ctx,
            ("zero_dp_strategy",),
            f"zero_dp_strategy: {zero}: AutoModel logs 'MegatronFSDP zero_dp_strategy is not 3. Parameters "
            "will not be sharded.': every data-parallel rank holds the full parameters",
            "zero_dp_strategy: 3 to shard parameters too",
            severity="info",
        )


_REMOVED = ".".join(map(str, FSDP2_PATCH_REMOVED_IN))


@rule(
    "torch-version",
    family=F,
    severity="error",
    title="A torch release AutoModel 0.7.0's FSDP2 path cannot run on",
    patterns=(r"type object 'FSDPParam' has no attribute 'to_accumulated_grad_if_needed'",),
    cause=f"AutoModel 0.7.0's FSDP2 parallelizers (dense and MoE) patch torch's "
    f"FSDPParam.to_accumulated_grad_if_needed, which torch {_REMOVED} removed: with strategy fsdp2 on more "
    "than one rank the run raises AttributeError when it parallelizes the model, after launch (the "
    "Nemotron-H class's own parallelizer, used without EP, does not patch it).",
    fix=f"Launch AutoModel 0.7.0 with torch older than {_REMOVED} (2.11-2.14 work), or, when the model fits one "
    "GPU, strategy ddp (its path does not touch FSDP).",
)
def torch_version(ctx: Context) -> Iterator[Finding]:
    given = ctx.torch_version
    if given is None:
        return
    release = torch_release(given)
    if release is None:
        yield finding(
            ctx,
            (),
            f"torch_version {clip(repr(given))} is not a torch version "
            "(MAJOR.MINOR[.PATCH][+local]); the torch release checks were skipped",
            "pass what `python -c 'import torch; print(torch.__version__)'` prints where the job runs",
            severity="warning",
        )
        return
    if ctx.dims.strategy != "fsdp2" or ctx.dims.world_size == 1 or not fsdp2_unusable(release):
        return
    if own_fsdp2(ctx) is not None:
        return  # Nemotron-H's own FSDP2 parallelizer (ep_size 1) does not install the patch
    where = f"on {ctx.dims.world_size} ranks" if ctx.dims.world_size else "on more than one rank"
    yield finding(
        ctx,
        ("strategy",) if ctx.has("strategy") else (),
        f"torch {clip(given)} with strategy fsdp2 {where}: AutoModel 0.7.0's FSDP2 parallelizer patches "
        f"FSDPParam.to_accumulated_grad_if_needed, which torch {_REMOVED} removed, and raises "
        "\"AttributeError: type object 'FSDPParam' has no attribute 'to_accumulated_grad_if_needed'\" "
        "when it parallelizes the model, after launch",
        f"launch with torch {FSDP2_PATCH_REMOVED_IN[0]}.{FSDP2_PATCH_REMOVED_IN[1] - 1} or older "
        "(AutoModel 0.7.0 asks for torch>=2.8), or strategy: ddp if the model fits one GPU",
    )
