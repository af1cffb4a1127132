"""Hypothesis strategies over whole recipes, distributed: blocks, YAML text and mutations of real
recipes, plus the checks every input must pass. Shared by tests/unit/test_fuzz.py (a CI slice) and
bench/bench_fuzz.py (>= 10,000 inputs with counts and timings).

The properties: every call returns a report (no exception escapes), every finding names a known
rule with a message, no rule crashes (``internal-error``), and the surfaces agree with each other
(a valid config builds a mesh and an estimate; an invalid one raises ConfigError from build_mesh).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st
from pydantic import BaseModel

from automodel_dist import build_mesh, validate_config
from automodel_dist.catalog.models import catalog
from automodel_dist.config import schema
from automodel_dist.report import ConfigError, MeshReport, ValidationReport
from automodel_dist.rules import RULES

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
MODELS = [m.name for m in catalog()]

TOP_KEYS = [k for k in schema.DistributedConfig.model_fields if k != "options"]
OPTION_KEYS = sorted(
    {*schema.FSDP2Options.model_fields, *schema.MegatronFSDPOptions.model_fields, *schema.DDPOptions.model_fields}
)
PIPELINE_KEYS = list(schema.PipelineConfig.model_fields)
MOE_KEYS = list(schema.MoEConfig.model_fields)
NESTED = {
    "mp_policy": schema.MixedPrecisionPolicy,
    "offload_policy": schema.CPUOffloadPolicy,
    "multimodal": schema.Multimodal,
    "pipeline": schema.PipelineConfig,
    "moe": schema.MoEConfig,
}
ODD_STRINGS = [
    "none",
    "None",
    "null",
    "~",
    "2",
    "2.0",
    "two",
    "true",
    "yes",
    "off",
    "selective",
    "full",
    "fsdp2",
    "ddp",
    "mfsdp",
    "megatron-fsdp",
    "1f1b",
    "interleaved1f1b",
    "interleaved_1f1b",
    "DualPipeV",
    "bfloat16",
    "bf16",
    "torch.float32",
    "fp8",
    "1e5",
    "-3",
    "0x10",
    "[1, 2]",
    "{a: 1}",
    "${X}",
    "${X,2}",
    "$HOME",
    "_target_",
    "",
    " ",
    "\t",
    "é",
    "\u202e",
    "nan",
    "inf",
    "9" * 40,
]


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, 1, 2, 3, 4, 6, 8, 16, 32, 64, 128, -1, -8, 2**31, 2**40, 10**12]),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(ODD_STRINGS),
        st.text(max_size=12),
    )


def values(depth: int = 2) -> st.SearchStrategy[Any]:
    if depth <= 0:
        return scalars()
    inner = values(depth - 1)
    return st.one_of(
        scalars(),
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(PIPELINE_KEYS + MOE_KEYS + OPTION_KEYS), st.text(max_size=8)), inner, max_size=4
        ),
    )


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic block inside a field's annotation (``X``, ``X | None``), if any."""
    for t in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def shaped(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    """A mapping with some of ``model``'s keys, each an odd scalar, a list or (nested blocks) a mapping of the
    nested block's keys: reaches every level of mp_policy:, multimodal.vision.frame_sharding:, ..."""
    optional = {}
    for name, info in model.model_fields.items():
        sub = _model_of(info.annotation)
        optional[name] = st.one_of(
            scalars(), st.lists(scalars(), max_size=2), *([st.deferred(lambda sub=sub: shaped(sub))] if sub else [])
        )
    return st.fixed_dictionaries({}, optional=optional)


def _sizes() -> st.SearchStrategy[Any]:
    plausible = st.sampled_from([None, 1, 2, 3, 4, 8, 16, 32])
    return st.one_of(plausible, plausible, plausible, scalars())


@st.composite
def blocks(draw: st.DrawFn) -> dict[str, Any]:
    """A distributed: block: mostly plausible keys with plausible or odd values, some unknown keys."""
    block: dict[str, Any] = {}
    if draw(st.booleans()):
        names = st.sampled_from(["fsdp2", "FSDP2", "ddp", "megatron_fsdp", "mfsdp", "megatron-fsdp"])
        block["strategy"] = draw(st.one_of(names, names, names, scalars()))
    for key in ("tp_size", "pp_size", "cp_size", "ep_size", "dp_size", "dp_replicate_size"):
        if draw(st.integers(0, 3)) == 0:
            block[key] = draw(_sizes())
    if draw(st.integers(0, 3)) == 0:
        block["pipeline"] = draw(
            shaped(schema.PipelineConfig) if draw(st.booleans()) else st.one_of(st.none(), values(1))
        )
    if draw(st.integers(0, 4)) == 0:
        block["moe"] = draw(shaped(schema.MoEConfig) if draw(st.booleans()) else st.one_of(st.none(), values(1)))
    if draw(st.integers(0, 3)) == 0:
        block["activation_checkpointing"] = draw(
            st.one_of(st.sampled_from([True, False, "selective", "full", "none", "off"]), scalars())
        )
    for key in draw(st.lists(st.sampled_from(OPTION_KEYS), max_size=3)):
        nested = key in NESTED and draw(st.booleans())  # half the time the block's own shape, all levels deep
        block[key] = draw(shaped(NESTED[key]) if nested else values(1))
    if draw(st.integers(0, 5)) == 0:
        block[draw(st.sampled_from(["_target_", "unknown_key", "tp", "sequence_parallell"]))] = draw(scalars())
    return block


@st.composite
def recipes(draw: st.DrawFn) -> dict[str, Any]:
    """A whole recipe: distributed: plus the sections rules read, any of them odd."""
    recipe: dict[str, Any] = {"distributed": draw(blocks()) if draw(st.integers(0, 9)) else draw(values(1))}
    if draw(st.booleans()):
        recipe["step_scheduler"] = draw(
            st.fixed_dictionaries({}, optional={"global_batch_size": _sizes(), "local_batch_size": _sizes()})
        )
    if draw(st.integers(0, 2)) == 0:
        recipe["dataset"] = draw(st.fixed_dictionaries({}, optional={"seq_length": _sizes(), "seq_len": _sizes()}))
    if draw(st.integers(0, 3)) == 0:
        recipe["packed_sequence"] = {"packed_sequence_size": draw(_sizes())}
    if draw(st.integers(0, 3)) == 0:
        recipe["model"] = {"pretrained_model_name_or_path": draw(st.one_of(st.sampled_from(MODELS), scalars()))}
        if draw(st.booleans()):  # what the model-class rules read: backend.attn and force_hf, in odd shapes too
            recipe["model"]["backend"] = draw(
                st.one_of(
                    st.fixed_dictionaries(
                        {}, optional={"attn": st.one_of(st.sampled_from(["te", "sdpa", "flex"]), scalars())}
                    ),
                    scalars(),
                )
            )
        if draw(st.integers(0, 3)) == 0:
            recipe["model"]["force_hf"] = draw(st.one_of(st.booleans(), scalars()))
    if draw(st.integers(0, 4)) == 0:
        recipe["ci"] = draw(
            st.one_of(st.fixed_dictionaries({}, optional={"nodes": _sizes(), "nproc_per_node": _sizes()}), values(1))
        )
    return recipe


def _dump(data: Any) -> str:
    try:
        return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, ValueError):
        return repr(data)


