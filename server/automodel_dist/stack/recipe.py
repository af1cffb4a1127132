"""What AutoModel is handed to build and train a recipe's model on this machine, decided without torch: the recipe's
backend, loss and optimizer with what a CPU runs instead of a CUDA-only kernel (each substitution stated), and its
``distributed:`` block with nothing in it that AutoModel would import. Shared by the dry run and the smoke run on
AutoModel's stack."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from ..catalog.kernels import EAGER_UNLESS_TE, LOCAL_DISPATCHERS
from ..workload import GEMMA4_TP_LINEAR_CE, Workload, te_fused_adam_states

# model.backend values that need CUDA kernels -> what AutoModel itself uses without them
_CPU_BACKEND: dict[str, tuple[frozenset[str], str]] = {
    "attn": (frozenset({"flex", "tilelang", "cudnn", "fa4", "magi"}), "sdpa"),  # own classes: te_attention.py
    "linear": (frozenset({"te", "quack"}), "torch"),
    "rms_norm": (frozenset({"te", "quack"}), "torch_fp32"),
    "rope": (frozenset({"quack", "triton"}), "torch"),
    "experts": (frozenset({"te", "gmm", "torch_mm_mxfp8"}), "torch_mm"),
    "dispatcher": (frozenset({"deepep", "hybridep", "uccl_ep", "mok"}), "torch"),
}
# AutoModel's classes whose sparse-attention kernels for a backend.attn the dry run stands in, and the module that does
# (GLM-5.2's DSA, DeepSeek-V4's sparse attention and indexer): the dry run keeps that backend rather than run the
# dense attention it would fall back to (a seq x seq mask per head)
DSV4_STAND_INS = "stack/dsv4_tilelang.py"
GLM_CUDNN_STAND_INS = "stack/glm_cudnn_dsa.py"
DSA_KERNEL_STAND_INS = {
    ("GlmMoeDsaForCausalLM", "tilelang"): "stack/glm_dsa.py",
    ("GlmMoeDsaForCausalLM", "cudnn"): GLM_CUDNN_STAND_INS,
    ("DeepseekV4ForCausalLM", "tilelang"): DSV4_STAND_INS,
}
_CUDA_FLAGS = ("rope_fusion", "compile_attn", "compile_situ", "te_grouped_tensor")
_TORCH_OPTIMIZERS = {"AdamW": "torch.optim.AdamW", "Adam": "torch.optim.Adam", "SGD": "torch.optim.SGD"}
_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")


# Attention kernels that keep what a flash kernel keeps for backward (q, k, v, output, log-sum-exp): on AutoModel's own
# classes they run as the TE stand-in, which its classes accept with and without context parallelism
_FLASH_LIKE = {"te": "TE", "flex": "FlexAttention", "magi": "MagiAttention", "cudnn": "cuDNN attention", "fa4": "FA4"}


class StackRecipe(BaseModel):
    """What AutoModel builds and trains, as the recipe says and this machine can run: the worker hands it to
    :mod:`.step` (its ``build``, ``optimizer`` and clipping). Written by the dry run's and the smoke run's planners,
    read back from JSON by their workers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    loss: dict[str, Any]  # {name, kwargs}: loss_for
    optimizer: dict[str, Any]  # {target, kwargs, state_dtype, master_weights}: optimizer_for
    peft: dict[str, Any] | None = None  # PeftConfig's fields
    backend: dict[str, Any] | None = None  # BackendConfig's fields (AutoModel's own classes): backend_for
    torch_dtype: str | None = None
    force_hf: bool = False
    # model.mtp_use_repeated_layer, an argument of AutoModel's Nemotron-V3 class (one MTP depth run at each of the
    # config's num_nextn_predict_layers depths): passed where the class takes it
    mtp_use_repeated_layer: bool = False
    # from_pretrained (load_base_model): under PP AutoModel skips the random initialization its checkpoint load
    # overwrites (infrastructure.py: _skip_init_weights_on_load), and with it the dtype cast inside it
    load_base_model: bool = False
    liger: bool = False  # use_liger_kernel
    # model.attn_implementation where it changes what is kept (eager: catalog/kernels.runs_eager_attention); None
    # leaves AutoModel's default, whose SDPA the dry run measures as the GPU's flash kernel holds it
    attn_implementation: str | None = None
    local_dispatch: bool = False  # the dry run's stand-in for DeepEP/HybridEP/UCCL-EP (LOCAL_DISPATCHERS)
    fla_gdn: bool = (
        False  # the dry run's stand-in for fla's Gated DeltaNet kernel (AutoModel's linear-attention layers)
    )
    mamba_ssm: bool = False  # the dry run's stand-in for mamba_ssm's fused Mamba-2 kernel (AutoModel's Nemotron-H)
    # ... and for the unfused kernels a transformers class's Mamba-2 mixer runs (causal_conv1d, mamba_ssm's chunk
    # scan): its architecture (Nemotron-H under force_hf, Falcon-H1; shims.HF_MAMBA_KERNELS), None for none
    mamba_hf: str | None = None
    ffpa: bool = False  # the dry run's stand-in for FFPA's CuTeDSL kernels (Gemma-4's CP ring, cp_full_attn_backend)
    dsv4_kernels: bool = False  # the dry run's stand-ins for DeepSeek-V4's TileLang sparse attention and indexer
    thd_batches: bool = False  # the recipe's batches are packed THD (the dry run hands the packing collate's fields)
    # a packed VLM batch under CP on a class that shards it block-diagonally (Qwen3.5's): the dry run hands the packing
    # collate's document map and stands in for flash-attn's kernels (stack/flash_varlen.py)
    blockdiag_cp: bool = False
    te_module: bool = False  # TE's module importable (the stand-in's) where AutoModel imports it whatever the backend
    clip_grad_norm: Any = None  # clip_grad_norm.max_norm (None: AutoModel's default)
    vlm: bool = False  # the VLM recipe (vlm/finetune.py): NeMoAutoModelForImageTextToText and its step
    freeze_config: dict[str, Any] | None = None  # the recipe's freeze_config: section, as its build_model passes it

    @property
    def te_stand_in(self) -> bool:
        """Whether Transformer Engine's attention module is stood in: TE attention, or TE importable for AutoModel's
        MoE CP setup (``te_module``)."""
        return (self.backend or {}).get("attn") == "te" or self.te_module

    @property
    def glm_dsa_kernels(self) -> bool:
        """Whether GLM-5.2's TileLang DSA kernels are stood in (backend.attn tilelang, which backend_for keeps only
        for the classes whose kernels the dry run stands in)."""
        return (self.backend or {}).get("attn") == "tilelang" and not self.dsv4_kernels

    @property
    def glm_cudnn_kernels(self) -> bool:
        """Whether GLM-5.2's cuDNN DSA and FlashMLA kernels are stood in: backend.attn cudnn, which backend_for keeps
        on AutoModel's own classes only for GLM-5.2's (it runs as the TE stand-in on the others); a Hugging Face class
        is handed the recipe's backend as written, and the stand-ins bind only into GLM-5.2's modules."""
        return (self.backend or {}).get("attn") == "cudnn"

    @property
    def thd_dsa_batches(self) -> bool:
        """Whether the dry run hands the packing collate's THD fields (GLM-5.2's TileLang and cuDNN DSA run on THD
        only; the other recipes' packed batches are measured as their unpacked equivalent)."""
        return self.thd_batches and (self.glm_dsa_kernels or self.glm_cudnn_kernels)

    @property
    def steps_optimizer(self) -> bool:
        """Whether the step runs the optimizer's own step: the stand-in for TE's FusedAdam (a ``state_dtype``) holds
        its states in TE's dtypes, which torch's Adam cannot step against bf16 gradients; TE's fused kernel updates
        them in place, with no temporaries to measure."""
        return not self.optimizer["state_dtype"]


