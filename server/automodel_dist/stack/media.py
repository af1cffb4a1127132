"""A VLM step's batch, as AutoModel's VLM recipe hands it to a Qwen-VL model (Qwen2.5-VL, Qwen3-VL, Qwen3.5 and
their MoE versions): token ids with each image's placeholder tokens, the processor's flattened patches
(``pixel_values``), one ``(t, h, w)`` grid per image, the token-type ids the multimodal RoPE needs, and the 3-axis
position ids the model's own ``get_rope_index`` computes from them; or to Gemma-3: ids with each image's
begin-of-image, soft and end-of-image tokens, the token-type ids its bidirectional image attention reads, and the
images at the tower's square; or to Gemma-4: the same ids, typed in ``mm_token_type_ids``, and every image's patches
padded to its processor's token budget with their grid positions.

The ids, grids and positions are small and their values decide shapes (how many image tokens, where they go, the
vision tower's attention segments), so on fake tensors they stay known values: fake tensors with a constant behind
them, which FakeTensorMode propagates through every operation whose inputs are all such constants (``known_values``
raises its size limit for the step). The patches, weights and activations are fake as usual.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from ..media import ImageGeometry
from .known_values import on_values, when_known

# the largest constant FakeTensorMode keeps (and computes really) during a VLM step: index tensors of a long packed
# sequence (131,072 ids x 3 position axes) fit; no activation of a real model is that small and built from ids alone
KNOWN_VALUES_LIMIT = 1 << 20


def _rope_owner(part: Any) -> Any:
    return next((m for m in part.modules() if callable(getattr(m, "get_rope_index", None))), None)


def _ids_with_images(
    batch: int,
    seq: int,
    *,
    images: int,
    tokens: int,
    start: int | None,
    image: int,
    end: int | None,
    text_high: int,
    lead: int,
    kinds_dtype: Any,
    what: str,
    text_low: int = 0,
) -> tuple[Any, Any, Any]:
    """Real token ids of ``batch`` sequences of ``seq`` tokens, random text (from ``text_low`` to below
    ``text_high``, clear of every special token) with ``images`` images a sequence, each written as ``lead`` text
    tokens, its start token, ``tokens`` image tokens (typed 1 in the kinds), its end token and ``lead`` text tokens (a
    start or end the model has none of stays text); the labels are the ids with the image tokens masked out, as the
    collate masks them."""
    import torch

    if 1 + images * (tokens + 2 + 2 * lead) > seq:
        raise ValueError(
            f"{images} image(s) of {what} do not fit in a {seq}-token sequence: raise the sequence length or lower "
            "the image size"
        )
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(text_low, text_high, (batch, seq), generator=g)
    kinds = torch.zeros(batch, seq, dtype=kinds_dtype)
    at = 1
    for _ in range(images):
        first = at + lead + 1  # the first image token
        if start is not None:
            ids[:, first - 1] = start
        ids[:, first : first + tokens] = image
        kinds[:, first : first + tokens] = 1
        if end is not None:
            ids[:, first + tokens] = end
        at += tokens + 2 + 2 * lead
    labels = ids.clone()
    labels[kinds.bool()] = -100
    return ids, kinds, labels


def _text(fake_mode: Any, ids: Any, labels: Any) -> dict[str, Any]:
    """A batch's real ids as known values (they decide where the images go) and its labels as fake tensors (the loss
    reads no value of them)."""
    known = fake_mode.fake_tensor_converter
    return {
        "input_ids": known.from_real_tensor(fake_mode, ids, make_constant=True),
        "labels": known.from_real_tensor(fake_mode, labels),
    }


def qwen_batch(
    part: Any,
    hf_config: Any,
    *,
    batch: int,
    seq: int,
    image: ImageGeometry,
    images_per_sample: int,
    pixel_dtype: str,
    fake_mode: Any,
    packed: bool = False,
) -> dict[str, Any]:
    """One microbatch of ``batch`` sequences of ``seq`` tokens, each holding ``images_per_sample`` images of
    ``image``'s geometry as a processor of flattened patches and grids makes them (Qwen-VL's, Muse-Glimmer's: a vision
    start token, the image's placeholders, a vision end token, the rest text); labels cover the text. A start or end
    token the config names no id for is left out (Muse-Glimmer's processor writes an image start and end its config
    does not name: two tokens an image that stay text here). ``packed``: as
    AutoModel's packing collate hands a pack to a class that wants its document map (``_packed_seq_ids`` and the
    indexed ``attention_mask``, no 4-D mask, and its packed-sequence metadata), one document filling each sequence.
    Call inside ``fake_mode``: the patches are fake, the rest constants."""
    import torch

    vision = hf_config.vision_config.to_dict()
    grid, n_img = list(image.grid), image.tokens
    ids_of = {
        k: getattr(hf_config, k, None) for k in ("image_token_id", "vision_start_token_id", "vision_end_token_id")
    }
    if ids_of["image_token_id"] is None:
        raise ValueError("the model's config names no image_token_id: its images cannot be placed in the ids")
    special = [v for v in (*ids_of.values(), getattr(hf_config, "video_token_id", None)) if isinstance(v, int)]
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():  # real values
        ids, kinds, labels = _ids_with_images(
            batch,
            seq,
            images=images_per_sample,
            tokens=n_img,
            start=ids_of["vision_start_token_id"],
            image=ids_of["image_token_id"],
            end=ids_of["vision_end_token_id"],
            text_high=max(2, min(special) - 64),
            lead=0,
            kinds_dtype=torch.int32,
            what=f"{n_img} tokens ({grid[1]}x{grid[2]} patches)",
        )
        grids = torch.tensor([grid] * (batch * images_per_sample), dtype=torch.int64)
        owner = _rope_owner(part)
        positions = None
        if owner is not None:  # the model's own multimodal RoPE positions (its forward computes the same)
            positions = owner.get_rope_index(ids, kinds, image_grid_thw=grids)[0]
    known = fake_mode.fake_tensor_converter
    if not images_per_sample:  # text-only data: the collate hands over no pixels
        return _text(fake_mode, ids, labels) | (_document_map(fake_mode, batch, seq) if packed else {})
    out = {
        **_text(fake_mode, ids, labels),
        "mm_token_type_ids": known.from_real_tensor(fake_mode, kinds, make_constant=True),
        "image_grid_thw": known.from_real_tensor(fake_mode, grids, make_constant=True),
        "pixel_values": torch.empty(
            batch * images_per_sample * grid[0] * grid[1] * grid[2],
            int(vision.get("in_channels", vision.get("in_chans", 3)))
            * int(vision.get("temporal_patch_size", vision.get("patch_temporal", 2)))  # (Muse-Glimmer's name)
            * image.patch_size**2,
            dtype=getattr(torch, pixel_dtype),
        ),
    }
    if positions is not None:
        out["position_ids"] = known.from_real_tensor(fake_mode, positions, make_constant=True)
    if packed:
        out |= _document_map(fake_mode, batch, seq)
    return out


def _document_map(fake_mode: Any, batch: int, seq: int) -> dict[str, Any]:
    """The packing collate's document fields for packs of one document filling ``seq`` tokens (collate_fns.py's
    packed VLM collate with ``materialize_4d_mask`` off, as a context-parallel VLM path asks): the indexed map as
    ``attention_mask`` and ``_packed_seq_ids``, and AutoModel's own packed-sequence metadata built from it, all known
    values."""
    import torch
    from nemo_automodel.components.datasets.packing import build_packed_sequence_metadata

    ids = on_values(fake_mode, torch.ones, (batch, seq), {"dtype": torch.long})
    meta = on_values(fake_mode, build_packed_sequence_metadata, (ids.constant,), {})
    return {"attention_mask": ids, "_packed_seq_ids": ids, **meta}


def gemma_batch(
    hf_config: Any,
    image: ImageGeometry,
    *,
    batch: int,
    seq: int,
    images_per_sample: int,
    pixel_dtype: str,
    fake_mode: Any,
) -> dict[str, Any]:
    """One microbatch of ``batch`` sequences of ``seq`` tokens for Gemma-3 or Gemma-4, each holding
    ``images_per_sample`` images of ``image``'s geometry as the model's processor writes them (a text token,
    begin-of-image, its soft tokens, end-of-image and a text token: Gemma-3's ``\\n\\n`` either side), the rest text;
    labels cover the text. Gemma-3's images are the tower's square, typed in ``token_type_ids`` for its bidirectional
    image attention. Gemma-4's patches come flattened and padded to its token budget's count, with their (x, y) grid
    positions and (-1, -1) for the padding, the soft tokens typed in ``mm_token_type_ids``. Call inside ``fake_mode``:
    the pixels are fake, the ids, types and positions constants."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    soft, boi, eoi = hf_config.image_token_id, hf_config.boi_token_id, hf_config.eoi_token_id
    images = batch * images_per_sample
    known = fake_mode.fake_tensor_converter
    with unset_fake_temporarily():  # real values
        ids, kinds, labels = _ids_with_images(
            batch,
            seq,
            images=images_per_sample,
            tokens=image.tokens,
            start=boi,
            image=soft,
            end=eoi,
            text_high=max(2, min(soft, boi, eoi) - 64),
            lead=1,
            kinds_dtype=torch.int64,
            what=f"{image.tokens} tokens",
        )
    out = _text(fake_mode, ids, labels)
    kinds = known.from_real_tensor(fake_mode, kinds, make_constant=True)
    if not images:  # text-only data: the collate hands over no pixels
        return {**out, "token_type_ids" if image.processor == "gemma3" else "mm_token_type_ids": kinds}
    if image.processor == "gemma3":
        height, width = image.pixels
        pixels = torch.empty(images, 3, height, width, dtype=getattr(torch, pixel_dtype))
        return {**out, "token_type_ids": kinds, "pixel_values": pixels}
    with unset_fake_temporarily():
        rows, cols = image.grid[1], image.grid[2]
        ys, xs = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        positions = torch.full((image.padded_patches, 2), -1, dtype=torch.int64)
        positions[: rows * cols] = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)
        positions = positions.expand(images, -1, -1).clone()
    patch = 3 * image.patch_size * image.patch_size
    return {
        **out,
        "mm_token_type_ids": kinds,
        "pixel_values": torch.empty(images, image.padded_patches, patch, dtype=getattr(torch, pixel_dtype)),
        "image_position_ids": known.from_real_tensor(fake_mode, positions, make_constant=True),
    }


