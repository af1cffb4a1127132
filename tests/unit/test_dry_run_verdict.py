"""The dry run's verdict on a measured peak: fits within the usable memory, tight over the headroom but within the
GPU (the published one-GPU 8B LoRA run: 78.3 GiB with overhead on an 80 GiB H100, which it ran on), does not fit over
the GPU."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from automodel_dist.dry_run.report import measured_verdict

ORDER = ["fits", "tight", "does not fit"]


def test_the_published_one_gpu_lora_run_is_tight_at_the_default_headroom_and_fits_at_none():
    assert measured_verdict(78.3, 80 * 0.9, 80) == "tight"
    assert measured_verdict(78.3, 80, 80) == "fits"
    assert measured_verdict(88.0, 72.0, 80) == "does not fit"


@given(
    st.floats(0, 500, allow_nan=False),
    st.floats(0, 500, allow_nan=False),
    st.floats(0, 0.5, allow_nan=False),
    st.floats(1, 200, allow_nan=False),
)
def test_the_verdict_grows_with_the_peak_and_matches_the_budget(a, b, headroom, gpu):
    usable = gpu * (1 - headroom)
    low, high = sorted((a, b))
    assert ORDER.index(measured_verdict(low, usable, gpu)) <= ORDER.index(measured_verdict(high, usable, gpu))
    assert (measured_verdict(a, usable, gpu) == "fits") == (a <= usable)
    assert (measured_verdict(a, usable, gpu) == "does not fit") == (a > gpu)
