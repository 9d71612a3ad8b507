"""The model's own implementation choices: the SDPA kernel of a Hugging Face model's attention, chosen inside
its forward (traced into the compiled graphs), offered where cuDNN's kernel is one of torch's choices, and
training the same losses as the model's own attention."""

import pytest
import torch

from autocompile.apply import ModelInfo, find_repeated_blocks, load_snippet, render_snippet, without_code
from autocompile.engine.study import build_space
from autocompile.space import DEFAULTS, EAGER, Capabilities, SearchSpace, WorkloadTraits
from autocompile.workloads import WorkloadOptions, get_workload
from autocompile.workloads.kernels import sdpa_attention
from snippet_loop import snippet_losses

OPTIONS = WorkloadOptions(device="cpu", seed=0)


def test_the_sdpa_kernel_is_chosen_inside_the_forward_and_trains_the_same_losses():
    """attention flash: the snippet registers the model's own SDPA attention under a kernel choice of its own
    (never cuDNN's), set on the model; each decoder layer compiled alone traces the choice into its graph
    (so a compile cache never hands a graph traced under another kernel's choice), and the padded batches
    train eager's losses."""
    workload = get_workload("tiny-llama")
    batches = workload.batches(OPTIONS, 3)
    flash = {"scope": "regional", "attention": "flash"}
    # padded to the longest length: each layer compiled once, not again (dynamic) at the second batch's length
    model, losses = snippet_losses(workload, {**flash, "padding": "max"}, batches, OPTIONS, attention="sdpa")
    assert model.config._attn_implementation == "autocompile_sdpa"
    _, eager = snippet_losses(workload, EAGER, batches, OPTIONS, attention="sdpa")
    assert losses == pytest.approx(eager, rel=1e-3)

    fresh, _ = workload.build(OPTIONS)
    fresh.set_attn_implementation("sdpa")
    snippet = load_snippet(render_snippet({**DEFAULTS, **flash}, ModelInfo(regions=find_repeated_blocks(fresh))))
    snippet["sdpa_flash_on"](fresh)
    traced = []

    def record(gm, example_inputs):
        traced.append(gm)
        return gm.forward

    torch._dynamo.reset()
    hidden = torch.randn(1, 16, fresh.config.hidden_size)
    position = torch.arange(16)[None]
    layer = torch.compile(fresh.model.layers[0], backend=record)
    layer(hidden, position_embeddings=fresh.model.rotary_emb(hidden, position), position_ids=position)
    targets = {getattr(node.target, "__name__", str(node.target)) for gm in traced for node in gm.graph.nodes}
    assert "_sdpa_kernel" in targets, targets


def test_the_attention_kernel_is_offered_on_a_gpu_for_hugging_faces_sdpa_only():
    """On the CPU (no cuDNN kernel among torch's choices) and for a model whose attention is not Hugging Face's
    SDPA, the dimension is left out with its reason; on CUDA for such a model it is offered, not under FlexAttention
    or varlen_attn; a configuration that sets it where it is not offered is refused with why."""
    cpu = build_space("tiny-lora", "cpu")  # a peft-wrapped Llama with SDPA attention
    assert cpu.traits.sdpa_attention
    assert dict(cpu.left_out)["attention=flash"].endswith("needs a GPU")
    assert "attention" not in {d.name for d in cpu.dimensions}
    assert "attention flash" in cpu.rejection({**DEFAULTS, "attention": "flash"})

    cuda = SearchSpace(Capabilities.detect("cuda"), WorkloadTraits(sdpa_attention=True, varying={"input_ids": (1, 0)}))
    dimension = next(d for d in cuda.dimensions if d.name == "attention")
    assert dimension.choices == ("model", "flash")
    assert dimension.active({**DEFAULTS, "padding": "multiple"})
    assert not dimension.active({**DEFAULTS, "padding": "pack", "pack_attention": "varlen"})
    assert any(p.get("attention") == "flash" and p["scope"] == "regional" for p in cuda.starting_points())
    assert not any("attention" in p for p in cpu.starting_points())  # the recipe applies where it is offered
    other = SearchSpace(Capabilities.detect("cuda"), WorkloadTraits())
    assert "not a Hugging Face model's SDPA" in dict(other.left_out)["attention=flash"]


def test_a_model_whose_attention_is_not_sdpa_is_not_switched():
    """Only a Hugging Face model whose attention is SDPA counts: a model built with eager attention does not,
    the same switched to SDPA does, and a winner that chooses the kernel has no code-free Trainer form."""
    model, _ = get_workload("tiny-llama").build(OPTIONS)
    assert not sdpa_attention(model)  # built with eager attention
    model.set_attn_implementation("sdpa")
    assert sdpa_attention(model)
    assert without_code({**DEFAULTS, "scope": "regional"})
    assert without_code({**DEFAULTS, "scope": "regional", "attention": "flash"}) == []
    assert without_code({**DEFAULTS, "scope": "regional", "fused_optimizer": True}) == []
