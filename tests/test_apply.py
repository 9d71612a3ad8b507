"""The snippet applies exactly what its configuration says: checked on real models, compiled for real."""

import ast

import pytest
import torch

from autocompile.apply import ModelInfo, bucket_lengths, find_repeated_blocks, load_snippet, render_snippet
from autocompile.space import DEFAULTS, EAGER
from autocompile.workloads import WorkloadOptions, get_workload
from conftest import toy

WORKLOAD = get_workload(toy())
OPTIONS = WorkloadOptions(device="cpu", seed=0)


def config(**changes):
    return {**DEFAULTS, **changes}


def info(workload=WORKLOAD, model=None, device_type="cpu"):
    model = model or workload.build(OPTIONS)[0]
    return ModelInfo(
        regions=find_repeated_blocks(model),
        parts=workload.parts,
        varying=dict(workload.varying),
        max_len=workload.max_len(OPTIONS),
        device_type=device_type,
    )


def applied(cfg, workload=WORKLOAD):
    model, optimizer = workload.build(OPTIONS)
    namespace = load_snippet(render_snippet(cfg, info(workload, model)))
    model, optimizer = namespace["apply_compilation"](model, optimizer)
    return model, optimizer, namespace["prepare_batch"]


def compiled(module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None


def train_step(model, optimizer, prepare_batch, batch):
    batch = prepare_batch(dict(batch))
    loss = WORKLOAD.loss(model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss


def test_snippet_imports_only_torch():
    for cfg in (EAGER, config(scope="regional", compile_optimizer=True, padding="buckets", mark_dynamic="mark")):
        tree = ast.parse(render_snippet(cfg, info()))
        imports = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
        assert imports == {"torch"}
        inside = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        assert inside == {"torch", "json", "triton"}  # the warm start: json, and triton's version if it is there
        assert not any(isinstance(node, ast.ImportFrom) for node in ast.walk(tree))


def test_eager_compiles_nothing():
    model, optimizer, _ = applied(EAGER)
    assert not compiled(model) and not any(compiled(b) for b in model.blocks)
    assert not hasattr(optimizer.step, "_torchdynamo_orig_callable")


def test_full_scope_compiles_the_model_and_trains():
    model, optimizer, prepare = applied(config(scope="full"))
    assert compiled(model) and not any(compiled(b) for b in model.blocks)
    batch = WORKLOAD.batches(OPTIONS, 1)[0]
    reference = WORKLOAD.loss(WORKLOAD.build(OPTIONS)[0], batch)
    loss = train_step(model, optimizer, prepare, batch)
    assert torch.allclose(loss, reference, rtol=1e-4)  # same seed, same weights: same first loss
    assert not any("_orig_mod" in key for key in model.state_dict())  # compiled in place: checkpoints unchanged


def test_regional_scope_compiles_each_block_and_trains():
    # padded to the longest length (the toy's loss is the same): each block compiled once, not again (dynamic)
    model, optimizer, prepare = applied(config(scope="regional", compile_optimizer=True, padding="max"))
    assert not compiled(model)
    assert all(compiled(block) for block in model.blocks)
    assert hasattr(optimizer.step, "_torchdynamo_orig_callable")
    for batch in WORKLOAD.batches(OPTIONS, 2):
        assert torch.isfinite(train_step(model, optimizer, prepare, batch))


def test_modular_scope_compiles_each_part_with_its_own_mode():
    workload = get_workload("tiny-captioner")
    cfg = config(scope="modular", part_modes={"encoder": "max-autotune-no-cudagraphs", "decoder": "default"})
    source = render_snippet(cfg, info(workload))
    assert "'encoder': {'mode': 'max-autotune-no-cudagraphs'}" in source and "'decoder': {}" in source
    model, _, _ = applied(cfg, workload)
    assert compiled(model.encoder) and compiled(model.decoder) and not compiled(model)


def test_fused_optimizer_switches_the_implementation():
    _, optimizer, _ = applied(config(fused_optimizer=True))
    assert all(g["fused"] and not g["foreach"] for g in optimizer.param_groups)


@pytest.mark.parametrize(
    "padding, extra, check",
    [
        ("longest", {}, lambda n, original: n == original),
        ("multiple", {"pad_multiple": 32}, lambda n, original: n % 32 == 0 and n >= original),
        ("buckets", {}, lambda n, original: n in bucket_lengths(48) and n >= original),
        ("max", {}, lambda n, original: n == 48),
    ],
)
def test_padding_produces_the_lengths_asked_for(padding, extra, check):
    _, _, prepare = applied(config(compile=False, padding=padding, **extra))
    for batch in WORKLOAD.batches(OPTIONS, 4):
        original = batch["input_ids"].shape[1]
        padded = prepare(dict(batch))
        n = padded["input_ids"].shape[1]
        assert check(n, original), (padding, original, n)
        assert padded["labels"].shape == padded["input_ids"].shape
        assert (padded["input_ids"][:, original:] == 0).all() and (padded["labels"][:, original:] == -100).all()
        assert torch.equal(padded["input_ids"][:, :original], batch["input_ids"])


def test_bucket_lengths_stay_within_the_recompile_limit():
    assert bucket_lengths(2048) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert bucket_lengths(256) == [16, 32, 64, 128, 256]
    assert bucket_lengths(300, limit=3) == [128, 256, 300]


@pytest.mark.parametrize("how, attribute", [("mark", "_dynamo_dynamic_indices"), ("maybe", "_dynamo_weak_dynamic_indices")])
def test_mark_dynamic_marks_the_varying_dimension(how, attribute):
    _, _, prepare = applied(config(mark_dynamic=how))
    batch = prepare(dict(WORKLOAD.batches(OPTIONS, 1)[0]))
    for key in WORKLOAD.varying:
        assert 1 in getattr(batch[key], attribute, set()), key


def test_cuda_graph_modes_mark_each_step_and_options_expand_the_mode():
    cuda = info(device_type="cuda")
    assert "cudagraph_mark_step_begin" in render_snippet(config(mode="reduce-overhead"), cuda)
    assert "cudagraph_mark_step_begin" not in render_snippet(config(mode="max-autotune-no-cudagraphs"), cuda)
    source = render_snippet(config(mode="max-autotune", inductor={"shape_padding": False}), cuda)
    namespace = load_snippet(source)
    kwargs = namespace["COMPILE_KWARGS"]
    assert "mode" not in kwargs  # torch.compile takes mode or options, not both
    assert kwargs["options"]["max_autotune"] is True and kwargs["options"]["shape_padding"] is False


def test_compile_loss_compiles_the_criterion_apart_and_trains_a_fresh_model():
    from torch._dynamo.utils import counters

    assert load_snippet(render_snippet(config(), info()))["compile_loss"](WORKLOAD.criterion) is WORKLOAD.criterion
    cfg = config(scope="regional", compile_loss=True, dynamic=False)
    source = render_snippet(cfg, info())
    assert "LOSS_COMPILE_KWARGS = {'dynamic': False}" in source
    model, optimizer = WORKLOAD.build(OPTIONS)
    namespace = load_snippet(source)
    model, optimizer = namespace["apply_compilation"](model, optimizer)
    criterion = namespace["compile_loss"](WORKLOAD.criterion)
    assert criterion._torchdynamo_orig_callable is WORKLOAD.criterion  # a compiled function around the criterion
    batch = WORKLOAD.batches(OPTIONS, 1)[0]
    reference = WORKLOAD.loss(WORKLOAD.build(OPTIONS)[0], batch)
    logits = WORKLOAD.forward(model, namespace["prepare_batch"](dict(batch)))  # the blocks compile here
    graphs = counters["stats"]["unique_graphs"]
    loss = criterion(logits, batch)
    assert counters["stats"]["unique_graphs"] == graphs + 1  # the criterion: one graph of its own
    assert type(loss.grad_fn).__name__ == "CompiledFunctionBackward"  # its backward is compiled too
    loss.backward()
    optimizer.step()
    assert torch.allclose(loss, reference, rtol=1e-4)


def test_the_host_options_reach_every_graph_the_snippet_compiles():
    """The Inductor options of the host's launch work (space INDUCTOR_OPTIONS_HOST) concern each compiled graph's
    wrapper: the model's blocks, the loss and the optimizer step all take them. With size_asserts off, no
    wrapper Inductor writes for a training step checks its inputs' sizes and strides (with it on, they do),
    and the step trains like eager."""
    from torch._inductor.utils import run_and_get_code

    losses, codes = {}, {}
    for asserts in (True, False):
        torch._dynamo.reset()
        inductor = {"size_asserts": asserts, "epilogue_fusion": False}
        cfg = config(scope="regional", compile_loss=True, compile_optimizer=True, lr_tensor=True, inductor=inductor)
        source = render_snippet(cfg, info())
        assert f"optimizer.step = torch.compile(optimizer.step, options={{'size_asserts': {asserts}}})" in source
        model, optimizer = WORKLOAD.build(OPTIONS)
        namespace = load_snippet(source)
        model, optimizer = namespace["apply_compilation"](model, optimizer)
        criterion = namespace["compile_loss"](WORKLOAD.criterion)
        batch = namespace["prepare_batch"](dict(WORKLOAD.batches(OPTIONS, 1)[0]))

        def step():
            loss = criterion(WORKLOAD.forward(model, batch), batch)
            loss.backward()
            optimizer.step()
            return loss

        losses[asserts], codes[asserts] = run_and_get_code(step)
    assert len(codes[False]) >= 4  # the block's forward and backward, the loss's, the optimizer step's
    assert all("assert_size_stride(" in code for code in codes[True])  # a call (the name is imported in any case)
    assert not any("assert_size_stride(" in code for code in codes[False])
    assert torch.allclose(losses[False], losses[True])


@pytest.mark.parametrize("lr_tensor", [False, True])
def test_a_tensor_lr_keeps_a_scheduled_compiled_step_from_recompiling(lr_tensor):
    """An LR that changes every step: a float LR is a constant of the compiled step (a new
    graph for each value with foreach, the CUDA default); as a tensor, one graph serves all."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # Adam.step is shared: other tests' compiled steps must not count
    model = torch.nn.Linear(4, 4, bias=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 100)  # before compiling
    namespace = load_snippet(render_snippet(config(compile_optimizer=True, lr_tensor=lr_tensor), ModelInfo()))
    model, optimizer = namespace["apply_compilation"](model, optimizer)
    graphs = []
    for _ in range(3):
        model.weight.grad = torch.ones_like(model.weight)
        optimizer.step()
        scheduler.step()
        graphs.append(counters["stats"]["unique_graphs"])
    group = optimizer.param_groups[0]
    assert float(group["lr"]) == pytest.approx(1e-3 * 4 / 100)  # the scheduler's value reached the optimizer
    if lr_tensor:
        assert isinstance(group["lr"], torch.Tensor) and group["foreach"] is False  # CPU: foreach needs capturable
        assert graphs[-1] == graphs[0], graphs  # no recompile
    else:
        assert graphs[-1] >= graphs[0] + 2, graphs  # a recompile at each new LR


def test_an_activation_memory_budget_recomputes_and_trains_like_eager():
    """A budget below 1 makes AOTAutograd's partitioner keep fewer activations for the backward
    (recomputing the rest): the snippet sets it before compiling, and the compiled model trains
    with eager's numerics (the same first losses from the same weights and batches)."""
    import torch._functorch.config as functorch_config

    before = functorch_config.activation_memory_budget
    batches = WORKLOAD.batches(OPTIONS, 3)
    try:
        cfg = config(scope="full", activation_memory_budget=0.5, padding="max")  # one compile: one length
        source = render_snippet(cfg, info())
        assert "ACTIVATION_MEMORY_BUDGET = 0.5" in source
        model, optimizer, prepare = applied(cfg)
        assert functorch_config.activation_memory_budget == 0.5
        compiled_losses = [float(train_step(model, optimizer, prepare, b)) for b in batches * 2]
    finally:
        functorch_config.activation_memory_budget = before
    model, optimizer, prepare = applied(EAGER)
    eager_losses = [float(train_step(model, optimizer, prepare, b)) for b in batches * 2]
    assert compiled_losses == pytest.approx(eager_losses, rel=1e-3)
    assert sum(compiled_losses[3:]) < sum(compiled_losses[:3])  # the second pass over the same batches: it learned


def test_compiled_autograd_compiles_the_backward_and_trains_like_eager():
    """backward(loss) under Compiled Autograd: the autograd engine's backward is captured and
    compiled as a graph of its own (torch counts the captures), and the model trains with eager's
    numerics; without it, backward(loss) is loss.backward()."""
    from torch._dynamo.utils import counters

    batches = WORKLOAD.batches(OPTIONS, 3)
    plain = load_snippet(render_snippet(config(scope="full"), info()))
    assert "compiled_autograd" not in render_snippet(config(scope="full"), info())
    model, optimizer = WORKLOAD.build(OPTIONS)
    # padded to the longest length (the toy's loss is the same): one length, each graph compiled once
    cfg = config(scope="full", compiled_autograd=True, padding="max")
    namespace = load_snippet(render_snippet(cfg, info(model=model)))
    model, optimizer = namespace["apply_compilation"](model, optimizer)
    before = sum(counters["compiled_autograd"].values())
    losses = []
    for batch in batches * 2:
        loss = WORKLOAD.loss(model, namespace["prepare_batch"](dict(batch)))
        namespace["backward"](loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    assert sum(counters["compiled_autograd"].values()) > before  # the backward went through Compiled Autograd
    model, optimizer = WORKLOAD.build(OPTIONS)
    eager = []
    for batch in batches * 2:
        loss = WORKLOAD.loss(model, dict(batch))
        plain["backward"](loss)
        optimizer.step()
        optimizer.zero_grad()
        eager.append(float(loss))
    assert losses == pytest.approx(eager, rel=1e-3)
    assert sum(losses[3:]) < sum(losses[:3])
