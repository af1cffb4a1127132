"""The MCP server (official ``mcp`` SDK, v2 API): the engine's functions as typed tools.

Start-up imports only the SDK and the report models (no torch, no rule table); the engine loads on
the first tool call and torch only in the smoke runner's processes. ``automodel-dist serve`` and
``automodel-dist-mcp`` (both :mod:`automodel_dist.serve`) build the server before the transport
starts, so a broken install fails on stderr before any handshake. Invalid configs come
back as findings (structured content), never as protocol errors; bad arguments come back as error
results and the server keeps serving.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from .catalog.listing import Catalogs
from .config.files import (
    ALLOWED_ROOTS_ENV,
    MAX_BYTES,
    MAX_OVERRIDE_CHARS,
    MAX_OVERRIDES,
    allowed_roots,
    check_path,
    is_dir,
)
from .dry_run.report import DryRunReport
from .estimate.report import Estimate
from .report import ConfigError, ExplainReport, Finding, MeshReport, ValidationReport
from .request import Request
from .smoke.report import SmokeReport
from .suggest.report import SuggestReport

log = logging.getLogger("automodel_dist.mcp")

NAME = "nemo-automodel-distributed-training"
INSTRUCTIONS = """Tools for NeMo AutoModel 0.7.0 `distributed:` configs (FSDP2, HSDP, MegatronFSDP, DDP; TP/SP, PP, CP, EP).
- Before launching or editing a config: call validate_config (pass world_size, or nodes and gpus_per_node, the
  model and the cluster's torch version when known; when the job is launched with `--dotted.key=value` arguments,
  pass them as overrides=["dotted.key=value", ...]). It returns every finding at once with YAML line, message and
  fix; apply the fixes and re-validate.
- To see which ranks form each tp/cp/pp/dp/ep group (and which groups cross nodes): build_mesh.
- "Which layout for model M on N nodes of G GPUs?": suggest_strategy (ranked layouts, each with a ready YAML block,
  per-GPU memory, step time and rationale; give the recipe as config_yaml/config_path to take its model, cluster
  and sizes and compare its own layout). For memory of a given config: estimate_memory.
- To prove a layout really runs and matches one process before spending GPU hours: run_smoke_test (launches real
  processes on this machine; takes 10-60 s; reports progress; cancellable). For the same check on the cluster's
  GPUs at full size, the CLI: `automodel-dist smoke RECIPE --world-size N --export DIR`, the printed
  torchrun/srun line, then `automodel-dist smoke --judge DIR`.
- Before booking the cluster for a recipe: dry_run runs AutoModel's own code for it at full size and world size on
  fake tensors (about a minute): its real per-GPU memory, or the exception AutoModel would raise. estimate_memory is
  the instant analytic figure, for comparing many layouts.
