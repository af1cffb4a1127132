"""One measured rank of a dry run: AutoModel 0.7.0's own setup, model build, parallelizer and training step, on a fake
process group under FakeTensorMode, with torch's memory tracker. Run as
``python -m automodel_dist.dry_run.worker SPEC.json RESULT.json`` (one process per rank: the fake process group and
AutoModel's module state are per process). Progress goes to stdout as ``PHASE <name>`` lines; the result is always
written, an AutoModel exception included.

The step follows ``recipes/llm/train_ft.py`` (``_run_train_optim_step`` and ``_forward_backward_step``), calling the
same AutoModel functions in the same order; the recipe module itself is not imported (it needs torchao, torchdata and
the dataset stack at import).
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import time
import traceback
import warnings
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from . import shims
from .depth import Depth, extrapolate_splits, line, peak_phase

GIB = float(1 << 30)
_CATEGORIES = {  # torch's tracker categories -> the report's split
    "Sharded Param": "params",
    "Parameter": "params",
    "Buffer": "params",
    "Sharded Grad": "grads",
    "Gradient": "grads",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Activation": "activations",
    "Inputs": "activations",
    "Input": "activations",
    "Unsharded Param": "temporaries",
    "Unsharded Grad": "temporaries",
    "Temp": "temporaries",
    "All Gather": "temporaries",
    "Reduce Scatter": "temporaries",
}


class Phases:
    """Wall time per phase; the phase a failure happened in; progress lines for the parent."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.current = "start"
        self.failed: str | None = None

    @contextlib.contextmanager
    def __call__(self, name: str) -> Any:
        previous, self.current = self.current, name
        print(f"PHASE {name}", flush=True)
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            self.failed = self.failed or name
            raise
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 3)
            self.current = previous


