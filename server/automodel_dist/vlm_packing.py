"""AutoModel's VLM neat packing as its packer fills packs (datasets/vlm/neat_packing_vlm.py, 0.7.0). Pure.

The packer counts each sample's tokens before tokenizing it: 500 an image or video where the precompute script's
``mm_inputs_meta`` is absent (the recipes' dataset builders, MedPix's among them, write none) and a token per 3
characters of text, one less for the shift. It fills a pack to ``int(pack_size * packing_ratio)`` of that count. A
pack's real length is its samples' tokens as the processor makes them, the samples past ``pack_size`` dropped. The
collate pads a batch to its longest pack, or to ``packed_sequence.collate_max_length`` where that is longer: without
it a step holds as many tokens as its pack, which the data decides, so the tools size the longest pack and say how
the packer's count compares with the model's image tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .media import IMAGE_PX, IMAGES_PER_SAMPLE, vlm_image

PACKER_MEDIA_TOKENS = 500  # _estimate_sample_length's count for an image or video without mm_inputs_meta
PACKER_CHARS_PER_TOKEN = 3  # ... and for text without precomputed _text_tokens


@dataclass(frozen=True)
class VlmPacking:
    """A VLM recipe's ``packed_sequence:`` as AutoModel's NeatPackConfig reads it."""

    pack_size: int
    packing_ratio: float = 1.0
    collate_max_length: int | None = None

    @property
    def capacity(self) -> int:
        """The packer's fill target, in its own count."""
        return int(self.pack_size * self.packing_ratio)

    @property
    def padded(self) -> bool:
        """Every batch padded to one length (collate_max_length, at least the longest pack)."""
        return self.collate_max_length is not None and self.collate_max_length >= self.pack_size


def packer_count(media: int, text_chars: int) -> int:
    """A sample's length as the packer counts it: ``media`` images or videos and ``text_chars`` characters of text."""
    return max(media * PACKER_MEDIA_TOKENS + text_chars // PACKER_CHARS_PER_TOKEN - 1, 0)


def media_only_samples(packing: VlmPacking, media_per_sample: int) -> int:
    """Samples of ``media_per_sample`` images and no text a pack takes: the most samples a pack can hold."""
    return max(1, packing.capacity // max(packer_count(media_per_sample, 0), 1))


def fill_note(packing: VlmPacking, seq_len: int, image_tokens: int | None, media_per_sample: int) -> str | None:
    """What the sized length means for a recipe whose packs are padded only to their own length (None: every batch
    is padded to one length, which is what is sized)."""
    if packing.padded:
        return None
    size, cap = packing.pack_size, packing.collate_max_length
    why = (
        "no packed_sequence.collate_max_length"
        if cap is None
        else f"collate_max_length {cap:,} is below pack_size {size:,}: a batch is padded to at least it, and a longer "
        "pack is left as it is, which AutoModel's collates do not take for a batch of several packs (its neat collate "
        "stacks them, its THD collate raises)"
    )
    sized = (
        f"sized at {seq_len:,} tokens (pack_size, the longest a pack can be)"
        if seq_len == size
        else f"sized at {seq_len:,} tokens as asked (a pack can hold up to pack_size {size:,})"
    )
    head = (
        f"VLM packing: each batch padded only to its longest pack ({why}), so a step holds as many tokens as its pack, "
        f"which the data decides: {sized}. AutoModel's packer fills a pack to {packing.capacity:,} tokens by its own "
        f"count, {PACKER_MEDIA_TOKENS} an image (no precomputed mm_inputs_meta) and one per {PACKER_CHARS_PER_TOKEN} "
        "characters of text"
    )
    if image_tokens is None:
        return head + "; --seq-len sizes the packs the data makes"
    per_sample = media_per_sample * image_tokens
    if image_tokens >= PACKER_MEDIA_TOKENS:
        return (
            f"{head}, where the assumed image takes {image_tokens}: packs of such samples fill to about "
            f"{image_tokens / PACKER_MEDIA_TOKENS:.2f} times that, up to pack_size (the samples past it dropped)"
        )
    n = media_only_samples(packing, media_per_sample)
    return (
        f"{head}, where the assumed image takes {image_tokens}: a pack holds at most {n} samples of "
        f"{media_per_sample} image(s) ({n * per_sample:,} image tokens, their text and chat template on top), so "
        "packs of short-text samples run well short of pack_size; --seq-len sizes the packs the data makes"
    )


def recipe_fill_note(
    packing: VlmPacking, cfg: dict[str, Any] | None, pixels: tuple[int | None, int | None], seq_len: int
) -> str | None:
    """``fill_note`` at the tools' assumed sample (media.py: ``IMAGES_PER_SAMPLE`` image(s) of ``IMAGE_PX``) as the
    model's processor makes it (``cfg`` the whole config.json; an unknown processor gives no token count)."""
    image = vlm_image(cfg, IMAGE_PX, pixels) if cfg else None
    return fill_note(packing, seq_len, image.sequence_tokens if image is not None else None, IMAGES_PER_SAMPLE)


__all__ = [
    "PACKER_CHARS_PER_TOKEN",
    "PACKER_MEDIA_TOKENS",
    "VlmPacking",
    "fill_note",
    "media_only_samples",
    "packer_count",
    "recipe_fill_note",
]
