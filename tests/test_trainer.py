"""`search --trainer` and `apply_to_trainer`: a Hugging Face Trainer's job read as a Workload, and the winner's
snippet put back into the Trainer, each Trainer trained for real (`trainer.train()`) on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from autocompile.apply import load_snippet, render_snippet
from autocompile.space import DEFAULTS
from autocompile.trial.worker import _model_info
from autocompile.workloads import WorkloadOptions, get_workload

HERE = os.path.dirname(__file__)
JOBS = os.path.join(HERE, "trainer_jobs.py")
sys.path.insert(0, HERE)
import trainer_jobs  # noqa: E402
from conftest import command  # noqa: E402

pytestmark = pytest.mark.slow


def snippet(job: str, **config) -> str:
    """The snippet of `config` for the Trainer job, rendered as a trial renders it (from the built model)."""
    workload = get_workload(f"trainer:{JOBS}:{job}")
    options = WorkloadOptions(device="cpu")
    batches = workload.batches(options, workload.batch_pool)
    model, _ = workload.build(options)
    info = _model_info(workload, options, model, batches, {})
    return render_snippet({**DEFAULTS, "compile": True, **config}, info)


def losses(trainer) -> list[float]:
    trainer.train()
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def trained_alike(job: str, tolerance: float = 1e-3, trainer_compiles: bool = False, **config):
    """The job trained as built and with the snippet's apply_to_trainer, each from the factory afresh: the same
    losses at every step, and the same weights at the end, which training moved. Returns the second Trainer.
    With `trainer_compiles`, the second Trainer's own torch_compile is on, as torch_compile=True builds it."""
    torch._dynamo.reset()
    plain = getattr(trainer_jobs, job)()
    before = {name: p.detach().clone() for name, p in plain.model.named_parameters() if p.requires_grad}
    plain_losses = losses(plain)
    code = snippet(job, **config)
    trainer = getattr(trainer_jobs, job)()
    if trainer_compiles:
        from accelerate.utils import DynamoBackend

        trainer.args.torch_compile = True
        trainer.accelerator.state.dynamo_plugin.backend = DynamoBackend.INDUCTOR  # as torch_compile=True builds it
    assert load_snippet(code)["apply_to_trainer"](trainer) is trainer
    compiled_losses = losses(trainer)
    assert len(plain_losses) == len(compiled_losses) == trainer_jobs.STEPS
    for a, b in zip(plain_losses, compiled_losses):
        assert abs(a - b) <= tolerance * abs(a), (plain_losses, compiled_losses)
    after = dict(trainer.model.named_parameters())
    for name, p in plain.model.named_parameters():
        if name in before:
            moved = (p.detach() - before[name]).float().norm()
            assert moved > 0, f"{name} did not train"
            assert (after[name].detach() - p.detach()).float().norm() <= 10 * tolerance * moved, name
    return trainer


def compiled_blocks(model) -> int:
    return sum(1 for m in model.modules() if getattr(m, "_compiled_call_impl", None) is not None)


@pytest.fixture(scope="module")
def own_trainer():
    """language_modeling trained as built and through apply_to_trainer (`trained_alike`), the second Trainer's
    own torch_compile on: the second Trainer. Padded to the longest length (as lora's below): each layer
    compiled once, not again (dynamic) at a new length."""
    return trained_alike(
        "language_modeling",
        trainer_compiles=True,
        scope="regional",
        compile_loss=True,
        compile_optimizer=True,
        lr_tensor=True,
        padding="max",
    )


def test_a_trainer_of_one_s_own_trains_the_same_losses_through_apply_to_trainer(own_trainer):
    assert compiled_blocks(own_trainer.model) == 2  # each decoder layer compiled alone
    assert own_trainer.compute_loss_func is not None  # the model's own loss, compiled apart