def _categories(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = getattr(key, "value", None) or getattr(key, "name", None) or str(key)
            out[name] = out.get(name, 0) + int(value)
    return out


def _split(categories: dict[str, int], param_bytes: int | None = None) -> dict[str, float]:
    """The tracker's categories as the report's split, with ``params`` the local parameter shards
    (``param_bytes``): FSDPMemTracker files parameters outside a sharded FSDP unit (experts on a one-rank ep_shard
    mesh) as unsharded copies, MemTracker (several FSDP roots: pipeline stages) counts the gathered copies as
    parameters; either way the difference belongs to the temporaries, as the estimate splits them."""
    out = dict.fromkeys(("params", "grads", "optimizer", "activations", "temporaries"), 0.0)
    for name, value in categories.items():
        if name in _CATEGORIES:
            out[_CATEGORIES[name]] += value / GIB
    if param_bytes is not None:
        moved = max(min(param_bytes / GIB - out["params"], out["temporaries"]), -out["params"])
        out["params"] += moved
        out["temporaries"] -= moved
    out["total"] = categories.get("Total", 0) / GIB
    return out


def make_tracker(parts: list[Any], optimizers: list[Any], phases: Phases) -> Any:
    """torch's FSDPMemTracker for one FSDP root, else its MemTracker; either also records the phase at the peak and
    the peak of every phase."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType
    from torch.distributed.fsdp import FSDPModule

    base = FSDPMemTracker if len(parts) == 1 and isinstance(parts[0], FSDPModule) else MemTracker

    class Tracker(base):  # type: ignore[misc, valid-type]
        peak_phase: str | None = None
        pipeline_roots: bool = False  # restart records of repeated calls (set by _repeated_calls)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.phase_peaks: dict[str, int] = {}
            self.phase_categories: dict[str, dict[str, int]] = {}  # torch's categories at each phase's peak

        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            # torch registers a gradient hook on every parameter, and a frozen one (PEFT's base weights) refuses it
            out = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                for p in module.parameters():
                    if p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:

                        def grad_hook(g: Any) -> None:
                            self._update_and_maybe_create_winfos(g, _MemRefType.GRAD)

                        def post_accumulate(q: Any) -> None:
                            self._update_and_maybe_create_winfos(q.grad, _MemRefType.GRAD)

                        self._param_to_grad_hook_handles[p] = (
                            p.register_hook(grad_hook),
                            p.register_post_accumulate_grad_hook(post_accumulate),
                        )
            return out

        def repeated_top_level(self, module: Any) -> bool:
            """A pipeline schedule calls each stage module once per microbatch; torch's trackers refuse a second
            call of a tracked root, so its per-module record restarts (the global peak is unaffected)."""
            if self._mod_tracker.is_bw or module not in self.memory_tracking:
                return False
            return set(self._mod_tracker.parents) - {self._mod_tracker.get_known_fqn(module)} == {"Global"}

        def _pre_fw_hook(self, module: Any, inputs: Any) -> Any:
            if base is MemTracker and self.pipeline_roots and self.repeated_top_level(module):
                self.memory_tracking.pop(module, None)
            return super()._pre_fw_hook(module, inputs)

        def _update_peak_stats(self, peak_state: Any) -> None:
            before = dict(self._peak_mem)
            super()._update_peak_stats(peak_state)
            total = sum(snap.get(_TOTAL_KEY, 0) for snap in self._curr_mem_snap.values())
            if total > self.phase_peaks.get(phases.current, 0):
                self.phase_peaks[phases.current] = total
                self.phase_categories[phases.current] = _categories(self._curr_mem_snap)
            if any(self._peak_mem.get(d, 0) > before.get(d, 0) for d in self._peak_mem):
                self.peak_phase = phases.current

    if base is FSDPMemTracker:
        return Tracker(parts[0], optimizers[0])
    tracker = Tracker()
    tracker.track_external(*parts, *optimizers)
    return tracker


def _module_views(tracker: Any) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """(modules by torch's local peak, modules by what their first forward left allocated), GiB, largest first."""
    peaks, retained = [], []
    for stats in tracker.memory_tracking.values():
        if stats.local_peak:
            peaks.append((stats.mod_fqn, round(sum(stats.local_peak.values()) / GIB, 3)))
        pre = post = None
        for state, snaps in stats.snapshots.items():
            name = getattr(state, "value", str(state))
            if name in ("Pre-Forward", "Before Pre-Forward") and snaps and pre is None:
                pre = snaps[0]
            if name in ("Post-Forward", "After Post-Forward") and snaps and post is None:
                post = snaps[0]
        if pre is not None and post is not None:

            def total(snap: Any) -> int:
                return sum(v for per in snap.values() for k, v in per.items() if str(getattr(k, "value", k)) == "Total")

            retained.append((stats.mod_fqn, round((total(post) - total(pre)) / GIB, 3)))
    peaks.sort(key=lambda x: -x[1])
    retained = sorted((x for x in retained if x[1] > 0), key=lambda x: -x[1])
    return peaks[:8], retained[:8]


def _local_bytes(parts: list[Any], optimizers: list[Any]) -> dict[str, int]:
    import torch
    from torch.distributed.tensor import DTensor

    def local(t: Any) -> Any:
        return t.to_local() if isinstance(t, DTensor) else t

    seen: set[int] = set()
    params = trainable = states = 0
    for part in parts:
        for p in part.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            size = local(p).numel() * local(p).element_size()
            params += size
            trainable += size if p.requires_grad else 0
    for opt in optimizers:
        for state in opt.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    states += local(value).numel() * local(value).element_size()
    return {"params": params, "trainable_params": trainable, "optimizer_states": states}


def _grad_bytes(parts: list[Any]) -> int:
    """Local bytes of the gradients the step's backward left (before the optimizer step frees them)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for part in parts:
        for p in part.parameters():
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                total += g.numel() * g.element_size()
    return total


def _dp_group_size(mesh_context: Any) -> int:
    """Ranks holding different data (train_ft's ``_get_dp_group_size(include_cp=True)``)."""
    mesh = mesh_context.device_mesh
    if mesh is None:
        return 1
    size = 1
    for name in ("dp_replicate", "dp_shard", "cp"):
        if name in mesh.mesh_dim_names:
            size *= mesh[name].size()
    return size


def _dp_group(mesh: Any) -> Any:
    """The group of ranks holding different data (train_ft's ``_get_dp_group(include_cp=True)``); None for one."""
    if mesh is None:
        return None
    names = tuple(n for n in ("dp_replicate", "dp_shard", "cp") if n in mesh.mesh_dim_names and mesh[n].size() > 1)
    return mesh[names]._flatten().get_group() if names else None


def _optimizer(model: Any, spec: dict[str, Any], mesh: Any) -> list[Any]:
    from nemo_automodel.components.optim.optimizer import build_optimizer

    kwargs = dict(spec["kwargs"])
    if isinstance(kwargs.get("betas"), list):
        kwargs["betas"] = tuple(kwargs["betas"])
    return build_optimizer(model, (spec["target"], kwargs), device_mesh=mesh)


def _states_to(optimizers: list[Any], dtype_name: str) -> None:
    """Optimizer states in ``dtype_name`` (a replaced optimizer that keeps its moments in another dtype)."""
    import torch

    dtype = getattr(torch, dtype_name)
    for opt in optimizers:
        for state in opt.state.values():
            for key, value in list(state.items()):
                if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                    state[key] = value.to(dtype)


def _import_automodel() -> None:
    shims.import_automodel()
    import nemo_automodel.components.training.utils  # noqa: F401 - the step's helpers (timed with the import)
    import nemo_automodel.recipes._dist_utils  # noqa: F401
    import transformers  # noqa: F401


def _measure(spec: dict[str, Any], build: dict[str, Any], phases: Phases, rewrites: list[str]) -> dict[str, Any]:
    """Build the model of ``build`` (its config.json and distributed: block) with AutoModel's own code on a fresh fake
    process group and run one training step under the memory tracker; its figures, per phase."""
    import torch
    import torch.distributed as dist
    from nemo_automodel._transformers.auto_model import NeMoAutoModelForCausalLM
    from nemo_automodel.components._peft.lora import PeftConfig
    from nemo_automodel.components.distributed.context_parallel import ContextParallelSharder
    from nemo_automodel.components.distributed.tp_replicas import synchronize_tp_replica_gradients
    from nemo_automodel.components.distributed.utils import get_sync_ctx
    from nemo_automodel.components.loss import build_loss_config
    from nemo_automodel.components.loss.linear_ce_base import LinearCrossEntropy
    from nemo_automodel.components.loss.utils import calculate_loss, prepare_lm_weight
    from nemo_automodel.components.training.model_output_utils import get_final_hidden_states
    from nemo_automodel.components.training.utils import (
        get_expert_tp_replication_factor,
        prepare_after_first_microbatch,
        prepare_for_final_backward,
        prepare_for_grad_accumulation,
        scale_grads_and_clip_grad_norm,
    )
    from nemo_automodel.components.utils.model_utils import count_model_parameters, filter_forward_kwargs
    from nemo_automodel.recipes._dist_utils import create_distributed_setup_from_config
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import AutoConfig

    res: dict[str, Any] = {}
    if dist.is_initialized():
        dist.destroy_process_group()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    batch, seq = spec["micro_batch_size"], spec["seq_len"]
    items: dict[str, Any] = {
        "model_utils.py:_get_model_param_stats": 0.0,  # a parameter norm, only logged
        "rope_utils.py:forward": seq - 1,  # RoPE sizes its cos/sin cache from position_ids.max()
        "torch/nn/init.py:_no_grad_trunc_normal_": lambda t: False if t.dtype == torch.bool else 0.0,
    }
    with phases("setup"):
        dist.init_process_group("fake", rank=spec["rank"], world_size=spec["world_size"], store=FakeStore())
        setup = create_distributed_setup_from_config(
            {"distributed": build["distributed"]}, world_size=spec["world_size"]
        )
        mc = setup.mesh_context
        mesh = mc.device_mesh

    with phases("build"):
        cfg = dict(build["hf_config"])
        hf_config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        loss_fn = build_loss_config(spec["loss"]["name"], **spec["loss"]["kwargs"]).build()
        pp_enabled = mc.pp_size > 1
        if pp_enabled:  # the fields train_ft's setup() fills in the pipeline config
            pc = setup.pipeline_config
            pc.pp_batch_size = spec["local_batch_size"]
            pc.loss_fn = loss_fn
            if pc.pp_seq_len is None:
                pc.pp_seq_len = seq
        peft = None
        if spec["peft"] is not None:
            peft = PeftConfig(**spec["peft"])
            if peft.use_triton and find_spec("triton") is None:
                peft.use_triton = False  # AutoModel's own choice under TP > 1 or PP; without triton it raises
                rewrites.append(
                    "peft.use_triton: false (triton is not installed here; AutoModel raises ImportError in the "
                    "first forward without it; it uses the same torch LoRA path itself under TP or PP)"
                )
        kwargs: dict[str, Any] = {"use_liger_kernel": bool(spec.get("liger"))}
        if spec["backend"] is not None:
            from nemo_automodel.components.models.common import BackendConfig

            kwargs["backend"] = BackendConfig(**spec["backend"])
        if spec["torch_dtype"]:
            kwargs["torch_dtype"] = spec["torch_dtype"]
        if spec["force_hf"]:
            kwargs["force_hf"] = True
        with shims.build_patches(fake_mode), shims.value_oracles(items, {}), shims.liger_stand_in() as liger:
            model = NeMoAutoModelForCausalLM.from_config(hf_config, distributed_setup=setup, peft_config=peft, **kwargs)
        if liger.applied:
            rewrites.append(
                "Liger Kernel (AutoModel's default for a Hugging Face class without TP or CP) runs as a stand-in with "
                "its kernels' saved tensors (RMSNorm, SwiGLU; dry_run/liger.py)"
            )
        elif liger.skipped:
            rewrites.append(
                f"Liger Kernel is not stood in for model type {liger.skipped[0]} (the stand-in covers "
                "llama, mistral, qwen2, qwen3): measured as the Hugging Face class computes without it"
            )
        parts = list(getattr(model, "parts", [model]))
        if hasattr(model, "total_params_before_pp"):
            trainable, total = model.trainable_params_before_pp, model.total_params_before_pp
        else:
            trainable, total = count_model_parameters(model)
        res["params"] = {"total": int(total), "trainable": int(trainable), "class": type(parts[0]).__name__}
        if pp_enabled:
            info = model.info
            res["pp_stages"] = [st.stage_index for st in info.stages]
            if (
                info.has_last_stage
                and isinstance(loss_fn, LinearCrossEntropy)
                and not any(getattr(p, "_pp_return_hidden_states_supported", False) for p in parts)
            ):
                # train_ft._maybe_downgrade_loss_fn: what AutoModel trains under PP on such a model
                from nemo_automodel.components.loss.masked_ce import MaskedCrossEntropy

                loss_fn = MaskedCrossEntropy(ignore_index=getattr(loss_fn, "ignore_index", -100))
                rewrites.append(
                    "FusedLinearCrossEntropy -> MaskedCrossEntropy: AutoModel's own fallback under pipeline "
                    "parallelism for a model without hidden-state outputs (train_ft._maybe_downgrade_loss_fn)"
                )

    with phases("optimizer"):
        optimizers = _optimizer(model, spec["optimizer"], mesh)

    items["tp_replicas.py:synchronize_tp_replica_gradients"] = mc.tp_size  # every replica reports its gradient
    dp_group = _dp_group_size(mc)
    ep = max(mc.ep_size, 1)
    n_experts = next(
        (
            getattr(hf_config, k)
            for k in ("num_experts", "n_routed_experts", "num_local_experts")
            if getattr(hf_config, k, None)
        ),
        1,
    )
    nonzero = {  # balanced routing: this rank's experts receive 1/ep of the token assignments
        "moe/experts.py:_permute_tokens_for_grouped_mm": lambda mask: mask.numel() // ep,
        "moe/experts.py:_forward_loop": lambda mask: mask.numel() // n_experts,
    }
    with (
        shims.step_patches(),
        shims.value_oracles(items, nonzero),
        fake_mode,
    ):
        with phases("optimizer"):  # the step after the first: the optimizer's states exist already
            for p in (p for part in parts for p in part.parameters() if p.requires_grad):
                p.grad = torch.zeros_like(p)
            for opt in optimizers:
                opt.step()
                opt.zero_grad(set_to_none=True)
            if spec["optimizer"]["state_dtype"]:
                _states_to(optimizers, spec["optimizer"]["state_dtype"])
        vocab = hf_config.vocab_size
        if pp_enabled:
            batches = [(torch.randint(0, vocab, (spec["local_batch_size"], seq)),) * 2]
        else:
            batches = [(torch.randint(0, vocab, (batch, seq)),) * 2 for _ in range(spec["microbatches"])]
        tracker = make_tracker(parts, optimizers, phases)
        after_forward: dict[str, int] | None = None
        num_label_tokens = sum(ids.numel() for ids, _ in batches) * (dp_group // max(mc.cp_size, 1))
        with tracker, _repeated_calls(tracker):
            prepare_for_grad_accumulation(parts, pp_enabled=pp_enabled)
            for i, (ids, labels) in enumerate(batches):
                last = i == len(batches) - 1
                if last:
                    prepare_for_final_backward(parts, pp_enabled=pp_enabled)
                if pp_enabled:
                    _pipeline_step(model, parts, ids, labels.clone(), loss_fn, mc, phases, tracker)
                else:
                    part = parts[0]
                    with phases("forward"):
                        sharder = ContextParallelSharder(
                            part,
                            mesh,
                            {"input_ids": ids, "labels": labels.clone()},
                            padding_token_id=0,
                            num_chunks=1,
                        )
                        train_ctx, mb = sharder.shard({"input_ids": ids, "labels": labels.clone()})
                    target = mb.pop("labels")
                    sync = get_sync_ctx(
                        part,
                        last,
                        defer_fsdp_grad_sync=getattr(setup.strategy_config, "defer_fsdp_grad_sync", True),
                    )
                    with train_ctx(), sync:
                        linear_ce = isinstance(loss_fn, LinearCrossEntropy)
                        with phases("forward"):
                            forward = filter_forward_kwargs(part, mb)
                            if linear_ce:
                                forward = {**forward, "logits_to_keep": 1, "output_hidden_states": True}
                            out = part(**forward)
                        with phases("loss"):
                            lm_weight = (
                                prepare_lm_weight(loss_fn, part, grad_reduce_group=_dp_group(mesh))
                                if linear_ce
                                else None
                            )
                            loss = calculate_loss(
                                loss_fn,
                                logits=getattr(out, "logits", out),
                                labels=target,
                                model=part,
                                hidden_states=get_final_hidden_states(out),
                                lm_weight=lm_weight,
                                num_label_tokens=num_label_tokens,
                            )
                        del out
                        if after_forward is None:
                            after_forward = _categories(tracker.get_tracker_snapshot("current"))
                        with phases("backward"):
                            (loss * dp_group).backward()
                if i == 0:
                    prepare_after_first_microbatch()
            grad_bytes = _grad_bytes(parts)
            with phases("clip_grad_norm"):
                synchronize_tp_replica_gradients(parts, mesh)
                moe_mesh = mc.moe_mesh
                scale_grads_and_clip_grad_norm(
                    spec["clip_grad_norm"],
                    parts,
                    norm_type=2.0,
                    pp_enabled=pp_enabled,
                    device_mesh=mesh,
                    moe_mesh=moe_mesh,
                    ep_axis_name="ep" if moe_mesh is not None and "ep" in moe_mesh.mesh_dim_names else None,
                    pp_axis_name="pp" if pp_enabled else None,
                    foreach=True,
                    num_label_tokens=num_label_tokens,
                    dp_group_size=dp_group,
                    expert_tp_replication_factor=get_expert_tp_replication_factor(parts, mesh),
                    grad_norm_backend="triton",
                )
            with phases("optimizer"):
                for opt in optimizers:
                    # the stand-in for TE's FusedAdam holds its fp32 states, which torch's Adam cannot step against
                    # bf16 gradients; TE's fused kernel updates them in place, with no temporaries to measure
                    if not spec["optimizer"]["state_dtype"]:
                        opt.step()
                    opt.zero_grad()
        peak = _categories(tracker.get_tracker_snapshot("peak"))
        largest, retained = _module_views(tracker)
    local = _local_bytes(parts, optimizers)
    local = _local_bytes(parts, optimizers)
    res.update(
        tracker=type(tracker).__mro__[1].__name__,
        peak_categories={k: v / GIB for k, v in peak.items()},
        peak=_split(peak, local["params"]),
        peak_phase=tracker.peak_phase,
        phase_peaks={k: v / GIB for k, v in tracker.phase_peaks.items()},
        phase_splits={ph: _split(c, local["params"]) for ph, c in tracker.phase_categories.items()},
        phase_categories={ph: {k: v / GIB for k, v in c.items()} for ph, c in tracker.phase_categories.items()},
        largest_modules=largest,
        forward_retained=retained,
        local_bytes={**local, "grads": grad_bytes},
        after_forward=_split(after_forward, local["params"]) if after_forward else None,
    )
    return res


def _at_depth(spec: dict[str, Any], first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """The full depth's figures on the line through two shallow builds (see :mod:`.depth`)."""
    d = spec["depth"]
    depth = Depth(
        period=d["period"],
        prefix=d["prefix"],
        layers=tuple(d["layers"]),  # type: ignore[arg-type]
        units=tuple(d["units"]),  # type: ignore[arg-type]
        target_units=d["target_units"],
    )
    (u1, u2), target = depth.units, depth.target_units

    def at(a: float, b: float) -> float:
        return line(u1, a, u2, b, target)

    splits = extrapolate_splits(depth, first["phase_splits"], second["phase_splits"])
    cats = extrapolate_splits(depth, first["phase_categories"], second["phase_categories"])
    phase = peak_phase(splits)
    if phase is None:
        raise RuntimeError("the two shallow builds share no phase: the depth cannot be extrapolated")
    out = dict(second)
    out.update(
        peak=splits[phase],
        peak_phase=phase,
        peak_categories=cats.get(phase, {}),
        phase_peaks={ph: v["total"] for ph, v in splits.items()},
        phase_splits=splits,
        local_bytes={k: int(at(first["local_bytes"][k], v)) for k, v in second["local_bytes"].items()},
        params={
            **second["params"],
            "total": int(at(first["params"]["total"], second["params"]["total"])),
            "trainable": int(at(first["params"]["trainable"], second["params"]["trainable"])),
        },
        builds=[
            {"layers": n, "peak_gib": b["peak"]["total"], "peak_phase": b["peak_phase"]}
            for n, b in zip(d["layers"], (first, second))
        ],
    )
    if first.get("after_forward") and second.get("after_forward"):
        out["after_forward"] = {k: at(first["after_forward"][k], v) for k, v in second["after_forward"].items()}
    return out


def run(spec: dict[str, Any]) -> dict[str, Any]:
    phases = Phases()
    result: dict[str, Any] = {"rank": spec["rank"], "status": "failed", "rewrites": []}
    try:
        with phases("import"):
            warnings.filterwarnings("ignore")
            _import_automodel()
        broken = shims.broken()
        if broken:
            result["status"] = "not_measured"
            result["reason"] = "the installed AutoModel or torch moved what the dry run hooks: " + "; ".join(broken)
            return result
        if (spec.get("backend") or {}).get("attn") == "te":
            shims.install_te_attention()
        builds = spec.get("builds") or [{"hf_config": spec["hf_config"], "distributed": spec["distributed"]}]
        measured = [_measure(spec, build, phases, result["rewrites"]) for build in builds]
        result.update(measured[0] if len(measured) == 1 else _at_depth(spec, measured[0], measured[1]))
        result["status"] = "measured"
    except Exception as exc:  # noqa: BLE001 - AutoModel's own exception is the result
        cause = exc.__cause__ or exc.__context__
        result.update(
            status="failed",
            error=f"{type(exc).__name__}: {exc}"[:4000],
            error_phase=phases.failed or phases.current,
            traceback=_short_traceback(exc),
        )
        if cause is not None and "[Stage" in str(exc):  # the pipeline wraps a stage's error
            result["error"] = f"{type(cause).__name__}: {cause}"[:4000]
            result["traceback"] = _short_traceback(cause)
    finally:
        result["phases_s"] = phases.seconds
        result["host_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        result["shim_hits"] = {name: s.hits for name, s in shims.SHIMS.items() if s.hits}
        result["value_calls"] = shims.CALLS
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
    return result


@contextlib.contextmanager
def _repeated_calls(tracker: Any) -> Any:
    """Let the tracker see a module called once per microbatch (gradient accumulation, pipeline schedules): its
    per-module record restarts at each call (see ``Tracker.repeated_top_level``). A global forward pre-hook runs
    before FSDP's own pre-forward, which is where FSDPMemTracker refuses a second call."""
    import torch
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    tracker.pipeline_roots = True

    def restart(module: Any, args: Any) -> None:
        if isinstance(tracker, FSDPMemTracker) and tracker.repeated_top_level(module):
            tracker.memory_tracking.pop(module, None)

    handle = torch.nn.modules.module.register_module_forward_pre_hook(restart)
    try:
        yield
    finally:
        handle.remove()


def _pipeline_step(
    pp: Any, parts: list[Any], ids: Any, labels: Any, loss_fn: Any, mc: Any, phases: Phases, tracker: Any
) -> None:
    """One pipeline step of this rank's stages, as train_ft runs it (its ``_configure_pipeline_loss_fn`` and the PP
    branch of ``_forward_backward_step``). On a fake process group the schedule's sends and receives complete
    without data into buffers AutoModel allocated from its static stage shapes, so the schedule's own microbatch
    order, and with it the in-flight activations, is what the tracker sees."""
    from nemo_automodel.components.loss.mtp import MTPLossConfig

    info = pp.info
    mesh = mc.device_mesh
    if info.has_last_stage:
        last = next(m for m, st in zip(parts, info.stages) if st.is_last)
        info.schedule._loss_fn = MTPLossConfig().build(loss_fn, last, grad_reduce_group=_dp_group(mesh))
    losses: list[Any] | None = [] if info.has_last_stage else None
    targets = labels if info.has_last_stage else None
    pp.update_seq_len(ids.shape[1])
    with phases("pipeline_schedule"):
        if info.has_first_stage:
            info.schedule.step(ids, target=targets, losses=losses)
        else:
            info.schedule.step(target=targets, losses=losses)


def _short_traceback(exc: BaseException) -> list[str]:
    frames = traceback.extract_tb(exc.__traceback__)
    return [f"{f.filename.split('site-packages/')[-1]}:{f.lineno} in {f.name}" for f in frames][-12:]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    spec_path, out_path = Path(args[0]), Path(args[1])
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    result = run(spec)
    out_path.write_text(json.dumps(result, default=str), encoding="utf-8")
    print("PHASE done", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
