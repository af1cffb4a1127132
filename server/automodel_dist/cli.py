"""``automodel-dist``: the command line. Thin: parse arguments, call the engine, render.

The engine and renderers are imported by the commands that use them (``serve`` and ``--help``
load neither).

Exit codes: 0 ok/valid/passed, 1 invalid config or failed layout, 2 usage error or unreadable input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config.values import STRATEGY_ALIASES

if TYPE_CHECKING:
    from .report import ValidationReport
    from .request import Request

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
_UNREADABLE = {"file-unreadable", "file-not-allowed"}


class UsageError(Exception):
    """A problem with the command line or its input files (exit 2)."""


def _config_arg(value: str) -> Any:
    """FILE, or '-' for standard input (read as YAML text)."""
    if value == "-":
        return sys.stdin.read()
    return Path(value)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from exc
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return n


def _request(args: argparse.Namespace, config: Any, overrides: list[str] | None = None) -> Request:
    """The request of a command: its config and launch overrides, and every option whose name is a request field
    (the subcommands' option names are the fields')."""
    from .request import Request, RequestFields

    given = {k: getattr(args, k) for k in RequestFields.__annotations__ if k != "overrides" and hasattr(args, k)}
    return Request.of(config, overrides=overrides, **given)


def _unreadable(report: ValidationReport) -> bool:
    return any(f.rule in _UNREADABLE for f in report.findings)


_FILE = "<FILE>"  # stands for the config given before -- when the launch command names none


def _launch(
    args: argparse.Namespace, files: list[str], *, need_file: bool = True
) -> tuple[list[str], list[str] | None]:
    """The files and overrides, with the launch command after ``--`` (AutoModel's own reading of it:
    its config, ``--nproc-per-node`` as the world size when no cluster option is given, its overrides)."""
    if args.launch is None:
        if not files and need_file:
            raise UsageError("give the config FILE (or the launch command after --)")
        return files, None
    from .config.overrides import parse_launch_args

    tail = list(args.launch)
    named = bool(tail) and (not tail[0].startswith("-") or tail[0] in ("-c", "--config"))  # the tail's own config
    try:  # otherwise FILE (or smoke's default) stands where the launcher's config would be
        launch = parse_launch_args(tail if named else [_FILE, *tail])
    except ValueError as exc:
        raise UsageError(f"launch arguments after --: {exc}") from exc
    ours = {k for name in vars(args) for k in (name, name.replace("_", "-"))}
    for item in launch.overrides:
        key = item.split("=", 1)[0]
        if key in ours:
            raise UsageError(
                f"--{key} after -- would be an AutoModel override (a top-level `{key}:` key); "
                "put automodel-dist's own options before --"
            )
    if launch.config not in (None, _FILE):
        if files and launch.config != files[0]:
            raise UsageError(f"the config is given twice: {files[0]} and {launch.config} (after --)")
        files = files or [launch.config]
    if not files and need_file:
        raise UsageError("give the config FILE, or name it in the launch command after --")
    if launch.nproc_per_node is not None and not (args.world_size or getattr(args, "nodes", None)):
        # `automodel recipe.yaml --nproc-per-node N` starts N ranks; --gpus-per-node only says how nodes split them
        args.world_size = launch.nproc_per_node
    return files, launch.overrides


# --------------------------------------------------------------------------- commands
NO_WORLD = (
    "the world size is unknown: give --world-size, or --nodes with --gpus-per-node (or --nproc-per-node in the "
    "launch command after --, or a recipe with a ci: block)"
)


FETCH_HELP = (
    "may download the model's config.json alone from the Hugging Face Hub (never weights) when it is neither a "
    "path, in the local Hugging Face cache (HF_HOME / HF_HUB_CACHE) nor in the catalog"
)


def cmd_validate(args: argparse.Namespace) -> int:
    from . import render
    from .api import validate_config
    from .config.files import is_dir

    files, overrides = _launch(args, args.files)
    if files.count("-") > 1:
        raise UsageError("standard input (-) can be given once")
    many = len(files) > 1 or any(f != "-" and is_dir(f) for f in files)
    files = [x for f in files for x in _expand(f)]
    fmt = "json" if args.json else args.format
    request = _request(args, None, overrides)
    reports = [validate_config(request.with_config(_config_arg(f))) for f in files]
    if fmt == "json":  # one file: its report; several: the list of reports (each names its file in "source")
        dumped = [r.model_dump(mode="json") for r in reports]
        _print_json(dumped if many else dumped[0])
    elif fmt == "github":
        text = "\n".join(t for t in (render.validation_github(r) for r in reports) if t)
        if text:
            print(text)
    else:
        print("\n\n".join(render.validation_text(r) for r in reports))
        if len(reports) > 1:
            bad = [r.source or "-" for r in reports if not r.valid]
            print(
                f"\n{len(reports)} files: {len(reports) - len(bad)} valid, {len(bad)} invalid"
                + (f" ({', '.join(bad)})" if bad else "")
            )
    if any(_unreadable(r) for r in reports):
        return EXIT_USAGE
    if args.strict and any(r.model_checks_skipped for r in reports):
        if fmt != "json":
            print("--strict: model-aware checks were not run on every file", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK if all(r.valid for r in reports) else EXIT_FAIL


def _expand(name: str) -> list[str]:
    """A directory stands for every ``.yaml``/``.yml`` file under it (hidden folders skipped), in sorted order."""
    from .config.files import is_dir

    path = Path(name)
    if name == "-" or not is_dir(path):
        return [name]
    found = sorted(
        str(p)
        for p in path.rglob("*")
        if p.suffix in (".yaml", ".yml")
        and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(path).parts)
    )
    if not found:
        raise UsageError(f"{name} holds no .yaml or .yml file")
    return found


def _show(args: argparse.Namespace, report: Any, renderer: str) -> None:
    """Print a report: its JSON with --json, else ``render.<renderer>(report)``."""
    if args.json:
        _print_json(report.model_dump(mode="json"))
    else:
        from . import render

        print(getattr(render, renderer)(report))


def _show_invalid(args: argparse.Namespace, report: ValidationReport) -> int:
    """Print an invalid config's findings (text or --json); its exit status."""
    _show(args, report, "validation_text")
    return EXIT_USAGE if _unreadable(report) else EXIT_FAIL