def pixtral_batch(
    hf_config: Any,
    image: ImageGeometry,
    *,
    batch: int,
    seq: int,
    images_per_sample: int,
    pixel_dtype: str,
    fake_mode: Any,
) -> dict[str, Any]:
    """One microbatch of ``batch`` sequences of ``seq`` tokens for Mistral3 (its Pixtral tower), each holding
    ``images_per_sample`` images of ``image``'s geometry: the processor's placeholders (its row breaks and image end
    are text tokens, written as text here after the placeholders: the model reads only where the placeholders are),
    the images padded to the batch's largest (all alike here) with their real sizes in ``image_sizes``, which the
    tower reads to cut each image's patches; labels cover the text. Call inside ``fake_mode``: the pixels are fake,
    the ids and sizes constants."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    token = getattr(hf_config, "image_token_index", None)
    token = token if isinstance(token, int) else hf_config.image_token_id
    breaks = image.sequence_tokens - image.tokens
    images = batch * images_per_sample
    known = fake_mode.fake_tensor_converter
    with unset_fake_temporarily():  # real values
        ids, _, labels = _ids_with_images(
            batch,
            seq,
            images=images_per_sample,
            tokens=image.tokens,
            start=None,
            image=token,
            end=None,
            # (Mistral's tokenizer keeps its control tokens, the image's among them, at the bottom of the vocabulary)
            text_low=token + 1,
            text_high=hf_config.get_text_config().vocab_size,
            lead=(breaks + 1) // 2,  # (the fit check counts them as the text either side of the image)
            kinds_dtype=torch.int64,
            what=f"{image.tokens} tokens and {breaks} row breaks",
        )
        sizes = torch.tensor([list(image.pixels)] * images, dtype=torch.int64)
    out = _text(fake_mode, ids, labels)
    if not images:  # text-only data: the collate hands over no pixels
        return out
    height, width = image.pixels
    return {
        **out,
        "pixel_values": torch.empty(images, 3, height, width, dtype=getattr(torch, pixel_dtype)),
        "image_sizes": known.from_real_tensor(fake_mode, sizes, make_constant=True),
    }


def kimi_vl_batch(
    hf_config: Any,
    image: ImageGeometry,
    *,
    batch: int,
    seq: int,
    images_per_sample: int,
    pixel_dtype: str,
    fake_mode: Any,
) -> dict[str, Any]:
    """One microbatch of ``batch`` sequences of ``seq`` tokens for Kimi-VL (its MoonViT tower), each holding
    ``images_per_sample`` images of ``image``'s geometry: the processor's placeholder tokens (its media start and end
    tokens are text here: the model reads only where the placeholders are), every image's patches flattened into
    ``pixel_values`` (patches x 3 x patch x patch) with its grid in ``image_grid_hws``, which the tower reads to cut,
    position and merge them; labels cover the text. Call inside ``fake_mode``: the pixels are fake, the ids and grids
    constants."""
    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    token = int(hf_config.media_placeholder_token_id)
    images = batch * images_per_sample
    known = fake_mode.fake_tensor_converter
    with unset_fake_temporarily():  # real values
        ids, _, labels = _ids_with_images(
            batch,
            seq,
            images=images_per_sample,
            tokens=image.tokens,
            start=None,
            image=token,
            end=None,
            # (Kimi's tokenizer keeps its special tokens, the placeholder among them, past its text vocabulary)
            text_high=token - 64,
            lead=1,
            kinds_dtype=torch.int64,
            what=f"{image.tokens} tokens ({image.grid[1]}x{image.grid[2]} patches)",
        )
        grids = torch.tensor([list(image.grid[1:])] * images, dtype=torch.int64)
    out = _text(fake_mode, ids, labels)
    if not images:  # text-only data: the collate hands over no pixels
        return out
    patch = image.patch_size
    return {
        **out,
        "pixel_values": torch.empty(images * image.patches, 3, patch, patch, dtype=getattr(torch, pixel_dtype)),
        "image_grid_hws": known.from_real_tensor(fake_mode, grids, make_constant=True),
    }


@contextlib.contextmanager
def known_vision_indices(fake_mode: Any) -> Iterator[None]:
    """transformers' vision index helpers (``transformers.vision_utils``: attention segments, window order, rotary and
    position-table indices, all computed from the image grids alone, the functions it keeps apart so they can be
    computed ahead), and the ``get_vision_*(grid_thw, ...)`` helpers AutoModel's own model modules define, run on the
    grid's known values and hand back constants, where a grid is one: the factories inside them (``arange``, ``pad``)
    would otherwise make values FakeTensorMode cannot know."""
    import inspect
    import sys

    import transformers.vision_utils as vision_utils
    from torch._subclasses.fake_tensor import FakeTensor

    def wrap(fn: Any) -> Any:
        # decided on the grid alone, the other arguments passed as they are: transformers hands these helpers its
        # forward's kwargs dict, which they pop from (an out-parameter: a copy would leave the caller's keys)
        @functools.wraps(fn)
        def run(grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
            if not (isinstance(grid_thw, FakeTensor) and grid_thw.constant is not None):
                return fn(grid_thw, *args, **kwargs)
            return on_values(fake_mode, fn, (grid_thw.constant, *args), kwargs)

        return run

    # the helpers, by identity: transformers' from vision_utils, and AutoModel's native towers' own copies beside their
    # modules (Muse-Glimmer's vision.py: cu_seqlens, window order, position ids, bilinear table indices from grid_thw);
    # each wrapped in every module that holds it (vision_utils, transformers' modeling modules, AutoModel's model
    # modules: the one defining it or one importing it by name)
    modules = [vision_utils] + [
        m
        for k, m in list(sys.modules.items())
        if m is not None
        and (
            (k.startswith("transformers.models.") and k.rsplit(".", 1)[-1].startswith("modeling_"))
            or k.startswith("nemo_automodel.components.models.")
        )
    ]
    helpers = {id(fn): fn for n, fn in vars(vision_utils).items() if n.startswith("get_vision_") and callable(fn)}
    helpers |= {
        id(fn): fn
        for module in modules
        for name, fn in vars(module).items()
        if name.startswith("get_vision_")
        and inspect.isfunction(fn)
        and fn.__module__.startswith("nemo_automodel.components.models.")
        and next(iter(inspect.signature(fn).parameters), None) == "grid_thw"
    }
    saved: list[tuple[Any, str, Any]] = []
    for module in modules:
        for name, fn in list(vars(module).items()):
            if name.startswith("get_vision_") and id(fn) in helpers:
                saved.append((module, name, fn))
                setattr(module, name, wrap(fn))
    try:
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def check_staged_images(hf_config: Any, input_ids: Any, grids: list[Any]) -> None:
    """The check transformers' ``get_placeholder_mask`` makes on each microbatch (its image tokens against its image
    features), made here on the known values: the pipeline's first stage finds the placeholders by comparing
    embeddings, which fake tensors cannot, so the dry run answers that read true (dry_run/worker.py) and rests the
    answer on this. ``grids`` are the microbatches' staged image grids (Gemma-4's: its patches' positions; Mistral3's:
    its images' sizes in pixels), in order;
    the schedule splits the ids by rows into as many microbatches."""
    import torch

    ids = getattr(input_ids, "constant", None)
    known = [getattr(g, "constant", None) for g in grids]
    if ids is None or any(g is None for g in known):
        raise NotImplementedError("the staged images cannot be checked against the ids: their values are not known")
    merge = int(getattr(hf_config.vision_config, "spatial_merge_size", 1) or 1) ** 2
    pooling = int(getattr(hf_config.vision_config, "pooling_kernel_size", 1) or 1) ** 2
    for i, (rows, grid) in enumerate(zip(torch.tensor_split(ids, len(known)), known, strict=True)):
        tokens = int((rows == hf_config.image_token_id).sum())
        if getattr(hf_config, "model_type", None) == "gemma4":  # its staged patch positions: a token a pooled cell
            features = int((grid != -1).all(-1).sum()) // pooling if grid.numel() else 0
        elif getattr(hf_config, "model_type", None) == "mistral3":  # its staged image_sizes: a token a merged cell
            cell = int(hf_config.vision_config.patch_size) * int(getattr(hf_config, "spatial_merge_size", 1) or 1)
            features = int(((grid // cell).prod(-1)).sum()) if grid.numel() else 0
        else:
            features = int(grid.prod(-1).sum()) // merge if grid.numel() else 0
        if tokens != features:
            raise ValueError(
                f"microbatch {i}: {tokens} image tokens in the ids against {features} staged image features "
                "(transformers' get_placeholder_mask raises for this)"
            )


@contextlib.contextmanager
def known_rope_index(parts: list[Any], fake_mode: Any) -> Iterator[None]:
    """The models' own ``get_rope_index`` runs on its inputs' known values and hands back constants, where every tensor
    it is given is one: a forward that computes its multimodal positions itself (a pipeline stage's microbatch, whose
    positions the schedule does not hand in) builds them with factories whose values FakeTensorMode cannot know. The
    batch's positions are computed the same way ahead (``qwen_batch``)."""
    owners = [m for part in parts for m in part.modules() if callable(getattr(m, "get_rope_index", None))]

    def wrap(fn: Any) -> Any:
        return when_known(fn, fake_mode=fake_mode)

    saved = [(owner, owner.__dict__.get("get_rope_index")) for owner in owners]
    for owner in owners:
        owner.get_rope_index = wrap(owner.get_rope_index)  # an instance attribute over the class's method
    try:
        yield
    finally:
        for owner, before in saved:
            if before is None:
                del owner.get_rope_index
            else:
                owner.get_rope_index = before


