"""Every surface returns exactly the JSON recorded in ``tests/golden/outputs.json`` (see ``tests/golden.py``)."""

from __future__ import annotations

import json

import golden
import pytest

RECORDED = json.loads(golden.OUT.read_text())
CASES = dict(golden.cases())


def test_the_recording_covers_every_case() -> None:
    assert sorted(CASES) == sorted(RECORDED)


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_is_unchanged(name: str) -> None:
    assert CASES[name]() == RECORDED[name], f"{name} changed; re-record with `python tests/golden.py --write` if meant"
