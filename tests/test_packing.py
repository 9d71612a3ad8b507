"""Variable-length batches packed instead of padded: the snippet packs each batch's own sequences into rows,
the model trains on the same tokens to the same losses, shapes repeat, and a model that lets packed
sequences see each other is refused by the numerics guard with that reason."""

import json
import subprocess
import sys

import pytest
import torch

from autocompile.apply import ModelInfo, find_repeated_blocks, load_snippet, render_snippet
from autocompile.engine.study import build_space
from autocompile.space import DEFAULTS, EAGER
from autocompile.space.rules import compiled_shapes
from autocompile.workloads import WorkloadOptions, get_workload
from conftest import command, toy

OPTIONS = WorkloadOptions(device="cpu", seed=0)
ENCODER = toy("tiny_encoder")


def _info(workload, model):
    return ModelInfo(
        regions=find_repeated_blocks(model),
        parts=workload.parts,
        varying=dict(workload.varying),
        max_len=workload.max_len(OPTIONS),
        layout=workload.layout,
    )


def _train(workload, config, batches):
    """A plain loop with the snippet of `config` pasted in: its losses, and the batches as packed."""
    model, optimizer = workload.build(OPTIONS)
    snippet = load_snippet(render_snippet({**DEFAULTS, **config}, _info(workload, model)))
    model, optimizer = snippet["apply_compilation"](model, optimizer)
    losses, seen = [], []
    for batch in batches:
        batch = snippet["prepare_batch"](dict(batch))
        loss = workload.criterion(workload.forward(model, batch), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
        seen.append(batch)
    return losses, seen


# Rows of the workload's longest, the whole model compiled with dynamic=False: the packed batches' shapes repeat
# (test_packed_shapes_repeat_within_the_row_count_rule) and they train like the padded batch, one run for both.
WHOLE_STATIC = {"scope": "full", "dynamic": False, "padding": "pack"}


@pytest.fixture(scope="module")
def whole_static_llama():
    """tiny-llama's three batches twice through WHOLE_STATIC's snippet in a plain loop (`_train`): its losses,
    the batches as packed, and the graphs Dynamo compiled for them."""
    from torch._dynamo.utils import counters

    workload = get_workload("tiny-llama")
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    losses, seen = _train(workload, WHOLE_STATIC, workload.batches(OPTIONS, 3) * 2)
    return losses, seen, counters["stats"]["unique_graphs"] - before


@pytest.mark.parametrize(
    "model, config",
    [
        ("tiny-llama", WHOLE_STATIC),  # its packed run is whole_static_llama's
        # one row per batch gives each batch a length of its own: compiled whole for each, tiny-llama was the
        # suite's longest test (168 s on 2 loaded cores); the small encoder is compiled whole for it instead.
        # Its blocks dynamic from the first length: compiled once, not at the first length and again dynamic
        ("tiny-llama", {"scope": "regional", "dynamic": True, "padding": "pack", "pack_length": "batch", "pad_multiple": 8}),
        (ENCODER, {"scope": "full", "padding": "pack"}),
        (ENCODER, {"scope": "full", "padding": "pack", "pack_length": "batch", "pad_multiple": 32}),
    ],
)
def test_packed_batches_train_like_the_padded_batch(model, config, request):
    """Pasted into a plain loop, the snippet's prepare_batch packs each batch's sequences into rows with
    position ids restarting per sequence (an encoder: its block-diagonal mask), so the compiled model trains
    on the same tokens to eager-on-the-padded-batch's losses, computing less padding."""
    workload = get_workload(model)
    batches = workload.batches(OPTIONS, 3) * 2
    if config is WHOLE_STATIC:
        packed, seen, _ = request.getfixturevalue("whole_static_llama")
    else:
        packed, seen = _train(workload, config, batches)
    padded, _ = _train(workload, EAGER, batches)
    assert packed == pytest.approx(padded, rel=1e-3)
    assert sum(packed[3:]) < sum(packed[:3])  # the second pass over the same batches: it learned
    for before, after in zip(batches, seen):
        assert int((after["labels"] != -100).sum()) == int((before["labels"] != -100).sum())  # the same tokens
        assert after["position_ids"].shape == after["input_ids"].shape
        if config.get("pack_length") == "batch":  # one row: no padding but its tail, to a multiple
            assert after["input_ids"].shape[0] == 1 and after["input_ids"].shape[1] % config["pad_multiple"] == 0
            assert after["input_ids"].numel() < before["input_ids"].numel()
        else:  # rows of the workload's longest: one length for every batch, fewer rows
            assert after["input_ids"].shape[1] == workload.max_len(OPTIONS)
            assert after["input_ids"].shape[0] <= before["input_ids"].shape[0]
        if workload.layout.causal:
            assert after["position_ids"][0, 0] == 0 and (after["position_ids"].diff(dim=1) != 1).any()
        else:
            assert after["attention_mask"].dim() == 4  # the block-diagonal mask the encoder needs


def _sequences(cu_seq_q, cu_seq_k, max_q, max_k, query):
    assert torch.equal(cu_seq_q, cu_seq_k) and cu_seq_q.dtype == torch.int32
    bounds = cu_seq_q.tolist()
    assert bounds[0] == 0 and bounds == sorted(bounds) and bounds[-1] == query.shape[0]
    assert all(end - start <= min(max_q, max_k) for start, end in zip(bounds, bounds[1:]))
    return [(start, end) for start, end in zip(bounds, bounds[1:]) if end > start]


def _probabilities(q, k, causal, scale):
    """Per head: softmax(q k^T * scale), causal where asked; k's grouped heads repeated to q's."""
    scores = torch.einsum("thd,shd->hts", q, k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(scores.shape[1:], dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def _flash_varlen_forward_on_the_cpu(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, scale=None, *rest):
    window_size = rest[0] if rest else None
    causal, scale = is_causal or list(window_size or ()) == [-1, 0], scale or query.shape[-1] ** -0.5
    out = torch.zeros_like(query)
    for a, b in _sequences(cu_seq_q, cu_seq_k, max_q, max_k, query):
        p = _probabilities(query[a:b], key[a:b], causal, scale)
        out[a:b] = torch.einsum("hts,shd->thd", p, value[a:b].repeat_interleave(query.shape[1] // value.shape[1], dim=1))
    return out, torch.zeros(query.shape[1], query.shape[0], dtype=torch.float32), torch.zeros(2, dtype=torch.uint64)


def _flash_varlen_backward_on_the_cpu(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, max_q, max_k, causal, _, *rest):
    scale, window_size = (list(rest) + [None, None])[:2]
    causal, scale = causal or list(window_size or ()) == [-1, 0], scale or query.shape[-1] ** -0.5
    group = query.shape[1] // key.shape[1]
    dq, dk, dv = (torch.zeros_like(x) for x in (query, key, value))
    for a, b in _sequences(cu_seq_q, cu_seq_k, max_q, max_k, query):
        q, k, v, do = query[a:b], key[a:b].repeat_interleave(group, 1), value[a:b].repeat_interleave(group, 1), grad_out[a:b]
        p = _probabilities(q, key[a:b], causal, scale)
        dp = torch.einsum("thd,shd->hts", do, v)
        ds = p * (dp - (dp * p).sum(-1, keepdim=True)) * scale
        dq[a:b] = torch.einsum("hts,shd->thd", ds, k)
        dk[a:b] = torch.einsum("hts,thd->shd", ds, q).unflatten(1, (-1, group)).sum(2)
        dv[a:b] = torch.einsum("hts,thd->shd", p, do).unflatten(1, (-1, group)).sum(2)
    return dq, dk, dv


@pytest.fixture(scope="module")
def varlen_on_the_cpu():
    """torch's varlen_attn op, its autograd and its fake (what Dynamo and Inductor see) as they are, with the
    Flash Attention kernels it calls on CUDA done on the CPU sequence by sequence with SDPA: the snippet's
    plumbing (sequences found from the position ids, the layout, grouped heads) is checked here against
    the padded batch; on the GPU the trial's numerics guard checks the kernels the same way."""
    from torch.nn.attention import varlen

    library = torch.library.Library("torch_attn", "IMPL")  # noqa: TOR901
    library.impl("_varlen_attn", _flash_varlen_forward_on_the_cpu, "CPU")
    library.impl("_varlen_attn_backward", _flash_varlen_backward_on_the_cpu, "CPU")
    assert varlen.varlen_attn is not None
    yield
    library._destroy()


def test_varlen_attention_trains_each_packed_sequence_like_the_padded_batch(varlen_on_the_cpu):
    """pack_attention varlen: the snippet registers an attention function of its own with the model, which
    finds each packed sequence where its position ids restart and hands them to varlen_attn, one causal
    sequence each (grouped key/value heads as they are), so nothing across sequences is computed. With
    varlen_attn's kernels done sequence by sequence on the CPU, the losses equal eager's on the padded
    batch, each decoder layer compiled alone around the op; a batch of more sequences than MAX_SEQUENCES is
    refused by pack, never silently cut."""
    from torch._dynamo.utils import counters

    workload = get_workload("tiny-llama")
    batches = workload.batches(OPTIONS, 4)
    assert len({b["input_ids"].numel() for b in batches}) == 4  # four sizes (they pack to four lengths)
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    model, optimizer = workload.build(OPTIONS)
    varlen = {**DEFAULTS, "scope": "regional", "padding": "pack", "pack_length": "batch", "pad_multiple": 8}
    varlen["pack_attention"] = "varlen"
    info = _info(workload, model)
    info.rows = max(b["input_ids"].shape[0] for b in batches)
    source = render_snippet(varlen, info)
    assert f"MAX_SEQUENCES = {2 * info.rows}" in source and 'set_attn_implementation("autocompile_varlen")' in source
    snippet = load_snippet(source)
    model, optimizer = snippet["apply_compilation"](model, optimizer)
    losses = []
    for batch in batches * 2:
        batch = snippet["prepare_batch"](dict(batch))
        loss = workload.criterion(workload.forward(model, batch), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    # each decoder layer (one code): its first length, then one graph for every length; the GPU's first try
    # compiled once per length (a value from the row's length in the attention), to the recompile limit
    assert counters["stats"]["unique_graphs"] - before == 2
    padded, _ = _train(workload, EAGER, batches * 2)
    assert losses == pytest.approx(padded, rel=1e-3)
    snippet["MAX_SEQUENCES"] = 2
    with pytest.raises(ValueError, match="sequences in a packed batch, MAX_SEQUENCES is 2"):
        snippet["prepare_batch"](dict(batches[0]))


@pytest.mark.parametrize("causal", [True, False])
def test_the_packing_check_runs_the_packed_batch_through_the_attention_it_packs_with(causal, varlen_on_the_cpu, tmp_path):
    """The trial's packing check (eager, before the compile) runs the packed batch under the attention the
    configuration switches to (varlen_attn here), the padded batch under the model's own: an attention that
    lets packed tokens see what they must not (here non-causal, each token seeing its sequence's later ones)
    is refused there, with the guard's reason, before anything compiles."""
    from autocompile.trial.packing_check import packed_alike
    from autocompile.trial.worker import Events, Setup

    workload = get_workload("tiny-llama")
    batches = workload.batches(OPTIONS, 1)
    model, _ = workload.build(OPTIONS)
    config = {**DEFAULTS, "scope": "regional", "padding": "pack", "pack_length": "batch", "pad_multiple": 8}
    config["pack_attention"] = "varlen"
    info = _info(workload, model)
    info.rows = batches[0]["input_ids"].shape[0]
    snippet = render_snippet(config, info)
    if not causal:
        snippet = snippet.replace("window_size=(-1, 0)", "window_size=(-1, -1)")
    setup = Setup(workload, OPTIONS, 1, batches, [workload.count(b) for b in batches], info, snippet)
    result: dict = {}
    alike = packed_alike(torch, {"config": config}, Events(str(tmp_path / "events.jsonl")), result, setup, model)
    assert model.config._attn_implementation == "autocompile_varlen"
    assert alike is causal, result
    check = result["packing_check"]
    if causal:
        assert check["max_rel_diff"] < 1e-5
        assert check["other_sequences_moved"] == check["earlier_tokens_moved"] == 0  # bit for bit
    else:  # each token sees its sequence's later ones, not the other sequences
        assert result["status"] == "infeasible" and result["reason"].startswith("numerics (packing check)")
        assert check["other_sequences_moved"] == 0 and check["earlier_tokens_moved"] > 1e-3
        assert "changing a packed sequence's later tokens, its earlier tokens' outputs moved" in result["reason"]
        assert result["reason"].endswith("the attention it packs with is not causal")
        assert result["numerics"]["method"] == "packing check"


def test_packed_shapes_repeat_within_the_row_count_rule(whole_static_llama):
    """Rows of the workload's longest: every batch packs into one of at most `rows` shapes (the row count),
    so a whole-model compile with dynamic=False compiles no more graphs than that rule counts."""
    workload = get_workload("tiny-llama")
    batches = workload.batches(OPTIONS, 3)  # 3 lengths padded, one row count packed: one compile of the whole model
    space = build_space("tiny-llama", "cpu")
    bound = compiled_shapes("pack", None, space.traits.lengths, [], space.traits.rows, "longest")
    assert bound == space.traits.rows == 8
    _, seen, graphs = whole_static_llama  # WHOLE_STATIC's snippet over these batches twice
    shapes = {tuple(b["input_ids"].shape) for b in seen}
    padded = {tuple(b["input_ids"].shape) for b in batches}
    assert len(shapes) < len(padded)  # shapes repeat: fewer distinct shapes than the batches padded to their longest
    assert all(width == workload.max_len(OPTIONS) for _, width in shapes)
    assert 0 < graphs <= bound


def test_a_model_that_mixes_packed_sequences_is_refused_by_the_guard(tmp_path):
    """A forward that drops the position ids its layout declares: packed, its sequences attend to each
    other. The trial's packing check (eager, before the compile) finds it and makes the trial infeasible,
    saying why; a model that passes them (tiny-llama) is found exact. That trial is also the reference
    family's, for real (test_trial.py's trial of tiny-llama padded to a multiple of 32, merged here):
    transformers' Llama, each decoder layer compiled alone, trains without a graph break."""
    from autocompile.trial import TrialRequest, run_trial

    measure = {"min_window_s": 0.05, "min_windows": 2, "max_windows": 2}
    # rows of the longest, their count varying: compiled dynamic from the first batch, not again at the second count
    packed = {**DEFAULTS, "scope": "regional", "padding": "pack", "dynamic": True}
    record = run_trial(
        TrialRequest(
            model=toy("llama_positions_dropped"),
            config=packed,
            device="cpu",
            trial_dir=str(tmp_path / "dropped"),
            timeout_s=300,
            measure=measure,
            prestart=True,  # as a search starts its compiled trials: the second forked from the process the first was
        )
    )
    assert record["status"] == "infeasible" and record["reason"].startswith("numerics (packing check)")
    assert "the sequences of a packed row see each other" in record["reason"]
    assert record["packing_check"]["other_sequences_moved"] > 1e-3 and "warmup_s" not in record  # refused before compiling
    record = run_trial(
        TrialRequest(
            model="tiny-llama",
            config=packed,
            device="cpu",
            trial_dir=str(tmp_path / "kept"),
            timeout_s=300,
            measure=measure,
            prestart=True,
        )
    )
    check = record["packing_check"]
    assert record["status"] == "ok" and check["max_rel_diff"] < 1e-5
    assert check["other_sequences_moved"] == check["earlier_tokens_moved"] == 0
    assert 0 < record["padding_share"] < 0.5  # rows of the longest: the rows' tails
    assert record["regions"] == ["model.layers"]
    assert record["graph_breaks"] == 0 and record["steps_per_s"] > 0
    assert "pad" in record["snippet"] and "model.layers" in record["snippet"]


def test_space_lists_pack_with_its_conditions_and_says_why_a_workload_cannot_pack():
    out = command("space", "--model", "tiny-llama", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert '"pack"]' in out.stdout and "pack_length" in out.stdout and "(where padding is pack)" in out.stdout
    assert "FlexAttention has no backward on the CPU" in out.stdout  # pack_attention: left out here, with why
    out = command("space", "--model", "tiny-captioner", "--device", "cpu")
    assert "padding=pack" in out.stdout and "declares no SequenceLayout" in out.stdout
    described = json.loads(command("space", "--model", ENCODER, "--device", "cpu", "--json").stdout)
    [padding] = [d for d in described["dimensions"] if d["name"] == "padding"]
    assert "pack" in padding["choices"]


@pytest.mark.parametrize("model", ["tiny-llama", ENCODER])
def test_a_packed_snippet_names_nothing_it_does_not_define(model, tmp_path):
    """The snippet a user pastes passes pyflakes' undefined-name check (ruff F821): a causal decoder's
    snippet once named MASK_DTYPE in pack's encoder branch without defining it."""
    workload = get_workload(model)
    built, _ = workload.build(OPTIONS)
    path = tmp_path / "apply_compilation.py"
    path.write_text(render_snippet({**DEFAULTS, "scope": "regional", "padding": "pack"}, _info(workload, built)))
    found = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--isolated", "--select", "F821,F841", str(path)],
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, found.stdout


def test_in_bf16_what_a_packed_token_must_not_see_moves_nothing_at_all(tmp_path):
    """The packing check's premise (trial/packing_check.py): outputs that must not see some tokens stay the same
    bit for bit when those change, in bf16 too (same shapes, same kernels; masked scores add exact zeros), where
    the packed batch's outputs against the padded batch's round apart by 4-5.5% on the 8B Llamas on CUDA."""
    from autocompile.trial.packing_check import packed_alike
    from autocompile.trial.worker import Events, Setup
    from autocompile.workloads import _llama

    config = dict(_llama.TINY_LLAMA, hidden_size=128, intermediate_size=256, num_hidden_layers=6)
    workload = _llama._make("bf16-llama", "", config, 4, 64, torch.bfloat16, torch.bfloat16, 4, attention="sdpa")
    batches = workload.batches(OPTIONS, 4)
    model, _ = workload.build(OPTIONS)
    packed = {**DEFAULTS, "scope": "regional", "padding": "pack", "pack_length": "batch", "pad_multiple": 8}
    info = _info(workload, model)
    setup = Setup(workload, OPTIONS, 4, batches, [workload.count(b) for b in batches], info, render_snippet(packed, info))
    result: dict = {}
    assert packed_alike(torch, {"config": packed}, Events(str(tmp_path / "events.jsonl")), result, setup, model), result
    check = result["packing_check"]
    assert next(model.parameters()).dtype == torch.bfloat16 and check["blind_batch"] == 0
    assert check["other_sequences_moved"] == check["earlier_tokens_moved"] == 0.0


class _NoWriteFromItself(torch.utils._python_dispatch.TorchDispatchMode):
    """Raises where an indexed write or a copy reads from the memory it writes, as CUDA does and the CPU does not
    ("some elements of the input tensor and the written-to tensor refer to a single memory location")."""

    WRITES = {torch.ops.aten.index_put_.default: 2, torch.ops.aten.copy_.default: 1}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        source = self.WRITES.get(func)
        if source is not None and isinstance(args[source], torch.Tensor):
            shared = args[0].untyped_storage().data_ptr() == args[source].untyped_storage().data_ptr()
            assert not shared, f"{func} writes a tensor from a view of itself"
        return func(*args, **(kwargs or {}))


def test_the_packing_check_writes_no_tensor_from_a_view_of_itself(tmp_path):
    """On CUDA (H200, 2026-11-29) the check's question of what each token sees wrote the changed tokens from a view
    of the tensor it wrote, which CUDA refuses: every packed trial failed in its check; the CPU ran it. The check,
    run here under a mode that refuses what CUDA refuses, writes from a copy."""
    from autocompile.trial.packing_check import packed_alike
    from autocompile.trial.worker import Events, Setup

    workload = get_workload("tiny-llama")
    batches = workload.batches(OPTIONS, 4)
    model, _ = workload.build(OPTIONS)
    packed = {**DEFAULTS, "scope": "regional", "padding": "pack", "pack_length": "batch", "pad_multiple": 8}
    info = _info(workload, model)
    setup = Setup(workload, OPTIONS, 4, batches, [workload.count(b) for b in batches], info, render_snippet(packed, info))
    with pytest.raises(AssertionError, match="writes a tensor from a view of itself"), _NoWriteFromItself():
        tensor = torch.arange(6)
        tensor[tensor > 3] = tensor[0]  # what the check did
    result: dict = {}
    with _NoWriteFromItself():
        alike = packed_alike(torch, {"config": packed}, Events(str(tmp_path / "events.jsonl")), result, setup, model)
    assert alike and result["packing_check"]["blind_batch"] is not None, result
