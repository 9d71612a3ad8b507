"""The mixture-of-experts workloads and the experts' implementation as a dimension: tiny-moe builds and trains, its
model FLOPs count the active parameters, and an implementation of the experts switched by the snippet is offered
where the model can switch and trains eager's losses under compile."""

import pytest
import torch

from autocompile.apply import ModelInfo, describe_config, find_repeated_blocks, load_snippet, render_snippet, without_code
from autocompile.errors import UserError
from autocompile.engine.study import build_space, workload_traits
from autocompile.space import DEFAULTS, EAGER, Capabilities, SearchSpace
from autocompile.trial import TrialRequest, run_trial
from autocompile.workloads import WorkloadOptions, get_workload
from autocompile.workloads._moe import QWEN3_MOE_2B, TINY_MOE, active_parameters
from autocompile.workloads.kernels import experts_implementations
from conftest import FAST
from snippet_loop import snippet_losses

OPTIONS = WorkloadOptions(device="cpu", seed=0)


def test_tiny_moe_builds_and_trains_padded_batches_of_varying_lengths():
    """A Qwen3-MoE of float32 on the CPU, without router logits (no aux loss, no output-capturing hooks), its
    batches padded to their longest and of varying lengths, trains: the losses fall over a few steps on one batch."""
    workload = get_workload("tiny-moe")
    model, optimizer = workload.build(OPTIONS)
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and not model.config.output_router_logits
    assert next(model.parameters()).dtype == torch.float32
    batches = workload.batches(OPTIONS, 4)
    assert len({b["input_ids"].shape[1] for b in batches}) > 1
    batch, losses = batches[0], []
    for _ in range(5):
        loss = workload.loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


def test_the_model_flops_count_the_active_parameters():
    """A token passes through the dense parameters and top-k of n experts: counted by hand from TINY_MOE's sizes."""
    model, _ = get_workload("tiny-moe").build(WorkloadOptions(device="meta"))
    c = TINY_MOE
    hidden, heads, kv, head_dim, expert = (
        c["hidden_size"],
        c["num_attention_heads"],
        c["num_key_value_heads"],
        c["head_dim"],
        c["moe_intermediate_size"],
    )
    attention = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2 + 2 * head_dim  # q, o, k, v, q_norm, k_norm
    router_and_norms = c["num_experts"] * hidden + 2 * hidden
    one_expert = 3 * hidden * expert  # gate, up, down
    dense = c["num_hidden_layers"] * (attention + router_and_norms) + 2 * c["vocab_size"] * hidden + hidden
    assert sum(p.numel() for p in model.parameters()) == dense + c["num_hidden_layers"] * c["num_experts"] * one_expert
    assert active_parameters(model) == dense + c["num_hidden_layers"] * c["num_experts_per_tok"] * one_expert


def test_a_trial_reports_the_model_tflops_of_the_active_parameters(tmp_path, toolchain_dir):
    """A trial of tiny-moe records its model FLOPs per token from the active parameters, and the model TFLOP/s at
    the tokens/s it measured (MFU: over the device's peak); a dense Llama counts all its parameters."""
    request = TrialRequest(
        model="tiny-moe",
        config=EAGER,
        device="cpu",
        trial_dir=str(tmp_path / "t"),
        timeout_s=300,
        toolchain_dir=toolchain_dir,
        measure=FAST,
    )
    record = run_trial(request)
    assert record["status"] == "ok", record["reason"]
    model, _ = get_workload("tiny-moe").build(WorkloadOptions(device="meta"))
    assert record["model_flops_per_item"] == 6 * active_parameters(model) < 6 * sum(p.numel() for p in model.parameters())
    assert record["model_tflops_per_s"] == pytest.approx(record["model_flops_per_item"] * record["items_per_s"] / 1e12)
    llama = get_workload("tiny-llama")
    dense, _ = llama.build(WorkloadOptions(device="meta"))
    assert llama.flops_per_item(dense) == 6 * sum(p.numel() for p in dense.parameters())
    # MFU where the device's dense bf16 peak is known (not the CPU's): the same figure on an H100 would read so
    from autocompile.outputs.table import _mfu_words

    assert _mfu_words(record) == ""
    on_h100 = {**record, "device_name": "NVIDIA H100 80GB HBM3", "model_tflops_per_s": 440.0}
    assert _mfu_words(on_h100).startswith(" MFU 44.5%: 440 TFLOP/s")


