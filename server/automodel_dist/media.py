"""A VLM recipe's images as its processor turns them into model inputs (pure: no torch, no transformers): the
resize to a patch grid, the grid's patches and the placeholder tokens each image takes in the sequence, for the
Qwen-VL processors (a resize within pixel bounds, flattened patches, merged 2 x 2 into a token), Gemma-3's (every
image resized to its SigLIP tower's square, pooled to ``mm_tokens_per_image`` tokens), Gemma-4's and Mistral3's Pixtral
processor (resized within a longest edge to whole merge cells, a row break token after each row of placeholders) and
Kimi-VL's (scaled within a patch limit, padded to whole merge cells) and Muse-Glimmer's (the grid of merge cells
nearest the image's aspect ratio within a token budget, flattened patches as Qwen-VL's). The estimate sizes the vision
tower's work from it and the dry run builds its batch from it; the tests hold ``smart_resize`` to transformers' own
``smart_resize``.

A recipe's data set is never read, so each sequence is assumed to carry ``IMAGES_PER_SAMPLE`` image(s) of
``IMAGE_PX`` pixels, resized within the recipe's processor bounds (``processor.min_pixels`` / ``max_pixels``), else
within the processor class's defaults (the checkpoint's own preprocessor_config.json is not read either).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

IMAGE_PX = (1024, 1024)  # (height, width) of the source image assumed per sequence
IMAGES_PER_SAMPLE = 1
# the image AutoModel injects into each text-only sample it pretokenizes (datasets/vlm/fake_image.py: a 56 x 56 white
# image, so that FSDP's collectives see the vision tower every step; dataset.inject_fake_images, default true)
FAKE_IMAGE_PX = (56, 56)
# transformers' Qwen2VLImageProcessor defaults (its size: shortest_edge / longest_edge)
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280


def is_qwen_tower(vision: Any) -> bool:
    """A Qwen-VL vision tower (Qwen2.5-VL's windowed one, Qwen3-VL's and Qwen3.5's with a learned position table)."""
    return isinstance(vision, dict) and ("num_position_embeddings" in vision or "fullatt_block_indexes" in vision)


def is_gemma3_tower(cfg: Any) -> bool:
    """Gemma-3's SigLIP tower and pooling projector, with the sizes its processor's resize needs: the tower's square
    ``image_size`` and patch, and the tokens an image is pooled to (a perfect square dividing the patch grid)."""
    if not (isinstance(cfg, dict) and cfg.get("model_type") == "gemma3"):
        return False
    vision, tokens = cfg.get("vision_config"), cfg.get("mm_tokens_per_image")
    if not (isinstance(vision, dict) and isinstance(vision.get("image_size"), int) and isinstance(tokens, int)):
        return False
    side = vision["image_size"] // int(vision.get("patch_size", 16))  # SiglipVisionConfig's default
    per_side = math.isqrt(max(tokens, 1))
    return per_side * per_side == tokens and side % per_side == 0


# transformers' Gemma4ImageProcessor default budget (5.18): soft tokens an image may take after pooling
GEMMA4_SOFT_TOKENS = 280


def is_gemma4_tower(cfg: Any) -> bool:
    """Gemma-4's own tower (patches of ``patch_size`` pooled ``pooling_kernel_size`` squared to a soft token, any
    aspect ratio within a token budget), with the image, begin- and end-of-image token ids its batch needs."""
    if not (isinstance(cfg, dict) and cfg.get("model_type") == "gemma4"):
        return False
    vision = cfg.get("vision_config")
    if not (isinstance(vision, dict) and vision.get("model_type") == "gemma4_vision"):
        return False
    return all(isinstance(cfg.get(k), int) for k in ("image_token_id", "boi_token_id", "eoi_token_id"))


# transformers' PixtralImageProcessor default (5.18): the longest edge an image is resized down to
PIXTRAL_LONGEST_EDGE = 1024


def is_pixtral_tower(cfg: Any) -> bool:
    """Mistral3's Pixtral tower and patch merger (Ministral-3, Mistral-Small-3.1, Devstral-Small-2), with the image
    token id its batch needs."""
    if not (isinstance(cfg, dict) and cfg.get("model_type") == "mistral3"):
        return False
    vision = cfg.get("vision_config")
    return (
        isinstance(vision, dict)
        and vision.get("model_type") == "pixtral"
        and isinstance(cfg.get("image_token_index", cfg.get("image_token_id")), int)
    )


# Kimi-VL's image processor (KimiVLImageProcessor, the checkpoint's remote code) as its preprocessor_config.json sets
# it (a public copy of a Kimi-VL-A3B-Instruct derivative's: in_token_limit 4,096, pad_input true, patch 14, merge 2 x 2)
KIMI_IN_TOKEN_LIMIT = 4096


def is_kimi_vl_tower(cfg: Any) -> bool:
    """Kimi-VL's MoonViT tower and projector, with the placeholder token id its batch needs."""
    if not (isinstance(cfg, dict) and cfg.get("model_type") == "kimi_vl"):
        return False
    vision = cfg.get("vision_config")
    return (
        isinstance(vision, dict)
        and vision.get("model_type") == "moonvit"
        and isinstance(cfg.get("media_placeholder_token_id"), int)
    )


# transformers' MuseGlimmerImageProcessor default (5.18): the merged tokens an image may take
MUSE_GLIMMER_IMAGE_TOKENS = 4096


def is_muse_glimmer_tower(cfg: Any) -> bool:
    """Muse-Glimmer's tower and adapter (AutoModel's native class), with the image token id its batch needs."""
    if not (isinstance(cfg, dict) and cfg.get("model_type") == "muse_glimmer"):
        return False
    vision = cfg.get("vision_config")
    return (
        isinstance(vision, dict)
        and vision.get("model_type") == "muse_glimmer_vision"
        and isinstance(cfg.get("image_token_id"), int)
    )


def muse_glimmer_resize(height: int, width: int, cell: int, max_tokens: int) -> tuple[int, int]:
    """transformers' Muse-Glimmer ``smart_resize`` (image_processing_muse_glimmer, 5.18): the whole grid of ``cell``
    pixel cells (patch x merge) nearest the image's aspect ratio within ``max_tokens`` cells, from the floors and
    ceilings of its ideal grid (ties resolved in the same order as transformers', which walks the same set)."""
    ideal_h, ideal_w = height / cell, width / cell
    ratio = ideal_w / ideal_h if ideal_h > 0 else 1.0
    if ideal_h * ideal_w > max_tokens:
        ideal_h = (max_tokens / ratio) ** 0.5
        ideal_w = ideal_h * ratio
    candidates = list(
        set(itertools.product([math.floor(ideal_h), math.ceil(ideal_h)], [math.floor(ideal_w), math.ceil(ideal_w)]))
    )
    candidates = [(h, w) for h, w in candidates if h >= 1 and w >= 1 and h * w <= max_tokens]
    if not candidates:
        candidates = [(max(1, round(ideal_h)), max(1, round(ideal_w)))]
    h, w = min(candidates, key=lambda grid: abs(grid[0] / grid[1] - height / width))
    return h * cell, w * cell


def moonvit_merge(vision: dict[str, Any]) -> tuple[int, int]:
    """MoonViT's merge kernel (patches merged into one token along each side), MoonViTConfig's default [2, 2]; a
    malformed one is refused (AutoModel's projector could not be built from it)."""
    merge = vision.get("merge_kernel_size", [2, 2])
    if isinstance(merge, (list, tuple)) and len(merge) == 2:
        if all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 64 for v in merge):
            return int(merge[0]), int(merge[1])
    raise ValueError(f"vision_config.merge_kernel_size must be two integers in [1, 64], got {merge!r}")


