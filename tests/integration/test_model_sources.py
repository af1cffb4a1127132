"""Where a model's dims come from: a config.json path, the local Hugging Face cache laid out by huggingface_hub itself
(a local server stands in for the Hub, so ``hf_hub_download`` writes snapshots, refs and revisions as it does for
real), the catalog, and ``--fetch-config``; never the network unless asked. The configs under ``tests/models`` are
the published config.json of each model (fields the tools do not read left out)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from automodel_dist import validate_config
from automodel_dist.catalog.models import MAX_CONFIG_BYTES, ModelConfigError
from automodel_dist.catalog.sources import resolve
from automodel_dist.request import Request
from support.hub import Hub
from support.paths import MODELS

QWEN3_NEXT = "Qwen/Qwen3-Next-80B-A3B-Thinking"
GEMMA4 = "google/gemma-4-31B-it"
PHI4 = "microsoft/phi-4"
CONFIGS = {
    QWEN3_NEXT: MODELS / "qwen3_next_80b_a3b.json",
    GEMMA4: MODELS / "gemma_4_31b_it.json",
    PHI4: MODELS / "phi_4.json",
}
# AutoModel's own Gemma-4-31B VLM recipe (examples/vlm_finetune/gemma4/gemma4_31b_tp4_pp2.yaml): its model and
# distributed settings as it ships them
GEMMA4_RECIPE = """\
recipe: FinetuneRecipeForVLM
step_scheduler:
  global_batch_size: 4
  local_batch_size: 2
model:
  _target_: nemo_automodel.NeMoAutoModelForImageTextToText.from_pretrained
  pretrained_model_name_or_path: google/gemma-4-31B-it
  torch_dtype: torch.bfloat16
  attn_implementation: eager
distributed:
  strategy: fsdp2
  dp_size: none
  tp_size: 4
  cp_size: 1
  pp_size: 2
  ep_size: 1
  sequence_parallel: false
  activation_checkpointing: true
  pipeline:
    pp_schedule: 1f1b
    pp_microbatch_size: 1
    scale_grads_in_schedule: false
freeze_config:
  freeze_vision_tower: true
  freeze_audio_tower: true
  freeze_language_model: false
