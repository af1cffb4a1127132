"""run_smoke_test: validate and plan a layout, then launch it and compare with one process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api import ConfigInput
from .launch import (
    DEFAULT_PG_TIMEOUT_S,
    DEFAULT_TIMEOUT_S,
    LAYOUT_KEYS,
    Plan,
    ProgressFn,
    SmokeUsageError,
    default_world_size,
    execute,
    make_plan,
)
from .report import SmokeReport

DEFAULT_CONFIG = {"distributed": {"strategy": "fsdp2", "tp_size": 2}}  # FSDP2 + TP 2 on 4 CPU ranks


def run_smoke_test(
    config: ConfigInput | None = None,
    *,
    world_size: int | None = None,
    steps: int = 3,
    model: str = "tiny-llama",
    stack: str = "auto",
    run_invalid: bool = False,
    backend: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S,
    progress: ProgressFn | None = None,
    precision: str = "auto",
    fault: str | dict | None = None,
    cancel: Any = None,
    keep_dir: bool = False,
    launcher: str = "elastic",
    overrides: Sequence[str] | None = None,
    **layout: Any,
) -> SmokeReport:
    """Run ``config``'s layout for real on ``world_size`` processes and compare with one process.

    ``world_size`` defaults to 4, or, when the layout is invalid on 4 ranks, to the smallest world it is valid
    on (up to the CPU limit; the report's notes say so).

    ``config`` is YAML text, a path or a mapping (None: the built-in FSDP2 + TP 2 default).
    ``overrides`` are the launch command's ``"dotted.key=value"`` overrides (as in ``validate_config``);
    the ``layout`` keywords (strategy, tp, pp, cp, ep, dp_replicate, pp_schedule, sequence_parallel,
    activation_checkpointing) then replace the config's values. ``progress(phase, step, total, message)``
    is called as the run advances; ``cancel`` (anything with ``is_set()``) stops it. ``fault``
    (``crash@R:S``, ``hang@R:S``, ``skew@R:S``) injects a failure for testing. ``precision`` is
    ``auto`` (the config's mp_policy; AutoModel's default is bf16), ``fp32`` or ``bf16``.
    ``stack`` is ``auto`` (AutoModel's own stack when it is installed: the recipe's architecture at tiny dims,
    else the tiny home-made model; the report says which ran and why), ``automodel`` or ``tiny``; ``model`` picks
    the tiny stack's model, and on AutoModel's stack the architecture when the config names no model.
    ``run_invalid`` runs a layout validation finds errors in (to see AutoModel's own failure).
    ``launcher`` is ``elastic`` (torch's elastic agent, ranks forked from a fork server: no per-rank torch import)
    or ``torchrun`` (the CLI, exactly the reproduce command).
    """
    if launcher not in ("elastic", "torchrun"):
        raise SmokeUsageError(f"launcher must be elastic or torchrun, got {launcher!r}")
    plan = plan_smoke_test(
        config,
        world_size=world_size,
        steps=steps,
        model=model,
        stack=stack,
        run_invalid=run_invalid,
        backend=backend,
        pg_timeout_s=pg_timeout_s,
        precision=precision,
        fault=fault,
        overrides=overrides,
        caller="run_smoke_test",
        **layout,
    )
    if isinstance(plan, SmokeReport):
        return plan
    return execute(plan, timeout_s=timeout_s, progress=progress, cancel=cancel, keep_dir=keep_dir, launcher=launcher)


def plan_smoke_test(
    config: ConfigInput | None,
    *,
    world_size: int | None,
    steps: int,
    model: str,
    backend: str | None,
    pg_timeout_s: float,
    precision: str,
    fault: str | dict | None,
    overrides: Sequence[str] | None,
    local: bool = True,
    stack: str = "auto",
    run_invalid: bool = False,
    caller: str = "plan_smoke_test",
    **layout: Any,
) -> Plan | SmokeReport:
    """The plan of a smoke run (what run_smoke_test launches and export_smoke_test writes), or the report of why
    it cannot run."""
    unknown = set(layout) - set(LAYOUT_KEYS)
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword argument(s): {sorted(unknown)}")
    if config is None:  # the default layout, unless layout keywords describe one
        config = {} if any(v is not None for v in layout.values()) else DEFAULT_CONFIG
    chosen = None
    if world_size is None:
        world_size, chosen = default_world_size(config, layout, overrides)
    plan = make_plan(
        config,
        world_size=world_size,
        steps=steps,
        model=model,
        backend=backend,
        precision=precision,
        fault=fault,
        pg_timeout_s=pg_timeout_s,
        layout=layout,
        overrides=overrides,
        local=local,
        stack=stack,
        run_invalid=run_invalid,
    )
    if chosen is not None:
        (plan.notes if isinstance(plan, SmokeReport) else plan.report_base["notes"]).insert(0, chosen)
    return plan
