"""The MCP server: every tool in-process (incl. progress and cancellation), stdio and HTTP transports,
and a real external client (MCP Inspector's CLI, when Node is present)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from automodel_dist.mcp_server import NAME, create_server
from support.mcp_client import call, run
from support.paths import EXAMPLES, ROOT
from support.session import own_processes, own_tag, still_running, wait_for_port

EXAMPLE = EXAMPLES / "qwen3_moe_30b_te_chat_thd.yaml"


def survivors() -> list[str]:
    return own_processes("automodel_dist.smoke")


def test_tools_annotations_and_schemas():
    async def go():
        async with Client(create_server()) as c:
            assert c.server_info.name == NAME
            return (await c.list_tools()).tools

    tools = {t.name: t for t in run(go)}
    assert set(tools) == {
        "validate_config",
        "build_mesh",
        "suggest_strategy",
        "estimate_memory",
        "run_smoke_test",
        "dry_run",
        "explain_error",
        "list_models",
    }
    for name, tool in tools.items():
        assert tool.annotations.read_only_hint is (name != "run_smoke_test"), name
        assert tool.output_schema, f"{name} has no output schema"
        assert tool.description
    props = tools["validate_config"].input_schema["properties"]
    assert props["world_size"]["anyOf"][0]["maximum"] == 1 << 24
    assert tools["run_smoke_test"].input_schema["properties"]["world_size"]["anyOf"][0]["maximum"] == 64


def test_validate_config_returns_findings_not_errors():
    r = call(
        "validate_config",
        {"config_yaml": "distributed:\n  tp_size: 3\n", "world_size": 8, "model": "meta-llama/Llama-3.1-8B"},
    )
    assert not r.is_error
    report = r.structured_content
    assert report["valid"] is False
    assert [(f["rule"], f["line"]) for f in report["findings"]] == [("world-not-divisible", 2), ("tp-heads", 2)]
    on_215 = call("validate_config", {"config_yaml": "tp_size: 2\n", "world_size": 8, "torch_version": "2.15.0"})
    assert [f["rule"] for f in on_215.structured_content["findings"]] == ["torch-version"]
    bad_yaml = call("validate_config", {"config_yaml": "a: [\n"})
    assert not bad_yaml.is_error and bad_yaml.structured_content["findings"][0]["rule"] == "yaml-syntax"


def test_config_path_is_checked(tmp_path, monkeypatch):
    ok = call("validate_config", {"config_path": str(EXAMPLE)})
    assert ok.structured_content["valid"] and ok.structured_content["world_size"] == 16
    d = call("validate_config", {"config_path": str(tmp_path)})
    assert d.structured_content["findings"][0]["rule"] == "file-unreadable"
    monkeypatch.setenv("AUTOMODEL_DIST_ALLOWED_ROOTS", str(tmp_path))
    outside = call("validate_config", {"config_path": str(EXAMPLE)})
    assert outside.structured_content["findings"][0]["rule"] == "file-not-allowed"
    inside = tmp_path / "r.yaml"
    inside.write_text("tp_size: 2\n")
    assert call("validate_config", {"config_path": str(inside), "world_size": 2}).structured_content["valid"]


def test_model_paths_obey_the_allowed_roots(tmp_path, monkeypatch):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
                "num_hidden_layers": 32,
                "intermediate_size": 14336,
                "vocab_size": 128256,
            }
        )
    )
    ok = call("validate_config", {"config_yaml": "tp_size: 3\n", "world_size": 3, "model": str(cfg)})
    assert "tp-heads" in {f["rule"] for f in ok.structured_content["findings"]}
    monkeypatch.setenv("AUTOMODEL_DIST_ALLOWED_ROOTS", str(tmp_path / "elsewhere"))
    refused = call("validate_config", {"config_yaml": "tp_size: 2\n", "world_size": 2, "model": str(cfg)})
    assert [f["rule"] for f in refused.structured_content["findings"]] == ["file-not-allowed"]
    est = call("estimate_memory", {"config_yaml": "tp_size: 2\n", "world_size": 2, "model": str(cfg)})
    assert [f["rule"] for f in est.structured_content["findings"]] == ["file-not-allowed"]
    refused_suggest = call("suggest_strategy", {"model": str(cfg)})
    assert refused_suggest.is_error and str(cfg) in refused_suggest.content[0].text
    dev = call("validate_config", {"config_yaml": "tp_size: 2\n", "world_size": 2, "model": "/dev/zero.json"})
    assert dev.structured_content["findings"][0]["rule"] == "file-unreadable"


def test_bad_arguments_are_error_results_and_the_server_keeps_serving():
    async def go():
        async with Client(create_server()) as c:
            results = [
                await c.call_tool("validate_config", {"world_size": "eight", "config_yaml": "tp_size: 2"}),
                await c.call_tool("validate_config", {}),
                await c.call_tool("validate_config", {"config_yaml": "x" * (2 << 20)}),
                await c.call_tool("build_mesh", {"config_yaml": "tp_size: 2"}),  # world_size missing
                await c.call_tool("explain_error", {"text": 42}),
                await c.call_tool("suggest_strategy", {"model": "no/such-model"}),
            ]
            still = await c.call_tool("validate_config", {"config_yaml": "tp_size: 2", "world_size": 2})
            return results, still

    results, still = run(go)
    assert all(r.is_error for r in results)
    assert still.structured_content["valid"] is True
    # the engine's own refusals reach the agent with their reason (not the SDK's bare "Error executing tool")
    assert "give the config as config_yaml (YAML text) or config_path" in results[1].content[0].text
    assert (
        "unknown model 'no/such-model': not a config.json path, not in the Hugging Face cache"
        in results[5].content[0].text
    )


def test_build_mesh_tool():
    ok = call(
        "build_mesh", {"config_yaml": "tp_size: 2\ncp_size: 2\n", "world_size": 8, "ranks": [5], "gpus_per_node": 4}
    )
    mesh = ok.structured_content["mesh"]
    assert ok.structured_content["valid"] and mesh["device_mesh"]["shape"] == [1, 1, 2, 2, 2]
    assert mesh["rank_groups"]["5"]["tp"] == [4, 5] and "node 1" in mesh["picture"]
    by_nodes = call(
        "build_mesh", {"config_yaml": "tp_size: 2\ncp_size: 2\n", "nodes": 2, "gpus_per_node": 4, "ranks": [5]}
    )
    assert by_nodes.structured_content == ok.structured_content
    unknown = call("build_mesh", {"config_yaml": "tp_size: 2\n", "nodes": 2})
    assert unknown.is_error and "the world size is unknown" in unknown.content[0].text
    bad = call("build_mesh", {"config_yaml": "tp_size: 3\n", "world_size": 8})
    assert (
        bad.structured_content["valid"] is False
        and bad.structured_content["findings"][0]["rule"] == "world-not-divisible"
    )


def test_suggest_estimate_explain_list_models():
    # verify 0: the candidates measured by the dry run are docs/mcp.md's verify row (test_readme_tool_arguments_work)
    s = call("suggest_strategy", {"model": "meta-llama/Llama-3.1-8B", "nodes": 1, "top_k": 2, "verify": 0})
    assert len(s.structured_content["candidates"]) == 2
    assert s.structured_content["candidates"][0]["yaml"].startswith("distributed:")
    assert not any(c["measured"] for c in s.structured_content["candidates"])
    e = call("estimate_memory", {"model": "Qwen/Qwen3-30B-A3B", "config_path": str(EXAMPLE)})
    assert e.structured_content["valid"] and e.structured_content["estimate"]["fits"]
    from_recipe = call("estimate_memory", {"config_path": str(EXAMPLE)})  # the recipe names its model
    assert from_recipe.structured_content == e.structured_content
    e_bad = call("estimate_memory", {"model": "meta-llama/Llama-3.1-8B", "config_yaml": "tp_size: 3", "world_size": 8})
    assert e_bad.structured_content["valid"] is False
    x = call(
        "explain_error",
        {
            "text": "Traceback ...\nValueError: `pp_size=2` (> 1) enables pipeline parallelism "
            "but no `distributed.pipeline` block was provided."
        },
    )
    assert x.structured_content["matches"][0]["rule"] == "pipeline-missing"
    slow = call(
        "estimate_memory",
        {
            "model": "meta-llama/Llama-3.1-8B",
            "config_yaml": "tp_size: 2",
            "nodes": 2,
            "gpus_per_node": 8,
            "inter_gbps": 12.5,
            "memory_gib": 40,
            "headroom": 0.2,
        },
    )
    est = slow.structured_content["estimate"]
    assert (est["inter_gbps"], est["intra_gbps"], est["gpu_memory_gib"], est["headroom"]) == (12.5, 450.0, 40.0, 0.2)
    s2 = call("suggest_strategy", {"model": "meta-llama/Llama-3.1-8B", "top_k": 1, "intra_gbps": 900, "verify": 0})
    assert s2.structured_content["intra_gbps"] == 900.0
    from_recipe = call("suggest_strategy", {"config_path": str(EXAMPLE), "top_k": 1, "verify": 0})
    assert from_recipe.structured_content["model"] == "Qwen/Qwen3-30B-A3B"
    assert from_recipe.structured_content["current"]["valid"] and from_recipe.structured_content["world_size"] == 16
    mf = call(
        "suggest_strategy",
        {"model": "meta-llama/Llama-3.1-70B", "nodes": 2, "strategies": ["megatron_fsdp"], "verify": 0},
    )
    assert mf.structured_content["strategies"] == ["megatron_fsdp"] and mf.structured_content["candidates"]
    assert {c["distributed"]["strategy"] for c in mf.structured_content["candidates"]} == {"megatron_fsdp"}
    for bad_strategies in ([], ["zero3"]):
        refused = call("suggest_strategy", {"model": "meta-llama/Llama-3.1-8B", "strategies": bad_strategies})
        assert refused.is_error and "strategies" in refused.content[0].text
    m = call("list_models", {})
    assert any(x["name"] == "deepseek-ai/DeepSeek-V3" for x in m.structured_content["models"])
    assert any(x["name"] == "H100-80GB" for x in m.structured_content["gpus"])


def test_run_smoke_test_reports_progress():
    seen = []

    async def progress(p, total, message):
        seen.append((p, message))

    # the progress machinery is the launcher's, the same on both stacks: the tiny one is the quicker to run
    args = {"world_size": 2, "tp": 2, "precision": "fp32", "stack": "tiny"}
    r = call("run_smoke_test", args, progress_callback=progress)
    assert not r.is_error and r.structured_content["passed"]
    counts = [p for p, _ in seen]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)  # strictly increasing
    messages = " ".join(m for _, m in seen)
    assert "launch" in messages and "step 3/3" in messages and "done" in messages


def test_dry_run_reports_progress_and_cancels_its_processes():
    """dry_run over MCP: progress per phase and rank; a cancelled call leaves no worker process behind."""
    pytest.importorskip("nemo_automodel")
    seen = []

    async def progress(p, total, message):
        seen.append(message)

    args = {
        "config_yaml": "distributed: {}\n",
        "world_size": 8,
        "model": "meta-llama/Llama-3.2-1B",
        "num_layers": 2,
        "seq_len": 128,
    }
    r = call("dry_run", args, progress_callback=progress)
    assert not r.is_error and r.structured_content["status"] == "measured"
    assert any(m.startswith("build") for m in seen) and any(m.startswith("backward") for m in seen)

    def workers() -> list[str]:  # this test's: a test on another worker may be running a dry run meanwhile
        return own_processes("automodel_dist.dry_run.worker", "automodel_dist.dry_run.launcher", tag=tag)

    async def go():
        async with Client(create_server()) as c:
            started = anyio.Event()

            async def on_progress(p, total, message):
                if message.startswith("import"):
                    started.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: c.call_tool("dry_run", args, progress_callback=on_progress))
                with anyio.fail_after(120):
                    await started.wait()
                assert workers()
                tg.cancel_scope.cancel()

    with own_tag() as tag:
        run(go)
    assert still_running("automodel_dist.dry_run.worker", "automodel_dist.dry_run.launcher", tag=tag) == []


def _run_dirs() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("automodel-dist-smoke-*")}


def test_cancelling_run_smoke_test_kills_its_ranks():
    before = _run_dirs()

    async def go():
        async with Client(create_server()) as c:
            started = anyio.Event()

            async def progress(p, total, message):
                if message.startswith("step"):
                    started.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    lambda: c.call_tool(
                        "run_smoke_test",
                        {"world_size": 2, "steps": 20, "precision": "fp32", "fault": "hang@1:2", "stack": "tiny"},
                        progress_callback=progress,
                    )
                )
                with anyio.fail_after(120):
                    await started.wait()
                assert survivors()
                tg.cancel_scope.cancel()
            again = await c.call_tool("validate_config", {"config_yaml": "tp_size: 2", "world_size": 2})
            return again

    again = run(go)
    deadline = time.time() + 15
    while survivors() and time.time() < deadline:
        time.sleep(0.2)
    assert survivors() == []
    assert again.structured_content["valid"]
    deadline = time.time() + 15
    while _run_dirs() - before and time.time() < deadline:
        time.sleep(0.2)
    assert _run_dirs() - before == set()  # the run directory is removed too


def test_stdio_subprocess_server():
    async def go():
        t = time.perf_counter()
        params = StdioServerParameters(command=sys.executable, args=["-m", "automodel_dist.serve"])
        async with Client(params) as c:
            tools = await c.list_tools()
            elapsed = time.perf_counter() - t
            r = await c.call_tool("validate_config", {"config_yaml": "tp_size: 2\n", "world_size": 4})
            return tools, r, elapsed

    tools, r, elapsed = run(go)
    assert len(tools.tools) == 8 and r.structured_content["valid"]
    assert elapsed < 20  # the bench measures start-up precisely; this only guards against hangs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_http_transport_loopback_with_dns_rebinding_protection():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "automodel_dist.cli", "serve", "--transport", "http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        wait_for_port(port, proc)

        async def go():
            async with Client(url) as c:
                r = await c.call_tool("validate_config", {"config_yaml": "tp_size: 2", "world_size": 2})
                return r.structured_content["valid"]

        assert run(go)
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
        req = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={
                "Host": "evil.example.com",
                "Content-Type": "application/json",
                "Accept": "application/json, text/event-stream",
            },
        )
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=10)
        assert err.value.code in (403, 421)
        # the listener is on loopback only
        assert all(c.laddr.ip == "127.0.0.1" for c in _listeners(proc.pid, port)) if _psutil() else True
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _psutil():
    try:
        import psutil  # noqa: F401
    except ImportError:
        return False
    return True


def _listeners(pid: int, port: int):
    import psutil

    return [c for c in psutil.Process(pid).net_connections() if c.laddr.port == port]


INSPECTOR = ["npx", "-y", "-p", "node@22", "-p", "@modelcontextprotocol/inspector@2.12.0", "mcp-inspector", "--cli"]


@pytest.mark.node
@pytest.mark.skipif(shutil.which("npx") is None, reason="Node.js (npx) is not installed")
def test_mcp_inspector_cli_lists_and_calls_tools():
    server = [sys.executable, "-m", "automodel_dist.serve"]  # what automodel-dist-mcp runs
    env = dict(os.environ, npm_config_loglevel="error")
    listed = subprocess.run(
        INSPECTOR + server + ["--method", "tools/list"], capture_output=True, text=True, timeout=600, env=env
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    names = {t["name"] for t in json.loads(listed.stdout)["tools"]}
    assert {"validate_config", "build_mesh", "run_smoke_test"} <= names
    called = subprocess.run(
        INSPECTOR
        + server
        + [
            "--method",
            "tools/call",
            "--tool-name",
            "validate_config",
            "--tool-arg",
            "config_yaml=tp_size: 3",
            "--tool-arg",
            "world_size=8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert called.returncode == 0, called.stderr[-2000:]
    result = json.loads(called.stdout)
    report = result.get("structuredContent") or json.loads(result["content"][0]["text"])
    assert report["valid"] is False and report["findings"][0]["rule"] == "world-not-divisible"


def _readme_tool_examples() -> list[tuple[str, dict]]:
    """The `tools/call` arguments table of docs/mcp.md, one (tool, arguments) per row."""
    import re

    rows = re.findall(r"^\| `(\w+)`[^|]*\| `(\{.*\})` \|$", (ROOT / "docs" / "mcp.md").read_text(), re.MULTILINE)
    return [(tool, json.loads(args)) for tool, args in rows]


def test_readme_tool_arguments_work():
    """Every row of docs/mcp.md's MCP arguments table is a real call that succeeds (its placeholder recipe path
    replaced by a real recipe)."""
    examples = _readme_tool_examples()
    assert {t for t, _ in examples} == {
        "validate_config",
        "build_mesh",
        "suggest_strategy",
        "estimate_memory",
        "run_smoke_test",
        "dry_run",
        "explain_error",
        "list_models",
    }
    recipe = str(EXAMPLES / "llama3_1_8b_hellaswag_pp.yaml")

    async def go():
        async with Client(create_server()) as c:
            out = []
            for tool, args in examples:
                if args.get("config_path") == "/abs/recipe.yaml":
                    args = {**args, "config_path": recipe}
                out.append((tool, args, await c.call_tool(tool, args)))
            return out

    for tool, args, result in run(go):
        assert not result.is_error, (tool, args, result.content)
        body = result.structured_content
        if tool in ("build_mesh", "estimate_memory"):
            assert body["valid"], (tool, args, body)
        if tool == "run_smoke_test":
            assert body["passed"], body
            if "config_path" in args:  # the recipe names its model: AutoModel's own stack ran
                assert body["stack"] == "automodel" and body["model_class"], body
        if tool == "dry_run":
            assert body["status"] == "measured", body
        if tool == "suggest_strategy" and args.get("verify") and importlib.util.find_spec("nemo_automodel"):
            measured = [c["measured"] for c in body["candidates"]]  # verify N: the first N measured by the dry run
            assert measured[: args["verify"]] == [True] * args["verify"] and not any(measured[args["verify"] :]), body
