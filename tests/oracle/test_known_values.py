"""stack/known_values.py: a helper that reads a batch's layout on the host runs on the values behind FakeTensorMode's
constants and hands its tensors back as constants; an unknown input leaves it on the fake tensors, or is refused by
name where the helper cannot run without values."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily  # noqa: E402

from automodel_dist.stack.known_values import UnknownValues, when_known  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Layout:
    starts: torch.Tensor
    longest: int


def _layout(cu: torch.Tensor) -> Layout:
    lengths = cu[1:] - cu[:-1]
    return Layout(starts=torch.repeat_interleave(cu[:-1], lengths), longest=int(lengths.max()))


def _known(mode: FakeTensorMode, values: list[int]) -> torch.Tensor:
    with unset_fake_temporarily():
        real = torch.tensor(values)
    return mode.fake_tensor_converter.from_real_tensor(mode, real, make_constant=True)


def test_a_layout_of_known_values_is_computed_and_stays_known():
    """A value-dependent shape (repeat_interleave), a host read (int(max)) and a frozen dataclass of results."""
    mode = FakeTensorMode()
    with mode:
        layout = when_known(_layout, required="the layout")(_known(mode, [0, 3, 7]))
    assert layout.longest == 4
    assert isinstance(layout.starts, FakeTensor) and layout.starts.constant.tolist() == [0, 0, 0, 3, 3, 3, 3]


def test_an_unknown_input_runs_on_the_fake_tensors_or_is_refused_by_name():
    mode = FakeTensorMode()
    with mode:
        unknown = torch.zeros(3, dtype=torch.int64)
        assert when_known(torch.cumsum)(unknown, 0).constant is None  # as it would have run
        with pytest.raises(UnknownValues, match="the layout reads the batch's layout on the host"):
            when_known(_layout, required="the layout")(unknown)


def test_values_from_sizes_alone_are_computed_on_the_host():
    """A factory of sizes (a rank's token positions) would make values FakeTensorMode cannot know."""
    mode = FakeTensorMode()
    with mode:
        assert torch.arange(4).constant is None
        positions = when_known(lambda n: torch.arange(n), from_sizes=True)(4)
    assert positions.constant.tolist() == [0, 1, 2, 3]


def test_outside_a_fake_mode_it_is_the_function_itself():
    assert when_known(_layout, required="the layout")(torch.tensor([0, 2])).longest == 2


def test_the_vision_index_helpers_pop_from_the_callers_kwargs():
    """transformers' vision index helpers take their caller's kwargs dict and pop what was precomputed from it: on the
    known-grid path the dict is handed over as it is, so the caller's key is gone, as without the wrapper."""
    pytest.importorskip("transformers")
    import transformers.vision_utils as vision_utils

    from automodel_dist.stack.media import known_vision_indices

    mode = FakeTensorMode()
    with mode, known_vision_indices(mode):
        grid = _known(mode, [[1, 4, 4]])
        precomputed = torch.zeros(2, dtype=torch.int32)
        kwargs = {"cu_seqlens": precomputed}
        assert vision_utils.get_vision_cu_seqlens(grid, kwargs=kwargs) is precomputed
        assert "cu_seqlens" not in kwargs
        computed = vision_utils.get_vision_cu_seqlens(grid)
    assert computed.constant.tolist() == [0, 16]
