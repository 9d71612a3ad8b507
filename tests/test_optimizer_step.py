"""The optimizer step's two techniques from seed 001 as dimensions: static_grads (gradients zeroed in
place and marked static for CUDA graphs) and foreach_map_optimizer (the Adam/AdamW step as one
compiled function of foreach_map ops). Each is listed with its conditions, and its snippet, pasted
into a plain training loop, trains with eager's numerics (the numerics guard's tolerance)."""

import json

import pytest
import torch

from autocompile.apply import ModelInfo, load_snippet, render_snippet
from autocompile.engine.scoring import compare_losses
from autocompile.engine.study import build_space
from autocompile.space import DEFAULTS, Capabilities, SearchSpace, WorkloadTraits
from autocompile.space.optimizer import foreach_map_refusal
from conftest import PLAIN_GRAPHS, toy


def config(**changes):
    return {**DEFAULTS, **changes}


def _listing(capsys, *args) -> dict:
    from autocompile.cli import main

    assert main(["space", "--model", toy(), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_space_lists_both_with_their_conditions_and_what_is_left_out(capsys):
    cpu = _listing(capsys, "--device", "cpu")
    dims, left_out = {d["name"]: d for d in cpu["dimensions"]}, dict((i["name"], i["why"]) for i in cpu["left_out"])
    assert dims["foreach_map_optimizer"]["choices"] == [False, True] and "foreach_map" in dims["foreach_map_optimizer"]["help"]
    assert "static_grads" not in dims and "its effect is on CUDA graphs" in left_out["static_grads"]
    cuda = {d["name"]: d for d in _listing(capsys, "--device", "cuda")["dimensions"]}  # listed on a CPU machine
    assert "the step itself compiles in the default mode" in cuda["static_grads"]["help"]  # what it reaches, said
    space = build_space(toy(), "cuda")
    static, step = space.dimension("static_grads"), space.dimension("foreach_map_optimizer")
    assert static.active(config(compile_optimizer=True, mode="reduce-overhead"))
    assert not static.active(config(compile_optimizer=True)) and not static.active(config(mode="max-autotune"))
    assert step.active(DEFAULTS) and not step.active(config(compile_optimizer=True))
    assert not step.active(config(fused_optimizer=True))
    # what an optimizer or a torch lacks is left out, with the reason
    param = [torch.nn.Parameter(torch.zeros(2))]
    for optimizer, why in (
        (torch.optim.SGD(param, lr=0.1), "the optimizer is SGD"),
        (torch.optim.Adam(param, amsgrad=True), "amsgrad=True"),
    ):
        refused = SearchSpace(Capabilities.detect("cpu"), WorkloadTraits(foreach_map_refusal=foreach_map_refusal(optimizer)))
        assert why in dict(refused.left_out)["foreach_map_optimizer"]
    caps = Capabilities.detect("cuda")
    caps.has_foreach_map = caps.has_mark_static_address = False
    lacking = dict(SearchSpace(caps, WorkloadTraits(foreach_map_refusal=None)).left_out)
    assert "has no torch._higher_order_ops.foreach_map" in lacking["foreach_map_optimizer"]
    assert "has no torch._dynamo.mark_static_address" in lacking["static_grads"]
    assert "has no torch._dynamo.mark_static_address" in lacking["graph_step"]


def test_the_step_under_cuda_graphs_of_its_own_is_offered_on_cuda_with_its_conditions(capsys):
    """graph_step: listed where CUDA is (its reason where not), with a compiled step and, under a schedule,
    a tensor LR; static_grads then is not offered beside it, and a hand-written mix is refused saying why."""
    cpu = _listing(capsys, "--device", "cpu")
    assert "graph_step" not in {d["name"] for d in cpu["dimensions"]}
    assert "CUDA graphs need a CUDA device" in dict((i["name"], i["why"]) for i in cpu["left_out"])["graph_step"]
    unscheduled = build_space(toy(), "cuda")  # the toy's LR never changes: a float LR is a fine constant
    assert unscheduled.dimension("graph_step").active(config(compile_optimizer=True))
    space = build_space("tiny-llama", "cuda")  # under an LR schedule
    graphed, static = space.dimension("graph_step"), space.dimension("static_grads")
    assert "under CUDA graphs of its own" in graphed.help
    assert graphed.active(config(compile_optimizer=True, lr_tensor=True))
    assert not graphed.active(config(compile_optimizer=True)) and not graphed.active(config(lr_tensor=True))
    assert not static.active(config(compile_optimizer=True, lr_tensor=True, mode="reduce-overhead", graph_step=True))
    for changes, why in (
        ({"lr_tensor": True}, "the step is not compiled"),
        ({"compile_optimizer": True}, "needs lr_tensor"),
        ({"compile_optimizer": True, "lr_tensor": True, "mode": "reduce-overhead", "static_grads": True}, "marks the gradients"),
    ):
        assert why in space.rejection(config(graph_step=True, **changes))
    assert space.rejection(config(graph_step=True, compile_optimizer=True, lr_tensor=True)) is None
    assert "CUDA graphs need a CUDA device" in build_space("tiny-llama", "cpu").rejection(
        config(graph_step=True, compile_optimizer=True, lr_tensor=True)
    )


def test_the_pasted_graph_step_snippet_trains_like_eager():
    """The snippet of graph_step compiles the step under reduce-overhead (with the host's options, under
    reduce-overhead's one option), its LR a tensor on the parameters' device and its gradients static.
    Pasted into a plain loop on the CPU, where Inductor records no CUDA graph, it trains with eager's
    numerics, one graph for every step under the schedule, gradients at the same addresses every step."""
    graphed = config(compile_optimizer=True, lr_tensor=True, graph_step=True)
    source = render_snippet(graphed, ModelInfo())
    assert 'optimizer.step = torch.compile(optimizer.step, mode="reduce-overhead")' in source
    assert "    static_grads(optimizer)" in source and "def static_grads(optimizer):" in source
    assert 'group["lr"] = torch.tensor(float(group["lr"]), device=device)' in source
    host = render_snippet({**graphed, "inductor": {"size_asserts": False}}, ModelInfo())
    assert "torch.compile(optimizer.step, options={'triton.cudagraphs': True, 'size_asserts': False})" in host
    eager, *_ = _train(config(compile=False), torch.optim.AdamW, weight_decay=0.05)
    losses, model, optimizer, graphs = _train(graphed, torch.optim.AdamW, weight_decay=0.05)
    assert not compare_losses(losses, eager, "cpu")["differs"], (losses, eager)
    assert graphs[-1] == graphs[1], graphs  # the step compiled at the first step, never again as the LR changes
    assert all(getattr(p.grad, "_dynamo_static_input_type", None) is not None for p in model.parameters())


def _groups(model) -> list[dict]:
    return [{"params": [model[0].weight, model[2].weight]}, {"params": [model[0].bias, model[2].bias], "weight_decay": 0.0}]


def _regression(cls, **hyper):
    """A small model, an optimizer with a group without weight decay, an LR schedule, and batches
    of a fixed linear map to learn: what a plain training loop over it does."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    optimizer = cls(_groups(model), lr=5e-2, **hyper)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.1 * step))  # before the snippet
    target = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    xs = [torch.randn(32, 8, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    return model, optimizer, scheduler, [(x, x @ target) for x in xs]


def _train(cfg, cls, **hyper):
    """The losses of a plain loop with the snippet of `cfg` pasted in, the trained model and
    optimizer, and the compiled graphs counted after each step."""
    from torch._dynamo.utils import counters

    model, optimizer, scheduler, batches = _regression(cls, **hyper)
    namespace = load_snippet(render_snippet(cfg, ModelInfo()))
    model, optimizer = namespace["apply_compilation"](model, optimizer)
    losses, graphs = [], []
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        namespace["backward"](loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        graphs.append(counters["stats"]["unique_graphs"])
    return losses, model, optimizer, graphs


@pytest.mark.parametrize(
    "cls, hyper",
    [
        (torch.optim.AdamW, {"weight_decay": 0.05}),  # decoupled weight decay
        (torch.optim.Adam, {"weight_decay": 0.1}),
    ],
)  # added to the gradient
def test_the_foreach_map_step_trains_like_torchs_and_keeps_its_state(cls, hyper):
    """The snippet's step replaces torch's Adam/AdamW step: eager's losses (the guard's tolerance) and
    weights, one compiled graph for every step under a changing LR, its state in optimizer.state under
    torch's names (a checkpoint loads into torch's optimizer), an optimizer it is not written for refused."""
    eager, eager_model, eager_optimizer, _ = _train(config(compile=False), cls, **hyper)
    source = render_snippet(config(foreach_map_optimizer=True), ModelInfo())
    assert "foreach_map_step(optimizer)" in source and "torch._higher_order_ops.foreach_map" in source
    losses, model, optimizer, graphs = _train(config(foreach_map_optimizer=True), cls, **hyper)
    assert not compare_losses(losses, eager, "cpu")["differs"], (losses, eager)
    assert losses[-1] < 0.8 * losses[0], losses  # it learns
    for mine, torchs in zip(model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(mine, torchs, rtol=1e-4, atol=1e-5)  # float32 rounding of steps of 0.05
    assert graphs[-1] == graphs[0], graphs  # compiled at the first step, never again as the LR changes
    param = next(model.parameters())
    assert set(optimizer.state[param]) == {"step", "exp_avg", "exp_avg_sq"} and float(optimizer.state[param]["step"]) == 6
    reloaded = cls(_groups(model), lr=5e-2, **hyper)  # a checkpoint of the step, into torch's optimizer
    reloaded.load_state_dict(optimizer.state_dict())
    torch.testing.assert_close(
        reloaded.state[param]["exp_avg_sq"],
        eager_optimizer.state[next(eager_model.parameters())]["exp_avg_sq"],
        rtol=1e-4,
        atol=1e-8,
    )
    model[0].weight.grad = torch.ones_like(model[0].weight)
    reloaded.step()  # torch's own step goes on from it
    with pytest.raises(ValueError, match="foreach_map_step: the optimizer is SGD"):
        load_snippet(source)["apply_compilation"](model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_static_grads_keep_the_gradients_in_place_marked_and_train_like_eager():
    """static_grads under a CUDA-graph mode: on the CPU, CUDA graphs are skipped, and what the
    snippet adds still runs: the gradients stay the same tensors, zeroed in place (whatever
    set_to_none says), marked static; the loop trains with eager's numerics."""
    cfg = config(mode="reduce-overhead", compile_optimizer=True, static_grads=True)
    source = render_snippet(cfg, ModelInfo())
    assert "static_grads(optimizer)" in source and "torch._dynamo.mark_static_address(param.grad)" in source
    assert "static_grads" not in render_snippet(config(mode="reduce-overhead", compile_optimizer=True), ModelInfo())
    eager, *_ = _train(config(compile=False), torch.optim.AdamW)
    losses, model, optimizer, _ = _train(cfg, torch.optim.AdamW)
    assert not compare_losses(losses, eager, "cpu")["differs"], (losses, eager)
    assert losses[-1] < 0.8 * losses[0], losses
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and not g.any() for g in grads)  # kept, zeroed in place by the loop's zero_grad()
    assert all(getattr(g, "_dynamo_static_input_type", None) == "unguarded" for g in grads)
    optimizer.zero_grad(set_to_none=True)  # as a trial's loop calls it
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    x = torch.randn(4, next(model.parameters()).shape[1])
    model(x).sum().backward()
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))  # accumulated in place, not replaced
    fresh, *_ = _regression(torch.optim.AdamW)  # the first step: gradients autograd made
    fresh_optimizer = torch.optim.AdamW(fresh.parameters())
    load_snippet(source)["apply_compilation"](fresh, fresh_optimizer)
    fresh(x).sum().backward()
    made = [p.grad for p in fresh.parameters()]
    fresh_optimizer.step()  # copies each into memory of its own (a CUDA graph's output is overwritten later)
    assert all(p.grad is not g and torch.equal(p.grad, g) for p, g in zip(fresh.parameters(), made))


