"""What it takes to run AutoModel 0.7.0's own build and step on a CPU, on fake tensors: small patches, each hooking one
AutoModel or torch internal by name.

None changes what AutoModel decides (its layout, wrapping, dtypes, checkpointing); each lets a CUDA-only call or a
data-dependent value pass on fake tensors. Every shim has a ``check`` that the target still exists and looks as
expected: :func:`broken` lists the shims an installed release breaks, so the dry run names the phase it cannot run
instead of failing inside AutoModel. Only the dry run's worker process imports this module.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Shim:
    name: str
    phase: str  # the phase that cannot run without it
    target: str
    why: str
    check: Callable[[], None]
    hits: int = 0
    notes: list[str] = field(default_factory=list)

    def count(self) -> None:
        """One more use (a stand-in's callback)."""
        self.hits += 1


SHIMS: dict[str, Shim] = {}


def _register(name: str, phase: str, target: str, why: str, check: Callable[[], None]) -> Shim:
    SHIMS[name] = shim = Shim(name, phase, target, why, check)
    return shim


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
    return obj


def _has_params(path: str, *names: str) -> Callable[[], None]:
    def check() -> None:
        fn = _resolve(path)
        fn = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
        params = inspect.signature(fn).parameters
        missing = [n for n in names if n not in params]
        if missing:
            raise RuntimeError(f"{path} no longer takes {missing}")

    return check


def _source_has(path: str, *needles: str) -> Callable[[], None]:
    def check() -> None:
        fn = _resolve(path)
        fn = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
        source = inspect.getsource(fn)
        missing = [n for n in needles if n not in source]
        if missing:
            raise RuntimeError(f"{path} no longer contains {missing}")

    return check


def _file_has(module: str, needle: str) -> Callable[[], None]:
    def check() -> None:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"{module} is gone")
        with open(spec.origin, encoding="utf-8") as fh:
            if needle not in fh.read():
                raise RuntimeError(f"{module} no longer contains {needle!r}")

    return check


def _fake_op(*ops: str) -> Callable[[], None]:
    def check() -> None:
        import torch
        from torch._subclasses import fake_impls

        for name in ops:
            op = getattr(torch.ops.aten, name.split(".")[0]).default
            if op not in fake_impls.op_implementations_dict:
                raise RuntimeError(f"torch's fake tensors have no implementation entry for aten.{name}")

    return check


def _meta_kernel(*ops: str) -> Callable[[], None]:
    def check() -> None:
        import torch

        for name in ops:
            op = getattr(torch.ops.aten, name).default
            if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta"):
                raise RuntimeError(f"aten.{name} has no shape function (Meta kernel) for fake tensors")

    return check


def broken() -> list[str]:
    """``"<shim> (phase <p>): <what changed>"`` for every shim whose target this install no longer has."""
    out = []
    try:
        import_automodel()
    except Exception as exc:  # noqa: BLE001
        return [f"{TORCHAO.name} (phase import): AutoModel cannot be imported: {type(exc).__name__}: {exc}"]
    for shim in SHIMS.values():
        try:
            shim.check()
        except Exception as exc:  # noqa: BLE001 - any failure means the target moved
            out.append(f"{shim.name} (phase {shim.phase}): {type(exc).__name__}: {exc}")
    return out


@contextlib.contextmanager
def _patched(obj: Any, name: str, new: Any) -> Iterator[None]:
    old = obj.__dict__[name] if isinstance(obj, type) else getattr(obj, name)
    setattr(obj, name, new)
    try:
        yield
    finally:
        setattr(obj, name, old)


# ----------------------------------------------------------------------------------------------------- import
TORCHAO = _register(
    "torchao_import_stub",
    "import",
    "sys.modules['torchao.quantization.qat', ...] while nemo_automodel.components.quantization.qat is imported",
    "qat.py imports torchao's QAT quantizers at module level and auto_model.py imports qat.py, so AutoModel cannot be "
    "imported without torchao. Stub modules stand in for that one import and are removed right after, so AutoModel's "
    "own torchao checks (fp8, init_empty_weights) still see it missing.",
    _file_has("nemo_automodel.components.quantization.qat", "from torchao.quantization.qat import"),
)


def import_automodel() -> None:
    """Import AutoModel's model builder (with the torchao stub around qat.py's import when torchao is missing)."""
    if importlib.util.find_spec("torchao") is None and "nemo_automodel.components.quantization.qat" not in sys.modules:
        import nemo_automodel.components.quantization.fp8  # noqa: F401 - its guarded import must see no torchao

        names = ["torchao", "torchao.quantization", "torchao.quantization.qat", "torchao.quantization.qat.linear"]
        mods = {n: types.ModuleType(n) for n in names}

        def unavailable(self: Any, *args: Any, **kwargs: Any) -> None:
            raise ImportError("torchao is not installed: QAT cannot run in the dry run")

        for cls in ("Int4WeightOnlyQATQuantizer", "Int8DynActInt4WeightQATQuantizer"):
            setattr(mods["torchao.quantization.qat"], cls, type(cls, (), {"__init__": unavailable}))
        for fn in (
            "disable_4w_fake_quant",
            "disable_8da4w_fake_quant",
            "enable_4w_fake_quant",
            "enable_8da4w_fake_quant",
        ):
            setattr(mods["torchao.quantization.qat.linear"], fn, lambda *a, **k: None)
        mods["torchao"].quantization = mods["torchao.quantization"]  # type: ignore[attr-defined]
        mods["torchao.quantization"].qat = mods["torchao.quantization.qat"]  # type: ignore[attr-defined]
        mods["torchao.quantization.qat"].linear = mods["torchao.quantization.qat.linear"]  # type: ignore[attr-defined]
        sys.modules.update(mods)
        try:
            importlib.import_module("nemo_automodel.components.quantization.qat")
            TORCHAO.hits += 1
        finally:
            for n in names:
                sys.modules.pop(n, None)
    import nemo_automodel._transformers.auto_model  # noqa: F401


TE_ATTENTION = _register(
    "te_attention_stand_in",
    "build",
    "transformer_engine.pytorch.attention.DotProductAttention (a stand-in module, stack/te_attention.py)",
    "AutoModel's own classes build Transformer Engine's DotProductAttention for backend.attn te, the only attention "
    "they accept under context parallelism; TE needs CUDA. The stand-in takes TE's constructor and call, sets TE's "
    "groups, and keeps what TE's flash / ring attention keeps (q, k, v or the ring's peer K/V buffer, output, fp32 "
    "log-sum-exp) and its ring buffers while they live; nothing else of TE is provided.",
    _source_has(
        "nemo_automodel.components.attention.utils:initialize_attn_module_and_func",
        "from transformer_engine.pytorch.attention import DotProductAttention",
    ),
)
FLA_GDN = _register(
    "fla_gated_delta_rule_stand_in",
    "build",
    "fla.ops.gated_delta_rule.chunk_gated_delta_rule (a stand-in module, stack/fla_gdn.py)",
    "AutoModel's Qwen3-Next and Qwen3.5 linear-attention layers bind flash-linear-attention's chunked Gated DeltaNet "
    "kernel where it is installed (its fla extra, in the moe and all extras), else transformers' pure-torch chunk "
    "loop, which keeps every chunk's intermediates; fla needs Triton on CUDA. The stand-in takes fla's call and keeps "
    "what its kernel keeps (normalised q, k, their rstd, v, beta, the gate's cumsum, the WY matrix) and its chunk "
    "states while they live.",
    lambda: (
        _source_has(
            "nemo_automodel.components.models.qwen3_next.layers:Qwen3NextFp32GatedDeltaNet._bind_kernels",
            '"fla.ops.gated_delta_rule", "chunk_gated_delta_rule"',
        )(),
        _file_has(
            "nemo_automodel.components.models.qwen3_5_moe.cp_linear_attn",
            "from fla.ops.gated_delta_rule import chunk_gated_delta_rule",
        )(),
    ),
)
FLA_KDA = _register(
    "fla_kda_stand_in",
    "build",
    "fla.ops.kda.chunk_kda, fla.ops.kda.gate.fused_kda_gate, fla.modules.ShortConvolution and FusedRMSNormGated "
    "(stand-in modules, stack/fla_kda.py)",
    "AutoModel's Kimi-Linear KDA layers (kimi_linear/model.py) require flash-linear-attention (its fla extra, in the "
    "moe and all extras): its short convolutions, gated RMSNorm, KDA gate and chunked KDA kernel, which need Triton "
    "on CUDA. The modules keep fla's parameters; the functions keep what fla's kernels keep for backward (the "
    "normalised q and k with their rstd, v, the gate and its chunk cumsum, beta, the two intra-chunk matrices) and "
    "their chunk states while they live, forward and backward.",
    lambda: tuple(
        _file_has("nemo_automodel.components.models.kimi_linear.model", needle)()
        for needle in (
            'safe_import_from("fla.modules", "ShortConvolution"',
            'safe_import_from("fla.ops.kda", "chunk_kda"',
            'safe_import_from("fla.ops.kda.gate", "fused_kda_gate"',
            '"fla.modules",\n    "FusedRMSNormGated"',
        )
    ),
)
MAMBA_SSD = _register(
    "mamba_ssd_stand_in",
    "forward",
    "mamba_ssm.ops.triton.ssd_combined.mamba_split_conv1d_scan_combined and layernorm_gated.rmsnorm_fn (stand-in "
    "modules, stack/mamba_ssd.py)",
    "AutoModel's Nemotron-H Mamba-2 mixers (nemotron_v3/layers.py) import mamba_ssm's fused conv1d + SSD scan + gated "
    "RMSNorm + out_proj kernel in their training forward, and its gated RMSNorm under context parallelism; mamba_ssm "
    "needs Triton on CUDA and causal_conv1d's CUDA extension. The stand-in takes mamba_ssm's call and keeps what its "
    "kernel keeps for backward (in_proj's output, the scan's output, the norm's fp32 rstd) and its conv output, chunk "
    "cumsums, chunk states and C^T B while they live, forward and backward.",
    lambda: (
        _source_has(
            "nemo_automodel.components.models.nemotron_v3.layers:NemotronV3Mamba2Mixer.forward",
            "from mamba_ssm.ops.triton.ssd_combined import mamba_split_conv1d_scan_combined",
            "rmsnorm_weight=self.norm.weight",
            "outproj_weight=self.out_proj.weight",
        )(),
        _source_has(
            "nemo_automodel.components.models.nemotron_v3.layers:NemotronV3MambaRMSNormGated.forward",
            "from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn",
        )(),
    ),
)
CUT_CROSS_ENTROPY = _register(
    "cut_cross_entropy_stand_in",
    "loss",
    "nemo_automodel.components.loss.chunked_ce._ChunkedLinearCE, while a FusedLinearCrossEntropy recipe's loss runs "
    "on fake tensors (stack/cce.py)",
    "FusedLinearCrossEntropy calls cut_cross_entropy's CUDA kernels; the dry run computes its loss as AutoModel's "
    "ChunkedCrossEntropy, whose backward accumulates the head's gradient in fp32 chunk by chunk and copies it to the "
    "weight's dtype at the end, where the kernel writes it once in the weight's dtype and the hidden states' in fp32: "
    "on fake tensors the stand-in keeps the kernel's (real tensors, the smoke run's, compute ChunkedCrossEntropy's).",
    lambda: _source_has(
        "nemo_automodel.components.loss.chunked_ce:ChunkedCrossEntropy.forward", "losses = _ChunkedLinearCE.apply("
    )(),
)


def _hf_mamba_kernels(name: str, model: str, mixer: str, why: str) -> Shim:
    module = f"transformers.models.{model}.modeling_{model}"
    return _register(
        name,
        "forward",
        f"{module}: causal_conv1d_fn, mamba2_chunk_scan and mamba2_split_conv1d_scan_combined (rebound to the "
        "stand-ins, stack/mamba_ssd.py)",
        why,
        lambda: _source_has(
            f"{module}:{mixer}.forward",
            "hidden_states_B_C = causal_conv1d_fn(",
            "scan_result = mamba2_chunk_scan(",
            "fused_output = mamba2_split_conv1d_scan_combined(",
        )(),
    )


