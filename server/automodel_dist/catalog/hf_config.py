"""A Hugging Face ``config.json`` for a model spec: what the dry run hands AutoModel's model builder.

A spec read from a ``config.json`` carries that file's own values (``ModelSpec.hf_config``) and they are returned
unchanged. A catalog entry has only its published dims; they are written under the field names each architecture's
Hugging Face config class reads, with its defaults for everything that does not change the parameters or the
sharding. ``tests/test_catalog.py`` builds the transformers class of every catalog entry from this dict on the meta
device and compares its parameter count with the spec's. Pure: no transformers import.
"""

from __future__ import annotations

from typing import Any

from .models import ModelSpec

MODEL_TYPES: dict[str, str] = {  # config.json architectures[0] -> model_type
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MixtralForCausalLM": "mixtral",
    "MistralForCausalLM": "mistral",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Glm4MoeForCausalLM": "glm4_moe",
    "GptOssForCausalLM": "gpt_oss",
    "NemotronHForCausalLM": "nemotron_h",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
}
_LAYER_CODES = {"mamba": "M", "moe": "E", "attention": "*", "mlp": "-"}


class NoConfigError(ValueError):
    """A spec whose architecture has no known Hugging Face config layout."""


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """The ``config.json`` dict of ``spec`` (its own when it was read from one); raises :class:`NoConfigError`."""
    if spec.hf_config is not None:
        return dict(spec.hf_config)
    model_type = MODEL_TYPES.get(spec.architecture or "")
    if model_type is None:
        raise NoConfigError(
            f"{spec.name}: no config.json layout is known for architecture {spec.architecture!r}; pass its config.json"
        )
    cfg: dict[str, Any] = {
        "architectures": [spec.architecture],
        "model_type": model_type,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.hd,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "max_position_embeddings": 131072,
    }
    if model_type in ("qwen3_moe",):
        cfg.update(
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.experts_per_token,
            moe_intermediate_size=spec.moe_intermediate_size,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
        )
    elif model_type == "mixtral":
        cfg.update(num_local_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token)
    elif model_type in ("deepseek_v3", "glm4_moe"):
        shared = spec.shared_expert_intermediate_size // spec.moe_intermediate_size if spec.moe_intermediate_size else 0
        cfg.update(
            n_routed_experts=spec.num_experts,
            n_shared_experts=shared,
            num_experts_per_tok=spec.experts_per_token,
            moe_intermediate_size=spec.moe_intermediate_size,
            first_k_dense_replace=spec.first_dense_layers,
            n_group=1,
            topk_group=1,
        )
        if model_type == "deepseek_v3":
            cfg.update(
                q_lora_rank=spec.q_lora_rank,
                kv_lora_rank=spec.kv_lora_rank,
                qk_nope_head_dim=spec.qk_nope_head_dim,
                qk_rope_head_dim=spec.qk_rope_head_dim,
                v_head_dim=spec.v_head_dim,
            )
            cfg.pop("head_dim")
        else:
            cfg.update(use_qk_norm=spec.qk_norm, attention_bias=spec.qkv_bias, partial_rotary_factor=0.5)
    elif model_type == "gpt_oss":
        cfg.update(num_local_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token)
    elif model_type == "nemotron_h":
        cfg.update(
            hybrid_override_pattern="".join(_LAYER_CODES[t] for t in spec.layer_types),
            mamba_num_heads=spec.mamba_num_heads,
            mamba_head_dim=spec.mamba_head_dim,
            n_groups=spec.mamba_n_groups,
            ssm_state_size=spec.ssm_state_size,
            conv_kernel=spec.conv_kernel,
            n_routed_experts=spec.num_experts or 8,
            moe_intermediate_size=spec.moe_intermediate_size or 8,
            moe_shared_expert_intermediate_size=spec.shared_expert_intermediate_size or 8,
            num_experts_per_tok=spec.experts_per_token or 2,
            mlp_hidden_act="relu2",
        )
    elif model_type in ("qwen2", "llama", "mistral") and spec.qkv_bias and model_type != "qwen2":
        cfg["attention_bias"] = True
    return cfg


__all__ = ["hf_config", "MODEL_TYPES", "NoConfigError"]