- When the user pastes an AutoModel/torch error or traceback: explain_error.
- list_models: the model and GPU catalogs (names accepted by `model` and `gpu`).
Sizes: world = dp*cp*tp*pp; ep must divide dp*cp*tp (not dp*cp); megatron_fsdp has no pp/ep; ddp has no tp/pp/cp/ep."""

MAX_YAML_CHARS = MAX_BYTES
MAX_TEXT_CHARS = 200_000

ConfigYaml = Annotated[
    str | None,
    Field(default=None, max_length=MAX_YAML_CHARS, description="The recipe or distributed: block as YAML text."),
]
ConfigPath = Annotated[
    str | None, Field(default=None, max_length=4096, description="Path of a YAML file (a regular file, at most 1 MiB).")
]
WorldSize = Annotated[int | None, Field(default=None, ge=1, le=1 << 24, description="Total ranks (GPUs).")]
Nodes = Annotated[int | None, Field(default=None, ge=1, le=1 << 20, description="Number of nodes.")]
GpusPerNode = Annotated[int | None, Field(default=None, ge=1, le=1024, description="GPUs per node.")]
MODEL_HELP = (
    "Hugging Face repo id (read from the local Hugging Face cache, else the built-in catalog: list_models), or a "
    "config.json path or model folder"
)
ModelArg = Annotated[
    str | None,
    Field(
        default=None,
        max_length=4096,
        description=MODEL_HELP + " (default: the recipe's model.pretrained_model_name_or_path).",
    ),
]
FetchConfig = Annotated[
    bool,
    Field(
        description=(
            "May download the model's config.json alone from the Hugging Face Hub (never weights) when it is neither "
            "a path, in the local cache nor in the catalog."
        )
    ),
]
TorchVersion = Annotated[
    str | None,
    Field(
        default=None,
        max_length=64,
        description=(
            "The torch release the job will run on (torch.__version__ there, e.g. 2.15.0+cu132): AutoModel 0.7.0's FSDP2 "
            "path fails on torch >= 2.15."
        ),
    ),
]

MemoryGib = Annotated[
    float | None, Field(default=None, gt=0, le=1 << 20, description=("Override the GPU's memory (GiB)."))
]
IntraGbps = Annotated[
    float | None,
    Field(
        default=None,
        gt=0,
        le=1 << 20,
        description=("Override the GB/s per GPU, one direction, inside a node (default: the GPU's, see list_models)."),
    ),
]
InterGbps = Annotated[
    float | None,
    Field(
        default=None,
        gt=0,
        le=1 << 20,
        description=("Override the GB/s per GPU, one direction, to other nodes (default: the GPU's, see list_models)."),
    ),
]
Gpu = Annotated[
    str,
    Field(max_length=64, description="A100-40GB, A100-80GB, H100-80GB, H200-141GB, B200, GB200, L40S (list_models)"),
]
SeqLen = Annotated[
    int | None,
    Field(default=None, ge=16, le=1 << 22, description="Tokens per sequence (default: the recipe's, else 4096)."),
]
MicroBatch = Annotated[int | None, Field(default=None, ge=1, le=4096, description="Sequences per microbatch.")]
GlobalBatch = Annotated[int | None, Field(default=None, ge=1, le=1 << 24, description="Sequences per step.")]
Precision = Literal["auto", "bf16", "bf16-mixed", "fp32"]
Headroom = Annotated[float, Field(ge=0.0, lt=1.0, description="Fraction of GPU memory kept free.")]
LaunchOverrides = Annotated[
    list[Annotated[str, Field(max_length=MAX_OVERRIDE_CHARS)]] | None,
    Field(
        default=None,
        max_length=MAX_OVERRIDES,
        description=(
            "The launch command's overrides as 'dotted.key=value' (`--distributed.tp_size 4` is "
            "'distributed.tp_size=4'), applied after the YAML the way AutoModel applies them."
        ),
    ),
]


class MeshResult(BaseModel):
    """build_mesh's answer: the meshes when the config is valid, its findings when it is not."""

    valid: bool
    mesh: MeshReport | None = None
    findings: list[Finding] = Field(default_factory=list)


class EstimateResult(BaseModel):
    """estimate_memory's answer: the estimate when the config is valid, its findings when it is not."""

    valid: bool
    estimate: Estimate | None = None
    findings: list[Finding] = Field(default_factory=list)


class _Unreadable(ValueError):
    def __init__(self, finding: Finding):
        super().__init__(finding.message)
        self.finding = finding


def _config(config_yaml: str | None, config_path: str | None, *, required: bool = True) -> str | Path | None:
    """The config argument: YAML text, or a path checked (regular file, size cap, allowed roots) before reading."""
    if config_yaml is not None and config_path is not None:
        raise ValueError("give config_yaml or config_path, not both")
    if config_path is not None:
        problem = check_path(config_path, allowed_roots=allowed_roots())
        if problem is not None:
            raise _Unreadable(problem)
        return Path(config_path)
    if config_yaml is None and required:
        raise ValueError("give the config as config_yaml (YAML text) or config_path (a file)")
    return config_yaml


