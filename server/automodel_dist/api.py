"""The public engine API. The CLI, the MCP server, scripts/ and the smoke worker call these."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from typing_extensions import Unpack

from .catalog.implementations import AUTOMODEL_VERSION
from .catalog.models import ModelConfigError, ModelSpec, from_hf_config, with_mtp_depth
from .catalog.sources import ModelSource, resolve
from .config import schema
from .config.kinds import DIFFUSION_FSDP_DEFAULTS, DIFFUSION_FSDP_KEYS, RecipeKind, recipe_kind
from .config.load import Document, clip, from_mapping, load_path, load_text
from .config.overrides import apply_overrides
from .config.values import TOP_LEVEL_KEYS, is_positive_int
from .dims import ParallelDims, read_dims
from .environment import installed_automodel
from .layout import MAX_LISTED, Layout
from .report import (
    SEVERITY_ORDER,
    AxisInfo,
    ConfigError,
    Finding,
    GroupSpec,
    MeshDims,
    MeshReport,
    Resolved,
    ValidationReport,
)
from .request import Cluster, ConfigInput, ModelInput, Overrides, Request, RequestFields
from .rules import Context, run_rules
from .workload import read_workload

TRAINING = RecipeKind("training", None)

MAX_WORLD_SIZE = 1 << 24  # 16.7M ranks: far beyond any cluster, small enough for exact arithmetic
MAX_GPUS_PER_NODE = 1024  # NVL72 racks have 72, NVL576 576: a "node" is at most one NVLink domain
DEFAULT_RANKS_LIMIT = 64  # build_mesh lists every rank's groups up to this world size, else rank 0

_RECIPE_SECTIONS = frozenset(
    {
        "recipe",
        "step_scheduler",
        "dist_env",
        "rng",
        "model",
        "checkpoint",
        "loss_fn",
        "dataset",
        "dataloader",
        "validation_dataset",
        "validation_dataloader",
        "optimizer",
        "lr_scheduler",
        "ci",
        "packed_sequence",
        "peft",
        "wandb",
        "mlflow",
        "processor",
        "freeze_config",
        "clip_grad_norm",
        "compile",
        "benchmark",
        "quantization",
        "distributed_config",
        "tokenizer",
        "qat",
        "fp8",
        "autopipeline",
        "seed",
    }
)
_BLOCK_KEYS = frozenset(TOP_LEVEL_KEYS) | {k for m in schema.STRATEGY_OPTIONS.values() for k in m.model_fields}


def _finding(
    rule: str,
    message: str,
    *,
    path: str = "<root>",
    line: int | None = None,
    fix: str | None = None,
    severity: str = "error",
) -> Finding:
    return Finding(rule=rule, severity=severity, path=path, line=line, message=message, fix=fix)


def load_config(config: ConfigInput, overrides: Overrides = None) -> Document:
    """Load any accepted config form into a :class:`Document` (never raises for bad content), with the
    launch command's ``overrides`` applied."""
    if isinstance(config, Path):
        doc = load_path(config)
    elif isinstance(config, (str, bytes)):
        doc = load_text(config)
    elif isinstance(config, Mapping):
        doc = from_mapping(dict(config))
    else:
        doc = Document(data=None)
        doc.findings.append(
            _finding(
                "yaml-root-not-mapping",
                f"config must be YAML text, a file path or a mapping, not {type(config).__name__}",
            )
        )
    if overrides is not None and isinstance(doc.data, dict):
        apply_overrides(doc, overrides, bare=_is_bare_block(doc.data))
    return doc


@dataclass
class _Split:
    block: dict[str, Any] | None
    base: tuple[Any, ...]
    recipe: dict[str, Any] | None
    kind: RecipeKind = TRAINING


def _is_bare_block(data: dict[Any, Any]) -> bool:
    """A bare ``distributed:`` block, not a recipe (one with a distributed: key, or with recipe sections and
    no block keys)."""
    if "distributed" in data:
        return False
    keys = {k for k in data if isinstance(k, str)}
    return not (keys & _RECIPE_SECTIONS and not keys & _BLOCK_KEYS)