"""


@pytest.fixture
def hub() -> Iterator[Hub]:
    h = Hub()
    yield h
    h.close()


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    return home


class Guard:
    """Once armed, every outbound connection fails the test (the cache and the catalog must need none). The tests
    lay out the cache through the local Hub first, as a user's earlier download did, then arm it."""

    def __init__(self) -> None:
        self.tried: list[Any] = []
        self.armed = False

    def arm(self) -> None:
        self.armed = True


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Guard:
    guard = Guard()
    connect, connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded(original: Any) -> Any:
        def call(self: socket.socket, address: Any) -> Any:
            if guard.armed:
                guard.tried.append(address)
                raise AssertionError(f"network call to {address} without fetch_config")
            return original(self, address)

        return call

    monkeypatch.setattr(socket.socket, "connect", guarded(connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(connect_ex))
    return guard


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "automodel_dist.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )


def _rules(report: Any) -> dict[str, Any]:
    return {f.rule: f for f in report.findings}


def test_the_cache_is_laid_out_as_huggingface_hub_lays_it_out(hub: Hub, hf_home: Path) -> None:
    hub.put(PHI4, CONFIGS[PHI4])
    path = hub.download(PHI4)
    repo = hf_home / "hub" / "models--microsoft--phi-4"
    assert (repo / "refs" / "main").read_text() == path.parent.name
    assert path == repo / "snapshots" / path.parent.name / "config.json" and path.is_symlink()
    assert (repo / "blobs").is_dir()


def test_phi4_tp4_from_the_cached_config_with_world_aware_fixes(hub: Hub, hf_home: Path, no_network: Guard) -> None:
    hub.put(PHI4, CONFIGS[PHI4])
    cached = hub.download(PHI4)
    no_network.arm()
    block = {"tp_size": 4}
    report = validate_config(block, world_size=8, model=PHI4)
    tp = _rules(report)["tp-heads"]
    assert tp.message == (
        "tp_size=4 does not divide num_key_value_heads=10 of microsoft/phi-4: AutoModel's TP validation fails after "
        "launch"
    )
    assert tp.fix == "use tp_size in {1, 2}"  # 5 and 10 divide the heads but not the 8 GPUs
    assert report.model_source == f"the Hugging Face cache ({cached})"
    assert validate_config(block, world_size=40, model=PHI4).findings[0].fix == "use tp_size in {1, 2, 5, 10}"
    assert validate_config(block, nodes=5, gpus_per_node=8, model=PHI4).findings[0].fix == "use tp_size in {1, 2}"
    assert no_network.tried == []


def test_a_revision_reads_its_own_snapshot(hub: Hub, hf_home: Path, no_network: Guard) -> None:
    cfg = json.loads(CONFIGS[PHI4].read_text())
    hub.put("acme/phi-like", cfg)
    hub.put("acme/phi-like", cfg | {"num_key_value_heads": 8}, revision="v2")
    hub.download("acme/phi-like")
    hub.download("acme/phi-like", revision="v2")
    no_network.arm()
    assert (hf_home / "hub" / "models--acme--phi-like" / "refs" / "v2").is_file()
    assert resolve("acme/phi-like").spec.num_key_value_heads == 10
    assert resolve("acme/phi-like", revision="v2").spec.num_key_value_heads == 8
    recipe = "model:\n  pretrained_model_name_or_path: acme/phi-like\n  revision: {rev}\ndistributed:\n  tp_size: 4\n"
    assert not validate_config(recipe.format(rev="v2"), world_size=8).errors
    assert _rules(validate_config(recipe.format(rev="main"), world_size=8))["tp-heads"]
    with pytest.raises(ModelConfigError, match="not in the Hugging Face cache"):
        resolve("acme/phi-like", revision="v3")
    # a catalog model at a revision the cache lacks: the catalog's dims, and the report says so
    assert resolve("meta-llama/Llama-3.1-8B", revision="v2").describe() == (
        "the built-in catalog (revision v2 is not in the Hugging Face cache)"
    )


def test_qwen3_next_tp2_is_the_error_automodel_raises(hub: Hub, hf_home: Path, no_network: Guard) -> None:
    hub.put(QWEN3_NEXT, CONFIGS[QWEN3_NEXT])
    hub.download(QWEN3_NEXT)
    no_network.arm()
    report = validate_config({"tp_size": 2, "ep_size": 1}, world_size=8, model=QWEN3_NEXT)
    cap = _rules(report)["model-capability"]
    assert cap.message == (
        "tp_size=2: AutoModel 0.7.0 builds Qwen/Qwen3-Next-80B-A3B-Thinking with AutoModel's own Qwen3NextForCausalLM "
        "(nemo_automodel.components.models.qwen3_next.model) and raises 'Tensor parallelism (tp_size=2) requested but "
        "Qwen3NextForCausalLM has no TP plan' right after building it, after launch"
    )
    assert cap.path == "tp_size" and not report.valid
    assert validate_config({"ep_size": 8}, world_size=8, model=QWEN3_NEXT).valid  # what it does shard
    assert no_network.tried == []


def test_gemma4_vlm_recipe_as_automodel_ships_it(hub: Hub, hf_home: Path, no_network: Guard) -> None:
    """tp 4 x pp 2 on 8 GPUs: AutoModel runs it (its VLM pipeline forward for gemma4, the tie lost under meta init),
    so it is VALID with the untied-head warning; tp 8 fails its Gemma-4 parallelizer on the global layers' 4 KV
    heads."""
    hub.put(GEMMA4, CONFIGS[GEMMA4])
    hub.download(GEMMA4)
    no_network.arm()
    report = validate_config(GEMMA4_RECIPE, world_size=8)
    assert report.valid, [f.message for f in report.errors]
    assert [f.rule for f in report.warnings] == ["pp-tied-embeddings"]
    assert report.model_source.startswith("the Hugging Face cache")
    tp8 = validate_config(GEMMA4_RECIPE, world_size=8, overrides=["distributed.tp_size=8", "distributed.pp_size=1"])
    heads = _rules(tp8)["tp-heads"]
    assert heads.message == (
        "tp_size=8 does not divide every layer's (attention, KV) heads of google/gemma-4-31B-it [(32, 4), (32, 16)]: "
        "AutoModel's Gemma4ModelParallelizer raises 'Gemma4 TP requires every layer attention head count to be "
        "divisible by tp_size; got incompatible_head_counts=[(32, 4)], tp_size=8.' when it parallelizes the model, "
        "after launch"
    )
    assert heads.fix == "use tp_size in {1, 2, 4}"
    quantized = GEMMA4_RECIPE + "quantization:\n  load_in_4bit: true\n"
    assert _rules(validate_config(quantized, world_size=8))["pp-tied-embeddings"].severity == "error"
    assert no_network.tried == []


def test_nothing_is_downloaded_without_fetch_config_and_the_summary_says_so(hub: Hub, hf_home: Path) -> None:
    hub.put(QWEN3_NEXT, CONFIGS[QWEN3_NEXT])
    block = hf_home.parent / "block.yaml"
    block.write_text("distributed:\n  tp_size: 2\n")
    env = {"HF_HOME": str(hf_home), "HF_ENDPOINT": hub.url}
    done = _cli(["validate", str(block), "--world-size", "8", "--model", QWEN3_NEXT], env)
    assert done.returncode == 0, done.stderr
    assert (
        "VALID: 0 error(s), 1 warning(s); world_size=8 (argument); model-aware checks NOT run: the model given "
        "cannot be resolved (unknown model 'Qwen/Qwen3-Next-80B-A3B-Thinking': not a config.json path, not in the "
        "Hugging Face cache" in done.stdout
    )
    assert hub.requests == []
    strict = _cli(["validate", str(block), "--world-size", "8", "--model", QWEN3_NEXT, "--strict"], env)
    assert strict.returncode == 1 and "--strict" in strict.stderr
    assert hub.requests == []

    fetched = _cli(
        ["validate", str(block), "--world-size", "8", "--model", QWEN3_NEXT, "--fetch-config", "--json"], env
    )
    assert fetched.returncode == 1, fetched.stderr
    report = json.loads(fetched.stdout)
    assert "model-capability" in {f["rule"] for f in report["findings"]}
    assert report["model_source"] == f"config.json downloaded from the Hub ({QWEN3_NEXT}@main)"
    files = [r for r in hub.requests if "/resolve/" in r]  # (huggingface_hub also asks for /api/agent-harnesses)
    assert files and all(r.endswith("/config.json") for r in files)  # config.json alone, no weights
    seen = len(hub.requests)

    offline = _cli(
        ["validate", str(block), "--world-size", "8", "--model", QWEN3_NEXT, "--json"], env | {"HF_HUB_OFFLINE": "1"}
    )
    assert offline.returncode == 1
    assert json.loads(offline.stdout)["model_source"].startswith("the Hugging Face cache (")
    assert len(hub.requests) == seen


def test_offline_and_missing_entries_are_findings(hub: Hub, hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("automodel_dist.catalog.sources.offline", lambda: True)
    report = validate_config({"tp_size": 2}, world_size=8, model="acme/not-cached", fetch_config=True)
    assert "HF_HUB_OFFLINE is set: config.json of acme/not-cached cannot be downloaded" in report.findings[0].message
    assert report.model_checks_skipped and report.valid
    monkeypatch.undo()
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setattr("huggingface_hub.constants.ENDPOINT", hub.url)
    monkeypatch.setattr(
        "huggingface_hub.constants.HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    missing = validate_config({"tp_size": 2}, world_size=8, model="acme/missing", fetch_config=True)
    assert missing.findings[0].rule == "model-unknown"
    assert "could not download config.json of acme/missing" in missing.findings[0].message
    assert any("acme/missing" in r for r in hub.requests)


@pytest.mark.parametrize(
    "content,said",
    [
        (b"{not json", "cannot read model config"),
        (b"[1, 2, 3]", "model config"),
        (b'{"hidden_size": 64}', "num_attention_heads"),
        (b"[" * 600_000 + b"]" * 600_000, "over the"),
    ],
    ids=["corrupt", "a-list", "not-a-model", "huge"],
)
def test_a_bad_cached_config_is_a_clear_finding(hub: Hub, hf_home: Path, content: bytes, said: str) -> None:
    hub.put("acme/bad", b"{}")
    path = hub.download("acme/bad")
    path.resolve().write_bytes(content)  # the blob the snapshot links to
    if said == "over the":
        assert len(content) > MAX_CONFIG_BYTES
    given = validate_config({"tp_size": 2}, world_size=8, model="acme/bad")
    assert given.findings[0].rule == "model-unknown" and said in given.findings[0].message
    named = validate_config(
        "model:\n  pretrained_model_name_or_path: acme/bad\ndistributed:\n  tp_size: 2\n", world_size=8
    )
    assert named.model_checks_skipped and said in named.model_checks_skipped
    block = hf_home.parent / "block.yaml"
    block.write_text("distributed:\n  tp_size: 2\n")
    done = _cli(["validate", str(block), "--world-size", "8", "--model", "acme/bad"], {"HF_HOME": str(hf_home)})
    assert done.returncode == 0 and "Traceback" not in done.stderr and said in done.stdout
    assert "model-aware checks NOT run" in done.stdout


def test_estimate_suggest_and_dry_run_plan_read_the_cache_without_network(
    hub: Hub, hf_home: Path, no_network: Guard
) -> None:
    from automodel_dist.dry_run.plan import plan_dry_run
    from automodel_dist.estimate import estimate_memory
    from automodel_dist.suggest import suggest_strategy

    hub.put(QWEN3_NEXT, CONFIGS[QWEN3_NEXT])
    hub.download(QWEN3_NEXT)
    no_network.arm()
    where = "the Hugging Face cache ("
    est = estimate_memory({"ep_size": 8}, model=QWEN3_NEXT, world_size=8, seq_len=4096)
    assert est.model_source.startswith(where) and est.model == QWEN3_NEXT
    rep = suggest_strategy(QWEN3_NEXT, nodes=1, gpus_per_node=8, seq_len=4096, top_k=1)
    assert rep.model_source.startswith(where)
    assert all(c.layout.tp == 1 for c in rep.candidates)  # its class has no TP plan
    plan = plan_dry_run(Request.of({"ep_size": 8}, world_size=8, model=QWEN3_NEXT, seq_len=4096))
    assert plan.model_source.startswith(where)
    with pytest.raises(ValueError, match="Hugging Face cache"):
        suggest_strategy("acme/not-anywhere", nodes=1, gpus_per_node=8)
    assert no_network.tried == []


@pytest.mark.parametrize("repo", sorted(CONFIGS))
def test_the_reader_agrees_with_transformers_autoconfig(repo: str) -> None:
    """transformers' AutoConfig (the oracle here; the engine stays free of it) reads the same dims."""
    transformers = pytest.importorskip("transformers")
    data = json.loads(CONFIGS[repo].read_text())
    config = transformers.AutoConfig.for_model(**data)
    text = config.get_text_config()
    ours = resolve(CONFIGS[repo]).spec
    assert ours.architecture == config.architectures[0]
    assert ours.hidden_size == text.hidden_size and ours.num_layers == text.num_hidden_layers
    assert ours.vocab_size == text.vocab_size and ours.tie_word_embeddings == bool(text.tie_word_embeddings)
    layers = getattr(text, "per_layer_config", None)  # transformers' heterogeneous configs (Gemma-4's global layers)
    if layers:
        assert {ours.num_attention_heads} == {layer.num_attention_heads for layer in layers}
        assert ours.kv_head_counts() == tuple(sorted({layer.num_key_value_heads for layer in layers}))
    else:
        assert ours.num_attention_heads == text.num_attention_heads
        assert ours.kv_head_counts() == (text.num_key_value_heads,)
    if repo == QWEN3_NEXT:
        kinds = text.layer_types
        assert ours.attention_layers == kinds.count("full_attention") == 12
        assert ours.num_experts == text.num_experts and ours.experts_per_token == text.num_experts_per_tok


def test_a_model_folder_named_as_a_string_is_read(tmp_path: Path, hf_home: Path) -> None:
    folder = tmp_path / "phi-4"
    folder.mkdir()
    (folder / "config.json").write_bytes(CONFIGS[PHI4].read_bytes())
    src = resolve(str(folder))
    assert (src.source, src.where) == ("config.json", str(folder / "config.json"))
    assert (
        _rules(validate_config({"tp_size": 4}, world_size=8, model=str(folder)))["tp-heads"].fix
        == "use tp_size in {1, 2}"
    )


@pytest.mark.parametrize(
    "config,said",
    [
        ({"layer_types": [[1], [2]]}, None),  # not a layer kind: read as uniform layers, no crash
        ({"vision_config": {"hidden_size": 10**200, "num_hidden_layers": 2}}, "must be an integer"),
    ],
    ids=["unhashable-layer-types", "huge-vision-tower"],
)
def test_odd_fields_are_findings_not_tracebacks(config: dict, said: str | None) -> None:
    base = json.loads(CONFIGS[PHI4].read_text())
    data = (
        {"architectures": base["architectures"], "model_type": base["model_type"], "text_config": base}
        if ("vision_config" in config)
        else base
    )
    report = validate_config({"tp_size": 2}, world_size=8, model=data | config)
    skipped = [f for f in report.findings if f.rule == "model-unknown"]
    if said is None:
        assert not skipped and report.valid
    else:
        assert skipped and said in skipped[0].message


def test_a_damaged_cache_or_a_name_the_hub_refuses_is_a_finding(hf_home: Path) -> None:
    repo = hf_home / "hub" / "models--acme--broken"
    repo.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc")
    (repo / "snapshots").write_text("not a folder")
    report = validate_config({"tp_size": 2}, world_size=8, model="acme/broken")
    assert [f.rule for f in report.findings] == ["model-unknown"] and report.model_checks_skipped
    assert (
        "cannot read the Hugging Face cache entry of acme/broken: [Errno 20] Not a directory"
        in report.findings[0].message
    )
    for name in ("a--b/c", "acme/x..y", "acmé/model"):
        with pytest.raises(ModelConfigError, match="unknown model"):
            resolve(name, fetch=False)


def test_hf_hub_offline_forbids_the_download(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelConfigError, match="HF_HUB_OFFLINE is set"):
        resolve("acme/not-cached", fetch=True)


def test_a_config_json_a_recipe_names_obeys_the_allowed_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MCP server's --allowed-root covers every file read for a client, the one a recipe names too."""
    outside = tmp_path / "outside" / "config.json"
    outside.parent.mkdir()
    outside.write_bytes(CONFIGS[PHI4].read_bytes())
    (tmp_path / "root").mkdir()
    monkeypatch.setenv("AUTOMODEL_DIST_ALLOWED_ROOTS", str(tmp_path / "root"))
    recipe = f"model:\n  pretrained_model_name_or_path: {outside}\ndistributed:\n  tp_size: 4\n"
    report = validate_config(recipe, world_size=8)
    assert report.model_checks_skipped and "outside the allowed roots" in report.model_checks_skipped
    monkeypatch.delenv("AUTOMODEL_DIST_ALLOWED_ROOTS")
    assert "tp-heads" in _rules(validate_config(recipe, world_size=8))
