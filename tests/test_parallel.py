"""Trials of several ranks under DDP and FSDP2, on the CPU with gloo: spaces, searches, failing ranks, the snippet under torchrun."""

import json
import os
import subprocess
import sys

import pytest

from autocompile.cli import main
from autocompile.trial import TrialRequest, run_trial
from autocompile.space import EAGER
from conftest import FAST, ROOT, toy

# The dimensions a test leaves free are the strategy's own; the rest at plain torch.compile's values.
PINNED = {"mode": "default", "dynamic": None, "fullgraph": False, "padding": "longest", "mark_dynamic": "off",
          "inductor.shape_padding": True, "inductor.epilogue_fusion": True, "inductor.aggressive_fusion": False,
          "compiled_autograd": False, "compile_optimizer": False, "fused_optimizer": False, "compile_loss": False}


def _space(capsys, *flags) -> dict:
    assert main(["space", "--model", toy(), "--device", "cpu", "--json", *flags]) == 0
    return {d["name"]: d["choices"] for d in json.loads(capsys.readouterr().out)["dimensions"]}


def test_the_strategies_dimensions_exist_only_under_parallel(capsys):
    single = _space(capsys)
    ddp = _space(capsys, "--parallel", "ddp", "--nproc", "2")
    fsdp2 = _space(capsys, "--parallel", "fsdp2", "--nproc", "2")
    assert not {"optimize_ddp", "fsdp_compile_order", "reshard_after_forward"} & set(single)
    assert {k: v for k, v in ddp.items() if k != "optimize_ddp"} == single  # the rest unchanged
    assert "ddp_optimizer" in ddp["optimize_ddp"] and "no_optimization" in ddp["optimize_ddp"]
    assert fsdp2["fsdp_compile_order"] == ["before", "after"] and fsdp2["reshard_after_forward"] == [True, False]
    assert main(["search", "--model", toy(), "--device", "cpu", "--nproc", "2"]) == 2
    assert "add --parallel ddp or --parallel fsdp2" in capsys.readouterr().err


def _pgid_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`, from the process table."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


@pytest.mark.parametrize("name, status, timeout_s", [("toy_rank1_crash", "crashed", 120),
                                                      ("toy_rank1_oom", "oom", 120),
                                                      ("toy_rank1_hang", "timeout", 25)])
def test_a_failing_rank_ends_the_whole_trial(tmp_path, name, status, timeout_s):
    group = {}

    def note_group(event):  # the launcher's pid, from the trial's own process file, while it runs
        if not group:
            with open(tmp_path / "t" / "process.json") as f:
                group["pid"] = json.load(f)["pid"]

    record = run_trial(TrialRequest(model=toy(name), config=dict(EAGER), device="cpu", trial_dir=str(tmp_path / "t"),
                                    nproc=2, parallel="ddp", timeout_s=timeout_s, measure=FAST), on_event=note_group)
    assert record["status"] == status, record["reason"]
    if status != "timeout":
        assert record["reason"].startswith("rank 1 of 2: ") and record["failed_rank"] == 1
    assert group["pid"] and _pgid_members(group["pid"]) == []  # every rank and the launcher are gone
