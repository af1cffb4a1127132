"""GLM-5.2's cuDNN DSA kernels as the dry run stands them in (stack/glm_cudnn_dsa.py): AutoModel's own adapters
(glm_moe_dsa/kernels/cudnn_dsa.py, common/cudnn_sparse_attention.py) run as written around stand-ins for cuDNN
Frontend's and FlashMLA's kernels, which return what each kernel returns and allocate its scratch for the call (read
from nvidia-cudnn-frontend's wrappers: IndexerTopK.scratch_workspace_bytes, flash_attn_bwd_sm90_workspace_size); the
packed metadata, which reads the layout on the host, runs on the dry run's known values."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nemo_automodel")

from automodel_dist.stack import glm_cudnn_dsa, media, shims  # noqa: E402
from automodel_dist.stack.known_values import UnknownValues  # noqa: E402

T, INDEX_HEADS, HEADS, TOPK = 64, 32, 16, 16


@pytest.fixture
def calls():
    seen: list[str] = []

    def count() -> None:
        import inspect

        seen.append(inspect.stack()[2].function)

    before = glm_cudnn_dsa.on_call
    glm_cudnn_dsa.on_call = count
    try:
        with glm_cudnn_dsa.stood_in():
            yield seen
    finally:
        glm_cudnn_dsa.on_call = before


def _indexer_inputs():
    q = torch.randn(T, INDEX_HEADS, 128, dtype=torch.bfloat16)
    k = torch.randn(T, 128, dtype=torch.bfloat16)
    w = torch.randn(T, INDEX_HEADS)
    return q, k, w, torch.tensor([0, T], dtype=torch.int32)


def test_automodels_adapters_run_around_the_stand_ins_with_the_kernels_shapes(calls):
    """The indexer: cuDNN's scores over each query's key segment, then its top-k in AutoModel's row chunks, made
    global and compacted by AutoModel: [T, 1, topk] int32. The sparse attention: FlashMLA's forward (AutoModel pads
    16 heads to the SM90 kernel's 64 and slices them back) and cuDNN's backward, gradients like q and kv."""
    from nemo_automodel.components.models.glm_moe_dsa.kernels import cudnn_dsa

    q, k, w, cu = _indexer_inputs()
    metadata = cudnn_dsa.prepare_cudnn_dsa_packed_metadata(cu, T)
    indices = cudnn_dsa.cudnn_indexer_topk(q, k, w, cu, TOPK, packed_metadata=metadata)
    assert indices.shape == (T, 1, TOPK) and indices.dtype == torch.int32
    assert calls == ["indexer_forward_wrapper", "indexer_top_k_wrapper"]

    sparse_q = torch.randn(T, HEADS, 576, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(T, 1, 576, dtype=torch.bfloat16, requires_grad=True)
    lengths = metadata.causal_lengths.clamp_max(TOPK).contiguous()
    out = cudnn_dsa.cudnn_sparse_attention(sparse_q, kv, indices, 0.1, topk_length=lengths, all_rows_nonempty=True)
    assert out.shape == (T, HEADS, 512) and out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert sparse_q.grad.shape == sparse_q.shape and kv.grad.shape == kv.shape and kv.grad.dtype == torch.bfloat16
    assert calls[2:] == ["flash_mla_sparse_fwd", "sparse_attention_backward_wrapper"]


def test_the_sparse_function_saves_what_automodels_saves(calls):
    """What stays alive for backward is AutoModel's Function's: q, the latent kv, the output, the fp32 log-sum-exp,
    the sink, the indices padded to FlashMLA's 512-wide top-k, the lengths and the cached rows."""
    from nemo_automodel.components.models.common.cudnn_sparse_attention import cudnn_sparse_attention

    sparse_q = torch.randn(T, HEADS, 576, dtype=torch.bfloat16, requires_grad=True)
    kv = torch.randn(T, 1, 576, dtype=torch.bfloat16, requires_grad=True)
    indices = torch.zeros(T, 1, TOPK, dtype=torch.int32)
    out = cudnn_sparse_attention(sparse_q, kv, indices, 0.1)
    saved = out.grad_fn.saved_tensors
    shapes = [(tuple(t.shape), t.dtype) for t in saved]
    assert shapes == [
        ((T, HEADS, 576), torch.bfloat16),
        ((T, 576), torch.bfloat16),
        ((T, HEADS, 512), torch.bfloat16),
        ((T, HEADS), torch.float32),
        ((HEADS,), torch.float32),
        ((T, 512), torch.int32),
        ((T,), torch.int32),
        ((0,), torch.int64),
    ]