def test_a_packed_sft_trainer_trains_the_same_losses_and_is_not_packed_twice():
    pytest.importorskip("trl")
    workload = get_workload(f"trainer:{JOBS}:sft_packed")
    assert workload.layout.packed
    from autocompile.workloads.packing import refusal

    assert "not packed twice" in refusal(workload)
    trainer = trained_alike("sft_packed", 2e-2, scope="regional", padding="multiple", pad_multiple=32)  # TRL's bf16
    assert compiled_blocks(trainer.model) == 2


def test_a_trl_job_s_pad_to_multiple_of_is_its_bucket_rule_as_built():
    pytest.importorskip("trl")
    from autocompile.engine.study import build_space
    from autocompile.space.rules import rejection

    workload = get_workload(f"trainer:{JOBS}:sft_padded_to_16")
    assert workload.pad_multiple == 16 and workload.layout and not workload.layout.packed
    assert all(batch["input_ids"].shape[1] % 16 == 0 for batch in workload.batches(WorkloadOptions(device="cpu"), 8))
    space = build_space(f"trainer:{JOBS}:sft_padded_to_16", "cpu")
    axis = next(d for d in space.describe()["dimensions"] if d["name"] == "pad_multiple")
    assert axis["choices"] == [8, 16, 32, 64] and "pads to a multiple of 16 as built" in axis["help"]
    base = {**DEFAULTS, "compile": True, "scope": "regional", "padding": "multiple"}
    for multiple in (8, 16):  # what the collator does already: the batches as built
        assert "pads to a multiple of 16 already" in rejection(space, {**base, "pad_multiple": multiple})
    assert rejection(space, {**base, "pad_multiple": 32}) is None
    trained_alike("sft_padded_to_16", 2e-2, scope="regional", padding="multiple", pad_multiple=32)


def test_a_lora_trainer_with_checkpointing_is_offered_the_memory_axis_and_trains_alike_without_it():
    pytest.importorskip("peft")
    done = command("space", "--trainer", f"{JOBS}:lora_checkpointing", "--device", "cpu", "--json")
    assert done.returncode == 0, done.stderr
    described = json.loads(done.stdout)
    axis = next(d for d in described["dimensions"] if d["name"] == "activation_checkpointing")
    assert axis["choices"] == ["as_built", "off", "selective"]
    trainer = trained_alike("lora_checkpointing", scope="regional", activation_checkpointing="off", padding="max")
    assert not trainer.model.base_model.model.is_gradient_checkpointing  # off, as the configuration says


def test_nothing_compiles_twice_where_the_trainer_compiles_too(own_trainer):
    """The Trainer's own torch_compile was on: the snippet turned it off, and it trained (own_trainer)."""
    assert own_trainer.state.global_step == trainer_jobs.STEPS
    assert not own_trainer.args.torch_compile
    assert not isinstance(own_trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule)  # accelerate compiled nothing
    assert compiled_blocks(own_trainer.model) == 2


def nan_at(trainer, steps: set[int]):
    """The Trainer's training_step giving NaN at `steps` (counted from 0), as its logged loss reads it: the
    gradients are the step's own, only the loss the loop logs is not finite."""
    training_step = trainer.training_step
    calls = []

    def training_step_nan(*args, **kwargs):
        loss = training_step(*args, **kwargs)
        calls.append(1)
        return loss * float("nan") if len(calls) - 1 in steps else loss

    trainer.training_step = training_step_nan
    trainer.args.logging_steps = 3
    return trainer