_HF_MAMBA_WHY = (
    "transformers' {} mixer binds causal_conv1d's and mamba_ssm's kernels when it is imported where they are "
    "installed, as in AutoModel's CUDA environment, and its chunked torch references otherwise, whose "
    "[chunks x chunk x chunk] intermediates a GPU never holds. With its cache on, as it trains (the config's "
    "use_cache), it runs the conv, the chunk scan and its own gated norm apart."
)
# transformers' classes with Mamba-2 mixers that AutoModel builds (Nemotron-H under force_hf; Falcon-H1, which its
# registry lacks), by architecture: their module (a fixed name, never the recipe's) and the shim counting its calls
HF_MAMBA_KERNELS: dict[str, tuple[str, Shim]] = {
    "NemotronHForCausalLM": (
        "transformers.models.nemotron_h.modeling_nemotron_h",
        _hf_mamba_kernels(
            "transformers_nemotron_h_kernels",
            "nemotron_h",
            "NemotronHMamba2Mixer",
            _HF_MAMBA_WHY.format("Nemotron-H (a Hugging Face class: force_hf)"),
        ),
    ),
    "FalconH1ForCausalLM": (
        "transformers.models.falcon_h1.modeling_falcon_h1",
        _hf_mamba_kernels(
            "transformers_falcon_h1_kernels",
            "falcon_h1",
            "FalconH1Mixer",
            _HF_MAMBA_WHY.format("Falcon-H1 (the class AutoModel builds: its registry has none)"),
        ),
    ),
}
FLA_CP = _register(
    "fla_context_parallel_stand_in",
    "forward",
    "fla.ops.cp.build_cp_context, fla.modules.convolution.causal_conv1d and the chunked kernel's cp_context (stand-ins, "
    "stack/fla_gdn.py) in AutoModel's Qwen3.5 CP linear attention, and its torch.equal position checks",
    "Under context parallelism AutoModel's Qwen3.5 Gated DeltaNet layers (cp_linear_attn.CPAwareGatedDeltaNet) "
    "gather the hidden states back to sequence order, check the gathered positions with torch.equal, and call fla's "
    "CP context, CP causal conv1d and chunked kernel with it. The stand-ins keep what fla's CP path keeps; the checks "
    "are answered true (the CP sharder hands each rank its share, as on a GPU).",
    lambda: (
        _file_has(
            "nemo_automodel.components.models.qwen3_5_moe.cp_linear_attn", "from fla.ops.cp import build_cp_context"
        )(),
        _file_has(
            "nemo_automodel.components.models.qwen3_5_moe.cp_linear_attn",
            "from fla.modules.convolution import causal_conv1d as fla_causal_conv1d",
        )(),
        _source_has(
            "nemo_automodel.components.models.qwen3_5_moe.cp_linear_attn:CPAwareGatedDeltaNet."
            "_undo_attention_load_balancing",
            "torch.equal(sorted_positions, expected_positions)",
        )(),
        _source_has(
            "nemo_automodel.components.models.qwen3_5_moe.cp_linear_attn:CPAwareGatedDeltaNet."
            "_redo_attention_load_balancing",
            "torch.equal(restored_positions, original_positions)",
        )(),
    ),
)
CUDA_STREAM = _register(
    "cuda_stream_for_cp",
    "build",
    "torch.cuda.Stream (a placeholder object while building, on a machine without CUDA)",
    "AutoModel hands TE's context-parallel attention a CUDA stream (attach_te_context_parallel, the MoE "
    "parallelizer's _get_cp_stream); a CPU build of torch cannot create one. The stand-in attention never uses it.",
    lambda: (
        _source_has(
            "nemo_automodel.components.distributed.context_parallel.utils:attach_te_context_parallel",
            "torch.cuda.Stream()",
        )(),
        _source_has("nemo_automodel.components.moe.parallelizer:_get_cp_stream", "torch.cuda.Stream()")(),
    ),
)

FFPA = _register(
    "ffpa_cutedsl_kernels_stand_in",
    "build",
    "the ffpa_attn package (ffpa_attn.cute._ffpa_attn_forward_cute / _ffpa_attn_backward_cute and the "
    "torch.ops.ffpa_attn._fwd_cute / _bwd_cute / _varlen_fwd_cute / _varlen_bwd_cute operators; stand-ins, "
    "stack/ffpa.py) behind nemo_automodel.components.attention.ffpa_attention's wrappers",
    "Gemma-4's context-parallel ring runs its full-attention layers' chunks through FFPA's CuTeDSL kernels (CUDA) "
    "where text_config.cp_full_attn_backend is ffpa. The stand-ins return each kernel's outputs in the shapes "
    "AutoModel's wrappers document; the wrappers and the ring around them (copies, gathers, merges) run as written.",
    lambda: (
        _resolve("nemo_automodel.components.attention.ffpa_attention:_ffpa_dense_fwd"),
        _resolve("nemo_automodel.components.attention.ffpa_attention:_ffpa_dense_bwd"),
        _resolve("nemo_automodel.components.attention.ffpa_attention:_ffpa_varlen_fwd"),
        _resolve("nemo_automodel.components.attention.ffpa_attention:_ffpa_varlen_bwd"),
        _resolve("nemo_automodel.components.models.gemma4_moe.cp_attention:_ring_use_ffpa_varlen"),
        _source_has("nemo_automodel.components.attention.ffpa_attention:_ffpa_low_level_ready", "_fwd_cute")(),
        _source_has("nemo_automodel.components.attention.ffpa_attention:_ffpa_varlen_fwd", "_varlen_fwd_cute")(),
        _source_has("nemo_automodel.components.attention.ffpa_attention:_ffpa_dense_fwd", "_ffpa_attn_forward_cute")(),
    ),
)
FLASH_VARLEN = _register(
    "flash_attn_varlen_stand_in",
    "build",
    "the flash_attn package (flash_attn_func / flash_attn_varlen_func; stand-ins, stack/flash_varlen.py) behind "
    "nemo_automodel.components.distributed.blockdiag_cp.kernels._flash_varlen_with_long_prefix_guard, with "
    "kernels.HAS_FLASH_VARLEN set",
    "A packed VLM batch under context parallelism (Qwen3.5's classes) takes AutoModel's block-diagonal CP path, whose "
    "softmax attention runs flash-attn's varlen kernel (CUDA) on the all-gathered keys and values. The stand-ins keep "
    "what flash-attn's Functions keep (q, k, v, the output and an fp32 log-sum-exp a row) and allocate what its "
    "backward allocates (an fp32 dq accumulator, softmax_d, and under GQA dk and dv at the query's head count); "
    "AutoModel's packing, slicing and scatter around them run as written.",
    lambda: (
        _resolve("nemo_automodel.components.distributed.blockdiag_cp.kernels:HAS_FLASH_VARLEN"),
        _resolve("nemo_automodel.components.distributed.blockdiag_cp.runtime:_ORIGINAL_SDPA"),
        _source_has(
            "nemo_automodel.components.distributed.blockdiag_cp.kernels:_flash_varlen_with_long_prefix_guard",
            "from flash_attn import flash_attn_func, flash_attn_varlen_func",
        )(),
        _source_has(
            "nemo_automodel.components.distributed.blockdiag_cp.kernels:_cp_blockdiag_varlen",
            'backend == "flash" and not HAS_FLASH_VARLEN',
        )(),
    ),
)
GLM_DSA = _register(
    "glm_dsa_tilelang_kernels_stand_in",
    "build",
    "nemo_automodel.components.models.glm_moe_dsa.kernels (indexer.indexer_fwd_interface / indexer_bwd_interface, "
    "sparse_mla.sparse_mla_fwd_interface / sparse_mla_bwd; stand-ins, stack/glm_dsa.py) and "
    "optimized_kernels.HAS_TILELANG / _all_cuda",
    "GLM-5.2's backend.attn tilelang runs the sparse attention through TileLang kernels AutoModel vendors (CUDA). The "
    "stand-ins return what each kernel returns and allocate what its interface allocates; AutoModel's autograd "
    "Functions around them (what they save for backward, the indexer's fp32 logits and top-k) run as written.",
    lambda: (
        _resolve("nemo_automodel.components.models.glm_moe_dsa.kernels.indexer:indexer_fwd_interface"),
        _resolve("nemo_automodel.components.models.glm_moe_dsa.kernels.indexer:indexer_bwd_interface"),
        _resolve("nemo_automodel.components.models.glm_moe_dsa.kernels.sparse_mla:sparse_mla_fwd_interface"),
        _resolve("nemo_automodel.components.models.glm_moe_dsa.kernels.sparse_mla:sparse_mla_bwd"),
        _resolve("nemo_automodel.components.models.glm_moe_dsa.optimized_kernels:_all_cuda"),
        _source_has(
            "nemo_automodel.components.models.glm_moe_dsa.optimized_kernels:is_dsa_kernel_available",
            "HAS_TILELANG",
        )(),
    ),
)

GLM_CUDNN_DSA = _register(
    "glm_dsa_cudnn_kernels_stand_in",
    "build",
    "cuDNN Frontend's DSA wrappers (cudnn.DSA.indexer_forward_wrapper / indexer_top_k_wrapper / "
    "sparse_attention_backward_wrapper) and FlashMLA's flash_mla_sparse_fwd where AutoModel's adapters look them up "
    "(glm_moe_dsa/kernels/cudnn_dsa.py, common/cudnn_sparse_attention.py: _CUDNN_DSA, _FLASH_MLA_SPARSE_FWD, the "
    "availability flags, _require_cuda_tensors as an SM90 device; stand-ins, stack/glm_cudnn_dsa.py), and "
    "prepare_cudnn_dsa_packed_metadata, contiguous_local_indices and thd_utils._thd_padding_mask run on the packed "
    "layout's known values",
    "GLM-5.2's backend.attn cudnn runs its sparse attention through cuDNN Frontend's CuTe DSL kernels and FlashMLA "
    "(CUDA). The stand-ins return what each kernel returns and allocate its scratch for the call; AutoModel's "
    "adapters around them (the indexer's fp32 scores and chunked top-k, the global indices and their compaction, "
    "the autograd Function and what it saves) run as written. The packed metadata reads the layout's values on the "
    "host, which the dry run's THD batch knows.",
    lambda: _glm_cudnn_checks(),
)


def _glm_cudnn_checks() -> None:
    """Every name the cuDNN stand-ins bind, where AutoModel looks it up (a renamed one would otherwise become a new
    attribute), the kernels' calls and the outputs read from them; the module paths are the stand-ins' own."""
    from . import glm_cudnn_dsa as g

    for module in (g.KERNELS, g.SHARED):
        for name in ("_CUDNN_DSA", "_HAS_CUDNN_DSA", "_HAS_FLASH_MLA", "_require_cuda_tensors"):
            _resolve(f"{module}:{name}")
    _resolve(f"{g.SHARED}:_FLASH_MLA_SPARSE_FWD")
    # AutoModel chunks the cuDNN top-k's rows by its own figure for the kernel's scratch (_TOPK_SCRATCH_INT32_FACTOR
    # int32s a score); the stand-in allocates what cuDNN's IndexerTopK does for fp32 scores: checked to agree
    factor = _resolve(f"{g.KERNELS}:_TOPK_SCRATCH_INT32_FACTOR")
    if factor != g.TOPK_BUFFERS_FP32:
        raise RuntimeError(f"AutoModel's top-k scratch factor is {factor}, cuDNN's fp32 buffers {g.TOPK_BUFFERS_FP32}")
    _resolve(f"{g.MODEL}:prepare_cudnn_dsa_packed_metadata")
    _resolve(f"{g.THD}:_thd_padding_mask")
    _resolve(f"{g.SHARDER}:contiguous_local_indices")
    _resolve(f"{g.GLM_CP}:contiguous_local_indices")
    _source_has(f"{g.MODEL}:GlmMoeDsaModel.forward", "prepare_cudnn_dsa_packed_metadata(")()
    _source_has(f"{g.MODEL}:GlmMoeDsaForCausalLM.prepare_model_inputs_for_cp", "contiguous_local_indices")()
    _source_has(f"{g.GLM_CP}:_slice_thd_chunk_for_cp", "contiguous_local_indices(")()
    _source_has(f"{g.THD}:process_input_for_thd", "_thd_padding_mask(")()
    _source_has(f"{g.KERNELS}:cudnn_indexer_topk", "_CUDNN_DSA.indexer_forward_wrapper(", '["scores"]')()
    _source_has(f"{g.KERNELS}:_topk_wrapper_chunked", "_CUDNN_DSA.indexer_top_k_wrapper(", 'result["indices"]')()
    _source_has(f"{g.KERNELS}:is_cudnn_dsa_available", "_HAS_CUDNN_DSA and _HAS_FLASH_MLA")()
    _source_has(f"{g.SHARED}:is_cudnn_sparse_attention_available", "_HAS_CUDNN_DSA and _HAS_FLASH_MLA")()
    _source_has(f"{g.SHARED}:_CudnnSparseAttention.forward", "_FLASH_MLA_SPARSE_FWD(")()
    _source_has(
        f"{g.SHARED}:_CudnnSparseAttention.backward",
        "_CUDNN_DSA.sparse_attention_backward_wrapper(",
        'result["dq"]',
        'result["dkv"]',
    )()
    _source_has(f"{g.SHARED}:cudnn_sparse_attention", "_require_cuda_tensors(")()