def _split(doc: Document) -> _Split:
    """Find what AutoModel parses as the distributed setup: a recipe's ``distributed:`` (or, for the kinds that
    read another section or none, that), or a bare block."""
    data = doc.data
    if data is None:
        return _Split(None, (), None)
    if not isinstance(data, dict):
        doc.findings.append(
            _finding(
                "yaml-root-not-mapping",
                f"the config must be a mapping (a recipe or a distributed: block), got a {type(data).__name__}",
                line=1 if doc.from_yaml else None,
                fix="give a recipe (with a distributed: section) or a bare distributed: block",
            )
        )
        return _Split(None, (), None)
    if "distributed" not in data and _is_bare_block(data):
        return _Split(data, (), None)
    kind = recipe_kind(data)
    if kind.name == "diffusion-training":
        return _diffusion_block(doc, data, kind)
    if kind.name == "diffusion-generation":
        what = "is null" if data.get("distributed") is None else "is given"
        doc.findings.append(
            _finding(
                "recipe-kind",
                f"a diffusion generation config (inference:, no recipe: class): AutoModel's generate.py reads "
                f"distributed: only to start a process group; it {what}, so "
                + (
                    "it runs one process with no process group"
                    if data.get("distributed") is None
                    else "its parallel_scheme is not the training distributed: block and is not checked here"
                ),
                path="distributed",
                line=doc.line(("distributed",)),
                severity="info",
            )
        )
        return _Split({}, ("distributed",), data, kind)
    if not kind.reads_distributed:
        if "distributed" in data:
            doc.findings.append(
                _finding(
                    "recipe-distributed-ignored",
                    f"{kind.recipe} never reads distributed: (it only initialises the process group): the block is "
                    "ignored",
                    path="distributed",
                    line=doc.line(("distributed",)),
                    severity="warning",
                    fix="remove distributed:",
                )
            )
        return _Split({}, ("distributed",), data, kind)
    if "distributed" in data:
        block = data["distributed"]
        if block is None and kind.distributed_optional:
            doc.findings.append(
                _finding(
                    "recipe-kind",
                    f"{kind.recipe or 'this speculative-decoding recipe'} reads distributed: only when it is given: "
                    "with distributed: null every rank holds a whole replica of the target model",
                    path="distributed",
                    line=doc.line(("distributed",)),
                    severity="info",
                )
            )
            return _Split({}, ("distributed",), data, replace(kind, section=None))
        if not isinstance(block, dict):
            what = "empty (YAML null)" if block is None else f"a {type(block).__name__}"
            doc.findings.append(
                _finding(
                    "distributed-invalid",
                    f"distributed: is {what}, not a mapping; AutoModel cannot read it",
                    path="distributed",
                    line=doc.line(("distributed",)),
                    fix="write `distributed: {}` for the defaults, or give its keys",
                )
            )
            return _Split(None, ("distributed",), data, kind)
        return _Split(block, ("distributed",), data, kind)
    if kind.distributed_optional:
        return _Split({}, ("distributed",), data, replace(kind, section=None))
    doc.findings.append(
        _finding(
            "no-distributed-section",
            "the recipe has no distributed: section; AutoModel's defaults apply (strategy fsdp2, dp = world size)",
            severity="info",
        )
    )
    return _Split({}, ("distributed",), data, kind)


def _diffusion_block(doc: Document, data: dict[str, Any], kind: RecipeKind) -> _Split:
    """TrainDiffusionRecipe's distributed setup: its fsdp: (or ddp:) section through AutoModel's own parser, with
    the recipe's defaults (diffusion/train.py _build_diffusion_mesh_context)."""
    if "distributed" in data:
        doc.findings.append(
            _finding(
                "recipe-distributed-ignored",
                "TrainDiffusionRecipe never reads distributed: it builds its setup from the fsdp: (or ddp:) section, "
                "so this block is ignored",
                path="distributed",
                line=doc.line(("distributed",)),
                severity="warning",
                fix="move the sizes and options into fsdp: (or ddp:)",
            )
        )
    if "fsdp" in data and "ddp" in data:
        doc.findings.append(
            _finding(
                "recipe-distributed-ignored",
                "both fsdp: and ddp: are given: TrainDiffusionRecipe raises ValueError ('Cannot specify both 'fsdp' "
                "and 'ddp' configurations')",
                path="ddp",
                line=doc.line(("ddp",)),
                fix="keep one of fsdp: and ddp:",
            )
        )
    section = kind.section or "fsdp"
    raw = data.get(section)
    options = {k: v for k, v in raw.items() if k not in DIFFUSION_FSDP_KEYS} if isinstance(raw, dict) else {}
    if section == "ddp":
        block = {"strategy": "ddp", **options}
    else:  # the recipe sets mp_policy and offload_policy itself
        options = {k: v for k, v in options.items() if k not in ("mp_policy", "offload_policy")}
        block = {**DIFFUSION_FSDP_DEFAULTS, **options}
    return _Split(block, (section,), data, kind)