MUTATIONS = ("delete", "duplicate", "swap", "number", "char", "truncate", "indent", "tab", "value", "nest")


@st.composite
def mutated_examples(draw: st.DrawFn) -> str:
    """A real recipe (tests/examples) with 1-4 random edits."""
    text = draw(st.sampled_from([p.read_text(encoding="utf-8") for p in EXAMPLES]))
    for _ in range(draw(st.integers(1, 4))):
        lines = text.splitlines() or [""]
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(MUTATIONS))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "number":
            lines[i] = (
                lines[i].rstrip() + f" {draw(st.integers(-(2**40), 2**40))}"
                if ":" not in lines[i]
                else (
                    lines[i].split(":", 1)[0]
                    + f": {draw(st.one_of(st.integers(-(2**40), 2**40), st.sampled_from([0, 3])))}"
                )
            )
        elif op == "char":
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = (
                lines[i][:pos] + draw(st.sampled_from(list(":-[]{}&*!|>'\"%@`#,?") + ["\t", "\x00"])) + lines[i][pos:]
            )
        elif op == "truncate":
            lines = lines[: i + 1]
            lines[-1] = lines[-1][: draw(st.integers(0, len(lines[-1])))]
        elif op == "indent":
            lines[i] = " " * draw(st.integers(0, 7)) + lines[i].lstrip()
        elif op == "tab":
            lines[i] = "\t" + lines[i]
        elif op == "value" and ":" in lines[i]:
            lines[i] = lines[i].split(":", 1)[0] + ": " + _dump(draw(scalars())).splitlines()[0]
        elif op == "nest":
            lines.insert(
                i,
                "distributed:\n  "
                + draw(st.sampled_from(TOP_KEYS + OPTION_KEYS))
                + ": "
                + _dump(draw(scalars())).splitlines()[0],
            )
        text = "\n".join(lines) + "\n"
    return text