@contextlib.contextmanager
def known_values() -> Iterator[None]:
    """FakeTensorMode computes really, and keeps as constants, the results of operations on constants up to
    ``KNOWN_VALUES_LIMIT`` elements (its default keeps single numbers only)."""
    import torch._subclasses.fake_tensor as fake_tensor

    saved = fake_tensor.CONSTANT_NUMEL_LIMIT
    fake_tensor.CONSTANT_NUMEL_LIMIT = KNOWN_VALUES_LIMIT
    try:
        yield
    finally:
        fake_tensor.CONSTANT_NUMEL_LIMIT = saved


@contextlib.contextmanager
def symmetric_reductions() -> Iterator[None]:
    """An all-reduce of a known value on the fake process group: every rank of the group holds the same value (the
    dry run's ranks are alike, as the oracle for unknown values assumes), so a sum is the value times the group's
    size and a maximum, minimum or average the value itself (the fake group would leave a sum at one rank's)."""
    import torch.distributed as dist
    from torch._subclasses.fake_tensor import FakeTensor

    original = dist.all_reduce

    def all_reduce(tensor: Any, op: Any = dist.ReduceOp.SUM, group: Any = None, async_op: bool = False) -> Any:
        if isinstance(tensor, FakeTensor) and tensor.constant is not None:
            if op == dist.ReduceOp.SUM:
                tensor.constant.mul_(dist.get_world_size(group))
            elif op not in (dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.AVG):
                raise NotImplementedError(f"all_reduce {op} of a known value")
        return original(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = all_reduce
    try:
        yield
    finally:
        dist.all_reduce = original


@contextlib.contextmanager
def known_document_segments(fake_mode: Any) -> Iterator[None]:
    """AutoModel's block-diagonal CP segments this rank's share of a pack on the host once a step
    (``blockdiag_cp.kernels.precompute_blockdiag_varlen_meta``: document lengths, cumulative offsets, the straddle
    from the rank before) with factories whose values FakeTensorMode cannot know: it runs on the document map's known
    values and hands back constants."""
    from nemo_automodel.components.distributed.blockdiag_cp import kernels

    original = kernels.precompute_blockdiag_varlen_meta
    kernels.precompute_blockdiag_varlen_meta = when_known(
        original, fake_mode=fake_mode, required="block-diagonal CP's segmentation (precompute_blockdiag_varlen_meta)"
    )
    try:
        yield
    finally:
        kernels.precompute_blockdiag_varlen_meta = original


@contextlib.contextmanager
def known_inputs(fake_mode: Any) -> Iterator[None]:
    """All four: constants propagate through the step, the vision index helpers run on the grids' values and a pack's
    CP segmentation on its document map's, and an all-reduce of a known value sums over alike ranks."""
    with (
        known_values(),
        known_vision_indices(fake_mode),
        known_document_segments(fake_mode),
        symmetric_reductions(),
    ):
        yield


__all__ = [
    "check_staged_images",
    "gemma_batch",
    "kimi_vl_batch",
    "pixtral_batch",
    "qwen_batch",
    "known_inputs",
    "known_rope_index",
]
