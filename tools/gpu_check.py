"""The dry run held to a real GPU: write the cases, and compare what the GPU measured with the dry run and the estimate.

    python tools/gpu_check.py make DIR            # one dry-run spec per case (AutoModel's recipes at their sizes)
    python -m automodel_dist.dry_run.on_gpu DIR RESULT.json     # on a CUDA machine (see docs/gpu-check.md)
    python tools/gpu_check.py compare DIR RESULT.json [--json OUT]   # here: the dry run and the estimate, per build

The cases are recipes the dry run measures (``tests/calibration`` and ``../shared/corpus``), at the sizes the
corpus sweep uses, on rank 0; specs are written by the dry run's own planner, so the GPU trains exactly the builds
the dry run measures (its two shallow builds, and the full depth where it fits one GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "server"))
CORPUS = ROOT.parent / "shared" / "corpus"
CALIBRATION = ROOT / "tests" / "calibration" / "recipes"

# name -> (recipe, request fields, full depth on the GPU too)
CASES: dict[str, tuple[Path, dict[str, Any], bool]] = {
    "01_llama3_1_8b_peft_benchmark": (
        CALIBRATION / "llama3_1_8b_peft_benchmark.yaml",
        {"world_size": 1, "seq_len": 4096, "micro_batch_size": 2},
        True,
    ),
    "02_qwen2_5_7b_peft_benchmark": (
        CALIBRATION / "qwen2_5_7b_peft_benchmark.yaml",
        {"world_size": 1, "seq_len": 4096, "micro_batch_size": 2},
        True,
    ),
    "03_llama3_1_70b_pretrain_cp2": (
        CORPUS / "llm_benchmark/llama3_3/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml",
        {},
        True,
    ),
    "04_phi_4_squad_tp2": (CORPUS / "llm_finetune/phi/phi_4_squad_tp2.yaml", {}, False),
    "05_gemma_2_9b_it_squad_eager": (CORPUS / "llm_finetune/gemma/gemma_2_9b_it_squad.yaml", {}, True),
    "06_llama_3_3_70b_squad_peft_pp": (
        CORPUS / "llm_benchmark/llama3_3/llama_3_3_70b_instruct_squad_peft_pp.yaml",
        {},
        True,
    ),
    "07_llama3_2_1b_full_sft_chat": (
        CORPUS / "llm_finetune/llama3_2/customizer_llama_3_2_1b_full_sft_chat.yaml",
        {},
        True,
    ),
    "08_qwen3_32b_tulu3": (CORPUS / "llm_finetune/qwen/qwen3_32b_tulu3.yaml", {}, True),
    "09_gpt_oss_peft_packing": (CORPUS / "llm_finetune/gpt_oss/customizer_gpt_oss_peft_packing.yaml", {}, True),
    "10_granite_3_3_2b_squad_peft": (
        CORPUS / "llm_finetune/granite/granite_3_3_2b_instruct_squad_peft.yaml",
        {},
        False,
    ),
    "11_phi_3_mini_it_squad": (CORPUS / "llm_finetune/phi/phi_3_mini_it_squad.yaml", {}, True),
    "12_mistral_7b_squad_peft": (CORPUS / "llm_finetune/mistral/mistral_7b_squad_peft.yaml", {}, False),
    "13_llama3_2_1b_squad": (CORPUS / "llm_finetune/llama3_2/llama3_2_1b_squad.yaml", {}, True),
}


def make(out: Path) -> None:
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.request import Request

    out.mkdir(parents=True, exist_ok=True)
    for name, (recipe, fields, full) in CASES.items():
        plan = plan_dry_run(Request.of(recipe, **fields))
        spec = plan.specs[0]
        rel = recipe.relative_to(CORPUS) if recipe.is_relative_to(CORPUS) else recipe.relative_to(ROOT)
        case = {"name": name, "recipe": str(rel), "fields": fields, "full_depth": full, "spec": spec.model_dump()}
        (out / f"{name}.json").write_text(json.dumps(case, indent=1) + "\n", encoding="utf-8")
        print(name, spec.world_size, spec.seq_len, [b.hf_config.get("num_hidden_layers") for b in spec.builds or []])


def recipe_path(case: dict[str, Any]) -> Path:
    return CORPUS / case["recipe"] if (CORPUS / case["recipe"]).exists() else ROOT / case["recipe"]


def compare(cases: Path, result: Path, json_out: Path | None) -> list[dict[str, Any]]:
    """Per measured build: the GPU's peak, the dry run's and the estimate's (on_gpu.against_gpu)."""
    from automodel_dist.dry_run.on_gpu import against_gpu

    gpu = json.loads(result.read_text(encoding="utf-8"))
    rows = []
    for row in gpu["cases"]:
        case = json.loads((cases / f"{row['name']}.json").read_text(encoding="utf-8"))
        for i, build in enumerate(row["builds"]):
            if build["status"] != "measured":
                out = {
                    "name": row["name"],
                    "build": build.get("build"),
                    "gpu": build["status"],
                    "error": build.get("error"),
                }
            else:
                got = against_gpu(
                    recipe_path(case),
                    case["fields"],
                    build,
                    rank=row.get("rank", 0),
                    full_depth=build.get("build") == "full",
                    previous=row["builds"][i - 1] if i else None,
                )
                out = {"name": row["name"], **got}
            rows.append(out)
            print(json.dumps(out), flush=True)
        if row.get("refused"):
            rows.append({"name": row["name"], "refused": row["refused"]})
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out", type=Path)
    c = sub.add_parser("compare")
    c.add_argument("cases", type=Path)
    c.add_argument("result", type=Path)
    c.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.cmd == "make":
        make(args.out)
    else:
        compare(args.cases, args.result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
