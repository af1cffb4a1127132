"""The dry run's spec: what the planner hands one measured rank's process, as one typed object serialised to JSON
(no torch), as the smoke run's :class:`~automodel_dist.smoke.spec.SmokeSpec` is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from ..stack.recipe import StackRecipe
from .depth import Depth


class Build(BaseModel):
    """One model build: its config.json and ``distributed:`` block (a shallow build sets its own depth)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hf_config: dict[str, Any]
    distributed: dict[str, Any]


class Media(BaseModel):
    """The images each sequence of a VLM step carries, as its processor and collate function would hand them over:
    the Qwen-VL processors' flattened patches, one ``(t, h, w)`` grid per image and that many placeholder tokens
    (``grid_thw.prod() / merge**2``) in the ids. ``image_px`` is the source image, resized by the processor's own
    rule (transformers' ``smart_resize``) within the recipe's pixel bounds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image_px: tuple[int, int]  # (height, width) of each source image
    images_per_sample: int = 1
    min_pixels: int | None = None  # the recipe's processor bounds (None: the processor class's default)
    max_pixels: int | None = None
    pixel_dtype: str = "bfloat16"  # what reaches the model: the default collate casts to bf16, Qwen2.5's keeps fp32


class DryRunSpec(BaseModel):
    """One measured rank: the world it is a rank of, the model (``build``; ``builds``, two shallow builds measured
    instead and extrapolated to ``depth``), what AutoModel builds and trains (``recipe``) and the batch shapes of the
    step (``microbatches`` run, of ``micro_batch_size`` sequences; ``local_batch_size`` the pipeline's batch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int
    world_size: int
    build: Build
    recipe: StackRecipe
    micro_batch_size: int
    local_batch_size: int
    microbatches: int
    seq_len: int
    # pipeline schedule steps run (each of ``local_batch_size``): 2 where gradients carry from one to the next
    # (estimate/memory.py carries_across_schedule_steps), so the second runs with what the first left
    schedule_steps: int = 1
    builds: tuple[Build, Build] | None = None
    depth: Depth | None = None
    media: Media | None = None  # a VLM step's images (None: token batches)
    megatron_fsdp: bool = False  # the layout's strategy is MegatronFSDP (whatever alias the block spells it with)
    # the two shallow builds at once, the first in a process forked after the stack's imports (cores left idle by the
    # other ranks): each build has its own fake process group and tracker, so nothing measured is shared
    side_by_side: bool = False

    def measured_builds(self) -> list[Build]:
        """The builds the worker runs: the two shallow ones, else the model at its depth."""
        return list(self.builds) if self.builds else [self.build]

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(), encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> DryRunSpec:
        return cls.model_validate_json(Path(path).read_text(encoding="utf-8"))


__all__ = ["DryRunSpec", "Build", "Media"]
