"""The model's own activation checkpointing as a searched dimension: found on a Hugging Face model (peft's
LoRA wrapper included) and on a model that declares it, switched by the snippet, judged by the numerics
guard, refused with CUDA graphs, and memory chosen from a finished study."""

import dataclasses
import json
import os

import pytest
import torch

from autocompile.apply import ModelInfo, find_repeated_blocks, load_snippet, render_snippet
from autocompile.engine.study import build_space
from autocompile.space import DEFAULTS, EAGER, doomed
from autocompile.workloads import WorkloadOptions, checkpointing, get_workload
from conftest import FAST, command, toy

OPTIONS = WorkloadOptions(device="cpu", seed=0)


def dims(space) -> dict:
    return {d.name: d for d in space.dimensions}


@pytest.mark.parametrize(
    "model, found",
    [
        ("tiny-lora", "Hugging Face activation checkpointing on LlamaForCausalLM inside PeftModelForCausalLM"),
        (toy("gpt2_checkpointed"), "Hugging Face activation checkpointing on GPT2LMHeadModel"),
        (toy("toy_checkpointed"), "the workload's own checkpointing (Workload.checkpointing)"),
    ],
)
def test_the_dimension_is_offered_where_the_model_checkpoints(model, found):
    """A Hugging Face model found through its own flag (GPT-2 declares nothing; the LoRA model through
    peft's wrapper), a model of one's own through its declared hooks: as built, off, selective; the
    budget where the model's checkpointing is off, with that condition said by `autocompile space`."""
    space = build_space(model, "cpu")
    dimension = dims(space)["activation_checkpointing"]
    assert dimension.choices == ("as_built", "off", "selective") and found in dimension.help
    budget = dims(space)["activation_memory_budget"]
    assert budget.choices == (None, 0.8, 0.5, 0.2, 0.05) and budget.where == "activation_checkpointing is off"
    assert not budget.active({**DEFAULTS, "activation_checkpointing": "as_built"})
    out = command("space", "--model", model, "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert '["as_built", "off", "selective"]' in out.stdout
    assert "(where activation_checkpointing is off)" in out.stdout


def test_models_that_do_not_checkpoint_do_not_get_the_dimension():
    """llama-8b and the captioner do not checkpoint: no dimension, no budget, no recipe of it."""
    for model in ("tiny-llama", "tiny-captioner", toy()):
        space = build_space(model, "cpu")
        assert "activation_checkpointing" not in dims(space) and "activation_memory_budget" not in dims(space)
        assert any(name == "activation_checkpointing" and "does not checkpoint" in why for name, why in space.left_out)
        assert all(p.get("activation_checkpointing", "as_built") == "as_built" for p in space.starting_points())
    lora = build_space("tiny-lora", "cpu")
    recipes = [p for p in lora.starting_points() if p.get("activation_checkpointing") == "off"]
    assert [r["padding"] for r in recipes] == ["pack", "multiple"]  # first: its batches packed too
    assert all(r["activation_memory_budget"] == 0.5 and r["scope"] == "regional" for r in recipes)


def test_selective_checkpointing_composes_only_where_the_compile_traces_the_checkpoint():
    """The toy checkpoints around each block from its own forward: a block compiled alone is called inside
    the checkpoint, so its selective policy would see compiled kernels, and regional is refused."""
    space = build_space(toy("toy_checkpointed"), "cpu")
    selective = space.validate({"scope": "regional", "activation_checkpointing": "selective"})
    assert "scope regional" in space.rejection(selective)
    assert space.rejection(space.validate({"scope": "full", "activation_checkpointing": "selective"})) is None
    plain = build_space(toy(), "cpu")
    assert "does not checkpoint" in plain.rejection(plain.validate({"activation_checkpointing": "off"}))


def test_cuda_graphs_under_the_model_s_checkpointing_are_refused_with_the_upstream_issue():
    """reduce-overhead with the model's own checkpointing on fails to record (pytorch/pytorch#154306):
    refused before launch while it is on; with it off, CUDA graphs are proposed as anywhere else."""
    space = build_space("tiny-lora", "cpu")
    cuda = dataclasses.replace(space.caps, device="cuda", torch_version="2.11.0+cu130")
    graphs = {**DEFAULTS, "scope": "regional", "mode": "reduce-overhead"}
    reason = doomed(graphs, space.traits, cuda)
    assert "pytorch/pytorch#154306" in reason and "activation_checkpointing off" in reason
    assert doomed({**graphs, "activation_checkpointing": "selective"}, space.traits, cuda) == reason
    assert doomed({**graphs, "activation_checkpointing": "off"}, space.traits, cuda) is None
    assert doomed(graphs, build_space("tiny-llama", "cpu").traits, cuda) is None  # no checkpointing to clash with


def _info(workload, model):
    return ModelInfo(
        regions=find_repeated_blocks(model),
        parts=workload.parts,
        varying=dict(workload.varying),
        max_len=workload.max_len(OPTIONS),
        checkpointing=checkpointing.find(model, workload.checkpointing),
    )


def _losses(workload, config, batches):
    """A plain training loop with the snippet of `config` pasted in, on a model built as the workload
    builds it (its checkpointing on), dropout off as the numerics guard's replay has it."""
    model, optimizer = workload.build(OPTIONS)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    snippet = load_snippet(render_snippet(config, _info(workload, model)))
    model, optimizer = snippet["apply_compilation"](model, optimizer)
    loss_fn = snippet["compile_loss"](workload.criterion)
    losses = []
    for batch in batches:
        batch = snippet["prepare_batch"](dict(batch))
        loss = loss_fn(workload.forward(model, batch), batch)
        snippet["backward"](loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return losses, model


@pytest.mark.parametrize(
    "model, config",
    [
        # padded to the longest length: each layer compiled once, not again (dynamic) at the second batch's length
        (
            "tiny-lora",
            {"scope": "regional", "activation_checkpointing": "off", "activation_memory_budget": 0.5, "padding": "max"},
        ),
        ("tiny-lora", {"scope": "regional", "activation_checkpointing": "selective"}),
        (toy("toy_checkpointed"), {"scope": "full", "activation_checkpointing": "off", "activation_memory_budget": 0.05}),
        (toy("toy_checkpointed"), {"scope": "full", "activation_checkpointing": "selective"}),
    ],
)
def test_the_snippet_switches_the_model_s_checkpointing_and_trains_like_eager_as_built(model, config):
    """Pasted into a plain loop over a model built with its checkpointing on, the snippet turns it off
    (or selective) itself, says so in its docstring, and trains with eager-as-built's losses within the
    numerics guard's tolerance."""
    import torch._functorch.config as functorch_config

    workload = get_workload(model)
    batches = workload.batches(OPTIONS, 3) * 2
    before = functorch_config.activation_memory_budget
    try:
        full = {**DEFAULTS, **config}
        source = render_snippet(full, _info(workload, workload.build(OPTIONS)[0]))
        compiled, trained = _losses(workload, full, batches)
    finally:
        functorch_config.activation_memory_budget = before
    eager, _ = _losses(workload, EAGER, batches)
    assert compiled == pytest.approx(eager, rel=1e-3)
    assert sum(compiled[3:]) < sum(compiled[:3])  # it learned
    found = checkpointing.find(trained, workload.checkpointing)
    if config["activation_checkpointing"] == "off":
        assert "turns the model's own activation checkpointing off" in source
        if found and found.kind == checkpointing.HUGGING_FACE:
            raise AssertionError("the Hugging Face model still checkpoints")
        if workload.checkpointing:
            assert trained.checkpointing is False and "def checkpointing_off(model):" in source
    else:
        assert "under a selective" in source and "def save_matmuls(ctx, op" in source


def test_a_configuration_with_the_checkpointing_off_runs_through_trial(tmp_path):
    out = command(
        "trial",
        "--model",
        "tiny-lora",
        "--device",
        "cpu",
        "--dir",
        str(tmp_path),
        "--json",
        "--config",
        # padded to the longest length: one compile of the blocks, not a second (dynamic) one when the length
        # first changes, 33 of the warm-up's 58 s (2 busy cores); what is under test is the checkpointing
        json.dumps({"scope": "regional", "activation_checkpointing": "off", "activation_memory_budget": 0.5, "padding": "max"}),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    record = json.loads(out.stdout)
    assert record["status"] == "ok" and record["peak_mem_gb"] > 0
    assert "LlamaForCausalLM" in record["model_checkpointing"]
    with open(tmp_path / "apply_compilation.py") as f:
        assert "model_checkpointing_off(model)" in f.read()


def test_a_search_turns_the_checkpointing_off_and_best_picks_under_a_memory_limit(tmp_path):
    """The search's recipe turns the toy's own checkpointing off with a budget, it runs and is judged by the
    numerics guard and against eager's peak as built (--max-memory-gb eager); from the finished study,
    `best --max-memory-gb X` picks the best configuration whose peak was within X (no new search), those
    over the search's own limit alone included, `--pareto` lists the memory front, and a limit nothing met
    is one clear line."""
    from autocompile.api import run_search
    from autocompile.engine.study import SearchSettings, load_study

    directory = str(tmp_path / "studies")
    settings = SearchSettings(
        model=toy("toy_checkpointed"),
        device="cpu",
        study="ckpt",
        directory=directory,
        trials=3,
        trial_timeout_s=300,
        measure=FAST,
        horizon=100_000,
        finalists=0,
        prune=False,
        fixed={"padding": "longest", "mark_dynamic": "off", "dynamic": None},
        max_memory_gb="eager",
    )
    run_search(settings)
    study = load_study("ckpt", "sqlite:///" + os.path.join(settings.study_dir, "study.db"))
    [eager] = [t.user_attrs for t in study.trials if t.user_attrs.get("role") == "eager"]
    [recipe] = [t for t in study.trials if t.user_attrs.get("role") == "recipe" and "status" in t.user_attrs]
    a = recipe.user_attrs
    assert a["config"]["activation_checkpointing"] == "off" and a["config"]["activation_memory_budget"] == 0.5
    assert a["numerics"]["differs"] is False and a["steps_per_s"] > 0
    if a["peak_mem_gb"] > eager["peak_mem_gb"]:  # the process's RSS on the CPU: compiling costs some
        assert a["status"] == "infeasible" and a["over_memory_gb"] == pytest.approx(a["peak_mem_gb"] - eager["peak_mem_gb"])
        assert a["reason"] == f"peak memory {a['peak_mem_gb']:.2f} GB is above --max-memory-gb {eager['peak_mem_gb']:g}"
    else:
        assert a["status"] == "ok", a.get("reason")
    measured = {
        t.number: t.user_attrs
        for t in study.trials
        if t.user_attrs.get("steps_per_s")
        and not (t.user_attrs.get("numerics") or {}).get("differs")
        and t.user_attrs.get("status") in ("ok", "infeasible")
    }
    limit = max(r["peak_mem_gb"] for r in measured.values())  # every configuration that ran fits
    out = command("best", "--study", "ckpt", "--dir", directory, "--max-memory-gb", str(limit), "--json")
    assert out.returncode == 0, out.stderr
    chosen = json.loads(out.stdout)
    from autocompile.engine.scoring import score

    scores = {n: score({**r, "status": "ok"}, 100_000) for n, r in measured.items()}
    assert chosen["number"] == max(scores, key=scores.get) and chosen["max_memory_gb"] == limit
    from autocompile.outputs.pareto import measured_points, memory_front

    pareto = command("best", "--study", "ckpt", "--dir", directory, "--pareto").stdout
    assert "Pareto front of steady throughput against peak memory" in pareto
    # the recipe is listed where it is on the memory front (on the CPU, RSS can put it behind plain torch.compile)
    on_front = recipe.number in {p.number for p in memory_front(measured_points(study, float("inf")))}
    assert ("model-ckpt=off act-budget=0.5" in pareto) == on_front
    least = min(r["peak_mem_gb"] for r in measured.values())
    out = command("best", "--study", "ckpt", "--dir", directory, "--max-memory-gb", str(least / 10))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert f"measured no configuration within {least / 10:g} GB: the least any needed was {least:.2f} GB" in out.stderr
    pareto = command("best", "--study", "ckpt", "--dir", directory, "--pareto").stdout
    assert "Pareto front of steady throughput against peak memory" in pareto and "eager as built peaked at" in pareto