KERNELS_DSV4 = "nemo_automodel.components.models.deepseek_v4.kernels"
OPTIMIZED_DSV4 = "nemo_automodel.components.models.deepseek_v4.optimized_kernels"
DSV4_TILELANG = _register(
    "dsv4_tilelang_kernels_stand_in",
    "build",
    "nemo_automodel.components.models.deepseek_v4.kernels (tilelang_sparse_mla_fwd.sparse_mqa_fwd, "
    "tilelang_sparse_mla_bwd.preprocess / bwd / postprocess, tilelang_indexer_fwd.tl_indexer_fwd_impl / "
    "clean_logits_; stand-ins, stack/dsv4_tilelang.py) and optimized_kernels._all_cuda",
    "DeepSeek-V4's backend.attn tilelang runs its sparse attention and indexer through TileLang kernels AutoModel "
    "vendors (CUDA). The stand-ins build kernels that return or fill what each real one does; AutoModel's autograd "
    "Functions (what they save for backward, the head chunks' copies and fp32 KV-gradient accumulator) and its "
    "interfaces' padded indices, masks and logits run as written.",
    lambda: (
        _source_has(f"{KERNELS_DSV4}.tilelang_sparse_mla_fwd:sparse_mqa_fwd_interface", "sparse_mqa_fwd(")(),
        _source_has(
            f"{KERNELS_DSV4}.tilelang_sparse_mla_bwd:sparse_mqa_bwd_interface", "preprocess(", "postprocess("
        )(),
        _source_has(
            f"{KERNELS_DSV4}.tilelang_indexer_fwd:indexer_fwd_interface", "tl_indexer_fwd_impl(", "clean_logits_("
        )(),
        _resolve(f"{OPTIMIZED_DSV4}:_all_cuda"),
    ),
)


def _dsv4_sinkhorn_flags_exist() -> None:
    """Each TileKernels availability flag the Sinkhorn stand-ins set is still one AutoModel reads (a renamed flag
    would leave the stand-ins unused and the torch reference measured)."""
    from . import dsv4_tilelang

    _source_has(f"{OPTIMIZED_DSV4}:is_dsv4_kernel_available", *dsv4_tilelang.SINKHORN_FLAGS)()
    for flag in dsv4_tilelang.SINKHORN_FLAGS:
        _resolve(f"{OPTIMIZED_DSV4}:{flag}")


DSV4_SINKHORN = _register(
    "dsv4_tilekernels_sinkhorn_stand_in",
    "build",
    "nemo_automodel.components.models.deepseek_v4.optimized_kernels (_tile_kernels_sinkhorn_fwd / _bwd, TileKernels' "
    "Sinkhorn kernel builders; stand-ins, stack/dsv4_tilelang.py) and its _HAS_TILE_KERNELS_SINKHORN flags",
    "Under backend.attn tilelang DeepSeek-V4's hyper-connections ask for the Sinkhorn backend auto, which on a GPU "
    "with TileKernels (the tile-kernels package of AutoModel's cuda extra) runs AutoModel's _Dsv4TileKernelsSinkhorn "
    "Function around TileKernels' kernels; on a CPU it would run the torch reference, which keeps every iteration. "
    "The stand-ins fill the kernels' out-arguments (the kernels allocate nothing) and the flags say TileKernels is "
    "installed, so AutoModel's Function runs as written and keeps what it keeps on the GPU: its fp32 input.",
    lambda: (
        _source_has(
            f"{OPTIMIZED_DSV4}:_Dsv4TileKernelsSinkhorn.forward",
            "_tile_kernels_sinkhorn_fwd(",
            "_tile_kernels_sinkhorn_bwd(",
            "save_for_backward(flat_x)",
        )(),
        _source_has(f"{OPTIMIZED_DSV4}:_tile_kernels_sinkhorn_contiguous_grad", "_HAS_TILE_KERNELS_SINKHORN_FWD")(),
        _dsv4_sinkhorn_flags_exist(),
        _source_has("nemo_automodel.components.models.deepseek_v4.layers:_dsv4_sinkhorn_backend", '"auto"')(),
    ),
)

FLEX_ATTENTION = _register(
    "gemma4_cp_flex_attention_stand_in",
    "forward",
    "nemo_automodel.components.models.gemma4_moe.cp_attention._compiled_flex_attention (torch.compile(flex_attention); "
    "a stand-in, stack/flex_attention.py)",
    "Gemma-4's context-parallel ring runs each ring chunk through torch.compile'd flex_attention; Dynamo refuses fake "
    "tensors and eager flex_attention refuses a CPU backward (and would materialise the score matrix the compiled "
    "kernel never holds). The stand-in takes flex_attention's call and keeps what the compiled kernel keeps (q, k, v, "
    "output, fp32 log-sum-exp and max scores), with its fp32 row buffer while it lives; AutoModel's ring around it "
    "(the p2p K/V rotation, the per-chunk masks, the online-softmax merge, the backward's recompute and dK/dV "
    "routing) runs as written.",
    _source_has(
        "nemo_automodel.components.models.gemma4_moe.cp_attention:_run_gemma4_flex_chunk",
        "_compiled_flex_attention(attention_module)(",
    ),
)

KIMI_FLEX_ATTENTION = _register(
    "kimi_linear_cp_flex_attention_stand_in",
    "forward",
    "nemo_automodel.components.models.kimi_linear.cp._compiled_flex_attention (torch.compile(flex_attention); a "
    "stand-in, stack/flex_attention.py)",
    "Kimi-Linear's MLA layers under context parallelism attend their local queries to the all-gathered, locally "
    "expanded keys and values through torch.compile'd flex_attention with a document-causal block mask; Dynamo "
    "refuses fake tensors and eager flex_attention refuses a CPU backward. The stand-in keeps what the compiled kernel "
    "keeps (q, k, v, output, fp32 log-sum-exp and max scores); the gather, the expansion, the head-dim padding and "
    "torch's own create_block_mask run as written.",
    _source_has(
        "nemo_automodel.components.models.kimi_linear.cp:document_causal_flex_attention",
        "_compiled_flex_attention()(",
    ),
)


LIGER = _register(
    "liger_kernel_stand_in",
    "build",
    "nemo_automodel._transformers.kernel_patches.liger_kernel_trf / HAS_LIGER_KERNEL (stack/liger.py)",
    "AutoModel patches a Hugging Face class with Liger Kernel by default (use_liger_kernel, without TP or CP), which "
    "its container installs and this machine cannot run (Triton on CUDA). The stand-in replaces what Liger's instance "
    "patch replaces on the classes it covers (RMSNorm, SwiGLU MLP), keeping what Liger's kernels keep for backward.",
    lambda: (
        _resolve("nemo_automodel._transformers.kernel_patches:HAS_LIGER_KERNEL"),
        _source_has(
            "nemo_automodel._transformers.kernel_patches:_patch_liger_kernel",
            "liger_kernel_trf._apply_liger_kernel_to_instance(model=model)",
        )(),
    ),
)


@contextlib.contextmanager
def liger_stand_in() -> Iterator[Any]:
    """Liger's stand-in where AutoModel looks for Liger, while the model is built; yields it (what it patched)."""
    import nemo_automodel._transformers.kernel_patches as kp

    from .liger import Stub

    stub = Stub()
    with _patched(kp, "HAS_LIGER_KERNEL", True), _patched(kp, "liger_kernel_trf", stub):
        yield stub
    LIGER.hits += len(stub.applied)


def install_te_attention() -> None:
    """Put the TE attention stand-in in place (after AutoModel is imported, so its import-time TE flags stay off)."""
    from . import te_attention

    if te_attention.install():
        TE_ATTENTION.hits += 1


def install_fla_gdn() -> None:
    """Put the fla stand-ins (Gated DeltaNet's and KDA's) in place before the model is built (its layers bind the
    kernels then)."""
    from . import fla_gdn, fla_kda

    fla_kda.install()
    fla_gdn.on_call = FLA_GDN.count
    fla_gdn.on_cp_context = FLA_CP.count
    fla_kda.on_call = FLA_KDA.count


def install_ffpa() -> None:
    """Put the stand-ins for FFPA's CuTeDSL kernels in place (AutoModel imports the package and looks its operators
    up per call); their calls are counted."""
    from . import ffpa

    ffpa.install()
    ffpa.on_call = FFPA.count


def install_flash_varlen() -> None:
    """Put the stand-ins for flash-attn's kernels in place for AutoModel's block-diagonal CP (it imports them at each
    call); their calls are counted."""
    from . import flash_varlen

    flash_varlen.install()
    flash_varlen.on_call = FLASH_VARLEN.count


def install_glm_dsa() -> None:
    """Put the stand-ins for GLM-5.2's vendored TileLang DSA kernels in place (their Functions look them up per call);
    their calls are counted."""
    from . import glm_dsa

    glm_dsa.install()
    glm_dsa.on_call = GLM_DSA.count


def install_glm_cudnn_dsa() -> None:
    """Put the stand-ins for GLM-5.2's cuDNN DSA and FlashMLA kernels in place (AutoModel's adapters look them up at
    each call); their calls are counted."""
    from . import glm_cudnn_dsa

    glm_cudnn_dsa.install()
    glm_cudnn_dsa.on_call = GLM_CUDNN_DSA.count


def install_dsv4_tilelang() -> None:
    """Put the stand-ins for DeepSeek-V4's vendored TileLang kernels in place (its interfaces build them per call);
    their calls are counted."""
    from . import dsv4_tilelang

    dsv4_tilelang.install()
    dsv4_tilelang.on_call = DSV4_TILELANG.count
    dsv4_tilelang.on_sinkhorn_call = DSV4_SINKHORN.count


def install_mamba_ssd(*, transformers_class: str | None = None) -> None:
    """Put the mamba_ssm stand-in in place before the step (AutoModel's Mamba-2 mixers import it in forward); its
    calls are counted. ``transformers_class``: an architecture of HF_MAMBA_KERNELS, whose transformers module's
    kernels (bound when it was imported) are rebound to the stand-ins, causal_conv1d's included."""
    from . import mamba_ssd

    hf = HF_MAMBA_KERNELS.get(transformers_class or "")
    if not mamba_ssd.install(causal_conv1d=hf is not None):  # (the real mamba_ssm runs where it is installed)
        return
    mamba_ssd.on_call = MAMBA_SSD.count
    if hf is not None:
        _bind_transformers_mamba(mamba_ssd, *hf)


