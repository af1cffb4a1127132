"""Property-based fuzzing (a CI slice; bench/bench_fuzz.py runs >= 10,000 inputs with counts):
hypothesis-generated recipes, blocks, YAML text and mutations of real recipes through
validate_config / build_mesh / estimate_memory, random arguments through suggest_strategy and
explain_error, and malformed calls through the MCP server, which must keep serving."""

from __future__ import annotations

from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from automodel_dist.explain import explain_error
from support.fuzzing import check_input, check_suggest, inputs, mcp_calls, suggest_args

SLICE = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@SLICE
@given(inputs())
def test_configs_always_get_a_report(case: tuple[str, Any, dict[str, Any]]) -> None:
    check_input(*case)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(suggest_args())
def test_suggest_strategy_never_crashes(args: dict[str, Any]) -> None:
    check_suggest(args)


@SLICE
@given(
    st.one_of(
        st.text(max_size=400),
        st.sampled_from(
            [
                "ValueError: non_pp_size=8 must be a multiple of ep_size=3",
                "torch.OutOfMemoryError: CUDA out of memory",
                "(" * 5000,
                "\\" * 3000,
                "a" * 200_000 + "b",
            ]
        ),
    )
)
def test_explain_error_never_crashes(text: str) -> None:
    report = explain_error(text)
    assert all(m.rule and m.fix is not None for m in report.matches)


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.lists(mcp_calls(), min_size=25, max_size=25))
def test_mcp_server_survives_malformed_calls(calls: list[tuple[str, dict[str, Any]]]) -> None:
    from mcp import Client

    from automodel_dist.mcp_server import create_server

    async def go() -> None:
        async with Client(create_server()) as client:
            for tool, args in calls:
                try:
                    r = await client.call_tool(tool, args)
                except Exception as exc:  # noqa: BLE001 - an unknown tool is a protocol error, nothing else
                    assert tool == "no_such_tool", (tool, args, exc)
                    continue
                assert r.is_error or r.structured_content is not None, (tool, args)
            ok = await client.call_tool("validate_config", {"config_yaml": "tp_size: 2\n", "world_size": 2})
            assert ok.structured_content["valid"]

    anyio.run(go)
