"""Generate ``server/automodel_dist/catalog/capabilities.json`` from the installed NeMo AutoModel (0.7.0) and
transformers: for every architecture AutoModel's registry maps to its own class, what its capability code
(``_transformers/capabilities.ModelSupports``, the gate ``validate_for_mesh`` applies right after building) and its
parallelizer decide; for the Hugging Face causal-LM classes it builds otherwise, what CP needs.

The engine reads the JSON (it never imports AutoModel); ``tests/oracle/test_capabilities.py`` regenerates it and checks
the committed file is current, and checks the engine's verdicts against ``validate_for_mesh`` for every row.

Run: python tools/gen_capabilities.py [--check]   (needs nemo_automodel, torch, transformers, einops, pillow)
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect
import json
import logging
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "server" / "automodel_dist" / "catalog" / "capabilities.json"
# every backend.attn value AutoModel 0.7.0's BackendConfig documents (a model that owns its CP accepts any of them)
ATTENTION_BACKENDS = ("te", "sdpa", "flex", "magi", "tilelang", "cudnn", "eager", "torch", "fa4")


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)


def _configs(arch: str) -> dict[str, Any]:
    """Two configs that differ only in what AutoModel's ``_is_hybrid`` reads: the capability code decides CP by
    the class, its backend and whether the layers mix attention with other mixers (Mamba, linear attention), so the
    engine picks the row by what the model's own config.json says."""
    from transformers import PretrainedConfig

    plain = PretrainedConfig(architectures=[arch])
    hybrid = PretrainedConfig(architectures=[arch], is_hybrid_model=True)
    return {"plain": plain, "hybrid": hybrid}


def _shell(cls: type, cfg: Any, attn: str | None) -> Any:
    """An instance carrying only what ModelSupports reads (no __init__: some need CUDA or a download to build):
    the config, the backend, and, for PreTrainedModel subclasses, the dict plans their post_init always sets."""
    import torch.nn as nn
    from transformers import PreTrainedModel

    obj = cls.__new__(cls)
    nn.Module.__init__(obj)
    obj.config = cfg
    if attn is not None and "backend" in inspect.signature(cls.__init__).parameters:
        obj.backend = SimpleNamespace(attn=attn)
    if issubclass(cls, PreTrainedModel):
        obj._tp_plan = dict(getattr(cls, "_tp_plan", None) or {}) | dict(getattr(cfg, "base_model_tp_plan", None) or {})
        obj._pp_plan = dict(getattr(cls, "_pp_plan", None) or {})
    return obj


def _built(cls: type, has_backend: bool) -> Any:
    """The class built on the meta device from its default config, or None where that needs more (CUDA, a
    download): a plan function that reads the Hugging Face plan of the model's submodules needs them built."""
    import torch

    config_class = getattr(cls, "config_class", None)
    if config_class is None:
        return None
    try:
        kwargs: dict[str, Any] = {}
        if has_backend:
            from nemo_automodel.components.models.common import BackendConfig

            kwargs["backend"] = BackendConfig(attn="sdpa", linear="torch", rms_norm="torch", rope_fusion=False)
        with torch.device("meta"):
            return cls(config_class(), **kwargs)
    except Exception:  # noqa: BLE001 - any failure to build means: fall back to the shell
        return None


