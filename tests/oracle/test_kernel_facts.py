"""The AutoModel facts the pure estimate copies (it imports no AutoModel) held to AutoModel 0.7.0's own code: the
expert-bias chunk threshold, the classes that weight their experts' outputs after the down projection, the token
dispatchers the dry run stands in for, Liger's default, the eager attention terms, Gemma-4's router, and what
Muse-Glimmer's fp32 norms and output gate keep."""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from automodel_dist.catalog.kernels import LOCAL_DISPATCHERS
from automodel_dist.estimate.memory import _ROUTER_AFTER_DOWN, EXPERT_BIAS_CHUNK_ROWS

pytest.importorskip("nemo_automodel")


def test_the_expert_bias_chunk_threshold_is_automodels():
    from nemo_automodel.components.moe import experts

    assert experts._BIAS_CHUNK_THRESHOLD == EXPERT_BIAS_CHUNK_ROWS


def test_the_classes_weighting_after_the_down_projection_say_so_in_their_moe_config():
    from nemo_automodel._transformers.registry import MODEL_ARCH_MAPPING

    for arch in _ROUTER_AFTER_DOWN:
        module, _ = MODEL_ARCH_MAPPING[arch]
        package = Path(inspect.getfile(importlib.import_module(module))).parent  # a VLM wrapper's text model too
        source = "".join(f.read_text(encoding="utf-8") for f in sorted(package.glob("*.py")))
        assert re.search(r"apply_router_weight_after_down\s*=\s*True", source), arch


def test_the_dispatchers_the_dry_run_keeps_local_are_backend_choices():
    from nemo_automodel.components.models.common.utils import BackendConfig

    choices = set(typing.get_args(typing.get_type_hints(BackendConfig)["dispatcher"]))
    assert LOCAL_DISPATCHERS < choices and "torch" in choices


