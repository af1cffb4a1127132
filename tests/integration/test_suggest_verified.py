"""suggest's top candidates measured by the dry run where AutoModel is installed (CLI and MCP default to 3; the
Python search itself stays pure and instant)."""

from __future__ import annotations

import json

import pytest

from automodel_dist import suggest_strategy
from automodel_dist.cli import main
from automodel_dist.dry_run import missing_packages
from automodel_dist.request import Request
from automodel_dist.verified import verify_candidates

needs_automodel = pytest.mark.skipif(bool(missing_packages()), reason="the dry run needs AutoModel installed")
L1B = "meta-llama/Llama-3.2-1B"


def test_the_python_search_measures_nothing():
    rep = suggest_strategy(L1B, nodes=1, seq_len=1024, top_k=2)
    assert rep.candidates and not any(c.measured for c in rep.candidates)


@needs_automodel
def test_the_first_candidates_are_measured_and_said(capsys):
    rep = suggest_strategy(L1B, nodes=1, gpus_per_node=8, seq_len=1024, top_k=3, strategies="fsdp2")
    first = rep.candidates[0].model_copy()
    out = verify_candidates(rep, Request.of(model=L1B), top=1)
    c = out.candidates[0]
    assert c.measured and c.measured_peak_gib and c.measured_fits is True
    # the dry run's allocated peak against the estimate's, within the error the verdict allows
    assert abs(c.measured_peak_gib - first.memory_gib.tracked_peak) <= 0.15 * c.measured_peak_gib + 0.5
    assert not out.candidates[1].measured  # only the first was asked for
    argv = ["suggest", "--model", L1B, "--nodes", "1", "--seq-len", "1024", "--top", "2", "--strategy", "fsdp2"]
    assert main([*argv, "--verify", "1"]) == 0
    text = capsys.readouterr().out
    assert "#1  " in text and "MEASURED by the dry run" in text.split("#2")[0] and "MEASURED" not in text.split("#2")[1]
    assert main(["suggest", "--model", L1B, "--nodes", "1", "--top", "1", "--verify", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["candidates"][0]["measured"] is False


@needs_automodel
def test_a_layout_the_dry_run_cannot_measure_says_why():
    rep = suggest_strategy(L1B, nodes=1, gpus_per_node=8, seq_len=1024, top_k=1, strategies="ddp")
    c = verify_candidates(rep, Request.of(model=L1B), top=1).candidates[0]
    assert not c.measured and c.measured_note and "DDP" in c.measured_note
