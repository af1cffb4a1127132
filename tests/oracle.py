"""The real NeMo AutoModel 0.7.0 as a test oracle (tests and bench only; never used by the engine).

``run(block, world_size, ranks)`` loads the block through AutoModel's own ``ConfigNode`` (its YAML
value semantics), calls ``recipes._dist_utils.create_distributed_setup_from_config`` under a fake
process group of ``world_size`` ranks at each requested rank, and returns its verdict, mesh shapes
and every axis group it built.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

AVAILABLE = importlib.util.find_spec("nemo_automodel") is not None


@dataclass
class OracleRank:
    ok: bool
    error: str | None = None
    groups: dict[str, list[int]] = field(default_factory=dict)


@dataclass
class OracleResult:
    ok: bool  # accepted at every requested rank
    error: str | None  # first error text (type: message)
    device_mesh: tuple[list[str], list[int]] | None = None
    moe_mesh: tuple[list[str], list[int]] | None = None
    ranks: dict[int, OracleRank] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run(block: dict[str, Any], world_size: int, ranks: list[int] | None = None) -> OracleResult:
    """AutoModel's verdict and meshes for ``{"distributed": block}`` at ``world_size``."""
    import torch.distributed as dist
    from nemo_automodel.components.config.loader import ConfigNode
    from nemo_automodel.recipes._dist_utils import create_distributed_setup_from_config
    from torch.testing._internal.distributed.fake_pg import FakeStore

    ranks = ranks if ranks is not None else [0]
    result = OracleResult(ok=True, error=None)
    capture = _Capture()
    logger = logging.getLogger("nemo_automodel")
    logger.addHandler(capture)
    propagate, logger.propagate = logger.propagate, False
    try:
        for rank in ranks:
            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    cfg = ConfigNode({"distributed": copy.deepcopy(block)})
                    setup = create_distributed_setup_from_config(cfg, world_size=world_size)
                mc = setup.mesh_context
                groups: dict[str, list[int]] = {}
                dm, mm = mc.device_mesh, mc.moe_mesh
                if dm is not None:
                    result.device_mesh = ([str(n.value if hasattr(n, "value") else n) for n in dm.mesh_dim_names],
                                          list(dm.mesh.shape))
                    for name in dm.mesh_dim_names:
                        groups[str(getattr(name, "value", name))] = dist.get_process_group_ranks(dm[name].get_group())
                    for name, flat in getattr(dm, "_flatten_mapping", {}).items():
                        key = str(getattr(name, "value", name))
                        if key in ("dp", "dp_shard_cp", "dp_cp"):
                            groups[key] = dist.get_process_group_ranks(flat.get_group())
                if mm is not None:
                    result.moe_mesh = ([str(getattr(n, "value", n)) for n in mm.mesh_dim_names], list(mm.mesh.shape))
                    for name in mm.mesh_dim_names:
                        groups[str(getattr(name, "value", name))] = dist.get_process_group_ranks(mm[name].get_group())
                result.ranks[rank] = OracleRank(ok=True, groups=groups)
            except Exception as exc:  # noqa: BLE001 - any failure is AutoModel's verdict
                text = f"{type(exc).__name__}: {exc}"
                result.ranks[rank] = OracleRank(ok=False, error=text)
                if result.ok:
                    result.ok, result.error = False, text
            finally:
                dist.destroy_process_group()
    finally:
        logger.removeHandler(capture)
        logger.propagate = propagate
    result.warnings = capture.messages
    return result