def cmd_mesh(args: argparse.Namespace) -> int:
    from . import render
    from .api import build_layout, mesh_report
    from .report import ConfigError

    files, overrides = _launch(args, [args.file] if args.file else [])
    try:  # without --world-size, a recipe's ci: block gives it (and GPUs per node), as validate reads it
        lay, vreport = build_layout(_request(args, _config_arg(files[0]), overrides))
        gpn = args.gpus_per_node or vreport.gpus_per_node
        report = mesh_report(lay, vreport, ranks=args.rank, gpus_per_node=gpn, picture_axis=args.axis)
    except ConfigError as exc:
        if exc.report.world_size is None and not exc.report.errors:
            raise UsageError(NO_WORLD) from exc
        return _show_invalid(args, exc.report)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.world_size is None and not args.json:
        print(f"world_size {lay.world_size} ({vreport.world_size_source})" + (f", {gpn} GPUs per node" if gpn else ""))
    if args.svg:
        Path(args.svg).write_text(render.mesh_svg(lay, args.axis, gpus_per_node=gpn), encoding="utf-8")
    if args.json:
        _print_json(report.model_dump(mode="json"))
    else:
        print(render.mesh_text(report))
        if args.svg:
            print(f"\npicture written to {args.svg}")
    return EXIT_OK


