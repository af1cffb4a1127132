"""What AutoModel 0.7.0 silently does differently at run time from what the recipe says, where it changes what
trains or how much memory it needs, and the recipe-kind refusals that come with them. Each rule names the code
that decides it; ``tests/oracle/test_oracle_parity.py`` checks the tables here against that code."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..catalog.implementations import implementation, implementations
from ..catalog.kernels import TP_HEAD_VIA_EMBEDDING, tp_splits_vocab
from ..config.kinds import DIFFUSION_LM_RECIPES, KD_RECIPES, TRAIN_FT_RECIPES, VLM_STEP_RECIPES
from ..report import Finding
from ..workload import GEMMA4_TP_LINEAR_CE
from .base import Context, finding, rule

F = "fallback"
LINEAR_CE = ("FusedLinearCrossEntropy", "ChunkedCrossEntropy")  # LinearCrossEntropy subclasses (loss/linear_ce_base)
# AutoModel classes that keep their own forward under pipeline parallelism (``_pp_keep_self_forward``) and do not
# declare ``_pp_return_hidden_states_supported``: their last stage returns logits, not hidden states; and the
# classes whose forward takes no ``logits_to_keep`` (model_utils._supports_logits_to_keep is False). Both read from
# the generated capability table.
KEEPS_OWN_PIPELINE_FORWARD = frozenset(
    a for a, i in implementations().items() if i.custom and i.keeps_own_forward and not i.returns_hidden_states
)
NO_LOGITS_TO_KEEP = frozenset(a for a, i in implementations().items() if i.custom and not i.logits_to_keep)
VLM_RECIPES = VLM_STEP_RECIPES  # (the VLM recipes, whose step is vlm/finetune.py's: config/kinds.py)
# The steps that call the recipe's own loss_fn on the model's final hidden states, asking the forward for
# logits_to_keep=1 where the loss is a linear cross entropy (train_ft's and vlm/finetune.py's _forward_backward_step):
# a distillation step feeds the student's full logits to its loss, a diffusion LM's step calls a loss of its own
LINEAR_CE_STEP_RECIPES = frozenset(
    {"TrainFinetuneRecipeForNextTokenPrediction", "BenchmarkingRecipeForNextTokenPrediction", "FinetuneRecipeForVLM"}
)


def megatron_root_hook_unfired(loss: str | None, recipe: str | None, mtp_layers: int) -> bool:
    """Whether megatron-fsdp 0.5.0's root pre-backward hook gets no gradient: it sits on the output of the wrapped
    model's last submodule (the variable MegatronFSDP._register_fsdp_hooks' loop over named_modules() leaves behind),
    lm_head in a causal LM, and ``loss``, the loss that runs, is a linear cross entropy that a finetune step computes
    from the hidden states and the head's weight, never from lm_head's output. Not decided for a model with
    multi-token-prediction layers (a module built after lm_head may be the last)."""
    linear = loss in (*LINEAR_CE, GEMMA4_TP_LINEAR_CE)
    return linear and (recipe is None or recipe in LINEAR_CE_STEP_RECIPES) and not mtp_layers


def no_hidden_states(architecture: str | None, force_hf: bool, pipeline: Any) -> str | None:
    """Why the last pipeline stage returns no hidden states (train_ft._maybe_downgrade_loss_fn's condition), or
    None when it does or the model is not known. ``pipeline`` is the block's ``pipeline:`` mapping, if any."""
    if isinstance(pipeline, dict) and pipeline.get("patch_causal_lm_model") is False:
        impl = implementation(architecture) if architecture is not None and not force_hf else None
        if impl is not None and impl.custom and impl.returns_hidden_states:
            return None  # its own forward declares hidden-state outputs (_pp_return_hidden_states_supported)
        return "distributed.pipeline.patch_causal_lm_model: false leaves the model's own forward in place"
    if architecture is not None and not force_hf and architecture in KEEPS_OWN_PIPELINE_FORWARD:
        return f"AutoModel's {architecture} keeps its own forward under pipeline parallelism"
    return None


def _no_hidden_states(ctx: Context) -> str | None:
    m = ctx.model
    return no_hidden_states(m.architecture if m is not None else None, ctx.workload.force_hf, ctx.block.get("pipeline"))


@rule(
    "pp-linear-ce-fallback",
    family=F,
    severity="warning",
    title="Linear cross entropy AutoModel replaces under pipeline parallelism",
    patterns=(
        r"FusedLinearCrossEntropy is not supported under pipeline parallelism for this model\. Using "
        r"MaskedCrossEntropy instead",
        r"ChunkedCrossEntropy requires pipeline stages that can return hidden states",
    ),
    cause="Under pp_size > 1 AutoModel's train_ft (_maybe_downgrade_loss_fn) needs the last stage to return hidden "
    "states for a linear cross entropy; when the model keeps its own forward (or patch_causal_lm_model is false) "
    "it swaps FusedLinearCrossEntropy for MaskedCrossEntropy with one warning on rank 0, so the last stage "
    "materialises the whole [micro batch, seq, vocab] logits; ChunkedCrossEntropy raises ValueError instead.",
    fix="Expect the logits' memory on the last stage (`automodel-dist dryrun` measures what runs), or keep "
    "patch_causal_lm_model: true on a model whose forward AutoModel patches.",
    section="recipe",
)
def pp_linear_ce_fallback(ctx: Context) -> Iterator[Finding]:
    w = ctx.workload
    if ctx.kind.section is None or ctx.dims.pp <= 1 or w.loss not in LINEAR_CE:
        return
    if ctx.kind.recipe is not None and ctx.kind.recipe not in TRAIN_FT_RECIPES:
        return  # only llm/train_ft.py (and its subclasses) checks the last stage's hidden states
    why = _no_hidden_states(ctx)
    if why is None or _probe_has_no_logits_to_keep(ctx) is not None:
        return  # train_ft's logits_to_keep check comes first and replaces the loss already
    if w.loss == "ChunkedCrossEntropy":
        yield finding(
            ctx,
            (),
            f"loss_fn ChunkedCrossEntropy with pp_size={ctx.dims.pp}: "
            f"{why}, so train_ft raises ValueError ('ChunkedCrossEntropy requires pipeline stages that can "
            "return hidden states') in setup",
            "loss_fn: MaskedCrossEntropy, or FusedLinearCrossEntropy (which AutoModel then replaces by it)",
            severity="error",
            recipe_path="loss_fn",
        )
        return
    yield finding(
        ctx,
        (),
        f"loss_fn FusedLinearCrossEntropy with pp_size={ctx.dims.pp}: "
        f"{why}, so AutoModel trains with MaskedCrossEntropy instead (one warning on rank 0): the last stage "
        "holds the full-vocabulary logits the fused loss was meant to avoid",
        "loss_fn: MaskedCrossEntropy to say what runs (`automodel-dist dryrun` measures the logits it holds)",
        recipe_path="loss_fn",
    )


@rule(
    "linear-ce-logits-multiplier",
    family=F,
    severity="warning",
    title="A linear cross entropy leaves out the model's logits multiplier",
    cause="FusedLinearCrossEntropy and ChunkedCrossEntropy compute the loss from the final hidden states and the "
    "lm_head weight (train_ft asks the model for hidden states, loss/utils.prepare_lm_weight hands over the weight), "
    "so whatever the model's forward does to its logits after lm_head is not in the loss. Falcon-H1 multiplies its "
    "logits by lm_head_multiplier (a muP scale, 0.0078 to 0.039 in the published checkpoints); ChunkedCrossEntropy's "
    "head check looks only for softcapping. The loss is computed on logits tens of times larger than the model's, "
    "with no error.",
    fix="loss_fn: MaskedCrossEntropy (the model's own logits).",
    section="recipe",
)
def linear_ce_logits_multiplier(ctx: Context) -> Iterator[Finding]:
    w, m = ctx.workload, ctx.model
    if m is None or w.loss not in LINEAR_CE or m.logits_multiplier == 1.0:
        return
    recipe = ctx.kind.recipe
    if recipe is not None and recipe not in TRAIN_FT_RECIPES and recipe not in VLM_RECIPES:
        return
    if _probe_has_no_logits_to_keep(ctx) is not None or (ctx.dims.pp > 1 and _no_hidden_states(ctx) is not None):
        return  # AutoModel trains with MaskedCrossEntropy instead: other rules say so
    yield finding(
        ctx,
        (),
        f"loss_fn {w.loss} with {m.name}: the loss is computed from the hidden states and lm_head's weight, without "
        f"the model's logits multiplier ({m.logits_multiplier:g}), so it is not the model's loss",
        "loss_fn: MaskedCrossEntropy",
        recipe_path="loss_fn",
    )


@rule(
    "linear-ce-tp-head",
    family=F,
    severity="error",
    title="Linear cross entropy on a head tensor parallelism splits",
    patterns=(
        r"LinearCrossEntropy requires grad_reduce_group to match the LM-head DTensor mesh",
        r"ChunkedCrossEntropy requires a plain bias-free nn\.Linear output head",
    ),
    cause="The LLM, VLM and KD recipes hand a linear cross entropy one dense head weight (loss/utils.prepare_lm_weight; "
    "under PP the last stage's MTPLossConfig loss) with the data-parallel x CP group as its gradient's reduction "
    "group. Where the model's TP plan splits lm_head (FSDP2), ChunkedCrossEntropy's check of the head raises "
    "ValueError in setup, and FusedLinearCrossEntropy's materialize_lm_weight raises ValueError at the first loss "
    "unless the head's TP mesh has as many ranks as that group.",
    fix="loss_fn: MaskedCrossEntropy (or TEParallelCrossEntropy) with tp_size > 1, or tp_size: 1 with the linear "
    "cross entropy.",
    section="recipe",
)
def linear_ce_tp_head(ctx: Context) -> Iterator[Finding]:
    w, m, d = ctx.workload, ctx.model, ctx.dims
    if ctx.kind.section is None or w.loss not in LINEAR_CE or d.tp <= 1 or m is None or d.world_size is None:
        return
    recipe = ctx.kind.recipe
    if recipe in DIFFUSION_LM_RECIPES or (
        recipe is not None and recipe not in TRAIN_FT_RECIPES and recipe not in VLM_RECIPES
    ):
        return  # (a diffusion LM's step calls no linear cross entropy)
    if d.strategy != "fsdp2" or ctx.block.get("tp_plan") is not None:
        return  # (MegatronFSDP's head mesh is not checked here; a plan of the recipe's own may leave the head whole)
    impl = implementation(m.architecture) if not w.force_hf else None
    if impl is not None and (not impl.tp or impl.tp_plan_error):
        return  # TP is refused before any loss (model-capability says so)
    if not tp_splits_vocab(m.architecture, w.force_hf)[1]:
        return  # a head TP keeps whole (Qwen3.5's dense VLM class) is a plain tensor: nothing to check
    if _probe_has_no_logits_to_keep(ctx) is not None or (d.pp > 1 and _no_hidden_states(ctx) is not None):
        return  # AutoModel trains with MaskedCrossEntropy instead (or refuses ChunkedCE in setup): other rules
    if d.pp > 1 and recipe is not None and recipe not in TRAIN_FT_RECIPES:
        return
    kd_all = recipe in KD_RECIPES and _kd_ratio(ctx) >= 1.0  # the KD step then calls no cross entropy on labels
    group = d.world_size // (d.tp * d.pp)
    via_embedding = m.architecture in TP_HEAD_VIA_EMBEDDING
    if w.loss == "ChunkedCrossEntropy" and (not via_embedding or m.final_softcap):
        check = (
            "'ChunkedCrossEntropy does not support final_logit_softcapping'"
            if m.final_softcap
            else "'ChunkedCrossEntropy requires a plain bias-free nn.Linear output head'"
        )
        yield finding(
            ctx,
            (),
            f"loss_fn ChunkedCrossEntropy with tp_size={d.tp}: the TP plan splits {m.name}'s lm_head, and the recipe's "
            f"setup check of the head raises ValueError ({check}) before training",
            "loss_fn: MaskedCrossEntropy with tp_size > 1, or tp_size: 1",
            recipe_path="loss_fn",
        )
    elif group != d.tp and not kd_all:
        where = "the last pipeline stage's first loss" if d.pp > 1 else "the first loss"
        head = "lm_head (tied to its vocabulary-split embedding)" if via_embedding else "lm_head"
        yield finding(
            ctx,
            (),
            f"loss_fn {w.loss} with tp_size={d.tp}: the TP plan splits {m.name}'s {head} over a {d.tp}-rank mesh, "
            f"and materialize_lm_weight needs the gradient's reduction group (data parallel x CP, {group} ranks) to "
            f"be that size: it raises ValueError at {where}",
            "loss_fn: MaskedCrossEntropy (or TEParallelCrossEntropy) with tp_size > 1, or tp_size: 1",
            recipe_path="loss_fn",
        )


def _kd_ratio(ctx: Context) -> float:
    """The KD recipes' kd_ratio (their default 0.5)."""
    value = (ctx.recipe or {}).get("kd_ratio", 0.5)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.5


def no_logits_to_keep(
    recipe: str | None, architecture: str | None, force_hf: bool, pp: int, pipeline: Any
) -> str | None:
    """Why the module AutoModel probes for ``logits_to_keep`` has none (train_ft._maybe_downgrade_loss_fn on the
    first model part; vlm/finetune.py on the model, which under PP is the AutoPipeline), or None."""
    if recipe in VLM_RECIPES:
        if pp > 1:
            return (
                f"{recipe} asks the pipeline object (AutoPipeline, which has no forward) for logits_to_keep under "
                "pipeline parallelism"
            )
    elif recipe is not None and recipe not in TRAIN_FT_RECIPES:
        return None  # the other recipes do not downgrade their loss
    if architecture is None or force_hf or architecture not in NO_LOGITS_TO_KEEP:
        return None
    patched = pp > 1 and architecture not in KEEPS_OWN_PIPELINE_FORWARD
    if patched and not (isinstance(pipeline, dict) and pipeline.get("patch_causal_lm_model") is False):
        return None  # the pipeline forward AutoModel puts in place takes logits_to_keep
    return f"AutoModel's {architecture} forward takes no logits_to_keep"


def masked_ce_instead(
    loss: str | None, recipe: str | None, architecture: str | None, force_hf: bool, pp: int, pipeline: Any
) -> str | None:
    """Why AutoModel trains MaskedCrossEntropy in place of the recipe's loss (train_ft._maybe_downgrade_loss_fn,
    vlm/finetune.py), or None: any other loss where the probed forward takes no ``logits_to_keep``
    (``linear-ce-no-logits-to-keep``), then a linear cross entropy (FusedLinearCrossEntropy and its subclasses) where
    the last pipeline stage returns no hidden states (``pp-linear-ce-fallback``). ChunkedCrossEntropy raises there
    instead (an error those rules report)."""
    if loss in (None, "MaskedCrossEntropy", "ChunkedCrossEntropy"):
        return None
    if (why := no_logits_to_keep(recipe, architecture, force_hf, pp, pipeline)) is not None:
        return why
    linear = loss in ("FusedLinearCrossEntropy", GEMMA4_TP_LINEAR_CE)
    if linear and pp > 1 and (recipe is None or recipe in TRAIN_FT_RECIPES):
        return no_hidden_states(architecture, force_hf, pipeline)
    return None


def _probe_has_no_logits_to_keep(ctx: Context) -> str | None:
    m = ctx.model
    return no_logits_to_keep(
        ctx.kind.recipe,
        m.architecture if m is not None else None,
        ctx.workload.force_hf,
        ctx.dims.pp,
        ctx.block.get("pipeline"),
    )


@rule(
    "megatron-fsdp-linear-ce",
    family=F,
    severity="warning",
    title="Linear cross entropy under MegatronFSDP: its root backward hook never fires",
    cause="megatron-fsdp 0.5.0 (AutoModel's pin) attaches its root pre-backward hook, which queues the root's "
    "post-backward (the last gradient reduce, and finish_grad_sync under model_auto_sync), to the output of the "
    "wrapped model's last submodule: MegatronFSDP._register_fsdp_hooks passes the variable its loop over "
    "named_modules() left behind, which in a causal LM is lm_head. A linear cross entropy never uses lm_head's "
    "output (the recipes ask for logits_to_keep=1 and compute the loss from the hidden states and the head's "
    "weight), so the hook never fires. Run as written on fake tensors (Llama-3.2-1B on 8 ranks, "
    "FusedLinearCrossEntropy): no finish_grad_sync in any step, no gradient attached to any parameter the optimizer "
    "holds at optimizer.step (17 of 146 on rank 0 with MaskedCrossEntropy, which uses the logits), and every "
    "parameter bucket the backward gathered left gathered, the tied head's full gradient with them: 3.3 GiB more "
    "held at the next step's start.",
    fix="loss_fn: MaskedCrossEntropy with strategy: megatron_fsdp, or strategy: fsdp2 with the linear cross entropy.",
    section="recipe",
)
def megatron_fsdp_linear_ce(ctx: Context) -> Iterator[Finding]:
    w, m, d = ctx.workload, ctx.model, ctx.dims
    if ctx.kind.section is None or not d.megatron_wraps:
        return
    if not megatron_root_hook_unfired(w.loss, ctx.kind.recipe, m.mtp_layers if m is not None else 0):
        return
    if _probe_has_no_logits_to_keep(ctx) is not None:
        return  # AutoModel trains MaskedCrossEntropy instead (or refuses ChunkedCE): linear-ce-no-logits-to-keep
    gathered = ""
    if d.zero_dp_strategy >= 3:  # (below it the parameters are not sharded: nothing is gathered)
        whole = f" ({m.param_count() * 2 / (1 << 30):.1f} GiB of {m.name}'s parameters in bf16)" if m else ""
        gathered = f", and every parameter bucket the backward gathers stays gathered from the first step on{whole}"
    yield finding(
        ctx,
        (),
        f"loss_fn {w.loss} with strategy megatron_fsdp: megatron-fsdp 0.5.0's root backward hook sits on lm_head's "
        "output, which a linear cross entropy never uses, so the root's post-backward and finish_grad_sync never "
        "run: the optimizer steps with no gradient attached (the dry run finds none)" + gathered,
        "loss_fn: MaskedCrossEntropy with megatron_fsdp, or strategy: fsdp2 with the linear cross entropy",
        recipe_path="loss_fn",
    )


@rule(
    "linear-ce-no-logits-to-keep",
    family=F,
    severity="warning",
    title="Linear cross entropy AutoModel replaces for want of logits_to_keep",
    patterns=(
        r"logits_to_keep not found in model\.forward\. Using MaskedCrossEntropy instead",
        r"ChunkedCrossEntropy requires a model supporting logits_to_keep",
    ),
    cause="The LLM and VLM recipes check the model's forward for a logits_to_keep parameter before training: "
    "without one FusedLinearCrossEntropy is swapped for MaskedCrossEntropy with one warning (the full logits are "
    "materialised) and ChunkedCrossEntropy raises ValueError. The VLM recipe asks the AutoPipeline object under "
    "pipeline parallelism, which has no forward, so there it always happens.",
    fix="loss_fn: MaskedCrossEntropy to say what runs (and size the logits), or a model class whose forward takes "
    "logits_to_keep.",
    section="recipe",
)
def linear_ce_no_logits_to_keep(ctx: Context) -> Iterator[Finding]:
    w = ctx.workload
    if ctx.kind.section is None or w.loss not in LINEAR_CE:
        return
    why = _probe_has_no_logits_to_keep(ctx)
    if why is None:
        return
    if w.loss == "ChunkedCrossEntropy":
        yield finding(
            ctx,
            (),
            f"loss_fn ChunkedCrossEntropy: {why}, so the recipe raises ValueError in setup ('ChunkedCrossEntropy "
            "requires a model supporting logits_to_keep')",
            "loss_fn: MaskedCrossEntropy",
            severity="error",
            recipe_path="loss_fn",
        )
        return
    yield finding(
        ctx,
        (),
        f"loss_fn FusedLinearCrossEntropy: {why}, so AutoModel trains with MaskedCrossEntropy instead (one warning "
        "on rank 0) and materialises the full-vocabulary logits",
        "loss_fn: MaskedCrossEntropy to say what runs (`automodel-dist dryrun` measures the logits it holds)",
        recipe_path="loss_fn",
    )


@rule(
    "kd-pp-linear-ce",
    family=F,
    severity="error",
    title="Knowledge distillation under PP with a linear cross entropy",
    patterns=(r"Pipeline parallelism with KD requires a loss that uses only logits and labels",),
    cause="KnowledgeDistillationRecipeForNextTokenPrediction raises ValueError in setup when pp_size > 1 and the "
    "loss is a linear cross entropy (the last stage has only logits for the KD loss).",
    fix="loss_fn: MaskedCrossEntropy with pipeline parallelism under KD.",
    section="recipe",
)
def kd_pp_linear_ce(ctx: Context) -> Iterator[Finding]:
    w = ctx.workload
    if not ctx.kind.teacher or ctx.dims.pp <= 1 or w.loss not in LINEAR_CE or _no_hidden_states(ctx):
        return  # without hidden states the loss was already replaced by masked cross entropy
    yield finding(
        ctx,
        (),
        f"knowledge distillation with pp_size={ctx.dims.pp} and loss_fn "
        f"{w.loss}: the KD recipe raises ValueError in setup (PP KD needs a loss on logits and labels)",
        "loss_fn: MaskedCrossEntropy",
        recipe_path="loss_fn",
    )


@rule(
    "recipe-distributed-unsupported",
    family=F,
    severity="error",
    title="distributed: on a recipe that refuses one",
    patterns=(r"TrainVispecStage1Recipe does not support target-model sharding yet",),
    cause="TrainVispecStage1Recipe raises NotImplementedError when a distributed: section is given: it runs one "
    "target replica per rank.",
    fix="Remove distributed: (or set it to null).",
    section="recipe",
)
def recipe_distributed_unsupported(ctx: Context) -> Iterator[Finding]:
    if ctx.kind.recipe != "TrainVispecStage1Recipe" or not ctx.recipe:
        return
    if isinstance(ctx.recipe.get("distributed"), dict):
        yield finding(
            ctx,
            (),
            "TrainVispecStage1Recipe with a distributed: "
            "section: it raises NotImplementedError in setup (no target-model sharding yet)",
            "remove distributed: (one target replica per rank)",
            recipe_path="distributed",
        )


__all__ = [
    "KEEPS_OWN_PIPELINE_FORWARD",
    "LINEAR_CE",
    "LINEAR_CE_STEP_RECIPES",
    "megatron_root_hook_unfired",
    "NO_LOGITS_TO_KEEP",
    "VLM_RECIPES",
    "masked_ce_instead",
    "no_hidden_states",
    "no_logits_to_keep",
]
