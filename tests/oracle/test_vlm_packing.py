"""AutoModel's VLM neat packer as automodel_dist.vlm_packing describes it: a sample's count held to AutoModel's own
``_estimate_sample_length`` (shifted as its packer shifts it) and the most samples a pack takes held to the bins its
``neat_pack_dataset_vlm`` builds (its VT-balanced knapsack included) from MedPix-shaped conversations."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automodel_dist.vlm_packing import VlmPacking, media_only_samples, packer_count

pytest.importorskip("nemo_automodel")
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def packer() -> Iterator[types.ModuleType]:
    """AutoModel's neat_packing_vlm module, imported alone: its packages' __init__ import the data set builders
    beside it, which need Hugging Face's ``datasets`` (not installed here) and which the packer never calls. The
    packages stand as bare namespaces over AutoModel's own folders, a stand-in answers the LLM packer's one
    ``datasets`` import (a type hint), and every module imported meanwhile is dropped afterwards."""
    import nemo_automodel.components as components
    import torch  # noqa: F401  (imported whole before the stand-ins below are in place)

    before = set(sys.modules)
    root = Path(components.__file__).parent / "datasets"
    for name, folder in (("", root), (".llm", root / "llm"), (".vlm", root / "vlm")):
        package = types.ModuleType("nemo_automodel.components.datasets" + name)
        package.__path__ = [str(folder)]
        sys.modules[package.__name__] = package
    if importlib.util.find_spec("datasets") is None:
        stand_in = types.ModuleType("datasets")
        stand_in.Dataset = type("Dataset", (), {})  # type: ignore[attr-defined]
        sys.modules["datasets"] = stand_in
    try:
        yield importlib.import_module("nemo_automodel.components.datasets.vlm.neat_packing_vlm")
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]


def _medpix(question: str, answer: str, images: int) -> dict:
    """A sample as AutoModel's make_medpix_dataset hands it over (a user turn of image(s) and a question, an answer)."""
    content = [{"type": "image", "image": "img.png"}] * images + [{"type": "text", "text": question}]
    return {
        "conversation": [
            {"role": "user", "content": content},
            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        ]
    }


@settings(max_examples=200, deadline=None)
@given(question=st.text(max_size=400), answer=st.text(max_size=3000), images=st.integers(0, 3))
def test_a_samples_count_is_automodels(packer, question: str, answer: str, images: int) -> None:
    own = packer._estimate_sample_length(_medpix(question, answer, images))
    assert packer_count(images, len(question) + len(answer)) == max(own - 1, 0)


@settings(max_examples=60, deadline=None)
@given(
    pack_size=st.integers(512, 20000),
    ratio=st.sampled_from([0.8, 0.9, 0.95, 1.0]),
    images=st.integers(1, 2),
    texts=st.lists(st.integers(0, 1500), min_size=1, max_size=40),
)
def test_no_pack_holds_more_samples_than_image_only_ones_fill(packer, pack_size, ratio, images, texts) -> None:
    packing = VlmPacking(pack_size, ratio)
    raw = [_medpix("q" * (n // 2), "a" * (n - n // 2), images) for n in texts]
    bins = packer.neat_pack_dataset_vlm(dataset=raw, pack_size=pack_size, ds_raw=raw, packing_ratio=ratio).bins
    most = media_only_samples(packing, images)
    assert max(len(b) for b in bins) <= most
    if all(n == 0 for n in texts) and len(texts) >= most:  # image-only samples: some pack holds exactly that many
        assert max(len(b) for b in bins) == most


@pytest.mark.parametrize("pack_size,ratio,images,most", [(3072, 0.9, 1, 5), (4096, 0.9, 1, 7), (2048, 0.9, 2, 1)])
def test_image_only_samples_fill_a_pack_as_the_recipes_packer_does(packer, pack_size, ratio, images, most) -> None:
    """gemma4_26b_a4b_moe_packing's packs (3,072 at 0.9): five one-image samples, whatever the images' tokens."""
    raw = [_medpix("", "", images) for _ in range(3 * most + 1)]
    bins = packer.neat_pack_dataset_vlm(dataset=raw, pack_size=pack_size, ds_raw=raw, packing_ratio=ratio).bins
    assert media_only_samples(VlmPacking(pack_size, ratio), images) == most == max(len(b) for b in bins)
