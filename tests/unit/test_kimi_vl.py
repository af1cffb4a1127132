"""Kimi-VL (moonshotai/Kimi-VL-A3B-Instruct): its MoonViT images as the processor class's defaults make them, its tower
and projector counted as AutoModel's class builds them, and what freeze_vision_tower leaves trainable (the dry run's
step on AutoModel's class: tests/integration/test_dry_run.py; the whole model's parameters: tests/unit/test_catalog.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist import media
from automodel_dist.catalog.models import from_hf_config, lookup

KIMI = "moonshotai/Kimi-VL-A3B-Instruct"


def test_the_assumed_image_is_scaled_within_the_patch_limit_and_padded_to_merge_cells() -> None:
    """1,024 x 1,024 has 73 x 73 = 5,329 whole 14-pixel patches, over the checkpoint's 4,096: scaled by
    sqrt(4096 / 5329) to 897 x 897, then padded to whole 28-pixel cells, 924 x 924: a 66 x 66 grid, 1,089
    placeholder tokens."""
    image = media.vlm_image(lookup(KIMI).hf_config, (1024, 1024), (None, None))
    assert image is not None and image.processor == "kimi"
    assert image.pixels == (924, 924) and image.grid == (1, 66, 66) and image.tokens == 1089
    assert media.kimi_resize(500, 300, 14, (2, 2)) == (504, 308)  # within the limit: padded only
    assert media.kimi_resize(500, 300, 14, (2, 2), pad=False) == (490, 294)  # the class's own default: cropped


@settings(max_examples=200, deadline=None)
@given(height=st.integers(28, 4000), width=st.integers(28, 4000))
def test_every_grid_is_whole_merge_cells_padding_the_scaled_image(height: int, width: int) -> None:
    h, w = media.kimi_resize(height, width, 14, (2, 2))
    assert h % 28 == 0 and w % 28 == 0
    over = (height // 14) * (width // 14) > media.KIMI_IN_TOKEN_LIMIT
    scale = (media.KIMI_IN_TOKEN_LIMIT / ((height // 14) * (width // 14))) ** 0.5 if over else 1.0
    # the padding is less than a cell on each side of the (scaled) image
    assert 0 <= h - int(height * scale) < 28 and 0 <= w - int(width * scale) < 28


def test_the_tower_and_projector_are_counted_as_automodels_classes_build_them() -> None:
    """MoonViT: a biased patch convolution, a 64 x 64 position table, 27 LayerNorm blocks (fused biased qkv, output,
    GELU MLP) and a final norm; the projector: a LayerNorm, 4,608 -> 4,608 -> 2,048 with biases. The projector is what
    freeze_vision_tower leaves trainable (it freezes modules named for the tower)."""
    torch = pytest.importorskip("torch")
    model = pytest.importorskip("nemo_automodel.components.models.kimivl.model")
    spec = lookup(KIMI)
    cfg = model.KimiVLConfig(**{k: v for k, v in spec.hf_config.items() if k != "model_type"})
    with torch.device("meta"):
        tower = model.MoonVitPretrainedModel(cfg.vision_config)
        projector = model.KimiVLMultiModalProjector(cfg)
    counted = sum(p.numel() for p in [*tower.parameters(), *projector.parameters()])
    assert spec.vision_params == counted
    assert spec.projector_params == sum(p.numel() for p in projector.parameters()) == 30_679_808


@pytest.mark.parametrize("merge", [[2], [2, 0], "2x2", [2.0, 2]])
def test_a_merge_kernel_that_cannot_be_built_is_refused(merge: object) -> None:
    from automodel_dist.catalog.models import ModelConfigError

    cfg = dict(lookup(KIMI).hf_config)
    with pytest.raises(ModelConfigError, match="merge_kernel_size"):
        from_hf_config({**cfg, "vision_config": {**cfg["vision_config"], "merge_kernel_size": merge}})


def test_a_non_square_merge_is_not_fed_to_the_dry_run() -> None:
    cfg = dict(lookup(KIMI).hf_config)
    with pytest.raises(ValueError, match="merge_kernel_size"):
        media.kimi_vl_image(
            {**cfg, "vision_config": {**cfg["vision_config"], "merge_kernel_size": [2, 3]}}, (1024, 1024)
        )