def backend_for(
    w: Workload, moe: bool, custom: bool, out: list[str], *, values: bool = False, architecture: str | None = None
) -> dict[str, Any]:
    """model.backend as the dry run (``values`` False: fake tensors, memory) or the smoke run (``values``: real
    tensors, numerics) builds it. Only AutoModel's own classes take one: for a Hugging Face class the recipe's own is
    passed as written (an error it causes is AutoModel's) and nothing is added to it."""
    backend = dict(w.backend)
    if not custom:
        return backend
    eager_off_te = architecture in EAGER_UNLESS_TE and backend.get("attn", "te") != "te"
    dsa_kernels = not values and (architecture, backend.get("attn")) in DSA_KERNEL_STAND_INS
    # (MiMo's other backends run its eager path; a DSA class whose kernels are stood in keeps its backend)
    if backend.get("attn", "te") in _FLASH_LIKE and not eager_off_te and not dsa_kernels:
        # te: AutoModel's default on a GPU with Transformer Engine (unset means te there) and the only attention its
        # own classes take under CP; flex (FlexAttention) keeps the same tensors for backward (q, k, v, output,
        # log-sum-exp), and some classes take only te or flex (GPT-OSS)
        was = backend.get("attn")
        if values:  # the TE stand-in keeps TE's tensors but computes no attention; torch's does, on the CPU
            backend["attn"] = "sdpa"
            out.append(
                f"model.backend.attn: {was or 'unset (te on a GPU with Transformer Engine)'} runs as sdpa (torch's "
                "attention on the CPU): the layout's sharding of q, k, v is the same"
            )
        else:
            backend["attn"] = "te"
            out.append(
                f"model.backend.attn: {was or 'unset (te on a GPU with Transformer Engine)'} runs as a stand-in with "
                "Transformer Engine's shapes (stack/te_attention.py): what its flash attention keeps (q, k, v, "
                "output, log-sum-exp) and, under context parallelism, its ring's peer K/V buffers; "
                f"{_FLASH_LIKE[was or 'te']}'s own workspace is not measured"
            )
    if dsa_kernels and backend["attn"] == "cudnn":
        out.append(
            "model.backend.attn: cudnn runs AutoModel's cuDNN DSA adapters as written (the packed metadata, the "
            "indexer's fp32 scores and chunked top-k, the global indices, the sparse attention's autograd Function and "
            f"what it saves for backward) with stand-ins for cuDNN Frontend's and FlashMLA's kernels "
            f"({GLM_CUDNN_STAND_INS}: each kernel's outputs, the top-k's radix scratch and the SM90 backward's fp32 "
            "scratch), assuming an H100 (SM90) with nvidia-cudnn-frontend (AutoModel's cuda extra) and FlashMLA (in "
            "no extra) installed, without which AutoModel raises; the kernels' other buffers are not measured"
        )
    elif dsa_kernels:
        out.append(
            f"model.backend.attn: {backend['attn']} runs AutoModel's vendored TileLang DSA Functions (the "
            "sparse-attention indexer and sparse attention, what they save for backward, the indexer's fp32 logits and top-k) "
            f"with stand-ins for their CUDA kernels ({DSA_KERNEL_STAND_INS[(architecture, backend['attn'])]}: each "
            "kernel's outputs and its interface's allocations); the kernels' own workspaces are not measured"
        )
        if architecture == "DeepseekV4ForCausalLM":
            out.append(
                "DeepSeek-V4's hyper-connection Sinkhorn (backend auto under tilelang) runs AutoModel's "
                "_Dsv4TileKernelsSinkhorn Function around stand-ins for TileKernels' kernels (its fp32 input kept), "
                "assuming the GPU has tile-kernels installed (AutoModel's cuda extra); without it AutoModel runs the "
                "torch reference, which keeps every iteration's ratios (about 50 times as many bytes)"
            )
    for key, (cuda_only, cpu) in _CPU_BACKEND.items():
        if key == "attn" and dsa_kernels:
            continue
        if backend.get(key) in cuda_only:
            if key == "dispatcher" and not values and backend[key] in LOCAL_DISPATCHERS:
                out.append(
                    f"model.backend.dispatcher: {backend[key]} runs as torch with the token exchange kept on the rank "
                    "(stack/dispatch.py: no all-gather of the EP group's tokens; this rank's experts get its T*k "
                    "routed rows, as under balanced routing); its communication buffers are not measured"
                )
            else:
                out.append(
                    f"model.backend.{key}: {backend[key]} runs as {cpu} (it needs CUDA kernels); its workspaces "
                    "are not measured"
                )
            backend[key] = cpu
    for flag in _CUDA_FLAGS:
        if backend.get(flag):
            out.append(f"model.backend.{flag}: false (CUDA only)")
            backend[flag] = False
    if backend.get("te_fp8") is not None:
        out.append("model.backend.te_fp8 is not applied (Transformer Engine FP8 needs CUDA): bf16 compute measured")
        backend["te_fp8"] = None
    if moe and "experts" not in backend:
        backend["experts"] = "torch_mm"  # AutoModel's default on a GPU (it loops over experts on a CPU)
    return backend