def _world(
    cluster: Cluster, recipe: dict[str, Any] | None, doc: Document, findings: list[Finding]
) -> tuple[int | None, str | None, int | None, int | None]:
    """Resolve (world_size, source, nodes, gpus_per_node) from the request or the recipe's ci: block."""
    world_size, nodes, gpus_per_node = cluster.world_size, cluster.nodes, cluster.gpus_per_node

    def positive(name: str, value: Any) -> int | None:
        if value is None:
            return None
        limit = MAX_GPUS_PER_NODE if name == "gpus_per_node" else MAX_WORLD_SIZE
        if not is_positive_int(value) or value > limit:
            findings.append(
                _finding(
                    "world-size-invalid",
                    f"{name} must be a positive integer <= {limit:,}, got {clip(repr(value))}",
                    fix=f"pass a positive {name}",
                )
            )
            return None
        return value

    world = positive("world_size", world_size)
    nodes_i, gpn = positive("nodes", nodes), positive("gpus_per_node", gpus_per_node)
    bad_args = (
        (world_size is not None and world is None)
        or (nodes is not None and nodes_i is None)
        or (gpus_per_node is not None and gpn is None)
    )
    if bad_args:
        return None, None, nodes_i, gpn
    if world is not None:
        return world, "argument", nodes_i, gpn
    if nodes_i and gpn:
        if nodes_i * gpn > MAX_WORLD_SIZE:
            findings.append(
                _finding("world-size-invalid", f"nodes x gpus_per_node = {nodes_i * gpn:,} is over {MAX_WORLD_SIZE:,}")
            )
            return None, None, nodes_i, gpn
        return nodes_i * gpn, "nodes x gpus_per_node", nodes_i, gpn
    ci = recipe.get("ci") if recipe else None
    if isinstance(ci, dict):
        # an argument given alone (--gpus-per-node, --nodes) completes the ci: block's other half
        ci_nodes = nodes_i if nodes_i is not None else ci.get("nodes", 1)
        ci_gpn = gpn if gpn is not None else ci.get("nproc_per_node", 8)
        if is_positive_int(ci_nodes) and is_positive_int(ci_gpn) and ci_nodes * ci_gpn <= MAX_WORLD_SIZE:
            given = [n for n, v in (("nodes", nodes_i), ("gpus_per_node", gpn)) if v is not None]
            findings.append(
                _finding(
                    "world-from-ci",
                    f"world_size {ci_nodes * ci_gpn} taken from the recipe's ci: block (nodes={ci_nodes} x "
                    f"nproc_per_node={ci_gpn}" + (f"; {' and '.join(given)} from the arguments)" if given else ")"),
                    path="ci",
                    line=doc.line(("ci",)),
                    severity="info",
                )
            )
            source = "ci: block" if nodes_i is None and gpn is None else "ci: block with the arguments"
            return ci_nodes * ci_gpn, source, ci_nodes, ci_gpn
    return None, None, nodes_i, gpn


@dataclass
class _ModelFound:
    """The model the model-aware checks use (None: they are not run) and where its dims came from, or why not."""

    spec: ModelSpec | None = None
    source: str | None = None
    skipped: str | None = None


NO_MODEL = "no model given (pass --model / model=, or name one in model.pretrained_model_name_or_path)"


def _recipe_model_name(recipe: dict[str, Any] | None) -> tuple[str, tuple[str, ...], str | None] | None:
    """(name, its YAML path, revision) of the recipe's model, when it names one."""
    if not recipe or not isinstance(recipe.get("model"), dict):
        return None
    m = recipe["model"]
    revision = m.get("revision") if isinstance(m.get("revision"), str) else None
    for path in (("pretrained_model_name_or_path",), ("config", "pretrained_model_name_or_path")):
        node: Any = m
        for p in path:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, str) and node.strip():
            return node, ("model",) + path, revision
    return None