def _eager_attention_peak(dtype, sinks: bool, kind: str = "mimo") -> tuple[float, float]:
    """(saved, peak) bytes a score of an eager attention, forward and backward on fake tensors under torch's MemTracker:
    AutoModel's MiMo-V2-Flash function (``mimo``, with or without its sinks) or transformers' own
    (``transformers``: Llama's eager_attention_forward, the one its classes share); 64 query heads over 8 KV heads,
    q/k head dim 192, v 128, as MiMo's sliding layers."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    if kind == "mimo":
        from nemo_automodel.components.models.mimo_v2_flash.model import _eager_attention_forward
    else:
        from transformers.models.llama.modeling_llama import eager_attention_forward as _eager_attention_forward
    from torch.distributed._tools.mem_tracker import MemTracker

    heads, kv, seq = 64, 8, 4096

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.num_key_value_groups = heads // kv
            self.register_buffer("attention_sink_bias", torch.zeros(heads) if sinks else None)

    with FakeTensorMode():
        module = Attention()
        q = torch.randn(1, heads, seq, 192, dtype=dtype, requires_grad=True)
        k = torch.randn(1, kv, seq, 192, dtype=dtype, requires_grad=True)
        v = torch.randn(1, kv, seq, 128, dtype=dtype, requires_grad=True)
        mask = torch.zeros(1, 1, seq, seq, dtype=dtype)
        tracker = MemTracker()
        tracker.track_external(module)
        with tracker:
            out, _ = _eager_attention_forward(module, q, k, v, mask, scaling=192**-0.5)
            out.sum().backward()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    scores = heads * seq * seq
    saved = [n for ref, n in peak.items() if str(ref).endswith("ACT")][0]
    return saved / scores, peak["Total"] / scores


def test_kimi_linears_eager_mla_backward_transient_is_the_estimates():
    """Kimi-Linear's MLA layer without CP (AutoModel's KimiMLAAttention: its own matmul, additive causal mask and fp32
    softmax) forward and backward at bf16 on fake tensors under torch's MemTracker, 64 heads over 4,096 tokens: its
    peak a score is the estimate's kept fp32 softmax and bf16 copy plus eager_backward_bytes, within 0.75 bytes (the
    rest: q, k, v and the projections, per token)."""
    from dataclasses import replace

    import torch
    from nemo_automodel.components.models.kimi_linear.config import KimiLinear48BConfig
    from nemo_automodel.components.models.kimi_linear.model import KimiMLAAttention, _make_causal_mask
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from automodel_dist.catalog.models import lookup
    from automodel_dist.estimate.memory import ParallelDims, Training, eager_backward_bytes

    heads, seq = 64, 4096
    cfg = KimiLinear48BConfig(
        hidden_size=256, num_attention_heads=heads, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, mla_use_nope=True, q_lora_rank=None,
    )  # fmt: skip
    with FakeTensorMode():
        attn = KimiMLAAttention(cfg, 3)
        x = torch.randn(1, seq, 256, dtype=torch.bfloat16, requires_grad=True)
        mask = _make_causal_mask(x, None, dtype=torch.bfloat16)
        tracker = MemTracker()
        tracker.track_external(attn)
        with tracker:
            attn(x, attention_mask=mask).float().sum().backward()
    (peak,) = tracker.get_tracker_snapshot("peak").values()
    peak_per_score = peak["Total"] / (heads * seq * seq)
    m = replace(lookup("moonshotai/Kimi-Linear-48B-A3B-Instruct"), num_attention_heads=heads)
    tr = Training(seq_len=seq, attn_backend="sdpa")
    per_score = eager_backward_bytes(m, ParallelDims(world_size=1), tr, 2) / (heads * seq)
    assert per_score > 0 and peak_per_score - 0.75 < 6 + per_score <= peak_per_score


@pytest.mark.parametrize("dtype_name, comp_bytes", [("bfloat16", 2), ("float32", 4)])
@pytest.mark.parametrize("sinks, kind", [(True, "mimo"), (False, "mimo"), (False, "transformers")])
def test_eager_attentions_backward_transient_is_the_estimates(dtype_name, comp_bytes, sinks, kind):
    """The estimate's eager-attention terms against AutoModel's own eager attention: what it saves a score (the fp32
    softmax, and its copy in a 16-bit compute dtype) and what its backward adds on top (eager_backward_bytes), within
    0.75 bytes a score: the rest are q, k and v expanded to every head (640 elements a query against 4,096 keys)
    and the mask."""
    from dataclasses import replace

    import torch

    from automodel_dist.catalog.models import lookup
    from automodel_dist.estimate.memory import ParallelDims, Training, eager_backward_bytes

    saved, peak = _eager_attention_peak(getattr(torch, dtype_name), sinks, kind)
    kept = 4 + (comp_bytes if comp_bytes != 4 else 0)
    assert kept <= saved < kept + 0.75
    m = lookup("XiaomiMiMo/MiMo-V2-Flash" if kind == "mimo" else "meta-llama/Llama-3.1-8B")
    m = replace(m, num_attention_heads=64)  # the probe's heads (the term is per head)
    tr = Training(seq_len=4096, attn_backend="sdpa", attn_implementation="eager", hf_class=kind != "mimo")
    per_score = eager_backward_bytes(m, ParallelDims(world_size=1), tr, comp_bytes) / (64 * 4096)
    assert peak - 0.75 < kept + per_score <= peak


def test_mimo_runs_its_own_eager_attention_off_te():
    """MiMo-V2-Flash's attention (the class the catalog names in EAGER_UNLESS_TE) calls its eager function on every
    backend but te, and SDPA nowhere: its sinks have no SDPA path."""
    from nemo_automodel.components.models.mimo_v2_flash import model

    from automodel_dist.catalog.kernels import EAGER_UNLESS_TE, runs_eager_attention

    assert EAGER_UNLESS_TE == {model.MiMoV2FlashForCausalLM.__name__}
    forward = inspect.getsource(model.MiMoV2FlashAttention.forward)
    assert 'if self.backend.attn == "te":' in forward and "_eager_attention_forward(" in forward
    assert "scaled_dot_product_attention" not in inspect.getsource(model)
    for attn, eager in (("sdpa", True), ("flex", True), ("te", False), (None, False)):
        got = runs_eager_attention(
            None, hf_class=False, architecture="MiMoV2FlashForCausalLM", cp=1, packed=False, backend_attn=attn
        )
        assert got is eager


def test_a_dense_gemma4_checkpoint_runs_transformers_layers_which_automodel_checkpoints_whole():
    """TRANSFORMERS_DECODER_LAYERS: AutoModel's Gemma-4 class keeps transformers' language model for a dense checkpoint,
    whose decoder layers are transformers' GradientCheckpointingLayer, and AutoModel's parallelizer checkpoints such
    layers whole (what the estimate's "layer" style counts); its MoE backend has layers of its own."""
    import torch
    import transformers
    from nemo_automodel.components.distributed import parallelizer
    from transformers.modeling_layers import GradientCheckpointingLayer

    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.catalog.kernels import EAGER_DISPATCH_CUSTOM, FP32_NORM_CLASSES, TRANSFORMERS_DECODER_LAYERS
    from automodel_dist.catalog.models import lookup
    from automodel_dist.dry_run.depth import truncated_config

    assert TRANSFORMERS_DECODER_LAYERS <= EAGER_DISPATCH_CUSTOM
    source = inspect.getsource(parallelizer._should_use_hf_native_gradient_checkpointing)
    assert 'startswith("transformers.")' in source and "_HFGradLayer" in source
    from nemo_automodel.components.models.gemma4_moe.model import Gemma4ForConditionalGeneration

    cfg = truncated_config(hf_config(lookup("google/gemma-4-31B-it")), 2)
    cfg.pop("model_type")
    config = transformers.Gemma4Config(**cfg)
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(config)
    layer = model.model.language_model.layers[0]
    assert isinstance(layer, GradientCheckpointingLayer) and type(layer).__module__.startswith("transformers.")
    assert "Gemma4ForConditionalGeneration" in TRANSFORMERS_DECODER_LAYERS
    # ... and its norms are transformers' Gemma4RMSNorm, which normalises and scales in fp32 (FP32_NORM_CLASSES)
    from transformers.models.gemma4 import modeling_gemma4

    assert type(layer.input_layernorm) is modeling_gemma4.Gemma4RMSNorm
    assert "self._norm(hidden_states.float())" in inspect.getsource(modeling_gemma4.Gemma4RMSNorm.forward)
    assert "Gemma4ForConditionalGeneration" in FP32_NORM_CLASSES


def test_gemma4s_router_keeps_three_fp32_hidden_states():
    """The estimate's Gemma-4 MoE router term (scaled_router_bytes: beside the 4 bytes a logit every MoE router
    keeps) against AutoModel's own Gemma4Gate, its saved tensors counted on fake tensors: three fp32 hidden states
    where it trains, one where it is frozen (LoRA)."""
    import torch
    import transformers
    from nemo_automodel.components.models.gemma4_moe.model import Gemma4Gate
    from torch._subclasses.fake_tensor import FakeTensorMode

    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.catalog.models import lookup
    from automodel_dist.estimate.memory import Training, scaled_router_bytes
    from automodel_dist.estimate.peft import lora_of

    m = lookup("google/gemma-4-26B-A4B-it")
    assert m.router_scale
    text = transformers.Gemma4TextConfig(**{k: v for k, v in hf_config(m)["text_config"].items() if k != "model_type"})
    tokens = 1024
    for trained in (True, False):
        gate = Gemma4Gate(text).to(torch.bfloat16).requires_grad_(trained)
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor, saved: dict[int, int] = saved) -> torch.Tensor:
            if t.dim() and t.shape[0] == tokens:  # the activations, not the parameters or their fp32 copies
                saved[id(t.untyped_storage())] = t.numel() * t.element_size()
            return t

        with FakeTensorMode(allow_non_fake_inputs=True):
            x = torch.randn(tokens, m.hidden_size, dtype=torch.bfloat16, requires_grad=True)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                gate(x)
        per_token = sum(saved.values()) / tokens
        tr = Training(lora=None if trained else lora_of(m, {"target_modules": ["*_proj"]}))
        ours = scaled_router_bytes(m, tr, 2) + 4 * m.num_experts
        # the top-k's indices and weights and the norms' statistics are the rest (at most 112 bytes a token)
        assert ours <= per_token <= ours + 128, (trained, per_token, ours)
    assert scaled_router_bytes(m, Training(), 2) == 12 * m.hidden_size


