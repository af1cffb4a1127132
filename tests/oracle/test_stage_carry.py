"""What crosses a pipeline stage boundary beside the residual stream, held to AutoModel's own declaration of it:
GLM-5.2's IndexShare top-k carry (glm_moe_dsa/model.py ``get_pipeline_stage_metas``, whose metas torch's pipeline
allocates its receive buffers from) against the estimate's ``stage_carry_bytes``."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("nemo_automodel")

from automodel_dist.catalog.models import lookup  # noqa: E402
from automodel_dist.estimate.memory import Training, stage_carry_bytes  # noqa: E402

SEQ = 4096


def _automodels_carry_bytes(name: str, attn: str, seq: int, config: dict | None = None) -> float:
    """Bytes a token of the tensors AutoModel's GLM-5.2 class declares a middle stage receives, past the hidden
    states (its method run on the model's own config and backend, no model built)."""
    from nemo_automodel.components.models.glm_moe_dsa.config import GlmMoeDsaConfig
    from nemo_automodel.components.models.glm_moe_dsa.model import GlmMoeDsaForCausalLM

    cfg = GlmMoeDsaConfig(**(config or lookup(name).hf_config))
    stage = types.SimpleNamespace(config=cfg, backend=types.SimpleNamespace(attn=attn), lm_head=None)
    inputs, outputs = GlmMoeDsaForCausalLM.get_pipeline_stage_metas(
        stage, is_first=False, microbatch_size=1, seq_len=seq, dtype=torch.bfloat16
    )
    assert inputs[0].shape[-1] == cfg.hidden_size and len(inputs) == len(outputs)
    return sum(t.numel() * t.element_size() for t in inputs[1:]) / seq


@pytest.mark.parametrize(("attn", "seq"), [("cudnn", SEQ), ("tilelang", SEQ), ("sdpa", SEQ), ("sdpa", 1024)])
def test_glm52_indexshare_carry_is_what_automodel_declares(attn, seq):
    spec = lookup("zai-org/GLM-5.2")
    ours = stage_carry_bytes(spec, Training(seq_len=seq, attn_backend=attn))
    assert ours == _automodels_carry_bytes("zai-org/GLM-5.2", attn, seq) > 0


def test_dense_kernels_under_cp_take_a_ranks_share():
    """Under CP, train_ft sizes the stage metas from the CP-local length: with the dense kernels the carry is
    min(index_topk, seq / cp) wide (4,096 / 4 = 1,024 under GLM-5.2's 2,048)."""
    spec = lookup("zai-org/GLM-5.2")
    ours = stage_carry_bytes(spec, Training(seq_len=SEQ, attn_backend="sdpa"), cp=4)
    assert ours == _automodels_carry_bytes("zai-org/GLM-5.2", "sdpa", SEQ // 4) == 4.0 * 1024


def test_no_carry_without_shared_indexers():
    """GLM-5.1 (every layer its own indexer) and GLM-5.2 with indexer_types all full: the hidden states alone, by
    AutoModel's metas and by the estimate."""
    from automodel_dist.catalog.models import from_hf_config

    glm51 = lookup("zai-org/GLM-5.1")
    assert stage_carry_bytes(glm51, Training(seq_len=SEQ, attn_backend="tilelang")) == 0.0
    cfg = dict(lookup("zai-org/GLM-5.2").hf_config)
    cfg["indexer_types"] = ["full"] * len(cfg["indexer_types"])
    assert _automodels_carry_bytes("zai-org/GLM-5.2", "cudnn", SEQ, cfg) == 0.0
    assert stage_carry_bytes(from_hf_config(cfg), Training(seq_len=SEQ, attn_backend="cudnn")) == 0.0