def test_the_experts_implementation_is_offered_where_the_model_can_switch_it():
    """tiny-moe's experts, built as grouped_mm, may be switched to the per-expert loop or batched_mm on the CPU too;
    a model without experts leaves the dimension out with its reason and refuses a configuration that sets it;
    the per-expert loop is refused under fullgraph."""
    space = build_space("tiny-moe", "cpu")
    assert (space.traits.experts, space.traits.other_experts) == ("grouped_mm", ("eager", "batched_mm"))
    assert next(d for d in space.dimensions if d.name == "experts").choices == ("model", "eager", "batched_mm")
    assert space.rejection({**DEFAULTS, "experts": "batched_mm"}) is None
    assert "breaks the graph" in space.rejection({**DEFAULTS, "experts": "eager", "fullgraph": True})
    assert "the model's own" in space.rejection({**DEFAULTS, "experts": "grouped_mm"})
    with pytest.raises(UserError, match="experts"):
        space.validate({**DEFAULTS, "experts": "sonic"})

    llama = build_space("tiny-lora", "cpu")  # a peft-wrapped dense Llama
    assert "no Hugging Face experts" in dict(llama.left_out)["experts"]
    assert "experts" not in {d.name for d in llama.dimensions}
    assert "experts batched_mm" in llama.rejection({**DEFAULTS, "experts": "batched_mm"})
    model, _ = get_workload("tiny-lora").build(WorkloadOptions(device="meta"))
    assert experts_implementations(model) == ("", (), {})


def test_batched_mm_is_left_out_where_its_copies_of_the_weights_cannot_fit():
    """batched_mm gathers each token's top-k experts' weights and keeps them for the backward: for moe-2b's batch of
    8 x 2048 tokens, 2 bytes x 3 x 2048 x 768 a copy, 4 copies a token, 8 layers: 4948 GB, so it is left out."""
    traits = workload_traits(get_workload("moe-2b"), WorkloadOptions(device="cuda"))
    c = QWEN3_MOE_2B
    gathered = (
        2 * 3 * c["hidden_size"] * c["moe_intermediate_size"] * c["num_experts_per_tok"] * 8 * 2048 * c["num_hidden_layers"]
    )
    assert (traits.experts, traits.other_experts) == ("grouped_mm", ("eager",))
    assert f"{gathered / 1e9:.0f} GB for a batch of 16384 tokens" in traits.experts_refused["batched_mm"]
    space = SearchSpace(Capabilities.detect("cuda"), traits)
    assert next(d for d in space.dimensions if d.name == "experts").choices == ("model", "eager")
    assert "experts=batched_mm" in dict(space.left_out)
    assert "4948 GB" in space.rejection({**DEFAULTS, "experts": "batched_mm"})


def test_the_snippet_switches_the_experts_inside_a_peft_wrapper():
    """apply_compilation's experts_on finds the Hugging Face model a peft wrapper (compiled whole) holds and switches
    its experts there."""
    import peft

    model, optimizer = get_workload("tiny-moe").build(OPTIONS)
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert experts_implementations(wrapped)[:2] == ("grouped_mm", ("eager", "batched_mm"))
    snippet = load_snippet(render_snippet({**DEFAULTS, "experts": "eager"}, ModelInfo(regions=find_repeated_blocks(model))))
    snippet["apply_compilation"](wrapped, optimizer)  # compiled lazily: nothing runs until a forward
    assert model.config._experts_implementation == "eager"


def test_an_experts_implementation_switched_by_the_snippet_trains_eagers_losses():
    """The snippet's experts_on sets batched_mm on the model before each decoder layer is compiled alone, and two
    steps on a padded batch train the same losses as eager with the model's own (grouped_mm) experts."""
    workload = get_workload("tiny-moe")
    batches = workload.batches(OPTIONS, 1) * 2  # one length: one compile of each layer (a second is 20 s of CPU)
    config = {"scope": "regional", "experts": "batched_mm"}
    torch._dynamo.reset()
    model, losses = snippet_losses(workload, config, batches, OPTIONS)
    assert model.config._experts_implementation == "batched_mm"
    _, eager = snippet_losses(workload, EAGER, batches, OPTIONS)
    assert losses == pytest.approx(eager, rel=1e-4)
    assert describe_config({**DEFAULTS, **config}).endswith("experts-batched_mm")
    assert without_code({**DEFAULTS, **config}) == []  # the Trainer's settings cannot say it


@pytest.mark.parametrize("how", ["eager", "grouped_mm", "batched_mm"])
def test_only_the_per_expert_loop_breaks_the_graph(how):
    """What the rule against experts eager under fullgraph says: Dynamo traces the grouped and batched products
    whole, and breaks on the loop over the experts a batch routes to."""
    model, _ = get_workload("tiny-moe").build(OPTIONS)
    model.set_experts_implementation(how)
    block = model.model.layers[0].mlp
    torch._dynamo.reset()
    compiled = torch.compile(block, backend="eager", fullgraph=True)
    hidden = torch.randn(2, 8, TINY_MOE["hidden_size"])
    if how == "eager":
        with pytest.raises((torch._dynamo.exc.Unsupported, torch._dynamo.exc.UserError), match="in expert_hit"):
            compiled(hidden)
    else:
        assert torch.allclose(compiled(hidden), block(hidden))