def _bind_transformers_mamba(kernels: Any, module_name: str, shim: Shim) -> None:
    """transformers' module resolved its kernels when it was imported, before the stand-ins existed (the torch
    fallbacks): bind the stand-ins in their place, their keywords filtered as transformers' own wrapper does
    (integrations/hub_kernels.use_kernel_func_from_hub_with_fallback)."""
    module = importlib.import_module(module_name)

    def bound(kernel: Callable[..., Any]) -> Callable[..., Any]:
        accepted = set(inspect.signature(kernel).parameters)

        def call(*args: Any, **kwargs: Any) -> Any:
            shim.count()
            return kernel(*args, **{k: v for k, v in kwargs.items() if k in accepted})

        return call

    module.causal_conv1d_fn = bound(kernels.causal_conv1d_fn)
    module.mamba2_chunk_scan = bound(kernels.mamba_chunk_scan_combined)
    module.mamba2_split_conv1d_scan_combined = bound(kernels.mamba_split_conv1d_scan_combined)


LOCAL_DISPATCH = _register(
    "local_dispatch_stand_in",
    "forward",
    "nemo_automodel.components.moe.experts:GroupedExperts._gather_ep_inputs, and the EP all-reduce in the forward "
    "of GroupedExperts and its LoRA and MXFP4 twins (_GATHERING_EXPERTS; stack/dispatch.py)",
    "DeepEP, HybridEP and UCCL-EP need CUDA and run as AutoModel's torch dispatcher, which all-gathers the whole EP "
    "group's tokens and all-reduces an fp32 output of that size; the stand-in keeps the exchange on the rank, as "
    "those dispatchers deliver only the rows this rank's experts need, through AutoModel's own expert GEMMs.",
    lambda: (
        _has_params(
            "nemo_automodel.components.moe.experts:GroupedExperts._gather_ep_inputs",
            "x",
            "token_mask",
            "weights",
            "indices",
            "ep_group",
            "ep_size",
        )(),
        _source_has(
            "nemo_automodel.components.moe.experts:GroupedExperts.forward",
            "self._gather_ep_inputs(",
            "dist_nn_f.all_reduce(",
            "sum(gathered_lens[:ep_rank])",
        )(),
        *(
            _source_has(
                f"{path}.forward", "self._gather_ep_inputs(", "dist_nn_f.all_reduce(", "sum(gathered_lens[:ep_rank])"
            )()
            for path in _GATHERING_EXPERTS[1:]
        ),
    ),
)


COMPILED_ACTIVATIONS = _register(
    "compiled_expert_activations",
    "forward",
    "nemo_automodel.components.moe.experts: its @torch.compile(fullgraph=True) expert activations "
    "(quick_geglu_deepep, swiglu_oai_deepep, relu2_deepep, swiglu_clamped_deepep)",
    "Dynamo refuses fake tensors, so a compiled function runs eagerly and keeps every intermediate of its pointwise "
    "graph (clamps, sigmoid, products: several I-wide tensors per routed token). Compiled, Inductor fuses the graph "
    "into one kernel that writes its output alone, and AOTAutograd's partitioner keeps the graph's inputs and "
    "recomputes the pointwise ops in backward; the stand-in keeps its tensor inputs and, on fake tensors, makes its "
    "output alone (on real tensors it computes it eagerly, without autograd).",
    lambda: _compiled_activations(),
)
_COMPILED = ("quick_geglu_deepep", "swiglu_oai_deepep", "relu2_deepep", "swiglu_clamped_deepep")


def _compiled_activations() -> dict[str, Callable[..., Any]]:
    """The eager functions behind the compiled activations (torch.compile returns the function itself where Dynamo is
    disabled, as in the dry run's worker; or the function behind the stand-in, once installed)."""
    out = {}
    for name in _COMPILED:
        fn = _resolve(f"nemo_automodel.components.moe.experts:{name}")
        eager = getattr(fn, "_stand_in_for", None) or getattr(fn, "_torchdynamo_orig_callable", None) or fn
        if list(inspect.signature(eager).parameters)[:2] != ["x", "permuted_probs"]:
            raise RuntimeError(f"nemo_automodel.components.moe.experts.{name} no longer takes (x, permuted_probs)")
        out[name] = eager
    return out


def _output_width_divisor(name: str, eager: Callable[..., Any]) -> int:
    """How many of a compiled activation's input columns make one output column (relu2 1; the gated ones, whose
    input holds the gate and the up halves, 2), read off the eager function on a tiny real tensor."""
    import torch

    kwargs = {
        p.name: 1.0
        for p in list(inspect.signature(eager).parameters.values())[2:]
        if p.default is inspect.Parameter.empty
    }
    out = eager(torch.ones(2, 8), torch.ones(2, 1), **kwargs)
    if out.shape[:-1] != (2,) or 8 % out.shape[-1] or out.dtype != torch.float32:
        raise RuntimeError(f"nemo_automodel.components.moe.experts.{name} no longer maps [n, w] to [n, w / k]")
    return 8 // out.shape[-1]