def test_the_search_proposes_the_foreach_map_step_as_a_neighbour():
    """Everything else pinned, plain torch.compile measured: the incumbent's neighbour is the step."""
    import optuna

    from autocompile.engine.strategy import PROMISE, next_neighbour

    names = [name for name, _ in PROMISE]
    assert names.index("foreach_map_optimizer") == names.index("compile_optimizer") + 1
    assert names.index("static_grads") == names.index("mode") + 1
    fixed = {**PLAIN_GRAPHS, "compile_optimizer": False, "fused_optimizer": False, "compile_loss": False}
    del fixed["foreach_map_optimizer"]
    space = build_space(toy(), "cpu", fixed=fixed)
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    for key, value in {
        "status": "ok",
        "config": DEFAULTS,
        "role": "compile-defaults",
        "steps_per_s": 10.0,
        "warmup_s": 5.0,
        "wall_s": 20.0,
    }.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 9.0)
    move = next_neighbour(space, study, lambda config, params: False)
    assert move["changed"] == ["foreach_map_optimizer"] and move["config"]["foreach_map_optimizer"] is True
    assert space.rejection(move["config"]) is None


class _Blocks(torch.nn.Module):
    """Three repeated blocks between an input layer and a head: what step_in_backward steps a block at a time."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh()) for _ in range(3))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def _blocks_training(cfg, steps: int = 6, backwards: int = 1):
    """A plain loop over _Blocks with the snippet of `cfg` pasted in: two parameter groups (the biases without
    weight decay), an LR schedule made before the snippet; the losses, the model and the optimizer."""
    torch.manual_seed(0)
    model = _Blocks()
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    weights = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    optimizer = torch.optim.AdamW([{"params": weights}, {"params": biases, "weight_decay": 0.0}], lr=5e-2, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.1 * step))
    target = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    namespace = load_snippet(render_snippet(cfg, ModelInfo(regions=["blocks"])))
    model, optimizer = namespace["apply_compilation"](model, optimizer)
    losses, moved = [], set()  # moved: the parameters a backward changed, before optimizer.step()
    for i in range(steps):
        x = torch.randn(32, 8, generator=torch.Generator().manual_seed(i))
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        for _ in range(backwards):
            loss = torch.nn.functional.mse_loss(model(x), x @ target)
            namespace["backward"](loss)
        moved |= {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, model, optimizer, moved


def test_each_blocks_step_in_the_backward_trains_the_same_model_and_refuses_accumulation():
    """step_in_backward: each block steps as its gradients come in, the rest at optimizer.step(); the same
    losses and weights as the optimizer's own step (each parameter's arithmetic is its own), its state where
    torch keeps it, under a schedule; a second backward before the step is an error, not a double step."""
    cfg = config(scope="regional", step_in_backward=True)
    source = render_snippet(cfg, ModelInfo(regions=["blocks"]))
    assert "    step_in_backward(model, optimizer, REGIONS)" in source and "STEP_REGIONS" not in source
    assert "STEP_REGIONS = ['blocks']" in render_snippet(config(step_in_backward=True), ModelInfo(regions=["blocks"]))
    plain, plain_model, plain_optimizer, unmoved = _blocks_training(config(scope="regional"))
    losses, model, optimizer, moved = _blocks_training(cfg)
    assert not unmoved and moved == {f"blocks.{i}.0.{p}" for i in range(3) for p in ("weight", "bias")}, moved
    assert losses == plain, (losses, plain)
    for mine, theirs in zip(model.parameters(), plain_model.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    for mine, theirs in zip(model.parameters(), plain_model.parameters()):
        assert float(optimizer.state[mine]["step"]) == float(plain_optimizer.state[theirs]["step"]) == 6
    whole = _blocks_training(config(step_in_backward=True))  # the whole model compiled: the blocks named apart
    assert whole[0] == _blocks_training(config())[0] and whole[3] == moved, whole
    with pytest.raises(RuntimeError, match="a second backward before optimizer.step"):
        _blocks_training(cfg, steps=1, backwards=2)


def test_the_foreach_map_step_in_the_backward_compiles_one_graph_for_the_blocks_and_trains_the_same():
    """step_in_backward beside the foreach_map step: each block steps through that compiled function as its
    gradients come in, one graph (not dynamic) for every block of the same shapes and one for the rest; the same
    losses and weights as the foreach_map step after the backward."""
    from torch._dynamo.utils import counters

    cfg = config(scope="regional", foreach_map_optimizer=True, step_in_backward=True)
    source = render_snippet(cfg, ModelInfo(regions=["blocks"]))
    body = source[source.index("def apply_compilation") :]
    assert body.index("    foreach_map_step(optimizer)") < body.index("    step_in_backward(model, optimizer, REGIONS)")
    assert "STEP_COMPILE_KWARGS = {'dynamic': False}" in source
    _blocks_training(config(scope="regional"), steps=1)  # the blocks' own graphs compiled: only steps' counted
    graphs = counters["stats"]["unique_graphs"]
    plain, plain_model, _, unmoved = _blocks_training(config(scope="regional", foreach_map_optimizer=True))
    plain_graphs, graphs = counters["stats"]["unique_graphs"] - graphs, counters["stats"]["unique_graphs"]
    losses, model, optimizer, moved = _blocks_training(cfg)
    assert counters["stats"]["unique_graphs"] - graphs == plain_graphs + 1  # the blocks' step: one graph for three
    assert not unmoved and moved == {f"blocks.{i}.0.{p}" for i in range(3) for p in ("weight", "bias")}, moved
    assert losses == plain, (losses, plain)
    for mine, theirs in zip(model.parameters(), plain_model.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    assert all(float(optimizer.state[p]["step"]) == 6 for p in model.parameters())


def test_step_in_backward_is_offered_with_the_optimizers_own_step_and_refused_where_it_would_train_otherwise():
    """Listed for a model of repeated blocks and torch's per-parameter optimizers, beside the optimizer's own
    step or the foreach_map step, not a compiled one; left out, with the reason, for another optimizer and a Trainer's loop."""
    from autocompile.space.optimizer import step_in_backward_refusal
    from autocompile.workloads import Workload

    space = build_space("tiny-llama", "cpu")
    dim = space.dimension("step_in_backward")
    assert dim.active(DEFAULTS) and not dim.active(config(compile_optimizer=True))
    assert "foreach_map step, not compile_optimizer" in space.rejection(config(step_in_backward=True, compile_optimizer=True))
    assert space.rejection(config(step_in_backward=True, fused_optimizer=True)) is None
    assert space.rejection(config(step_in_backward=True, foreach_map_optimizer=True)) is None
    assert dim.active(config(foreach_map_optimizer=True)) and not dim.active(config(clip_in_step=True))
    param = [torch.nn.Parameter(torch.zeros(2))]
    workload = Workload.__new__(Workload)
    object.__setattr__(workload, "framework", "")
    assert step_in_backward_refusal(workload, torch.optim.SGD(param, lr=0.1)) is None
    assert "the optimizer is Adagrad" in step_in_backward_refusal(workload, torch.optim.Adagrad(param))
    object.__setattr__(workload, "framework", "trainer")
    why = step_in_backward_refusal(workload, torch.optim.AdamW(param))
    assert "clip or accumulate" in why
    refused = SearchSpace(Capabilities.detect("cpu"), WorkloadTraits(regions=["blocks"], step_in_backward_refusal=why))
    assert why in dict(refused.left_out)["step_in_backward"]
    blockless = SearchSpace(Capabilities.detect("cpu"), WorkloadTraits(regions=[], step_in_backward_refusal=None))
    assert "no repeated blocks" in dict(blockless.left_out)["step_in_backward"]