def loss_for(w: Workload, out: list[str], *, values: bool = False) -> dict[str, Any]:
    """The loss the dry run (``values`` False) or the smoke run (``values``: real numerics) computes."""
    name, kwargs = w.loss, dict(w.loss_kwargs)
    if name == GEMMA4_TP_LINEAR_CE:
        out.append(
            f"loss {name} (FusedLinearCrossEntropy on Gemma-4's TP-sharded head; cut_cross_entropy's GPU kernels) "
            "runs as AutoModel's ChunkedCrossEntropy on the head its own materialize_lm_weight gathers whole, with "
            "the kernel's memory stood in (stack/cce.py: the logits blockwise, the fp32 log-sum-exp kept; in "
            "backward the hidden states' gradient in fp32 and the head's once in its dtype); the kernel's own "
            "workspace is not measured"
        )
        return {"name": "ChunkedCrossEntropy", "kwargs": {}, "stands_for": name}
    if name == "FusedLinearCrossEntropy":
        out.append(
            "loss FusedLinearCrossEntropy (cut_cross_entropy's GPU kernels) runs as AutoModel's ChunkedCrossEntropy "
            "with the kernel's memory stood in (stack/cce.py, as AutoModel calls it: the logits blockwise, the fp32 "
            "log-sum-exp kept; in backward the hidden states' gradient in fp32 (accum_e_fp32) and the head's once "
            "in its dtype); the head's weight is prepared as FusedLinearCrossEntropy prepares it "
            "(materialize_lm_weight, without ChunkedCrossEntropy's own check of the head and of softcapping); the "
            "kernel's own workspace is not measured"
        )
        if kwargs.get("impl") == "torch_compile":
            out.append(
                "loss_fn.impl torch_compile (cut_cross_entropy's compiled path, whose memory grows as tokens x vocab) "
                "is measured as its cce kernel: not as written"
            )
        # (its head's weight prepared as FusedLinearCrossEntropy prepares it: stack/step.py)
        return {"name": "ChunkedCrossEntropy", "kwargs": {}, "stands_for": "FusedLinearCrossEntropy"}
    if name == "TEParallelCrossEntropy" and not values:
        out.append(
            "loss TEParallelCrossEntropy (Transformer Engine's Triton kernels) runs as a stand-in that keeps what "
            "they keep: the logits, with the gradient written into them (stack/shims.py te_cross_entropy)"
        )
        return {"name": name, "kwargs": kwargs}
    if name == "TEParallelCrossEntropy":
        out.append("loss TEParallelCrossEntropy (Transformer Engine) computed as MaskedCrossEntropy")
        return {"name": "MaskedCrossEntropy", "kwargs": {}}
    if name not in ("MaskedCrossEntropy", "ChunkedCrossEntropy"):
        out.append(f"loss {name} is not one AutoModel's typed losses: measured with MaskedCrossEntropy")
        return {"name": "MaskedCrossEntropy", "kwargs": {}}
    return {"name": name, "kwargs": kwargs}