def _recipe_inline_config(recipe: dict[str, Any] | None) -> dict[str, Any] | str | None:
    """The config.json a recipe writes out in ``model.config`` (a transformers config class's ``_target_`` with its
    fields, as from_config recipes do), or why it cannot be read (None: the recipe writes none out). The model type is
    read off the class's path ``transformers.models.<type>.configuration_<type>.<Type>Config`` as a string (never
    imported), else taken from a ``model_type`` field; a module's other classes (Gemma3TextConfig in
    configuration_gemma3) need the field, as the path would name the wrong type."""
    m = recipe.get("model") if recipe else None
    cfg = m.get("config") if isinstance(m, dict) else None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("_target_"), str):
        return None
    target = cfg["_target_"]
    # Hydra's own keys (_target_, _recursive_, ...) are instructions to it, not config fields
    out = {k: v for k, v in cfg.items() if isinstance(k, str) and not k.startswith("_")}
    parts = target.split(".")
    if (
        len(parts) == 5
        and parts[:2] == ["transformers", "models"]
        and parts[3] == f"configuration_{parts[2]}"
        and parts[4].lower() == parts[2].replace("_", "") + "config"
    ):
        out["model_type"] = parts[2]
    elif not isinstance(out.get("model_type"), str) or not out["model_type"].strip():
        return (
            f"model.config's _target_ {clip(repr(target), 100)} does not name its model type: add model_type: <type> "
            "to model.config, or give the class as transformers.models.<type>.configuration_<type>.<Class>"
        )
    return out


def _model(
    model: ModelInput, recipe: dict[str, Any] | None, doc: Document, findings: list[Finding], fetch: bool
) -> _ModelFound:
    if model is not None:
        try:
            src = resolve(model, fetch=fetch)
        except ModelConfigError as exc:
            findings.append(
                _finding(
                    "model-unknown",
                    f"{exc}; model-aware checks skipped",
                    severity="warning",
                    fix="run `automodel-dist models` for the catalog, pass a config.json path, or --fetch-config",
                )
            )
            return _ModelFound(skipped=f"the model given cannot be resolved ({clip(str(exc), 160)})")
        if src.source not in ("argument", "catalog"):
            findings.append(
                _finding(
                    "model-from-recipe",
                    f"model-aware checks use {src.spec.name}: dims from {src.describe()}",
                    severity="info",
                )
            )
        return _ModelFound(src.spec, src.describe())
    named = _recipe_model_name(recipe)
    if named is not None:
        name, path, revision = named
        dotted = ".".join(path)
        try:
            src = resolve(name, revision=revision, fetch=fetch)
        except ModelConfigError as exc:
            return _ModelFound(skipped=f"{dotted} {clip(repr(name), 80)}: {clip(str(exc), 240)}")
    else:
        inline = _recipe_inline_config(recipe)
        if not isinstance(inline, dict):
            return _ModelFound(skipped=inline or NO_MODEL)
        path, dotted = ("model", "config"), "model.config"
        try:
            spec = from_hf_config(inline, name=f"{clip(inline['model_type'], 60)} ({dotted})")
        except ModelConfigError as exc:
            return _ModelFound(skipped=f"{dotted}: {clip(str(exc), 240)}")
        src = ModelSource(spec, "recipe", dotted)
    findings.append(
        _finding(
            "model-from-recipe",
            f"model-aware checks use {src.spec.name} from {dotted}"
            + ("" if src.source in ("catalog", "recipe") else f" (dims from {src.describe()})"),
            path=dotted,
            line=doc.line(path),
            severity="info",
        )
    )
    return _ModelFound(src.spec, src.describe())


