"""run_smoke_test: validate and plan a layout, then launch it and compare with one process."""

from __future__ import annotations

from typing import Any

from typing_extensions import Unpack

from ..api import ConfigInput
from .launch import DEFAULT_TIMEOUT_S, Plan, ProgressFn, SmokeUsageError, default_world_size, execute, make_plan
from .report import SmokeReport
from .request import DEFAULT_CONFIG, SmokeOptions, SmokeRequest


def run_smoke_test(
    config: ConfigInput | SmokeRequest | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    progress: ProgressFn | None = None,
    cancel: Any = None,
    keep_dir: bool = False,
    launcher: str = "elastic",
    **options: Unpack[SmokeOptions],
) -> SmokeReport:
    """Run ``config``'s layout for real on ``world_size`` processes and compare with one process.

    ``config`` is YAML text, a path or a mapping (None: the built-in FSDP2 + TP 2 default), or a whole
    :class:`SmokeRequest`; ``options`` are its fields:

    - ``world_size`` defaults to 4, or, when the layout is invalid on 4 ranks, to the smallest world it is valid
      on (up to the CPU limit; the report's notes say so).
    - ``overrides`` are the launch command's ``"dotted.key=value"`` overrides (as in ``validate_config``); the layout
      keywords (strategy, tp, pp, cp, ep, dp_replicate, pp_schedule, sequence_parallel, activation_checkpointing)
      then replace the config's values.
    - ``fault`` (``crash@R:S``, ``hang@R:S``, ``skew@R:S``) injects a failure for testing. ``precision`` is ``auto``
      (the config's mp_policy; AutoModel's default is bf16), ``fp32`` or ``bf16``.
    - ``stack`` is ``auto`` (AutoModel's own stack when it is installed: the recipe's architecture at tiny dims,
      else the tiny home-made model; the report says which ran and why), ``automodel`` or ``tiny``; ``model`` picks
      the tiny stack's model, and on AutoModel's stack the architecture when the config names no model.
      ``run_invalid`` runs a layout validation finds errors in (to see AutoModel's own failure).

    ``progress(phase, step, total, message)`` is called as the run advances; ``cancel`` (anything with ``is_set()``)
    stops it. ``launcher`` is ``elastic`` (torch's elastic agent, ranks forked from a fork server: no per-rank torch
    import) or ``torchrun`` (the CLI, exactly the reproduce command).
    """
    if launcher not in ("elastic", "torchrun"):
        raise SmokeUsageError(f"launcher must be elastic or torchrun, got {launcher!r}")
    plan = plan_smoke_test(SmokeRequest.called("run_smoke_test", config, options))
    if isinstance(plan, SmokeReport):
        return plan
    return execute(plan, timeout_s=timeout_s, progress=progress, cancel=cancel, keep_dir=keep_dir, launcher=launcher)


def plan_smoke_test(request: SmokeRequest, *, local: bool = True) -> Plan | SmokeReport:
    """The plan of a smoke run (what run_smoke_test launches and export_smoke_test writes), or the report of why
    it cannot run."""
    chosen = None
    if request.world_size is None:
        world_size, chosen = default_world_size(request)
        request = request.replace(world_size=world_size)
    plan = make_plan(request, local=local)
    if chosen is not None:
        (plan.notes if isinstance(plan, SmokeReport) else plan.report_base["notes"]).insert(0, chosen)
    return plan


__all__ = ["run_smoke_test", "plan_smoke_test", "DEFAULT_CONFIG", "SmokeRequest"]