def optimizer_for(w: Workload, out: list[str]) -> dict[str, Any]:
    # (AutoModel's factory path hands the recipe's foreach to torch as written, under TP too, and sets false itself
    # under TP where the recipe gives none; torch's default is the GPU's foreach step, which the dry run's step takes
    # too: shims.FOREACH. fused needs CUDA: dropped, the step is torch's default or the recipe's foreach)
    kwargs = {k: v for k, v in w.optimizer_kwargs.items() if k != "fused"}
    if w.optimizer in _TORCH_OPTIMIZERS and w.optimizer_kwargs.get("fused") is True:
        out.append(
            f"optimizer {w.optimizer} fused: true runs torch's unfused step (the fused kernel needs CUDA): foreach "
            "unless the recipe or TP turns it off, its temporaries larger than the fused kernel's"
        )
    if w.optimizer in _TORCH_OPTIMIZERS:
        return {
            "target": _TORCH_OPTIMIZERS[w.optimizer],
            "kwargs": kwargs,
            "state_dtype": None,
            "master_weights": False,
        }
    if w.optimizer == "TEFusedAdam":
        # AutoModel's factory path hands the recipe's keyword arguments to FusedAdam, dtype names made torch dtypes
        # (optim/optimizer.py _DTYPE_FIELDS); TE keeps exp_avg, exp_avg_sq and master_param in those dtypes (fp32 by
        # default), the master copy only with master_weights, and with store_param_remainders (bf16 parameters, an
        # fp32 master) only the 16 bits a bf16 parameter lacks of it
        te = te_fused_adam_states(w.optimizer_kwargs)
        moments, master = {"exp_avg": te.exp_avg, "exp_avg_sq": te.exp_avg_sq}, te.master
        said = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "uint8": "uint8 (FP8)"}
        out.append(
            "optimizer Transformer Engine FusedAdam (CUDA only) replaced by torch AdamW with its states: exp_avg "
            f"in {said[moments['exp_avg']]}, exp_avg_sq in {said[moments['exp_avg_sq']]}"
            + (
                ""
                if master is None
                else ", master weights as 16-bit remainders of the bf16 parameters"
                if master == "remainders"
                else f", {said[master]} master weights"
            )
            + " (the recipe's settings, TE's defaults where it gives none); its fused in-place step keeps no "
            "temporaries, so the measured step does not run torch's"
        )
        return {
            "target": "torch.optim.AdamW",
            "kwargs": {k: v for k, v in kwargs.items() if k in _ADAM_KEYS},
            "state_dtype": moments,
            "master_weights": master or False,
        }
    out.append(
        f"optimizer {w.optimizer} is not available to the dry run: torch AdamW measured in its place (its "
        "states: two per trainable parameter, in the parameter dtype)"
    )
    return {
        "target": "torch.optim.AdamW",
        "kwargs": {k: v for k, v in kwargs.items() if k in _ADAM_KEYS},
        "state_dtype": None,
        "master_weights": False,
    }


