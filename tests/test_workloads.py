import subprocess
import sys
import textwrap

import pytest
import torch

from autocompile.errors import UserError
from autocompile.workloads import WorkloadOptions, get_workload, list_workloads
from conftest import TOY, toy


def test_builtin_names_are_listed():
    names = [name for name, _ in list_workloads()]
    assert names[:4] == ["llama-8b", "tiny-llama", "captioner", "tiny-captioner"]


def test_unknown_model_names_the_choices():
    with pytest.raises(UserError, match="unknown model 'gpt-17'.*tiny-llama"):
        get_workload("gpt-17")


def test_file_and_module_factories(tmp_path, monkeypatch):
    assert get_workload(toy()).name == "toy"
    with pytest.raises(UserError, match="workload file not found"):
        get_workload(str(tmp_path / "missing.py") + ":toy")
    with pytest.raises(UserError, match="has no attribute 'nope'"):
        get_workload(f"{TOY}:nope")
    with pytest.raises(UserError, match="did not give an autocompile Workload"):
        get_workload(f"{TOY}:not_a_workload")
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "my_jobs.py").write_text("from toy_workloads import toy as job\n")
    monkeypatch.syspath_prepend(TOY.rsplit("/", 1)[0])
    assert get_workload("my_jobs:job").name == "toy"
    with pytest.raises(UserError, match="could not import workload module"):
        get_workload("no_such_package_xyz:job")


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-captioner"])
def test_tiny_builtins_train_one_step_with_varying_lengths(name):
    workload = get_workload(name)
    options = WorkloadOptions(device="cpu", seed=1)
    model, optimizer = workload.build(options)
    batches = workload.batches(options, 6)
    key = next(iter(workload.varying))
    lengths = {b[key].shape[1] for b in batches}
    assert len(lengths) > 1, "batches should differ in length"
    assert max(lengths) <= workload.max_len(options)
    for b in batches:  # padding is never counted as work
        assert 0 < workload.count(b) <= b["labels"].numel()
    loss = workload.loss(model, batches[0])
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)


def test_llama_8b_is_the_llama_3_1_architecture():
    workload = get_workload("llama-8b")
    model, _ = workload.build(WorkloadOptions(device="meta"))
    config = model.config
    assert (
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.intermediate_size,
        config.vocab_size,
    ) == (32, 4096, 32, 8, 14336, 128256)
    assert 7.9e9 < sum(p.numel() for p in model.parameters()) < 8.1e9
    assert workload.gpu_only


def test_captioner_follows_the_seed():
    workload = get_workload("captioner")
    model, optimizer = workload.build(WorkloadOptions(device="meta"))
    assert type(model).__name__ == "VisionEncoderDecoderModel"
    assert model.decoder.config.vocab_size == 1024 and isinstance(optimizer, torch.optim.Adam)
    assert workload.parts == ("encoder", "decoder")
    lengths = [b["labels"].shape[1] for b in workload.batches(WorkloadOptions(batch_size=64), 3)]
    assert all(6 <= n <= 256 for n in lengths)


def test_entry_point_plugin_is_found(tmp_path):
    """A package that registers a workload through the entry-point group is listed and resolved."""
    dist = tmp_path / "demo_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[autocompile.workloads]\ndemo-toy = toy_workloads:toy\n")
    code = textwrap.dedent(f"""
        import sys; sys.path[:0] = [{str(tmp_path)!r}, {TOY.rsplit("/", 1)[0]!r}]
        from autocompile.workloads import get_workload, list_workloads
        assert get_workload("demo-toy").name == "toy"
        assert any(name == "demo-toy" for name, _ in list_workloads())
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_forward_and_criterion_make_the_loss_and_old_plugins_keep_working():
    from autocompile.workloads import Workload

    common = dict(name="w", description="", build=None, batches=None, count=len)
    split = Workload(**common, forward=lambda model, batch: model * 2, criterion=lambda out, batch: out + batch)
    assert split.split_loss and split.loss(3, 1) == 7
    old = Workload("old", "", None, None, lambda model, batch: 5, len)  # positional, as before forward existed
    assert old.loss(None, None) == 5 and not old.split_loss and old.schedule is None
    with pytest.raises(TypeError, match="forward and criterion together"):
        Workload(**common, forward=lambda model, batch: model)
    with pytest.raises(TypeError, match="needs loss, or forward and criterion"):
        Workload(**common)
    with pytest.raises(TypeError, match="needs count"):
        Workload(name="w", description="", build=None, batches=None, loss=lambda m, b: 0)


def test_builtins_split_their_loss_and_the_llamas_follow_an_lr_schedule():
    for name in ("llama-8b", "tiny-llama", "captioner", "tiny-captioner"):
        assert get_workload(name).split_loss, name
    assert get_workload("captioner").schedule is None
    workload = get_workload("tiny-llama")
    options = WorkloadOptions(device="cpu", seed=0)
    model, optimizer = workload.build(options)
    scheduler = workload.schedule(optimizer)
    factor = scheduler.lr_lambdas[0]
    assert factor(0) == pytest.approx(0.01) and factor(99) == pytest.approx(1.0)  # linear warm-up over 100 steps
    assert factor(100 + 5000) == pytest.approx(0.55) and factor(100 + 10000) == pytest.approx(0.1)  # cosine to 10%
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-5 * 0.01)
    batch = workload.batches(options, 1)[0]
    logits = workload.forward(model, batch)
    assert logits.shape[:2] == batch["input_ids"].shape
    assert torch.equal(workload.criterion(logits, batch), workload.loss(model, batch))


def test_the_cpu_quickstart_space_and_preset():
    """scripts/quickstart.sh's CPU search: tiny-llama as sized for 2 cores, and the space file that
    leaves one recipe, so that its 3 minutes hold the baselines, the recipe, a neighbour and the
    finalist round (its measured runs: studies/runs/2026-11-23- and 2026-11-26-cpu-quickstart.log)."""
    import os

    from autocompile.engine.study import build_space
    from conftest import ROOT

    config = get_workload("tiny-llama").build(WorkloadOptions(device="meta"))[0].config
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size, config.vocab_size) == (2, 32, 64, 256)
    assert config._attn_implementation == "eager"  # attention's small ops are what Inductor fuses
    space_file = os.path.join(ROOT, "studies", "quickstart-cpu.toml")
    with open(os.path.join(ROOT, "scripts", "quickstart.sh")) as f:
        assert "--space studies/quickstart-cpu.toml" in f.read()
    space = build_space("tiny-llama", "cpu", space_file=space_file)
    assert {
        "scope": "regional",
        "compile_optimizer": True,
        "lr_tensor": True,
        "padding": "multiple",
        "pad_multiple": 64,
    }.items() <= space.fixed.items()
    assert len(space.starting_points()) == 1
    recipe = space.suggest(__import__("optuna").trial.FixedTrial(space.starting_points()[0]))
    assert space.rejection(recipe) is None
