"""Rules for what AutoModel 0.7.0's code fails in the first training step (forward or backward), after it built and
parallelized the model without complaint: found by running its own stack (``smoke --stack automodel``), each tied to
the AutoModel function that causes it."""

from __future__ import annotations

from collections.abc import Iterator

from ..report import Finding
from .base import Context, finding, rule
from .helpers import flag_on as _on

F = "forward"


@rule(
    "pp-sequence-parallel",
    family=F,
    severity="error",
    title="Sequence parallelism across pipeline stages",
    patterns=(
        r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\) at non-singleton dimension 2",
        r"apply_rotary_pos_emb",
    ),
    cause="With pp_size > 1, tp_size > 1 and sequence_parallel, every stage after the first fails in its first "
    "forward. AutoModel's _precompute_stage_shapes (pipelining/functional.py) gives the next stage a plain "
    "full-length input buffer while the previous stage sends its sequence shard; pipeline_forward "
    "(pipelining/hf_utils.py) builds RoPE for that length, and the sequence-parallel norm "
    "(SequenceParallelAllGatherActivation, optimized_tp_plans.py) takes the tensor for one rank's shard and "
    "all-gathers it to tp_size times the length: q and cos/sin then differ by tp_size.",
    fix="Set sequence_parallel: false when pp_size > 1, or keep sequence parallelism with pp_size: 1 and scale "
    "with TP, CP or FSDP.",
)
def pp_sequence_parallel(ctx: Context) -> Iterator[Finding]:
    d = ctx.dims
    if d.strategy == "fsdp2" and d.pp > 1 and d.tp > 1 and d.ep <= 1 and _on(ctx, "sequence_parallel"):
        yield finding(
            ctx,
            ("sequence_parallel",),
            f"sequence_parallel: true with tp_size={d.tp} and pp_size={d.pp}: every pipeline stage after the first "
            f"fails in its first forward (q has {d.tp}x the sequence of RoPE's cos/sin). AutoModel's "
            "_precompute_stage_shapes (pipelining/functional.py) sizes the next stage's input as a plain "
            "full-length tensor while the previous stage sends its sequence shard, and the sequence-parallel norm "
            "all-gathers that tensor again; seen on AutoModel's Llama and Qwen3 classes and the Hugging Face "
            "fallback with 1F1B, Interleaved1F1B, GPipe and ZBVZeroBubble (classes with their own pipeline "
            "forward were not run)",
            "sequence_parallel: false while pp_size > 1 (or pp_size: 1 and scale with TP, CP or FSDP)",
        )