def install_compiled_activations() -> None:
    """AutoModel's compiled expert activations keep what a compiled graph keeps (their inputs) and make what its fused
    kernel makes (its output alone, on fake tensors), in this process."""
    import nemo_automodel.components.moe.experts as experts
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    def fused(eager: Callable[..., Any], divisor: int) -> Callable[..., Any]:
        class Fused(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: Any, probs: Any, kwargs: dict[str, Any]) -> Any:
                ctx.save_for_backward(x, probs)
                if isinstance(x, FakeTensor):  # the fused kernel's one allocation: no eager intermediates
                    return x.new_empty((*x.shape[:-1], x.shape[-1] // divisor))
                with torch.no_grad():
                    return eager(x, probs, **kwargs)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                x, probs = ctx.saved_tensors
                return torch.empty_like(x), torch.empty_like(probs), None

        @functools.wraps(eager)
        def call(x: Any, permuted_probs: Any, **kwargs: Any) -> Any:
            COMPILED_ACTIVATIONS.hits += 1
            return Fused.apply(x, permuted_probs, kwargs)

        call._stand_in_for = eager  # type: ignore[attr-defined]
        return call

    for name, eager in _compiled_activations().items():
        if getattr(getattr(experts, name), "_stand_in_for", None) is None:
            setattr(experts, name, fused(eager, _output_width_divisor(name, eager)))


TE_CROSS_ENTROPY = _register(
    "te_cross_entropy_stand_in",
    "loss",
    "nemo_automodel.components.loss.te_parallel_ce: cross_entropy_forward / cross_entropy_backward, "
    "HAVE_TE_PARALLEL_CE",
    "TEParallelCrossEntropy runs Transformer Engine's Triton kernels (CUDA): their forward writes the gradient into "
    "the logits' own buffer, which the autograd function keeps, and the backward scales it in place. The stand-in "
    "does the same with no arithmetic, so the step keeps the logits and nothing else for the loss.",
    _source_has(
        "nemo_automodel.components.loss.te_parallel_ce:CrossEntropyFunction.forward",
        "cross_entropy_forward(",
        "ctx.save_for_backward(_input.detach())",
    ),
)


@contextlib.contextmanager
def te_cross_entropy() -> Iterator[None]:
    """TEParallelCrossEntropy's Triton kernels as stand-ins that keep what they keep (the logits, written in place)."""
    import nemo_automodel.components.loss.te_parallel_ce as te_ce
    import torch

    def forward(_input: Any, target: Any, label_smoothing: Any, reduce_loss: bool, group: Any, ignore: Any) -> Any:
        TE_CROSS_ENTROPY.hits += 1
        shape = () if reduce_loss else target.shape
        return torch.zeros(shape, dtype=torch.float32, device=_input.device), _input

    def backward(_input: Any, grad_output: Any) -> Any:
        return _input

    with (
        _patched(te_ce, "HAVE_TE_PARALLEL_CE", True),
        _patched(te_ce, "cross_entropy_forward", forward),
        _patched(te_ce, "cross_entropy_backward", backward),
    ):
        yield


# The expert classes whose forward gathers the EP group's tokens and all-reduces the combined output
_GATHERING_EXPERTS = (
    "nemo_automodel.components.moe.experts:GroupedExperts",
    "nemo_automodel.components._peft.lora_experts:GroupedExpertsLoRA",
    "nemo_automodel.components.moe.quantized_experts:GroupedExpertsMXFP4",
    "nemo_automodel.components._peft.lora_experts_mxfp4:GroupedExpertsLoRAMXFP4",
)


@contextlib.contextmanager
def local_dispatch(enabled: bool) -> Iterator[None]:
    """The experts' token exchange kept on the rank (stack/dispatch.py) while ``enabled``."""
    if not enabled:
        yield
        return
    from nemo_automodel.components.moe.experts import GroupedExperts

    from . import dispatch

    def gather(*args: Any, **kwargs: Any) -> Any:
        LOCAL_DISPATCH.hits += 1
        return dispatch.local_gather(*args, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(GroupedExperts, "_gather_ep_inputs", staticmethod(gather)))
        for path in _GATHERING_EXPERTS:
            cls = _resolve(path)
            stack.enter_context(_patched(cls, "forward", dispatch.local_forward(cls.__dict__["forward"])))
        yield


# ----------------------------------------------------------------------------------------------------- build
CUDA_DEVICE = _register(
    "cuda_current_device",
    "build",
    "torch.cuda.current_device (answers 0)",
    "from_config and _build_model call torch.cuda.current_device() unconditionally; only the index is used (the "
    "device itself is replaced by infrastructure_cpu_device).",
    _source_has(
        "nemo_automodel._transformers.auto_model:_BaseNeMoAutoModelClass._build_model",
        "torch.cuda.current_device()",
    ),
)
CPU_DEVICE = _register(
    "infrastructure_cpu_device",
    "build",
    "nemo_automodel._transformers.auto_model.apply_model_infrastructure / instantiate_infrastructure (device= cpu)",
    "_build_model hands cuda:0 to apply_model_infrastructure and from_config to instantiate_infrastructure; the meshes "
    "are CPU meshes on the fake process group, so the weights must be materialised on the CPU device.",
    lambda: (
        _has_params("nemo_automodel._transformers.auto_model:apply_model_infrastructure", "device")(),
        _has_params("nemo_automodel._transformers.auto_model:instantiate_infrastructure", "device")(),
    ),
)
FAKE_INIT = _register(
    "fake_weight_materialisation",
    "build",
    "Checkpointer.initialize_model_weights (run inside the dry run's FakeTensorMode)",
    "AutoModel builds on the meta device and materialises the weights after wrapping; running only that step under "
    "FakeTensorMode makes every local shard a fake tensor (nothing allocated) while everything before it (PEFT "
    "surgery, dtype casts, TP/FSDP wrapping) runs on meta exactly as AutoModel runs it.",
    _has_params(
        "nemo_automodel.components.checkpoint.checkpointing:Checkpointer.initialize_model_weights",
        "model",
        "device",
        "peft_init_method",
    ),
)
PRETRAINED_PP_INIT = _register(
    "pretrained_pp_skip_init",
    "build",
    "each pipeline part gets _skip_init_weights_on_load before initialize_model_weights (from_pretrained under PP)",
    "The dry run builds through from_config (no checkpoint to load), which initializes every parameter randomly after "
    "sharding; a recipe's from_pretrained under PP sets _skip_init_weights_on_load on each part first "
    "(infrastructure.py, load_base_model), so AutoModel skips that initialization and its dtype cast (which, run on "
    "sharded parameters, turns a strict-fp32 parameter's local shard bf16: MiniMax-M2's router gate) and loads the "
    "checkpoint into the materialised shards instead, which allocates nothing the step keeps.",
    _source_has(
        "nemo_automodel._transformers.infrastructure:apply_model_infrastructure",
        "autopipeline is not None and load_base_model",
        "mp._skip_init_weights_on_load = True",
    ),
)
RETIE = _register(
    "fake_init_retie",
    "build",
    "parameters shared by several modules before initialize_model_weights are shared again after it",
    "to_empty keeps a parameter's identity only when old and new tensors have compatible types; meta -> fake is not "
    "(meta -> cuda is), so plain-tensor layouts (one rank) would untie lm_head from the embedding.",
    _has_params("nemo_automodel.components.checkpoint.checkpointing:to_empty_parameters_only", "model", "device"),
)
FAKE_APPLY = _register(
    "module_apply_on_fake_params",
    "build",
    "torch.nn.Module._apply on plain fake parameters (replaces each converted parameter instead of swapping it)",
    "cast_model_to_dtype converts through model._apply when some parameters keep their dtype (PEFT adapters); on one "
    "rank the parameters are plain fake tensors, which nn.Module._apply swaps in place, and a fake tensor's weak "
    "references refuse the swap. The parameters come out with the same dtypes and shapes; ties are restored after "
    "the initialization as for to_empty.",
    _source_has("torch.nn.modules.module:Module._apply", "isinstance(param, FakeTensor)", "swap_tensors"),
)
PP_WARMUP = _register(
    "pp_warmup_noop",
    "build",
    "nemo_automodel.components.distributed.pipelining.functional._warmup_pipeline_stage_neighbors (no-op)",
    "It sleeps 2 s per global rank of the first stage when no GPU is visible, exchanges one element with the "
    "neighbour stages (NCCL warm-up) and calls torch.cuda.synchronize(); none of it touches memory.",
    _source_has(
        "nemo_automodel.components.distributed.pipelining.functional:pipeline_model",
        "_warmup_pipeline_stage_neighbors(stages[0])",
    ),
)
STAGE_COPY = _register(
    "pipeline_stage_copy_shares_dropped_layers",
    "build",
    "copy.deepcopy(model) in nemo_automodel.components.distributed.pipelining.functional's _build_stage_from_modules "
    "(the layers the stage drops are shared with the model in the copy, not copied)",
    "AutoModel builds each pipeline stage by deep-copying the whole meta-device model and then dropping from the copy "
    "the layers other stages hold; at full depth that copying is a large share of a rank's build (DeepSeek-V3.2: its "
    "61 layers copied for each of a rank's 7 stages). The copy is given the layers it is about to drop as they are "
    "(deepcopy's memo) and drops them as before, so the stage holds the same copied modules and never one of the "
    "model's (tests/integration/test_dry_run.py builds the stages both ways).",
    _source_has(
        "nemo_automodel.components.distributed.pipelining.functional:split_model_into_stages",
        "stage_model = copy.deepcopy(model)",
        "modules_to_keep = set(module_names)",
        'name.split(".")[-1] for name in modules_to_keep if name.startswith(f"{full_name}.")',
        "isinstance(module, (nn.ModuleDict, nn.ModuleList))",
    ),
)
META_INIT = _register(
    "meta_init_on_one_rank",
    "build",
    "nemo_automodel._transformers.auto_model.get_world_size_safe (answers at least 2 while from_config builds)",
    "On one rank AutoModel builds a Hugging Face class with real weights on the host (its meta-device init is for "
    "world size > 1 or its own classes), which would allocate the whole model in this process. Answering 2 to that "
    "one decision builds it on the meta device and materialises it as fake tensors: the same parameters, shapes and "
    "dtypes on the GPU; the parallelizer's own world-size checks (infrastructure.py) are not affected.",
    _source_has(
        "nemo_automodel._transformers.auto_model:_BaseNeMoAutoModelClass._build_model",
        "get_world_size_safe() > 1 or not is_hf_model",
    ),
)
EXPERTS_ON_META = _register(
    "experts_built_on_meta",
    "build",
    "nemo_automodel.components.moe.experts GroupedExperts / GroupedExpertsDeepEP.__init__ (under torch.device('meta') "
    "while auto_model's init_empty_weights is active)",
    "AutoModel's meta-device init (init_empty_weights) creates each parameter on the host and moves it to meta as it "
    "is registered: the routed experts' stacked weights are allocated on the host first, a tensor at a time (a "
    "DeepSeek-V4-Pro layer's gate-and-up tensor alone is 34 GB, more than this machine holds, where a GPU node's host "
    "has room). Creating them on meta "
    "directly gives the same meta parameters without the host allocation.",
    lambda: (
        _source_has(
            "nemo_automodel._transformers.auto_model:_BaseNeMoAutoModelClass._build_model", "init_empty_weights()"
        )(),
        _resolve("nemo_automodel.components.moe.experts:GroupedExperts.__init__"),
        _resolve("nemo_automodel.components.moe.experts:GroupedExpertsDeepEP.__init__"),
    ),
)
MODULE_TO = _register(
    "module_to_on_fake_params",
    "build",
    "torch.nn.Module.to (returns the module when its fake parameters are already on the target device)",
    "apply_model_infrastructure ends with model.to(device) when no parameter is a DTensor (one rank); moving fake "
    "parameters to the device they are on fails in nn.Module._apply's tensor swap.",
    _source_has("nemo_automodel._transformers.infrastructure:apply_model_infrastructure", "model.to(device"),
)


def dropped_layers(model: Any, module_names: list[str]) -> list[tuple[str, Any]]:
    """``(path, module)`` of the children of ``model``'s layer containers (ModuleList / ModuleDict) that AutoModel's
    ``_build_stage_from_modules`` drops from its copy for a stage that keeps ``module_names``: those whose name is not
    the last part of a kept name under the container (its own rule), in a container that is neither kept whole nor
    inside a kept module or another container (those it keeps or drops whole). Every registration is listed, a module
    registered twice twice."""
    import torch

    containers = (torch.nn.ModuleList, torch.nn.ModuleDict)
    keep = set(module_names)
    out = []
    for path, container in model.named_modules():
        if not path or not isinstance(container, containers):
            continue
        parts = path.split(".")
        above = [".".join(parts[:i]) for i in range(1, len(parts))]
        if path in keep or any(a in keep or isinstance(model.get_submodule(a), containers) for a in above):
            continue
        kept = {name.split(".")[-1] for name in keep if name.startswith(f"{path}.")}
        out += [(f"{path}.{name}", child) for name, child in container._modules.items() if name not in kept]
    return out


@contextlib.contextmanager
def stage_copies_share_dropped_layers() -> Iterator[None]:
    """While active, AutoModel's pipeline split copies only what each stage keeps (see STAGE_COPY). Where a dropped
    layer is also held at a place the stage keeps (a module registered twice), the stage is copied whole, as AutoModel
    copies it, and the shim says so in its notes."""
    import copy

    import nemo_automodel.components.distributed.pipelining.functional as pp_functional
    import torch

    class StageCopy(types.ModuleType):  # the ``copy`` module as functional.py sees it
        def __getattr__(self, name: str) -> Any:
            return getattr(copy, name)

        @staticmethod
        def deepcopy(obj: Any, memo: dict[int, Any] | None = None) -> Any:
            caller = sys._getframe(1)
            names = caller.f_locals.get("module_names") if caller.f_code is split_code else None
            if names is None or not isinstance(obj, torch.nn.Module):
                return copy.deepcopy(obj, memo)
            dropped = dropped_layers(obj, list(names))
            shared, paths = {id(m) for _, m in dropped}, {p for p, _ in dropped}
            trial = {} if memo is None else dict(memo)
            trial.update((id(m), m) for _, m in dropped)
            stage = copy.deepcopy(obj, trial)
            held = [p for p, m in stage.named_modules(remove_duplicate=False) if id(m) in shared and p not in paths]
            if not held:
                STAGE_COPY.hits += 1
                return stage
            STAGE_COPY.notes.append(f"copied whole: a dropped layer is also held at {held[0]}")
            return copy.deepcopy(obj, memo)

    split_code = next(
        c
        for c in pp_functional.split_model_into_stages.__code__.co_consts
        if isinstance(c, types.CodeType) and c.co_name == "_build_stage_from_modules"
    )
    with _patched(pp_functional, "copy", StageCopy("copy")):
        yield


def _shared_params(model: Any) -> list[list[tuple[Any, str]]]:
    groups: dict[int, list[tuple[Any, str]]] = {}
    for _, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is not None:
                groups.setdefault(id(p), []).append((mod, pname))
    return [g for g in groups.values() if len(g) > 1]


@contextlib.contextmanager
def _fake_apply() -> Iterator[None]:
    """Module._apply (``.to``, ``.float()``) on a module whose parameters are fake tensors: new Parameters in place of
    torch's swap_tensors, which refuses a fake tensor (its fake mode holds a weak reference to it)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    original_apply = torch.nn.Module._apply

    def apply(self: Any, fn: Any, recurse: bool = True) -> Any:
        own = [p for p in self._parameters.values() if p is not None]
        if not own or not all(isinstance(p, FakeTensor) for p in own):
            return original_apply(self, fn, recurse)
        FAKE_APPLY.hits += 1
        if recurse:
            for child in self.children():
                child._apply(fn)
        for key, param in list(self._parameters.items()):
            if param is not None:
                with torch.no_grad():
                    applied = fn(param)
                if applied is not param:
                    self._parameters[key] = torch.nn.Parameter(applied, requires_grad=param.requires_grad)
        for key, buf in list(self._buffers.items()):
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    with _patched(torch.nn.Module, "_apply", apply):
        yield


FULL_DEPTH_LAYER_GROUPS = _register(
    "full_depth_layer_groups",
    "build",
    "nemo_automodel.components.distributed.parallelizer:_discover_layer_groups",
    "Where a class names no layer groups, AutoModel finds them by structure: per group (language, vision, audio by "
    "path names) the longest ModuleList. A shallow build's decoder list is shorter than the model's, so a longer list "
    "in the same group (Muse-Glimmer's 50 tower blocks under vision_encoder.transformer, a path AutoModel does not name "
    "as a tower) would take the place the decoder list takes at full depth, and with it the activation checkpointing "
    "and per-layer FSDP wrapping. While a shallow build is parallelized, the decoder list is ranked at the model's "
    "layer count; AutoModel's own discovery runs as written.",
    _source_has(
        "nemo_automodel.components.distributed.parallelizer:_discover_layer_groups",
        "candidates.setdefault(group, []).append((len(module), path, module))",
        "max(group_candidates",
    ),
)


@contextlib.contextmanager
def full_depth_layer_groups(built: int, full: int) -> Iterator[None]:
    """AutoModel's structural layer discovery sees a shallow build's decoder list (each ModuleList or ModuleDict named
    ``layers`` of ``built`` entries) at the model's ``full`` layer count (see FULL_DEPTH_LAYER_GROUPS)."""
    import nemo_automodel.components.distributed.parallelizer as parallelizer
    import torch

    discover = parallelizer._discover_layer_groups
    if built == full:
        yield
        return
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict)  # (AutoModel's MoE classes keep a ModuleDict by index)
    at_full = {
        kind: type(f"{kind.__name__}AtFullDepth", (kind,), {"__len__": lambda self: full}) for kind in containers
    }

    def at_full_depth(model: Any) -> Any:
        # each container once, found as a registered child named layers (not through a property that hands back a
        # child's list: the same container would be found twice)
        found: dict[int, Any] = {}
        for m in model.modules():
            layers = m._modules.get("layers")
            if type(layers) in containers and len(layers) == built:
                found.setdefault(id(layers), layers)
        swapped: list[tuple[Any, type]] = []
        try:
            for layers in found.values():
                swapped.append((layers, type(layers)))
                layers.__class__ = at_full[type(layers)]
            groups = discover(model)
        finally:
            for layers, kind in swapped:
                layers.__class__ = kind
        shallow = discover(model)
        if any(groups.get(k, [None])[0] is not shallow.get(k, [None])[0] for k in groups.keys() | shallow.keys()):
            FULL_DEPTH_LAYER_GROUPS.count()  # (a discovery whose choice the shallow build would have made otherwise)
        return groups

    with _patched(parallelizer, "_discover_layer_groups", at_full_depth):
        yield


@contextlib.contextmanager
def build_patches(fake_mode: Any, *, pretrained_pp: bool = False) -> Iterator[None]:
    """What from_config needs on a CPU, on fake tensors. ``pretrained_pp``: the recipe's from_pretrained under PP,
    whose pipeline parts AutoModel initializes as it does before loading the checkpoint (see PRETRAINED_PP_INIT)."""
    import nemo_automodel._transformers.auto_model as am
    import torch
    from nemo_automodel.components.checkpoint.checkpointing import Checkpointer
    from torch._subclasses.fake_tensor import FakeTensor

    with contextlib.ExitStack() as stack:
        stack.enter_context(_cpu_build(infrastructure_on_cpu=True))  # the fake process group's meshes are CPU meshes
        real_world = am.get_world_size_safe

        def world_for_meta_init() -> int:
            size = real_world()
            if size < 2:
                META_INIT.hits += 1
            return max(size, 2)

        stack.enter_context(_patched(am, "get_world_size_safe", world_for_meta_init))

        import nemo_automodel.components.moe.experts as experts

        meta_init = [False]
        empty_weights = am.init_empty_weights

        @contextlib.contextmanager
        def init_empty_weights() -> Iterator[None]:
            meta_init.append(True)
            try:
                with empty_weights():
                    yield
            finally:
                meta_init.pop()

        def on_meta(init: Any) -> Any:
            @functools.wraps(init)
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
                if not meta_init[-1]:
                    return init(self, *args, **kwargs)
                EXPERTS_ON_META.hits += 1
                with torch.device("meta"):
                    return init(self, *args, **kwargs)

            return __init__

        stack.enter_context(_patched(am, "init_empty_weights", init_empty_weights))
        for cls in (experts.GroupedExperts, experts.GroupedExpertsDeepEP):
            stack.enter_context(_patched(cls, "__init__", on_meta(cls.__init__)))

        init = Checkpointer.__dict__["initialize_model_weights"]
        init_fn = init.__func__ if isinstance(init, staticmethod) else init

        @functools.wraps(init_fn)
        def initialize_model_weights(model: Any, device: Any, peft_init_method: Any = None) -> Any:
            FAKE_INIT.hits += 1
            if pretrained_pp:
                PRETRAINED_PP_INIT.hits += 1
                model._skip_init_weights_on_load = True
            ties = _shared_params(model)
            with fake_mode, _fake_apply():
                out = init_fn(model, device, peft_init_method=peft_init_method)
            for group in ties:
                keep = group[0][0]._parameters[group[0][1]]
                for mod, name in group[1:]:
                    if mod._parameters[name] is not keep:
                        RETIE.hits += 1
                        mod._parameters[name] = keep
            return out

        stack.enter_context(_patched(Checkpointer, "initialize_model_weights", staticmethod(initialize_model_weights)))

        original_to = torch.nn.Module.to

        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
            params = list(self.parameters())
            if (
                params
                and dtype is None
                and device is not None
                and all(isinstance(p, FakeTensor) for p in params)
                and all(t.device.type == torch.device(device).type for t in [*params, *self.buffers()])
            ):
                MODULE_TO.hits += 1
                return self
            return original_to(self, *args, **kwargs)

        stack.enter_context(_patched(torch.nn.Module, "to", to))
        stack.enter_context(flash_sdpa())
        stack.enter_context(stage_copies_share_dropped_layers())
        yield


# ----------------------------------------------------------------------------------------------- real tensors
CUDA_FACTORIES = _register(
    "cuda_factories_on_cpu",
    "build",
    "torch functions called with device=cuda[:N] (and Tensor.to(cuda)) run on the CPU (a TorchFunctionMode)",
    "Some AutoModel classes create buffers and RoPE tables on a hard-coded cuda:N device (Qwen3-MoE's and DeepSeek's "
    "buffer_device, the MoE experts' scratch); on a machine without CUDA those calls run on the CPU instead. Only "
    "the smoke run on AutoModel's stack uses it (real tensors on gloo); the dry run builds on fake CPU tensors.",
    lambda: (
        _resolve("torch.overrides:TorchFunctionMode"),
        _source_has("nemo_automodel.components.models.qwen3_moe.model:Qwen3MoeModel.__init__", "cuda:")(),
    ),
)


@contextlib.contextmanager
def cuda_factories_on_cpu() -> Iterator[None]:
    """While active, ``device=cuda...`` arguments of torch functions mean the CPU (no-op where CUDA exists)."""
    import torch
    from torch.overrides import TorchFunctionMode

    if torch.cuda.is_available():
        yield
        return

    def on_cpu(device: Any) -> bool:
        return isinstance(device, (str, torch.device)) and torch.device(device).type == "cuda"

    class CpuDevices(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if on_cpu(kwargs.get("device")):
                CUDA_FACTORIES.hits += 1
                kwargs = {**kwargs, "device": "cpu"}
            if func is torch.Tensor.to and len(args) > 1 and on_cpu(args[1]):
                CUDA_FACTORIES.hits += 1
                args = (args[0], "cpu", *args[2:])
            return func(*args, **kwargs)

    with CpuDevices():
        yield


CP_MATH = _register(
    "cp_attention_math_on_cpu",
    "forward",
    "SDPA backends [FLASH, EFFICIENT] chosen by AutoModel's CP train context -> [MATH] on a CPU; torch's CP "
    "head-tail load balancing off",
    "Under context parallelism AutoModel pins SDPA to the flash and memory-efficient kernels (get_train_context), "
    "which torch's context-parallel attention shards only on CUDA; on a CPU the flash kernel has no DTensor rule. "
    "SDPA's math kernel on the sequence-sharded DTensors computes exact attention (DTensor gathers K and V), with "
    "contiguous chunks: the head-tail load balancer reorders the sequence, which the math kernel's causal mask does "
    "not follow. Only the smoke run on AutoModel's stack uses it; what AutoModel shards (inputs, labels, positions) "
    "and restores is its own.",
    lambda: (
        _source_has(
            "nemo_automodel.components.distributed.context_parallel.utils:get_train_context",
            "sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])",
        )(),
        _resolve("nemo_automodel._transformers.kernel_patches:sdpa_kernel"),
        _resolve("nemo_automodel.components.distributed.activation_checkpointing:sdpa_kernel"),
        _resolve("torch.distributed.tensor.experimental._context_parallel._attention:_cp_options"),
    ),
)


@contextlib.contextmanager
def cp_attention_math_on_cpu() -> Iterator[None]:
    """See CP_MATH (no-op where CUDA exists)."""
    import torch
    import torch.nn.attention as attention
    from torch.distributed.tensor.experimental._context_parallel._attention import _cp_options

    if torch.cuda.is_available():
        yield
        return
    plain = attention.sdpa_kernel

    def sdpa_kernel(backends: Any, *args: Any, **kwargs: Any) -> Any:
        listed = backends if isinstance(backends, (list, tuple)) else [backends]
        if attention.SDPBackend.MATH not in listed:
            CP_MATH.hits += 1
            backends = [attention.SDPBackend.MATH]
        return plain(backends, *args, **kwargs)

    import nemo_automodel._transformers.kernel_patches as kernel_patches
    import nemo_automodel.components.distributed.activation_checkpointing as ac
    from torch.distributed.tensor.experimental import implicit_replication

    balanced = _cp_options.enable_load_balance
    _cp_options.enable_load_balance = False
    try:
        with contextlib.ExitStack() as stack:
            # the CP train context's own pin, and the pin AutoModel wraps a Hugging Face model's forward in
            # (_patch_attention) and restores in checkpoint recompute
            for module in (attention, kernel_patches, ac):
                stack.enter_context(_patched(module, "sdpa_kernel", sdpa_kernel))
            stack.enter_context(implicit_replication())  # the math kernel's causal mask meets sharded scores
            yield
    finally:
        _cp_options.enable_load_balance = balanced


@contextlib.contextmanager
def _cpu_build(*, infrastructure_on_cpu: bool) -> Iterator[None]:
    """What from_config needs on a machine without CUDA, fake or real tensors alike: CUDA's device index, a stream
    placeholder, the infrastructure on the CPU device (``infrastructure_on_cpu``: also where CUDA exists), no pipeline
    warm-up sleep."""
    import nemo_automodel._transformers.auto_model as am
    import nemo_automodel.components.distributed.pipelining.functional as pp_functional
    import torch

    cpu = torch.device("cpu")
    with contextlib.ExitStack() as stack:
        if not torch.cuda.is_available():

            def current_device() -> int:
                CUDA_DEVICE.hits += 1
                return 0

            stack.enter_context(_patched(torch.cuda, "current_device", current_device))
            stack.enter_context(_patched(torch.cuda, "Stream", _no_stream(CUDA_STREAM)))
        if infrastructure_on_cpu or not torch.cuda.is_available():

            def on_cpu(fn: Callable[..., Any]) -> Callable[..., Any]:
                @functools.wraps(fn)
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    CPU_DEVICE.hits += 1
                    kwargs["device"] = cpu
                    return fn(*args, **kwargs)

                return wrapper

            stack.enter_context(_patched(am, "apply_model_infrastructure", on_cpu(am.apply_model_infrastructure)))
            stack.enter_context(_patched(am, "instantiate_infrastructure", on_cpu(am.instantiate_infrastructure)))

        def no_warmup(stage: Any) -> None:
            PP_WARMUP.hits += 1

        stack.enter_context(_patched(pp_functional, "_warmup_pipeline_stage_neighbors", no_warmup))
        yield


@contextlib.contextmanager
def real_build_patches() -> Iterator[None]:
    """What from_config needs with real tensors (the smoke run on AutoModel's stack): :func:`_cpu_build` where there
    is no CUDA, and cuda:N factory calls on the CPU."""
    with _cpu_build(infrastructure_on_cpu=False), cuda_factories_on_cpu():
        yield


# ----------------------------------------------------------------------------------------------------- values
ITEM = _register(
    "item_oracle",
    "forward",
    "torch's fake implementations of aten._local_scalar_dense / aten.item (.item(), float(t), int(t), bool(t))",
    "A fake tensor has no values. AutoModel reads a few (a logged parameter norm, RoPE's cache length from "
    "position_ids.max(), the TP-replica gradient counts, torch's truncated-normal init loop). Each is answered from a "
    "table keyed by the calling function; an unknown call site raises, so a new read in a release is seen.",
    _fake_op("_local_scalar_dense", "item"),
)
SHAPES = _register(
    "dynamic_shape_oracle",
    "forward",
    "torch's fake implementation of aten.nonzero (and boolean-mask indexing) plus one for aten.bincount",
    "AutoModel's MoE experts select their tokens with boolean masks and count them with bincount, whose output sizes "
    "depend on values. They are answered for balanced routing: each rank's experts receive 1/ep of the assignments.",
    _fake_op("nonzero"),
)
MESH = _register(
    "device_mesh_real_tensors",
    "backward",
    "DeviceMesh.mesh, DeviceMesh._concatenate and tp_replicas._is_tp_replicated run outside the fake mode",
    "They read a mesh's small rank tensor, which inside the fake mode would come out fake; mesh coordinates are not "
    "training data.",
    lambda: (
        _resolve("torch.distributed.device_mesh:DeviceMesh.mesh"),
        _resolve("torch.distributed.device_mesh:DeviceMesh._concatenate"),
        _resolve("nemo_automodel.components.distributed.tp_replicas:_is_tp_replicated"),
    ),
)
PROPAGATION = _register(
    "dtensor_propagation_private_fake_mode",
    "forward",
    "torch.distributed.tensor._sharding_prop.detect_fake_mode (returns None during the step)",
    "DTensor's sharding propagation runs ops on global-shape scratch tensors in the active fake mode; given none, it "
    "uses a private one, so the memory tracker does not charge those scratch tensors to the rank (TP layouts).",
    lambda: _resolve("torch.distributed.tensor._sharding_prop:detect_fake_mode"),
)
SDPA = _register(
    "sdpa_as_flash",
    "forward",
    "torch.nn.functional.scaled_dot_product_attention -> aten._scaled_dot_product_flash_attention (on fake tensors)",
    "On a GPU AutoModel's attention runs a flash kernel (SDPA's flash backend, Transformer Engine, flash-attn): it "
    "keeps the output and a per-row log-sum-exp, never the seq x seq score matrix the CPU's math backend would "
    "allocate. The CUDA flash kernel's shape function runs on the fake CPU tensors instead, so attention's memory is "
    "the GPU's; torch's context parallelism shards that same kernel, so ring attention runs as on a GPU.",
    lambda: (
        _meta_kernel(
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention",
        )(),
        _file_has(
            "torch.distributed.tensor.experimental._context_parallel._attention",
            "aten._scaled_dot_product_flash_attention.default",
        )(),
    ),
)

DROPOUT = _register(
    "dropout_as_on_cuda",
    "forward",
    "torch.nn.functional.dropout / torch.dropout -> torch.native_dropout (training, 0 < p < 1)",
    "torch's dropout takes its fused kernel (native_dropout: the backward keeps a bool mask) only on CUDA devices; "
    "on CPU tensors it multiplies by a noise tensor of the input's dtype and keeps that (bf16: twice the bytes). "
    "LoRA's dropout on every adapted projection made the fake-CPU step keep 2x the masks a GPU keeps.",
    lambda: _meta_kernel("native_dropout")(),
)

RMS_NORM = _register(
    "rms_norm_as_on_cuda",
    "forward",
    "torch.nn.functional.rms_norm -> aten._fused_rms_norm's memory (a stand-in, stack/rms_norm.py; FakeTensor inputs "
    "that are not DTensors, with no weight or one of the input's dtype)",
    "On a CUDA tensor F.rms_norm (nn.RMSNorm: AutoModel's rms_norm: torch backend; DeepSeek-V4's per-head query norm) "
    "runs aten._fused_rms_norm, whose autograd node keeps the input, the weight and an fp32 reciprocal RMS a row; on "
    "a CPU tensor it decomposes into ops that keep an fp32 copy of a bf16 input and, with a weight, the fp32 "
    "normalised input (up to 8 bytes an element where the GPU keeps the input itself). torch takes the fused kernel "
    "unless the weight's dtype differs from the input's or the input is complex; the stand-in takes the same cases. "
    "A DTensor input (a norm under sequence parallelism) reaches the fused kernel on a GPU too (DTensor shards it); "
    "the stand-in leaves it to the decomposition, which over-counts it.",
    lambda: (
        _resolve("torch.nn.functional:rms_norm"),
        _file_has("torch.nn.modules.normalization", "F.rms_norm(")(),
        _source_has("nemo_automodel.components.models.deepseek_v4.layers:_rms_norm_last_dim", "F.rms_norm(")(),
        _file_has("nemo_automodel.components.models.common.utils", "torch.nn.functional.rms_norm(x.float()")(),
    ),
)

CUDA_SYNC = _register(
    "cuda_synchronize_noop",
    "forward",
    "torch.cuda.synchronize (a no-op during the step)",
    "Gemma-4's tensor-parallel row reduction (gemma4_moe/parallelization.py, _ReduceFromTensorParallelRegion) waits "
    "for the device around its all-reduce; on a host without CUDA the call raises. Waiting allocates nothing.",
    _source_has(
        "nemo_automodel.components.models.gemma4_moe.parallelization:_ReduceFromTensorParallelRegion.forward",
        "torch.cuda.synchronize(local_output.device)",
    ),
)


def _megatron_fsdp(check: Callable[[], Any]) -> Callable[[], None]:
    """``check`` where megatron-fsdp is installed: without it AutoModel raises for the strategy itself (its
    "MegatronFSDP is not installed" assertion) and nothing of the package is bound."""

    def checked() -> None:
        if importlib.util.find_spec("megatron_fsdp") is not None:
            check()

    return checked


MEGATRON_FSDP_FAKE_BUILD = _register(
    "megatron_fsdp_fake_build",
    "build",
    "from_config inside FakeTensorMode under distributed.strategy megatron_fsdp",
    "Under MegatronFSDP AutoModel builds the model with real weights (from_config's is_meta_device is false for it: "
    "MegatronFSDP copies each parameter into its own buffers) and hands it to megatron_fsdp.fully_shard; a real build "
    "would allocate the whole model on the host. The build runs on fake tensors instead, the same code on the same "
    "shapes; weight initialisation runs as written. Its DTensors' checkpoint metadata (each rank's shard shape, "
    "pickled through all_gather_object and read on the host) is gathered outside fake mode, where the fake process "
    "group hands every rank this rank's own.",
    _megatron_fsdp(
        lambda: (
            _source_has(
                "nemo_automodel._transformers.auto_model:_BaseNeMoAutoModelClass._build_model", "MegatronFSDPConfig"
            )(),
            _resolve("megatron_fsdp:MegatronFSDP"),
        )
    ),
)
MEGATRON_FSDP_DEVICE = _register(
    "megatron_fsdp_device",
    "build",
    "megatron_fsdp.MegatronFSDP(device=None) -> the CPU",
    "AutoModel passes no device, and MegatronFSDP then takes cuda:<current device> for its parameter, gradient and "
    "main-weight buffers. The dry run's tensors are fake CPU tensors (the batch, the meshes; on a host with CUDA "
    "too), so its buffers are made there: the same sizes, counted on the rank the same way.",
    _megatron_fsdp(
        lambda: (
            _source_has("megatron_fsdp.megatron_fsdp:MegatronFSDP.__init__", "torch.cuda.current_device()")(),
            _source_has(
                "megatron_fsdp.megatron_fsdp:MegatronFSDP._init_fsdp_param_and_grad_buffer", "device=self.device"
            )(),
        )
    ),
)
MEGATRON_FSDP_RUNTIME = _register(
    "megatron_fsdp_runtime",
    "step",
    "torch.cuda.Stream / current_stream / stream while MegatronFSDP builds and steps (streams that order nothing)",
    "MegatronFSDP runs its parameter all-gathers and gradient reduce-scatters on side streams and orders them with "
    "wait_stream; a fake process group completes every collective at once and the tensors are fake CPU tensors, so "
    "the streams are placeholders, and an event they record is already complete. Streams order work; the bytes allocated are the "
    "tensors the pipelines make, which run as written: how far the all-gathers prefetch and how many unreduced "
    "gradient buckets the reduce-scatter queue keeps are decided on the host by size, not by timing.",
    _megatron_fsdp(
        lambda: (
            _source_has(
                "megatron_fsdp.megatron_fsdp:MegatronFSDP._init_fsdp_param_and_grad_buffer", "torch.cuda.Stream()"
            )(),
            _file_has("megatron_fsdp.param_and_grad_buffer", "torch.cuda.current_stream()")(),
            _file_has("megatron_fsdp.param_and_grad_buffer", ".record_event()")(),
        )
    ),
)

MEGATRON_FSDP_UNCOALESCED = _register(
    "megatron_fsdp_uncoalesced",
    "forward",
    "megatron_fsdp.param_and_grad_buffer._coalescing_manager (each collective issued on its own)",
    "MegatronFSDP batches a bucket group's all-gathers and reduce-scatters in torch's _coalescing_manager, which "
    "issues them as one coalesced op that torch's fake tensors have no implementation for. Issued one by one, they "
    "run on the same pre-allocated buffers: coalescing batches launches and allocates nothing.",
    _megatron_fsdp(
        lambda: (
            _resolve("megatron_fsdp.param_and_grad_buffer:_coalescing_manager"),
            _file_has("megatron_fsdp.param_and_grad_buffer", "with _coalescing_manager(")(),
        )
    ),
)

MEGATRON_FSDP_HELD = _register(
    "megatron_fsdp_held_buffers",
    "step",
    "MegatronFSDP's parameter groups' weight, main-weight and gradient buffers and its allocators' buckets, registered "
    "with the memory tracker as the step starts (stack/step.megatron_fsdp_buffers)",
    "MegatronFSDP makes its buffers when it wraps the model, and a tracker first sees a tensor when an operator makes "
    "or uses it: its gradient buffer's shards, which no operator touches until the first reduce-scatter writes them, "
    "would be missing from the step's early phases. They are registered, each with its category, when the tracker "
    "starts; the attributes read are checked here, so a renamed one fails the check instead of going unmeasured.",
    _megatron_fsdp(
        lambda: (
            _source_has(
                "megatron_fsdp.megatron_fsdp:MegatronFSDP._init_fsdp_param_and_grad_buffer",
                "self.param_and_grad_buffer = ",
                "self.all_gather_pipeline = ",
            )(),
            _source_has(
                "megatron_fsdp.param_and_grad_buffer:ParameterGroup",
                "params:",
                "model_weight_buffer:",
                "transpose_weight_buffer:",
                "main_weight_buffer:",
                "main_grad_buffer:",
            )(),
            _source_has(
                "megatron_fsdp.param_and_grad_buffer:DataParallelBuffer.__init__", "self.temporary_bucket_allocator = "
            )(),
            _source_has("megatron_fsdp.param_and_grad_buffer:DataParallelBuffer.init_data", "self.data = data")(),
            _source_has("megatron_fsdp.param_and_grad_buffer:TemporaryBucketAllocator.__init__", "self.buckets = ")(),
        )
    ),
)


class _Done:
    """A collective's work handle, already complete (the fake process group's are)."""

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


@contextlib.contextmanager
def _uncoalesced(group: Any = None, device: Any = None, async_ops: bool = False) -> Iterator[_Done]:
    MEGATRON_FSDP_UNCOALESCED.hits += 1
    yield _Done()


class _NoStream:
    """A CUDA stream's surface, ordering nothing (work on fake CPU tensors)."""

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _Done()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def _no_stream(shim: Shim) -> Callable[..., _NoStream]:
    """``torch.cuda.Stream``'s stand-in, counted on ``shim``."""

    def make(*args: Any, **kwargs: Any) -> _NoStream:
        shim.count()
        return _NoStream()

    return make


@contextlib.contextmanager
def megatron_fsdp_runtime() -> Iterator[None]:
    """MegatronFSDP's streams as placeholders (:data:`MEGATRON_FSDP_RUNTIME`; the dry run's tensors are fake CPU
    tensors on a host with CUDA too), its collectives uncoalesced (:data:`MEGATRON_FSDP_UNCOALESCED`)."""
    import megatron_fsdp.param_and_grad_buffer as buffers
    import torch

    stream = _no_stream(MEGATRON_FSDP_RUNTIME)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(buffers, "_coalescing_manager", _uncoalesced))
        stack.enter_context(_patched(torch.cuda, "Stream", stream))
        stack.enter_context(_patched(torch.cuda, "current_stream", lambda device=None: stream()))
        stack.enter_context(_patched(torch.cuda, "stream", lambda s: contextlib.nullcontext()))
        yield


@contextlib.contextmanager
def megatron_fsdp_build(fake_mode: Any) -> Iterator[None]:
    """AutoModel's build under MegatronFSDP on fake tensors, its buffers on the CPU device the dry run's fake tensors
    use (whether or not the host has CUDA)."""
    import torch
    from megatron_fsdp import MegatronFSDP

    init = MegatronFSDP.__dict__["__init__"]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, device: Any = None, **kwargs: Any) -> None:
        if device is None:
            MEGATRON_FSDP_DEVICE.hits += 1
            device = torch.device("cpu")
        init(self, *args, device=device, **kwargs)

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(MegatronFSDP, "__init__", __init__))
        stack.enter_context(megatron_fsdp_runtime())
        MEGATRON_FSDP_FAKE_BUILD.hits += 1
        stack.enter_context(fake_mode)
        stack.enter_context(_fake_apply())
        stack.enter_context(_meshes_real())
        import torch.distributed as dist

        # its DTensors' checkpoint metadata: each rank's shard shapes, pickled through all_gather_object (read on
        # the host), which the fake process group answers with this rank's own for every rank
        stack.enter_context(
            _patched(dist, "all_gather_object", _real(dist.all_gather_object, MEGATRON_FSDP_FAKE_BUILD))
        )
        yield