def _with_recipe_config_fields(
    spec: ModelSpec | None, recipe: Mapping[str, Any] | None, doc: Document, findings: list[Finding]
) -> ModelSpec | None:
    """The model with the fields a recipe's ``model.config`` passes to its config class's ``from_pretrained`` (which
    sets them over the config.json: a CI run's ``num_hidden_layers``, ``num_nextn_predict_layers: 0``); only fields
    the config.json has: a keyword the class reads for itself (a kernel choice) changes nothing, and neither does a
    config field the file leaves to its class's default (not sized from the recipe: said nowhere yet)."""
    m = recipe.get("model") if isinstance(recipe, Mapping) else None
    cfg = m.get("config") if isinstance(m, Mapping) else None
    if spec is None or spec.hf_config is None or not isinstance(cfg, Mapping):
        return spec
    if not (isinstance(cfg.get("_target_"), str) and cfg["_target_"].endswith(".from_pretrained")):
        return spec
    fields = {
        k: v for k, v in cfg.items() if k in spec.hf_config and k not in NOT_CONFIG_FIELDS and v != spec.hf_config[k]
    }
    if not fields:
        return spec
    try:
        built = from_hf_config({**spec.hf_config, **fields}, name=spec.name)
    except ModelConfigError as exc:
        findings.append(
            _finding(
                "model-config-fields",
                f"model.config's fields cannot be applied: {exc}; sized from the config.json as it is",
                path="model.config",
                severity="warning",
            )
        )
        return spec
    said = ", ".join(f"{k}: {v}" for k, v in sorted(fields.items()))
    findings.append(
        _finding(
            "model-config-fields",
            f"model.config sets {said} over {spec.name}'s config.json: sized and built with it",
            path="model.config",
            line=doc.line(("model", "config")),
            severity="info",
        )
    )
    return replace(built, published_params=None, source=spec.source, aliases=spec.aliases)


# model.config's from_pretrained arguments that name the checkpoint rather than set a field of its config
NOT_CONFIG_FIELDS = frozenset({"pretrained_model_name_or_path", "name_or_path", "_name_or_path", "trust_remote_code"})


def _with_recipe_mtp_depth(
    spec: ModelSpec | None, recipe: Mapping[str, Any] | None, doc: Document, findings: list[Finding]
) -> ModelSpec | None:
    """The model as the recipe has AutoModel build it: with the multi-token-prediction depth the recipe sets, where
    the model's class builds MTP layers (AutoModel's Qwen3.5 and Nemotron-V3 classes; the latter's
    ``mtp_use_repeated_layer`` runs one physical depth that many times)."""
    w = read_workload(recipe)
    depth = w.mtp_depth
    if spec is None or w.force_hf:  # (transformers' class builds none)
        return spec
    if depth is None and w.mtp_repeated and spec.mtp_layers:
        depth = (spec.mtp_layers, "model.mtp_use_repeated_layer")  # (the config's depth, on one repeated layer)
    if depth is None or (depth[0] == spec.mtp_layers and not w.mtp_repeated):
        return spec
    built = with_mtp_depth(spec, depth[0], repeated=w.mtp_repeated)
    if built is None or built == spec:
        return spec
    if depth[1] == "model.mtp_use_repeated_layer":
        said = f"{depth[1]}: true: {spec.name} is sized and built with one multi-token-prediction layer run at each "
        said += f"of its config's {depth[0]} depths (AutoModel's class repeats one physical depth)"
    else:
        what = f"{depth[0]} multi-token-prediction layer(s)"
        if built.mtp_iterations:
            what = f"one multi-token-prediction layer run at each of {depth[0]} depth(s) (model.mtp_use_repeated_layer)"
        said = f"{depth[1]}: {depth[0]}: {spec.name} is sized and built with {what}, not its config's "
        said += f"{spec.mtp_layers} (AutoModel's class takes the recipe's depth)"
    findings.append(
        _finding("model-mtp-depth", said, path=depth[1], line=doc.line(tuple(depth[1].split("."))), severity="info")
    )
    return built


@dataclass(frozen=True)
class Analysis:
    """A validation's report and what it was computed from: the loaded document and, when the config has a
    ``distributed:`` block, the :class:`~automodel_dist.rules.Context` (the block, the recipe, the model and
    AutoModel's reading of the block, ``context.dims``) that the estimate, suggest and the smoke runner build on."""

    report: ValidationReport
    context: Context | None
    document: Document

    @property
    def dims(self) -> ParallelDims | None:
        return self.context.dims if self.context is not None else None


def _context(
    doc: Document, request: Request, findings: list[Finding]
) -> tuple[Context | None, str | None, _ModelFound]:
    split = _split(doc)
    world, source, nodes_i, gpn = _world(request.cluster, split.recipe, doc, findings)
    if split.block is None:
        return None, source, _ModelFound(skipped="the config has no distributed setup to check a model against")
    found = _model(request.lookup.model, split.recipe, doc, findings, request.lookup.fetch_config)
    spec = _with_recipe_config_fields(found.spec, split.recipe, doc, findings)
    spec = _with_recipe_mtp_depth(spec, split.recipe, doc, findings)
    ctx = Context(
        doc=doc,
        block=split.block,
        base=split.base,
        kind=split.kind,
        dims=read_dims(split.block, world),
        recipe=split.recipe,
        nodes=nodes_i,
        gpus_per_node=gpn,
        model=spec,
        torch_version=request.job.torch_version,
        model_skipped=found.skipped,
    )
    return ctx, source, found


