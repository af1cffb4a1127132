"""Every surface returns exactly the JSON recorded under ``tests/golden/``, one file per case (see ``tests/support/golden.py``)."""

from __future__ import annotations

import pytest

from support import golden

RECORDED = golden.recorded()
CASES = dict(golden.cases())


def test_the_recording_covers_every_case() -> None:
    assert sorted(CASES) == sorted(RECORDED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_is_unchanged(name: str) -> None:
    assert CASES[name]() == RECORDED[name], (
        f"{name} changed; re-record with `python tests/support/golden.py --write` if meant"
    )
