"""A causal LM's loss from its last hidden states and its head's weight, a chunk of tokens at a time (lm_loss):
torch's fused linear cross-entropy where this torch has it, the snippet's compiled chunked one everywhere; each
trains the model's own losses, and is offered only where the loss is a Hugging Face causal LM's own."""

import dataclasses
import os
import sys

import pytest
import torch

from autocompile.apply import ModelInfo, find_repeated_blocks, load_snippet, render_snippet, without_code
from autocompile.engine.study import build_space
from autocompile.space import DEFAULTS, EAGER, Capabilities, SearchSpace, WorkloadTraits
from autocompile.workloads import WorkloadOptions, get_workload
from autocompile.workloads.kernels import lm_loss_refusal

sys.path.insert(0, os.path.dirname(__file__))
import trainer_jobs  # noqa: E402

CPU = Capabilities.detect("cpu")
HOWS = ["chunked"] + (["fused"] if CPU.has_linear_cross_entropy else [])


def batches(n: int = 3) -> list[dict]:
    """Rows of one length (one compile), some right-padded: the padding's labels -100, the labels unshifted (the
    model shifts them)."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for padding in (0, 5, 11)[:n]:
        ids = torch.randint(3, trainer_jobs.VOCAB, (4, 24), generator=generator)
        labels = ids.clone()
        labels[1:, 24 - padding :] = -100
        out.append({"input_ids": ids, "labels": labels})
    return out


def trained(config: dict) -> tuple[torch.nn.Module, list[float]]:
    """The tiny Llama trained through the snippet of `config` on its own loss (labels passed to the model)."""
    torch._dynamo.reset()
    model = trainer_jobs.model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    snippet = load_snippet(render_snippet({**DEFAULTS, **config}, ModelInfo(regions=find_repeated_blocks(model))))
    model, optimizer = snippet["apply_compilation"](model, optimizer)
    losses = []
    for batch in batches():
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return model, losses


@pytest.mark.parametrize("how", HOWS)
def test_the_loss_from_the_hidden_states_trains_the_models_own_losses(how):
    """Compiled whole (the loss inside the model's graph), the model's head passes its hidden states through and
    its loss_function takes them: the same losses as eager's, and the same weights after training."""
    eager_model, eager = trained(EAGER)
    model, losses = trained({"scope": "full", "lm_loss": how})
    assert losses == pytest.approx(eager, rel=1e-4)
    hidden = model(input_ids=batches(1)[0]["input_ids"]).logits
    assert hidden.shape[-1] == model.config.hidden_size  # never the [tokens, vocabulary] logits
    initial = trainer_jobs.model()
    for (name, p), q, before in zip(eager_model.named_parameters(), model.parameters(), initial.parameters()):
        assert torch.allclose(p, q, atol=1e-4), name
        assert not torch.allclose(p, before), f"{name} did not train"


def test_the_chunked_cross_entropy_gives_the_reference_loss_and_gradients():
    """The snippet's compiled ChunkedCrossEntropy against cross_entropy over the whole logits: its sum over the
    tokens, the gradients of the hidden states and of the weight, and none for a frozen weight (a LoRA head)."""
    torch._dynamo.reset()
    snippet = load_snippet(render_snippet({**DEFAULTS, "lm_loss": "chunked"}, ModelInfo()))
    chunked = snippet["chunked_cross_entropy"]
    hidden = torch.randn(37, 16, requires_grad=True)  # not a multiple of the chunks
    weight = torch.randn(300, 16, requires_grad=True)
    targets = torch.randint(0, 300, (37,))
    targets[::3] = -100
    reference = torch.nn.functional.cross_entropy(hidden @ weight.T, targets, ignore_index=-100, reduction="sum")
    loss = chunked(hidden, weight, targets, -100)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)
    expected = torch.autograd.grad(reference * 0.5, (hidden, weight))
    got = torch.autograd.grad(loss * 0.5, (hidden, weight))
    for e, g in zip(expected, got):
        assert torch.allclose(e, g, atol=1e-5)
    frozen = weight.detach()
    (grad,) = torch.autograd.grad(chunked(hidden, frozen, targets, -100), (hidden,))
    assert torch.allclose(grad, expected[0] * 2, atol=1e-5)


