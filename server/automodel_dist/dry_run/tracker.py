"""torch's memory tracker as the dry run uses it: one per measured step (FSDPMemTracker for one FSDP root, else
MemTracker), recording the phase of the peak and each phase's peak, letting a module be called once per microbatch,
and finding the modules running at each operator through an index by name.

torch's ``MemTracker._update_peak_stats`` runs after every operator and walks every module it has ever tracked to
find the running ones (``mod_fqn in parents``): O(modules) per operator, which was most of a pipeline dry run's time
(a rank holding several stages tracks thousands of modules). The running modules are the few names in
``parents``; an index from name to records, kept current by counting changes to the records, gives the same updates
in O(running modules). Each update leaves every running module's local peak at least the current total, so until a
module enters (a name joins ``parents``, or a pre-forward / pre-backward hook resets a local peak), the records change
or forward turns to backward, an operator that leaves the total at or below that update's finds nothing to raise: the
walk is skipped there, with the same figures (the global and per-phase peaks are still checked at every operator).
torch's trackers also file every operator's outputs through a mapped copy of them that they discard; while the dry
run's tracker is entered they walk the outputs in place instead (``walk_outputs_in_place``), with the same calls.
Its module tracker's backward hooks are made without the reference cycle torch's "all" multi-grad hook forms
(``backward_hooks_without_cycles``): the cycle kept every autograd branch that no backward runs, and what that branch
saved, alive until a garbage collection, which the measured step holds off; the GPU run has no such hooks.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
from collections.abc import Iterator
from typing import Any, Protocol

from ..estimate.memory import GIB


class _Phase(Protocol):
    current: str
    moment: str | None

    @property
    def key(self) -> str: ...


def _counted_records() -> Any:
    """torch's per-module record dictionary (a weak-key dictionary by module identity), counting its changes."""
    from torch.utils.weak import WeakIdKeyDictionary

    class Records(WeakIdKeyDictionary):  # type: ignore[misc]
        changes = 0

        def __setitem__(self, key: Any, value: Any) -> None:
            self.changes += 1
            super().__setitem__(key, value)

        def __delitem__(self, key: Any) -> None:
            self.changes += 1
            super().__delitem__(key)

        def pop(self, key: Any, *args: Any) -> Any:
            self.changes += 1
            return super().pop(key, *args)

        def popitem(self) -> Any:
            self.changes += 1
            return super().popitem()

        def setdefault(self, key: Any, default: Any = None) -> Any:
            self.changes += 1
            return super().setdefault(key, default)

        def update(self, dict: Any = None, **kwargs: Any) -> None:  # noqa: A002 - torch's signature
            self.changes += 1
            super().update(dict, **kwargs)

    return Records()


class _CountingSet(set):  # type: ignore[type-arg]
    """ModTracker's ``parents`` set, counting the names added to it; each one has its own generation (an ``id`` can be
    reused once the set it named is freed)."""

    adds = 0
    made = itertools.count()

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.generation = next(_CountingSet.made)

    def add(self, name: Any) -> None:
        self.adds += 1
        super().add(name)


