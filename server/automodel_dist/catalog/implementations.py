"""Which implementation AutoModel 0.7.0 builds for a Hugging Face architecture, and what it can shard.

AutoModel uses its own model class when ``_transformers/registry.py`` lists the architecture
(``MODEL_ARCH_MAPPING``), else the Hugging Face one. Right after building it,
``_transformers/capabilities.validate_for_mesh`` raises for a parallelism the class lacks:
TP needs a plan (``optimized_tp_plans.PARALLELIZE_FUNCTIONS`` or a ``_tp_plan`` attribute), PP a
``_pp_plan`` or the MoE mixin, EP the ``MoEFSDPSyncMixin``, and CP, for AutoModel's own classes,
one of the attention backends in ``cp_attn`` (the recipe's ``model.backend.attn``; Hugging Face
classes need only SDPA support). ``tests/test_oracle_parity.py`` checks every row against
AutoModel's own registry and capability code. ``model.force_hf: true`` makes AutoModel build the
Hugging Face class instead, which this table does not describe.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Implementation:
    """AutoModel 0.7.0's class for one architecture and the parallelisms it accepts."""

    architecture: str
    module: str  # where the class lives: nemo_automodel.components.models.* (custom) or transformers.models.*
    tp: bool
    pp: bool
    ep: bool
    cp_attn: frozenset[str] | None = None  # backend.attn values CP accepts (custom classes); None: any
    sequence_parallel: bool = True  # False: its own parallelizer raises for sequence_parallel: true (FSDP2 path)
    mamba_cp: bool = False  # CP shards its Mamba layers by heads (MambaContextParallel's divisibility asserts)
    own_fsdp2: bool = False  # its own FSDP2 parallelizer (ep_size 1) installs none of AutoModel's FSDP patches

    @property
    def custom(self) -> bool:
        return self.module.startswith("nemo_automodel.")

    def describe(self) -> str:
        where = "AutoModel's own" if self.custom else "the Hugging Face"
        return f"{where} {self.architecture} ({self.module})"


CP_TE_OR_MAGI = frozenset({"te", "magi"})  # AutoModel's classes without their own CP attention


def _custom(arch: str, pkg: str, *, tp: bool, pp: bool, ep: bool) -> Implementation:
    return Implementation(arch, f"nemo_automodel.components.models.{pkg}.model", tp, pp, ep, CP_TE_OR_MAGI)


def _hf(arch: str, pkg: str, *, tp: bool, pp: bool, ep: bool) -> Implementation:
    return Implementation(arch, f"transformers.models.{pkg}.modeling_{pkg}", tp, pp, ep)


IMPLEMENTATIONS: dict[str, Implementation] = {
    i.architecture: i
    for i in (
        _custom("LlamaForCausalLM", "llama", tp=True, pp=True, ep=False),
        _custom("Qwen2ForCausalLM", "qwen2", tp=True, pp=True, ep=False),
        _custom("Qwen3ForCausalLM", "qwen3", tp=True, pp=True, ep=False),
        # AutoModel's MoE models carry no TP plan in 0.7.0: shard them with EP, PP, CP and FSDP.
        _custom("Qwen3MoeForCausalLM", "qwen3_moe", tp=False, pp=True, ep=True),
        _custom("DeepseekV3ForCausalLM", "deepseek_v3", tp=False, pp=True, ep=True),
        _custom("GptOssForCausalLM", "gpt_oss", tp=False, pp=True, ep=True),
        _custom("Glm4MoeForCausalLM", "glm4_moe", tp=False, pp=True, ep=True),
        # No AutoModel Mixtral: the Hugging Face class has TP/PP plans but not the MoE mixin EP needs.
        _hf("MixtralForCausalLM", "mixtral", tp=True, pp=True, ep=False),
        # Nemotron-H (dense and MoE): AutoModel's hybrid class. No TP plan; its own FSDP2 parallelizer raises for
        # sequence_parallel and does not patch FSDP (so it runs on torch 2.15; its EP path does patch); CP runs on TE
        # or SDPA attention and splits each Mamba layer's heads over the CP ranks.
        Implementation(
            "NemotronHForCausalLM",
            "nemo_automodel.components.models.nemotron_v3.model",
            tp=False,
            pp=True,
            ep=True,
            cp_attn=frozenset({"te", "sdpa"}),
            sequence_parallel=False,
            mamba_cp=True,
            own_fsdp2=True,
        ),
        _hf("MistralForCausalLM", "mistral", tp=True, pp=True, ep=False),  # no AutoModel class: the transformers one
        _hf("Gemma2ForCausalLM", "gemma2", tp=True, pp=True, ep=False),
        _hf("Gemma3ForCausalLM", "gemma3", tp=True, pp=True, ep=False),
    )
}


def implementation(architecture: str | None) -> Implementation | None:
    """The tabled implementation of ``architecture`` (None when unknown: nothing is checked)."""
    return IMPLEMENTATIONS.get(architecture) if architecture else None
