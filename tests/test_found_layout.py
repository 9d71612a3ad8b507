"""A workload of a Hugging Face model that declares no SequenceLayout is packed by the layout found from its
model and a batch (workloads/layout.py): the space offers packing and says where the layout came from; the
trial's packing check passes a found layout that is right and refuses one that is wrong, with its reason,
before anything is compiled or measured; a declared layout wins over the one the model would give."""

import pytest
import torch

from autocompile.apply import render_snippet
from autocompile.engine.study import build_space
from autocompile.space import DEFAULTS, EAGER
from autocompile.workloads import WorkloadOptions, get_workload
from autocompile.workloads.layout import DECLARED, infer_layout, resolve
from conftest import toy

OPTIONS = WorkloadOptions(device="cpu", seed=0)
PACKED = {**DEFAULTS, "scope": "full", "padding": "pack"}
# the workloads that declare nothing: the class their layout is found from, and whether their loss shifts the labels
UNDECLARED = [
    ("hf_causal_lm", "LlamaForCausalLM", True),
    ("hf_encoder", "BertForMaskedLM", False),
    ("hf_peft", "LlamaForCausalLM", True),
]


def _checked(name: str, config: dict, tmp_path) -> tuple[bool, dict, object]:
    """The trial's packing check on the workload, as a trial runs it (eager, nothing compiled): whether it
    passes, what it wrote to the trial's result, and the model's info the snippet was rendered from."""
    from autocompile.trial.packing_check import packed_alike
    from autocompile.trial.worker import Events, Setup, _model_info

    workload = get_workload(name)
    batches = workload.batches(OPTIONS, workload.batch_pool)
    model, _ = workload.build(OPTIONS)
    result: dict = {}
    info = _model_info(workload, OPTIONS, model, batches, result)
    setup = Setup(workload, OPTIONS, len(batches), batches, [workload.count(b) for b in batches], info)
    setup.snippet = render_snippet(config, info)
    alike = packed_alike(torch, {"config": config}, Events(str(tmp_path / "events.jsonl")), result, setup, model)
    return alike, result, info


@pytest.mark.parametrize("name, found_from, shifted", UNDECLARED)
def test_the_space_offers_packing_by_the_layout_found_from_the_model(name, found_from, shifted):
    space = build_space(toy(name), "cpu")
    described = space.describe()
    [padding] = [d for d in described["dimensions"] if d["name"] == "padding"]
    assert "pack" in padding["choices"] and not space.traits.pack_refusal
    assert described["layout"].startswith(f"found from {found_from}: ")
    assert ("'labels' taken to be shifted by the loss" in described["layout"]) is shifted


@pytest.mark.parametrize("name, found_from, shifted", UNDECLARED)
def test_the_packing_check_passes_a_found_layout_that_is_right(name, found_from, shifted, tmp_path):
    """Packed as found, the batch gives what the padded batch gives, each packed sequence blind to the others
    (where the workload gives outputs per token), and the loss reads the labels as the layout takes them."""
    alike, result, info = _checked(toy(name), PACKED, tmp_path)
    check = result["packing_check"]
    assert alike, result.get("reason")
    assert info.layout.source.startswith(f"found from {found_from}") and info.layout.causal is shifted
    assert check["max_rel_diff"] < 1e-5 and check["labels_read"] and check["labels_first_read"] is not shifted
    assert check.get("other_sequences_moved", 0) == check.get("earlier_tokens_moved", 0) == 0


def test_a_declared_layout_wins_over_the_one_found_from_the_model():
    """tiny-llama's labels come shifted already, as it declares (shifted=()); its model alone would say a causal
    LM's own loss shifts them. The declared one is the one the space names and the snippet packs by."""
    from autocompile.trial.worker import _model_info

    workload = get_workload("tiny-llama")
    model, _ = workload.build(OPTIONS)
    batch = workload.batches(OPTIONS, 1)[0]
    found, _ = infer_layout(model, batch, workload.varying)
    assert found.shifted == ("labels",)
    layout, source = resolve(workload, model, batch)
    assert layout is workload.layout and layout.shifted == () and source == DECLARED
    assert build_space("tiny-llama", "cpu").describe()["layout"] == DECLARED
    info = _model_info(workload, OPTIONS, model, [batch], {})
    assert info.layout is workload.layout and "SHIFTED = ()" in render_snippet(PACKED, info)


