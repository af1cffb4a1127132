"""A VLM recipe's images as the model receives them (automodel_dist.media): the resize held to transformers' own
Qwen-VL processor and its default bounds (the dry run's VLM step itself: tests/integration/test_dry_run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist import media

transformers = pytest.importorskip("transformers")


@settings(max_examples=300, deadline=None)
@given(
    height=st.integers(28, 4096),
    width=st.integers(28, 4096),
    factor=st.sampled_from([28, 32]),
    low=st.sampled_from([56 * 56, 65536, 200704]),
    high=st.sampled_from([1003520, 4194304, 16777216]),
)
def test_the_resize_is_transformers_own(height: int, width: int, factor: int, low: int, high: int) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    if max(height, width) / min(height, width) > 200:
        return
    assert media.smart_resize(height, width, factor, low, high) == smart_resize(
        height, width, factor=factor, min_pixels=low, max_pixels=high
    )


def test_the_default_bounds_are_the_processor_classs() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    size = Qwen2VLImageProcessorPil.size
    assert (size["shortest_edge"], size["longest_edge"]) == (media.DEFAULT_MIN_PIXELS, media.DEFAULT_MAX_PIXELS)


def test_an_image_is_the_grid_and_tokens_the_processor_makes() -> None:
    """Qwen3-VL's 16-pixel patches merged 2 x 2: a 1,024-pixel square within the class's default bounds is resized
    to 992 pixels a side, 62 x 62 patches and 961 placeholder tokens (what the processor itself gives)."""
    image = media.qwen_image({"patch_size": 16, "spatial_merge_size": 2}, media.IMAGE_PX, (None, None))
    assert (image.grid, image.patches, image.tokens) == ((1, 62, 62), 3844, 961)
    capped = media.qwen_image({"patch_size": 14, "spatial_merge_size": 2}, (2084, 2084), (200704, 1003520))
    assert capped.grid == (1, 70, 70) and capped.tokens == 1225  # Shopify's largest photo at the recipe's bounds


@settings(max_examples=20, deadline=None)
@given(
    image_size=st.sampled_from([224, 448, 896]),
    patch=st.sampled_from([14, 16]),
    per_side=st.sampled_from([4, 8, 16]),
    height=st.integers(8, 1500),
    width=st.integers(8, 1500),
)
def test_a_gemma3_image_is_what_its_processor_and_projector_make(
    image_size: int, patch: int, per_side: int, height: int, width: int
) -> None:
    """Gemma-3's image processor resizes any image to the tower's square (its checkpoint's size, which the projector's
    fixed reshape requires) and the projector pools the patch grid to ``mm_tokens_per_image``: transformers' own
    processor and projector, against media.gemma3_image."""
    import numpy as np
    import torch
    from transformers import AutoConfig
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
    from transformers.models.gemma3.modeling_gemma3 import Gemma3MultiModalProjector

    side = image_size // patch
    if side % per_side:
        return
    cfg = {
        "model_type": "gemma3",
        "mm_tokens_per_image": per_side * per_side,
        "vision_config": {"model_type": "siglip_vision_model", "image_size": image_size, "patch_size": patch},
    }
    assert media.is_gemma3_tower(cfg)
    image = media.vlm_image(cfg, (height, width), (None, None))
    assert image is not None and image.processor == "gemma3"
    processor = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size})
    pixels = processor(np.zeros((height, width, 3), dtype=np.uint8), return_tensors="pt")["pixel_values"]
    assert tuple(pixels.shape) == (1, 3, *image.pixels)
    config = AutoConfig.for_model(
        "gemma3",
        mm_tokens_per_image=per_side * per_side,
        vision_config={"image_size": image_size, "patch_size": patch, "hidden_size": 8},
        text_config={"hidden_size": 8},
    )
    with torch.device("meta"):
        projector = Gemma3MultiModalProjector(config)
    assert (projector.patches_per_image, projector.kernel_size) == (image.grid[1], image.merge)
    assert image.tokens == projector.tokens_per_side**2 == config.mm_tokens_per_image


@settings(max_examples=300, deadline=None)
@given(
    height=st.integers(1, 6000),
    width=st.integers(1, 6000),
    soft_tokens=st.sampled_from([70, 140, 280, 560, 1120]),
    patch=st.sampled_from([14, 16]),
    pooling=st.sampled_from([2, 3]),
)
def test_the_gemma4_resize_is_transformers_own(height: int, width: int, soft_tokens: int, patch: int, pooling: int):
    """Gemma-4's aspect-ratio-keeping resize within its token budget, held to transformers' own (its error included)."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import get_aspect_ratio_preserving_size

    budget = soft_tokens * pooling * pooling
    try:
        theirs = get_aspect_ratio_preserving_size(height, width, patch, budget, pooling)
    except ValueError:
        with pytest.raises(ValueError):
            media.gemma4_resize(height, width, patch, pooling, budget)
        return
    assert media.gemma4_resize(height, width, patch, pooling, budget) == theirs