def _model_arg(model: str | None) -> str | None:
    """A model argument that names a file (config.json) passes the same checks as config_path."""
    from .catalog.models import names_a_file

    if model is None or not names_a_file(model):
        return model  # a catalog name
    problem = check_path(Path(model) / "config.json" if is_dir(model) else model, allowed_roots=allowed_roots())
    if problem is not None:
        raise _Unreadable(problem)
    return model


async def _with_progress(ctx: Context, work: Any, name: str) -> Any:
    """Run ``work(progress, cancel)`` in a thread, relaying its progress events as MCP progress notifications;
    when the client cancels (or the server goes down), set ``cancel`` and wait for the work to stop its processes."""
    import anyio

    cancel = threading.Event()
    events: deque[tuple[str, int, int, str]] = deque()
    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["result"] = work(lambda *e: events.append(e), cancel)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    count = 0
    try:
        while not done.is_set() or events:
            while events:
                phase, step, total, message = events.popleft()
                count += 1
                await ctx.report_progress(count, None, f"{phase} {step}/{total} {message}".strip())
            await anyio.sleep(0.1)
    except BaseException:
        cancel.set()
        with anyio.CancelScope(shield=True):
            deadline = time.time() + 30
            while not done.is_set() and time.time() < deadline:
                await anyio.sleep(0.05)
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def _anticipated(fn: Any) -> Any:
    """Bad arguments and inputs (``ValueError``, ``ConfigError``: an unknown model, both or neither config argument,
    an unreadable model file) reach the client as ``ToolError`` carrying their message, so the agent can correct
    the call; the SDK turns anything else into a bare "Error executing tool" (a crash's text stays here)."""
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except ValueError as exc:
                raise ToolError(str(exc)) from exc

        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ValueError as exc:
            raise ToolError(str(exc)) from exc

    return run