def test_a_wrong_found_layout_is_refused_by_the_packing_check_before_anything_is_measured(tmp_path):
    """tiny-llama without its declared layout: the layout found from its model takes its loss to shift the
    labels, which it does not (they come shifted). The model's outputs alone, packed, match the padded
    batch's; the packing check asks the loss and refuses the trial, saying why, before it compiles."""
    from autocompile.trial import TrialRequest, run_trial

    record = run_trial(
        TrialRequest(
            model=toy("llama_undeclared"),
            config={**DEFAULTS, "scope": "regional", "padding": "pack"},
            device="cpu",
            trial_dir=str(tmp_path / "trial"),
            timeout_s=300,
            measure={"min_window_s": 0.05, "min_windows": 2, "max_windows": 2},
        )
    )
    assert record["status"] == "infeasible" and record["reason"].startswith("numerics (packing check)")
    assert "the workload's loss reads each sequence's first label ('labels'): they come shifted already" in record["reason"]
    assert "declare Workload.layout" in record["reason"]
    check = record["packing_check"]
    assert check["max_rel_diff"] < 1e-5 and check["labels_first_read"]  # the outputs alone would have passed
    assert "warmup_s" not in record and "steps_per_s" not in record  # nothing compiled, nothing measured


def test_no_layout_is_found_where_the_model_and_batch_do_not_say(tmp_path):
    """Where the model or its batches leave the layout open, none is found and packing is refused, saying why."""
    causal = get_workload(toy("hf_causal_lm"))
    model, _ = causal.build(OPTIONS)
    batch = causal.batches(OPTIONS, 1)[0]
    unlabelled = {key: value for key, value in causal.varying.items() if key != "labels"}
    text = {key: value for key, value in batch.items() if key != "labels"}
    assert infer_layout(model, text, unlabelled)[1].endswith("its batches carry no labels: what its loss trains on is not known")
    per_row = {**batch, "score": torch.zeros(batch["input_ids"].shape[0])}
    assert "'score' of the batch has a row per sequence" in infer_layout(model, per_row, causal.varying)[1]
    assert "no argument of LlamaForCausalLM's forward" in infer_layout(model, batch, {**causal.varying, "targets": (1, 0)})[1]
    toy_model = get_workload(toy()).build(OPTIONS)[0]
    assert infer_layout(toy_model, batch, causal.varying) == (None, "it is not a Hugging Face model")


def test_space_prints_where_the_layout_came_from(capsys):
    from autocompile.cli import main

    assert main(["space", "--model", toy("hf_peft"), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "packing's sequence layout: found from LlamaForCausalLM: a causal decoder" in out


def test_a_found_layout_that_is_right_is_trained_and_measured(tmp_path):
    """The peft-wrapped Llama that declares nothing, packed by the layout found from its model: checked, then
    trained and measured, eager (a compiled trial of a found layout: test_trainer.py's packed Trainer)."""
    from autocompile.trial import TrialRequest, run_trial

    record = run_trial(
        TrialRequest(
            model=toy("hf_peft"),
            config={**EAGER, "padding": "pack"},
            device="cpu",
            trial_dir=str(tmp_path / "trial"),
            timeout_s=300,
            measure={"min_window_s": 0.05, "min_windows": 2, "max_windows": 2},
        )
    )
    assert record["status"] == "ok", record["reason"]
    check = record["packing_check"]
    assert check["max_rel_diff"] < 1e-5 and check["labels_read"] and not check["labels_first_read"]
    assert "SHIFTED = ('labels',)" in record["snippet"] and "POSITIONS = 'position_ids'" in record["snippet"]
    assert record["steps_per_s"] > 0 and record["padding_share"] < 0.5