def kimi_resize(
    height: int, width: int, patch: int, merge: tuple[int, int], limit: int = KIMI_IN_TOKEN_LIMIT, pad: bool = True
) -> tuple[int, int]:
    """The Kimi-VL processor's rescale: scaled down, its aspect ratio kept, when it has more than ``limit`` whole
    patches, then padded (bottom and right) to whole cells of merge x patch pixels, the grid the tower's patch merger
    takes (``pad`` false: centre-cropped to whole patches instead, the class's own default)."""
    if (width // patch) * (height // patch) > limit:
        scale = math.sqrt(limit / ((width // patch) * (height // patch)))
        width, height = int(width * scale), int(height * scale)
    if not pad:
        return height - height % patch, width - width % patch
    cell_h, cell_w = merge[0] * patch, merge[1] * patch
    return -(-height // cell_h) * cell_h, -(-width // cell_w) * cell_w


def pixtral_resize(height: int, width: int, cell: int, longest_edge: int = PIXTRAL_LONGEST_EDGE) -> tuple[int, int]:
    """transformers' Pixtral resize (image_processing_pixtral.get_resize_output_image_size): scaled down, its aspect
    ratio kept and floored, until both sides are within ``longest_edge``, then rounded up to whole cells of ``cell``
    pixels (the processor's patch size times Mistral3's spatial merge)."""
    ratio = max(height / longest_edge, width / longest_edge)
    if ratio > 1:
        height, width = int(math.floor(height / ratio)), int(math.floor(width / ratio))
    return ((height - 1) // cell + 1) * cell, ((width - 1) // cell + 1) * cell


def gemma4_resize(height: int, width: int, patch: int, pooling: int, max_patches: int) -> tuple[int, int]:
    """transformers' ``get_aspect_ratio_preserving_size`` (gemma4, 5.18): the largest size of the image's aspect
    ratio whose sides are multiples of ``pooling * patch`` within ``max_patches`` patches."""
    side = pooling * patch
    factor = math.sqrt(max_patches * patch * patch / (height * width))
    h, w = math.floor(factor * height / side) * side, math.floor(factor * width / side) * side
    if h == 0 and w == 0:
        raise ValueError(f"a {height} x {width} image resizes to 0 x 0 for Gemma-4's {side}-pixel grid")
    longest = (max_patches // pooling**2) * side
    if h == 0:
        h, w = side, min(math.floor(width / height) * side, longest)
    elif w == 0:
        h, w = min(math.floor(height / width) * side, longest), side
    return h, w


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers' ``qwen2_vl`` ``smart_resize`` (5.18): both sides to multiples of ``factor``, the area within the
    bounds, the aspect ratio kept as closely as that allows."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclass(frozen=True)
class ImageGeometry:
    """One image as the model receives it."""

    grid: tuple[int, int, int]  # (t, h, w) patches
    patch_size: int
    merge: int  # patches per token along a side (Qwen-VL's spatial merge, Gemma-3's and Gemma-4's pooling kernel)
    processor: Literal["qwen", "gemma3", "gemma4", "pixtral", "kimi", "muse_glimmer"] = "qwen"
    padded_patches: int = 0  # the patches the processor pads every image to (Gemma-4's budget; 0: none)

    @property
    def pixels(self) -> tuple[int, int]:
        """(height, width) of the resized image."""
        return self.grid[1] * self.patch_size, self.grid[2] * self.patch_size

    @property
    def patches(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def tokens(self) -> int:
        """The placeholder tokens it takes in the ids: its patches merged ``merge`` squared to one."""
        return self.patches // (self.merge * self.merge)

    @property
    def sequence_tokens(self) -> int:
        """The tokens it takes in the sequence: its placeholders, and Pixtral's row break after each row of them (the
        last row's an image end)."""
        return self.tokens + (self.grid[1] // self.merge if self.processor == "pixtral" else 0)


def qwen_image(
    vision: dict[str, Any], image_px: tuple[int, int], bounds: tuple[int | None, int | None]
) -> ImageGeometry:
    """One image's patch grid: the processor's resize to multiples of patch x merge within the pixel bounds, then
    patches of ``patch_size`` (an image is one temporal step)."""
    patch, merge = int(vision.get("patch_size", 14)), int(vision.get("spatial_merge_size", 2))
    low, high = bounds[0] or DEFAULT_MIN_PIXELS, bounds[1] or DEFAULT_MAX_PIXELS
    h, w = smart_resize(image_px[0], image_px[1], patch * merge, low, high)
    return ImageGeometry(grid=(1, h // patch, w // patch), patch_size=patch, merge=merge)


def gemma3_image(cfg: dict[str, Any]) -> ImageGeometry:
    """One image as Gemma-3's processor hands it over: resized to the tower's ``image_size`` square whatever its own
    size (no pan-and-scan, the processor's default), its patches pooled to ``mm_tokens_per_image`` tokens."""
    vision = cfg["vision_config"]
    patch = int(vision.get("patch_size", 16))  # SiglipVisionConfig's default
    side = int(vision["image_size"]) // patch
    return ImageGeometry(
        grid=(1, side, side),
        patch_size=patch,
        merge=side // math.isqrt(int(cfg["mm_tokens_per_image"])),
        processor="gemma3",
    )


def gemma4_image(
    cfg: dict[str, Any], image_px: tuple[int, int], soft_tokens: int = GEMMA4_SOFT_TOKENS
) -> ImageGeometry:
    """One image as Gemma-4's processor hands it over: resized, its aspect ratio kept, to the largest grid of
    ``pooling_kernel_size * patch_size`` pixel cells within ``soft_tokens`` pooled tokens, its patches padded to that
    budget's ``soft_tokens * pooling**2``."""
    vision = cfg["vision_config"]
    patch, pooling = int(vision.get("patch_size", 16)), int(vision.get("pooling_kernel_size", 3))
    budget = soft_tokens * pooling * pooling
    h, w = gemma4_resize(image_px[0], image_px[1], patch, pooling, budget)
    return ImageGeometry(
        grid=(1, h // patch, w // patch), patch_size=patch, merge=pooling, processor="gemma4", padded_patches=budget
    )


def pixtral_image(cfg: dict[str, Any], image_px: tuple[int, int]) -> ImageGeometry:
    """One image as Mistral3's Pixtral processor hands it over: resized within the processor class's longest edge to
    whole cells of patch x spatial merge, its patches merged merge x merge into a placeholder token."""
    patch, merge = int(cfg["vision_config"].get("patch_size", 16)), int(cfg.get("spatial_merge_size", 2))
    h, w = pixtral_resize(image_px[0], image_px[1], patch * merge)
    return ImageGeometry(grid=(1, h // patch, w // patch), patch_size=patch, merge=merge, processor="pixtral")


def kimi_vl_image(cfg: dict[str, Any], image_px: tuple[int, int]) -> ImageGeometry:
    """One image as Kimi-VL's processor hands it over: within its patch limit, padded to whole merge cells, its
    patches merged merge x merge into a placeholder token."""
    vision = cfg["vision_config"]
    patch = int(vision.get("patch_size", 14))
    merge = moonvit_merge(vision)
    if merge[0] != merge[1]:
        raise ValueError(f"Kimi-VL's merge_kernel_size {list(merge)!r}: only a square merge is sized")
    h, w = kimi_resize(image_px[0], image_px[1], patch, merge)
    return ImageGeometry(grid=(1, h // patch, w // patch), patch_size=patch, merge=merge[0], processor="kimi")


def muse_glimmer_image(cfg: dict[str, Any], image_px: tuple[int, int]) -> ImageGeometry:
    """One image as Muse-Glimmer's processor hands it over: resized to whole cells of patch x merge pixels within its
    token budget, flattened patches (an image is one temporal step), merged merge x merge into a placeholder token."""
    vision = cfg["vision_config"]
    patch, merge = int(vision.get("patch_size", 14)), int(vision.get("merge_size", 2))
    h, w = muse_glimmer_resize(image_px[0], image_px[1], patch * merge, MUSE_GLIMMER_IMAGE_TOKENS)
    return ImageGeometry(grid=(1, h // patch, w // patch), patch_size=patch, merge=merge, processor="muse_glimmer")


def vlm_image(
    cfg: dict[str, Any], image_px: tuple[int, int], bounds: tuple[int | None, int | None]
) -> ImageGeometry | None:
    """One image of the assumed size as the model's processor hands it over (``cfg`` the whole config.json); None for
    a processor this module does not know."""
    if is_pixtral_tower(cfg):
        return pixtral_image(cfg, image_px)
    if is_kimi_vl_tower(cfg):
        return kimi_vl_image(cfg, image_px)
    if is_gemma3_tower(cfg):
        return gemma3_image(cfg)
    if is_gemma4_tower(cfg):
        return gemma4_image(cfg, image_px)
    if is_muse_glimmer_tower(cfg):
        return muse_glimmer_image(cfg, image_px)
    if is_qwen_tower(cfg.get("vision_config")):
        return qwen_image(cfg["vision_config"], image_px, bounds)
    return None


__all__ = [
    "GEMMA4_SOFT_TOKENS",
    "IMAGE_PX",
    "FAKE_IMAGE_PX",
    "IMAGES_PER_SAMPLE",
    "ImageGeometry",
    "PIXTRAL_LONGEST_EDGE",
    "gemma3_image",
    "gemma4_image",
    "gemma4_resize",
    "is_gemma3_tower",
    "is_gemma4_tower",
    "is_pixtral_tower",
    "is_kimi_vl_tower",
    "is_qwen_tower",
    "KIMI_IN_TOKEN_LIMIT",
    "kimi_resize",
    "kimi_vl_image",
    "moonvit_merge",
    "MUSE_GLIMMER_IMAGE_TOKENS",
    "is_muse_glimmer_tower",
    "muse_glimmer_image",
    "muse_glimmer_resize",
    "pixtral_image",
    "pixtral_resize",
    "qwen_image",
    "smart_resize",
    "vlm_image",
]