def test_a_gemma4_image_is_the_grid_tokens_and_padding_its_processor_makes() -> None:
    """The processor class's default budget (280 soft tokens, 3 x 3 pooling of 16-pixel patches): a 1,024-pixel square
    becomes 768 x 768, 48 x 48 patches padded to 2,520, and 256 soft tokens."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    assert Gemma4ImageProcessorPil.max_soft_tokens == media.GEMMA4_SOFT_TOKENS
    cfg = {
        "model_type": "gemma4",
        "image_token_id": 258880,
        "boi_token_id": 255999,
        "eoi_token_id": 258882,
        "vision_config": {"model_type": "gemma4_vision", "patch_size": 16, "pooling_kernel_size": 3},
    }
    assert media.is_gemma4_tower(cfg)
    image = media.vlm_image(cfg, media.IMAGE_PX, (None, None))
    assert image is not None and image.processor == "gemma4"
    assert (image.pixels, image.patches, image.padded_patches, image.tokens) == ((768, 768), 2304, 2520, 256)


@settings(max_examples=40, deadline=None)
@given(height=st.integers(28, 3000), width=st.integers(28, 3000))
def test_the_pixtral_image_is_the_one_transformers_processor_makes(height: int, width: int) -> None:
    """Mistral3's images (Ministral-3's tower: patches of 14 merged 2 x 2, so 28-pixel cells, as its processor passes
    them to the image processor): transformers' Pixtral image processor (its PIL backend, the class's defaults) resizes
    a height x width image to the pixels and image_sizes the dry run feeds, and the placeholders and row breaks are
    one a cell and one a row of cells (PixtralProcessor.replace_image_token)."""
    from PIL import Image
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    if max(height, width) / min(height, width) > 40:
        return
    out = PixtralImageProcessorPil()(
        images=[Image.new("RGB", (width, height))], patch_size={"height": 28, "width": 28}, return_tensors="np"
    )
    cfg = {
        "model_type": "mistral3",
        "image_token_index": 10,
        "spatial_merge_size": 2,
        "vision_config": {"model_type": "pixtral", "patch_size": 14},
    }
    image = media.vlm_image(cfg, (height, width), (None, None))
    assert image is not None and image.processor == "pixtral"
    assert tuple(out["pixel_values"].shape[2:]) == image.pixels == tuple(out["image_sizes"][0])
    rows, cols = image.pixels[0] // 28, image.pixels[1] // 28
    assert (image.tokens, image.sequence_tokens) == (rows * cols, rows * (cols + 1))


def test_the_pixtral_longest_edge_is_the_processor_classs() -> None:
    from transformers.models.pixtral.image_processing_pil_pixtral import PixtralImageProcessorPil

    assert PixtralImageProcessorPil.size["longest_edge"] == media.PIXTRAL_LONGEST_EDGE


def _muse_glimmer_processor() -> tuple[Any, dict[str, Any]]:
    """transformers' Muse-Glimmer ``smart_resize`` and its image processor's class defaults, read from the module's
    source: the module imports torchvision at its top, which this project's set-up does not install (torch's CPU
    wheel alone), and the function needs only math and itertools. The installed transformers' own file, compiled as
    it is; nothing else of it runs."""
    import ast
    import importlib.util
    import itertools
    import math

    spec = importlib.util.find_spec("transformers.models.muse_glimmer.image_processing_muse_glimmer")
    assert spec is not None and spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "smart_resize")
    namespace: dict[str, Any] = {"math": math, "itertools": itertools}
    exec(compile(ast.Module(body=[function], type_ignores=[]), spec.origin, "exec"), namespace)  # noqa: S102
    processor = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MuseGlimmerImageProcessor")
    defaults = {
        target.id: node.value.value
        for node in processor.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return namespace["smart_resize"], defaults


@settings(max_examples=300, deadline=None)
@given(
    height=st.integers(1, 6000),
    width=st.integers(1, 6000),
    cell=st.sampled_from([28, 32]),
    budget=st.sampled_from([256, 1024, 4096, 16384]),
)
def test_the_muse_glimmer_resize_is_transformers_own(height: int, width: int, cell: int, budget: int) -> None:
    theirs, _ = _muse_glimmer_processor()
    assert media.muse_glimmer_resize(height, width, cell, budget) == theirs(height, width, cell, budget)


def test_a_muse_glimmer_image_is_the_grid_and_tokens_its_processor_makes() -> None:
    """The processor class's defaults (14-pixel patches merged 2 x 2, at most 4,096 tokens an image): a 1,024-pixel
    square becomes 1,036 x 1,036, 74 x 74 patches and 1,369 placeholder tokens."""
    _, defaults = _muse_glimmer_processor()
    assert (defaults["patch_size"], defaults["merge_size"], defaults["temporal_patch_size"]) == (14, 2, 2)
    assert defaults["max_image_tokens"] == media.MUSE_GLIMMER_IMAGE_TOKENS
    cfg = {
        "model_type": "muse_glimmer",
        "image_token_id": 200092,
        "vision_config": {"model_type": "muse_glimmer_vision", "patch_size": 14, "merge_size": 2},
    }
    assert media.is_muse_glimmer_tower(cfg)
    image = media.vlm_image(cfg, media.IMAGE_PX, (None, None))
    assert image is not None and image.processor == "muse_glimmer"
    assert (image.pixels, image.grid, image.tokens) == ((1036, 1036), (1, 74, 74), 1369)
