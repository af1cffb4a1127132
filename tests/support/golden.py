"""The JSON every surface returns for the project's own configs, recorded so a refactor can prove it changed nothing.

``python tests/support/golden.py --write`` records one file per case under ``tests/golden/`` (``<kind>/<name>.json``,
holding the case's name and its output); ``tests/unit/test_golden.py`` recomputes every case and compares. A change in behaviour
that is intended re-records in the same commit, so the diff shows exactly which outputs changed, one file each.

Cases: the recipes under ``tests/examples`` and ``tests/calibration/recipes`` (validate at their own ``ci:`` world and
at 8 and 64 ranks, build_mesh, estimate_memory and suggest_strategy where they apply), every rule case of
``tests/unit/test_rules.py`` and every YAML block of the docs (``tests/integration/test_docs.py``; validate_config).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
OUT = TESTS / "golden"
# Outputs must not depend on this machine's Hugging Face cache (a cached config.json changes what a model name
# resolves to, and unknown-model messages name the cache): the tests and the recording point huggingface_hub at a
# folder that never exists (a fixed path: messages clip long names, so its length must not depend on the checkout);
# the tests that need a cache lay one out in a temporary HF_HOME.
NO_HF_CACHE = Path("/nonexistent-automodel-dist-hf-cache")
RECIPES = sorted((TESTS / "examples").glob("*.yaml")) + sorted((TESTS / "calibration" / "recipes").glob("*.yaml"))


def _dump(value: Any) -> Any:
    # The checkout's own path is not behaviour: CI clones the repository somewhere else.
    return json.loads(value.model_dump_json().replace(json.dumps(str(ROOT))[1:-1], "<repo>"))


def _guard(fn: Callable[[], Any]) -> Any:
    """The JSON of a call, or the error it raised (the error is part of the behaviour)."""
    try:
        return _dump(fn())
    except ValueError as exc:  # ConfigError included
        return {"raised": type(exc).__name__, "message": str(exc).replace(str(ROOT), "<repo>")}


def cases() -> Iterator[tuple[str, Callable[[], Any]]]:
    from automodel_dist import build_mesh, estimate_memory, suggest_strategy, validate_config

    for path in RECIPES:
        name = f"{path.parent.name}/{path.name}"
        yield f"validate:{name}", lambda p=path: _guard(lambda: validate_config(p))
        for world in (8, 64):
            yield f"validate:{name}@{world}", lambda p=path, w=world: _guard(lambda: validate_config(p, world_size=w))
        yield f"mesh:{name}", lambda p=path: _guard(lambda: build_mesh(p, ranks=[0], gpus_per_node=8))
        yield (
            f"mesh:{name}@64",
            lambda p=path: _guard(lambda: build_mesh(p, ranks=[0, 63], world_size=64, gpus_per_node=8)),
        )
        yield f"estimate:{name}", lambda p=path: _guard(lambda: estimate_memory(p))
        yield f"estimate:{name}@64", lambda p=path: _guard(lambda: estimate_memory(p, world_size=64, gpus_per_node=8))
        yield f"suggest:{name}", lambda p=path: _guard(lambda: suggest_strategy(config=p, top_k=3))
    # the rule table and the docs' blocks are defined with the tests that check them (under pytest they are already
    # imported under these names: the same modules are reused)
    sys.path[:0] = [str(TESTS), str(TESTS / "unit"), str(TESTS / "integration")]
    import test_rules

    for case in test_rules.CASES:
        yield f"rule:{case.id}", lambda t=case.text, k=case.kwargs: _guard(lambda: validate_config(t, **k))
    import test_docs

    for block in test_docs.YAML_BLOCKS:  # keyed by file and text: moving a block in its page changes nothing
        kwargs = test_docs._kwargs(block.check)
        key = f"doc:{block.where.split(':')[0]}:{hashlib.sha1(block.text.encode()).hexdigest()[:10]}"
        yield key, lambda b=block, k=kwargs: _guard(lambda: validate_config(b.text, **k))


def compute() -> dict[str, Any]:
    return {name: fn() for name, fn in cases()}


def path_of(name: str) -> Path:
    """Where a case is recorded: ``validate:examples/a.yaml@8`` -> ``validate/examples/a.yaml@8.json``."""
    kind, rest = name.split(":", 1)
    return OUT / kind / (rest.replace(":", "/") + ".json")


def recorded() -> dict[str, Any]:
    """Every recorded case, by name."""
    out = {}
    for path in sorted(OUT.rglob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        out[data["case"]] = data["output"]
    return out


def write(outputs: dict[str, Any]) -> None:
    for old in OUT.rglob("*.json"):
        old.unlink()
    for name, output in outputs.items():
        path = path_of(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"case": name, "output": output}, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for folder in sorted((p for p in OUT.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/support/golden.py --write")
    os.environ["HF_HUB_CACHE"] = str(NO_HF_CACHE)
    outputs = compute()
    write(outputs)
    print(f"wrote {len(outputs)} cases under {OUT}")
