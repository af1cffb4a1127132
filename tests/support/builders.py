"""Small builders the unit tests share."""

from __future__ import annotations

from typing import Any


def dims(strategy: str = "fsdp2", *, dp: int = 1, **kw: Any) -> Any:
    """A :class:`ParallelDims` with ``dp`` data-parallel ranks (the world is dp*tp*cp*pp)."""
    from automodel_dist.dims import ParallelDims

    world = dp * kw.get("tp", 1) * kw.get("cp", 1) * kw.get("pp", 1)
    return ParallelDims(strategy, world_size=world, **kw)


def torch_version() -> tuple[int, int]:
    """(major, minor) of the installed torch."""
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)