def categories(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for per_device in snapshot.values():
        for key, value in per_device.items():
            name = getattr(key, "value", None) or getattr(key, "name", None) or str(key)
            out[name] = out.get(name, 0) + int(value)
    return out


def visit_tensors(types: Any, func: Any, tree: Any, is_leaf: Any = None) -> Any:
    """``func`` on each leaf of ``tree`` that is an instance of ``types`` (a tensor type: ``torch.Tensor`` at every
    call site ``walk_outputs_in_place`` rebinds), in pytree order: the calls ``tree_map_only(types, func, tree)``
    makes, without building the mapped tree it returns; returns ``tree`` itself."""
    from torch.utils._pytree import SUPPORTED_NODES, tree_leaves

    if isinstance(tree, types) and type(tree) not in SUPPORTED_NODES:  # a leaf itself (pytree's root rule)
        func(tree)
    else:
        for leaf in tree_leaves(tree, is_leaf=is_leaf):
            if isinstance(leaf, types):
                func(leaf)
    return tree


@contextlib.contextmanager
def backward_hooks_without_cycles() -> Iterator[bool]:
    """torch's ModTracker (inside every memory tracker) marks a module's backward as done with
    ``register_multi_grad_hook(inputs, fn)`` in its "all" mode, whose hook closure holds the inputs' autograd nodes
    while being held by them: a reference cycle a forward call. Where a module's inputs feed a branch no backward runs
    (a LoRA-trained Linear whose output only selects indices: DSA's indexer, whose top-k indices take no gradient),
    the cycle keeps that branch's nodes and the tensors they saved (the layer's normed input, one a layer and
    microbatch) after the forward returns, until a garbage collection; the measured step holds collections off, so
    a pipeline rank carried every such tensor of the step (the dry run of glm_5.1_lora's rank 0 at 24 layers: 41 of
    them, 1.9 GiB, into its second schedule step; its peak 3.0 GiB lower without them). The GPU run has no module
    tracker, and FSDP2's own backward hooks form no such cycle.
    While this is entered, ModTracker's hook takes the "any" mode, which holds no node: the module leaves the
    backward's running set at its first input's gradient rather than its last, for a module with several inputs that
    take a gradient: which modules a backward moment is filed under (largest_modules) changes there, and the "all"
    hook's buffer of the earlier inputs' gradients, kept until the last arrived, is not made (neither is in the GPU
    run). Yields whether the name was rebound (not where torch moved it)."""
    from torch.autograd.graph import register_multi_grad_hook
    from torch.distributed._tools import mod_tracker

    rebound = getattr(mod_tracker, "register_multi_grad_hook", None) is register_multi_grad_hook
    if rebound:
        mod_tracker.register_multi_grad_hook = functools.partial(register_multi_grad_hook, mode="any")  # type: ignore[attr-defined]
    try:
        yield rebound
    finally:
        if rebound:
            mod_tracker.register_multi_grad_hook = register_multi_grad_hook  # type: ignore[attr-defined]


@functools.cache
def _result_discarded(module: Any, name: str) -> bool:
    """Whether ``module``'s source reads ``name`` only as calls ``name(torch.Tensor, ...)`` that are statements of
    their own (the result unused, the filter torch's tensor type); False where the source cannot be read."""
    import ast
    import inspect

    try:
        tree = ast.parse(inspect.getsource(module))
    except (OSError, TypeError, SyntaxError):
        return False
    nodes = list(ast.walk(tree))
    statements = {id(n.value) for n in nodes if isinstance(n, ast.Expr)}
    calls = {id(n.func): n for n in nodes if isinstance(n, ast.Call)}

    def tensor_filter(call: ast.Call) -> bool:
        first = call.args[0] if call.args else None
        return (
            isinstance(first, ast.Attribute)
            and first.attr == "Tensor"
            and isinstance(first.value, ast.Name)
            and first.value.id == "torch"
        )

    reads = [n for n in nodes if isinstance(n, ast.Name) and n.id == name]
    return bool(reads) and all(
        id(r) in calls and id(calls[id(r)]) in statements and tensor_filter(calls[id(r)]) for r in reads
    )


@contextlib.contextmanager
def walk_outputs_in_place() -> Iterator[list[str]]:
    """torch's trackers file every operator's output tensors (and, in their module hooks, the modules' inputs and
    outputs) through ``tree_map_only(torch.Tensor, ...)``, which builds a mapped copy of the tree and a wrapper for
    its type filter, and discard both: on fake tensors, where an operator costs little else, a large share of a
    step's time (and the wrapper leaves cyclic garbage a call, which a step run with the collector held off keeps).
    While this is entered, in each tracker module that reads the name only in such calls it is bound to
    ``visit_tensors``, which calls the same function on the same tensors in the same order; torch's own is bound
    again on exit. Yields the modules changed: none where torch moved the name, reads it otherwise, or where it is
    already rebound (a tracker entered inside another)."""
    from torch.distributed._tools import fsdp2_mem_tracker, mem_tracker
    from torch.utils._pytree import tree_map_only

    changed = [
        m
        for m in (mem_tracker, fsdp2_mem_tracker)
        if getattr(m, "tree_map_only", None) is tree_map_only and _result_discarded(m, "tree_map_only")
    ]
    for module in changed:
        module.tree_map_only = visit_tensors  # type: ignore[attr-defined]
    try:
        yield [m.__name__ for m in changed]
    finally:
        for module in changed:
            module.tree_map_only = tree_map_only  # type: ignore[attr-defined]


def make_tracker(
    parts: list[Any], optimizers: list[Any], phases: _Phase, held: list[tuple[Any, str]] | None = None
) -> Any:
    """torch's FSDPMemTracker for one FSDP root, else its MemTracker; either also records the phase at the peak and
    the peak of every phase. ``held``: tensors the step holds beside the modules' and optimizers' own, with their
    category (params, grads, optimizer, temporaries), registered when the tracker starts."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType
    from torch.distributed.fsdp import FSDPModule

    base = FSDPMemTracker if len(parts) == 1 and isinstance(parts[0], FSDPModule) else MemTracker

    class Tracker(base):  # type: ignore[misc, valid-type]
        peak_phase: str | None = None
        pipeline_roots: bool = False  # restart records of repeated calls (set by repeated_calls)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.held: list[tuple[Any, str]] = []  # (tensor, category) registered at the start (see make_tracker)
            # each moment's peak (a phase, or a pipeline action within one: ``phase@action``) and torch's categories
            # then
            self.moment_peaks: dict[str, int] = {}
            self.moment_categories: dict[str, dict[str, int]] = {}
            records = _counted_records()
            records.update(self.memory_tracking)
            self.memory_tracking = records
            self._by_name: dict[str, list[Any]] = {}
            self._indexed: tuple[int, int] | None = None  # (changes, length) of the records the index was built at
            self._indexed_name: dict[int, str] = {}  # id(record) -> its name in the index
            self._entries = 0  # module entries that may reset a local peak (pre-forward / pre-backward hooks)
            self._quiet_key: tuple[Any, ...] | None = None  # what the last full update saw running
            self._ceiling: dict[Any, int] = {}  # ... and the totals it left every running local peak at or above

        def __enter__(self) -> Any:
            outermost = getattr(self, "_depth", 0) == 0
            if outermost:
                with contextlib.ExitStack() as names:  # (torch's names back if the second rebinding fails)
                    names.enter_context(walk_outputs_in_place())
                    names.enter_context(backward_hooks_without_cycles())
                    self._walk = names.pop_all()
            entered = False
            try:
                out = super().__enter__()
                entered = True
                kinds = {
                    "params": _MemRefType.PARAM,
                    "grads": _MemRefType.GRAD,
                    "optimizer": _MemRefType.OPT,
                    "temporaries": _MemRefType.TEMP,
                }
                for tensor, category in self.held:
                    self._update_and_maybe_create_winfos(tensor, kinds[category])
                return out
            except BaseException:  # no `with` body runs, so no __exit__: leave torch's tracker and names as found
                if entered:
                    super().__exit__(*sys.exc_info())
                if outermost:
                    self._walk.__exit__(None, None, None)
                raise

        def __exit__(self, *args: Any) -> None:
            try:
                super().__exit__(*args)
            finally:
                if getattr(self, "_depth", 0) == 0:
                    self._walk.__exit__(None, None, None)

        def _records_by_name(self) -> dict[str, list[Any]]:
            """Module records by module name, rebuilt when the records changed (a garbage-collected module drops
            its record without a call: the length catches it)."""
            state = (self.memory_tracking.changes, len(self.memory_tracking))
            if state != self._indexed:
                self._by_name, self._indexed_name = {}, {}
                for stats in self.memory_tracking.values():
                    self._by_name.setdefault(stats.mod_fqn, []).append(stats)
                    self._indexed_name[id(stats)] = stats.mod_fqn
                self._indexed = state
            return self._by_name

        def _track_module_params_and_buffers(self, module: Any, install_grad_hooks: bool = True) -> Any:
            # torch registers a gradient hook on every parameter, and a frozen one (PEFT's base weights) refuses it
            out = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
            if install_grad_hooks:
                for p in module.parameters():
                    if p.requires_grad and self._param_to_grad_hook_handles.get(p) is None:
                        self._param_to_grad_hook_handles[p] = self._grad_hooks(p, _MemRefType.GRAD)
            return out

        def _grad_hooks(self, p: Any, reftype: Any) -> tuple[Any, Any]:
            """A trainable parameter's gradient filed under ``reftype`` when it is made and when it is accumulated."""

            def grad_hook(g: Any) -> None:
                self._update_and_maybe_create_winfos(g, reftype)

            def post_accumulate(q: Any) -> None:
                self._update_and_maybe_create_winfos(q.grad, reftype)

            return p.register_hook(grad_hook), p.register_post_accumulate_grad_hook(post_accumulate)

        def _entering(self, hook: Any, *args: Any, **kwargs: Any) -> Any:
            """Run a hook that may reset a local peak (a module entering), counted before and after it."""
            self._entries += 1
            out = hook(*args, **kwargs)
            self._entries += 1
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
            out = self._entering(super()._pre_fw_hook, module, inputs)
            stats = self.memory_tracking.get(module)
            # MemTracker renames a module's record on a repeated call: the index must follow the new name
            if stats is not None and self._indexed_name.get(id(stats), stats.mod_fqn) != stats.mod_fqn:
                self._indexed = None
            return out

        def _pre_bw_hook(self, module: Any, args: Any) -> Any:
            return self._entering(super()._pre_bw_hook, module, args)

        if base is FSDPMemTracker:

            def _fsdp_param_group_pre_backward(self, fsdp_mod: Any, orig: Any) -> Any:
                tracked = super()._fsdp_param_group_pre_backward(fsdp_mod, orig)
                return lambda *args, **kwargs: self._entering(tracked, *args, **kwargs)  # it resets the local peak

            def _instrument_fsdp_module(self) -> None:
                # FSDPMemTracker registers the sharded parameters of FSDP's groups only: a parameter FSDP leaves out
                # (AutoModel's experts on a one-rank ep_shard mesh, its ignored_params) was first seen when forward
                # touched it and filed as an activation, its gradient as a temporary or an activation. Registered
                # here as this rank's shard, with a gradient hook, they are split as the estimate splits them; the
                # bytes are the same.
                super()._instrument_fsdp_module()
                from torch.distributed._tools.fsdp2_mem_tracker import _FSDPRefType

                managed = {
                    id(fp.sharded_param)
                    for m in self._root_mod.modules()
                    if isinstance(m, FSDPModule) and (group := m._get_fsdp_state()._fsdp_param_group)
                    for fp in group.fsdp_params
                }
                self._outside_hooks = []
                for p in self._root_mod.parameters():
                    if id(p) in managed:
                        continue
                    self._update_and_maybe_create_winfos(p, _FSDPRefType.SHARDED_PARAM)
                    if p.grad is not None:
                        self._update_and_maybe_create_winfos(p.grad, _FSDPRefType.SHARDED_GRAD)
                    if p.requires_grad:
                        self._outside_hooks += self._grad_hooks(p, _FSDPRefType.SHARDED_GRAD)

            def _deregister_module_and_optimizer_hooks(self) -> None:
                super()._deregister_module_and_optimizer_hooks()
                for handle in getattr(self, "_outside_hooks", ()):
                    handle.remove()
                self._outside_hooks = []

            def _fsdp_param_group_post_backward(self, fsdp_mod: Any, orig: Any) -> Any:
                tracked = super()._fsdp_param_group_post_backward(fsdp_mod, orig)

                def inner(*args: Any, **kwargs: Any) -> Any:
                    # a group that never ran forward in this step (a multimodal tower under a text batch) was never
                    # unsharded: torch's tracker would read its unsharded parameters; FSDP's own post-backward runs
                    group = fsdp_mod._get_fsdp_state()._fsdp_param_group
                    if group and any(not hasattr(p, "_unsharded_param") for p in group.fsdp_params):
                        return orig(*args, **kwargs)
                    return tracked(*args, **kwargs)

                return inner

        def _running_key(self, peak_state: Any) -> tuple[Any, ...]:
            parents = self._mod_tracker.parents
            if type(parents) is not _CountingSet:  # ModTracker starts a new set after each backward
                parents = self._mod_tracker.parents = _CountingSet(parents)
            records = self.memory_tracking
            return (parents.generation, parents.adds, self._entries, records.changes, len(records), peak_state)

        def _update_peak_stats(self, peak_state: Any) -> None:
            # torch's update (mem_tracker.py), with the running modules found by name and the walk skipped where it
            # cannot raise a local peak (see the module docstring)
            curr = self._curr_mem_snap
            key = self._running_key(peak_state)
            ceiling = self._ceiling
            if key != self._quiet_key or any(snap[_TOTAL_KEY] > ceiling.get(dev, -1) for dev, snap in curr.items()):
                by_name = self._records_by_name()
                for name in self._mod_tracker.parents:
                    for stats in by_name.get(name, ()):
                        if peak_state in stats.snapshots:
                            for dev, dev_snap in curr.items():
                                if stats.local_peak.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                                    stats.local_peak[dev] = dev_snap[_TOTAL_KEY]
                                    stats.snapshots[peak_state][-1][dev] = dict(dev_snap)  # enum keys, int values
                self._quiet_key = key
                self._ceiling = {dev: snap[_TOTAL_KEY] for dev, snap in curr.items()}
            for dev, dev_snap in curr.items():
                if self._peak_mem.get(dev, 0) < dev_snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = dev_snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(dev_snap)
                    self.peak_phase = phases.current
            self.record_moment()

        def record_moment(self) -> None:
            """The current total as a candidate for the peak of the running moment (a phase, or one pipeline action
            within it: :func:`pipeline_moments`); called at every operator and where a moment begins."""
            curr = self._curr_mem_snap
            total = sum(snap.get(_TOTAL_KEY, 0) for snap in curr.values())
            key = phases.key
            if total > self.moment_peaks.get(key, 0):
                self.moment_peaks[key] = total
                self.moment_categories[key] = categories(curr)

    if base is FSDPMemTracker:
        tracker = Tracker(parts[0], optimizers[0])
    else:
        tracker = Tracker()
        tracker.track_external(*parts, *optimizers)
    tracker.held = held or []
    return tracker


@contextlib.contextmanager
def pipeline_moments(tracker: Any, phases: Any) -> Iterator[None]:
    """Each pipeline action a moment of its own: every stage's forward, backward and weight-gradient chunk, and the
    stretch after it until the next (the schedule's unshards, reshards and sends), keyed by its stage, microbatch and
    occurrence (a second schedule step repeats them): ``F1.3#0``, then ``F1.3#0!`` (the total it leaves, alone) and
    ``F1.3#0+``.

    A phase's peak is the largest of its moments, each linear in the layers a stage holds, so a shallow build's peak
    can fall on another moment than the full depth's: within the last stage's last backward of a 1F1B schedule, a
    transient of the head's at three and four layers a stage, and at eight what the backward leaves, every block
    gathered. Where a rank's two builds hold the same stages they run the same actions in the same order (the
    microbatches do not change with the layers), so each moment is extrapolated on its own line and the maximum taken
    after (dry_run/depth.py by_phase); builds of 3 and 4 of a rank's stages keep a line per phase."""
    from torch.distributed.pipelining.stage import _PipelineStageBase

    seen: dict[str, int] = {}
    originals = {
        name: getattr(_PipelineStageBase, name)
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
    }

    def enter(label: str) -> None:
        phases.moment = label
        tracker.record_moment()  # the moment starts holding what the last one left

    def wrap(kind: str, original: Any) -> Any:
        @functools.wraps(original)
        def chunk(stage: Any, *args: Any, **kwargs: Any) -> Any:
            # (torch passes the chunk id first; by keyword it is fwd_chunk_id or bwd_chunk_id)
            chunk_id = args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id"))
            action = f"{kind}{stage.stage_index}.{chunk_id}"
            label = f"{action}#{seen.get(action, 0)}"
            seen[action] = seen.get(action, 0) + 1
            enter(label)
            try:
                return original(stage, *args, **kwargs)
            finally:
                enter(f"{label}!")  # what the action leaves, alone: within the action or after it a transient that
                enter(f"{label}+")  # does not grow with the layers can outweigh it in a shallow build

        return chunk

    for name, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"), ("backward_weight_one_chunk", "W")):
        setattr(_PipelineStageBase, name, wrap(kind, originals[name]))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(_PipelineStageBase, name, original)
        phases.moment = None


def module_views(tracker: Any) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
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


@contextlib.contextmanager
def repeated_calls(tracker: Any) -> Any:
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
