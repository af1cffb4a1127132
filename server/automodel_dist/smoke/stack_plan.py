"""What a smoke run on AutoModel's own stack builds, decided without torch: the recipe's architecture at tiny dims
that keep the layout's divisibility rules, the ``distributed:`` block AutoModel reads for the run and for its
single-process reference, and the recipe's PEFT, loss, optimizer and kernels with what a CPU runs instead (each
substitution stated)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..catalog.implementations import builds_own_class
from ..catalog.models import EXPERT_COUNT_KEYS, SHARED_EXPERT_COUNT_KEYS, period_of
from ..dims import ParallelDims
from ..stack.recipe import StackRecipe, backend_for, jsonable, loss_for, optimizer_for, sanitized_block
from ..workload import Workload

HEAD_DIM = 16
VOCAB = 256
_NOT_CAUSAL_LM = ("vision_config", "audio_config", "speech_config")
FLEX_ONLY = frozenset({"GptOssForCausalLM"})  # AutoModel asserts te or flex attention for these classes


class StackUnavailable(ValueError):
    """The recipe's model cannot run on AutoModel's stack here (the reason is the message)."""


def tiny_hf_config(cfg: Mapping[str, Any], *, tp: int, ep: int, stages: int, seq_len: int) -> dict[str, Any]:
    """``cfg`` (a config.json of a causal LM) shrunk to a few thousand parameters per layer, keeping its
    architecture, attention kind (GQA ratio, MLA, sliding window, linear attention), MoE routing and layer pattern.
    Heads and KV heads divide by ``tp``, experts by ``ep``, layers by the pipeline ``stages``, and a pattern of layer
    kinds keeps at least one full period."""
    if any(k in cfg for k in _NOT_CAUSAL_LM):
        raise StackUnavailable(
            "a multimodal config (vision/audio towers): the smoke run on AutoModel's stack sizes causal LMs only"
        )
    out = dict(cfg)
    tp, ep, stages = max(tp, 1), max(ep, 1), max(stages, 1)
    heads0 = int(cfg.get("num_attention_heads") or 4)
    kv0 = int(cfg.get("num_key_value_heads") or heads0)
    ratio = 2 if heads0 > kv0 else 1
    kv = max(tp, 2)
    heads = kv * ratio
    hidden = max(heads * HEAD_DIM, 64)
    out.update(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        vocab_size=math.lcm(VOCAB, tp),
    )
    if "head_dim" in cfg and "kv_lora_rank" not in cfg:
        out["head_dim"] = HEAD_DIM
    if "query_pre_attn_scalar" in cfg:
        out["query_pre_attn_scalar"] = HEAD_DIM
    if int(cfg.get("max_position_embeddings") or 0) > 512:
        out["max_position_embeddings"] = 512
    if isinstance(cfg.get("sliding_window"), int):
        out["sliding_window"] = min(int(cfg["sliding_window"]), max(8, seq_len // 2))
    if "kv_lora_rank" in cfg:  # MLA
        out.update(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=HEAD_DIM, v_head_dim=HEAD_DIM)
        if cfg.get("q_lora_rank") is not None:
            out["q_lora_rank"] = 32
        if "qk_head_dim" in cfg:
            out["qk_head_dim"] = 8 + HEAD_DIM
        if "head_dim" in cfg:
            out["head_dim"] = 8
    for key in ("linear_num_key_heads", "linear_num_value_heads"):  # linear attention (Qwen3-Next)
        if key in cfg:
            out[key] = kv if key == "linear_num_key_heads" else heads
    for key in ("linear_key_head_dim", "linear_value_head_dim"):
        if key in cfg:
            out[key] = HEAD_DIM
    expert_key = next((k for k in EXPERT_COUNT_KEYS if cfg.get(k)), None)
    prefix = 0
    if expert_key is not None:
        experts = max(4, 2 * ep)
        out[expert_key] = experts
        out["num_experts_per_tok"] = min(int(cfg.get("num_experts_per_tok") or 2), 2)
        for key in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            if key in cfg:
                out[key] = hidden // 2
        for key in SHARED_EXPERT_COUNT_KEYS:
            if cfg.get(key):
                out[key] = 1
        if "n_group" in cfg:
            out.update(n_group=1, topk_group=1)
        if cfg.get("first_k_dense_replace"):
            out["first_k_dense_replace"] = prefix = 1
        if "mlp_only_layers" in cfg:
            out["mlp_only_layers"] = []
        if "decoder_sparse_step" in cfg:
            out["decoder_sparse_step"] = 1
    if cfg.get("num_nextn_predict_layers"):
        out["num_nextn_predict_layers"] = 0
    pattern = next((cfg[k] for k in ("layer_types", "layers_block_type") if isinstance(cfg.get(k), list)), None)
    period = (period_of(list(pattern)) or 1) if pattern else int(cfg.get("full_attention_interval") or 1)
    want = max(2, prefix + period)
    per_stage = max(1, math.ceil(want / stages))
    layers = per_stage * stages
    out["num_hidden_layers"] = layers
    for key in ("layer_types", "layers_block_type"):
        if isinstance(cfg.get(key), list):
            out[key] = [cfg[key][i % len(cfg[key])] for i in range(layers)]
    if isinstance(cfg.get("hybrid_override_pattern"), str):
        out["hybrid_override_pattern"] = (cfg["hybrid_override_pattern"] * layers)[:layers]
    if "pad_token_id" not in cfg:  # a class's default pad id (Phi-3: 32000) would fall outside the tiny vocabulary
        out["pad_token_id"] = None
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):  # token ids inside the tiny vocabulary
        value = cfg.get(key)
        if isinstance(value, int) and value >= out["vocab_size"]:
            out[key] = out["vocab_size"] - 1
        elif isinstance(value, list):
            out[key] = [v if not isinstance(v, int) or v < out["vocab_size"] else out["vocab_size"] - 1 for v in value]
    for key in ("torch_dtype", "dtype"):
        if key in out:
            out[key] = "float32"
    out.pop("quantization_config", None)
    return out


@dataclass
class StackPlan:
    """spec.automodel (what the worker hands AutoModel) and what the report states about it."""

    automodel: dict[str, Any]
    substitutions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _mp(precision: str) -> dict[str, Any]:
    if precision == "bf16":  # FSDP2's policy as AutoModel's default: bf16 compute, fp32 master weights and reduction
        return {"param_dtype": "bfloat16", "reduce_dtype": "float32", "output_dtype": None}
    return {"param_dtype": "float32", "reduce_dtype": "float32", "output_dtype": "float32"}


def plan_stack(
    *,
    block: Mapping[str, Any],
    dims: ParallelDims,
    workload: Workload,
    architecture: str,
    is_moe: bool,
    hf_config: Mapping[str, Any],
    stages: int,
    seq_len: int,
    per_dp: int,
    micro_batch_size: int,
    precision: str,
) -> StackPlan:
    """Raises :class:`StackUnavailable` with the reason where AutoModel's stack cannot run this here."""
    subs: list[str] = []
    notes: list[str] = []
    custom = builds_own_class(architecture, workload.force_hf)
    if workload.quantization is not None:
        raise StackUnavailable("quantization: (QLoRA) needs bitsandbytes' CUDA kernels")
    if dims.strategy == "megatron_fsdp":
        raise StackUnavailable("MegatronFSDP needs the megatron-fsdp package and CUDA")
    cfg = tiny_hf_config(hf_config, tp=dims.tp, ep=dims.ep, stages=stages, seq_len=seq_len)
    # AutoModel's own classes that cannot run here take the same architecture through its Hugging Face fallback
    # (force_hf: its setup, parallelizer, CP sharder, loss and step alike), where that class can hold the layout
    needs = None
    if custom and dims.cp > 1:
        needs = "takes only Transformer Engine attention under context parallelism (CUDA)"
    elif custom and architecture in FLEX_ONLY:
        needs = "runs only Transformer Engine attention or FlexAttention (AutoModel asserts it; TE needs CUDA and "
        needs += "FlexAttention has no backward on a CPU)"
    if needs is not None:
        if dims.ep > 1:
            raise StackUnavailable(
                f"AutoModel's own class for {architecture} {needs}, and its Hugging Face fallback cannot hold this "
                "layout (expert parallelism exists only in AutoModel's own MoE classes)"
            )
        workload = replace(workload, force_hf=True, backend={})  # model.backend configures the own class only
        custom = False
        notes.append(
            f"AutoModel's own class for {architecture} {needs}, so this run built the architecture through "
            "AutoModel's Hugging Face fallback (model.force_hf: true; its setup, parallelizer, CP sharder, loss and "
            "step are the same); the own class's attention did not run"
        )
        subs.append(f"{architecture}: AutoModel's Hugging Face fallback class instead of its own ({needs})")
    backend = backend_for(workload, is_moe, custom, subs, values=True, architecture=architecture)
    if dims.cp > 1:
        subs.append(
            "context parallelism on a CPU: attention runs as SDPA's math kernel on the sequence-sharded tensors "
            "(exact attention; DTensor gathers K and V) with contiguous chunks, not torch's ring over the CUDA "
            "flash kernel with head-tail load balancing; AutoModel's sharding of inputs, labels and positions is its "
            "own"
        )
    loss = loss_for(workload, subs, values=True)
    optimizer = optimizer_for(workload, subs)
    distributed = jsonable(sanitized_block(dict(block), subs, StackUnavailable))
    if dims.strategy == "fsdp2":  # DDP trains in the model's dtype (torch_dtype float32 here); it has no policy
        distributed["mp_policy"] = _mp(precision)
    if dims.ep > 1 or isinstance(distributed.get("moe"), dict):
        distributed["moe"] = {**(distributed.get("moe") or {}), "mp_policy": _mp(precision)}
    pipeline = distributed.get("pipeline")
    if isinstance(pipeline, dict):
        pipeline = {
            k: v
            for k, v in pipeline.items()
            if k not in ("layers_per_stage", "module_fqns_per_model_part", "round_virtual_stages_to_pp_multiple")
        }
        if dims.pp > 1:
            pipeline["pp_microbatch_size"] = micro_batch_size
        distributed["pipeline"] = pipeline
    notes.append(
        f"AutoModel's stack: {architecture} at tiny dims ({cfg['num_hidden_layers']} layers, hidden "
        f"{cfg['hidden_size']}, {cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV heads"
        + (f", {next(cfg[k] for k in EXPERT_COUNT_KEYS if cfg.get(k))} experts" if is_moe else "")
        + f", vocab {cfg['vocab_size']}); the reference is the same class on one process"
    )
    subs.append(
        "torch.compile'd code (AutoModel compiles some of its kernels) runs eagerly on the CPU, in the run and the "
        "reference alike"
    )
    subs.append("Liger Kernel is not applied (Triton on CUDA): the Hugging Face modules compute in torch")
    automodel = {
        "hf_config": cfg,
        "architecture": architecture,
        "distributed": distributed,
        "reference_distributed": {"strategy": "fsdp2", "mp_policy": _mp(precision)},
        "recipe": StackRecipe(
            loss=loss,
            optimizer={"target": optimizer["target"], "kwargs": optimizer["kwargs"]},
            peft=workload.peft,
            backend=backend or None,
            torch_dtype="float32",
            force_hf=workload.force_hf,
            liger=False,
            clip_grad_norm=workload.clip_grad_norm,
        ).model_dump(mode="json"),
        "micro_batch_size": micro_batch_size,
        "local_batch_size": per_dp,
    }
    return StackPlan(automodel=automodel, substitutions=subs, notes=notes)


__all__ = ["tiny_hf_config", "plan_stack", "StackPlan", "StackUnavailable"]
