"""Unit tests per rule: the exact message, path, line, severity and fix of each finding.

One case per rule (some rules have two). ``test_every_rule_has_a_case`` keeps the table complete."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from automodel_dist import validate_config
from automodel_dist.rules import RULES
from support import golden


@dataclass(frozen=True)
class RuleCase:
    """One row of the table: a config (and validate_config's arguments), and the finding it must give."""

    text: str
    kwargs: dict[str, Any]
    rule: str
    severity: str
    path: str
    line: int | None
    valid: bool  # the report's verdict
    message: str
    fix: str | None
    id: str


CASES = [
    RuleCase(
        text="distributed:\n  strategy: fsdp\n",
        kwargs={},
        rule="strategy-unknown",
        severity="error",
        path="distributed.strategy",
        line=2,
        valid=False,
        message="unknown strategy 'fsdp'; AutoModel 0.7.0 accepts ['ddp', 'fsdp2', 'megatron-fsdp', 'megatron_fsdp', 'mfsdp']",
        fix="strategy: fsdp2",
        id="strategy-unknown",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 0\n",
        kwargs={"world_size": 8},
        rule="size-invalid",
        severity="error",
        path="distributed.tp_size",
        line=2,
        valid=False,
        message="tp_size must be a positive integer, got 0 (int); AutoModel silently uses 1 instead",
        fix="tp_size: 1",
        id="size-invalid",
    ),
    RuleCase(
        text="distributed:\n  activation_checkpointing: sometimes\n",
        kwargs={},
        rule="ac-invalid",
        severity="error",
        path="distributed.activation_checkpointing",
        line=2,
        valid=False,
        message="activation_checkpointing='sometimes' is not accepted: AutoModel raises 'must be a boolean or one of full, selective, false'",
        fix="activation_checkpointing: true | selective | false",
        id="ac-invalid",
    ),
    RuleCase(
        text="distributed:\n  strategy: megatron_fsdp\n  activation_checkpointing: selective\n",
        kwargs={},
        rule="ac-selective-strategy",
        severity="error",
        path="distributed.activation_checkpointing",
        line=3,
        valid=False,
        message="activation_checkpointing: selective is supported only for fsdp2 and ddp, not strategy 'megatron_fsdp'",
        fix="strategy: fsdp2 (megatron_fsdp does not apply full checkpointing either), or remove activation_checkpointing",
        id="ac-selective-strategy",
    ),
    RuleCase(
        text="distributed:\n  activation_checkpointing_scope: [all, vision]\n",
        kwargs={},
        rule="ac-scope-invalid",
        severity="error",
        path="distributed.activation_checkpointing_scope",
        line=2,
        valid=False,
        message="activation_checkpointing_scope='all' cannot be combined with other scopes. (got ['all', 'vision'])",
        fix="activation_checkpointing_scope: all (or language, vision, audio, multimodal)",
        id="ac-scope-invalid",
    ),
    RuleCase(
        text="distributed:\n  _target_: nemo_automodel.components.distributed.fsdp2.FSDP2Manager\n  tp_size: 2\n",
        kwargs={},
        rule="hydra-target",
        severity="warning",
        path="distributed._target_",
        line=2,
        valid=True,
        message="_target_ is ignored by AutoModel 0.7.0; the strategy is 'fsdp2' (the default)",
        fix="replace _target_ with strategy: fsdp2",
        id="hydra-target",
    ),
    RuleCase(
        text="distributed:\n  _target_: nemo_automodel.components.distributed.ddp.DDPManager\n",
        kwargs={},
        rule="hydra-target",
        severity="error",
        path="distributed._target_",
        line=2,
        valid=False,
        message="_target_ names DDPManager (ddp) but AutoModel 0.7.0 ignores _target_ and runs strategy 'fsdp2': the intended strategy is silently replaced",
        fix="strategy: ddp (and drop _target_)",
        id="hydra-target-misread",
    ),
    RuleCase(
        text="distributed:\n  strategy: ddp\n  sequence_parallel: true\n",
        kwargs={},
        rule="option-unknown",
        severity="error",
        path="distributed.sequence_parallel",
        line=3,
        valid=False,
        message="unknown option 'sequence_parallel' for strategy 'ddp': AutoModel raises \"Unknown options for strategy 'ddp': ['sequence_parallel']\"",
        fix="remove 'sequence_parallel': it is an option of fsdp2 only (sequence parallelism needs strategy: fsdp2 with tp_size > 1)",
        id="option-unknown",
    ),
    RuleCase(
        text='distributed:\n  enable_compile: "no"\n',
        kwargs={},
        rule="option-type",
        severity="error",
        path="distributed.enable_compile",
        line=2,
        valid=False,
        message="enable_compile must be true or false, got 'no'; AutoModel passes it on unchecked (a non-empty string is truthy: AutoModel treats it as true)",
        fix="enable_compile: false (the default) or a valid value",
        id="option-type",
    ),
    RuleCase(
        text="distributed:\n  autocast_dtype: fp8\n",
        kwargs={},
        rule="dtype-invalid",
        severity="error",
        path="distributed.autocast_dtype",
        line=2,
        valid=False,
        message="autocast_dtype: unknown dtype 'fp8': AutoModel's dtype_from_str raises KeyError",
        fix="autocast_dtype: bfloat16 (or float32, float16)",
        id="dtype-invalid",
    ),
    RuleCase(
        text="distributed:\n  mp_policy:\n    param_dtype: bfloat16\n    foo: 1\n",
        kwargs={},
        rule="mp-policy-invalid",
        severity="error",
        path="distributed.mp_policy.foo",
        line=4,
        valid=False,
        message="unknown MixedPrecisionPolicy field 'foo': AutoModel raises TypeError (unexpected keyword argument)",
        fix="remove it (valid: cast_forward_inputs, output_dtype, param_dtype, reduce_dtype)",
        id="mp-policy-invalid",
    ),
    RuleCase(
        text="distributed:\n  offload_policy:\n    _target_: my.Evil\n",
        kwargs={},
        rule="offload-policy-invalid",
        severity="error",
        path="distributed.offload_policy._target_",
        line=3,
        valid=False,
        message="distributed.offload_policy._target_ is 'my.Evil': AutoModel imports and calls this target; only CPUOffloadPolicy is meaningful here (never imported by this tool)",
        fix="_target_: torch.distributed.fsdp.CPUOffloadPolicy (or drop _target_)",
        id="offload-policy-invalid",
    ),
    RuleCase(
        text="distributed:\n  multimodal:\n    frozen_sharding: sometimes\n",
        kwargs={},
        rule="multimodal-invalid",
        severity="error",
        path="distributed.multimodal.frozen_sharding",
        line=3,
        valid=False,
        message="distributed.multimodal.frozen_sharding must be one of ['root', 'per_layer', 'replicate'], got 'sometimes'",
        fix="frozen_sharding: root (the default) or a valid value",
        id="multimodal-invalid",
    ),
    RuleCase(
        text="distributed:\n  pipeline:\n    pp_schedule: 1f1b\n",
        kwargs={},
        rule="pipeline-ignored",
        severity="warning",
        path="distributed.pipeline",
        line=2,
        valid=True,
        message="pipeline: is set but pp_size=1: pipeline parallelism is off and AutoModel ignores the block",
        fix="set pp_size > 1 to use it, or remove the block",
        id="pipeline-ignored",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n",
        kwargs={},
        rule="pipeline-missing",
        severity="error",
        path="distributed.pp_size",
        line=2,
        valid=False,
        message="pp_size=2 enables pipeline parallelism but there is no distributed.pipeline block; AutoModel raises ValueError",
        fix="add `pipeline: {pp_schedule: 1f1b, pp_microbatch_size: 1}` (an empty `pipeline: {}` selects the defaults)",
        id="pipeline-missing",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedul: 1f1b\n",
        kwargs={},
        rule="pipeline-invalid",
        severity="error",
        path="distributed.pipeline.pp_schedul",
        line=4,
        valid=False,
        message="unknown key 'pp_schedul' in distributed.pipeline; AutoModel's PipelineConfig has no such field (TypeError: unexpected keyword argument)",
        fix="remove it; did you mean 'pp_schedule'? (valid: dtype, layers_per_stage, loss_fn, module_fqns_per_model_part, patch_causal_lm_model, patch_inner_model, patch_stage_backward_maybe_with_nosync, pp_batch_size, pp_microbatch_size, pp_recv_buffer_pool, pp_recv_buffer_pool_slack, pp_schedule, pp_schedule_csv, pp_seq_len, round_virtual_stages_to_pp_multiple, scale_grads_in_schedule)",
        id="pipeline-invalid",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline:\n    pp_recv_buffer_pool_slack: -1\n",
        kwargs={},
        rule="pipeline-recv-slack",
        severity="error",
        path="distributed.pipeline.pp_recv_buffer_pool_slack",
        line=4,
        valid=False,
        message="pp_recv_buffer_pool_slack must be an integer >= 0, got -1",
        fix="pp_recv_buffer_pool_slack: 2 (the default)",
        id="pipeline-recv-slack",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: interleaved_1f1b\n",
        kwargs={},
        rule="pp-schedule-unknown",
        severity="error",
        path="distributed.pipeline.pp_schedule",
        line=4,
        valid=False,
        message="pp_schedule 'interleaved_1f1b' is not a schedule torch's get_schedule_class knows (a spelling from older docs / AutoModel's docstring): AutoModel fails with \"Unknown schedule name\"; valid (case-insensitive): 1F1B, GPipe, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV",
        fix="pp_schedule: interleaved1f1b",
        id="pp-schedule-unknown",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline:\n    pp_microbatch_size: 0\n",
        kwargs={},
        rule="pp-microbatch-invalid",
        severity="error",
        path="distributed.pipeline.pp_microbatch_size",
        line=4,
        valid=False,
        message="pp_microbatch_size must be a positive integer, got 0; AutoModel does not check it and the pipeline schedule build fails (division by zero / negative microbatch count)",
        fix="pp_microbatch_size: 1",
        id="pp-microbatch-invalid",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline:\n    dtype: float32\n",
        kwargs={},
        rule="pipeline-dtype-mismatch",
        severity="warning",
        path="distributed.pipeline.dtype",
        line=4,
        valid=True,
        message="pipeline.dtype=float32 does not match the FSDP activation dtype bfloat16 (mp_policy) used for inter-stage communication; this can corrupt pipeline stage shape inference",
        fix="remove pipeline.dtype (AutoModel derives it from mp_policy)",
        id="pipeline-dtype-mismatch",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline:\n    pp_batch_size: 8\n",
        kwargs={},
        rule="pipeline-overwritten",
        severity="info",
        path="distributed.pipeline.pp_batch_size",
        line=4,
        valid=True,
        message="pipeline.pp_batch_size is overwritten at runtime by step_scheduler.local_batch_size",
        fix="remove pipeline.pp_batch_size",
        id="pipeline-overwritten",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: DualPipeV\n",
        kwargs={},
        rule="pp-schedule-dualpipev",
        severity="warning",
        path="distributed.pipeline.pp_schedule",
        line=4,
        valid=True,
        message="AutoModel 0.7.0 assigns pipeline stages loop-style for DualPipeV (stages r and r+pp on rank r) but torch's DualPipeV expects V-style placement (r and 2*pp-1-r): stage-to-rank maps disagree and the run is expected to hang or fail at the first step",
        fix="pp_schedule: zbvzerobubble (V-style, placed correctly) or interleaved1f1b",
        id="pp-schedule-dualpipev",
    ),
    RuleCase(
        text="distributed:\n  moe:\n    reshard_after_forward: true\n",
        kwargs={},
        rule="moe-ignored",
        severity="warning",
        path="distributed.moe",
        line=2,
        valid=True,
        message="moe: is set but ep_size=1: AutoModel silently drops the block",
        fix="set ep_size > 1 to use it, or remove moe:",
        id="moe-ignored",
    ),
    RuleCase(
        text="distributed:\n  ep_size: 2\n  moe:\n    ignore_router_for_ac: 3\n",
        kwargs={},
        rule="moe-invalid",
        severity="error",
        path="distributed.moe.ignore_router_for_ac",
        line=4,
        valid=False,
        message="distributed.moe.ignore_router_for_ac must be true or false, got 3",
        fix="ignore_router_for_ac: true (the default) or a valid value",
        id="moe-invalid",
    ),
    RuleCase(
        text="distributed:\n  ep_size: 2\n  activation_checkpointing: true\n  moe:\n    ignore_router_for_ac: false\n",
        kwargs={},
        rule="moe-ac-router",
        severity="warning",
        path="distributed.moe.ignore_router_for_ac",
        line=5,
        valid=True,
        message="ignore_router_for_ac: false with activation checkpointing recomputes the router in backward; tied top-k picks can route a different number of tokens per expert and torch.utils.checkpoint raises CheckpointError",
        fix="ignore_router_for_ac: true (the default)",
        id="moe-ac-router",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 4\n  enable_async_tensor_parallel: true\n",
        kwargs={"world_size": 8},
        rule="tp-async-needs-sp",
        severity="error",
        path="distributed.enable_async_tensor_parallel",
        line=3,
        valid=False,
        message="enable_async_tensor_parallel: true with tp_size=4 needs sequence_parallel: true; AutoModel's FSDP2 parallelizer raises 'enable_async_tensor_parallel=True requires sequence_parallel=True' when it parallelizes the model, after launch",
        fix="add sequence_parallel: true (async TP overlaps its reduce-scatters), or remove enable_async_tensor_parallel",
        id="tp-async-needs-sp",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n  pp_size: 2\n  sequence_parallel: true\n  pipeline: {}\n",
        kwargs={"world_size": 8},
        rule="pp-sequence-parallel",
        severity="error",
        path="distributed.sequence_parallel",
        line=4,
        valid=False,
        message="sequence_parallel: true with tp_size=2 and pp_size=2: every pipeline stage after the first fails in its first forward (q has 2x the sequence of RoPE's cos/sin). AutoModel's _precompute_stage_shapes (pipelining/functional.py) sizes the next stage's input as a plain full-length tensor while the previous stage sends its sequence shard, and the sequence-parallel norm all-gathers that tensor again; seen on AutoModel's Llama and Qwen3 classes and the Hugging Face fallback with 1F1B, Interleaved1F1B, GPipe and ZBVZeroBubble (classes with their own pipeline forward were not run)",
        fix="sequence_parallel: false while pp_size > 1 (or pp_size: 1 and scale with TP, CP or FSDP)",
        id="pp-sequence-parallel",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n  ep_size: 4\n",
        kwargs={"world_size": 8},
        rule="moe-tp",
        severity="error",
        path="distributed.tp_size",
        line=2,
        valid=False,
        message="tp_size=2 without tp_plan: with ep_size=4 AutoModel parallelizes through its MoE path, which needs a TP plan for the non-expert modules; no AutoModel 0.7.0 MoE model registers one, so it raises 'No safe tensor-parallel plan is registered for custom MoE model' after launch",
        fix="tp_size: 1 (split with ep_size/cp_size/pp_size instead), or give tp_plan: a dict or import path of the styles for attention/shared modules (routed experts stay EP-owned)",
        id="moe-tp",
    ),
    RuleCase(
        text="distributed:\n  strategy: fsdp2\n  tp_size: 2\n",
        kwargs={"world_size": 8, "torch_version": "2.15.0+cu132"},
        rule="torch-version",
        severity="error",
        path="distributed.strategy",
        line=2,
        valid=False,
        message="torch 2.15.0+cu132 with strategy fsdp2 on 8 ranks: AutoModel 0.7.0's FSDP2 parallelizer patches FSDPParam.to_accumulated_grad_if_needed, which torch 2.15 removed, and raises \"AttributeError: type object 'FSDPParam' has no attribute 'to_accumulated_grad_if_needed'\" when it parallelizes the model, after launch",
        fix="launch with torch 2.14 or older (AutoModel 0.7.0 asks for torch>=2.8), or strategy: ddp if the model fits one GPU",
        id="torch-version",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={"world_size": 8, "torch_version": "latest"},
        rule="torch-version",
        severity="warning",
        path="distributed",
        line=1,
        valid=True,
        message="torch_version 'latest' is not a torch version (MAJOR.MINOR[.PATCH][+local]); the torch release checks were skipped",
        fix="pass what `python -c 'import torch; print(torch.__version__)'` prints where the job runs",
        id="torch-version-unreadable",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n  ep_size: 4\n  tp_plan: my_plans.moe_tp\n  sequence_parallel: true\n",
        kwargs={"world_size": 8},
        rule="moe-tp",
        severity="error",
        path="distributed.sequence_parallel",
        line=5,
        valid=False,
        message="sequence_parallel: true: with ep_size=4 and tp_size=2 AutoModel parallelizes through its MoE path, which keeps router and attention activations replicated and raises 'sequence_parallel=True is not supported by the custom MoE TP path' after launch",
        fix="remove sequence_parallel (or use tp_size: 1)",
        id="moe-tp-sequence-parallel",
    ),
    RuleCase(
        text="distributed:\n  sequence_parallel: true\n",
        kwargs={"world_size": 8},
        rule="tp-option-no-effect",
        severity="info",
        path="distributed.sequence_parallel",
        line=2,
        valid=True,
        message="sequence_parallel: true has no effect with tp_size=1",
        fix="remove sequence_parallel, or set tp_size > 1",
        id="tp-option-no-effect",
    ),
    RuleCase(
        text="distributed:\n  strategy: megatron_fsdp\n  activation_checkpointing: true\n",
        kwargs={"world_size": 8},
        rule="megatron-fsdp-ac-ignored",
        severity="warning",
        path="distributed.activation_checkpointing",
        line=3,
        valid=True,
        message="activation_checkpointing: true with megatron_fsdp: AutoModel 0.7.0 logs 'Activation checkpointing is not yet supported with MegatronFSDP. Skipping.' and keeps every activation, so memory is as without checkpointing",
        fix="strategy: fsdp2 to checkpoint activations (estimate_memory shows the difference), or remove activation_checkpointing",
        id="megatron-fsdp-ac-ignored",
    ),
    RuleCase(
        text="distributed:\n  strategy: megatron_fsdp\n  tp_size: 2\n",
        kwargs={"world_size": 2},
        rule="megatron-fsdp-unsharded",
        severity="warning",
        path="distributed.tp_size",
        line=3,
        valid=True,
        message="dp * cp = 1 (tp_size=2 on 2 ranks): AutoModel logs 'MegatronFSDP DP shard group size is 1; skipping MegatronFSDP wrapping' and trains the tensor-parallel model without any sharding",
        fix="tp_size: 1 to leave ranks for MegatronFSDP, or strategy: fsdp2",
        id="megatron-fsdp-unsharded",
    ),
    RuleCase(
        text="distributed:\n  strategy: ddp\n  tp_size: 2\n",
        kwargs={},
        rule="strategy-unsupported",
        severity="error",
        path="distributed.tp_size",
        line=3,
        valid=False,
        message="ddp does not support tensor parallelism (tp_size=2)",
        fix="set tp_size: 1, or use strategy: fsdp2 which supports it",
        id="strategy-unsupported",
    ),
    RuleCase(
        text="distributed:\n  strategy: megatron_fsdp\n  dp_replicate_size: 2\n",
        kwargs={},
        rule="dp-replicate-strategy",
        severity="error",
        path="distributed.dp_replicate_size",
        line=3,
        valid=False,
        message="dp_replicate_size=2 (HSDP) is only supported with fsdp2, not megatron_fsdp",
        fix="remove dp_replicate_size, or use strategy: fsdp2",
        id="dp-replicate-strategy",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 3\n",
        kwargs={"world_size": 8},
        rule="world-not-divisible",
        severity="error",
        path="distributed.tp_size",
        line=2,
        valid=False,
        message="world_size (8) must be divisible by (tp_size * cp_size * pp_size) (3 * 1 * 1 = 3)",
        fix="use a world size that is a multiple of 3 (e.g. 6 or 9), or tp_size in {1, 2, 4, 8}",
        id="world-not-divisible",
    ),
    RuleCase(
        text="distributed:\n  dp_size: 16\n  tp_size: 2\n",
        kwargs={"world_size": 16},
        rule="dp-size-exceeds-world",
        severity="error",
        path="distributed.dp_size",
        line=2,
        valid=False,
        message="dp_size=16 gives a mesh of 32 ranks (dp*tp*cp*pp), more than world_size=16: torch fails with 'Mesh should not be bigger than default world size'",
        fix="dp_size: 8 (or remove it)",
        id="dp-size-exceeds-world",
    ),
    RuleCase(
        text="distributed:\n  dp_size: 2\n  tp_size: 2\n",
        kwargs={"world_size": 8},
        rule="dp-size-leaves-ranks",
        severity="warning",
        path="distributed.dp_size",
        line=2,
        valid=True,
        message="dp_size=2 gives a mesh of 4 ranks but world_size=8: ranks 4..7 are outside the mesh; on torch 2.13 AutoModel's mesh build fails on those ranks ('needs to contain the local rank') unless they are deliberately idle",
        fix="dp_size: 4 (or remove it)",
        id="dp-size-leaves-ranks",
    ),
    RuleCase(
        text="distributed:\n  dp_replicate_size: 3\n",
        kwargs={"world_size": 8},
        rule="dp-replicate-not-multiple",
        severity="error",
        path="distributed.dp_replicate_size",
        line=2,
        valid=False,
        message="dp_size (8) must be a multiple of dp_replicate_size (3)",
        fix="dp_replicate_size in {1, 2, 4}",
        id="dp-replicate-not-multiple",
    ),
    RuleCase(
        text="distributed:\n  dp_replicate_size: 8\n",
        kwargs={"world_size": 8},
        rule="dp-replicate-too-large",
        severity="error",
        path="distributed.dp_replicate_size",
        line=2,
        valid=False,
        message="dp_replicate_size=8 must be less than dp_size=8 (DDP-style pure replication is not supported by FSDP2)",
        fix="dp_replicate_size in {1, 2, 4} or strategy: ddp",
        id="dp-replicate-too-large",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n  ep_size: 16\n",
        kwargs={"world_size": 8},
        rule="ep-not-divisible",
        severity="error",
        path="distributed.ep_size",
        line=3,
        valid=False,
        message="non_pp_size=8 (dp*cp*tp = 4*1*2) must be a multiple of ep_size=16 (the 0.7.0 code requires dp*cp*tp, not dp*cp as older docs say)",
        fix="ep_size in {2, 4, 8}",
        id="ep-not-divisible",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={},
        rule="world-size-missing",
        severity="info",
        path="distributed",
        line=1,
        valid=True,
        message="world_size not given: the checks that need dp (world divisibility, HSDP, EP, batch sizes, node placement) were skipped",
        fix="pass world_size (or nodes and gpus_per_node)",
        id="world-size-missing",
    ),
    RuleCase(
        text="step_scheduler:\n  local_batch_size: 0\ndistributed:\n  tp_size: 2\n",
        kwargs={"world_size": 8},
        rule="batch-size-invalid",
        severity="error",
        path="step_scheduler.local_batch_size",
        line=2,
        valid=False,
        message="step_scheduler.local_batch_size must be a positive integer, got 0",
        fix="local_batch_size: 1",
        id="batch-size-invalid",
    ),
    RuleCase(
        text="step_scheduler:\n  local_batch_size: 6\ndistributed:\n  pp_size: 2\n  pipeline:\n    pp_microbatch_size: 4\n",
        kwargs={"world_size": 8},
        rule="pp-batch-divisibility",
        severity="error",
        path="distributed.pipeline.pp_microbatch_size",
        line=6,
        valid=False,
        message="step_scheduler.local_batch_size=6 is not divisible by pipeline.pp_microbatch_size=4: AutoModel's pipeline schedule build raises ValueError",
        fix="local_batch_size: 8 (with pp_microbatch_size=4), or pp_microbatch_size: 3 (with local_batch_size=6)",
        id="pp-batch-divisibility",
    ),
    RuleCase(
        text="step_scheduler:\n  local_batch_size: 2\ndistributed:\n  pp_size: 4\n  pipeline:\n    pp_microbatch_size: 1\n",
        kwargs={"world_size": 8},
        rule="pp-microbatches",
        severity="error",
        path="step_scheduler.local_batch_size",
        line=2,
        valid=False,
        message="local_batch_size 2 // pp_microbatch_size 1 = 2 microbatches, fewer than pp_size=4: the recipe's assertion fails",
        fix="local_batch_size: 4 (with pp_microbatch_size=1)",
        id="pp-microbatches",
    ),
    RuleCase(
        text="step_scheduler:\n  local_batch_size: 5\ndistributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: interleaved1f1b\n",
        kwargs={"world_size": 8},
        rule="pp-microbatches",
        severity="error",
        path="step_scheduler.local_batch_size",
        line=2,
        valid=False,
        message="Interleaved1F1B needs the number of microbatches (5) to be a multiple of the number of rounds (2 = max(1, 5 // pp_size 2)): torch raises ValueError when building the schedule",
        fix="local_batch_size: 4 or 6 (with pp_microbatch_size=1)",
        id="pp-microbatches-rounds",
    ),
    RuleCase(
        text="step_scheduler:\n  global_batch_size: 30\n  local_batch_size: 4\ndistributed:\n  tp_size: 2\n",
        kwargs={"world_size": 8},
        rule="global-batch-divisibility",
        severity="error",
        path="step_scheduler.global_batch_size",
        line=2,
        valid=False,
        message="global_batch_size (30) must be divisible by local_batch_size * dp_size (4 * 4 = 16): StepScheduler raises ValueError",
        fix="global_batch_size: 16 or 32",
        id="global-batch-divisibility",
    ),
    RuleCase(
        text="distributed:\n  cp_size: 4\npacked_sequence:\n  packed_sequence_size: 1020\n",
        kwargs={"world_size": 8},
        rule="cp-seq-divisibility",
        severity="error",
        path="packed_sequence.packed_sequence_size",
        line=4,
        valid=False,
        message="packed_sequence.packed_sequence_size=1020 is not divisible by 2*cp_size=8: load-balanced context parallelism splits each sequence into 8 chunks",
        fix="packed_sequence_size: 1024",
        id="cp-seq-divisibility",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 3\n",
        kwargs={"world_size": 12, "model": "meta-llama/Llama-3.1-8B"},
        rule="tp-heads",
        severity="error",
        path="distributed.tp_size",
        line=2,
        valid=False,
        message="tp_size=3 does not divide num_attention_heads=32 and num_key_value_heads=8 of meta-llama/Llama-3.1-8B: AutoModel's TP validation fails after launch",
        fix="use tp_size in {1, 2, 4}",
        id="tp-heads",
    ),
    RuleCase(
        text="distributed:\n  ep_size: 64\n",
        kwargs={"world_size": 64, "model": "openai/gpt-oss-20b"},
        rule="ep-experts",
        severity="error",
        path="distributed.ep_size",
        line=2,
        valid=False,
        message="n_routed_experts 32 of openai/gpt-oss-20b must be divisible by ep_size=64",
        fix="use ep_size in {2, 4, 8, 16, 32}",
        id="ep-experts",
    ),
    RuleCase(
        text="distributed:\n  ep_size: 2\n",
        kwargs={"world_size": 8, "model": "meta-llama/Llama-3.1-8B"},
        rule="ep-dense-model",
        severity="error",
        path="distributed.ep_size",
        line=2,
        valid=False,
        message="ep_size=2 but meta-llama/Llama-3.1-8B is a dense model (no experts): AutoModel raises 'Expert parallelism (ep_size=2) requires a MoE model' when it builds the model, after launch",
        fix="ep_size: 1",
        id="ep-dense-model",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={"world_size": 16, "model": "Qwen/Qwen3-30B-A3B"},
        rule="model-capability",
        severity="error",
        path="distributed.tp_size",
        line=2,
        valid=False,
        message="tp_size=2: AutoModel 0.7.0 builds Qwen/Qwen3-30B-A3B with AutoModel's own Qwen3MoeForCausalLM (nemo_automodel.components.models.qwen3_moe.model) and raises 'Tensor parallelism (tp_size=2) requested but Qwen3MoeForCausalLM has no TP plan' right after building it, after launch",
        fix="tp_size: 1, and shard with FSDP (dp) plus ep_size / pp_size / cp_size",
        id="model-capability",
    ),
    RuleCase(
        text="distributed:\n  ep_size: 8\n",
        kwargs={"world_size": 16, "model": "mistralai/Mixtral-8x7B-v0.1"},
        rule="model-capability",
        severity="error",
        path="distributed.ep_size",
        line=2,
        valid=False,
        message="ep_size=8: AutoModel 0.7.0 builds mistralai/Mixtral-8x7B-v0.1 with the Hugging Face MixtralForCausalLM (transformers.models.mixtral.modeling_mixtral) and raises 'Expert parallelism (ep_size=8) requires a MoE model, but MixtralForCausalLM does not inherit from MoEFSDPSyncMixin' right after building it, after launch",
        fix="ep_size: 1: the experts are then FSDP-sharded with the rest of the model",
        id="model-capability-ep",
    ),
    RuleCase(
        text="model:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B\n  backend:\n    attn: sdpa\ndistributed:\n  cp_size: 2\n",
        kwargs={"world_size": 8},
        rule="model-cp-backend",
        severity="error",
        path="model.backend.attn",
        line=4,
        valid=False,
        message="cp_size=2 with model.backend.attn: sdpa: AutoModel 0.7.0 builds meta-llama/Llama-3.1-8B with AutoModel's own LlamaForCausalLM (nemo_automodel.components.models.llama.model), whose context parallelism needs attn {magi, te}; it raises 'Context parallelism (cp_size=2) for LlamaForCausalLM requires the TE attention backend' right after building the model, after launch",
        fix="model.backend.attn: te (or cp_size: 1)",
        id="model-cp-backend",
    ),
    RuleCase(
        text="model:\n  backend:\n    attn: flex\ndistributed:\n  cp_size: 2\n",
        kwargs={"world_size": 8, "model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"},
        rule="model-cp-backend",
        severity="error",
        path="model.backend.attn",
        line=3,
        valid=False,
        message="cp_size=2 with model.backend.attn: flex: AutoModel 0.7.0 builds nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 with AutoModel's own NemotronHForCausalLM (nemo_automodel.components.models.nemotron_v3.model), whose context parallelism needs attn {sdpa, te}; it raises 'Context parallelism (cp_size=2) for hybrid model NemotronHForCausalLM requires the TE or SDPA attention backend' right after building the model, after launch",
        fix="model.backend.attn: te or sdpa (or cp_size: 1)",
        id="model-cp-backend-hybrid",
    ),
    RuleCase(
        text="distributed:\n  cp_size: 2\n",
        kwargs={
            "world_size": 8,
            "model": {
                "architectures": ["DeepseekV4ForCausalLM"],
                "model_type": "deepseek_v4",
                "hidden_size": 1024,
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "num_key_value_heads": 8,
                "vocab_size": 1000,
            },
        },
        rule="model-cp-backend",
        severity="error",
        path="distributed.cp_size",
        line=2,
        valid=False,
        message="cp_size=2 with model.backend.attn unset (AutoModel's default: te with Transformer Engine on CUDA, else sdpa): AutoModel 0.7.0 builds DeepseekV4ForCausalLM with AutoModel's own DeepseekV4ForCausalLM (nemo_automodel.components.models.deepseek_v4.model), whose context parallelism needs attn {tilelang}; it raises 'Context parallelism (cp_size=2) for DeepseekV4ForCausalLM requires the TileLang attention backend (backend.attn='tilelang')' right after building the model, after launch",
        fix="model.backend.attn: tilelang (or cp_size: 1)",
        id="model-cp-backend-default",
    ),
    RuleCase(
        text="distributed:\n  sequence_parallel: true\n",
        kwargs={"world_size": 8, "model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"},
        rule="model-sp-unsupported",
        severity="error",
        path="distributed.sequence_parallel",
        line=2,
        valid=False,
        message="sequence_parallel: true with nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16: AutoModel 0.7.0 builds it with AutoModel's own NemotronHForCausalLM (nemo_automodel.components.models.nemotron_v3.model), whose FSDP2 parallelizer raises 'Sequence parallelism is not supported for NemotronHForCausalLM' (at any tp_size) when it parallelizes the model, after launch",
        fix="remove sequence_parallel",
        id="model-sp-unsupported",
    ),
    RuleCase(
        text="distributed:\n  cp_size: 3\n",
        kwargs={"world_size": 48, "model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"},
        rule="cp-mamba-heads",
        severity="error",
        path="distributed.cp_size",
        line=2,
        valid=False,
        message="mamba_num_heads=64 is not divisible by cp_size=3 in nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's Mamba layers: AutoModel's MambaContextParallel asserts this when it parallelizes the model, after launch",
        fix="use cp_size in {2, 4, 8, 16}",
        id="cp-mamba-heads",
    ),
    RuleCase(
        text="distributed:\n  cp_size: 6\n",
        kwargs={
            "world_size": 12,
            "model": {
                "architectures": ["NemotronHForCausalLM"],
                "model_type": "nemotron_h",
                "hidden_size": 64,
                "num_attention_heads": 4,
                "num_hidden_layers": 3,
                "hybrid_override_pattern": "M*-",
                "mamba_num_heads": 12,
                "n_groups": 4,
            },
        },
        rule="cp-mamba-heads",
        severity="error",
        path="distributed.cp_size",
        line=2,
        valid=False,
        message="cp_size=6 is not a multiple of n_groups=4 (fewer groups than CP ranks) in NemotronHForCausalLM's Mamba layers: AutoModel's MambaContextParallel asserts this when it parallelizes the model, after launch",
        fix="use cp_size in {2, 4, 12}",
        id="cp-mamba-groups",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline: {}\n",
        kwargs={"world_size": 8, "model": "tiiuae/Falcon-H1-7B-Instruct"},
        rule="pp-falcon-h1-forward",
        severity="warning",
        path="distributed.pp_size",
        line=2,
        valid=True,
        message="pp_size=2 with tiiuae/Falcon-H1-7B-Instruct: AutoModel's generic pipeline stage forward replaces Falcon-H1's and leaves out its embedding and logits multipliers and its final norm (final_layernorm): the stages train another function than the checkpoint's, with no error",
        fix="pp_size: 1 (shard with FSDP, or TP)",
        id="pp-falcon-h1-forward",
    ),
    RuleCase(
        text="distributed:\n  strategy: megatron_fsdp\nloss_fn:\n"
        "  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\n",
        kwargs={"world_size": 8, "model": "meta-llama/Llama-3.2-1B"},
        rule="megatron-fsdp-linear-ce",
        severity="warning",
        path="loss_fn",
        line=3,
        valid=True,
        message="loss_fn FusedLinearCrossEntropy with strategy megatron_fsdp: megatron-fsdp 0.5.0's root backward hook sits on lm_head's output, which a linear cross entropy never uses, so the root's post-backward and finish_grad_sync never run: the optimizer steps with no gradient attached (the dry run finds none), and every parameter bucket the backward gathers stays gathered from the first step on (2.3 GiB of meta-llama/Llama-3.2-1B's parameters in bf16)",
        fix="loss_fn: MaskedCrossEntropy with megatron_fsdp, or strategy: fsdp2 with the linear cross entropy",
        id="megatron-fsdp-linear-ce",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n  sequence_parallel: true\n",
        kwargs={"world_size": 8, "model": "meta-models/Muse-Glimmer-30B"},
        rule="sp-ignored",
        severity="warning",
        path="distributed.sequence_parallel",
        line=3,
        valid=True,
        message="sequence_parallel: true with meta-models/Muse-Glimmer-30B: AutoModel 0.7.0's TP plan for it ignores the flag, so the activations SP would split stay whole on each of the 2 TP ranks (the estimate counts them so), with no error",
        fix="remove sequence_parallel (it changes nothing here)",
        id="sp-ignored",
    ),
    RuleCase(
        text="distributed:\n  cp_size: 2\n",
        kwargs={"world_size": 8, "model": "tiiuae/Falcon-H1-7B-Instruct"},
        rule="cp-parallel-mamba",
        severity="warning",
        path="distributed.cp_size",
        line=2,
        valid=True,
        message="cp_size=2 with tiiuae/Falcon-H1-7B-Instruct: AutoModel accepts it (its hybrid check does not see Falcon-H1's Mamba layers) and shards every sequence 2 ways, but only the attention is made whole; the Mamba-2 branch in each of the 44 layers scans its rank's 1/2 of the sequence alone, so the step trains on outputs that are not the model's",
        fix="cp_size: 1 (no context-parallel path for Falcon-H1's Mamba branch in AutoModel 0.7.0)",
        id="cp-parallel-mamba",
    ),
    RuleCase(
        text="distributed:\n  ep_size: 8\n",
        kwargs={"world_size": 24, "model": "Qwen/Qwen3-30B-A3B"},
        rule="ep-shard-uneven",
        severity="error",
        path="distributed.ep_size",
        line=2,
        valid=False,
        message="ep_shard=3 (dp*cp*tp=24 / ep_size=8) does not divide hidden_size=2048 of Qwen/Qwen3-30B-A3B: AutoModel FSDP-shards the grouped expert weights over ep_shard on dim 1 and torch raises 'FSDP does not support uneven sharding on dim 1' when AutoModel parallelizes the model, after launch",
        fix="ep_size: 1 (experts are then FSDP-sharded on dim 0), or a rank count where ep_shard = dp*cp*tp / ep_size divides gcd(hidden_size, moe_intermediate_size) = 256",
        id="ep-shard-uneven",
    ),
    RuleCase(
        text="distributed:\n  ep_size: 2\n",
        kwargs={"world_size": 256, "model": "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"},
        rule="ep-shard-uneven",
        severity="error",
        path="distributed.ep_size",
        line=2,
        valid=False,
        message="ep_shard=128 (dp*cp*tp=256 / ep_size=2) does not divide moe_intermediate_size=1856 of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16: AutoModel FSDP-shards the grouped expert weights over ep_shard on dim 1 and torch raises 'FSDP does not support uneven sharding on dim 1' when AutoModel parallelizes the model, after launch",
        fix="ep_size in {4, 8, 16, 32, 64, 128}",
        id="ep-shard-uneven-fix",
    ),
    RuleCase(
        text="distributed:\n  ep_size: 2\n",
        kwargs={"world_size": 8, "model": "nvidia/Nemotron-H-8B-Base-8K"},
        rule="ep-no-experts",
        severity="warning",
        path="distributed.ep_size",
        line=2,
        valid=True,
        message="ep_size=2 but nvidia/Nemotron-H-8B-Base-8K has no MoE layers: AutoModel's own NemotronHForCausalLM (nemo_automodel.components.models.nemotron_v3.model) accepts it and its expert-parallel path has no experts to place, so the ep split does nothing",
        fix="ep_size: 1",
        id="ep-no-experts",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline: {}\n",
        kwargs={"world_size": 8, "model": "meta-llama/Llama-3.2-1B"},
        rule="pp-tied-embeddings",
        severity="warning",
        path="distributed.pp_size",
        line=2,
        valid=True,
        message="pp_size=2 with meta-llama/Llama-3.2-1B, which ties its input and output embeddings: AutoModel's meta init loses the tie, so its pipeline check passes and the last stage trains a separate lm_head (262,668,288 more parameters that no longer share the embedding's weight)",
        fix="pp_size: 1 to keep the tie, or accept an untied lm_head",
        id="pp-tied-embeddings",
    ),
    RuleCase(
        text="quantization:\n  load_in_4bit: true\ndistributed:\n  pp_size: 2\n  pipeline: {}\n",
        kwargs={"world_size": 8, "model": "meta-llama/Llama-3.2-1B"},
        rule="pp-tied-embeddings",
        severity="error",
        path="distributed.pp_size",
        line=4,
        valid=False,
        message="pp_size=2 but meta-llama/Llama-3.2-1B ties its input and output embeddings (tie_word_embeddings: true) and the model is quantized (the recipe's quantization: or its config.json), so AutoModel builds it without meta init and the weights stay tied: its pipeline builder raises 'Pipeline parallelism does not support tie_word_embeddings=True' after launch",
        fix="pp_size: 1, and shard with FSDP (dp), tp_size or cp_size",
        id="pp-tied-embeddings-quantized",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline: {}\n",
        kwargs={
            "world_size": 8,
            "model": {
                "architectures": ["LlavaForConditionalGeneration"],
                "model_type": "llava",
                "text_config": {
                    "model_type": "llama",
                    "hidden_size": 4096,
                    "num_hidden_layers": 32,
                    "num_attention_heads": 32,
                    "num_key_value_heads": 32,
                    "intermediate_size": 11008,
                    "vocab_size": 32064,
                },
            },
        },
        rule="pp-model-unsupported",
        severity="error",
        path="distributed.pp_size",
        line=2,
        valid=False,
        message="pp_size=2 with LlavaForConditionalGeneration: AutoModel's pipeline builder raises 'Model ... is not compatible with pipeline parallelism: VLM model_type='llava' is not on the pipeline-aware list (gemma4, mistral3) and the model class LlavaForConditionalGeneration does not declare ``_pp_keep_self_forward = True``.' after launch",
        fix="pp_size: 1, and shard with FSDP (dp), tp_size or cp_size",
        id="pp-model-unsupported",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  ep_size: 8\n  pipeline:\n    pp_schedule: 1f1b\n"
        "    patch_causal_lm_model: false\n",
        kwargs={"world_size": 16, "model": "deepseek-ai/DeepSeek-V4-Flash"},
        rule="pp-patched-forward",
        severity="error",
        path="distributed.pipeline.patch_inner_model",
        line=4,
        valid=False,
        message="pp_size=2 with patch_inner_model on (the default): AutoModel's generic stage forward replaces "
        "DeepseekV4ForCausalLM's own, which hands its hyper-connection streams ([B, S, hc_mult, hidden]) from stage to "
        "stage; the next stage gets [B, S, hidden] and the first forward fails ('a and b must have same reduction "
        "dim') after launch",
        fix="distributed.pipeline: {patch_inner_model: false, patch_causal_lm_model: false}",
        id="pp-patched-forward",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={
            "world_size": 8,
            "model": {
                "architectures": ["AcmeForCausalLM"],
                "model_type": "acme",
                "auto_map": {"AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"},
                "hidden_size": 2048,
                "num_hidden_layers": 16,
                "num_attention_heads": 16,
                "num_key_value_heads": 8,
                "intermediate_size": 8192,
                "vocab_size": 32000,
            },
        },
        rule="model-remote-code-tp",
        severity="warning",
        path="distributed.tp_size",
        line=2,
        valid=True,
        message="tp_size=2 with AcmeForCausalLM, a trust_remote_code architecture (AcmeForCausalLM, config.json auto_map) that AutoModel 0.7.0 has no plan for: unless its code defines a usable _tp_plan, AutoModel raises 'No tensor-parallel plan is registered for the custom-code architecture 'AcmeForCausalLM' (loaded via trust_remote_code=True), and no usable HuggingFace `_tp_plan` was found' when it parallelizes the model, after launch (its code was not run here)",
        fix="tp_size: 1, or give distributed.tp_plan",
        id="model-remote-code-tp",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: mistralai/Mixtral-8x7B-v0.1\npacked_sequence:\n  packed_sequence_size: 4096\ndistributed:\n  cp_size: 2\n",
        kwargs={"world_size": 8},
        rule="model-cp-packing",
        severity="error",
        path="packed_sequence.packed_sequence_size",
        line=5,
        valid=False,
        message="cp_size=2 with packed_sequence_size=4096: mistralai/Mixtral-8x7B-v0.1 is built as the Hugging Face MixtralForCausalLM (AutoModel 0.7.0 has no class of its own for it), and for Hugging Face classes AutoModel raises 'Packed sequence is only supported with CP size 1' when it builds the model, after launch",
        fix="packed_sequence_size: 0, or cp_size: 1",
        id="model-cp-packing",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 4\n  pipeline:\n    pp_schedule: interleaved1f1b\n    layers_per_stage: 8\n",
        kwargs={"world_size": 8, "model": "meta-llama/Llama-3.2-1B"},
        rule="pp-stages",
        severity="error",
        path="distributed.pipeline.layers_per_stage",
        line=5,
        valid=False,
        message="meta-llama/Llama-3.2-1B (16 layers), pp_size=4, Interleaved1F1B: Number of virtual stages (2) must be divisible by pipeline parallel size (4); the model has 16 layers with layers_per_stage=8",
        fix="layers_per_stage in {1, 2}",
        id="pp-stages",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={"world_size": 8, "nodes": 2, "gpus_per_node": 8},
        rule="world-mismatch",
        severity="error",
        path="distributed",
        line=1,
        valid=False,
        message="world_size=8 but nodes x gpus_per_node = 2 x 8 = 16",
        fix="world_size: 16",
        id="world-mismatch",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={"world_size": 12, "gpus_per_node": 8},
        rule="world-partial-node",
        severity="error",
        path="distributed",
        line=1,
        valid=False,
        message="world_size=12 is not a whole number of 8-GPU nodes",
        fix="world_size: 16",
        id="world-partial-node",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 8\n",
        kwargs={"world_size": 16, "gpus_per_node": 4},
        rule="tp-cross-node",
        severity="warning",
        path="distributed.tp_size",
        line=2,
        valid=True,
        message="2 of 2 tp groups (size 8) cross a node boundary with 4 GPUs per node; e.g. ranks [0, 1, 2, 3, 4, 5, 6, 7] span nodes [0, 1]: TP collectives run every layer and are bound by the inter-node network",
        fix="keep tp_size (now 8) a divisor of gpus_per_node=4",
        id="tp-cross-node",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 4\n  cp_size: 2\n",
        kwargs={"world_size": 16, "gpus_per_node": 4},
        rule="cp-cross-node",
        severity="warning",
        path="distributed.cp_size",
        line=3,
        valid=True,
        message="8 of 8 cp groups (size 2) cross a node boundary with 4 GPUs per node; e.g. ranks [0, 4] span nodes [0, 1]: CP exchanges keys/values every attention layer over the inter-node network",
        fix="keep tp_size * cp_size (now 8) a divisor of gpus_per_node=4",
        id="cp-cross-node",
    ),
    RuleCase(
        text="distributed:\n\ttp_size: 2\n",
        kwargs={},
        rule="yaml-syntax",
        severity="error",
        path="<root>",
        line=2,
        valid=False,
        message="YAML syntax error: found character that cannot start any token",
        fix="indent with spaces: YAML forbids tab characters in indentation",
        id="yaml-syntax",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n  tp_size: 4\n",
        kwargs={},
        rule="yaml-duplicate-key",
        severity="error",
        path="distributed.tp_size",
        line=3,
        valid=False,
        message="key 'tp_size' appears twice (lines 2 and 3); YAML loaders (PyYAML, AutoModel) silently keep the last value and drop the first",
        fix="keep one 'tp_size' entry",
        id="yaml-duplicate-key",
    ),
    RuleCase(
        text="tp_size: 2\n---\ntp_size: 4\n",
        kwargs={},
        rule="yaml-multiple-documents",
        severity="error",
        path="<root>",
        line=3,
        valid=False,
        message="the YAML has more than one document ('---'); AutoModel's yaml.safe_load rejects it ('expected a single document in the stream'); only the first was checked",
        fix="keep one document per recipe file",
        id="yaml-multiple-documents",
    ),
    RuleCase(
        text="model:\n  x: 1\ndistributed:\n",
        kwargs={},
        rule="distributed-invalid",
        severity="error",
        path="distributed",
        line=3,
        valid=False,
        message="distributed: is empty (YAML null), not a mapping; AutoModel cannot read it",
        fix="write `distributed: {}` for the defaults, or give its keys",
        id="distributed-invalid",
    ),
    RuleCase(
        text="model:\n  pretrained_model_name_or_path: x\n",
        kwargs={},
        rule="no-distributed-section",
        severity="info",
        path="<root>",
        line=None,
        valid=True,
        message="the recipe has no distributed: section; AutoModel's defaults apply (strategy fsdp2, dp = world size)",
        fix=None,
        id="no-distributed-section",
    ),
    RuleCase(
        text="distributed:\n  tp_size: ${TP_SIZE}\n",
        kwargs={},
        rule="env-var",
        severity="warning",
        path="distributed.tp_size",
        line=2,
        valid=True,
        message="value comes from environment variable(s) TP_SIZE at launch and was not checked (AutoModel fails at load if they are unset)",
        fix="give a default, e.g. ${VAR,2}, to have it checked",
        id="env-var",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={"model": "meta-llama/Llama-9"},
        rule="model-unknown",
        severity="warning",
        path="<root>",
        line=None,
        valid=True,
        message=f"unknown model 'meta-llama/Llama-9': not a config.json path, not in the Hugging Face cache ({golden.NO_HF_CACHE}), not in the catalog; did you mean meta-llama/Llama-3.2-3B, meta-llama/Llama-3.2-1B, meta-llama/Llama-3.1-8B?; --fetch-config (MCP fetch_config) downloads its config.json alone; model-aware checks skipped",
        fix="run `automodel-dist models` for the catalog, pass a config.json path, or --fetch-config",
        id="model-unknown",
    ),
    RuleCase(
        text="model:\n  pretrained_model_name_or_path: Qwen/Qwen3-8B\ndistributed:\n  tp_size: 2\n",
        kwargs={},
        rule="model-from-recipe",
        severity="info",
        path="model.pretrained_model_name_or_path",
        line=2,
        valid=True,
        message="model-aware checks use Qwen/Qwen3-8B from model.pretrained_model_name_or_path",
        fix=None,
        id="model-from-recipe",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\nci:\n  nodes: 2\n",
        kwargs={},
        rule="world-from-ci",
        severity="info",
        path="ci",
        line=3,
        valid=True,
        message="world_size 16 taken from the recipe's ci: block (nodes=2 x nproc_per_node=8)",
        fix=None,
        id="world-from-ci",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={"world_size": 8, "overrides": ["distributed.tp_size=4"]},
        rule="override-applied",
        severity="info",
        path="distributed.tp_size",
        line=2,
        valid=True,
        message="distributed.tp_size = 4 from the command line (the config has 2)",
        fix=None,
        id="override-applied",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={"world_size": 8, "overrides": ["distributed.tp_size 4"]},
        rule="override-invalid",
        severity="error",
        path="<overrides>",
        line=None,
        valid=False,
        message="override 'distributed.tp_size 4' has no '=' (AutoModel fails splitting it: 'not enough values to unpack')",
        fix="write dotted.key=value, e.g. distributed.tp_size=4",
        id="override-invalid",
    ),
    RuleCase(
        text="distributed:\n  tp_size: 2\n",
        kwargs={"world_size": 0},
        rule="world-size-invalid",
        severity="error",
        path="<root>",
        line=None,
        valid=False,
        message="world_size must be a positive integer <= 16,777,216, got 0",
        fix="pass a positive world_size",
        id="world-size-invalid",
    ),
    RuleCase(
        text="",
        kwargs={},
        rule="yaml-empty",
        severity="error",
        path="<root>",
        line=None,
        valid=False,
        message="the config is empty",
        fix="give a distributed: block",
        id="yaml-empty",
    ),
    RuleCase(
        text="- 1\n- 2\n",
        kwargs={},
        rule="yaml-root-not-mapping",
        severity="error",
        path="<root>",
        line=1,
        valid=False,
        message="the config must be a mapping (a recipe or a distributed: block), got a list",
        fix="give a recipe (with a distributed: section) or a bare distributed: block",
        id="yaml-root-not-mapping",
    ),
    RuleCase(
        text="distributed:\n  [a, b]: 1\n",
        kwargs={},
        rule="yaml-bad-key",
        severity="error",
        path="distributed",
        line=2,
        valid=False,
        message="a mapping key must be a scalar, got list",
        fix="use a plain string key",
        id="yaml-bad-key",
    ),
    RuleCase(
        text="distributed:\n  tp_size: !!python/int 2\n",
        kwargs={"world_size": 2},
        rule="yaml-unsafe-tag",
        severity="error",
        path="distributed.tp_size",
        line=2,
        valid=False,
        message="YAML tag '!!python/int' is not a plain YAML type; AutoModel's yaml.safe_load fails ('could not determine "
        "a constructor for the tag') and nothing here constructs or runs it",
        fix="remove the tag and write the plain value",
        id="yaml-unsafe-tag",
    ),
    RuleCase(
        text="distributed:\n  pp_size: 2\n  pipeline:\n    loss_fn: masked cross entropy\n",
        kwargs={"world_size": 8},
        rule="target-path-invalid",
        severity="error",
        path="distributed.pipeline.loss_fn",
        line=4,
        valid=False,
        message="distributed.pipeline.loss_fn is 'masked cross entropy': AutoModel's loader resolves loss_fn values as "
        "import paths when it loads the recipe, and it is not a dotted import path (ImportError: Cannot resolve "
        "target)",
        fix="write a dotted import path (package.module.function) or path/to/file.py:function",
        id="target-path-invalid",
    ),
    RuleCase(
        text="distributed:\n  mp_policy:\n    param_dtype: bf16\n    param_dtype_override_fn: null\n",
        kwargs={"world_size": 8},
        rule="mp-policy-invalid",
        severity="error",
        path="distributed.mp_policy.param_dtype_override_fn",
        line=4,
        valid=False,
        message="MixedPrecisionPolicy has 'param_dtype_override_fn' only from torch 2.15: with an older torch AutoModel "
        "raises TypeError (unexpected keyword argument) when it reads the config",
        fix="remove it, unless every node runs torch >= 2.15",
        id="mp-policy-torch-later-field",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPredictoin\ndistributed:\n  tp_size: 1\n",
        kwargs={"world_size": 8},
        rule="recipe-unknown",
        severity="error",
        path="recipe",
        line=1,
        valid=False,
        message="recipe: 'TrainFinetuneRecipeForNextTokenPredictoin' is not a recipe class of AutoModel 0.7.0: its CLI "
        "stops with 'Unknown recipe class'",
        fix="recipe: TrainFinetuneRecipeForNextTokenPrediction",
        id="recipe-unknown",
    ),
    RuleCase(
        text="recipe: nemo_automodel.recipes.retrieval.train_bi_encoder.TrainBiEncoderRecipe\ndistributed:\n"
        "  pp_size: 2\n  pipeline: {}\n",
        kwargs={"world_size": 8},
        rule="recipe-pp-unsupported",
        severity="error",
        path="distributed.pp_size",
        line=3,
        valid=False,
        message="pp_size=2 with recipe TrainBiEncoderRecipe (recipe): its setup raises NotImplementedError (no pipeline "
        "parallelism) after the job has started",
        fix="pp_size: 1 (use tp_size or more FSDP2 ranks instead)",
        id="recipe-pp-unsupported",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\ndomain_mixture:\n  weights: {a: 1}\n"
        "distributed:\n  cp_size: 2\n",
        kwargs={"world_size": 8},
        rule="recipe-feature-parallelism",
        severity="error",
        path="domain_mixture",
        line=2,
        valid=False,
        message="domain_mixture with cp_size=2: TrainFinetuneRecipeForNextTokenPrediction raises ValueError in setup "
        "(domain_mixture does not support context parallelism)",
        fix="remove domain_mixture, or cp_size: 1",
        id="recipe-feature-parallelism",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-70B\ndistributed:\n  tp_size: 1\ncheckpoint:\n  model_save_format: pickle\n",
        kwargs={"world_size": 8},
        rule="checkpoint-invalid",
        severity="error",
        path="checkpoint.model_save_format",
        line=7,
        valid=False,
        message="checkpoint.model_save_format='pickle': AutoModel raises AssertionError ('Unsupported model save format', "
        "supported: ['torch_save', 'safetensors']) (raised in setup, after the job has started)",
        fix="model_save_format: safetensors (the default) or torch_save",
        id="checkpoint-invalid",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\ndistributed: {}\ncheckpoint:\n  save_consolidate: final\n",
        kwargs={"world_size": 8},
        rule="checkpoint-invalid",
        severity="error",
        path="checkpoint.save_consolidate",
        line=4,
        valid=False,
        message="unknown key 'save_consolidate' in checkpoint; AutoModel's CheckpointingConfig has no such field "
        "(TypeError: unexpected keyword argument) (raised in setup, after the job has started)",
        fix="remove it; did you mean 'save_consolidated'? (valid: allow_legacy_pickle_restore, best_metric_key, "
        "checkpoint_dir, consolidation_timeout_minutes, cpu_offload, dequantize_base_checkpoint, diffusers_compatible, "
        "enabled, is_async, is_peft, legacy_paramwrapper_layout, max_recent_checkpoints, model_cache_dir, "
        "model_repo_id, model_save_format, model_state_dict_keys, original_model_root_dir, save_consolidated, "
        "single_rank_consolidation, skip_task_head_prefixes_for_base_model, staging_dir, v4_compatible, "
        "wait_for_staging)",
        id="checkpoint-invalid-typo",
    ),
    RuleCase(
        text="recipe: FinetuneRecipeForVLM\ndistributed: {}\nfreeze_config:\n  freeze_embeddings: true\n  freeze_vision_tower: true\n",
        kwargs={"world_size": 8},
        rule="freeze-config-invalid",
        severity="error",
        path="freeze_config.freeze_embeddings",
        line=4,
        valid=False,
        message="freeze_config.freeze_embeddings is not an option of AutoModel 0.7.0's freeze_config: it raises "
        "\"freeze_config has unsupported option(s) ['freeze_embeddings']\" while building the model",
        fix="remove freeze_embeddings: earlier AutoModel versions accepted and ignored it (AutoModel dropped it from its "
        "own recipes with trainability unchanged); to really freeze the token embeddings name the model's embedding "
        "module in a selector, e.g. freeze_modules: [{path: model.embed_tokens}] (a VLM's: "
        "model.language_model.embed_tokens), and in a VLM recipe also say freeze_vision_tower: true outright: a "
        "selector turns the implicit vision freeze off",
        id="freeze-config-invalid",
    ),
    RuleCase(
        text="recipe: FinetuneRecipeForVLM\ndistributed: {}\nfreeze_config:\n  freeze_vision: true\n",
        kwargs={"world_size": 8},
        rule="freeze-config-invalid",
        severity="error",
        path="freeze_config.freeze_vision",
        line=4,
        valid=False,
        message="freeze_config.freeze_vision is not an option of AutoModel 0.7.0's freeze_config: it raises "
        "\"freeze_config has unsupported option(s) ['freeze_vision']\" while building the model",
        fix="rename it: freeze_vision_tower: true",
        id="freeze-config-invalid-typo",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-70B\ndistributed:\n  tp_size: 1\ncheckpoint:\n  model_repo_id: foo/bar\n",
        kwargs={"world_size": 8},
        rule="checkpoint-overwritten",
        severity="warning",
        path="checkpoint.model_repo_id",
        line=7,
        valid=True,
        message="checkpoint.model_repo_id is overwritten by the recipe with model.pretrained_model_name_or_path: the value here is ignored",
        fix="remove checkpoint.model_repo_id (set model.pretrained_model_name_or_path instead)",
        id="checkpoint-overwritten",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-70B\ndistributed:\n  tp_size: 1\ncheckpoint:\n  model_save_format: torch_save\n",
        kwargs={"world_size": 8},
        rule="checkpoint-torch-save-consolidation",
        severity="warning",
        path="checkpoint.model_save_format",
        line=7,
        valid=True,
        message="model_save_format: torch_save with save_consolidated: final (the default is final): AutoModel writes no consolidated Hugging Face checkpoint at all, only DCP shards (one startup warning says so)",
        fix="model_save_format: safetensors, or save_consolidated: false and AutoModel's scripts/export_llm_dcp_to_hf.py after training",
        id="checkpoint-torch-save-consolidation",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-70B\ndistributed:\n  tp_size: 1\ncheckpoint:\n  single_rank_consolidation: true\n",
        kwargs={"world_size": 64},
        rule="checkpoint-inline-consolidation",
        severity="warning",
        path="checkpoint.single_rank_consolidation",
        line=7,
        valid=True,
        message="a consolidated Hugging Face save of meta-llama/Llama-3.1-70B (141 GB in bf16) at the final save: rank 0 writes all while 63 wait in an NCCL broadcast (the world group); at 2 GB/s per rank (reading and writing) that takes about 2.4 min, past dist_env.timeout_minutes (the recipe's default, 1) = 1 min: the waiting ranks time out and the job dies in the save",
        fix="single_rank_consolidation: false (every rank writes its share), or save_consolidated: false, then bash <checkpoint>/model/consolidate.sh after training (NPROC_PER_NODE ranks, off the training job); staging_dir: a local disk keeps a killed save from leaving truncated shards",
        id="checkpoint-inline-consolidation",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-70B\ndistributed:\n  tp_size: 1\ncheckpoint:\n  is_async: true\n",
        kwargs={"world_size": 8, "torch_version": "2.8.0"},
        rule="checkpoint-async-torch",
        severity="warning",
        path="checkpoint.is_async",
        line=7,
        valid=True,
        message="checkpoint.is_async: true on torch 2.8.0: AutoModel disables it (async saves need torch >= 2.9) and every save blocks training",
        fix="is_async: false, or torch >= 2.9",
        id="checkpoint-async-torch",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: Qwen/Qwen3-30B-A3B\nloss_fn:\n  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\ndistributed:\n  pp_size: 2\n  ep_size: 4\n  pipeline: {}\n",
        kwargs={"world_size": 8},
        rule="pp-linear-ce-fallback",
        severity="warning",
        path="loss_fn",
        line=4,
        valid=True,
        message="loss_fn FusedLinearCrossEntropy with pp_size=2: AutoModel's Qwen3MoeForCausalLM keeps its own forward under pipeline parallelism, so AutoModel trains with MaskedCrossEntropy instead (one warning on rank 0): the last stage holds the full-vocabulary logits the fused loss was meant to avoid",
        fix="loss_fn: MaskedCrossEntropy to say what runs (`automodel-dist dryrun` measures the logits it holds)",
        id="pp-linear-ce-fallback",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: tiiuae/Falcon-H1-7B-Instruct\nloss_fn:\n  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\ndistributed: {}\n",
        kwargs={"world_size": 8},
        rule="linear-ce-logits-multiplier",
        severity="warning",
        path="loss_fn",
        line=4,
        valid=True,
        message="loss_fn FusedLinearCrossEntropy with tiiuae/Falcon-H1-7B-Instruct: the loss is computed from the hidden states and lm_head's weight, without the model's logits multiplier (0.0130208), so it is not the model's loss",
        fix="loss_fn: MaskedCrossEntropy",
        id="linear-ce-logits-multiplier",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.2-1B\nloss_fn:\n  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\ndistributed:\n  tp_size: 2\n",
        kwargs={"world_size": 8},
        rule="linear-ce-tp-head",
        severity="error",
        path="loss_fn",
        line=4,
        valid=False,
        message="loss_fn FusedLinearCrossEntropy with tp_size=2: the TP plan splits meta-llama/Llama-3.2-1B's lm_head over a 2-rank mesh, and materialize_lm_weight needs the gradient's reduction group (data parallel x CP, 4 ranks) to be that size: it raises ValueError at the first loss",
        fix="loss_fn: MaskedCrossEntropy (or TEParallelCrossEntropy) with tp_size > 1, or tp_size: 1",
        id="linear-ce-tp-head",
    ),
    RuleCase(
        text="recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.2-1B\nloss_fn:\n  _target_: nemo_automodel.components.loss.chunked_ce.ChunkedCrossEntropy\ndistributed:\n  tp_size: 2\n",
        kwargs={"world_size": 4},
        rule="linear-ce-tp-head",
        severity="error",
        path="loss_fn",
        line=4,
        valid=False,
        message="loss_fn ChunkedCrossEntropy with tp_size=2: the TP plan splits meta-llama/Llama-3.2-1B's lm_head, and the recipe's setup check of the head raises ValueError ('ChunkedCrossEntropy requires a plain bias-free nn.Linear output head') before training",
        fix="loss_fn: MaskedCrossEntropy with tp_size > 1, or tp_size: 1",
        id="linear-ce-tp-head-chunked",
    ),
    RuleCase(
        text="recipe: KnowledgeDistillationRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B\nloss_fn:\n  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\ndistributed:\n  pp_size: 2\n  pipeline: {}\n",
        kwargs={"world_size": 8},
        rule="kd-pp-linear-ce",
        severity="error",
        path="loss_fn",
        line=4,
        valid=False,
        message="knowledge distillation with pp_size=2 and loss_fn FusedLinearCrossEntropy: the KD recipe raises ValueError in setup (PP KD needs a loss on logits and labels)",
        fix="loss_fn: MaskedCrossEntropy",
        id="kd-pp-linear-ce",
    ),
    RuleCase(
        text="recipe: FinetuneRecipeForVLM\nloss_fn:\n  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\n"
        "distributed:\n  pp_size: 2\n  pipeline: {}\n",
        kwargs={"world_size": 8},
        rule="linear-ce-no-logits-to-keep",
        severity="warning",
        path="loss_fn",
        line=2,
        valid=True,
        message="loss_fn FusedLinearCrossEntropy: FinetuneRecipeForVLM asks the pipeline object (AutoPipeline, which has no "
        "forward) for logits_to_keep under pipeline parallelism, so AutoModel trains with MaskedCrossEntropy instead "
        "(one warning on rank 0) and materialises the full-vocabulary logits",
        fix="loss_fn: MaskedCrossEntropy to say what runs (`automodel-dist dryrun` measures the logits it holds)",
        id="linear-ce-no-logits-to-keep",
    ),
    RuleCase(
        text="recipe: TrainVispecStage1Recipe\ndistributed:\n  tp_size: 1\n",
        kwargs={"world_size": 8},
        rule="recipe-distributed-unsupported",
        severity="error",
        path="distributed",
        line=2,
        valid=False,
        message="TrainVispecStage1Recipe with a distributed: section: it raises NotImplementedError in setup (no target-model sharding yet)",
        fix="remove distributed: (one target replica per rank)",
        id="recipe-distributed-unsupported",
    ),
    RuleCase(
        text="recipe: TrainEagle3Recipe\ndistributed: null\n",
        kwargs={"world_size": 8},
        rule="recipe-kind",
        severity="info",
        path="distributed",
        line=2,
        valid=True,
        message="TrainEagle3Recipe reads distributed: only when it is given: with distributed: null every rank holds a whole replica of the target model",
        fix=None,
        id="recipe-kind",
    ),
    RuleCase(
        text="recipe: MineHardNegativesRecipe\ndistributed:\n  tp_size: 2\n",
        kwargs={"world_size": 8},
        rule="recipe-distributed-ignored",
        severity="warning",
        path="distributed",
        line=2,
        valid=True,
        message="MineHardNegativesRecipe never reads distributed: (it only initialises the process group): the block is ignored",
        fix="remove distributed:",
        id="recipe-distributed-ignored",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule_finding(case: RuleCase) -> None:
    report = validate_config(case.text, **case.kwargs)
    found = [f for f in report.findings if f.rule == case.rule]
    assert found, f"{case.rule} not reported; got {[(f.rule, f.message) for f in report.findings]}"
    f = found[0]
    assert (f.severity, f.path, f.line) == (case.severity, case.path, case.line)
    assert f.message == case.message
    assert f.fix == case.fix
    assert report.valid is case.valid


# Rules that need an input the unit table cannot express (internal failures).
UNTESTABLE_HERE = {
    "internal-error",
    "file-unreadable",
    "file-not-allowed",
    "yaml-too-large",
    "yaml-not-utf8",
    "yaml-too-deep",
    "yaml-too-complex",
}


# Rules whose input is the installed environment, tested with it patched below.
ENVIRONMENT = {"automodel-version"}


def test_every_rule_has_a_case():
    covered = {c.rule for c in CASES} | ENVIRONMENT
    runtime = {r.id for r in RULES.values() if r.family == "runtime"}
    missing = set(RULES) - covered - UNTESTABLE_HERE - runtime
    assert not missing, f"rules without a unit case: {sorted(missing)}"


def test_another_installed_automodel_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("automodel_dist.api.installed_automodel", lambda: "0.8.0")
    report = validate_config("distributed:\n  tp_size: 2\n", world_size=8, model="meta-llama/Llama-3.1-8B")
    note = [f for f in report.findings if f.rule == "automodel-version"]
    assert [(f.severity, f.path) for f in note] == [("info", "<root>")] and report.valid
    assert "nemo-automodel 0.8.0 is installed" in note[0].message and "0.7.0" in note[0].message
    monkeypatch.setattr("automodel_dist.api.installed_automodel", lambda: "0.7.0")
    assert "automodel-version" not in {
        f.rule for f in validate_config("distributed:\n  tp_size: 2\n", world_size=8).findings
    }


def test_all_findings_at_once():
    text = """distributed:
  strategy: ddp
  tp_size: 3
  pp_size: 2
  sequence_parallel: true
  dp_replicate_size: 2
  activation_checkpointing: selective
  pipeline:
    pp_schedule: interleaved_1f1b
    pp_microbatch_size: 0
    foo: 1
"""
    report = validate_config(text, world_size=16, model="meta-llama/Llama-3.1-8B")
    rules = [(f.rule, f.line) for f in report.findings if f.severity == "error"]
    assert rules == [
        ("strategy-unsupported", 3),
        ("tp-heads", 3),
        ("strategy-unsupported", 4),
        ("option-unknown", 5),
        ("dp-replicate-strategy", 6),
        ("pp-schedule-unknown", 9),
        ("pp-microbatch-invalid", 10),
        ("pipeline-invalid", 11),
    ]


def test_node_crossing_is_checked_when_only_ep_or_hsdp_fails():
    """tp and cp groups depend on neither ep_size nor dp_replicate_size: when only those fail, the groups that
    cross nodes are still reported (not one fix at a time), exactly as once the error is fixed."""
    text = "distributed:\n  tp_size: 3\n  cp_size: 2\n  pp_size: 2\n  pipeline: {}\n  ep_size: 5\n"
    report = validate_config(text, nodes=3, gpus_per_node=8)
    found = {(f.rule, f.severity, f.line) for f in report.findings}
    assert ("ep-not-divisible", "error", 6) in found
    assert ("tp-cross-node", "warning", 2) in found and ("cp-cross-node", "warning", 3) in found
    fixed = validate_config(text.replace("ep_size: 5", "ep_size: 4"), nodes=3, gpus_per_node=8)
    assert "ep-not-divisible" not in {f.rule for f in fixed.findings} and fixed.resolved.ep_shard == 3
    cross = lambda r: [(f.rule, f.message) for f in r.findings if f.rule.endswith("-cross-node")]  # noqa: E731
    assert cross(report) == cross(fixed) and len(cross(report)) == 2
    hsdp = text.replace("ep_size: 5", "dp_replicate_size: 3")  # dp=2 is not a multiple of 3
    report = validate_config(hsdp, nodes=3, gpus_per_node=8)
    assert "dp-replicate-not-multiple" in {f.rule for f in report.errors}
    fixed = validate_config(hsdp.replace("dp_replicate_size: 3", "dp_replicate_size: 2"), nodes=3, gpus_per_node=8)
    assert "dp-replicate-not-multiple" not in {f.rule for f in fixed.findings}
    assert cross(report) == cross(fixed) and len(cross(report)) == 2
    # ep_shard = dp*cp*tp / ep does not depend on HSDP either: an HSDP error leaves ep-shard-uneven reported
    moe = "distributed:\n  ep_size: 8\n  dp_replicate_size: 5\n"
    found = [f.rule for f in validate_config(moe, nodes=3, gpus_per_node=8, model="Qwen/Qwen3-30B-A3B").errors]
    assert found == ["ep-shard-uneven", "dp-replicate-not-multiple"]
    # a device mesh that does not fit the world size has no groups to check
    bad = validate_config("distributed:\n  tp_size: 5\n  ep_size: 5\n", nodes=3, gpus_per_node=8)
    assert not [f for f in bad.findings if f.rule.endswith("-cross-node")]


def test_bare_block_and_recipe_agree():
    bare = validate_config("tp_size: 3\n", world_size=8)
    recipe = validate_config("distributed:\n  tp_size: 3\n", world_size=8)
    assert [(f.rule, f.message) for f in bare.findings] == [(f.rule, f.message) for f in recipe.findings]
    assert bare.findings[0].path == "tp_size" and recipe.findings[0].path == "distributed.tp_size"
    assert bare.findings[0].line == 1 and recipe.findings[0].line == 2


def test_mapping_input_has_no_lines():
    report = validate_config({"distributed": {"tp_size": 3}}, world_size=8)
    assert report.findings[0].rule == "world-not-divisible" and report.findings[0].line is None


def test_automodel_value_semantics():
    # AutoModel's loader reads "2" as 2 and none as null; so do we.
    report = validate_config('distributed:\n  tp_size: "2"\n  dp_size: none\n', world_size=8)
    assert report.valid and report.resolved.tp == 2 and report.resolved.dp == 4


def test_pipeline_keys_checked_as_warnings_when_pp_is_1():
    report = validate_config("pipeline:\n  pp_schedul: 1f1b\n  pp_microbatch_size: 0\n", world_size=4)
    sev = {f.rule: f.severity for f in report.findings}
    assert report.valid
    assert sev["pipeline-invalid"] == "warning" and sev["pp-microbatch-invalid"] == "warning"


@pytest.mark.parametrize(
    "value,problem",
    [
        ("torch.nn.functional.cross_entropy", None),
        ("my_pkg.losses.masked_ce", None),  # may or may not import on the cluster: not ours to say
        ("recipes/loss.py:masked_ce", None),
        ("not a path", "not a dotted import path"),
        ("torch..nn", "not a dotted import path"),
        ("full", "bare name with no dots"),  # AutoModel: Cannot resolve target (blocked or not found): full
        ("torch", "bare name with no dots"),  # resolves, but to a module, which no recipe can call
        ("", "not a dotted import path"),
        ("${LOSS_FN}", "not a dotted import path"),  # AutoModel does not expand variables in _target_ / *_fn
        ("loss.txt:f", "must be a .py file"),
        ("loss.py:_private", "is private"),
        ("loss.py:a.b", "is not an attribute name"),
    ],
)
def test_import_path_problem(value, problem):
    from automodel_dist.config.values import import_path_problem

    got = import_path_problem(value)
    assert (got is None) if problem is None else (problem in got), got


def test_target_paths_checked_across_the_whole_recipe():
    # AutoModel's ConfigNode resolves every _target_ and *_fn of the recipe when it loads it.
    text = (
        "model:\n  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained\n"
        "dataloader:\n  collate_fn: default collate\nloss_fn:\n  _target_: my/loss.yaml:build\n"
        "distributed:\n  tp_size: 1\n"
    )
    report = validate_config(text, world_size=8)
    bad = [(f.path, f.line) for f in report.findings if f.rule == "target-path-invalid"]
    assert bad == [("dataloader.collate_fn", 4), ("loss_fn._target_", 6)]


@pytest.mark.parametrize(
    "text,path,line",
    [
        ("distributed:\n  multimodal:\n    vision: null\n", "distributed.multimodal.vision", 3),
        (
            "distributed:\n  multimodal:\n    vision:\n      frame_sharding: [cp]\n",
            "distributed.multimodal.vision.frame_sharding",
            4,
        ),
    ],
)
def test_nested_block_that_is_not_a_mapping(text, path, line):
    # AutoModel: "MultimodalDistributedConfig.vision must be a MultimodalVisionConfig instance." (TypeError)
    report = validate_config(text, world_size=8)
    [f] = [f for f in report.findings if f.rule == "multimodal-invalid"]
    assert not report.valid and (f.path, f.line, f.severity) == (path, line, "error")
    assert "must be a mapping" in f.message and "TypeError" in f.message
    assert not [f for f in report.findings if f.rule == "internal-error"]


@pytest.mark.parametrize("value", ["null", "[1]", "true", "2.5"])
def test_recv_slack_must_be_an_integer(value):
    # null/[1] make PipelineConfig's `slack < 0` raise TypeError; true is read as 1, 2.5 breaks the ring size.
    report = validate_config(f"pp_size: 2\npipeline:\n  pp_recv_buffer_pool_slack: {value}\n", world_size=4)
    assert [f.rule for f in report.errors] == ["pipeline-recv-slack"]


@pytest.mark.parametrize(
    "lbs,mbs,pp,fix",
    [
        (
            8,
            4,
            4,
            "local_batch_size: 16 (with pp_microbatch_size=4), or pp_microbatch_size: 2 (with local_batch_size=8)",
        ),
        (
            12,
            4,
            4,
            "local_batch_size: 16 (with pp_microbatch_size=4), or pp_microbatch_size: 3 (with local_batch_size=12)",
        ),
        (2, 2, 4, "local_batch_size: 8 (with pp_microbatch_size=2)"),  # no microbatch size gives 4 from 2 samples
    ],
)
def test_pp_microbatches_fix_only_offers_sizes_that_work(lbs, mbs, pp, fix):
    text = (
        f"step_scheduler:\n  local_batch_size: {lbs}\ndistributed:\n  pp_size: {pp}\n  pipeline:\n"
        f"    pp_microbatch_size: {mbs}\n"
    )
    report = validate_config(text, world_size=8)
    [f] = [f for f in report.findings if f.rule == "pp-microbatches"]
    assert f.fix == fix


def test_keys_the_recipe_overwrites_are_not_type_checked():
    # train_ft sets pp_batch_size, loss_fn and patch_stage_backward_maybe_with_nosync itself before use.
    report = validate_config(
        {"pp_size": 2, "pipeline": {"pp_batch_size": "abc", "loss_fn": 3, "patch_stage_backward_maybe_with_nosync": 5}},
        world_size=8,
    )
    assert report.valid
    assert {f.rule for f in report.findings} == {"pipeline-overwritten"}


def test_never_imports_targets(monkeypatch):
    import builtins

    real_import = builtins.__import__
    seen = []

    def spy(name, *args, **kwargs):
        seen.append(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", spy)
    validate_config(
        "distributed:\n  mp_policy:\n    _target_: os.system\n  offload_policy:\n"
        "    _target_: evil_module_xyz.Boom\n  pipeline:\n    loss_fn: evil_module_xyz.f\n"
    )
    assert "evil_module_xyz" not in seen and "os" not in seen


def test_force_hf_skips_the_automodel_class_checks():
    # model.force_hf: true builds the Hugging Face class, which the implementation table does not describe
    text = "model:\n  pretrained_model_name_or_path: {}\n  force_hf: true\n  backend:\n    attn: sdpa\ndistributed:\n{}"
    for model, block in (("deepseek-ai/DeepSeek-V3", "  tp_size: 2\n"), ("meta-llama/Llama-3.1-8B", "  cp_size: 2\n")):
        report = validate_config(text.format(model, block), world_size=16)
        assert report.valid, [f.message for f in report.findings]
        report = validate_config(text.format(model, block).replace("  force_hf: true\n", ""), world_size=16)
        assert {f.rule for f in report.errors} & {"model-capability", "model-cp-backend"}
    # ...except EP: no Hugging Face class has AutoModel's MoE mixin
    report = validate_config(text.format("Qwen/Qwen3-30B-A3B", "  ep_size: 8\n"), world_size=16)
    assert [f.rule for f in report.errors] == ["model-capability"]
    assert "force_hf" in report.errors[0].message and "Qwen3MoeForCausalLM does not inherit" in report.errors[0].message


def test_a_bitsandbytes_quantization_builds_the_hugging_face_class_as_force_hf_does():
    """AutoModel's own classes do not load bitsandbytes weights (_transformers/model_init.py falls through to the
    Hugging Face class), so a QLoRA recipe is checked against that class: its own class's TP gate does not apply,
    and EP on an MoE model is refused, naming the quantization and its fix."""
    text = (
        "model:\n  pretrained_model_name_or_path: {}\n  backend:\n    attn: sdpa\n"
        "quantization:\n  load_in_4bit: true\npeft:\n  match_all_linear: true\ndistributed:\n{}"
    )
    report = validate_config(text.format("deepseek-ai/DeepSeek-V3", "  tp_size: 2\n"), world_size=16)
    assert "model-capability" not in {f.rule for f in report.errors}, [f.message for f in report.errors]
    report = validate_config(text.format("Qwen/Qwen3-30B-A3B", "  ep_size: 8\n"), world_size=16)
    (ep,) = [f for f in report.errors if f.rule == "model-capability"]
    assert "quantization: (bitsandbytes" in ep.message and "train without quantization:" in ep.fix


@pytest.mark.parametrize(
    "text,release",
    [
        ("2.15.0", (2, 15)),
        ("2.15.0+cu132", (2, 15)),
        ("2.13.0+cpu", (2, 13)),
        ("2.16.0.dev20260101", (2, 16)),
        ("2.14.0a0+git1234", (2, 14)),
        ("2.9", (2, 9)),
        (" v2.11.0 ", (2, 11)),
        ("2.15.0rc1", (2, 15)),
        ("latest", None),
        ("2", None),
        ("", None),
        ("2.15.0 bogus", None),
        (2.15, None),
    ],
)
def test_torch_release(text, release):
    from automodel_dist.environment import fsdp2_unusable, torch_release

    assert torch_release(text) == release
    if release is not None:
        assert fsdp2_unusable(release) is (release >= (2, 15))


def test_torch_version_only_matters_for_fsdp2_on_more_than_one_rank():
    def rules(block: str, world: int | None, version: str) -> set[str]:
        return {f.rule for f in validate_config(block, world_size=world, torch_version=version).findings}

    assert "torch-version" in rules("tp_size: 2\n", 8, "2.15.0")
    assert "torch-version" in rules("ep_size: 2\n", 2, "2.16.1")  # the MoE path patches FSDP too
    assert "torch-version" in rules("{}\n", None, "2.15.0")  # world unknown: more than one rank is the case to fear
    assert "torch-version" not in rules("{}\n", 1, "2.15.0")  # one rank: AutoModel does not shard
    assert "torch-version" not in rules("strategy: ddp\n", 8, "2.15.0")
    assert "torch-version" not in rules("tp_size: 2\n", 8, "2.14.1")
    assert "torch-version" not in rules("tp_size: 2\n", 8, None)


def test_torch_2_15_spares_nemotron_h_own_fsdp2_path_but_not_its_ep_path():
    """Nemotron-H's own FSDP2 parallelizer (ep_size 1) does not install AutoModel's FSDP patch that torch 2.15
    breaks; with ep_size > 1 the class goes through AutoModel's MoE parallelizer, which does
    (``test_nemotron_h_matches_automodel`` confirms both against AutoModel on torch 2.15)."""
    nano = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    assert validate_config({"cp_size": 2}, world_size=8, model=nano, torch_version="2.15.0").valid
    ep = validate_config({"ep_size": 8}, world_size=8, model=nano, torch_version="2.15.0")
    assert [f.rule for f in ep.errors] == ["torch-version"]
    dense = validate_config({}, world_size=8, model="meta-llama/Llama-3.1-8B", torch_version="2.15.0")
    assert [f.rule for f in dense.errors] == ["torch-version"]


@pytest.mark.parametrize(
    "text, rule",
    [
        (
            "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled "
            "system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\nncclSystemError: System call (e.g. "
            "socket, malloc) or external library call failed or device error.",
            "runtime-nccl-system",
        ),
        (
            "node1:123:456 [0] misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x "
            "(size 5967872)",
            "runtime-nccl-system",
        ),
        (
            "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\nLast error:\nDuplicate GPU detected : "
            "rank 1 and rank 0 both on CUDA device 1000",
            "runtime-duplicate-gpu",
        ),
        (
            "RuntimeError: CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported",
            "runtime-invalid-device",
        ),
        (
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. port: "
            "29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use",
            "runtime-port-in-use",
        ),
        (
            "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 1/2 clients joined.",
            "runtime-rendezvous",
        ),
        (
            "torch.distributed.DistNetworkError: The client socket has timed out after 900000ms while trying to connect to "
            "(10.0.0.1, 29500).",
            "runtime-rendezvous",
        ),
    ],
)
def test_launch_and_nccl_failures_are_explained(text, rule):
    from automodel_dist.explain import explain_error

    assert [m.rule for m in explain_error(text).matches] == [rule]


MULTI_RANK_LOG = """\
[rank0]:[E1201 10:00:01 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600032 milliseconds
[rank2]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 2 has a total capacity of 79 GiB
[rank3]: Traceback (most recent call last):
[rank3]:   File "/opt/Automodel/nemo_automodel/components/distributed/pipelining/functional.py", line 880
[rank3]: ValueError: Batch size 4 must be divisible by number of microbatches 3. Check local_batch_size
[rank1]:[E1201 10:00:01 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout
E1201 10:00:05 torch/distributed/elastic/multiprocessing/api.py:869] failed (exitcode: 1) local_rank: 3
"""


def test_a_multi_rank_log_is_explained_root_causes_first_with_lines_and_ranks(capsys):
    """A whole torchrun log: every failure, root causes in the order they appear, then what usually follows another
    rank's failure (the collective timeouts that come first in the log); each with its first line and its ranks."""
    from automodel_dist.cli import main
    from automodel_dist.explain import explain_error

    rep = explain_error(MULTI_RANK_LOG)
    got = [(m.rule, m.line, m.ranks, m.consequence) for m in rep.matches]
    assert got == [
        ("runtime-oom", 2, [2], False),
        ("pp-batch-divisibility", 5, [3], False),
        ("runtime-collective-timeout", 1, [0, 1], True),
    ]
    assert rep.matches[2].matched == "Watchdog caught collective operation timeout"
    one = explain_error("RuntimeError: CUDA error: invalid device ordinal").matches[0]
    assert (one.line, one.ranks, one.consequence) == (1, [], False)
    assert main(["explain", "CUDA out of memory " + "x" * 5000]) == 0  # a long pasted line is text, not a path
    assert main(["explain", MULTI_RANK_LOG]) == 0  # this crashed (OSError: File name too long) before
    out = capsys.readouterr().out
    assert "  matched: CUDA out of memory  (line 2, rank 2)" in out
    assert (
        "[runtime-collective-timeout] Collective timed out  (usually a consequence: find the root cause first)" in out
        and "(line 1, ranks 0, 1)" in out
    )


def test_a_long_log_is_read_from_its_end(tmp_path):
    """The root cause followed by a megabyte of other ranks' output (and preceded by a long training log) is still
    found, in a file too (read from its end)."""
    from automodel_dist.cli import main
    from automodel_dist.explain import MAX_TEXT, explain_error

    noise = "[rank1]:[E1201] ProcessGroupNCCL.cpp:616 step 100 loss 2.345 watchdog heartbeat ok\n"
    root = "[rank3]: ValueError: Batch size 4 must be divisible by number of microbatches 3.\n"
    log = noise * (4 * MAX_TEXT // len(noise)) + root + noise * (1_000_000 // len(noise))
    assert [m.rule for m in explain_error(log).matches] == ["pp-batch-divisibility"]
    path = tmp_path / "job.log"
    path.write_text(log)
    assert main(["explain", str(path), "--json"]) == 0


TORCHRUN_SIGKILL = """\
[2026-12-01 10:00:00,000] torch.distributed.elastic.multiprocessing.api: [WARNING] Sending process 4312 closing signal \
SIGTERM
[2026-12-01 10:00:01,000] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: -9) local_rank: 1 \
(pid: 4313) of binary: /usr/bin/python
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train_ft.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4313)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4313
"""


@pytest.mark.parametrize(
    "text, rules",
    [
        (TORCHRUN_SIGKILL, ["runtime-host-oom", "runtime-child-failed"]),
        ("[E ProcessGroupNCCL.cpp] NCCL WARN Cuda failure 'out of memory'", ["runtime-oom"]),
        ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", ["runtime-oom"]),
        (
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n  traceback : To enable traceback see: "
            "https://pytorch.org/docs/stable/elastic/errors.html",
            ["runtime-child-failed"],
        ),
    ],
)
def test_killed_ranks_and_torchrun_summaries_are_explained(text, rules):
    """A rank killed by SIGKILL (no traceback: host memory, usually) is a root cause; torchrun's ChildFailedError
    summary comes after it, marked as pointing elsewhere; NCCL's and cuBLAS's allocation failures are GPU OOM."""
    from automodel_dist.explain import explain_error

    rep = explain_error(text)
    assert [m.rule for m in rep.matches] == rules
    assert [m.consequence for m in rep.matches] == [r == "runtime-child-failed" for r in rules]


def test_world_size_missing_says_why_when_half_a_cluster_is_given():
    recipe = "distributed:\n  tp_size: 2\nci:\n  nodes: 2\n  nproc_per_node: 8\n"
    assert validate_config(recipe).world_size == 16  # no cluster option: the ci: block
    assert validate_config(recipe, gpus_per_node=4).world_size == 8  # one option completes the ci: block
    [f] = [f for f in validate_config("tp_size: 2\n", gpus_per_node=8).findings if f.rule == "world-size-missing"]
    assert f.message.startswith(
        "world_size not given (gpus_per_node without nodes gives no world size, and the recipe has no ci: block "
        "to complete it): "
    )
    assert f.fix == "pass world_size (or nodes and gpus_per_node)"
    [f] = [f for f in validate_config("tp_size: 2\n", nodes=2).findings if f.rule == "world-size-missing"]
    assert f.message.startswith("world_size not given (nodes without gpus_per_node gives no world size, and the ")
    [f] = [f for f in validate_config("tp_size: 2\n").findings if f.rule == "world-size-missing"]
    assert f.message.startswith("world_size not given: ") and f.fix == "pass world_size (or nodes and gpus_per_node)"


def test_a_diffusion_generation_config_with_null_distributed_is_valid():
    """AutoModel's generate.py configs (inference:, no recipe class) carry distributed: null: one process."""
    text = (
        "model:\n  pretrained_model_name_or_path: Wan-AI/Wan2.2-T2V-A14B-Diffusers\ninference:\n"
        "  num_inference_steps: 40\npipeline:\n  guidance_scale: 4.0\noutput:\n  output_dir: ./out\ndistributed: null\n"
    )
    report = validate_config(text)
    assert report.valid
    assert [(f.rule, f.severity, f.path, f.line, f.message) for f in report.findings] == [
        (
            "recipe-kind",
            "info",
            "distributed",
            9,
            "a diffusion generation config (inference:, no recipe: class): AutoModel's generate.py reads "
            "distributed: only to start a process group; it is null, so it runs one process with no process group",
        )
    ]
    # the same null in a training recipe is the crash AutoModel has
    assert not validate_config("recipe: TrainFinetuneRecipeForNextTokenPrediction\ndistributed: null\n").valid


def test_diffusion_training_is_checked_in_its_fsdp_section():
    text = "recipe: TrainDiffusionRecipe\nflow_matching: {}\ndistributed:\n  tp_size: 2\nfsdp:\n  tp_size: 3\n"
    found = [(f.rule, f.severity, f.path, f.line) for f in validate_config(text, world_size=8).findings]
    assert found == [
        ("world-not-divisible", "error", "fsdp.tp_size", 6),
        ("recipe-distributed-ignored", "warning", "distributed", 3),
    ]
    both = validate_config("recipe: TrainDiffusionRecipe\nfsdp: {}\nddp: {}\n", world_size=8)
    assert [f.rule for f in both.errors] == ["recipe-distributed-ignored"]


@pytest.mark.parametrize(
    "recipe,model,loss,distributed,world",
    [
        # a TP mesh as large as the DP group (the dry run measures it: tests/integration/test_dry_run.py)
        (
            "TrainFinetuneRecipeForNextTokenPrediction",
            "meta-llama/Llama-3.2-1B",
            "linear_ce.FusedLinearCrossEntropy",
            "tp_size: 2",
            4,
        ),
        (
            "TrainFinetuneRecipeForNextTokenPrediction",
            "meta-llama/Llama-3.2-1B",
            "masked_ce.MaskedCrossEntropy",
            "tp_size: 2",
            8,
        ),
        # AutoModel's Qwen3.5 plan keeps the head whole (the corpus's recipe ran in AutoModel's CI)
        ("FinetuneRecipeForVLM", "Qwen/Qwen3.6-27B", "linear_ce.FusedLinearCrossEntropy", "tp_size: 4", 16),
        # a diffusion LM's step calls no linear cross entropy; KD at kd_ratio 1 none on the labels
        ("DiffusionLMSFTRecipe", "meta-llama/Llama-3.2-1B", "linear_ce.FusedLinearCrossEntropy", "tp_size: 2", 8),
        (
            "KnowledgeDistillationRecipeForNextTokenPrediction\nkd_ratio: 1.0\nteacher_model: {pretrained_model_name_or_path: meta-llama/Llama-3.2-1B}",
            "meta-llama/Llama-3.2-1B",
            "linear_ce.FusedLinearCrossEntropy",
            "tp_size: 2",
            8,
        ),
        # the recipe's own TP plan, and strategies whose head mesh is not checked
        (
            "TrainFinetuneRecipeForNextTokenPrediction",
            "meta-llama/Llama-3.2-1B",
            "linear_ce.FusedLinearCrossEntropy",
            "tp_size: 2\n  tp_plan: {}",
            8,
        ),
        (
            "TrainFinetuneRecipeForNextTokenPrediction",
            "meta-llama/Llama-3.2-1B",
            "linear_ce.FusedLinearCrossEntropy",
            "strategy: megatron_fsdp\n  tp_size: 2",
            8,
        ),
    ],
)
def test_a_linear_cross_entropy_that_runs_or_never_meets_a_split_head_is_not_flagged(
    recipe, model, loss, distributed, world
):
    text = (
        f"recipe: {recipe}\nmodel:\n  pretrained_model_name_or_path: {model}\n"
        f"loss_fn:\n  _target_: nemo_automodel.components.loss.{loss}\ndistributed:\n  {distributed}\n"
    )
    assert not [f for f in validate_config(text, world_size=world).findings if f.rule == "linear-ce-tp-head"]


def test_a_linear_cross_entropy_under_pp_is_flagged_on_the_last_stages_group():
    """Under PP the last stage's loss (MTPLossConfig) prepares the head the same way, with the DP x CP group: TP 2 x
    PP 2 on 4 ranks leaves a one-rank group (the dry run: rank 2 raises, tests/integration/test_dry_run.py)."""
    text = (
        "recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  pretrained_model_name_or_path: "
        "meta-llama/Llama-3.2-1B\nloss_fn:\n  _target_: nemo_automodel.components.loss.linear_ce."
        "FusedLinearCrossEntropy\ndistributed:\n  tp_size: 2\n  pp_size: 2\n  pipeline: {}\n"
    )
    (f,) = [f for f in validate_config(text, world_size=4).findings if f.rule == "linear-ce-tp-head"]
    assert "(data parallel x CP, 1 ranks)" in f.message and "the last pipeline stage's first loss" in f.message


def test_the_loss_fallback_condition_covers_every_loss_automodel_replaces():
    """train_ft._maybe_downgrade_loss_fn: without logits_to_keep any loss but MaskedCrossEntropy is replaced
    (TEParallelCrossEntropy too); under PP a linear cross entropy (FusedLinearCrossEntropy and its Gemma-4 TP
    subclass) where the last stage returns no hidden states, which a class's own forward may declare it does
    (MiMo-V2-Flash) even with patch_causal_lm_model false; ChunkedCrossEntropy raises instead."""
    from automodel_dist.rules.fallbacks import KEEPS_OWN_PIPELINE_FORWARD, NO_LOGITS_TO_KEEP, masked_ce_instead
    from automodel_dist.workload import GEMMA4_TP_LINEAR_CE

    ft = "TrainFinetuneRecipeForNextTokenPrediction"
    no_keep = sorted(NO_LOGITS_TO_KEEP)[0]
    own = sorted(KEEPS_OWN_PIPELINE_FORWARD)[0]
    unpatched = {"patch_causal_lm_model": False}
    assert masked_ce_instead("TEParallelCrossEntropy", ft, no_keep, False, 1, None)
    assert masked_ce_instead("MaskedCrossEntropy", ft, no_keep, False, 1, None) is None
    assert masked_ce_instead("ChunkedCrossEntropy", ft, no_keep, False, 1, None) is None  # (it raises: an error)
    assert masked_ce_instead(GEMMA4_TP_LINEAR_CE, ft, own, False, 2, None)
    assert masked_ce_instead("TEParallelCrossEntropy", ft, own, False, 2, None) is None  # not a linear CE
    assert masked_ce_instead("FusedLinearCrossEntropy", ft, "MiMoV2FlashForCausalLM", False, 2, unpatched) is None
    assert masked_ce_instead("FusedLinearCrossEntropy", ft, "MiMoV2FlashForCausalLM", True, 2, unpatched)
    assert masked_ce_instead("FusedLinearCrossEntropy", ft, "LlamaForCausalLM", False, 2, unpatched)
    assert masked_ce_instead("FusedLinearCrossEntropy", ft, "LlamaForCausalLM", False, 2, None) is None
    vlm = "FinetuneRecipeForVLM"  # under PP it asks the AutoPipeline object, which has no forward
    assert masked_ce_instead("FusedLinearCrossEntropy", vlm, "Qwen3VLForConditionalGeneration", False, 2, None)
    assert masked_ce_instead("FusedLinearCrossEntropy", vlm, "Qwen3VLForConditionalGeneration", False, 1, None) is None


MEGATRON_LINEAR = (
    "distributed:\n  strategy: megatron_fsdp\n{z}loss_fn:\n"
    "  _target_: nemo_automodel.components.loss.linear_ce.FusedLinearCrossEntropy\n"
)


@pytest.mark.parametrize(
    "recipe,zero,fires,gathered",
    [
        ("", "", True, True),
        ("", "  zero_dp_strategy: 2\n", True, False),  # nothing sharded, nothing gathered: the sync alone
        ("recipe: FinetuneRecipeForVLM\n", "", True, True),
        # a distillation step feeds the student's full logits to its loss, a diffusion LM's step a loss of its own
        ("recipe: KnowledgeDistillationRecipeForNextTokenPrediction\n", "", False, False),
        ("recipe: DiffusionLMSFTRecipe\n", "", False, False),
    ],
)
def test_megatron_fsdp_linear_ce_where_the_step_never_uses_lm_heads_output(recipe, zero, fires, gathered):
    report = validate_config(recipe + MEGATRON_LINEAR.format(z=zero), world_size=8, model="meta-llama/Llama-3.2-1B")
    found = [f for f in report.findings if f.rule == "megatron-fsdp-linear-ce"]
    assert bool(found) == fires
    assert any("stays gathered" in f.message for f in found) == gathered
    # one rank of data parallelism: AutoModel does not wrap, no hook
    one = validate_config(recipe + MEGATRON_LINEAR.format(z=zero) + "", world_size=1, model="meta-llama/Llama-3.2-1B")
    assert not any(f.rule == "megatron-fsdp-linear-ce" for f in one.findings)
