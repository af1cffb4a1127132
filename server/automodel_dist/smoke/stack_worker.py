"""One rank of a smoke run on AutoModel's own stack: the recipe's architecture at tiny dims, built, parallelized and
trained by AutoModel 0.7.0's code (:mod:`automodel_dist.stack.step`, train_ft's order) on real tensors.

Rank 0 first trains the single-process reference: the same AutoModel class on one rank, unparallelized, on the whole
global batch. Every rank then trains its share under the layout. Both sides start from the same weights (a value per
parameter name, from the seed) and see the same tokens, so per-step loss and grad norm, the first step's gradients and
the final parameters must agree up to the precision's rounding. Rank 0 broadcasts the reference; every rank compares
the tensors it holds (gathered whole from their DTensor shards) and the worst difference is reduced over the world.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from .parallelize import clean_name, full_tensor, local_tensor, skew_gradients
from .spec import SmokeSpec


def _initial_value(name: str, shape: Any, seed: int) -> Any:
    """A parameter's starting value from its name alone, so every process (and the reference) starts alike whatever
    the layout split: N(0, 0.02) for matrices, 1 + N(0, 0.1) for norm-like weight vectors, N(0, 0.02) for biases."""
    import torch

    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    values = torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
    if len(shape) == 1 and name.endswith("weight"):
        return 1.0 + 0.1 * values
    return 0.02 * values


def load_initial_weights(parts: list[Any], seed: int) -> int:
    """Every parameter of ``parts`` set to its :func:`_initial_value` (DTensors: this rank's shard of it)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    count = 0
    with torch.no_grad():
        for part in parts:
            for name, p in part.named_parameters():
                full = _initial_value(clean_name(name), p.shape, seed).to(p.dtype)
                if isinstance(p, DTensor):
                    local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                    p.to_local().copy_(local)
                else:
                    p.copy_(full)
                count += 1
    return count


def gather_full(parts: list[Any], grads: bool) -> dict[str, Any]:
    """The whole tensor of every parameter (or gradient) this rank holds, by clean name (a collective over each
    DTensor's mesh: every rank of a stage calls it in the same order)."""
    out: dict[str, Any] = {}
    for part in parts:
        for name, p in part.named_parameters():
            t = p.grad if grads else p
            if t is not None:
                out[clean_name(name)] = full_tensor(t.detach()).float().clone()
    return out


def still_mask(grad: Any, rel: float = 1e-6) -> Any:
    """The elements of a reference gradient that are not zero up to rounding (|g| > rel x the tensor's largest).
    Some are zero by symmetry (a key bias on dimensions RoPE leaves alone: softmax ignores a per-row constant); Adam
    divides such a gradient by its own size, so rounding moves those weights by up to the learning rate either way,
    and they are left out of the final-parameter comparison (their gradients are compared)."""
    mag = grad.abs()
    return mag > rel * mag.max()


def worst_difference(
    got: dict[str, Any], want: dict[str, Any], masks: dict[str, Any] | None = None
) -> tuple[float, str, list[str], int]:
    """Worst per-tensor ||got - want|| / ||want|| (on the ``masks`` elements where one is given), its name, the names
    present on one side only, and how many elements the masks left out."""
    worst, worst_name, missing, left_out = 0.0, "", [], 0
    for name, tensor in got.items():
        ref = want.get(name)
        if ref is None or tuple(ref.shape) != tuple(tensor.shape):
            missing.append(name)
            continue
        mask = (masks or {}).get(name)
        if mask is not None and tuple(mask.shape) == tuple(tensor.shape):
            left_out += int((~mask).sum())
            tensor, ref = tensor[mask], ref[mask]
        diff = float((tensor - ref).norm() / ref.norm().clamp_min(1e-12))
        if diff > worst:
            worst, worst_name = diff, name
    return worst, worst_name, missing, left_out


def _batches(stack: dict[str, Any], ids: Any, pp: bool) -> list[dict[str, Any]]:
    """``ids`` [n, seq+1] as train_ft's batches: labels are the next tokens; under PP one batch holds them all."""
    inputs, labels = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    if pp:
        return [{"input_ids": inputs, "labels": labels}]
    mbs = stack["micro_batch_size"]
    return [{"input_ids": inputs[i : i + mbs], "labels": labels[i : i + mbs]} for i in range(0, inputs.shape[0], mbs)]


def _tokens(spec: SmokeSpec) -> Any:
    """The global batch every step trains on (one batch, so the loss must fall)."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed * 7919)
    vocab = spec.automodel["hf_config"]["vocab_size"]
    return torch.randint(0, vocab, (spec.global_batch, spec.seq_len + 1), generator=gen)


def _distributed_block(block: dict[str, Any]) -> dict[str, Any]:
    """The block AutoModel's parser gets: a ``moe.mp_policy`` written as dtypes becomes torch's MixedPrecisionPolicy
    (AutoModel instantiates only a resolved ``_target_`` there; the planner never writes one)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    out = dict(block)
    moe = out.get("moe")
    if isinstance(moe, dict) and isinstance(moe.get("mp_policy"), dict):
        kw = {k: getattr(torch, v) for k, v in moe["mp_policy"].items() if k.endswith("dtype") and v}
        out["moe"] = {**moe, "mp_policy": MixedPrecisionPolicy(cast_forward_inputs=False, **kw)}
    return out


class _Run:
    """A model built by AutoModel with its optimizer, trained for the spec's steps."""

    def __init__(self, spec: SmokeSpec, distributed: dict[str, Any], world: int, rewrites: list[str]):
        from ..stack import shims, step
        from ..stack.recipe import StackRecipe

        stack = spec.automodel
        self.recipe = StackRecipe.model_validate(stack["recipe"])
        self.spec = spec
        self.setup = step.setup(_distributed_block(distributed), world)
        self.built = step.build(
            self.recipe,
            stack["hf_config"],
            self.setup,
            shims.real_build_patches(),
            rewrites,
            local_batch_size=stack["local_batch_size"] if world > 1 else spec.global_batch,
            seq_len=spec.seq_len,
        )
        self.initialised = load_initial_weights(self.built.parts, spec.seed)
        opt = self.recipe.optimizer
        self.optimizers = step.optimizer(self.built, opt["target"], {**opt["kwargs"], "lr": spec.lr})
        if self.built.pp_enabled:
            step.configure_pipeline_loss(self.built)

    def train(
        self,
        rows: Callable[[Any], Any],
        on_step: Callable[[int, float, float], None] | None = None,
        before_optimizer: Callable[[int], None] | None = None,
    ) -> tuple[list[float], list[float], dict[str, Any]]:
        """K steps on ``rows(global ids)``; (losses, grad norms, the first step's gathered gradients)."""
        from ..stack import shims, step

        losses, norms, grads0 = [], [], {}
        stack = self.spec.automodel
        for k in range(self.spec.steps):
            device = next(p.device for part in self.built.parts for p in part.parameters())
            batches = _batches(stack, rows(_tokens(self.spec)).to(device), self.built.pp_enabled)
            n_tokens = step.label_tokens(self.built, batches)

            def hook(k: int = k) -> None:
                if before_optimizer is not None:
                    before_optimizer(k)
                if k == 0:
                    grads0.update(gather_full(self.built.parts, grads=True))

            with shims.cuda_factories_on_cpu(), shims.cp_attention_math_on_cpu():
                out = step.train_step(
                    self.built,
                    self.optimizers,
                    batches,
                    num_label_tokens=n_tokens,
                    clip_grad_norm=self.recipe.clip_grad_norm,
                    before_optimizer=hook,
                )
                loss = step.reported_loss(self.built, out.loss_buffer, n_tokens)
            norm = float(out.grad_norm) if out.grad_norm is not None else float("nan")
            losses.append(loss)
            norms.append(norm)
            if on_step is not None:
                on_step(k, loss, norm)
        return losses, norms, grads0


def reference(spec: SmokeSpec, rewrites: list[str]) -> dict[str, Any]:
    """The single-process reference (rank 0, before the world's process group): AutoModel's class on one rank."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        run = _Run(spec, spec.automodel["reference_distributed"], 1, rewrites)
        losses, norms, grads0 = run.train(lambda ids: ids)
        return {
            "losses": losses,
            "grad_norms": norms,
            "grads0": grads0,
            "params": gather_full(run.built.parts, grads=False),
            "class": run.built.params.get("class"),
        }
    finally:
        dist.destroy_process_group()


def _hugging_face_class(part: Any, architecture: str) -> bool:
    """Whether AutoModel built the transformers class of ``architecture`` (its fallback) rather than its own (FSDP2
    wraps either in a class of its own, so the architecture's class is looked up in the MRO)."""
    cls = next((c for c in type(part).__mro__ if c.__name__ == architecture), type(part))
    return not cls.__module__.startswith("nemo_automodel")


def run_on_automodel(
    spec: SmokeSpec,
    result: dict[str, Any],
    timings: dict[str, float],
    progress: Any,
    backend: str,
    fault: Callable[[int, str], bool],
) -> dict[str, Any]:
    """This rank's smoke run on AutoModel's stack; fills and returns ``result`` (the tiny stack's keys)."""
    import torch
    import torch.distributed as dist

    from ..stack import shims
    from ..stack.step import dp_group_size, flat_dp_mesh

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    t0 = time.time()
    import torch._dynamo

    torch._dynamo.config.disable = True  # eager on both sides (the plan's substitutions say so)
    progress("init", message="importing AutoModel")
    shims.import_automodel()
    broken = shims.broken()
    if broken:
        raise RuntimeError("the installed AutoModel or torch moved what the smoke run hooks: " + "; ".join(broken))
    timings["import_automodel_s"] = time.time() - t0
    rewrites: list[str] = []
    ref: dict[str, Any] | None = None
    t_ref = time.time()
    if rank == 0:
        progress("reference", message="single-process reference on AutoModel's class")
        ref = reference(spec, rewrites)
    timings["reference_s"] = time.time() - t_ref

    progress("init", message=f"init_process_group({backend}), {world} ranks")
    dist.init_process_group(backend, timeout=timedelta(seconds=float(spec.pg_timeout_s)))
    run = _Run(spec, spec.automodel["distributed"], world, rewrites)
    built = run.built
    mesh = built.mesh
    result["model_class"] = built.params.get("class")
    if _hugging_face_class(built.parts[0], spec.automodel["architecture"]):
        result["model_class"] = f"{result['model_class']}, the Hugging Face class through AutoModel's fallback"
    result["stages"] = list(built.params.get("pp_stages", [0]))
    flat = flat_dp_mesh(mesh, include_cp=False)
    dp_rank = flat.get_local_rank() if flat is not None and flat.size() > 1 else 0
    per_dp = spec.global_batch // max(flat.size() if flat is not None else 1, 1)
    result["groups"] = {
        name: sorted(int(r) for r in mesh[name].mesh.flatten().tolist())
        for name in mesh.mesh_dim_names
        if mesh[name].size() > 1
    }
    result["mesh_mismatches"] = []
    timings["init_s"] = time.time() - t0 - timings["reference_s"]
    skew = float((spec.fault or {}).get("factor", 0.5))

    def inject(k: int) -> None:
        if fault(k, "crash"):
            raise RuntimeError(f"injected fault: crash@{rank}:{k}")
        if fault(k, "hang"):
            progress("step", k, spec.steps, f"injected fault: rank {rank} hangs at step {k}", force=True)
            time.sleep(10**9)
        if fault(k, "skew"):
            params = [p for part in built.parts for p in part.parameters()]
            skew_gradients(params, rank * 1000 + k, skew, next(p.device for p in params))

    def on_step(k: int, loss: float, norm: float) -> None:
        progress("step", k + 1, spec.steps, f"loss {loss:.5f}, grad norm {norm:.4f}")

    t_steps = time.time()
    progress("step", 0, spec.steps, "training on AutoModel's stack")
    losses, norms, grads0 = run.train(
        lambda ids: ids[dp_rank * per_dp : (dp_rank + 1) * per_dp], on_step=on_step, before_optimizer=inject
    )
    timings["steps_s"] = time.time() - t_steps

    t1 = time.time()
    params = gather_full(built.parts, grads=False)
    box = [ref]
    dist.broadcast_object_list(box, src=0)
    ref = box[0]
    assert ref is not None
    masks = {name: still_mask(g) for name, g in ref["grads0"].items()}
    worst, worst_name, missing_p, left_out = worst_difference(params, ref["params"], masks)
    grad_diff, grad_name, missing_g, _ = worst_difference(grads0, ref["grads0"])
    worst_t = torch.tensor([worst, grad_diff, float(len(missing_p) + len(missing_g))])
    dist.all_reduce(worst_t, op=dist.ReduceOp.MAX)
    timings["check_s"] = time.time() - t1 + timings["reference_s"]
    result.update(
        stack="automodel",
        losses=losses,
        reference_losses=ref["losses"],
        grad_norms=norms,
        reference_grad_norms=ref["grad_norms"],
        reference_class=ref["class"],
        max_param_rel_diff=worst,
        worst_param=worst_name,
        global_max_param_rel_diff=worst_t[0].item(),
        max_grad_rel_diff=grad_diff,
        worst_grad=grad_name,
        global_max_grad_rel_diff=worst_t[1].item(),
        unmatched_tensors=sorted(set(missing_p + missing_g))[:10],
        rewrites=rewrites,
        shim_hits={name: s.hits for name, s in shims.SHIMS.items() if s.hits},
        dp_group_size=dp_group_size(mesh),
        params_compared=len(params),
        still_elements=left_out,
    )
    if rank == 0:
        progress("compare", message=f"max parameter difference {worst_t[0].item():.2e}")
    result["param_bytes"] = sum(
        local_tensor(p).numel() * p.element_size() for part in built.parts for p in part.parameters()
    )
    return result


__all__ = [
    "run_on_automodel",
    "reference",
    "load_initial_weights",
    "gather_full",
    "worst_difference",
    "still_mask",
]