def registry_rows() -> dict[str, dict[str, Any]]:
    from nemo_automodel._transformers.capabilities import ModelSupports
    from nemo_automodel._transformers.registry import MODEL_ARCH_MAPPING
    from nemo_automodel.components.distributed.optimized_tp_plans import PARALLELIZE_FUNCTIONS, _get_class_qualname
    from nemo_automodel.components.moe.fsdp_mixin import MoEFSDPSyncMixin
    from transformers import PreTrainedModel

    rows: dict[str, dict[str, Any]] = {}
    for arch, entry in MODEL_ARCH_MAPPING.items():
        module, name = entry[0], entry[1]
        cls = getattr(importlib.import_module(module), name)
        configs = _configs(arch)
        cfg = configs["plain"]
        shell = _shell(cls, cfg, "sdpa")
        supports = ModelSupports(shell, None)
        has_backend = "backend" in inspect.signature(cls.__init__).parameters
        cp: dict[str, Any] = {}
        for kind, config in configs.items():
            if has_backend:  # ModelSupports holds a weak reference: keep each instance alive while it is asked
                shells = {a: _shell(cls, config, a) for a in ATTENTION_BACKENDS}
                cp[kind] = sorted(a for a, m in shells.items() if ModelSupports(m, None).supports_cp)
            else:
                hf_shell = _shell(cls, config, None)
                cp[kind] = bool(ModelSupports(hf_shell, None).supports_cp)
        qualname = _get_class_qualname(cls)
        optimized = qualname in PARALLELIZE_FUNCTIONS
        hf_sub = issubclass(cls, PreTrainedModel)
        moe = issubclass(cls, MoEFSDPSyncMixin)
        tp_plan = "optimized" if optimized else "hf" if hf_sub else "none"
        plan_error = None
        if optimized:
            try:  # AutoModel's own plan function on the class (it raises where it finds no plan to use)
                PARALLELIZE_FUNCTIONS[qualname](_built(cls, has_backend) or shell, False)
            except (ValueError, AttributeError, TypeError) as exc:
                plan_error = f"{type(exc).__name__}: {exc}" if isinstance(exc, ValueError) else None
        sidecar = getattr(cls, "parallelizer", None)
        if hf_sub and moe and not optimized and sidecar is None:
            # the default plan reaches _validate_moe_tp_plan, which rejects patterns matching no module
            plan_error = (
                "ValueError: Custom MoE tensor-parallel plan patterns must each match at least one concrete module "
                "(give distributed.tp_plan)"
            )
        sidecar_src = inspect.getsource(type(sidecar)) if sidecar is not None else ""
        tie = getattr(getattr(cls, "tie_word_embeddings_support", None), "value", None)
        rows[arch] = {
            "module": module,
            "class": name,
            "tags": sorted(entry[2]) if len(entry) > 2 else [],
            "tp": supports.supports_tp,
            "pp": supports.supports_pp,
            "ep": supports.supports_ep,
            "cp_attn": cp["plain"] if has_backend else None,  # backend.attn values CP accepts
            "cp_attn_hybrid": cp["hybrid"] if has_backend else None,  # the same with hybrid layers
            "cp_without_backend": None if has_backend else {"plain": cp["plain"], "hybrid": cp["hybrid"]},
            "tp_plan": tp_plan,
            "tp_plan_error": plan_error,
            "sequence_parallel": "Sequence parallelism is not supported" not in sidecar_src,
            "sidecar": type(sidecar).__name__ if sidecar is not None else None,
            "keeps_own_forward": bool(getattr(cls, "_pp_keep_self_forward", False)),
            "returns_hidden_states": bool(getattr(cls, "_pp_return_hidden_states_supported", False)),
            "logits_to_keep": "logits_to_keep" in inspect.signature(cls.forward).parameters,
            "moe_sync_mixin": moe,
            "tie": tie,
        }
    return dict(sorted(rows.items()))


def hf_rows(registered: set[str]) -> dict[str, dict[str, Any]]:
    """The Hugging Face causal-LM and image-text-to-text classes AutoModel builds when its registry has none: the
    TP and PP gates pass (transformers' post_init always sets dict plans), EP fails (no AutoModel MoE mixin), and CP
    needs SDPA and no hybrid layers, decided per class here from the same capability code."""
    import transformers
    from nemo_automodel._transformers.capabilities import ModelSupports
    from transformers.models.auto import modeling_auto

    names: dict[str, str] = {}
    for mapping in (
        modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        modeling_auto.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    ):
        for model_type, cls_name in mapping.items():
            if isinstance(cls_name, str) and cls_name not in registered:
                names.setdefault(cls_name, model_type)
    rows: dict[str, dict[str, Any]] = {}
    for cls_name, model_type in sorted(names.items()):
        try:
            cls = getattr(transformers, cls_name)
        except (AttributeError, ImportError):
            continue
        shells = {k: _shell(cls, c, None) for k, c in _configs(cls_name).items()}
        supports = {k: ModelSupports(m, None) for k, m in shells.items()}
        rows[cls_name] = {
            "model_type": model_type,
            "module": cls.__module__,  # not always modeling_<model_type> (AriaText lives in aria)
            "tp": supports["plain"].supports_tp,
            "pp": supports["plain"].supports_pp,
            "ep": supports["plain"].supports_ep,
            "cp": supports["plain"].supports_cp,
            "cp_hybrid": supports["hybrid"].supports_cp,
        }
    return rows


def generate() -> dict[str, Any]:
    _quiet()
    import torch

    torch.cuda.current_device = lambda: 0  # some classes build torch.device(f"cuda:{...}") at import
    rows = registry_rows()
    return {
        "generated_by": "tools/gen_capabilities.py",
        "nemo_automodel": importlib.metadata.version("nemo_automodel"),
        "transformers": importlib.metadata.version("transformers"),
        "architectures": rows,
        "hf_classes": hf_rows(set(rows)),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    args = ap.parse_args()
    text = json.dumps(generate(), indent=1, sort_keys=True) + "\n"
    if args.check:
        current = OUT.read_text(encoding="utf-8") if OUT.exists() else ""
        if current != text:
            print(f"{OUT} is stale: run python tools/gen_capabilities.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