def test_gemma4_moe_lora_module_names_are_automodels():
    """The Linear modules the estimate's PEFT matching names for a Gemma-4 MoE layer (its dense MLP as the layer's
    mlp, the routed experts as the moe block's) are the ones AutoModel's own class has: a target pattern adapts the
    same modules in both."""
    import torch
    import transformers
    from nemo_automodel.components.models.gemma4_moe.model import Gemma4ForConditionalGeneration

    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.catalog.models import lookup
    from automodel_dist.dry_run.depth import truncated_config
    from automodel_dist.estimate.peft import layer_modules

    spec = lookup("google/gemma-4-26B-A4B-it")
    cfg = truncated_config(hf_config(spec), 6)
    cfg.pop("model_type")
    with torch.device("meta"):
        model = Gemma4ForConditionalGeneration(transformers.Gemma4Config(**cfg))
    layer = next(iter(model.model.language_model.layers.values()))  # a ModuleDict in AutoModel's MoE backend
    theirs = {n for n, mod in layer.named_modules() if isinstance(mod, torch.nn.Linear)}
    ours = {lin.name.split("layers.{i}.", 1)[1] for lin in layer_modules(spec, "moe")}
    experts = {n for n, mod in layer.named_modules() if n.endswith("experts")}
    assert {n for n in ours if not n.endswith("experts")} == theirs - {"moe.gate.proj"}  # the router: never adapted
    assert {n for n in ours if n.endswith("experts")} == experts == {"moe.experts"}


