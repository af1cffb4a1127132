"""Which kind of AutoModel 0.7.0 config a YAML is, and where that kind reads its distributed setup.

Read from the ``recipe:`` class (a name, a dotted path or ``{_target_: ...}``, resolved by name only) or, without
one, from the sections it has. Each kind's facts are AutoModel's:

- the LLM, VLM, sequence-classification, retrieval, multimodal and dLLM recipes call
  ``create_distributed_setup_from_config`` on ``distributed:`` (a null or missing section crashes them);
- knowledge distillation does the same and builds ``teacher_model:`` with the student's setup (kd.py);
- ``TrainDiffusionRecipe`` never reads ``distributed:``: it parses a top-level ``fsdp:`` (or ``ddp:``) section
  with AutoModel's own parser and its own defaults (diffusion/train.py ``_build_diffusion_mesh_context``);
- the speculative-decoding recipes (EAGLE, DFlash, ...) read ``distributed:`` only when it is given
  (``if self.cfg.get("distributed", None) is not None``): without it every rank holds a whole target replica;
  ``TrainVispecStage1Recipe`` refuses one;
- the diffusion generation script (examples/diffusion/generate/generate.py) is no recipe: ``distributed: null``
  makes it run one process with no process group (``maybe_init_distributed`` returns None);
- ``MineHardNegativesRecipe`` only initialises the process group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The short names AutoModel 0.7.0's CLI accepts for `recipe:` (cli/utils.py::_discover_recipe_classes).
RECIPE_CLASSES = frozenset(
    {
        "BenchmarkingRecipeForNextTokenPrediction",
        "DiffusionGemmaSFTRecipe",
        "DiffusionLMSFTRecipe",
        "EmbeddingDistillRecipe",
        "FinetuneRecipeForMultimodal",
        "FinetuneRecipeForVLM",
        "KnowledgeDistillationRecipeForNextTokenPrediction",
        "KnowledgeDistillationRecipeForVLM",
        "MineHardNegativesRecipe",
        "PeagleRecipeMixin",
        "PretrainRecipeForMultimodal",
        "TrainBiEncoderRecipe",
        "TrainCrossEncoderRecipe",
        "TrainDFlash2Recipe",
        "TrainDFlashRecipe",
        "TrainDSparkRecipe",
        "TrainDiffusionRecipe",
        "TrainDominoRecipe",
        "TrainEagle1Recipe",
        "TrainEagle2Recipe",
        "TrainEagle3Recipe",
        "TrainFinetuneRecipeForNextTokenPrediction",
        "TrainFinetuneRecipeForSequenceClassification",
        "TrainJetSpecRecipe",
        "TrainVispecRecipe",
        "TrainVispecStage1Recipe",
    }
)
# Recipes whose setup raises NotImplementedError when pp_size > 1 (and their subclasses).
NO_PP_RECIPES = frozenset(
    {
        "FinetuneRecipeForMultimodal",
        "PretrainRecipeForMultimodal",
        "TrainBiEncoderRecipe",
        "EmbeddingDistillRecipe",
        "TrainCrossEncoderRecipe",
    }
)
# llm/train_ft.py's recipe and the subclasses that run its setup.
TRAIN_FT_RECIPES = frozenset(
    {
        "TrainFinetuneRecipeForNextTokenPrediction",
        "BenchmarkingRecipeForNextTokenPrediction",
        "KnowledgeDistillationRecipeForNextTokenPrediction",
        "DiffusionLMSFTRecipe",
        "DiffusionGemmaSFTRecipe",
    }
)
SPECULATIVE_RECIPES = frozenset(
    {
        "TrainEagle1Recipe",
        "TrainEagle2Recipe",
        "TrainEagle3Recipe",
        "TrainVispecRecipe",
        "TrainVispecStage1Recipe",
        "TrainDFlashRecipe",
        "TrainDFlash2Recipe",
        "TrainDominoRecipe",
        "TrainJetSpecRecipe",
        "TrainDSparkRecipe",
    }
)
KD_RECIPES = frozenset({"KnowledgeDistillationRecipeForNextTokenPrediction", "KnowledgeDistillationRecipeForVLM"})
# Recipes whose step feeds media (images, video, audio) besides tokens, and those whose step is a diffusion LM's
# masked denoising: neither is the next-token step (what the dry run runs)
MEDIA_RECIPES = frozenset(
    {
        "FinetuneRecipeForVLM",
        "KnowledgeDistillationRecipeForVLM",
        "FinetuneRecipeForMultimodal",
        "PretrainRecipeForMultimodal",
    }
)
# Recipes whose model build parses freeze_config (model_utils.parse_freeze_config, strict since 0.7.0): train_ft's and
# its subclasses, the VLM and multimodal finetunes, sequence classification and the retrieval encoders
FREEZE_CONFIG_RECIPES = TRAIN_FT_RECIPES | {
    "FinetuneRecipeForVLM",
    "KnowledgeDistillationRecipeForVLM",
    "FinetuneRecipeForMultimodal",
    "PretrainRecipeForMultimodal",
    "TrainFinetuneRecipeForSequenceClassification",
    "TrainBiEncoderRecipe",
    "TrainCrossEncoderRecipe",
    "EmbeddingDistillRecipe",
}
# The recipes whose step is vlm/finetune.py's (images in the batch, the model output kept through backward)
VLM_STEP_RECIPES = frozenset({"FinetuneRecipeForVLM", "KnowledgeDistillationRecipeForVLM"})
DIFFUSION_LM_RECIPES = frozenset({"DiffusionLMSFTRecipe", "DiffusionGemmaSFTRecipe"})
# Recipes that build CheckpointingConfig from the YAML with RecipeConfig.checkpoint (model-derived keys overwrite
# the YAML's); the speculative and multimodal recipes build their own (the YAML's win).
RECIPE_CONFIG_CHECKPOINT = TRAIN_FT_RECIPES | {
    "FinetuneRecipeForVLM",
    "KnowledgeDistillationRecipeForVLM",
    "TrainFinetuneRecipeForSequenceClassification",
    "TrainBiEncoderRecipe",
    "TrainCrossEncoderRecipe",
    "EmbeddingDistillRecipe",
    "TrainDiffusionRecipe",
}


@dataclass(frozen=True)
class RecipeKind:
    """What kind of config this is and where AutoModel reads its distributed setup."""

    name: str  # training | distillation | diffusion-training | diffusion-generation | speculative | hard-negatives
    recipe: str | None  # the recipe class's name, when the YAML gives one
    recipe_path: str = "recipe"  # where it is given (recipe, recipe._target_)
    section: str | None = "distributed"  # the section AutoModel parses as the distributed setup; None: none is
    distributed_optional: bool = False  # a null or missing section is a supported configuration
    reads_distributed: bool = True  # whether a `distributed:` section is read at all
    teacher: bool = False  # builds teacher_model: with the student's setup
    checkpoint_from_recipe_config: bool = True  # RecipeConfig.checkpoint (model-derived keys overwrite the YAML's)

    @property
    def checks_checkpoint(self) -> bool:
        return self.name != "diffusion-generation" and self.name != "hard-negatives"


def recipe_class(data: Mapping[str, Any] | None) -> tuple[str | None, str, bool]:
    """The `recipe:` (a name, a dotted path or {_target_: ...}): (class name, YAML path of the value, whether it is a
    bare name that AutoModel's CLI looks up among its own classes)."""
    raw = data.get("recipe") if isinstance(data, Mapping) else None
    where = "recipe"
    if isinstance(raw, Mapping):
        raw, where = raw.get("_target_"), "recipe._target_"
    if not isinstance(raw, str) or not raw.strip():
        return None, where, False
    name = raw.strip()
    return name.rsplit(".", 1)[-1], where, where == "recipe" and "." not in name


def recipe_kind(data: Mapping[str, Any] | None) -> RecipeKind:
    """The kind of a recipe mapping (a bare ``distributed:`` block is a training block)."""
    name, where, _ = recipe_class(data)
    keys = {k for k in data if isinstance(k, str)} if isinstance(data, Mapping) else set()
    if name == "TrainDiffusionRecipe" or (name is None and keys & {"fsdp", "ddp"} and "flow_matching" in keys):
        return RecipeKind(
            "diffusion-training", name, where, section="ddp" if "ddp" in keys else "fsdp", reads_distributed=False
        )
    if name is None and "inference" in keys and "model" in keys and keys & {"output", "vae", "pipeline"}:
        return RecipeKind(
            "diffusion-generation",
            None,
            where,
            section=None,
            distributed_optional=True,
            checkpoint_from_recipe_config=False,
        )
    if name in SPECULATIVE_RECIPES or (name is None and "recipe_args" in keys):
        return RecipeKind("speculative", name, where, distributed_optional=True, checkpoint_from_recipe_config=False)
    if name in KD_RECIPES or (name is None and "teacher_model" in keys):
        return RecipeKind("distillation", name, where, teacher=True)
    if name == "MineHardNegativesRecipe":
        return RecipeKind("hard-negatives", name, where, section=None, reads_distributed=False)
    if name in ("FinetuneRecipeForMultimodal", "PretrainRecipeForMultimodal"):
        return RecipeKind("training", name, where, checkpoint_from_recipe_config=False)
    return RecipeKind(
        "training", name, where, checkpoint_from_recipe_config=name is None or name in RECIPE_CONFIG_CHECKPOINT
    )


DIFFUSION_FSDP_KEYS = (
    "use_hf_tp_plan",
    "cp_ring_degree",
    "cp_ulysses_degree",
    "backend",
    "cpu_offload",
    "reduce_dtype",
)  # consumed by the diffusion recipe before AutoModel's parser sees the section
DIFFUSION_FSDP_DEFAULTS = {
    "strategy": "fsdp2",
    "activation_checkpointing": True,
    "defer_fsdp_grad_sync": True,
    "enable_fsdp2_prefetch": True,
}


__all__ = [
    "RecipeKind",
    "recipe_kind",
    "recipe_class",
    "RECIPE_CLASSES",
    "NO_PP_RECIPES",
    "TRAIN_FT_RECIPES",
    "SPECULATIVE_RECIPES",
    "KD_RECIPES",
    "FREEZE_CONFIG_RECIPES",
    "VLM_STEP_RECIPES",
    "DIFFUSION_FSDP_KEYS",
    "DIFFUSION_FSDP_DEFAULTS",
]