def _version_note() -> list[Finding]:
    """An info finding when the nemo-automodel installed here is not the release the rules and the capability table
    were written from (the installed package is the truth for a job launched from this environment)."""
    installed = installed_automodel()
    if installed is None or installed == AUTOMODEL_VERSION:
        return []
    return [
        _finding(
            "automodel-version",
            f"nemo-automodel {installed} is installed here, but these checks and the capability table are AutoModel "
            f"{AUTOMODEL_VERSION}'s: where the installed release differs (its registry, its validate_for_mesh) the "
            "installed one decides",
            fix=f"run `python tools/gen_capabilities.py` to regenerate the table from the installed release, or "
            f"pin nemo-automodel=={AUTOMODEL_VERSION}",
            severity="info",
        )
    ]


def _sorted(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.line if f.line is not None else 1 << 30))


def validate_config(config: ConfigInput | Request, **fields: Unpack[RequestFields]) -> ValidationReport:
    """Check a ``distributed:`` block (or a whole recipe) the way AutoModel 0.7.0 would, and more.

    ``config`` is YAML text, a :class:`pathlib.Path` or a mapping, or a whole :class:`Request`; the keywords are
    its fields (``world_size``, ``nodes``, ``gpus_per_node``, ``model``, ``torch_version``, ``overrides``,
    ``fetch_config``). ``model`` (else the recipe's
    ``model.pretrained_model_name_or_path``) is found as :mod:`automodel_dist.catalog.sources` says: a config.json
    path, the local Hugging Face cache, the catalog, and with ``fetch_config`` a download of config.json alone.
    ``torch_version`` is the torch release the job will run on (``2.15.0+cu132``), for the checks that depend on
    it. ``overrides`` are the launch command's ``--dotted.key=value`` overrides as ``"dotted.key=value"`` strings
    (``["distributed.tp_size=4"]``), applied the way AutoModel applies them. Every finding is returned at once;
    nothing raises for bad input.
    """
    return analyze(Request.of(config, **fields)).report


def analyze(request: Request) -> Analysis:
    """:func:`validate_config` of a request, keeping what the report was computed from (see :class:`Analysis`)."""
    doc = load_config(request.job.config, request.job.overrides)  # type: ignore[arg-type]  # None: a finding
    findings: list[Finding] = []
    ctx, source, found = _context(doc, request, findings)
    all_findings = list(doc.findings) + findings
    if ctx is not None:
        all_findings += _version_note()
        all_findings += run_rules(ctx)
        prefix = ctx.path()
        for i, f in enumerate(all_findings):  # duplicate keys inside the block are errors
            if f.rule == "yaml-duplicate-key" and (prefix == "<root>" or f.path.startswith(prefix)):
                all_findings[i] = f.model_copy(update={"severity": "error"})
    report = ValidationReport(
        valid=not any(f.severity == "error" for f in all_findings),
        world_size=ctx.dims.world_size if ctx else None,
        world_size_source=source,
        gpus_per_node=ctx.gpus_per_node if ctx else None,
        source=doc.source,
        model=ctx.model.name if ctx and ctx.model else None,
        model_source=found.source,
        model_checks_skipped=found.skipped if ctx is not None else None,
        findings=_sorted(all_findings),
        resolved=ctx.dims.resolved() if ctx else Resolved(),
    )
    return Analysis(report, ctx, doc)


def _default_ranks(world_size: int) -> list[int]:
    return list(range(world_size)) if world_size <= DEFAULT_RANKS_LIMIT else [0]


def build_layout(config: ConfigInput | Request, **fields: Unpack[RequestFields]) -> tuple[Layout, ValidationReport]:
    """Validate, then return AutoModel's :class:`Layout` and the report; raises :class:`ConfigError`.
    Without a world size, ``nodes`` x ``gpus_per_node``, else the recipe's ``ci:`` block gives it (and GPUs per
    node), as in :func:`validate_config`."""
    result = analyze(Request.of(config, **fields))
    if not result.report.valid or result.dims is None or result.dims.layout is None:
        raise ConfigError(result.report)
    return result.dims.layout, result.report