def _gemma4_saved(per_layer_input: int, frozen_ple: bool) -> dict[str, int]:
    """The bytes a small bf16 Gemma-4 text model keeps for backward, 64 tokens, by where they are first saved
    ("before" its first layer, "layer0", ...; saved-tensor hooks, each storage once, the parameters left out), with
    per-layer inputs ``per_layer_input`` wide (0: none) and their model-level and per-layer weights frozen or
    trained."""
    import torch
    import transformers

    tokens = 64
    config = transformers.Gemma4TextConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=64,
        global_head_dim=128,
        hidden_size_per_layer_input=per_layer_input,
        vocab_size=1000,
        vocab_size_per_layer_input=1000,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        sliding_window=16,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = transformers.Gemma4ForCausalLM(config).to(torch.bfloat16).train()
    if frozen_ple:
        for name, p in model.named_parameters():
            if "per_layer" in name:
                p.requires_grad_(False)
    where = ["before"]

    def enter(name: str):
        def hook(module: torch.nn.Module, args: tuple) -> None:
            where.append(name)

        return hook

    def leave(module: torch.nn.Module, args: tuple, out: object) -> None:
        where.pop()

    for i, layer in enumerate(model.model.layers):
        layer.register_forward_pre_hook(enter(f"layer{i}"))
        layer.register_forward_hook(leave)
    model.model.norm.register_forward_pre_hook(enter("after"))
    params = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: set[int] = set()
    per: dict[str, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in seen and key not in params:
            seen.add(key)
            per[where[-1]] = per.get(where[-1], 0) + t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=torch.randint(3, 1000, (1, tokens)), use_cache=False, logits_to_keep=1)
    return per


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
def test_gemma4_per_layer_inputs_keep_what_the_estimate_counts(frozen):
    """Gemma-4's E-series per-layer inputs, on transformers' own model: what a layer keeps beyond the same layer without
    them is the estimate's per-layer term, and what the model keeps once for them (before its first layer, and the
    per-layer inputs' bf16 sum, first saved by layer 0's product) is its once-a-step term, each to the byte but each
    RMSNorm's fp32 copy of its weight (a weight's size, not a token's), trained whole and with their weights frozen
    (LoRA, no adapter on them)."""
    from automodel_dist.catalog.models import ModelSpec
    from automodel_dist.estimate.memory import Training, _per_layer_input_bytes, per_layer_inputs_bytes
    from automodel_dist.estimate.peft import Lora

    h, p, tokens = 256, 32, 64
    spec = ModelSpec("probe", h, 6, 4, 1, 512, 1000, head_dim=64, per_layer_input=p, per_layer_vocab=1000)
    tr = Training(lora=Lora(8, (("dense", 1.0),), 0.0, ("model.layers.0.self_attn.q_proj",), ())) if frozen else None
    tr = tr or Training()
    ple, plain = _gemma4_saved(p, frozen), _gemma4_saved(0, frozen)
    extra = {k: ple.get(k, 0) - plain.get(k, 0) for k in ("before", "layer0", "layer1")}
    assert extra["layer1"] - 4 * h == _per_layer_input_bytes(spec, tr) * tokens
    once = extra["before"] + extra["layer0"] - extra["layer1"] - 4 * p
    assert once == per_layer_inputs_bytes(spec, tr) * tokens


QWEN35_TP = """
import json, sys, warnings
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.distributed.tensor import DTensor, Shard

dist.init_process_group("fake", rank=0, world_size=8, store=FakeStore())
from nemo_automodel.components.distributed.config import FSDP2Config
from nemo_automodel.components.distributed.mesh import MeshContext, ParallelismSizes
from nemo_automodel.components.distributed.mesh_utils import _create_device_meshes
from nemo_automodel.components.distributed.model_parallelizer import parallelize_model
from nemo_automodel.components.models.common import BackendConfig
from transformers import Qwen3_5Config

cfg = json.loads(sys.argv[1])
if sys.argv[2] == "automodel":
    from nemo_automodel.components.models.qwen3_5.model import Qwen3_5ForConditionalGeneration as Model
    kwargs = {"backend": BackendConfig(attn="sdpa", linear="torch", rms_norm="torch", rope_fusion=False),
              "num_nextn_predict_layers": 0}
else:
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForConditionalGeneration as Model
    kwargs = {}
with torch.device("meta"):
    model = Model(Qwen3_5Config(**cfg), **kwargs).to(torch.bfloat16)
config = FSDP2Config(activation_checkpointing=False)
sizes = ParallelismSizes(tp_size=4, cp_size=1, pp_size=1, dp_replicate_size=1, ep_size=1)
meshes, moe = _create_device_meshes(config, sizes, world_size=8)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    model = parallelize_model(model, MeshContext.from_meshes(meshes, moe, strategy_config=config))
split = {}
for name, p in model.named_parameters():
    tp = isinstance(p, DTensor) and any(
        isinstance(pl, Shard) and dim == "tp" for pl, dim in zip(p.placements, p.device_mesh.mesh_dim_names)
    )
    for key in ("embed_tokens", "lm_head", "self_attn.q_proj", "linear_attn.in_proj_qkv", "mlp.down_proj"):
        if key in name and not name.startswith("model.visual"):
            split[key] = split.get(key, True) and tp
print(json.dumps(split))
"""


