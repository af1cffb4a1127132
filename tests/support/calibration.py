"""AutoModel's published H100 runs (tests/calibration/README.md) as rows, with the sizes each was measured at, and
the layouts the estimate is compared with AutoModel's own step on (the dry run) per memory category. Shared by
``tests/oracle/test_calibration.py`` and ``bench/bench_calibration.py``."""

from __future__ import annotations

import math
import re

import pytest

from automodel_dist import estimate_memory
from automodel_dist.catalog.models import lookup
from support.paths import CALIBRATION


def published_rows() -> list[dict]:
    """The table of tests/calibration/README.md, as published."""
    text = (CALIBRATION / "README.md").read_text()
    table = text[text.index("| recipe | GPUs |") :].split("\n\n")[0].splitlines()
    head = [c.strip() for c in table[0].strip("|").split("|")]
    rows = []
    for line in table[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        row = dict(zip(head, cells))
        row["recipe"] = row["recipe"].split(" ")[0]
        for key in ("GPUs", "GBS", "MBS", "LBS", "seq", "TP", "PP", "CP"):
            row[key] = int(row[key])
        for key in ("EP", "VP"):
            row[key] = None if row[key] == "-" else int(row[key])
        row["s/step"] = float(row["s/step"])
        rows.append(row)
    return rows


# What differs between the measured run and the recipe in AutoModel's repository today.
TABLE_OVERRIDES = {
    # the 1,024-GPU recipe no longer sets activation_checkpointing; without it the 16 MoE layers per pipeline rank keep
    # ~180 GiB of activations over 8 in-flight microbatches, which cannot have run on 80 GB (its 256-GPU twin sets it)
    "deepseek_v3_te_deepep_1024.yaml": ["distributed.activation_checkpointing=true"],
}
# Rows the model does not reach, and why (measured: bench/bench_calibration.py prints every ratio).
MISSES = {
    "gptoss_20b_te_deepep.yaml": "step time 0.74x the measured: GPT-OSS's FlexAttention with sinks and its clamped "
    "SwiGLU experts run well below the matmul efficiency assumed for every other model (its MFU is 28% in the table, "
    "where Qwen3-MoE's comparable run reaches the model's efficiency); the model has no per-kernel efficiency",
}


def overrides(row: dict) -> list[str]:
    out = [f"step_scheduler.global_batch_size={row['GBS']}", f"step_scheduler.local_batch_size={row['LBS']}"]
    if row["PP"] > 1:
        out.append(f"distributed.pipeline.pp_microbatch_size={row['MBS']}")
        if row["VP"]:
            layers = lookup(_recipe_model(row)).num_layers
            per_stage = math.ceil(layers / (row["PP"] * row["VP"]))
            out += [
                f"distributed.pipeline.layers_per_stage={per_stage}",
                "distributed.pipeline.round_virtual_stages_to_pp_multiple=up",
            ]
    return out + TABLE_OVERRIDES.get(row["recipe"], [])


def _recipe_model(row: dict) -> str:
    text = (CALIBRATION / "recipes" / row["recipe"]).read_text()
    return re.search(r"pretrained_model_name_or_path:\s*(\S+)", text).group(1)


def estimate_row(row: dict):
    return estimate_memory(
        CALIBRATION / "recipes" / row["recipe"],
        world_size=row["GPUs"],
        gpus_per_node=min(8, row["GPUs"]),
        seq_len=row["seq"],
        gpu="H100-80GB",
        headroom=0.0,
        overrides=overrides(row),
    )


L8, Q3 = "meta-llama/Llama-3.1-8B", "Qwen/Qwen3-30B-A3B"
LLM = "recipe: TrainFinetuneRecipeForNextTokenPrediction\n"
PP = "step_scheduler:\n  local_batch_size: 4\n  global_batch_size: 16\n"
EAGER = "model:\n  attn_implementation: eager\n"
NO_LIGER = "model:\n  use_liger_kernel: false\n"
LORA = "peft:\n  target_modules: ['*_proj']\n  dim: 16\n"
DRY = [
    pytest.param(L8, "distributed: {}\n", id="dense"),
    pytest.param(L8, "distributed:\n  tp_size: 2\n  sequence_parallel: true\n", id="tp2-sp"),
    pytest.param(L8, LORA + "distributed: {}\n", id="lora"),
    pytest.param(
        L8,
        PP + "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: interleaved1f1b\n    pp_microbatch_size: 1\n"
        "    layers_per_stage: 1\n",
        id="pp2-interleaved",
    ),
    pytest.param(
        Q3, "distributed:\n  ep_size: 8\n  activation_checkpointing: true\n", id="qwen3-moe-ep8-checkpointing"
    ),
    # transformers' eager attention, as AutoModel's own Llama class runs it when the recipe asks (seq x seq scores)
    pytest.param(L8, EAGER + "distributed: {}\n", id="eager-attention"),
]
DRY_SLOW = [
    pytest.param(L8, "distributed:\n  activation_checkpointing: true\n", id="checkpointing-submodules"),
    pytest.param(L8, "distributed:\n  activation_checkpointing: selective\n", id="checkpointing-selective"),
    pytest.param(L8, "distributed:\n  dp_replicate_size: 2\n", id="hsdp"),
    pytest.param(
        L8, "step_scheduler:\n  local_batch_size: 1\n  global_batch_size: 16\ndistributed: {}\n", id="grad-accumulation"
    ),
    pytest.param(L8, "distributed:\n  tp_size: 2\n", id="tp2"),
    pytest.param(L8, LORA + "distributed:\n  activation_checkpointing: true\n", id="lora-checkpointing"),
    pytest.param(
        L8,
        "distributed:\n  tp_size: 2\n  sequence_parallel: true\n  activation_checkpointing: true\n",
        id="tp2-sp-checkpointing",
    ),
    pytest.param(
        L8, "model:\n  force_hf: true\ndistributed:\n  activation_checkpointing: true\n", id="hf-class-checkpointing"
    ),
    pytest.param(
        L8,
        PP + "distributed:\n  pp_size: 2\n  pipeline:\n    pp_schedule: 1f1b\n    pp_microbatch_size: 1\n",
        id="pp2-1f1b",
    ),
    pytest.param(Q3, "distributed:\n  ep_size: 8\n", id="qwen3-moe-ep8"),
    pytest.param(L8, EAGER + "distributed:\n  tp_size: 2\n", id="eager-attention-tp2"),
    # a Hugging Face multimodal class's language model without Liger: Gemma-3's fp32 layer and q/k norms, whose
    # normalised tensors stay only for a trained norm weight
    pytest.param("google/gemma-3-4b-it", NO_LIGER + "distributed: {}\n", id="hf-fp32-norms"),
    pytest.param("google/gemma-3-4b-it", NO_LIGER + LORA + "distributed: {}\n", id="hf-fp32-norms-lora"),
    # a Hugging Face class's frozen norms under LoRA (no Liger under TP): they keep no normalised copy
    pytest.param(L8, "model:\n  force_hf: true\n" + LORA + "distributed:\n  tp_size: 2\n", id="hf-class-lora-tp2"),
    # transformers' q/k norms (fp32 copies) on a Hugging Face class without Liger (off under TP)
    pytest.param("Qwen/Qwen3-8B", "model:\n  force_hf: true\ndistributed:\n  tp_size: 2\n", id="hf-qk-norms-tp2"),
    # AutoModel's Qwen3-VL class subclasses transformers', its Qwen3 class transformers' decoder layer: their layers
    # keep transformers' norms (and get no Liger)
    pytest.param("Qwen/Qwen3-8B", LORA + "distributed: {}\n", id="hf-layers-own-qwen3-lora"),
    pytest.param("Qwen/Qwen3-VL-4B-Instruct", "distributed: {}\n", id="hf-layers-own-class"),
    # a Hugging Face class with softcapped scores (Gemma-2: its tanh is kept too)
    pytest.param("google/gemma-2-9b-it", EAGER + "distributed: {}\n", id="eager-attention-softcap"),
]