_SKIPPED = (
    "/torch/_ops.py",
    "/torch/_subclasses/",
    "/torch/utils/",
    "/torch/_compile.py",
    "/torch/_dynamo/",
    "/torch/_tensor.py",
    "/torch/overrides.py",
    "/torch/distributed/_tools/",
    "/torch/distributed/tensor/_dispatch.py",
    "/torch/distributed/tensor/_api.py",
    "/torch/_prims_common/",
    "/torch/_refs/",
    "/torch/_decomp/",
    "/automodel_dist/dry_run/",
    "/automodel_dist/stack/",
)
CALLS: dict[str, dict[str, Any]] = {}  # every answered (or refused) call site: what was asked, the answer, how often


def _call_chain(limit: int = 10) -> list[str]:
    """``file:function`` of the callers that asked for a value, innermost first (torch internals skipped)."""
    out = []
    frame = sys._getframe(2)
    while frame is not None and len(out) < limit:
        name = frame.f_code.co_filename
        if not any(s in name for s in _SKIPPED):
            out.append(f"{name.split('site-packages/')[-1]}:{frame.f_code.co_name}")
        frame = frame.f_back
    return out or ["?"]


def _answer(table: dict[str, Any], what: str, arg: Any) -> tuple[str, Any]:
    chain = _call_chain()
    for site, answer in table.items():
        hit = next((c for c in chain if c.endswith(site)), None)
        if hit is not None:
            return hit, answer(arg) if callable(answer) else answer
    CALLS.setdefault(f"{what}@{chain[0]}", {"answer": "refused", "calls": 0, "chain": chain})["calls"] += 1
    return chain[0], None