@pytest.mark.parametrize("hf_class", [False, True], ids=["automodel", "transformers"])
def test_qwen35_tp_plan_splits_no_vocabulary_on_automodels_class(hf_class):
    """TP_WHOLE_VOCAB against AutoModel's own parallelizer, on a fake process group (8 ranks, TP 4): Qwen3.5's dense
    VLM class keeps embed_tokens and lm_head whole on every TP rank while its attention, Gated DeltaNet projections and
    MLP are split; transformers' class (force_hf) splits the embedding only."""
    import json
    import subprocess
    import sys

    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.catalog.kernels import tp_splits_vocab
    from automodel_dist.catalog.models import lookup
    from automodel_dist.dry_run.depth import truncated_config

    spec = lookup("Qwen/Qwen3.6-27B")
    cfg = truncated_config(hf_config(spec), 4)  # three Gated DeltaNet layers and a full-attention one
    cfg["vision_config"] = {**cfg["vision_config"], "depth": 1}
    cfg.pop("model_type")
    which = "transformers" if hf_class else "automodel"
    done = subprocess.run(
        [sys.executable, "-c", QWEN35_TP, json.dumps(cfg), which], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    split = json.loads(done.stdout.strip().splitlines()[-1])
    assert split["self_attn.q_proj"] and split["linear_attn.in_proj_qkv"] and split["mlp.down_proj"], split
    assert (split["embed_tokens"], split["lm_head"]) == tp_splits_vocab(spec.architecture, hf_class), split


def test_falcon_h1_is_not_hybrid_to_automodel_and_its_tp_plan_leaves_the_mixer_whole():
    """The premises of the cp-parallel-mamba warning and of the estimate's Falcon-H1 TP split, from AutoModel's code:
    its hybrid check does not see Falcon-H1's Mamba layers (so CP takes the generic path), and its Falcon-H1 plan
    splits the attention and the MLP and names nothing of the Mamba mixer, nor sequence parallelism."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from nemo_automodel._transformers.capabilities import _is_hybrid
    from nemo_automodel.components.distributed.optimized_tp_plans import PARALLELIZE_FUNCTIONS

    config = transformers.FalconH1Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=128,
        vocab_size=128,
        mamba_d_ssm=128,
        mamba_n_heads=4,
        mamba_d_state=16,
    )
    with torch.device("meta"):
        model = transformers.FalconH1ForCausalLM(config)
    assert not _is_hybrid(model)
    plan = PARALLELIZE_FUNCTIONS["transformers.models.falcon_h1.modeling_falcon_h1.FalconH1ForCausalLM"](
        model, sequence_parallel=True
    )
    assert not [k for k in plan if ".mamba" in k] and {k.split(".")[-2] for k in plan if "layers" in k} == {
        "self_attn",
        "feed_forward",
    }
    assert not any("SequenceParallel" in type(style).__name__ for style in plan.values())


def test_automodel_resolves_the_catalogs_mistral3_vlms_to_the_class_the_parser_names():
    """The parser names Mistral3FP8VLMForConditionalGeneration for a Mistral3 config with a ministral3 text model;
    AutoModel's own supports_config claims the catalog's configs (Ministral-3, Devstral-Small-2,
    Mistral-Medium-3.5), and its projector's parameters are the spec's projector_params."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from nemo_automodel.components.models.mistral3_vlm.model import Mistral3FP8VLMForConditionalGeneration

    from automodel_dist.catalog.models import lookup

    for name in (
        "mistralai/Ministral-3-3B-Instruct-2512",
        "mistralai/Devstral-Small-2-24B-Instruct-2512",
        "mistralai/Mistral-Medium-3.5-128B",
    ):
        spec = lookup(name)
        cfg = dict(spec.hf_config or {})
        cfg.pop("architectures", None)
        config = transformers.Mistral3Config(**cfg)
        assert spec.architecture == "Mistral3FP8VLMForConditionalGeneration" and (
            Mistral3FP8VLMForConditionalGeneration.supports_config(config)
        ), name
        with torch.device("meta"):
            projector = transformers.models.mistral3.modeling_mistral3.Mistral3MultiModalProjector(config)
        assert sum(p.numel() for p in projector.parameters()) == spec.projector_params, name


def _muse_glimmer_config(hidden: int = 64, heads: int = 4, head_dim: int = 16) -> Any:
    """A small Muse-Glimmer config of AutoModel's class (a 4-layer language model, a 1-block tower)."""
    from nemo_automodel.components.models.muse_glimmer.config import MuseGlimmerConfig

    return MuseGlimmerConfig(
        text_config={
            "hidden_size": hidden,
            "intermediate_size": 2 * hidden,
            "num_hidden_layers": 4,
            "num_attention_heads": heads,
            "num_key_value_heads": 2,
            "head_dim": head_dim,
            "vocab_size": 100,
        },
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2},
    )