class _ProgressLine:
    """Progress on stderr: one rewritten line on a terminal, one line per event otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()

    def __call__(self, phase: str, step: int, total: int, message: str) -> None:
        bar = ""
        if phase == "step" and total:
            done = int(20 * step / total)
            bar = f"[{'#' * done}{'.' * (20 - done)}] {step}/{total} "
        text = f"{phase:<9} {bar}{message}"[:110]
        if self.tty:
            sys.stderr.write("\r\033[K" + text + ("\n" if phase == "done" else ""))
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()


def _nonneg(value: str) -> int:
    try:
        n = int(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a rank (an integer >= 0), got {value!r}") from exc
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a rank (an integer >= 0), got {value!r}")
    return n


def _positive_number(value: str) -> float:
    try:
        x = float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}") from exc
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return x


def _ac_flag(value: str) -> bool | str:
    low = value.lower()
    if low in ("true", "full", "on", "yes", "1"):
        return True
    if low in ("false", "off", "no", "none", "0"):
        return False
    if low == "selective":
        return "selective"
    raise argparse.ArgumentTypeError("expected true, false or selective")


def cmd_smoke(args: argparse.Namespace) -> int:
    from .config.files import is_file
    from .smoke import (
        SmokeOptions,
        SmokeReport,
        SmokeRequest,
        SmokeUsageError,
        export_smoke_test,
        judge_smoke_test,
        run_smoke_test,
    )

    if args.judge:
        if args.file or args.export or args.launch is not None:
            raise UsageError("--judge DIR takes no config, --export or launch command: the spec in DIR says it all")
        try:
            judged = judge_smoke_test(args.judge)
        except SmokeUsageError as exc:
            raise UsageError(str(exc)) from exc
        _show(args, judged, "smoke_text")
        return EXIT_OK if judged.passed else EXIT_FAIL
    files, overrides = _launch(args, [args.file] if args.file else [], need_file=False)
    config = _config_arg(files[0]) if files else None
    if isinstance(config, Path) and not is_file(config):
        raise UsageError(f"cannot read {config}")
    given = {k: getattr(args, k) for k in SmokeOptions.__annotations__ if k != "overrides"}
    request = SmokeRequest.of(config, overrides=overrides, **given)
    if args.export:
        if args.world_size is None:
            raise UsageError(
                "--export needs --world-size (or --nproc-per-node after --): the ranks the cluster's launch will start"
            )
        try:
            exported = export_smoke_test(request, args.export)
        except SmokeUsageError as exc:
            raise UsageError(str(exc)) from exc
        if isinstance(exported, SmokeReport):
            _show(args, exported, "smoke_text")
            return EXIT_FAIL
        _show(args, exported, "smoke_export_text")
        return EXIT_OK
    try:
        report = run_smoke_test(
            request,
            timeout_s=args.timeout,
            launcher=args.launcher,
            progress=None if args.json or args.quiet else _ProgressLine(),
        )
    except SmokeUsageError as exc:
        raise UsageError(str(exc)) from exc
    _show(args, report, "smoke_text")
    if report.reason and report.reason.startswith("interrupted (SIGINT)"):
        return 130
    if report.reason and report.reason.startswith("interrupted (SIGTERM)"):
        return 143
    return EXIT_OK if report.passed else EXIT_FAIL


def cmd_estimate(args: argparse.Namespace) -> int:
    from .estimate import estimate_memory
    from .report import ConfigError

    files, overrides = _launch(args, [args.file] if args.file else [])
    try:
        est = estimate_memory(
            _request(args, _config_arg(files[0]), overrides), precision=args.precision, headroom=args.headroom
        )
    except ConfigError as exc:
        if exc.report.world_size is None and not exc.report.errors:
            raise UsageError(NO_WORLD) from exc
        return _show_invalid(args, exc.report)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    _show(args, est, "estimate_text")
    return EXIT_OK if est.fits in (True, None) else EXIT_FAIL


def cmd_dryrun(args: argparse.Namespace) -> int:
    from .dry_run import DryRunUnavailable, DryRunUsageError, dry_run

    files, overrides = _launch(args, [args.file] if args.file else [])
    quiet = args.quiet or args.json

    def progress(phase: str, step: int, total: int, message: str) -> None:
        print(f"{phase:<18} {message}", file=sys.stderr, flush=True)

    try:
        report = dry_run(
            _request(args, _config_arg(files[0]), overrides),
            ranks=args.rank,
            timeout_s=args.timeout,
            num_layers=args.num_layers,
            full_depth=args.full_depth,
            headroom=args.headroom,
            host_gib=args.host_memory_gib,
            progress=None if quiet else progress,
        )
    except DryRunUnavailable as exc:
        raise UsageError(str(exc)) from exc
    except DryRunUsageError as exc:
        raise UsageError(str(exc)) from exc
    _show(args, report, "dry_run_text")
    return EXIT_OK if report.status == "measured" and report.verdict != "does not fit" else EXIT_FAIL


def cmd_suggest(args: argparse.Namespace) -> int:
    from .suggest import suggest_strategy

    request = _request(args, _config_arg(args.file) if args.file else None)
    try:
        report = suggest_strategy(
            request,
            precision=args.precision,
            allow_activation_checkpointing=not args.no_activation_checkpointing,
            headroom=args.headroom,
            top_k=args.top,
            strategies=args.strategy,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if args.verify:
        from .verified import verify_candidates

        report = verify_candidates(report, request, top=args.verify, headroom=args.headroom)
    _show(args, report, "suggest_text")
    return EXIT_OK if report.candidates else EXIT_FAIL


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve import run

    return run(args)


def cmd_explain(args: argparse.Namespace) -> int:
    from .config.files import is_file
    from .explain import MAX_TEXT, explain_error

    text = sys.stdin.read() if args.text in (None, "-") else args.text
    if args.text and args.text != "-" and "\n" not in args.text and is_file(args.text):
        with open(args.text, "rb") as fh:  # a job log can be huge: its end holds the failure
            fh.seek(max(0, fh.seek(0, os.SEEK_END) - 4 * MAX_TEXT))
            text = fh.read().decode("utf-8", errors="replace")
    report = explain_error(text)
    if args.json:
        _print_json(report.model_dump(mode="json"))
    else:
        from . import render

        print(render.explain_text(report, lines="\n" in text.strip()))
    return EXIT_OK if report.matches else EXIT_FAIL


def cmd_models(args: argparse.Namespace) -> int:
    from .catalog.listing import catalogs

    cat = catalogs()
    if args.json:
        _print_json(cat.model_dump(mode="json"))
        return EXIT_OK
    w = max(len(m.name) for m in cat.models)
    print(f"{'model':<{w}} {'params':>8} {'active':>8} {'layers':>6} {'heads':>5} {'kv':>4} {'experts':>7}  hybrid")
    for m in cat.models:
        mix = ", ".join(f"{n} {t}" for t, n in (m.layer_types or {}).items())
        print(
            f"{m.name:<{w}} {m.params / 1e9:>7.1f}B {m.active_params / 1e9:>7.1f}B {m.num_layers:>6} "
            f"{m.num_attention_heads:>5} {m.num_key_value_heads:>4} {m.num_experts or '-':>7}  {mix}".rstrip()
        )
    w = max(len(g.name) for g in cat.gpus)
    print(
        f"\n{'gpu':<{w}} {'GiB':>6} {'bf16 TFLOP/s':>12} {'per node':>8} {'GB/s in node':>12} {'to network':>10}  "
        "interconnect"
    )
    for g in cat.gpus:
        print(
            f"{g.name:<{w}} {g.memory_gib:>6.1f} {g.bf16_tflops:>12.0f} {g.gpus_per_node:>8} {g.intra_gbps:>12.0f} "
            f"{g.inter_gbps:>10.1f}  {g.interconnect}"
        )
    return EXIT_OK


# --------------------------------------------------------------------------- parser
def _cluster_arguments(g: argparse._ArgumentGroup, *, mesh: bool = False) -> None:
    g.add_argument(
        "--world-size",
        type=_positive,
        help="total ranks (default: --nodes x --gpus-per-node, --nproc-per-node after --, or the recipe's ci: block)",
    )
    g.add_argument("--nodes", type=_positive, help="nodes in the job (with --gpus-per-node)")
    g.add_argument(
        "--gpus-per-node",
        type=_positive,
        help=(
            "GPUs per node: node placement, groups that cross nodes and the picture's rows"
            if mesh
            else "GPUs per node: turns on the checks of groups that cross nodes"
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="automodel-dist", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = p.add_subparsers(dest="command", required=True)

    v = sub.add_parser(
        "validate", help="check a recipe or distributed: block (all findings at once)", epilog=LAUNCH_HELP
    )
    v.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="recipe YAML(s), bare distributed: block(s), folders (every .yaml/.yml under them) or - "
        "for stdin; each is checked on its own (a recipe's ci: block gives its world size when no "
        "cluster option is given)",
    )
    g = v.add_argument_group("cluster")
    _cluster_arguments(g)
    v.add_argument(
        "--model",
        help="a Hugging Face repo id (read from the local Hugging Face cache, else the catalog: see `models`), a "
        "config.json path or a model folder (default: the recipe's model.pretrained_model_name_or_path)",
    )
    v.add_argument("--fetch-config", action="store_true", help=FETCH_HELP)
    v.add_argument(
        "--strict", action="store_true", help="exit 1 when the model-aware checks could not run (no model resolved)"
    )
    v.add_argument(
        "--torch-version",
        help="the torch release the job will run on, e.g. 2.15.0+cu132 "
        "(AutoModel 0.7.0's FSDP2 path fails on torch >= 2.15)",
    )
    v.add_argument(
        "--format",
        choices=("text", "json", "github"),
        default="text",
        help="text (compiler style), json (the report; a list for several files) or github "
        "(GitHub Actions annotations)",
    )
    v.add_argument("--json", action="store_true", help="same as --format json")
    v.set_defaults(func=cmd_validate)

    m = sub.add_parser(
        "mesh", help="AutoModel's device_mesh / moe_mesh and rank groups, without GPUs", epilog=LAUNCH_HELP
    )
    m.add_argument("file", nargs="?", help="recipe or distributed: block, or - for stdin")
    _cluster_arguments(m.add_argument_group("cluster"), mesh=True)
    m.add_argument("--rank", type=int, action="append", help="rank(s) to list groups for (repeatable)")
    m.add_argument("--axis", help="axis to draw in the picture (tp, cp, dp_shard, ep, ...)")
    m.add_argument("--svg", help="also write the picture as an SVG file")
    m.add_argument("--json", action="store_true", help="print the mesh report as JSON")
    m.set_defaults(func=cmd_mesh)

    e = sub.add_parser("explain", help="map an AutoModel/torch error message to its cause and fix")
    e.add_argument("text", nargs="?", help="the error text, a file holding it, or - / nothing for stdin")
    e.add_argument("--json", action="store_true", help="print the matches as JSON")
    e.set_defaults(func=cmd_explain)

    sm = sub.add_parser(
        "smoke", help="really run the layout on N processes (torchrun) and check parity", epilog=LAUNCH_HELP
    )
    sm.add_argument("file", nargs="?", help="recipe or distributed: block (default: FSDP2 + TP 2)")
    sm.add_argument(
        "--world-size",
        type=_positive,
        help="default: --nproc-per-node after --, else 4, or the "
        "smallest number of processes the layout is valid on when 4 is not",
    )
    sm.add_argument("--steps", type=_positive, default=3, help="training steps compared with one process (default 3)")
    sm.add_argument(
        "--model",
        choices=["tiny-llama", "tiny-moe"],
        default="tiny-llama",
        help="the tiny stack's model (default tiny-llama; tiny-moe has experts for ep > 1); on AutoModel's stack, the "
        "architecture when the file names no model (Llama-3.1-8B's, Qwen3-30B-A3B's)",
    )
    sm.add_argument(
        "--stack",
        choices=["auto", "automodel", "tiny"],
        default="auto",
        help="automodel: the recipe's architecture at tiny dims through AutoModel's own build, parallelizer, loss "
        "and step; tiny: this tool's tiny model and its re-implementation of AutoModel's parallelize order; "
        "auto (default): automodel when AutoModel is installed (a layout its stack cannot run on this machine is "
        "reported not run, with why), tiny when it is not",
    )
    sm.add_argument(
        "--run-invalid",
        action="store_true",
        help="run even when validation finds errors, to see AutoModel's own failure",
    )
    lay = sm.add_argument_group("layout (overrides the file)")
    lay.add_argument("--strategy", choices=["fsdp2", "megatron_fsdp", "ddp"])
    for flag in ("tp", "pp", "cp", "ep", "dp-replicate"):
        lay.add_argument(
            f"--{flag}", type=_positive, dest=flag.replace("-", "_"), help=f"{flag.replace('-', '_')}_size"
        )
    lay.add_argument(
        "--pp-schedule", help="1f1b, gpipe, interleaved1f1b, loopedbfs, interleavedzerobubble, zbvzerobubble, dualpipev"
    )
    lay.add_argument(
        "--sequence-parallel", action="store_true", default=None, help="sequence_parallel: true (with --tp)"
    )
    lay.add_argument("--activation-checkpointing", type=_ac_flag, metavar="{true,false,selective}")
    run = sm.add_argument_group("run")
    run.add_argument("--backend", choices=["gloo", "nccl"], help="default: nccl with enough GPUs, else gloo")
    run.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="auto = the config's mp_policy (AutoModel's default: bf16 params, fp32 reduce)",
    )
    run.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit in seconds")
    run.add_argument(
        "--pg-timeout", dest="pg_timeout_s", type=float, default=60.0, help="process-group timeout in seconds"
    )
    run.add_argument(
        "--fault", help="testing: crash@RANK:STEP, hang@RANK:STEP, skew@RANK:STEP, stall@RANK:0 or abort@RANK:0"
    )
    run.add_argument(
        "--launcher",
        choices=["elastic", "torchrun"],
        default="elastic",
        help="elastic: torch's elastic agent, ranks forked from a fork server (fast); torchrun: the torchrun CLI",
    )
    away = sm.add_argument_group("run elsewhere (a cluster's own torchrun or srun, NCCL on its GPUs)")
    away.add_argument(
        "--export",
        metavar="DIR",
        help="instead of running here, write DIR/spec.json for --world-size "
        "ranks and print the torchrun/srun commands that run it",
    )
    away.add_argument("--judge", metavar="DIR", help="judge the results the ranks of an exported run left in DIR")
    sm.add_argument("--json", action="store_true", help="print the smoke report as JSON")
    sm.add_argument("--quiet", action="store_true", help="no progress display")
    sm.set_defaults(func=cmd_smoke)

    def sizing(ap: argparse.ArgumentParser, defaults: str) -> None:
        ap.add_argument(
            "--gpu",
            default="H100-80GB",
            help="A100-40GB, A100-80GB, H100-80GB (default), H200-141GB, B200, GB200, L40S",
        )
        ap.add_argument("--memory-gib", type=_positive_number, help="override the GPU's memory")
        ap.add_argument(
            "--intra-gbps",
            type=_positive_number,
            help="override the GB/s per GPU (one direction) inside a node (default: the GPU's, see `models`)",
        )
        ap.add_argument(
            "--inter-gbps",
            type=_positive_number,
            help="override the GB/s per GPU (one direction) to other nodes (default: the GPU's, see `models`)",
        )
        ap.add_argument(
            "--seq-len",
            type=_positive,
            help="tokens per sequence (default: the recipe's "
            "dataset.seq_len, seq_length or packed_sequence_size, else 4096)",
        )
        ap.add_argument(
            "--micro-batch-size",
            type=_positive,
            help="sequences per rank per microbatch (default: the "
            "recipe's pipeline.pp_microbatch_size with pp, else step_scheduler.local_batch_size, else 1)",
        )
        ap.add_argument(
            "--global-batch-size",
            type=_positive,
            help="sequences per optimizer step (default: the "
            "recipe's step_scheduler.global_batch_size, else "
            + (
                "one micro batch per data-parallel rank)"
                if defaults == "recipe"
                else "one micro batch per GPU, the same for every layout)"
            ),
        )
        ap.add_argument(
            "--precision",
            choices=["auto", "bf16", "bf16-mixed", "fp32"],
            default="auto",
            help="auto = the recipe's model.torch_dtype (float32: bf16-mixed), else bf16; bf16 = AutoModel's "
            "default (bf16 weights and AdamW states); bf16-mixed = fp32 master weights with bf16 compute",
        )
        ap.add_argument("--headroom", type=float, default=0.1, help="fraction of GPU memory kept free")
        ap.add_argument("--json", action="store_true", help="print the report as JSON")

    es = sub.add_parser(
        "estimate", help="per-GPU memory, communication and step time of a config's layout", epilog=LAUNCH_HELP
    )
    es.add_argument("file", nargs="?", help="recipe or distributed: block, or - for stdin")
    es.add_argument(
        "--model",
        help="Hugging Face repo id (local cache, else the catalog), config.json path or model folder (default: the "
        "recipe's model.pretrained_model_name_or_path)",
    )
    es.add_argument("--fetch-config", action="store_true", help=FETCH_HELP)
    g = es.add_argument_group("cluster")
    _cluster_arguments(g)
    sizing(es, "recipe")
    es.set_defaults(func=cmd_estimate)

    dr = sub.add_parser(
        "dryrun",
        help="AutoModel's own training step at full size and world size on fake tensors: its real per-GPU memory",
        epilog=LAUNCH_HELP,
    )
    dr.add_argument("file", nargs="?", help="recipe or distributed: block, or - for stdin")
    dr.add_argument(
        "--model",
        help="Hugging Face repo id (local cache, else the catalog), config.json path or model folder (default: the "
        "recipe's model.pretrained_model_name_or_path)",
    )
    dr.add_argument("--fetch-config", action="store_true", help=FETCH_HELP)
    g = dr.add_argument_group("cluster")
    _cluster_arguments(g)
    dr.add_argument(
        "--rank",
        type=_nonneg,
        action="append",
        help="a rank to measure (repeatable; default: rank 0, or the first rank of each pipeline stage position where the "
        "peak can fall)",
    )
    dr.add_argument("--seq-len", type=_positive, help="tokens per sequence (default: the recipe's, else 4096)")
    dr.add_argument(
        "--micro-batch-size",
        type=_positive,
        help="sequences per rank per microbatch (default: the recipe's pp_microbatch_size with pp, else "
        "local_batch_size, else 1)",
    )
    dr.add_argument("--global-batch-size", type=_positive, help="sequences per step (default: the recipe's)")
    dr.add_argument(
        "--num-layers", type=_positive, help="build only the first N layers (quick looks; the report says so)"
    )
    dr.add_argument(
        "--full-depth",
        action="store_true",
        help="build every layer (default: a model whose layers repeat is built twice at a shallow depth and "
        "extrapolated per layer, much faster; the report says which)",
    )
    dr.add_argument("--gpu", default="H100-80GB", help="the GPU the verdict is for (default H100-80GB)")
    dr.add_argument("--headroom", type=float, default=0.1, help="fraction of GPU memory kept free")
    dr.add_argument("--timeout", type=float, default=900.0, help="wall-clock limit per rank, seconds")
    dr.add_argument("--host-memory-gib", type=_positive_number, default=4.0, help="host memory cap per rank process")
    dr.add_argument("--json", action="store_true", help="print the report as JSON")
    dr.add_argument("--quiet", action="store_true", help="no progress lines")
    dr.set_defaults(func=cmd_dryrun)

    su = sub.add_parser("suggest", help="ranked layouts that fit a model on a cluster")
    su.add_argument(
        "file",
        nargs="?",
        help="a recipe: its model, ci: cluster, seq_len and batch sizes fill the "
        "options not given, and its own layout is compared with the candidates",
    )
    su.add_argument(
        "--model",
        help="Hugging Face repo id (local cache, else the catalog), config.json path or model folder (required "
        "without a recipe that names one)",
    )
    su.add_argument("--fetch-config", action="store_true", help=FETCH_HELP)
    su.add_argument("--nodes", type=_positive, help="nodes (default: the recipe's ci: block, else 1)")
    su.add_argument(
        "--gpus-per-node", type=_positive, help="GPUs per node (default: the GPU's usual node, 8; 72 for GB200)"
    )
    su.add_argument("--top", type=_positive, default=5, help="layouts to show (default 5)")
    su.add_argument(
        "--no-activation-checkpointing",
        action="store_true",
        help="only layouts that fit without activation checkpointing",
    )
    su.add_argument(
        "--strategy",
        action="append",
        choices=sorted(STRATEGY_ALIASES),
        metavar="STRATEGY",
        help="search only this strategy: fsdp2, megatron_fsdp (megatron-fsdp, mfsdp) or ddp; repeat for "
        "several (default: all three)",
    )
    sizing(su, "search")
    su.add_argument(
        "--verify",
        type=int,
        default=3,
        metavar="N",
        help="measure the first N candidates with the dry run (AutoModel's own step on fake tensors; seconds each) "
        "when AutoModel is installed; 0: estimates only (default 3)",
    )
    su.set_defaults(func=cmd_suggest)

    sv = sub.add_parser("serve", help="run the MCP server (stdio by default; --transport http for HTTP)")
    from .serve import add_serve_arguments

    add_serve_arguments(sv)
    sv.set_defaults(func=cmd_serve)

    mo = sub.add_parser("models", help="list the built-in model and GPU catalogs")
    mo.add_argument("--json", action="store_true", help="print the catalogs as JSON")
    mo.set_defaults(func=cmd_models)

    return p


_LAUNCH_COMMANDS = ("validate", "mesh", "estimate", "smoke", "dryrun")
LAUNCH_HELP = (
    "-- LAUNCH...: what follows `automodel` (or `python script.py`) when the job is launched, read as "
    "AutoModel reads it: [CONFIG] [--nproc-per-node N] [--key.sub=value | --key.sub value | --flag] "
    "or -c CONFIG [...]; its overrides are applied to the config, and --nproc-per-node is the world "
    "size when no cluster option is given"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    launch = None
    if "--" in argv:  # the launch command: AutoModel's arguments, not ours
        cut = argv.index("--")
        argv, launch = argv[:cut], argv[cut + 1 :]
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors already
        return int(exc.code or 0)
    if launch is not None and args.command not in _LAUNCH_COMMANDS:
        print(f"automodel-dist: error: {args.command} takes no launch command after --", file=sys.stderr)
        return EXIT_USAGE
    args.launch = launch
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, so that a closed pipe is handled below and not at interpreter exit
        return code
    except UsageError as exc:
        print(f"automodel-dist: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `automodel-dist ... | head`: the reader left; no traceback, no flush error at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports it


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