@contextlib.contextmanager
def value_oracles(
    items: dict[str, Any], nonzero: dict[str, Any], equal: dict[str, Any] | None = None
) -> Iterator[None]:
    """Answer ``.item()`` reads, data-dependent shapes and ``torch.equal`` from the tables (``site suffix -> value |
    fn(tensor)``; an equality's function gets its first tensor)."""
    import torch
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    table = fake_impls.op_implementations_dict
    aten = torch.ops.aten
    ops = (
        aten._local_scalar_dense.default,
        aten.item.default,
        aten.nonzero.default,
        aten.bincount.default,
        aten.equal.default,
    )
    saved = {op: table.get(op) for op in ops}

    def item(fake_mode: Any, func: Any, arg: Any) -> Any:
        if arg.item_memo is not None:  # a constant (e.g. a Python scalar turned tensor): its value is known
            return arg.item_memo
        site, value = _answer(items, "item", arg)
        if value is None:
            raise DataDependentOutputException(func)
        value = float(value) if arg.dtype.is_floating_point else bool(value) if arg.dtype == torch.bool else int(value)
        record = CALLS.setdefault(f"item@{site}", {"answer": value, "calls": 0})
        record["calls"] += 1
        ITEM.hits += 1
        return value

    def nonzero_impl(fake_mode: Any, func: Any, arg: Any) -> Any:
        site, count = _answer(nonzero, "nonzero", arg)
        if count is None:
            raise DynamicOutputShapeException(func)
        record = CALLS.setdefault(f"nonzero@{site}", {"answer": f"{list(arg.shape)} -> {int(count)}", "calls": 0})
        record["calls"] += 1
        SHAPES.hits += 1
        return arg.new_empty((int(count), arg.dim()), dtype=torch.int64)

    def bincount_impl(fake_mode: Any, func: Any, arg: Any, weights: Any = None, minlength: int = 0) -> Any:
        if not minlength:  # AutoModel passes minlength = local experts; without it the size depends on values
            raise DynamicOutputShapeException(func)
        SHAPES.hits += 1
        return arg.new_empty((minlength,), dtype=weights.dtype if weights is not None else torch.int64)

    def equal_impl(fake_mode: Any, func: Any, a: Any, b: Any) -> Any:
        if a.shape != b.shape:  # torch.equal's answer needs no value then
            return False
        site, value = _answer(equal or {}, "equal", a)
        if value is None:
            raise DataDependentOutputException(func)
        record = CALLS.setdefault(f"equal@{site}", {"answer": bool(value), "calls": 0})
        record["calls"] += 1
        ITEM.hits += 1
        return bool(value)

    table[ops[0]] = table[ops[1]] = item
    table[ops[2]] = nonzero_impl
    table[ops[3]] = bincount_impl
    table[ops[4]] = equal_impl
    try:
        yield
    finally:
        for op, impl in saved.items():
            if impl is None:
                table.pop(op, None)
            else:
                table[op] = impl


