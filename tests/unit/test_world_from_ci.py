"""The world size from a recipe's ci: block completed by --gpus-per-node or --nodes given alone, the same in every
tool (validate, mesh, estimate, suggest, the dry run's plan, the CLI)."""

from __future__ import annotations

import pytest

from automodel_dist import build_mesh, estimate_memory, suggest_strategy, validate_config
from automodel_dist.cli import main
from automodel_dist.dry_run.plan import plan_dry_run
from automodel_dist.request import Request

RECIPE = (
    "model:\n  pretrained_model_name_or_path: meta-llama/Llama-3.1-8B\n"
    "distributed:\n  tp_size: 2\n"
    "dataset:\n  seq_length: 1024\n"
    "ci:\n  nodes: 4\n"
)


@pytest.mark.parametrize(
    "kw,world,nodes,gpn",
    [
        ({}, 32, 4, 8),  # ci: alone, 8 per node by default
        ({"gpus_per_node": 4}, 16, 4, 4),  # the argument completes ci.nodes
        ({"nodes": 2}, 16, 2, 8),  # ... or ci's GPUs per node
        ({"nodes": 2, "gpus_per_node": 2}, 4, 2, 2),  # both given: the arguments
        ({"world_size": 8}, 8, None, None),
    ],
)
def test_validate_reads_the_ci_block_with_one_argument(kw, world, nodes, gpn):
    report = validate_config(RECIPE, **kw)
    assert report.valid and report.world_size == world
    if gpn is not None:
        assert report.gpus_per_node == gpn
    info = [f.message for f in report.findings if f.rule == "world-from-ci"]
    if "world_size" in kw or len(kw) == 2:
        assert not info
    else:
        assert info and f"world_size {world}" in info[0]
        assert ("from the arguments" in info[0]) == bool(kw)


def test_every_tool_sizes_the_same_world():
    assert build_mesh(RECIPE, gpus_per_node=4).world_size == 16
    assert estimate_memory(RECIPE, gpus_per_node=4).world_size == 16
    plan = plan_dry_run(Request.of(RECIPE, gpus_per_node=4), num_layers=2)
    assert plan.dims.world_size == 16
    rep = suggest_strategy(config=RECIPE, gpus_per_node=4, top_k=1)
    assert (rep.nodes, rep.gpus_per_node, rep.world_size) == (4, 4, 16)
    assert rep.from_recipe.get("nodes") == "ci.nodes" and "gpus_per_node" not in rep.from_recipe


def test_cli_estimate_with_gpus_per_node_alone(tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(RECIPE)
    assert main(["estimate", str(path), "--gpus-per-node", "4"]) in (0, 1)
    out = capsys.readouterr().out
    assert "on 16 x H100-80GB" in out and "world size is unknown" not in out


def test_the_request_keywords_are_the_parts_fields():
    """RequestFields and SmokeOptions (the keywords' types) name exactly the fields the requests route."""
    import dataclasses

    from automodel_dist.request import Request, RequestFields
    from automodel_dist.smoke.request import LAYOUT_KEYS, SmokeOptions, SmokeRequest

    parts = {f.name for part in dataclasses.fields(Request) for f in dataclasses.fields(part.default)}
    assert set(RequestFields.__annotations__) == parts - {"config"}
    own = {f.name for f in dataclasses.fields(SmokeRequest)} - {"base", "layout"}
    assert set(SmokeOptions.__annotations__) == own | set(LAYOUT_KEYS) | {"world_size", "overrides"}
    request = Request.of("distributed: {}\n", world_size=8, model="m", seq_len=64, gpu="B200")
    assert request.flat()["world_size"] == 8 and request.lookup.model == "m" and request.cluster.gpu == "B200"
    assert Request.of(request, nodes=2).cluster.nodes == 2 and request.cluster.nodes is None  # frozen: a copy