def _in_bf16(build: Any) -> Any:
    """``build()`` with bf16 the default dtype (AutoModel's Muse-Glimmer modules make their norms' weights in it)."""
    import torch

    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return build()
    finally:
        torch.set_default_dtype(default)


def _saved_bytes(run: Any, keep: Any) -> int:
    """Bytes of the distinct storages autograd saves while ``run()`` runs, of the tensors ``keep(t)`` accepts."""
    import torch

    storages: dict[int, int] = {}

    def pack(t: Any) -> Any:
        storages.setdefault(id(t.untyped_storage()), t.untyped_storage().nbytes() if keep(t) else 0)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(storages.values())


def _rotary(cfg: Any, x: Any, tokens: int) -> Any:
    import torch
    from nemo_automodel.components.models.muse_glimmer.model import MuseGlimmerRotaryEmbedding

    return MuseGlimmerRotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)(
        x, torch.arange(tokens)[None]
    )


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
def test_muse_glimmers_post_norms_stay_outside_automodels_submodule_checkpoints(frozen):
    """AutoModel's sub-module checkpointing on Muse-Glimmer's own decoder layer (apply_submodule_checkpointing, the
    path its native class takes): the wrappers keep their four inputs (8h bytes a token) and the post norms, which
    they do not wrap, what FP32_NORM_DECODERS' unwrapped count says, counted by saved-tensor hooks on real tensors,
    with the norms trained and frozen (LoRA)."""
    torch = pytest.importorskip("torch")
    from nemo_automodel.components.distributed.activation_checkpointing import apply_submodule_checkpointing
    from nemo_automodel.components.models.common import BackendConfig
    from nemo_automodel.components.models.muse_glimmer.model import MuseGlimmerDecoderLayer

    from automodel_dist.catalog.models import ModelSpec
    from automodel_dist.estimate.memory import Training, unwrapped_norm_bytes
    from automodel_dist.estimate.peft import Lora

    h, tokens = 64, 32
    cfg = _muse_glimmer_config(h)
    layer = _in_bf16(lambda: MuseGlimmerDecoderLayer(cfg, 0, BackendConfig(attn="sdpa")))
    if frozen:
        for name, param in layer.named_parameters():
            param.requires_grad_("norm" not in name)
    apply_submodule_checkpointing([layer], False)
    x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    position = _rotary(cfg, x, tokens)
    # (the [tokens, h] tensors: a norm also keeps its [tokens, 1] statistics and its weight's fp32 copy, [h])
    kept = _saved_bytes(lambda: layer(x, position), lambda t: t.dim() == 3 and t.shape[1:] == (tokens, h))
    spec = ModelSpec("probe", h, 4, 4, 2, 128, 100, head_dim=16, architecture="MuseGlimmerForConditionalGeneration")
    lora = Lora(8, (("dense", 1.0),), 0.0, ("model.layers.0.self_attn.q_proj",), ())
    tr = Training(lora=lora) if frozen else Training()
    assert kept == (8 * h + unwrapped_norm_bytes(spec, tr)) * tokens
    assert unwrapped_norm_bytes(spec, tr) == (8 if frozen else 16) * h


@pytest.mark.parametrize("frozen", [False, True], ids=["trained", "frozen"])
@pytest.mark.parametrize(
    "module, name",
    [
        ("nemo_automodel.components.models.muse_glimmer.model", "MuseGlimmerRMSNorm"),
        ("nemo_automodel.components.models.qwen3_next.layers", "Qwen3NextRMSNorm"),
    ],
)
def test_an_fp32_norm_keeps_what_the_estimate_counts(module, name, frozen):
    """The fp32 RMSNorms of FP32_NORM_DECODERS' classes (Muse-Glimmer's, and Qwen3-Next's, which Qwen3.5's class
    keeps): on a bf16 input, saved-tensor hooks count an fp32 copy of the input and, where the weight trains, the fp32
    normalised input a token (fp32_norm_bytes), beside [tokens, 1] statistics and the weight's fp32 copy."""
    torch = pytest.importorskip("torch")
    from automodel_dist.catalog.models import ModelSpec
    from automodel_dist.estimate.memory import Training, fp32_norm_bytes
    from automodel_dist.estimate.peft import Lora

    h, tokens = 64, 16
    norm = getattr(importlib.import_module(module), name)(h)
    norm.weight.requires_grad_(not frozen)
    x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
    kept = _saved_bytes(lambda: norm(x), lambda t: t.dim() == 3 and t.shape[1:] == (tokens, h))
    spec = ModelSpec("probe", h, 2, 4, 2, 128, 100, head_dim=16)
    tr = Training(lora=Lora(8, (("dense", 1.0),), 0.0, ("q_proj",), ())) if frozen else Training()
    assert kept == fp32_norm_bytes(spec, tr) * tokens