@contextlib.contextmanager
def flash_sdpa() -> Iterator[None]:
    """F.scaled_dot_product_attention as the GPU's flash kernel (see SDPA). In place while the model is built too:
    AutoModel's context-parallel hooks capture the function then (context_parallel/utils.py's _cp_sdpa)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor

    def sdpa_flash(
        query: Any,
        key: Any,
        value: Any,
        attn_mask: Any = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: Any = None,
        enable_gqa: bool = False,
    ) -> Any:
        if query.dim() == 3:  # unbatched [heads, seq, dim] (SDPA takes it; the flash kernel's op wants a batch)
            batched = sdpa_flash(
                query[None], key[None], value[None], attn_mask, dropout_p, is_causal, scale, enable_gqa
            )
            return batched[0]
        SDPA.hits += 1
        # a mask (causal, sliding window, a block per image) changes which scores count, not what a flash kernel keeps
        op = torch.ops.aten._scaled_dot_product_flash_attention.default
        causal = is_causal or attn_mask is not None
        heads, kv_heads = query.shape[-3], key.shape[-3]
        if kv_heads != heads and isinstance(query, DTensor):
            # DTensor's ring attention (context parallelism) takes equal head counts, as SDPA's enable_gqa does
            key = key.repeat_interleave(heads // kv_heads, dim=-3)
            value = value.repeat_interleave(heads // kv_heads, dim=-3)
        if value.shape[-1] != query.shape[-1]:  # MLA (DeepSeek): the memory-efficient kernel takes a narrower V
            efficient = torch.ops.aten._scaled_dot_product_efficient_attention.default
            return efficient(query, key, value, None, True, dropout_p, causal, scale=scale)[0]
        # grouped K/V as the GPU kernel takes them (no expanded copies kept for backward)
        return op(query, key, value, dropout_p, causal, scale=scale)[0]

    # AutoModel's block-diagonal CP captured SDPA when it was imported, and calls that for its dense fallback (a
    # query neither fp16 nor bf16): the GPU's kernel there too
    from nemo_automodel.components.distributed.blockdiag_cp import runtime as blockdiag_runtime

    with contextlib.ExitStack() as stack:
        stack.enter_context(_patched(F, "scaled_dot_product_attention", sdpa_flash))
        if hasattr(blockdiag_runtime, "_ORIGINAL_SDPA"):  # (FLASH_VARLEN's check reports it gone)
            stack.enter_context(_patched(blockdiag_runtime, "_ORIGINAL_SDPA", sdpa_flash))
        yield


FOREACH = _register(
    "optimizer_foreach_as_on_cuda",
    "optimizer",
    "torch.optim.optimizer._get_foreach_kernels_supported_devices and _foreach_supported_types (the CPU and "
    "FakeTensor added while the step runs)",
    "On a GPU, torch's Adam, AdamW and SGD default to their foreach implementation for plain and DTensor parameters "
    "alike. It updates a whole parameter group at once and makes group-sized temporaries (the second moment's square "
    "root, the step sizes). On CPU tensors they default to the per-tensor loop, whose temporaries are one tensor's. "
    "The fake CPU step therefore takes the GPU's default, so a peak in the optimizer step is the GPU's.",
    lambda: (
        _resolve("torch.optim.optimizer:_get_foreach_kernels_supported_devices"),
        _resolve("torch.optim.optimizer:_foreach_supported_types"),
    ),
)


@contextlib.contextmanager
def foreach_optimizers() -> Iterator[None]:
    """See FOREACH."""
    import torch.optim.optimizer as optimizer
    from torch._subclasses.fake_tensor import FakeTensor

    plain = optimizer._get_foreach_kernels_supported_devices

    def devices() -> list[str]:
        FOREACH.hits += 1
        return [*plain(), "cpu"]

    # a parameter outside a DTensor is a FakeTensor here, where a GPU has a plain tensor
    types = [*optimizer._foreach_supported_types, FakeTensor]
    with (
        _patched(optimizer, "_get_foreach_kernels_supported_devices", devices),
        _patched(optimizer, "_foreach_supported_types", types),
    ):
        yield


def _real(fn: Callable[..., Any], shim: Shim | None = None) -> Callable[..., Any]:
    """``fn`` with fake mode off while it runs (counted on ``shim``, :data:`MESH` by default)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        (shim or MESH).count()
        with unset_fake_temporarily():
            return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def _meshes_real() -> Iterator[None]:
    """DeviceMesh's rank tables computed on real tensors while fake mode is on (:data:`MESH`)."""
    from torch.distributed.device_mesh import DeviceMesh

    concatenate = DeviceMesh.__dict__["_concatenate"]
    mesh = DeviceMesh.__dict__["mesh"]
    with (
        _patched(DeviceMesh, "_concatenate", staticmethod(_real(concatenate.__func__))),
        _patched(DeviceMesh, "mesh", property(_real(mesh.fget))),
    ):
        yield


@contextlib.contextmanager
def step_patches() -> Iterator[None]:
    """What the training step needs on fake tensors."""
    import nemo_automodel.components.distributed.tp_replicas as tp_replicas
    import torch
    import torch.distributed.tensor._sharding_prop as sharding_prop
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.distributed.tensor import DTensor

    from .rms_norm import fused_rms_norm

    with contextlib.ExitStack() as stack:

        def no_fake_mode(*args: Any, **kwargs: Any) -> None:
            PROPAGATION.hits += 1
            return None

        stack.enter_context(_patched(sharding_prop, "detect_fake_mode", no_fake_mode))

        stack.enter_context(_meshes_real())
        stack.enter_context(_patched(tp_replicas, "_is_tp_replicated", _real(tp_replicas._is_tp_replicated)))

        stack.enter_context(flash_sdpa())
        stack.enter_context(foreach_optimizers())
        plain_dropout, plain_torch_dropout = F.dropout, torch.dropout

        def dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
            if training and 0.0 < p < 1.0 and not inplace and not isinstance(input, DTensor):
                DROPOUT.hits += 1
                return torch.native_dropout(input, p, True)[0]
            return plain_dropout(input, p, training, inplace)

        def torch_dropout(input: Any, p: float, train: bool) -> Any:
            if train and 0.0 < p < 1.0 and not isinstance(input, DTensor):
                DROPOUT.hits += 1
                return torch.native_dropout(input, p, True)[0]
            return plain_torch_dropout(input, p, train)

        stack.enter_context(_patched(F, "dropout", dropout))
        plain_rms_norm = F.rms_norm

        def rms_norm(input: Any, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Any:
            if (
                isinstance(input, FakeTensor)
                and not input.is_complex()
                and (weight is None or (isinstance(weight, FakeTensor) and weight.dtype == input.dtype))
            ):
                RMS_NORM.hits += 1
                return fused_rms_norm(input, normalized_shape, weight)
            return plain_rms_norm(input, normalized_shape, weight, eps)

        stack.enter_context(_patched(F, "rms_norm", rms_norm))
        stack.enter_context(_patched(torch, "dropout", torch_dropout))

        def synchronize(device: Any = None) -> None:
            CUDA_SYNC.hits += 1

        if not torch.cuda.is_available():
            stack.enter_context(_patched(torch.cuda, "synchronize", synchronize))
        cp_attention = sys.modules.get("nemo_automodel.components.models.gemma4_moe.cp_attention")
        if cp_attention is not None:  # (imported where a Gemma-4 model was built)
            from . import flex_attention

            flex_attention.on_call = FLEX_ATTENTION.count
            stack.enter_context(
                _patched(cp_attention, "_compiled_flex_attention", lambda module: flex_attention.flex_attention)
            )
        kimi_cp = sys.modules.get("nemo_automodel.components.models.kimi_linear.cp")
        if kimi_cp is not None:  # (imported where a Kimi-Linear model was built)
            from . import flex_attention

            def kimi_flex(*args: Any, **kwargs: Any) -> Any:
                KIMI_FLEX_ATTENTION.count()
                return flex_attention.flex_attention(*args, **kwargs)

            stack.enter_context(_patched(kimi_cp, "_compiled_flex_attention", lambda: kimi_flex))
        yield


__all__ = [
    "SHIMS",
    "CALLS",
    "broken",
    "import_automodel",
    "install_te_attention",
    "install_fla_gdn",
    "install_ffpa",
    "install_flash_varlen",
    "install_dsv4_tilelang",
    "install_glm_cudnn_dsa",
    "install_glm_dsa",
    "install_mamba_ssd",
    "install_compiled_activations",
    "liger_stand_in",
    "local_dispatch",
    "te_cross_entropy",
    "build_patches",
    "cuda_factories_on_cpu",
    "cp_attention_math_on_cpu",
    "real_build_patches",
    "step_patches",
    "megatron_fsdp_build",
    "megatron_fsdp_runtime",
    "value_oracles",
]