# _target_ values AutoModel may instantiate from a distributed: block that are torch's own classes
_SAFE_TARGETS = frozenset(
    {
        "torch.distributed.fsdp.MixedPrecisionPolicy",
        "torch.distributed.fsdp.CPUOffloadPolicy",
        "torch.distributed.fsdp.OffloadPolicy",
    }
)


def sanitized_block(block: dict[str, Any], subs: list[str], error: type[Exception] = ValueError) -> dict[str, Any]:
    """The block AutoModel's parser gets: nothing in it that AutoModel would import (it imports ``_target_`` strings
    and a ``tp_plan`` import path; this tool never imports a name from a config)."""

    def walk(value: Any, path: str) -> Any:
        if not isinstance(value, dict):
            return value
        out = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key == "_target_":
                if path == "":
                    continue  # AutoModel drops it at the top level
                if item not in _SAFE_TARGETS:
                    raise error(
                        f"distributed.{where} is {str(item)[:80]!r}: AutoModel would import and call it, and the dry "
                        "run never imports a name from a config; write torch's own class or drop the _target_"
                    )
            if where == "tp_plan" and isinstance(item, str):
                subs.append(
                    "distributed.tp_plan (an import path) is not imported: AutoModel's own plan for the class "
                    "is measured"
                )
                continue
            out[key] = walk(item, where)
        return out

    return walk(block, "")


def jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value if type(value) in (str, int, float, bool) or value is None else str(value)
    return str(value)


__all__ = [
    "StackRecipe",
    "backend_for",
    "loss_for",
    "optimizer_for",
    "sanitized_block",
    "jsonable",
]
