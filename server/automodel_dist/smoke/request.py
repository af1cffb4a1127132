"""A smoke run's request: the job (config, launch overrides, world size) and how to run it, built once by the
surface (CLI, MCP tool, a Python call) and read by the planner, the local launch and the export alike."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from typing_extensions import Unpack

from ..request import ConfigInput, Request

DEFAULT_PG_TIMEOUT_S = 60.0
DEFAULT_CONFIG = {"distributed": {"strategy": "fsdp2", "tp_size": 2}}  # FSDP2 + TP 2 on 4 CPU ranks
LAYOUT_KEYS = {  # the layout keywords -> their key in distributed:
    "strategy": "strategy",
    "tp": "tp_size",
    "pp": "pp_size",
    "cp": "cp_size",
    "ep": "ep_size",
    "dp_replicate": "dp_replicate_size",
    "sequence_parallel": "sequence_parallel",
    "activation_checkpointing": "activation_checkpointing",
    "pp_schedule": "pipeline.pp_schedule",
}


class SmokeOptions(TypedDict, total=False):
    """The keywords of ``run_smoke_test`` / ``export_smoke_test`` that describe the run (see :class:`SmokeRequest`)."""

    world_size: int | None
    overrides: Sequence[str] | None
    steps: int
    model: str
    stack: str
    run_invalid: bool
    backend: str | None
    precision: str
    pg_timeout_s: float
    fault: str | dict | None
    strategy: str | None
    tp: int | None
    pp: int | None
    cp: int | None
    ep: int | None
    dp_replicate: int | None
    sequence_parallel: bool | None
    activation_checkpointing: bool | str | None
    pp_schedule: str | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SmokeRequest:
    """What to run: ``base``, the request every tool shares (the config, None for the built-in default; the launch command's overrides; the world
    size, None: 4 or the smallest valid) and how: ``steps``; ``model``, the tiny stack's model and AutoModel's
    architecture when the config names none; ``stack`` (auto, automodel, tiny); ``run_invalid``; ``backend``;
    ``precision`` (auto, fp32, bf16); ``pg_timeout_s``; ``fault`` (testing); ``layout``, keywords that replace the
    config's values (:data:`LAYOUT_KEYS`)."""

    base: Request = Request()
    steps: int = 3
    model: str = "tiny-llama"
    stack: str = "auto"
    run_invalid: bool = False
    backend: str | None = None
    precision: str = "auto"
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S
    fault: str | dict | None = None
    layout: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, config: ConfigInput | SmokeRequest | None = None, /, **options: Unpack[SmokeOptions]) -> SmokeRequest:
        """A request from a config and the keywords; a request given as ``config`` is returned with them replaced.
        Raises ``TypeError`` for an unknown keyword."""
        base = config if isinstance(config, SmokeRequest) else cls(base=Request.of(config))
        return base.replace(**options)

    @classmethod
    def called(cls, caller: str, config: ConfigInput | SmokeRequest | None, options: SmokeOptions) -> SmokeRequest:
        """:func:`of` for a public function: an unknown keyword's ``TypeError`` names ``caller``."""
        try:
            return cls.of(config, **options)
        except TypeError as exc:
            raise TypeError(f"{caller}() got {exc}") from None

    def replace(self, **options: Unpack[SmokeOptions]) -> SmokeRequest:
        opts: dict[str, Any] = dict(options)
        job = {k: opts.pop(k) for k in ("world_size", "overrides") if k in opts}
        layout = {k: opts.pop(k) for k in LAYOUT_KEYS if k in opts}
        unknown = (set(opts) - {f.name for f in dataclasses.fields(self)}) | ({"base", "layout"} & set(opts))
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {sorted(unknown)}")
        if job:
            opts["base"] = self.base.replace(**job)
        if layout:
            opts["layout"] = {**self.layout, **layout}
        return dataclasses.replace(self, **opts) if opts else self

    @property
    def config(self) -> ConfigInput:
        """The config to run: the job's, or the built-in default unless layout keywords describe one."""
        if self.base.config is not None:
            return self.base.config
        return {} if any(v is not None for v in self.layout.values()) else DEFAULT_CONFIG

    @property
    def job(self) -> Request:
        """The shared request with the config this run uses (:attr:`config`)."""
        return self.base.with_config(self.config)

    @property
    def world_size(self) -> int | None:
        return self.base.cluster.world_size

    @property
    def overrides(self) -> Sequence[str] | None:
        return self.base.job.overrides


__all__ = ["SmokeRequest", "SmokeOptions", "LAYOUT_KEYS", "DEFAULT_CONFIG", "DEFAULT_PG_TIMEOUT_S"]