def test_muse_glimmers_output_gate_keeps_what_the_estimate_counts():
    """Muse-Glimmer's attention with its output gate (its own output_gate_proj) and without, on AutoModel's class:
    saved-tensor hooks count the gate's activations (parameters left out) as output_gate_bytes, the sigmoid's output
    and the gated product, not Qwen3-Next's three."""
    torch = pytest.importorskip("torch")
    from nemo_automodel.components.models.common import BackendConfig
    from nemo_automodel.components.models.muse_glimmer.model import MuseGlimmerAttention

    from automodel_dist.catalog.models import ModelSpec
    from automodel_dist.estimate.memory import output_gate_bytes

    h, heads, d, tokens = 64, 4, 16, 16
    kept = {}
    for gate in (False, True):
        cfg = _muse_glimmer_config(h, heads, d)
        cfg.use_attn_output_gate = gate
        attn = _in_bf16(lambda cfg=cfg: MuseGlimmerAttention(cfg, 0, BackendConfig(attn="sdpa")))
        params = {id(p.untyped_storage()) for p in attn.parameters()}
        x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
        position = _rotary(cfg, x, tokens)
        kept[gate] = _saved_bytes(
            lambda attn=attn, x=x, position=position: attn(x, position),
            lambda t, params=params: id(t.untyped_storage()) not in params,
        )
    spec = ModelSpec(
        "probe", h, 4, heads, 2, 128, 100, head_dim=d, attn_output_gate=True,
        architecture="MuseGlimmerForConditionalGeneration",
    )  # fmt: skip
    assert kept[True] - kept[False] == output_gate_bytes(spec) * tokens == 4 * heads * d * tokens