def test_it_is_offered_where_the_loss_is_a_causal_lms_own_and_left_out_with_why_elsewhere():
    """A preset causal LM's criterion is its model's loss_function: offered; the captioner's decoder is no causal LM
    of transformers' kind: left out with why; a Trainer's causal LM (its loss the model's own) is offered model,
    fused (where this torch has linear_cross_entropy) and chunked; a torch without it leaves fused out with why; a
    configuration that asks for it where it is not offered is refused with why."""
    assert "lm_loss" in {d.name for d in build_space("tiny-llama", "cpu").dimensions}
    captioner = build_space("tiny-captioner", "cpu")
    assert "not a Hugging Face causal LM" in dict(captioner.left_out)["lm_loss"]
    assert "lm_loss" not in {d.name for d in captioner.dimensions}
    assert "lm_loss chunked" in captioner.rejection({**DEFAULTS, "lm_loss": "chunked"})

    model = trainer_jobs.model()
    assert lm_loss_refusal(model, own_loss=True) is None
    assert "criterion" in lm_loss_refusal(model, own_loss=False)
    assert "not a Hugging Face causal LM" in lm_loss_refusal(model.model, own_loss=True)
    model.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in lm_loss_refusal(model, own_loss=True)

    traits = WorkloadTraits(lm_loss_refusal=None)
    offered = SearchSpace(dataclasses.replace(CPU, has_linear_cross_entropy=True), traits)
    assert next(d for d in offered.dimensions if d.name == "lm_loss").choices == ("model", "fused", "chunked")
    older = SearchSpace(dataclasses.replace(CPU, has_linear_cross_entropy=False, torch_version="2.11.0"), traits)
    assert next(d for d in older.dimensions if d.name == "lm_loss").choices == ("model", "chunked")
    assert dict(older.left_out)["lm_loss=fused"] == "torch 2.11.0 has no torch.nn.functional.linear_cross_entropy"
    assert "linear_cross_entropy" in older.rejection({**DEFAULTS, "lm_loss": "fused"})
    assert older.rejection({**DEFAULTS, "lm_loss": "chunked"}) is None
    assert without_code({**DEFAULTS, "lm_loss": "chunked"}) == []


@pytest.mark.slow  # a Trainer trained twice, eight steps each
def test_a_trainers_job_trains_the_same_losses_with_the_chunked_loss_compiled_apart():
    """Through apply_to_trainer, the loss compiled apart (compute_loss_func: model_loss over the model's
    loss_function, switched first) and normalised by the Trainer's count of the batch's tokens: the same losses and
    weights as the Trainer as built. Padded to the longest length (the padding's labels -100, so the same count of
    tokens): the blocks and the loss compiled once each, not again (dynamic) at a second length, 124 s of a run on
    2 busy cores; what is under test is the loss."""
    from test_trainer import trained_alike

    trainer = trained_alike("language_modeling", scope="regional", compile_loss=True, lm_loss="chunked", padding="max")
    assert type(trainer.model.lm_head).__name__ == "HiddenHead"


def test_a_presets_criterion_follows_the_models_loss_to_the_hidden_states():
    """A preset's criterion is its model's own loss_function: with the chunked loss (compiled apart, as
    compile_loss runs it) the model gives its hidden states and the criterion the same losses as eager's."""

    def losses(config: dict) -> list[float]:
        torch._dynamo.reset()
        workload = get_workload("tiny-llama")
        options = WorkloadOptions(device="cpu", seed=0, seq_len=32)
        model, optimizer = workload.build(options)
        info = ModelInfo(regions=find_repeated_blocks(model))
        snippet = load_snippet(render_snippet({**DEFAULTS, **config}, info))
        model, optimizer = snippet["apply_compilation"](model, optimizer)
        criterion = snippet["compile_loss"](workload.criterion)
        out = []
        batches = workload.batches(options, 3)
        # one length (the shortest batch's): the blocks and the loss compiled once each, not again (dynamic) at a
        # second length, half of the test's 120 s on 2 busy cores; what is under test is the loss
        width = min(batch["input_ids"].shape[1] for batch in batches)
        for batch in batches:
            batch = {key: value[:, :width].contiguous() for key, value in batch.items()}
            loss = criterion(workload.forward(model, batch), batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            out.append(loss.item())
        return out

    eager = losses(EAGER)
    assert losses({"scope": "regional", "compile_loss": True, "lm_loss": "chunked"}) == pytest.approx(eager, rel=1e-4)
