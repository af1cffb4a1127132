"""Muse-Glimmer-30B (meta-models/Muse-Glimmer-30B): its catalog entry, its images as its processor class's defaults
make them, and what the estimate and the dry run's plan say about them (the processor's resize against transformers'
own: tests/oracle/test_media.py; AutoModel's layer under its sub-module checkpointing: tests/oracle/test_kernel_facts.py;
its layer groups at a shallow depth: tests/integration/test_dry_run_depth.py; both recipes measured: the corpus
sweep)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist import media
from automodel_dist.catalog.models import lookup
from automodel_dist.dry_run.plan import plan_dry_run
from automodel_dist.estimate.api import estimate_memory
from automodel_dist.request import Request

MUSE = "meta-models/Muse-Glimmer-30B"
# the parts of AutoModel's CI recipe (vlm_finetune/muse_glimmer/muse_glimmer_30b_medpix_cp8.yaml) the tools read
CP8 = """
recipe: FinetuneRecipeForVLM
step_scheduler: {global_batch_size: 8, local_batch_size: 1}
model:
  _target_: nemo_automodel.NeMoAutoModelForCausalLM.from_pretrained
  pretrained_model_name_or_path: meta-models/Muse-Glimmer-30B
  torch_dtype: bfloat16
  backend: {attn: te}
distributed: {strategy: fsdp2, tp_size: 1, cp_size: 8, activation_checkpointing: true}
freeze_config: {freeze_vision_tower: true, freeze_audio_tower: true, freeze_language_model: false}
loss_fn: {_target_: nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy}
dataset: {_target_: nemo_automodel.components.datasets.vlm.datasets.make_medpix_dataset}
dataloader:
  collate_fn: {_target_: nemo_automodel.components.datasets.vlm.collate_fns.default_collate_fn, max_length: 4096}
optimizer: {_target_: torch.optim.AdamW, lr: 1.0e-5}
ci: {nodes: 1}
"""


def test_the_catalog_entry_is_the_30b_model_both_classes_build() -> None:
    """29,776,626,688 parameters, the count transformers' and AutoModel's classes give from these fields (the catalog
    test builds both); the whole tower, adapter and projection frozen by freeze_vision_tower (their names hold
    'vision'), the output gate and four norms a layer counted."""
    spec = lookup(MUSE)
    assert spec.param_count() == 29_776_626_688
    assert (spec.vision_params, spec.projector_params) == (1_921_845_760, 0)
    assert spec.attn_output_gate and spec.norms_per_layer == 4 and spec.final_softcap


def test_the_assumed_image_is_its_processors_grid() -> None:
    image = media.vlm_image(lookup(MUSE).hf_config, media.IMAGE_PX, (None, None))
    assert image is not None and image.processor == "muse_glimmer"
    assert (image.pixels, image.grid, image.tokens) == ((1036, 1036), (1, 74, 74), 1369)


@settings(max_examples=200, deadline=None)
@given(height=st.integers(1, 8000), width=st.integers(1, 8000))
def test_every_grid_is_whole_cells_within_the_budget(height: int, width: int) -> None:
    h, w = media.muse_glimmer_resize(height, width, 28, media.MUSE_GLIMMER_IMAGE_TOKENS)
    assert h % 28 == 0 and w % 28 == 0 and h >= 28 and w >= 28
    assert (h // 28) * (w // 28) <= media.MUSE_GLIMMER_IMAGE_TOKENS


def test_the_estimate_and_the_plan_say_how_the_image_is_sized(tmp_path: Path) -> None:
    recipe = tmp_path / "muse_glimmer_30b_medpix_cp8.yaml"
    recipe.write_text(CP8)
    report = estimate_memory(recipe)
    assert report.world_size == 8 and report.layout.cp == 8
    assert any("Muse-Glimmer's processor to 1036 x 1036" in line and "1369" in line for line in report.workload)
    plan = plan_dry_run(Request.of(recipe))
    assert not plan.not_measured
    assert any("Muse-Glimmer's processor" in a and "1369 placeholder tokens" in a for a in plan.assumed)
    assert not any("Qwen-VL" in a or "get_rope_index" in a for a in [*plan.assumed, *plan.substitutions])
