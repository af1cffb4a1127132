"""Known values on fake tensors: AutoModel's and transformers' helpers that read a batch's layout on the host (image
grids, packed document lengths, a rank's token positions) run on the real values behind FakeTensorMode's constants,
and what they build is handed back as constants, so it stays known downstream. The dry run's batches carry their
layout as constants; everything else stays fake. Imports torch only where a helper is wrapped (the dry run's
rank)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any


class UnknownValues(RuntimeError):
    """A helper that must read the batch's layout on the host was handed a tensor whose values the dry run does not
    know: the rank is reported not measured, with this message as the reason (on a GPU AutoModel would not raise)."""


def on_values(fake_mode: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn`` on real values (``args`` and ``kwargs`` already the constants behind known fake tensors), outside
    FakeTensorMode; the tensors it returns, in containers or a dataclass's fields, handed back as constants."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.utils._pytree import tree_map

    with unset_fake_temporarily():
        out = fn(*args, **kwargs)

    def lift(value: Any) -> Any:
        return tree_map(lambda t: _lift(fake_mode, t), value)

    if dataclasses.is_dataclass(out) and not isinstance(out, type):
        return dataclasses.replace(out, **{f.name: lift(getattr(out, f.name)) for f in dataclasses.fields(out)})
    return lift(out)


def when_known(
    fn: Callable[..., Any],
    *,
    fake_mode: Any = None,
    required: str | None = None,
    from_sizes: bool = False,
) -> Callable[..., Any]:
    """``fn`` wrapped: where every fake tensor among its arguments is a constant, it runs on their values
    (:func:`on_values`); otherwise it runs on the fake tensors as it would have, or, with ``required`` (what reads
    them, for the message), raises :class:`UnknownValues`. ``from_sizes``: a call with no fake tensor at all is
    computed on the host too (its values come from sizes alone, where its factories would make unknown ones).
    ``fake_mode``: the mode to hand constants back to (default: the one active at the call, else its tensors').
    Containers among the arguments are rebuilt on the values path: a helper that uses one as an out-parameter needs
    its own wrapper (as the vision index helpers have, stack/media.py)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.utils._pytree import tree_flatten, tree_map

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        fakes = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, FakeTensor)]
        mode = fake_mode if fake_mode is not None else _active_fake_mode()
        if mode is None and fakes:  # (called outside the mode on its tensors)
            mode = fakes[0].fake_mode
        unknown = sum(t.constant is None for t in fakes)
        if mode is None or unknown or not (fakes or from_sizes):
            if unknown and required:
                raise UnknownValues(
                    f"{required} reads the batch's layout on the host, and {unknown} of the tensors it is handed are "
                    "not known to the dry run (a layout that is not the dry run's own batch's)"
                )
            return fn(*args, **kwargs)
        values = tree_map(lambda t: t.constant if isinstance(t, FakeTensor) else t, (args, kwargs))
        return on_values(mode, fn, *values)

    return run


def _active_fake_mode() -> Any:
    import torch

    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


def _lift(fake_mode: Any, t: Any) -> Any:
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, torch.Tensor) and not isinstance(t, FakeTensor):
        return fake_mode.fake_tensor_converter.from_real_tensor(fake_mode, t, make_constant=True)
    return t


__all__ = ["UnknownValues", "on_values", "when_known"]