def mesh_report(
    lay: Layout,
    report: ValidationReport,
    *,
    ranks: Sequence[int] | None = None,
    gpus_per_node: int | None = None,
    picture_axis: str | None = None,
    max_listed: int | None = MAX_LISTED,
) -> MeshReport:
    """The :class:`MeshReport` of a layout (groups for ``ranks``, node crossing, picture)."""
    world_size = lay.world_size
    wanted = list(ranks) if ranks is not None else _default_ranks(world_size)
    for rank in wanted:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank!r} is outside [0, {world_size})")
    if picture_axis is not None and picture_axis not in {a.name for a in lay.axes}:
        raise ValueError(f"axis {picture_axis!r} is not in this layout; axes: {[a.name for a in lay.axes]}")
    axes = []
    for a in lay.axes:
        info = AxisInfo(
            name=a.name,
            mesh=a.kind,
            size=lay.axis_size(a.name),
            groups=lay.axis_group_count(a.name),
            sources=list(a.dims) if a.kind == "flattened" else [],
        )
        if gpus_per_node:
            info.crosses_nodes, info.example_crossing = lay.crossing(a.name, gpus_per_node)
        axes.append(info)
    dm, mm = lay.device_mesh(), lay.moe_mesh()
    return MeshReport(
        world_size=world_size,
        strategy=lay.strategy,
        mesh_ranks=lay.mesh_ranks,
        gpus_per_node=gpus_per_node,
        device_mesh=MeshDims(dim_names=dm[0], shape=dm[1]) if dm else None,
        moe_mesh=MeshDims(dim_names=mm[0], shape=mm[1]) if mm else None,
        flattened=lay.flattened(),
        fsdp_mesh=lay.fsdp_mesh(),
        axes=axes,
        rank_groups={str(rank): lay.rank_groups(rank, max_members=max_listed) for rank in wanted},
        large_groups=_large_groups(lay, wanted, max_listed),
        findings=[f for f in report.findings if f.severity != "info"],
        picture=lay.picture(picture_axis, gpus_per_node=gpus_per_node),
    )


def _large_groups(lay: Layout, ranks: Sequence[int], max_listed: int | None) -> dict[str, dict[str, GroupSpec]]:
    """Groups over ``max_listed`` ranks, given exactly without listing them."""
    out: dict[str, dict[str, GroupSpec]] = {}
    for rank in ranks if max_listed is not None else ():
        if lay.device_mesh() is None or not lay.in_mesh(rank):
            continue
        big = {}
        for a in lay.axes:
            size = lay.axis_size(a.name)
            if size > max_listed:
                first, dims = lay.group_spec(a.name, rank)
                big[a.name] = GroupSpec(size=size, first=first, dims=dims)
        if big:
            out[str(rank)] = big
    return out


def build_mesh(
    config: ConfigInput | Request,
    *,
    ranks: Sequence[int] | None = None,
    picture_axis: str | None = None,
    max_listed: int | None = MAX_LISTED,
    **fields: Unpack[RequestFields],
) -> MeshReport:
    """AutoModel's exact meshes and per-rank groups for ``world_size`` ranks (or ``nodes`` x ``gpus_per_node``, or
    the recipe's ``ci:`` block), without GPUs.

    ``overrides`` as in :func:`validate_config`. ``ranks`` defaults to every rank up to 64 ranks, else rank 0. A group of more than
    ``max_listed`` ranks (4,096) is given in ``large_groups`` as an exact :class:`GroupSpec`
    instead of a list in ``rank_groups``; ``max_listed=None`` lists every group. Raises :class:`ConfigError`
    (a ``ValueError`` carrying the report) when the config is invalid, and ``ValueError`` for a
    rank outside ``[0, world_size)`` or an unknown ``picture_axis``.
    """
    request = Request.of(config, **fields)
    lay, report = build_layout(request)
    return mesh_report(
        lay,
        report,
        ranks=ranks,
        gpus_per_node=request.cluster.gpus_per_node or report.gpus_per_node,
        picture_axis=picture_axis,
        max_listed=max_listed,
    )


__all__ = [
    "Request",
    "ConfigInput",
    "ModelInput",
    "Overrides",
    "validate_config",
    "analyze",
    "Analysis",
    "build_mesh",
    "build_layout",
    "mesh_report",
    "load_config",
    "ConfigError",
]