def create_server() -> MCPServer:
    server = MCPServer(name=NAME, instructions=INSTRUCTIONS, version=_version())
    ro = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    # fetch_config may reach the Hugging Face Hub (config.json alone), so these tools are open-world
    hub = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=True)

    @server.tool(annotations=hub)
    @_anticipated
    def validate_config(
        config_yaml: ConfigYaml = None,
        config_path: ConfigPath = None,
        world_size: WorldSize = None,
        nodes: Nodes = None,
        gpus_per_node: GpusPerNode = None,
        model: ModelArg = None,
        torch_version: TorchVersion = None,
        overrides: LaunchOverrides = None,
        fetch_config: FetchConfig = False,
    ) -> ValidationReport:
        """Check a NeMo AutoModel 0.7.0 recipe or distributed: block: every error AutoModel raises or hits mid-run
        (model- and cluster-aware), all at once, each with YAML line, message and fix. `valid` is the verdict."""
        try:
            config = _config(config_yaml, config_path)
            model = _model_arg(model)
        except _Unreadable as exc:  # an unreadable file is a finding, like any other config problem
            return ValidationReport(valid=False, source=config_path, findings=[exc.finding])
        from .api import validate_config as _validate_config

        request = Request.of(
            config,
            world_size=world_size,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            model=model,
            torch_version=torch_version,
            overrides=overrides,
            fetch_config=fetch_config,
        )
        return _validate_config(request)

    @server.tool(annotations=ro)
    @_anticipated
    def build_mesh(
        world_size: Annotated[
            int | None,
            Field(
                default=None,
                ge=1,
                le=1 << 24,
                description=("Total ranks (or nodes x gpus_per_node, or the recipe's ci: block)."),
            ),
        ] = None,
        config_yaml: ConfigYaml = None,
        config_path: ConfigPath = None,
        ranks: Annotated[
            list[Annotated[int, Field(ge=0)]] | None,
            Field(default=None, max_length=64, description="Ranks to list groups for (default: all up to 64, else 0)."),
        ] = None,
        gpus_per_node: GpusPerNode = None,
        picture_axis: Annotated[str | None, Field(default=None, max_length=32)] = None,
        overrides: LaunchOverrides = None,
        nodes: Nodes = None,
    ) -> MeshResult:
        """AutoModel's exact device_mesh / flattened axes / moe_mesh and each requested rank's groups on every axis,
        which groups cross nodes, and a text picture of ranks per node. No GPUs needed."""
        try:
            config = _config(config_yaml, config_path)
        except _Unreadable as exc:
            return MeshResult(valid=False, findings=[exc.finding])
        from .api import build_layout, mesh_report

        try:
            request = Request.of(
                config, world_size=world_size, nodes=nodes, gpus_per_node=gpus_per_node, overrides=overrides
            )
            lay, report = build_layout(request)
        except ConfigError as exc:
            if exc.report.world_size is None and not exc.report.errors:
                raise ValueError(
                    "the world size is unknown: give world_size, or nodes and gpus_per_node (or a "
                    "recipe with a ci: block)"
                ) from None
            return MeshResult(valid=False, findings=exc.report.findings)
        mesh = mesh_report(
            lay, report, ranks=ranks, gpus_per_node=gpus_per_node or report.gpus_per_node, picture_axis=picture_axis
        )
        return MeshResult(valid=True, mesh=mesh, findings=mesh.findings)

    @server.tool(annotations=hub)
    @_anticipated
    async def suggest_strategy(
        ctx: Context,
        model: Annotated[
            str | None,
            Field(
                default=None,
                max_length=4096,
                description=MODEL_HELP + "; required unless the recipe names one.",
            ),
        ] = None,
        nodes: Annotated[
            int | None,
            Field(default=None, ge=1, le=1 << 17, description=("Nodes (default: the recipe's ci: block, else 1).")),
        ] = None,
        gpus_per_node: GpusPerNode = None,
        gpu: Gpu = "H100-80GB",
        seq_len: SeqLen = None,
        global_batch_size: GlobalBatch = None,
        micro_batch_size: MicroBatch = None,
        precision: Precision = "auto",
        allow_activation_checkpointing: bool = True,
        headroom: Headroom = 0.1,
        top_k: Annotated[int, Field(ge=1, le=20)] = 5,
        memory_gib: MemoryGib = None,
        intra_gbps: IntraGbps = None,
        inter_gbps: InterGbps = None,
        strategies: Annotated[
            list[Literal["fsdp2", "megatron_fsdp", "ddp"]] | None,
            Field(
                default=None,
                min_length=1,
                max_length=3,
                description="Search only these strategies (default: all three).",
            ),
        ] = None,
        config_yaml: Annotated[
            str | None,
            Field(
                default=None,
                max_length=MAX_YAML_CHARS,
                description=(
                    "A recipe (YAML text): fills model, nodes, seq_len and batch sizes not given, and its own layout is "
                    "compared with the candidates."
                ),
            ),
        ] = None,
        config_path: ConfigPath = None,
        fetch_config: FetchConfig = False,
        verify: Annotated[
            int,
            Field(
                ge=0,
                le=5,
                description=(
                    "Measure the first N candidates with the dry run (AutoModel's own step on fake tensors, seconds "
                    "each, progress reported) when AutoModel is installed here; 0: estimates only."
                ),
            ),
        ] = 3,
    ) -> SuggestReport:
        """Ranked layouts for a model on a cluster that fit in memory: each with a ready distributed: YAML block,
        per-GPU memory breakdown, communication, step time, MFU and rationale; plus why alternatives were rejected.
        Where AutoModel is installed the top candidates are measured by the dry run (``measured``)."""
        from .suggest import suggest_strategy as _suggest
        from .verified import verify_candidates

        try:
            model = _model_arg(model)
            config = _config(config_yaml, config_path, required=False)
        except _Unreadable as exc:
            raise ValueError(exc.finding.message) from None
        request = Request.of(
            config,
            model=model,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            gpu=gpu,
            seq_len=seq_len,
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            memory_gib=memory_gib,
            intra_gbps=intra_gbps,
            inter_gbps=inter_gbps,
            fetch_config=fetch_config,
        )
        report = _suggest(
            request,
            precision=precision,
            allow_activation_checkpointing=allow_activation_checkpointing,
            headroom=headroom,
            top_k=top_k,
            strategies=strategies,
        )
        if not verify:
            return report

        def work(progress: Any, cancel: threading.Event) -> SuggestReport:
            return verify_candidates(report, request, top=verify, headroom=headroom, cancel=cancel, progress=progress)

        return await _with_progress(ctx, work, "suggest-verify")

    @server.tool(annotations=hub)
    @_anticipated
    def estimate_memory(
        model: Annotated[
            str | None,
            Field(
                default=None,
                max_length=4096,
                description=MODEL_HELP + " (default: the recipe's model.pretrained_model_name_or_path).",
            ),
        ] = None,
        config_yaml: ConfigYaml = None,
        config_path: ConfigPath = None,
        world_size: WorldSize = None,
        nodes: Nodes = None,
        gpus_per_node: GpusPerNode = None,
        gpu: Gpu = "H100-80GB",
        seq_len: SeqLen = None,
        micro_batch_size: MicroBatch = None,
        global_batch_size: GlobalBatch = None,
        precision: Precision = "auto",
        overrides: LaunchOverrides = None,
        headroom: Headroom = 0.1,
        memory_gib: MemoryGib = None,
        intra_gbps: IntraGbps = None,
        inter_gbps: InterGbps = None,
        fetch_config: FetchConfig = False,
    ) -> EstimateResult:
        """Per-GPU memory (params, grads, optimizer, activations, buffers, overhead), communication per axis, step
        time and MFU of the layout in a config. An invalid config returns its validation report instead."""
        from .estimate import estimate_memory as _estimate

        try:
            request = Request.of(
                _config(config_yaml, config_path),
                model=_model_arg(model),
                world_size=world_size,
                nodes=nodes,
                gpus_per_node=gpus_per_node,
                gpu=gpu,
                seq_len=seq_len,
                micro_batch_size=micro_batch_size,
                global_batch_size=global_batch_size,
                overrides=overrides,
                memory_gib=memory_gib,
                intra_gbps=intra_gbps,
                inter_gbps=inter_gbps,
                fetch_config=fetch_config,
            )
            est = _estimate(request, precision=precision, headroom=headroom)
        except _Unreadable as exc:
            return EstimateResult(valid=False, findings=[exc.finding])
        except ConfigError as exc:
            return EstimateResult(valid=False, findings=exc.report.findings)
        return EstimateResult(valid=True, estimate=est, findings=est.findings)

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False
        )
    )
    @_anticipated
    async def run_smoke_test(
        ctx: Context,
        world_size: Annotated[
            int | None,
            Field(
                default=None,
                ge=1,
                le=64,
                description=(
                    "Processes to launch (default 4, or the smallest number the layout is valid on when 4 is not)."
                ),
            ),
        ] = None,
        config_yaml: ConfigYaml = None,
        config_path: ConfigPath = None,
        steps: Annotated[int, Field(ge=1, le=20)] = 3,
        model: Literal["tiny-llama", "tiny-moe"] = "tiny-llama",
        stack: Annotated[
            Literal["auto", "automodel", "tiny"],
            Field(
                description="automodel: the recipe's architecture at tiny dims through AutoModel's own build, "
                "parallelizer, loss and step (a config naming no model: Llama-3.1-8B's or, with ep, Qwen3-30B-A3B's "
                "architecture); tiny: this tool's tiny model; auto: automodel when AutoModel is installed (a layout "
                "its stack cannot run here comes back not_run, with why), else tiny."
            ),
        ] = "auto",
        run_invalid: Annotated[
            bool, Field(description="Run even when validation finds errors, to see AutoModel's own failure.")
        ] = False,
        backend: Literal["gloo", "nccl"] | None = None,
        precision: Literal["auto", "fp32", "bf16"] = "auto",
        timeout_s: Annotated[float, Field(ge=5, le=3600)] = 600.0,
        strategy: Literal["fsdp2", "megatron_fsdp", "ddp"] | None = None,
        tp: Annotated[int | None, Field(default=None, ge=1, le=64)] = None,
        pp: Annotated[int | None, Field(default=None, ge=1, le=64)] = None,
        cp: Annotated[int | None, Field(default=None, ge=1, le=64)] = None,
        ep: Annotated[int | None, Field(default=None, ge=1, le=64)] = None,
        dp_replicate: Annotated[int | None, Field(default=None, ge=1, le=64)] = None,
        pp_schedule: Annotated[str | None, Field(default=None, max_length=32)] = None,
        sequence_parallel: bool | None = None,
        activation_checkpointing: bool | Literal["selective"] | None = None,
        fault: Annotated[
            str | None, Field(default=None, max_length=32, description="Testing only: crash@R:S, hang@R:S or skew@R:S.")
        ] = None,
        overrides: LaunchOverrides = None,
    ) -> SmokeReport:
        """Really run the layout on world_size local processes (torch elastic launcher; gloo on CPU, NCCL on GPUs).
        With AutoModel installed, the recipe's architecture (a config naming no model: Llama-3.1-8B's) at tiny dims
        is built, parallelized, trained and clipped by AutoModel's own code (stack automodel); without it, a tiny
        model through this tool's re-implementation of AutoModel's parallelize order (stack tiny). A few steps are compared with one process: loss, grad norm,
        first-step gradients and final parameters. Reports progress; cancelling stops every rank."""
        from .smoke import SmokeRequest
        from .smoke import run_smoke_test as _smoke

        request = SmokeRequest.of(
            _config(config_yaml, config_path, required=False),
            world_size=world_size,
            overrides=overrides,
            steps=steps,
            model=model,
            stack=stack,
            run_invalid=run_invalid,
            backend=backend,
            precision=precision,
            fault=fault,
            strategy=strategy,
            tp=tp,
            pp=pp,
            cp=cp,
            ep=ep,
            dp_replicate=dp_replicate,
            pp_schedule=pp_schedule,
            sequence_parallel=sequence_parallel,
            activation_checkpointing=activation_checkpointing,
        )

        def work(progress: Any, cancel: threading.Event) -> SmokeReport:
            return _smoke(request, timeout_s=timeout_s, cancel=cancel, progress=progress)

        return await _with_progress(ctx, work, "smoke-run")

    @server.tool(
        annotations=ToolAnnotations(
            read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=True
        )
    )
    @_anticipated
    async def dry_run(
        ctx: Context,
        config_yaml: ConfigYaml = None,
        config_path: ConfigPath = None,
        world_size: WorldSize = None,
        nodes: Nodes = None,
        gpus_per_node: GpusPerNode = None,
        model: ModelArg = None,
        ranks: Annotated[
            list[Annotated[int, Field(ge=0)]] | None,
            Field(
                default=None,
                max_length=16,
                description=(
                    "Ranks to measure (default: rank 0, or the first rank of each pipeline stage position where the "
                    "peak can fall: the first and last, and those whose stages hold more of a heavier layer kind)."
                ),
            ),
        ] = None,
        seq_len: SeqLen = None,
        micro_batch_size: MicroBatch = None,
        global_batch_size: GlobalBatch = None,
        num_layers: Annotated[
            int | None,
            Field(
                default=None,
                ge=1,
                le=1024,
                description=("Build only the first N layers (a quick look; the report says so)."),
            ),
        ] = None,
        full_depth: Annotated[
            bool,
            Field(
                description=(
                    "Build every layer. Default: a model whose layers repeat is built twice per rank at a shallow "
                    "depth and extrapolated per layer (seconds instead of minutes; the report says so)."
                )
            ),
        ] = False,
        gpu: Gpu = "H100-80GB",
        headroom: Headroom = 0.1,
        timeout_s: Annotated[float, Field(ge=10, le=3600)] = 900.0,
        overrides: LaunchOverrides = None,
        fetch_config: FetchConfig = False,
    ) -> DryRunReport:
        """Run NeMo AutoModel's own training step (its setup, model class, PEFT, parallelizer, loss and optimizer) for
        the recipe at full model size and world size on fake tensors: per measured rank the peak allocated memory and
        its split, or AutoModel's own exception. Needs AutoModel installed; takes seconds (a repeating model is built
        shallow and extrapolated per layer); reports progress; cancellable."""
        from .dry_run import DryRunUnavailable
        from .dry_run import dry_run as _dry_run

        request = Request.of(
            _config(config_yaml, config_path),
            world_size=world_size,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            model=_model_arg(model),
            seq_len=seq_len,
            micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size,
            overrides=overrides,
            gpu=gpu,
            fetch_config=fetch_config,
        )

        def work(progress: Any, cancel: threading.Event) -> DryRunReport:
            try:
                return _dry_run(
                    request,
                    ranks=ranks,
                    timeout_s=timeout_s,
                    num_layers=num_layers,
                    full_depth=full_depth,
                    headroom=headroom,
                    progress=progress,
                    cancel=cancel,
                )
            except DryRunUnavailable as exc:
                raise ValueError(str(exc)) from exc

        return await _with_progress(ctx, work, "dry-run")

    @server.tool(annotations=ro)
    @_anticipated
    def explain_error(
        text: Annotated[
            str, Field(max_length=MAX_TEXT_CHARS, description="An AutoModel/torch error message or traceback.")
        ],
    ) -> ExplainReport:
        """Match a pasted AutoModel / torch.distributed error or traceback to the rule that explains it: cause and
        fix (e.g. kv heads vs tp, pp_size without a pipeline block, ep vs dp*cp*tp, NCCL timeouts and setup errors,
        rendezvous failures, OOM)."""
        from .explain import explain_error as _explain_error

        return _explain_error(text)

    @server.tool(annotations=ro)
    @_anticipated
    def list_models() -> Catalogs:
        """The built-in model catalog (Hugging Face repo ids with their dimensions) and the GPU catalog."""
        from .catalog.listing import catalogs

        return catalogs()

    return server