CONFIG_JSONS = [  # config.json shapes the model rules parse: a dense transformer, an MoE, a hybrid Mamba MoE
    {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 256,
    },
    {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "n_routed_experts": 8,
        "moe_intermediate_size": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 8,
        "first_k_dense_replace": 1,
    },
    {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": 64,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hybrid_override_pattern": "M*-ME",
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "ssm_state_size": 16,
        "n_routed_experts": 4,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 32,
        "num_experts_per_tok": 2,
    },
]


@st.composite
def config_jsons(draw: st.DrawFn) -> dict[str, Any]:
    """A config.json dict with some fields replaced by odd values (or odd layer patterns)."""
    cfg = dict(draw(st.sampled_from(CONFIG_JSONS)))
    for key in draw(st.lists(st.sampled_from(sorted({k for c in CONFIG_JSONS for k in c})), max_size=3)):
        cfg[key] = draw(
            st.one_of(
                scalars(),
                st.text(alphabet="M*-EX ", max_size=8),
                st.lists(
                    st.sampled_from(["mamba", "attention", "full_attention", "linear_attention", "mlp", "moe", "x"]),
                    max_size=6,
                ),
            )
        )
    return cfg


@st.composite
def contexts(draw: st.DrawFn) -> dict[str, Any]:
    """world_size / nodes / gpus_per_node / model / torch_version arguments, usually plausible, sometimes absurd."""
    kw: dict[str, Any] = {}
    how = draw(st.integers(0, 5))
    if how <= 2:
        kw["world_size"] = draw(
            st.one_of(st.sampled_from([1, 2, 4, 8, 12, 16, 32, 64, 128, 1024]), st.integers(-4, 1 << 25))
        )
    elif how <= 4:
        kw["nodes"] = draw(st.one_of(st.integers(1, 64), st.integers(-2, 10**9)))
        kw["gpus_per_node"] = draw(st.one_of(st.sampled_from([1, 2, 4, 8, 16]), st.integers(-2, 10**6)))
    if draw(st.booleans()):
        kw["model"] = draw(
            st.one_of(st.sampled_from(MODELS), st.sampled_from(["no/such-model", "llama", ""]), config_jsons())
        )
    if draw(st.integers(0, 3)) == 0:
        kw["torch_version"] = draw(
            st.one_of(st.sampled_from(["2.13.0+cpu", "2.14.1", "2.15.0+cu132", "3.0"]), st.text(max_size=12))
        )
    if draw(st.integers(0, 3)) == 0:
        kw["overrides"] = draw(
            st.lists(
                st.one_of(
                    st.sampled_from(OVERRIDES),
                    st.builds("{}={}".format, st.text(alphabet="distrbuteo._pz", max_size=24), st.text(max_size=12)),
                ),
                max_size=4,
            )
        )
    return kw


OVERRIDES = [  # launch-command overrides: usual, odd and malformed
    "distributed.tp_size=2",
    "distributed.tp_size='4'",
    "distributed.pp_size=2",
    "distributed.cp_size=none",
    "distributed.ep_size=8",
    "distributed.strategy=ddp",
    "distributed.strategy=megatron_fsdp",
    "distributed=None",
    "distributed={'tp_size': 2}",
    "distributed.pipeline={}",
    "distributed.pipeline.pp_schedule=interleaved1f1b",
    "distributed.pipeline=[1, 2]",
    "distributed.sequence_parallel=True",
    "distributed.dp_replicate_size=2",
    "step_scheduler.local_batch_size=3",
    "step_scheduler=None",
    "model._target_=os.system",
    "distributed.tp_size",
    "=",
    "distributed..tp_size=2",
    "a.b.c.d=[1, [2, {'x': None}]]",
    "distributed.tp_size=${TP,2}",
    "ci.nodes=0",
    "distributed.tp_size=" + "9" * 5000,
]


