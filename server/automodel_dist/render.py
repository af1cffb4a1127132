"""Human-readable rendering of the engine's reports (the CLI's non-JSON output)."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from .config.load import flow
from .layout import Layout
from .report import ExplainReport, Finding, MeshReport, ValidationReport

if TYPE_CHECKING:  # the reports of the tools above the engine, for the signatures only
    from .dry_run.report import DryRunReport
    from .estimate.report import Estimate
    from .smoke.export import SmokeExport
    from .smoke.report import SmokeReport
    from .suggest.report import SuggestReport


def finding_line(f: Finding, source: str | None) -> str:
    where = f"{source or '<config>'}:{f.line}" if f.line else f"{source or '<config>'}"
    text = f"{where}: {f.severity}[{f.rule}]: {f.message}"
    if f.path and f.path != "<root>":
        text += f"  ({f.path})"
    if f.fix:
        text += f"\n    fix: {f.fix}"
    return text


def _gh_escape(text: str, *, prop: bool = False) -> str:
    """GitHub workflow-command escaping (data: %, CR, LF; properties also ':' and ',')."""
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def validation_github(report: ValidationReport) -> str:
    """Errors and warnings as GitHub Actions workflow commands (annotations on the file and line in a PR);
    info findings (where the world size or model came from) are left out."""
    out = []
    for f in report.findings:
        if f.severity == "info":
            continue
        props = [f"file={_gh_escape(report.source, prop=True)}"] if report.source else []
        if f.line:
            props.append(f"line={f.line}")
        props.append(f"title={_gh_escape(f'{f.rule} ({f.path})', prop=True)}")
        message = f.message + (f"\nfix: {f.fix}" if f.fix else "")
        out.append(f"::{f.severity} {','.join(props)}::{_gh_escape(message)}")  # ::error / ::warning
    return "\n".join(out)


def resolved_line(report: ValidationReport) -> str:
    r = report.resolved
    if r.strategy is None:
        return "strategy unresolved"
    parts = [f"strategy={r.strategy}"]
    for key in ("dp", "dp_replicate", "dp_shard", "tp", "cp", "pp", "ep", "ep_shard"):
        value = getattr(r, key)
        if value is not None and (value != 1 or key in ("dp", "tp", "pp")):
            parts.append(f"{key}={value}")
    if r.pp_schedule:
        parts.append(f"pp_schedule={r.pp_schedule}")
    if r.activation_checkpointing:
        parts.append(f"activation_checkpointing={r.activation_checkpointing}")
    if r.sequence_parallel:
        parts.append("sequence_parallel")
    return " ".join(parts)


def validation_text(report: ValidationReport) -> str:
    lines = [finding_line(f, report.source) for f in report.findings]
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    world = (
        f"world_size={report.world_size} ({report.world_size_source})" if report.world_size else "world_size unknown"
    )
    model = f", model {report.model}" if report.model else ""
    if report.model and report.model_source:
        model += f" (dims from {report.model_source})"
    if report.model_checks_skipped:
        model = f"; model-aware checks NOT run: {report.model_checks_skipped}"
    verdict = "VALID" if report.valid else "INVALID"
    lines.append(f"{verdict}: {errors} error(s), {warnings} warning(s); {world}{model}; {resolved_line(report)}")
    if report.valid and report.not_checked:
        lines.append("not checked: " + "; ".join(report.not_checked))
    return "\n".join(lines)


def mesh_text(report: MeshReport) -> str:
    lines = [f"strategy {report.strategy}, world_size {report.world_size}, {report.mesh_ranks} ranks in the mesh"]
    if report.device_mesh:
        dims = ", ".join(f"{n}={s}" for n, s in zip(report.device_mesh.dim_names, report.device_mesh.shape))
        lines.append(f"device_mesh: ({dims})")
    else:
        lines.append("device_mesh: none (DDP: every rank is a data-parallel replica)")
    if report.moe_mesh:
        dims = ", ".join(f"{n}={s}" for n, s in zip(report.moe_mesh.dim_names, report.moe_mesh.shape))
        lines.append(f"moe_mesh: ({dims}) per pipeline stage")
    if report.flattened:
        lines.append("flattened: " + ", ".join(f"{k}=({', '.join(v)})" for k, v in report.flattened.items()))
    if report.fsdp_mesh:
        lines.append(f"FSDP shards over: ({', '.join(report.fsdp_mesh)})")
    if report.axes:
        cross = report.gpus_per_node is not None
        lines.append("")
        lines.append(f"{'axis':<12} {'mesh':<12} {'size':>6} {'groups':>8}" + ("  crossing nodes" if cross else ""))
        for a in report.axes:
            row = f"{a.name:<12} {a.mesh:<12} {a.size:>6} {a.groups:>8}"
            if cross:
                row += f"  {a.crosses_nodes}" + (f" (e.g. {_short(a.example_crossing)})" if a.example_crossing else "")
            lines.append(row)
    for f in report.findings:
        lines.append(f"{f.severity}[{f.rule}]: {f.message}")
    lines.append("")
    for rank, groups in report.rank_groups.items():
        if groups is None:
            lines.append(f"rank {rank}: outside the mesh")
        elif not groups:
            lines.append(f"rank {rank}: no mesh groups (DDP over all ranks)")
        else:
            parts = [f"{k}={_short(v)}" for k, v in groups.items()]
            for k, g in report.large_groups.get(rank, {}).items():
                dims = " + ".join(f"i*{stride} (i<{count})" for count, stride in g.dims)
                parts.append(f"{k}=[{g.size:,} ranks: {g.first} + {dims}]")
            lines.append(f"rank {rank}: " + "  ".join(parts))
    if report.picture:
        lines += ["", report.picture]
    return "\n".join(lines)


def smoke_text(report: SmokeReport) -> str:
    """Human summary of a SmokeReport."""
    r = report
    lines = [f"{r.status.upper()}: {r.reason or 'every check held'}"]
    lay = r.layout
    if lay.strategy:
        parts = [
            f"{k}={getattr(lay, k)}"
            for k in ("dp", "dp_replicate", "tp", "cp", "pp", "ep")
            if getattr(lay, k) not in (None, 1) or k in ("dp", "tp")
        ]
        extra = [
            x
            for x in (
                lay.pp_schedule,
                "SP" if lay.sequence_parallel else None,
                f"AC={lay.activation_checkpointing}" if lay.activation_checkpointing else None,
            )
            if x
        ]
        lines.append(
            f"layout: {lay.strategy} "
            + " ".join(parts + extra)
            + f" on {r.world_size} ranks"
            + (f", backend {r.backend} ({r.device})" if r.backend else "")
        )
    if r.stack == "automodel":
        lines.append(
            f"stack: AutoModel's ({r.model}"
            + (f", built as {r.model_class}" if r.model_class else "")
            + "): its setup, parallelizer, loss, gradient clip and optimizer"
            + (f", {r.tolerance.precision}" if r.tolerance else "")
        )
    elif r.model_dims:
        d = r.model_dims
        lines.append(
            f"stack: tiny (this tool's model and parallelize order): {r.model} ({d['num_layers']} layers, "
            f"{d['num_heads']} heads / {d['num_kv_heads']} kv, hidden {d['hidden_size']}"
            + (f", {d['num_experts']} experts" if d.get("num_experts") else "")
            + ")"
            + (f", {r.tolerance.precision}" if r.tolerance else "")
        )
    if r.losses:
        norms = r.grad_norms if len(r.grad_norms) == len(r.losses) else []
        lines.append("step  loss        reference   rel.diff" + ("  grad norm   reference" if norms else ""))
        for i, (a, b, d) in enumerate(zip(r.losses, r.reference_losses, r.loss_rel_diffs)):
            row = f"{i:>4}  {a:<10.6f}  {b:<10.6f}  {d:.1e}"
            if norms:
                row += f"   {norms[i]:<10.6f}  {r.reference_grad_norms[i]:<10.6f}"
            lines.append(row)
        tol = r.tolerance
        lines.append(
            f"final parameters off by {r.max_param_rel_diff:.1e} (bound {tol.param_rel:.0e}), first-step "
            f"gradients by {r.max_grad_rel_diff:.1e} (bound {tol.grad_rel:.0e}), loss bound "
            f"{tol.loss_rel:.0e}; loss decreasing: {r.loss_decreasing}; meshes match the engine: "
            f"{r.mesh_matches}"
        )
    for f in r.findings:
        lines.append(f"{f.severity}[{f.rule}]: {f.message}")
    lines += [f"note: {n}" for n in r.notes]
    lines += [f"substituted: {n}" for n in r.substitutions]
    lines += [f"AutoModel's fallback: {n}" for n in r.rewrites]
    same: dict[tuple[str, str | None], list[int]] = {}  # ranks that ended alike share a line
    for x in r.ranks:
        if x.state != "finished":
            same.setdefault((x.state, x.error), []).append(x.rank)
    for (state, error), ranks in same.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_short(ranks, 16)}"
        lines.append(f"{who}: {state}" + (f": {error}" if error else ""))
    if r.traceback_tail and not r.passed:
        lines += ["traceback (last lines):"] + ["  " + t for t in r.traceback_tail[-8:]]
    for e in r.explanations:
        lines.append(f"known cause [{e.rule}]: {e.cause} fix: {e.fix}")
    mem = [x for x in r.ranks if x.peak_rss_mib]
    if mem:
        worst = max(mem, key=lambda x: x.peak_rss_mib or 0)
        lines.append(
            f"memory: peak RSS up to {worst.peak_rss_mib:.0f} MiB/rank; params+grads+optimizer "
            f"{((worst.param_bytes or 0) + (worst.grad_bytes or 0) + (worst.optim_bytes or 0)) / 1024:.1f} KiB "
            f"on rank {worst.rank}"
        )
    t = r.timing
    if t.total_s:
        parts = [
            f"{k} {getattr(t, k + '_s'):.1f}s"
            for k in ("launch", "import", "init", "steps", "check", "teardown")
            if getattr(t, k + "_s") is not None
        ]
        lines.append(f"time: {t.total_s:.1f}s total" + (" (" + ", ".join(parts) + ")" if parts else ""))
    if r.command:
        lines.append(
            f"reproduce: add `--export DIR --world-size {r.world_size}` to this command (it prints the "
            f"torchrun/srun lines for a cluster too), run `{r.command}` in DIR, then "
            "`automodel-dist smoke --judge DIR`"
        )
    return "\n".join(lines)


def smoke_export_text(e: SmokeExport) -> str:
    """How to launch an exported smoke run and judge it."""
    lines = [
        f"wrote {e.spec_file}: a smoke run on {e.world_size} ranks",
        f"run it in {e.directory} with automodel-dist installed (each rank writes rank<R>.json there; on several "
        "nodes the directory must be on a shared filesystem; NCCL when every rank has a GPU, else gloo):",
        f"  one node:   {e.command}",
        f"  multi-node: {e.multinode_command}",
        f"  slurm:      {e.srun_command}",
        f"then: {e.judge_command}",
    ]
    lines += [f"{f.severity}[{f.rule}]: {f.message}" for f in e.findings]
    lines += [f"note: {n}" for n in e.notes]
    return "\n".join(lines)


def explain_text(report: ExplainReport, *, lines: bool = True) -> str:
    """The matches of explain_error, root causes first; ``lines``: the text had several lines (say which matched)."""
    out = []
    for m in report.matches:
        where = [f"line {m.line}"] if lines and m.line else []
        if m.ranks:
            where.append(("rank " if len(m.ranks) == 1 else "ranks ") + ", ".join(map(str, m.ranks)))
        after = "  (usually a consequence: find the root cause first)" if m.consequence else ""
        out.append(
            f"[{m.rule}] {m.title}{after}\n  matched: {m.matched}"
            + (f"  ({', '.join(where)})" if where else "")
            + f"\n  cause:   {m.cause}\n  fix:     {m.fix}"
        )
    if report.hint:
        out.append(report.hint)
    return "\n".join(out)


def _gib_line(mem: Any) -> str:
    teacher = f" + KD teacher {mem.teacher:.1f}" if getattr(mem, "teacher", 0.0) else ""
    return (
        f"params {mem.params:.1f} + grads {mem.grads:.1f} + optimizer {mem.optimizer:.1f} + activations "
        f"{mem.activations:.1f} + buffers {mem.buffers:.1f}{teacher} + overhead {mem.overhead:.1f} = "
        f"{mem.total:.1f} GiB"
    )


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _gpu_terms(r: Any) -> str:
    """Memory and the bandwidths assumed: "80 GiB, 450 / 50 GB/s in / between nodes"."""
    out = f"{r.gpu_memory_gib:.0f} GiB"
    if r.intra_gbps is not None and r.inter_gbps is not None:
        out += f", {r.intra_gbps:g} / {r.inter_gbps:g} GB/s in / between nodes"
    return out


def _dims_from(report: Any) -> str:
    source = getattr(report, "model_source", None)
    return f" (dims from {source})" if source else ""


def estimate_text(est: Estimate) -> str:
    lay = est.layout
    lines = [
        f"{est.model}{_dims_from(est)} on {est.world_size} x {est.gpu} ({_gpu_terms(est)}), seq_len {est.seq_len}, "
        f"micro batch {est.micro_batch_size}, {est.precision}; layout {lay.strategy} dp={lay.dp} tp={lay.tp} "
        f"cp={lay.cp} pp={lay.pp} ep={lay.ep}"
    ]
    if not est.seq_len_known:
        at = " / ".join(f"{n:,}" for n in est.micro_batch_at_lengths)
        batches = " / ".join("none" if b is None else f"{b:,}" for b in est.micro_batch_at_lengths.values())
        upto = (
            f"sequences up to {est.max_seq_len:,} tokens fit at micro batch {est.micro_batch_size}"
            if est.max_seq_len
            else f"no sequence length fits at micro batch {est.micro_batch_size}"
        )
        lines.append(
            f"the sequence length is the unknown (neither --seq-len nor the recipe fixes it): with "
            f"{est.headroom:.0%} headroom {upto}; at {at} tokens the micro batch can be up to {batches}. "
            f"The figures below are at an assumed {est.seq_len:,} tokens and give no verdict: pass --seq-len (the "
            "longest sequence in the data, or the packed length)"
        )
    if est.assumed:
        image = "one a sequence (the data's images are not read; the VLM step line gives its size)"
        values = {"seq_len": est.seq_len, "micro_batch_size": est.micro_batch_size, "image": image}
        lines.append(_assumed(values, est.assumed))
    for line in getattr(est, "workload", []):
        lines.append(f"from the recipe: {line}")
    mem = est.memory_gib
    band = f"the estimate's error of {est.memory_error:.0%}"
    budget = (est.gpu_memory_gib or 0.0) * (1 - est.headroom)
    verdict = {
        "fits": f"fits with {est.headroom:.0%} headroom (and {band})",
        "tight": f"TIGHT: the {budget:.1f} GiB budget ({est.headroom:.0%} headroom) is within {band}: check with "
        "`automodel-dist dryrun`",
        "does not fit": f"DOES NOT FIT with {est.headroom:.0%} headroom (even {est.memory_error:.0%} less would not)",
        None: "no verdict (the sequence length is unknown)"
        if not est.seq_len_known
        else "fit NOT JUDGED (see the assumptions)",
    }[est.verdict]
    lines.append(
        f"memory per GPU (worst pipeline rank {mem.worst_pp_rank}, peak at {mem.peak_phase}): "
        f"{_gib_line(mem)} -> {verdict}"
    )
    if mem.deferred_grads:
        lines.append(
            f"of the buffers, {mem.deferred_grads:.1f} GiB are gradients held unsharded in fp32 until the "
            "step's last backward (defer_fsdp_grad_sync: true, AutoModel's default, with gradient "
            "accumulation or PP); defer_fsdp_grad_sync: false reduce-scatters after every backward instead"
        )
    if mem.peak_phase in ("next-microbatch-forward", "gathered-late-backward"):
        where = (
            "the next microbatch's forward"
            if mem.peak_phase == "next-microbatch-forward"
            else "a microbatch's backward at its first layers"
        )
        lines.append(
            f"the peak is {where}: model.backend.enable_fsdp_optimizations turns FSDP's reshard after backward off "
            "for every microbatch but a step's last (AutoModel's MoE classes), so every unit of this GPU a backward "
            "gathers stays gathered, into the next microbatch's forward; false, one microbatch a step "
            "(local_batch_size = global_batch_size / data-parallel size) or PP avoid it"
        )
    if est.comm_bytes_per_step:
        lines.append(
            "communication per step per GPU: "
            + ", ".join(
                f"{k} {_bytes(v)} ({est.comm_time_s[k]:.2f} s{', crosses nodes' if est.crosses_nodes.get(k) else ''})"
                for k, v in est.comm_bytes_per_step.items()
            )
        )
    limits = f"limits of this layout with {est.headroom:.0%} headroom: "
    if est.max_seq_len is None:
        low = est.shortest
        limits += (
            f"not even {est.shortest_seq_len} tokens at micro batch {est.micro_batch_size} fit: they need "
            f"{_gib_line(low)}"
            if low is not None
            else f"not even the shortest seq_len at micro batch {est.micro_batch_size} fits"
        )
    else:
        limits += (
            f"seq_len up to {est.max_seq_len:,} at micro batch {est.micro_batch_size}; "
            + (f"micro batch up to {est.max_micro_batch_size:,}" if est.max_micro_batch_size else "no micro batch fits")
            + f" at seq_len {est.seq_len:,}"
        )
    lines.append(limits)
    lines.append(
        f"step time ~{est.step_time_s:.2f} s ({est.tokens_per_step} tokens, {est.grad_accumulation_steps} "
        f"grad-accumulation step(s), bubble {est.bubble_fraction:.0%}), MFU ~{est.mfu:.0%}"
    )
    for f in est.findings:
        lines.append(f"{f.severity}[{f.rule}]: {f.message}")
    lines.append("assumptions: " + "; ".join(est.assumptions))
    return "\n".join(lines)


def suggest_text(rep: SuggestReport) -> str:
    lines = [
        f"{rep.model}{_dims_from(rep)} on {rep.nodes} x {rep.gpus_per_node} {rep.gpu} ({_gpu_terms(rep)}), seq_len "
        f"{rep.seq_len}, global batch {rep.global_batch_size}, micro batch {rep.micro_batch_size}, "
        f"{rep.precision}: {rep.searched} layouts searched"
        f"{'' if len(rep.strategies) == 3 else ' (' + ', '.join(rep.strategies) + ' only)'}, {rep.fitting} fit "
        f"with {rep.headroom:.0%} headroom"
    ]
    values = {
        "model": rep.model,
        "nodes": rep.nodes,
        "gpus_per_node": rep.gpus_per_node,
        "seq_len": rep.seq_len,
        "global_batch_size": rep.global_batch_size,
        "micro_batch_size": rep.micro_batch_size,
        "teacher": rep.teacher,
    }
    if rep.from_recipe:
        lines.append("from the recipe: " + ", ".join(f"{k} {values[k]} ({src})" for k, src in rep.from_recipe.items()))
    for line in getattr(rep, "workload", []):
        lines.append(f"from the recipe: {line}")
    if rep.current is not None and rep.assumed:
        lines.append(_assumed(values, rep.assumed))
    if rep.current is not None and "seq_len" in rep.assumed:
        lines.append(
            f"the sequence length is the unknown: ranked at an assumed {rep.seq_len:,} tokens; pass --seq-len (the "
            "longest sequence in the data, or the packed length) to rank for the real job"
        )
    cur = rep.current
    if cur is not None:
        mine = f"the recipe's layout {_brief(cur.distributed)}"
        if not cur.valid:
            lines.append(f"{mine} is invalid on {rep.world_size} GPUs: " + "; ".join(cur.errors[:3]))
        else:
            faster = cur.best_speedup is not None and cur.best_speedup > 1.005
            may_fit = cur.fits is not False
            verdict = (
                ""
                if cur.best_speedup is None
                else f"; #1 is {cur.best_speedup:.2f}x faster"
                if may_fit and faster
                else "; #1 is as fast"
                if may_fit
                else "; #1 fits" + (f" and is {cur.best_speedup:.2f}x faster" if faster else "")
            )
            lines.append(
                f"{mine}: est. {cur.step_time_s:.2f} s/step, {cur.memory_gib:.1f} GiB/GPU, "
                + {True: "fits", None: "tight (within the estimate's error: check with dryrun)", False: "does NOT fit"}[
                    cur.fits
                ]
                + verdict
            )
    for c in rep.candidates:
        lines.append("")
        lines.append(
            f"#{c.rank}  "
            + ("(tight: check with dryrun) " if c.verdict == "tight" and not c.measured else "")
            + f"step ~{c.step_time_s:.2f} s, MFU ~{c.mfu:.0%}, {c.tokens_per_second:,.0f} tokens/s, "
            f"{c.memory_gib.total:.1f} GiB/GPU"
            + (
                f"; MEASURED by the dry run: {c.measured_peak_gib:.1f} GiB allocated (estimated "
                f"{c.memory_gib.tracked_peak:.1f}), "
                + {
                    "fits": "fits",
                    "tight": "TIGHT (over the headroom, within the GPU)",
                    "does not fit": "does NOT fit",
                }.get(c.measured_verdict or "", "no verdict")
                if c.measured and c.measured_peak_gib is not None
                else ""
            )
        )
        if c.measured_note:
            lines.append(f"    not measured: {c.measured_note}")
        for r in c.rationale:
            lines.append(f"    - {r}")
        for f in c.findings:
            lines.append(f"    ! {f.message}")
        lines += ["    " + x for x in c.yaml.rstrip().splitlines()]
    if rep.rejected:
        lines += ["", "not chosen:"]
        for r in rep.rejected:
            lines.append(f"    - {flow(r.distributed)}: {r.reason}")
    if rep.note:
        lines += ["", rep.note]
    return "\n".join(lines)


def _assumed(values: dict[str, Any], keys: list[str]) -> str:
    return "assumed (neither passed nor in the recipe): " + ", ".join(f"{k} {values[k]}" for k in keys)


def _brief(block: dict[str, Any]) -> str:
    """A distributed: block's layout keys (values other than the defaults 1, null, false), as a flow mapping."""
    keys = (
        "strategy",
        "dp_size",
        "dp_replicate_size",
        "tp_size",
        "cp_size",
        "pp_size",
        "ep_size",
        "sequence_parallel",
        "activation_checkpointing",
    )
    kept = {
        k: block[k]
        for k in keys
        if k in block
        and block[k] is not None
        and block[k] is not False
        and not (type(block[k]) is int and block[k] == 1)
    }
    pipe = block.get("pipeline")
    if isinstance(pipe, dict) and "pp_size" in kept:
        kept["pipeline"] = {k: pipe[k] for k in ("pp_schedule", "pp_microbatch_size") if k in pipe}
    return flow(kept) if kept else "(AutoModel's defaults)"