def _version() -> str:
    from . import __version__

    return __version__


def _reap_smoke_runs() -> None:
    """At exit, kill the smoke runs still in flight (none unless a run_smoke_test call loaded the runner)."""
    launch = sys.modules.get("automodel_dist.smoke.launch")
    if launch is not None:
        launch.kill_all_active()


def serve(
    transport: str = "stdio",
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    allowed_hosts: list[str] | None = None,
    allowed_roots: list[str] | None = None,
    server: MCPServer | None = None,
) -> None:
    """Run ``server`` (default: :func:`create_server`) on stdio or streamable HTTP (loopback, DNS-rebinding
    protection on)."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if allowed_roots:
        os.environ[ALLOWED_ROOTS_ENV] = os.pathsep.join(str(Path(r).resolve()) for r in allowed_roots)
    atexit.register(_reap_smoke_runs)
    server = server or create_server()
    if transport == "stdio":
        server.run("stdio")
        return
    from mcp.server.transport_security import TransportSecuritySettings

    hosts = [f"{h}:*" for h in ("127.0.0.1", "localhost", "[::1]", host)] + [f"{h}:*" for h in allowed_hosts or []]
    origins = [f"http://{h}" for h in hosts]
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: reachable beyond this machine; DNS-rebinding protection stays on", host)
    server.run("streamable-http", host=host, port=port, transport_security=security)