@pytest.mark.parametrize("arch", ["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"])
@pytest.mark.parametrize(("seq", "topk", "trained"), [(1024, 2048, False), (2048, 2048, True), (2048, 512, True)])
def test_the_dsa_indexers_forward_holds_what_the_estimate_counts(arch, seq, topk, trained):
    """AutoModel's DSA indexer on its dense path (backend.attn sdpa, as te) in forward, unchecked, on fake tensors under
    the dry run's tracker, at DeepSeek-V3.2's and GLM-5's index widths: its peak above its inputs is
    indexer_scores_bytes' within 2% (V3.2's ReLU and head-weighted product two new fp32 score tensors alive at once,
    GLM's scaled and ReLU'd in place and kept while its top-k is taken), its Linears taking a gradient or frozen (the
    inputs take one either way, as in training). Under the THD kernels the function counts none."""
    import torch
    from nemo_automodel.components.models.common import BackendConfig
    from torch._subclasses.fake_tensor import FakeTensorMode

    from automodel_dist.catalog.models import ModelSpec
    from automodel_dist.dry_run.tracker import make_tracker
    from automodel_dist.estimate.memory import Training, indexer_scores_bytes

    if arch == "DeepseekV32ForCausalLM":
        from nemo_automodel.components.models.deepseek_v32.config import DeepseekV32Config as Config
        from nemo_automodel.components.models.deepseek_v32.layers import DeepseekV32Indexer as Indexer

        heads, hidden, q_lora = 64, 7168, 1536
    else:
        from nemo_automodel.components.models.glm_moe_dsa.config import GlmMoeDsaConfig as Config
        from nemo_automodel.components.models.glm_moe_dsa.layers import GlmMoeDsaIndexer as Indexer

        heads, hidden, q_lora = 32, 6144, 2048
    dim, rope = 128, 64
    config = Config(
        hidden_size=hidden,
        q_lora_rank=q_lora,
        qk_rope_head_dim=rope,
        index_n_heads=heads,
        index_head_dim=dim,
        index_topk=topk,
        torch_dtype="bfloat16",
    )

    class Phase:
        current = key = "step"
        moment = None

    with FakeTensorMode():
        indexer = Indexer(config, BackendConfig(attn="sdpa", linear="torch", rms_norm="torch"))
        indexer.requires_grad_(trained)
        x = torch.randn(1, seq, hidden, dtype=torch.bfloat16, requires_grad=True)
        q_resid = torch.randn(1, seq, q_lora, dtype=torch.bfloat16, requires_grad=True)
        freqs = torch.randn(1, seq, rope // 2, dtype=torch.complex64)
        tracker = make_tracker([indexer], [], Phase())
        with tracker:
            (before,) = (s["Total"] for s in tracker.get_tracker_snapshot().values())
            indexer(x, q_resid, freqs)
    (peak,) = (s["Total"] for s in tracker.get_tracker_snapshot("peak").values())
    inputs = 2 * seq * (hidden + q_lora)  # (filed when the indexer is first entered)
    spec = ModelSpec(
        name="indexer",
        architecture=arch,
        hidden_size=hidden,
        num_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=hidden,
        vocab_size=1,
        index_heads=heads,
        index_head_dim=dim,
        index_topk=topk,
    )
    per_mb, per_token = indexer_scores_bytes(spec, Training(seq_len=seq, attn_backend="sdpa"))
    assert per_mb + per_token * seq == pytest.approx(peak - before - inputs, rel=0.02)
    assert indexer_scores_bytes(spec, Training(seq_len=seq, attn_backend="tilelang")) == (0.0, 0.0)


@pytest.mark.parametrize(
    "model",
    [
        "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
        "openai/gpt-oss-20b",
        "deepseek-ai/DeepSeek-V4-Flash",
        "Qwen/Qwen3-30B-A3B",
        "deepseek-ai/DeepSeek-V3",
    ],
)
def test_the_models_marked_with_a_fused_expert_activation_run_automodels_compiled_ones(model):
    """ModelSpec.fused_expert_activation (the estimate's moe_forward_bytes: the activation's output alone) where
    AutoModel's MoE class picks a torch.compile'd activation for the model's config: the expert_activation its class
    sets, and DeepSeek-V4's swiglu_limit (moe/experts.py get_expert_activation_for_deepep)."""
    import types

    from nemo_automodel._transformers.registry import MODEL_ARCH_MAPPING
    from nemo_automodel.components.moe.experts import get_expert_activation_for_deepep

    from automodel_dist.catalog.hf_config import hf_config
    from automodel_dist.catalog.models import lookup
    from automodel_dist.stack.shims import _COMPILED  # the compiled activations the dry run stands in for

    spec = lookup(model)
    module = MODEL_ARCH_MAPPING[spec.architecture][0]
    source = Path(inspect.getfile(importlib.import_module(module))).read_text(encoding="utf-8")
    named = re.findall(r'expert_activation="(\w+)"', source)
    cfg = hf_config(spec)
    limit = float(cfg.get("swiglu_limit", 0.0) or 0.0) if "swiglu_limit" in source else 0.0
    moe = types.SimpleNamespace(
        expert_activation=named[0] if named else "swiglu",
        swiglu_limit=limit,
        activation_alpha=1.702,
        activation_limit=7.0,
    )
    picked = get_expert_activation_for_deepep(moe)
    assert (getattr(picked, "func", picked).__name__ in _COMPILED) is spec.fused_expert_activation


def test_the_compiled_activations_stand_in_makes_its_output_alone_on_fake_tensors():
    """A fused kernel writes its output alone: on fake tensors the stand-in runs no eager intermediate (relu2's square
    and its fp32 product with the routing probabilities, a gated one's halves and products) and keeps its inputs for
    backward; on real tensors it computes the eager function's values."""
    import torch
    from nemo_automodel.components.moe import experts
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    from automodel_dist.stack import shims

    shims.install_compiled_activations()

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    for name, width in (("relu2_deepep", 64), ("swiglu_oai_deepep", 32), ("quick_geglu_deepep", 32)):
        fn = getattr(experts, name)
        eager = fn._stand_in_for
        x, probs = torch.randn(16, 64), torch.rand(16, 1)
        assert torch.equal(fn(x, probs), eager(x, probs))
        with FakeTensorMode() as mode:
            fx = mode.from_tensor(x).requires_grad_(True)
            fp = mode.from_tensor(probs)
            with Ops() as ops:
                out = fn(fx, fp)
            assert out.shape == (16, width) and out.dtype == x.dtype
            made = [op for op in ops.seen if op not in ("new_empty.default", "detach.default", "device.default")]
            assert made == [] and "new_empty.default" in ops.seen, (name, ops.seen)
            out.sum().backward()
            assert fx.grad.shape == fx.shape


def test_the_classes_that_mask_every_layer_with_the_sliding_window_are_transformers():
    """catalog/models.py SLIDING_MASK_TYPES (the estimate's mask_window, sdpa_repeats_kv): each model type's
    transformers class picks create_sliding_window_causal_mask for every layer where its config sets sliding_window, and
    transformers' SDPA path repeats the keys and values whenever it is given a mask."""
    import transformers
    from transformers.integrations import sdpa_attention

    from automodel_dist.catalog.models import SLIDING_MASK_TYPES

    models = Path(transformers.__file__).parent / "models"
    for mtype in SLIDING_MASK_TYPES:
        source = (models / mtype / f"modeling_{mtype}.py").read_text(encoding="utf-8")
        assert re.search(
            r"create_causal_mask if self\.config\.sliding_window is None else create_sliding_window_causal_mask", source
        ), mtype
    gqa = inspect.getsource(sdpa_attention.use_gqa_in_sdpa)
    assert "attention_mask is None" in gqa
    assert "repeat_kv(key" in inspect.getsource(sdpa_attention.sdpa_attention_forward)