def inputs() -> st.SearchStrategy[tuple[str, Any, dict[str, Any]]]:
    """(kind, config, context): mappings, their YAML text, mutated real recipes and raw odd YAML."""
    return st.one_of(
        st.tuples(st.just("recipe-mapping"), recipes(), contexts()),
        st.tuples(st.just("block-mapping"), blocks(), contexts()),
        st.tuples(st.just("recipe-yaml"), recipes().map(_dump), contexts()),
        st.tuples(st.just("mutated-example"), mutated_examples(), contexts()),
        st.tuples(st.just("raw-text"), st.text(max_size=200), contexts()),
    )


@dataclass
class Tally:
    """Counts and timings of a fuzz run (the bench prints them)."""

    calls: Counter = field(default_factory=Counter)
    slowest: dict[str, tuple[float, str]] = field(default_factory=dict)
    slowest_inputs: dict[str, tuple[tuple, dict]] = field(default_factory=dict)
    outcomes: Counter = field(default_factory=Counter)
    rules: Counter = field(default_factory=Counter)
    times_ms: dict[str, list[float]] = field(default_factory=dict)

    def time(self, what: str, ms: float) -> None:
        self.calls[what] += 1
        self.times_ms.setdefault(what, []).append(ms)


def _timed(tally: Tally | None, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    t = time.perf_counter()
    try:
        return fn(*args, **kwargs)
    finally:
        if tally is not None:
            ms = (time.perf_counter() - t) * 1e3
            tally.time(what, ms)
            if ms > tally.slowest.get(what, (0.0, ""))[0]:
                tally.slowest[what] = (ms, repr((args, kwargs))[:300])
                tally.slowest_inputs[what] = (args, kwargs)


def check_report(report: ValidationReport) -> None:
    assert isinstance(report, ValidationReport)
    for f in report.findings:
        assert f.rule in RULES, f.rule
        assert f.rule != "internal-error", f.message  # a rule crashed on this input
        assert f.severity in ("error", "warning", "info") and f.message
    assert report.valid == (not report.errors)


def same_value(a: Any, b: Any) -> bool:
    """Equal values of equal types all the way down (1 == True == 1.0 in Python; NaN != NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def check_input(kind: str, config: Any, ctx: dict[str, Any], tally: Tally | None = None) -> None:
    """validate_config, then build_mesh (and estimate_memory) must agree with its verdict; the rule
    gates change nothing."""
    report = _timed(tally, "validate_config", validate_config, config, **ctx)
    check_report(report)
    if tally is not None:
        tally.outcomes[f"{kind}: {'valid' if report.valid else 'invalid'}"] += 1
        tally.rules.update({f.rule for f in report.errors})
    world = report.world_size
    if world is None or world > (1 << 24):
        return
    gpn = ctx.get("gpus_per_node")
    # build_mesh sees only world_size and gpus_per_node: it builds iff validation with those alone passes
    over = ctx.get("overrides")
    plain = (
        report
        if set(ctx) <= {"world_size", "gpus_per_node", "overrides"}
        else validate_config(config, world_size=world, gpus_per_node=gpn, overrides=over)
    )
    check_report(plain)
    assert report.valid <= plain.valid  # the model and cluster only ever add findings
    if plain.valid:
        mesh = _timed(
            tally,
            "build_mesh",
            build_mesh,
            config,
            world_size=world,
            ranks=[0, world - 1],
            gpus_per_node=gpn,
            overrides=over,
        )
        assert isinstance(mesh, MeshReport)
        if mesh.device_mesh is not None:
            assert math.prod(mesh.device_mesh.shape) == mesh.mesh_ranks <= world
        if report.valid and ctx.get("model") in MODELS and report.resolved.strategy:
            from automodel_dist import estimate_memory

            est = _timed(
                tally,
                "estimate_memory",
                estimate_memory,
                config,
                model=ctx["model"],
                **{k: v for k, v in ctx.items() if k not in ("model", "torch_version")},
            )
            assert est.memory_gib.total > 0
    else:
        try:
            _timed(tally, "build_mesh", build_mesh, config, world_size=world, gpus_per_node=gpn, overrides=over)
        except ConfigError as exc:
            check_report(exc.report)
        else:
            raise AssertionError("build_mesh accepted a config validate_config rejects")


@st.composite
def suggest_args(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "model": draw(st.one_of(st.sampled_from(MODELS), st.sampled_from(["no/such", "", "x.json"]))),
        "nodes": draw(st.one_of(st.integers(1, 16), st.integers(1, 16), st.sampled_from([0, -1, 10**7]))),
        "gpus_per_node": draw(st.one_of(st.none(), st.sampled_from([1, 2, 4, 8]), st.integers(-1, 10**5))),
        "gpu": draw(
            st.one_of(
                st.sampled_from(["H100-80GB", "A100-40GB", "B200", "L40S", "h200"]),
                st.sampled_from(["H100-80GB", "GB200"]),
                st.text(max_size=8),
            )
        ),
        "seq_len": draw(st.one_of(st.sampled_from([512, 4096, 32768, 131072]), st.integers(-5, 1 << 22))),
        "global_batch_size": draw(st.one_of(st.none(), st.integers(-1, 4096))),
        "micro_batch_size": draw(st.one_of(st.sampled_from([1, 2]), st.integers(-1, 64))),
        "precision": draw(st.sampled_from(["bf16", "bf16", "bf16-mixed", "fp32", "fp8"])),
        "headroom": draw(st.one_of(st.sampled_from([0.0, 0.1, 0.5]), st.floats(-1, 2))),
        "top_k": draw(st.one_of(st.integers(1, 5), st.integers(1, 5), st.integers(-1, 0))),
    } | draw(
        st.one_of(
            st.just({}),
            st.fixed_dictionaries(
                {  # a recipe fills what is left out (None)
                    "config": st.one_of(recipes(), mutated_examples()),
                    "model": st.one_of(st.none(), st.sampled_from(MODELS)),
                    "nodes": st.one_of(st.none(), st.integers(1, 4)),
                    "seq_len": st.one_of(st.none(), st.sampled_from([1024, 4096])),
                    "micro_batch_size": st.none(),
                }
            ),
        )
    )


def check_suggest(args: dict[str, Any], tally: Tally | None = None) -> None:
    """suggest_strategy returns a report, or a ValueError naming the bad argument."""
    from automodel_dist import suggest_strategy

    try:
        report = _timed(tally, "suggest_strategy", suggest_strategy, **args)
    except ValueError as exc:
        assert str(exc)
        if tally is not None:
            tally.outcomes["suggest: argument refused"] += 1
        return
    assert len(report.candidates) <= args["top_k"]
    for c in report.candidates:  # every suggestion validates with the model and cluster
        again = validate_config(c.yaml, nodes=report.nodes, gpus_per_node=report.gpus_per_node, model=report.model)
        check_report(again)
        assert again.valid, [f.message for f in again.errors]
    if "config" in args:  # the recipe's own layout: measured when valid, its errors otherwise
        cur = report.current
        assert cur is not None and (cur.valid == (cur.step_time_s is not None) == (cur.memory_gib is not None))
        assert cur.valid or cur.errors
        assert set(report.from_recipe) <= {
            "model",
            "nodes",
            "gpus_per_node",
            "seq_len",
            "global_batch_size",
            "micro_batch_size",
        }
    else:
        assert report.current is None and report.from_recipe == {}
    if tally is not None:
        tally.outcomes[f"suggest: {'candidates' if report.candidates else 'nothing fits'}"] += 1


TOOLS = [
    "validate_config",
    "build_mesh",
    "suggest_strategy",
    "estimate_memory",
    "explain_error",
    "list_models",
    "no_such_tool",
]
ARG_NAMES = [
    "config_yaml",
    "config_path",
    "world_size",
    "nodes",
    "gpus_per_node",
    "model",
    "ranks",
    "text",
    "picture_axis",
    "seq_len",
    "gpu",
    "top_k",
    "precision",
    "headroom",
    "extra",
]


@st.composite
def mcp_calls(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A tool name and arguments: right names with wrong types, missing fields, oversized strings."""
    tool = draw(st.sampled_from(TOOLS))
    args: dict[str, Any] = {}
    for name in draw(st.lists(st.sampled_from(ARG_NAMES), max_size=5, unique=True)):
        args[name] = draw(
            st.one_of(
                values(1),
                st.sampled_from(
                    [
                        "tp_size: 2\n",
                        "distributed:\n  tp_size: 3\n",
                        "/etc/passwd",
                        "/dev/zero",
                        "x" * 300_000,
                        "meta-llama/Llama-3.1-8B",
                    ]
                ),
                st.integers(-(2**70), 2**70),
            )
        )
    return tool, args