class _Allocations(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes: list[tuple[torch.dtype, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default):
            self.bytes.append((out.dtype, out.numel() * out.element_size()))
        return out


def test_the_kernels_scratch_is_allocated_for_the_call(calls):
    """The top-k's radix scratch: rows x 2 x columns int32 for fp32 scores (IndexerTopK.scratch_workspace_bytes; the
    factor AutoModel chunks its rows by); the SM90 backward's fp32 dpsum and log2 LSE [T rounded to 64, heads] and its
    dKV accumulator [keys rounded to 64, 576] (flash_attn_bwd_sm90_workspace_size)."""
    from nemo_automodel.components.models.glm_moe_dsa.kernels import cudnn_dsa

    scores = torch.randn(T, 100)
    with _Allocations() as seen:
        cudnn_dsa._CUDNN_DSA.indexer_top_k_wrapper(scores, torch.full((T,), 100, dtype=torch.int32), top_k=TOPK)
    assert (torch.uint8, T * cudnn_dsa._TOPK_SCRATCH_INT32_FACTOR * 100 * 4) in seen.bytes

    q = torch.randn(100, HEADS, 576, dtype=torch.bfloat16)
    kv = torch.randn(70, 576, dtype=torch.bfloat16)
    with _Allocations() as seen:
        cudnn_dsa._CUDNN_DSA.sparse_attention_backward_wrapper(
            q, kv, q[..., :512], q[..., :512], q[..., 0].float(), torch.zeros(HEADS), torch.zeros(100, 512)
        )
    fp32 = sorted(n for dtype, n in seen.bytes if dtype == torch.float32)
    assert fp32 == sorted([128 * HEADS * 4, 128 * HEADS * 4, 128 * 576 * 4, HEADS * 4])


def test_the_packed_metadata_runs_on_the_known_layout_under_fake_tensors():
    """With the THD batch's lengths known (constants of the fake mode), AutoModel's metadata reads them on the host as
    on a GPU and its tensors stay known; an unknown layout is refused by name, never guessed."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily

    mode = FakeTensorMode()
    with glm_cudnn_dsa.stood_in(), media.known_values(), mode:
        from nemo_automodel.components.models.glm_moe_dsa import model

        with unset_fake_temporarily():
            real = torch.tensor([0, 40, T], dtype=torch.int32)
        known = mode.fake_tensor_converter.from_real_tensor(mode, real, make_constant=True)
        metadata = model.prepare_cudnn_dsa_packed_metadata(known, T)
        assert isinstance(metadata.starts, FakeTensor) and metadata.starts.constant is not None
        assert (metadata.max_seqlen_q, metadata.max_seqlen_k, metadata.all_rows_nonempty) == (40, 40, True)
        assert metadata.segment_cu_q.constant.tolist() == [0, 40, T]

        unknown = torch.zeros(3, dtype=torch.int32)
        with pytest.raises(UnknownValues, match="packed metadata"):
            model.prepare_cudnn_dsa_packed_metadata(unknown, T)

        from nemo_automodel.components.distributed.context_parallel import sharder

        class Mesh:  # CP 1: AutoModel's index map is every position
            def size(self) -> int:
                return 1

            def get_local_rank(self) -> int:
                return 0

        indices = sharder.contiguous_local_indices(Mesh(), T)
        assert indices.constant is not None and indices.constant.tolist() == list(range(T))


def test_the_stand_ins_are_unbound_after_the_block():
    from nemo_automodel.components.distributed import thd_utils
    from nemo_automodel.components.distributed.context_parallel import sharder
    from nemo_automodel.components.models.common import cudnn_sparse_attention as shared
    from nemo_automodel.components.models.glm_moe_dsa import cp, model
    from nemo_automodel.components.models.glm_moe_dsa.kernels import cudnn_dsa

    def bound() -> tuple:
        return (
            cudnn_dsa._CUDNN_DSA,
            shared._FLASH_MLA_SPARSE_FWD,
            cudnn_dsa.is_cudnn_dsa_available(),
            model.prepare_cudnn_dsa_packed_metadata,
            thd_utils._thd_padding_mask,
            sharder.contiguous_local_indices,
            cp.contiguous_local_indices,
        )

    before = bound()
    with glm_cudnn_dsa.stood_in():
        assert cudnn_dsa.is_cudnn_dsa_available() and shared.is_cudnn_sparse_attention_available()
        assert shared._FLASH_MLA_SPARSE_FWD is glm_cudnn_dsa.flash_mla_sparse_fwd
        assert thd_utils._thd_padding_mask is glm_cudnn_dsa.known_padding_mask
    assert bound() == before


def test_an_unknown_layout_makes_the_rank_not_measured_not_failed():
    """On a GPU AutoModel would not raise there: the rank says why it was not measured, with no AutoModel error."""
    from automodel_dist.dry_run.worker import Phases, _failure

    out = _failure(UnknownValues("cuDNN DSA's packed metadata reads the batch's layout on the host"), Phases())
    assert out["status"] == "not_measured" and "packed metadata" in out["reason"] and "error" not in out
    assert _failure(ValueError("AutoModel's own"), Phases())["status"] == "failed"


def test_the_shim_check_fails_when_automodel_moves_a_target(monkeypatch):
    from nemo_automodel.components.models.glm_moe_dsa.kernels import cudnn_dsa

    shims.GLM_CUDNN_DSA.check()
    monkeypatch.delattr(cudnn_dsa, "_TOPK_SCRATCH_INT32_FACTOR")
    with pytest.raises(AttributeError):
        shims.GLM_CUDNN_DSA.check()