def _short(ranks: list[int] | None, limit: int = 8) -> str:
    if ranks is None:
        return "-"
    if len(ranks) <= limit:
        return "[" + ",".join(map(str, ranks)) + "]"
    return "[" + ",".join(map(str, ranks[: limit // 2])) + f",...({len(ranks)})," + ",".join(map(str, ranks[-2:])) + "]"


_PALETTE = [
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
]


def mesh_svg(lay: Layout, axis: str | None = None, *, gpus_per_node: int | None = None, max_nodes: int = 64) -> str:
    """An SVG grid: one row per node, one cell per GPU, coloured by the rank's group on ``axis``."""
    axis = axis or lay.default_axis()
    g = gpus_per_node or min(lay.world_size, 8)
    total_nodes = -(-lay.world_size // g)
    nodes = min(total_nodes, max_nodes)
    cell, pad, left, top = 34, 4, 70, 30
    width, height = left + g * (cell + pad) + pad, top + nodes * (cell + pad) + pad + 10
    title = f"{axis} groups" if axis else "ranks (no device mesh)"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
        f'font-size="10">',
        f'<text x="4" y="16" font-size="12">{html.escape(title)}, {lay.world_size} ranks, '
        f"{html.escape(lay.strategy)}"
        + (f", first {nodes} of {total_nodes} nodes" if nodes < total_nodes else "")
        + "</text>",
    ]
    for node in range(nodes):
        y = top + node * (cell + pad)
        out.append(f'<text x="4" y="{y + cell // 2 + 4}">node {node}</text>')
        for i in range(g):
            rank = node * g + i
            if rank >= lay.world_size:
                continue
            grp = lay.group_index(axis, rank) if axis and lay.in_mesh(rank) else None
            colour = "#dddddd" if grp is None else _PALETTE[grp % len(_PALETTE)]
            x = left + i * (cell + pad)
            out.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{colour}" rx="3"/>')
            out.append(f'<text x="{x + 3}" y="{y + 13}" fill="#fff">r{rank}</text>')
            out.append(f'<text x="{x + 3}" y="{y + 27}" fill="#fff">g{"-" if grp is None else grp}</text>')
    out.append("</svg>")
    return "\n".join(out)


def dry_run_text(r: DryRunReport) -> str:
    """A dry run: verdict, then per measured rank its peak, split and phase, then what was substituted or not run."""
    head = {"measured": "MEASURED", "failed": "FAILED", "partial": "PARTIAL"}[r.status]
    verdict = ""
    if r.verdict is not None:
        usable = f"{r.gpu_memory_gib * (1 - r.headroom):.1f} GiB usable of {r.gpu} ({r.headroom:.0%} headroom)"
        peak = f": peak {r.peak_with_overhead_gib:.1f} GiB with overhead"
        verdict = {
            "fits": f"{peak} fits in {usable}",
            "tight": f"{peak} is TIGHT: over the {usable} but within the GPU's {r.gpu_memory_gib:.0f} GiB (the "
            "overhead margin, allocator fragmentation above all, decides it)",
            "does not fit": f"{peak} does NOT fit in the GPU's {r.gpu_memory_gib:.0f} GiB",
        }[r.verdict]
    lines = [f"{head}{verdict}"]
    lines.append(
        f"{r.model} (dims from {r.model_source}, {r.num_layers} layers) on {r.world_size} ranks; seq_len {r.seq_len}, micro batch "
        f"{r.micro_batch_size}; {r.measured_microbatches} of {r.microbatches} microbatch(es) run; AutoModel "
        f"{r.versions.get('nemo_automodel', '?')}, torch {r.versions.get('torch', '?')}"
    )
    if r.params_total is not None:
        lines.append(f"parameters: {r.params_total:,} ({r.params_trainable:,} trainable)")
    for rk in r.ranks:
        stages = f" (pipeline stage {', '.join(map(str, rk.pp_stages))})" if rk.pp_stages else ""
        if rk.status == "measured" and rk.peak is not None:
            p = rk.peak
            lines.append(
                f"rank {rk.rank}{stages}: peak {p.total:.2f} GiB allocated in {rk.peak_phase}: params "
                f"{p.params:.2f} + grads {p.grads:.2f} + optimizer {p.optimizer:.2f} + activations "
                f"{p.activations:.2f} + temporaries {p.temporaries:.2f}"
            )
            if rk.tracker == "MemTracker":
                lines.append(
                    "    (torch's MemTracker, not FSDP2's, tracked this rank: it counts gathered parameters as params; "
                    "the split above moves them to temporaries and keeps the rank's own shards as params)"
                )
            if rk.largest_modules:
                top = ", ".join(f"{name} {gib:.2f}" for name, gib in rk.largest_modules[:3])
                lines.append(f"    largest while running (GiB): {top}")
            wall = sum(rk.phases_s.values())
            shared = (
                {"import": "import (done before this run, by an earlier run's fork server)"}
                if rk.import_earlier
                else {"import": "import (shared by the ranks)"}
                if rk.import_shared
                else {}
            )
            both = " of work in two processes (its builds side by side)" if rk.side_by_side else ""
            lines.append(
                f"    {wall:.1f} s{both} ({', '.join(f'{shared.get(k, k)} {v:.1f}' for k, v in rk.phases_s.items())}), "
                f"host RSS {rk.host_peak_rss_mib:.0f} MiB"
            )
        elif rk.error:
            lines.append(f"rank {rk.rank}{stages}: FAILED in {rk.error_phase}: {rk.error}")
            lines += [f"    {t}" for t in rk.traceback[-3:]]
            for m in rk.explanations[:2]:
                lines.append(f"    known cause [{m.rule}]: {m.cause} fix: {m.fix}")
        else:
            lines.append(f"rank {rk.rank}{stages}: {rk.status.replace('_', ' ')}: {rk.reason}")
    if r.estimate_vs_dry_run:
        parts = ", ".join(f"{d.category} {d.estimate_gib:.2f} vs {d.dry_run_gib:.2f}" for d in r.estimate_vs_dry_run)
        lines.append(f"analytic estimate vs dry run (GiB): {parts}")
    lines += [f"assumed: {a}" for a in r.assumed]
    lines += [f"substituted: {s}" for s in r.substitutions]
    lines += [f"not measured: {s}" for s in r.not_measured]
    lines += [f"note: {n}" for n in r.notes]
    lines += [finding_line(f, None) for f in r.findings if f.severity == "error"]
    return "\n".join(lines)