def test_the_trainer_s_loop_waits_less_and_logs_the_same_losses():
    """apply_to_trainer takes the loop's reads of the GPU that change nothing trained: batches copied without
    waiting, an all-ones mask left out on the host, and the NaN filter of the logged loss on the device. A job
    at batch 1 (every mask all ones) logs the same losses as the plain Trainer, NaN steps filtered alike."""
    torch._dynamo.reset()
    code = snippet("per_length_cost", compile=False)
    plain = nan_at(trainer_jobs.per_length_cost(), {2, 4})
    plain_losses = losses(plain)
    trainer = nan_at(trainer_jobs.per_length_cost(), {2, 4})
    trainer.args.dataloader_pin_memory = True  # as on a GPU (a CPU's Trainer turns it off; its DataLoader ignores it)
    namespace = load_snippet(code)
    namespace["apply_to_trainer"](trainer)
    assert trainer.accelerator.dataloader_config.non_blocking  # the copies from pinned memory do not wait
    assert all("attention_mask" not in batch for _, batch in zip(range(3), trainer.get_train_dataloader()))
    step, checked = trainer.training_step, []

    def step_then_the_loop_s_check(*args, **kwargs):
        loss = step(*args, **kwargs)
        checked.append(trainer.args.logging_nan_inf_filter)  # what the loop reads next: on, it reads the loss back
        return loss

    trainer.training_step = step_then_the_loop_s_check
    ours = losses(trainer)
    assert checked == [False] * trainer_jobs.STEPS
    assert len(ours) == len(plain_losses) == trainer_jobs.STEPS // 3
    assert all(loss == loss for loss in ours), ours  # the NaN steps filtered, as the plain Trainer's are
    assert ours == pytest.approx(plain_losses, rel=1e-6, abs=0)
    assert trainer.args.logging_nan_inf_filter  # the loop's own check is back on once a step ends: evaluation's
    collate = namespace["without_full_mask"](trainer_jobs.language_modeling().data_collator)
    padded = collate([{"input_ids": [5, 6, 7]}, {"input_ids": [5]}])
    assert padded["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]  # a mask that masks is kept


def reads_in_a_step(trainer) -> int:
    """How many times one training step of the Trainer reads a tensor's value back to the host (.item(), a
    tensor's truth): on a GPU, each makes the host wait for the device. The batch is collated before."""
    from torch.utils._python_dispatch import TorchDispatchMode

    reads = [torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default]

    class CountReads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountReads.count += func in reads
            return func(*args, **(kwargs or {}))

    batch = next(iter(trainer.get_train_dataloader()))
    trainer.current_gradient_accumulation_steps = 1  # as the loop sets it before a step
    with CountReads():
        trainer.training_step(trainer.model, batch)
    return CountReads.count


def test_a_step_of_the_applied_trainer_reads_nothing_back():
    """At batch 1 the plain Trainer's model reads its all-ones mask back to find it all ones; with the mask left
    out, Hugging Face's mask would read the position ids back instead, to find packed sequences. Through
    apply_to_trainer a step reads nothing back: the model counts its own positions, one sequence a row."""
    code = snippet("per_length_cost", compile=False)
    plain, trainer = trainer_jobs.per_length_cost(), trainer_jobs.per_length_cost()
    assert reads_in_a_step(plain) >= 1
    load_snippet(code)["apply_to_trainer"](trainer)
    assert reads_in_a_step(trainer) == 0
    batch = {**next(iter(trainer.get_train_dataloader()))}
    batch["position_ids"] = torch.arange(batch["input_ids"].shape[1]).remainder(5)[None]  # rows packed by position
    from transformers import masking_utils

    found = []
    find = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda positions: found.append(find(positions)) or found[-1]
    try:
        trainer.model(**batch)
    finally:
        masking_utils.find_packed_sequence_indices = find
    assert found and found[0] is not None  # a batch that brings its positions is still looked at for packing


def test_a_trainer_whose_loss_reads_the_mask_keeps_it():
    """TRL's SFTTrainer counts its tokens from the batch's attention_mask in its compute_loss: its mask stays
    in the batch, all ones at batch 1, and it trains as built (eager)."""
    pytest.importorskip("trl")
    trainer = trained_alike("sft_one_row", 2e-2, compile=False)
    assert all("attention_mask" in batch for _, batch in zip(range(3), trainer.get_train_dataloader()))


@pytest.mark.parametrize(
    "factory, says",
    [
        ("not_a_trainer", "did not give a transformers Trainer (got LlamaForCausalLM)"),
        ("raises", "raised RuntimeError: the dataset is not there"),
        ("trained", "has trained 1 steps already: give one built but not trained"),
        ("nowhere", "has no attribute 'nowhere'"),
    ],
)
def test_a_bad_trainer_factory_gets_one_line_and_exit_2(factory, says):
    done = command("space", "--trainer", f"{JOBS}:{factory}", "--device", "cpu")
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2
    assert last.startswith("autocompile: error:") and says in last
    assert "Traceback" not in done.stderr


def test_a_bad_trainer_factory_exits_2_from_the_command_line():
    """The same, from the command's own process: its exit status and its last line."""
    done = subprocess.run(
        [sys.executable, "-m", "autocompile", "space", "--trainer", f"{JOBS}:nowhere", "--device", "cpu"],
        capture_output=True,
        text=True,
    )
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2
    assert last.startswith("autocompile: error:") and "has no attribute 'nowhere'" in last
    assert "Traceback" not in done.stderr


def test_a_trial_of_a_trainer_s_job_runs_its_own_step_through_apply_to_trainer(tmp_path, toolchain_dir):
    from conftest import FAST

    from autocompile.engine.scoring import compare_losses
    from autocompile.space import EAGER
    from autocompile.trial import TrialRequest, run_trial

    def trial(name, config):
        request = TrialRequest(
            model=f"trainer:{JOBS}:language_modeling",
            config={**DEFAULTS, **config},
            device="cpu",
            trial_dir=str(tmp_path / name),
            timeout_s=400,
            toolchain_dir=toolchain_dir,
            measure=FAST,
        )
        return run_trial(request)

    eager = trial("eager", EAGER)
    # one row per batch, each batch a length of its own: compiled dynamic from the first batch, not again at the second length
    packed = trial(
        "packed", {"scope": "regional", "padding": "pack", "pack_length": "batch", "pad_multiple": 16, "dynamic": True}
    )
    for record in (eager, packed):
        assert record["status"] == "ok", record["reason"]
        assert "def apply_to_trainer(trainer):" in record["snippet"]
        assert record["items_per_s"] > record["steps_per_s"] > 0
    # packed from the layout found on the model (nobody declared one), checked, and trained as eager trains
    check = packed["packing_check"]
    assert check["blind_batch"] is not None and check["other_sequences_moved"] == 0 and check["earlier_tokens_moved"] == 0
    assert packed["padding_share"] < eager["padding_share"]
    assert not compare_losses(packed["losses"], eager["losses"], "cpu")["differs"]


def test_a_trainer_s_job_is_measured_on_batches_its_warm_up_did_not_see(tmp_path, toolchain_dir):
    """A cost the device pays once per new shape (cuDNN attention's plans) is paid at each step of a run over a
    dataset of many lengths, and so in the trial's windows: they take batches the warm-up did not pass."""
    from conftest import FAST

    from autocompile.space import EAGER
    from autocompile.trial import TrialRequest, run_trial

    workload = get_workload(f"trainer:{JOBS}:per_length_cost")
    assert workload.batch_pool == 160 and workload.fresh_pass == 32
    request = TrialRequest(
        model=f"trainer:{JOBS}:per_length_cost",
        config={**DEFAULTS, **EAGER},
        device="cpu",
        trial_dir=str(tmp_path / "eager"),
        timeout_s=300,
        toolchain_dir=toolchain_dir,
        measure=FAST,
    )
    record = run_trial(request)
    assert record["status"] == "ok", record["reason"]
    assert len(record["window_rates"]) == 3 and record["settling_windows"] == 0
    assert record["warmup_steps"] + record["measured_steps"] <= workload.batch_pool
    # every measured step met a new length: none ran faster than the plan it paid (a step that reused a length
    # costs the tiny model's few milliseconds, so windows over the warm-up's batches would run several times faster)
    assert record["steps_per_s"] < 1 / trainer_jobs.PLAN_S


def test_only_a_trainer_whose_loss_is_the_model_s_own_has_it_compiled_apart_or_fed_hidden_states():
    """The loss compiled apart is the model's loss_function, and lm_loss gives it the hidden states instead of the
    logits: neither where the Trainer's loss is another (label smoothing), and no hidden states where the Trainer's
    own compute_loss reads the logits too (TRL's SFTTrainer, for its metrics)."""
    pytest.importorskip("trl")
    from autocompile.engine.study import build_space

    plain = get_workload(f"trainer:{JOBS}:language_modeling")
    assert plain.split_loss and plain.own_loss
    smoothed = get_workload(f"trainer:{JOBS}:label_smoothing")
    assert not smoothed.split_loss and not smoothed.own_loss
    sft = get_workload(f"trainer:{JOBS}:sft_padded_to_16")
    assert sft.split_loss and not sft.own_loss
    for job in ("label_smoothing", "sft_padded_to_16"):
        left_out = dict(build_space(f"trainer:{JOBS}:{job}", "cpu").left_out)
        assert "only the model's own loss_function" in left_out["lm_loss"]


def test_the_mask_is_left_in_where_prepare_batch_reads_it():
    """prepare_batch pads, packs or marks every varying key, the mask among them: there the mask stays."""
    from autocompile.apply import ModelInfo, drops_full_mask
    from autocompile.workloads import SequenceLayout

    varying = {"input_ids": (1, 0), "attention_mask": (1, 0), "labels": (1, -100)}
    info = ModelInfo(varying=varying, layout=SequenceLayout(mask="attention_mask"), framework="trainer")
    assert drops_full_mask({**DEFAULTS, "padding": "longest"}, info)
    for config in ({"padding": "max"}, {"padding": "pack"}, {"padding": "buckets"}, {"mark_dynamic": "maybe"}):
        assert not drops_full_mask({**DEFAULTS, **config}, info), config
    assert not drops_full_mask({**DEFAULTS}, ModelInfo(varying=varying, layout=SequenceLayout(mask=None)))


def test_clipping_folded_into_the_fused_step_clips_as_the_trainer_does():
    """clip_in_step: the Trainer's _clip_grad_norm hands the clip to the fused AdamW step as its gradient scale.
    The same step as torch's clipping then the step (an eps of 1 makes AdamW's update follow the gradient's
    scale, so that a step without the clip is told apart); offered for the job; trains alike through
    apply_to_trainer."""
    namespace = load_snippet(snippet("language_modeling", compile=False, clip_in_step=True))
    updated, norms = [], []
    for clip in ("torch", "in_step", None):
        trainer = trainer_jobs.language_modeling()
        trainer.optimizer = torch.optim.AdamW(trainer.model.parameters(), lr=0.1, eps=1.0, fused=True)
        if clip == "in_step":
            namespace["clip_in_optimizer_step"](trainer)
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.model(**batch).loss.backward()
        if clip:
            norms.append(float(trainer._clip_grad_norm(trainer.model)))
        trainer.optimizer.step()
        updated.append(torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
    assert norms[0] == pytest.approx(norms[1], rel=1e-6) and norms[0] > trainer.args.max_grad_norm  # it clips here
    assert torch.allclose(updated[0], updated[1], rtol=0, atol=1e-6)
    assert (updated[0] - updated[2]).abs().max() > 1e-3  # without the clip, another step
    space = json.loads(command("space", "--trainer", f"{JOBS}:language_modeling", "--device", "cpu", "--json").stdout)
    assert any(d["name"] == "clip_in_step" for d in space["dimensions"])
    trained_alike("language_modeling", compile=False, clip_in_step=True)
