"""The order of proposals after the baselines and recipes: neighbours of the incumbent, and TPE.

A neighbour is the best configuration measured so far (the incumbent) with one dimension
changed, and with it the dimensions that change conditions (padding -> pad_multiple). They
are proposed through Optuna (enqueued trials with fixed parameters), so resume, the dashboard
and TPE see them like any trial, and they alternate with TPE's global proposals. Each records
its `parent` and the dimensions it `changed`, so the effect of each single change can be read
off (`effects`). The order of dimensions: first those whose single changes helped in this
study, then those whose moves paid on this model and device in earlier studies (`known`: the
knowledge store's gains, by PAID), then PROMISE's order (what the seed texts and the GPU studies
found worth most), and last those whose changes hurt or failed. When the fastest trial (by
steady speed) is not the incumbent, it is a parent too, in turns: its neighbours move towards the incumbent's values,
first dropping a graph it compiles that the incumbent does not (a shorter warm-up at its speed).
A parent whose warm-up is a large share of its run at the horizon (WARMUP_SHARE) first drops a
graph it compiles besides the model's. A move that makes a dimension apply takes that
dimension's promising value (a step no longer compiled: the fused optimizer).
"""

from __future__ import annotations

import functools

import optuna

from autocompile.engine.cost import besides, neighbour_s
from autocompile.engine.gates import rules_refusal
from autocompile.engine.records import Record, Role, config_columns
from autocompile.engine.studyview import StudyView, view_of
from autocompile.engine.scoring import DEFAULT_HORIZON
from autocompile.engine.storage import same_machine
from autocompile.space import Graphs, shaping
from autocompile.trial.result import Status

# Dimensions in the order a change is most likely to pay, and why.
PROMISE = (
    (
        "activation_checkpointing",
        "offered only where the model checkpoints its activations: off, compile's "
        "partitioner recomputes instead (a LoRA fine-tune of the 8B Llama: 1.5x the "
        "steps/s of its own checkpointing at a budget of 0.5, 1.2x at 0.05; "
        "studies/README.md)",
    ),
    ("compile_loss", "the loss compiled apart: part of llama-8b's 1.46x (studies/README.md)"),
    (
        "lm_loss",
        "the loss from the hidden states, the logits over a large vocabulary never whole: up to 4x less "
        "peak memory by torch's notes for nn.LinearCrossEntropyLoss; the loss's own family, so after compile_loss",
    ),
    ("fused_optimizer", "one fused optimizer kernel: part of llama-8b's 1.46x"),
    ("clip_in_step", "a Trainer's clipping inside its fused step: one pass less over every gradient"),
    ("compile_optimizer", "the optimizer step compiled (001: optimizer compilation)"),
    (
        "foreach_map_optimizer",
        "the Adam/AdamW step as one foreach_map function, fused horizontally: 001's step #4, "
        "tried right after compiling the step (slower on its small model: 5.28 against "
        "5.54 steps/s, A100; the guide expects larger models to gain)",
    ),
    (
        "step_in_backward",
        "each block's optimizer step beside the backward of the blocks before it: the memory-bound step overlapping "
        "the matmuls (fused AdamW: llama-8b 6.52 against 6.16 steps/s, moe-2b 15.92 against 15.38, one H100; "
        "docs/results.md)",
    ),
    (
        "activation_memory_budget",
        "offered only where memory is the constraint: recomputing activations "
        "is what lets a configuration fit (AOTAutograd's partitioner)",
    ),
    ("mode", "reduce-overhead: CUDA graphs +15% (000), the captioner's 1.82x; max-autotune tunes kernels"),
    (
        "static_grads",
        "under CUDA graphs with a compiled step, gradients read in place instead of copied in: "
        "001's step #3, tried right after a CUDA-graph mode (5.32 against 5.54 steps/s on its "
        "small model, A100; slower on the captioner too: docs/decisions.md)",
    ),
    (
        "graph_step",
        "the compiled step replayed as one CUDA graph where the model's graphs are not recorded: the "
        "step's host work off the step, at the cost of static gradients zeroed and added into each step "
        "(llama-8b under varlen: 6.14 against 6.81 steps/s on an H200: docs/decisions.md), so after static_grads",
    ),
    ("padding", "fewer distinct shapes, fewer recompiles (001: padded buckets); packed, no padding computed"),
    (
        "pack_attention",
        "packed rows under FlexAttention (the blocks where one sequence would see another skipped) or "
        "Flash Attention over each sequence (varlen_attn: nothing across sequences computed)",
    ),
    (
        "attention",
        "SDPA kept off cuDNN's kernel, which plans anew for each new length: a Trainer's Llama 8B job "
        "host-bound by those plans ran its regional compile at 1.85x the plain Trainer with it, 1.04x "
        "without (docs/results.md)",
    ),
    ("experts", "the experts' kernels of a mixture of experts: grouped GEMM, a batched product or the loop"),
    ("pack_length", "packed rows of the longest sequence (one length, fewer rows) or the batch in one row"),
    ("pad_multiple", "shape padding aligns matrix dimensions (001: shape_padding)"),
    ("lr_tensor", "a scheduler's new LR stops recompiling a compiled step (002)"),
    (
        "compiled_autograd",
        "the whole backward as one compiled graph (002: dynamic backward graphs, hooks, FSDP); "
        "late: a whole backward per padded length, minutes of warm-up for no speed on the GPU "
        "models (docs/decisions.md)",
    ),
    ("inductor.coordinate_descent_tuning", "tunes Triton kernel configs (COMPILE_HEAVY)"),
    ("inductor.shape_padding", "pads matrix dimensions for faster kernels (001)"),
    ("inductor.epilogue_fusion", "fuses pointwise epilogues into matrix kernels"),
    ("inductor.aggressive_fusion", "fuses more, at the risk of register pressure"),
    ("scope", "regional against whole model: warm-up against steady speed (003)"),
    ("mark_dynamic", "one graph for all lengths (001)"),
    ("dynamic", "automatic, static or dynamic shapes (001)"),
    ("fullgraph", "no graph breaks allowed"),
)


# The values those changes are worth making towards (a change away from one is proposed last).
PROMISING = {
    "compile_loss": {True},
    "fused_optimizer": {True},
    "clip_in_step": {True},
    "step_in_backward": {True},
    "compile_optimizer": {True},
    "lr_tensor": {True},
    "mode": {"reduce-overhead"},
    "inductor.shape_padding": {True},
    "activation_memory_budget": {0.8, 0.5},
    "activation_checkpointing": {"off"},
    "padding": {"pack"},
    "pack_attention": {"flex", "varlen"},
}
# Moves that multiply what a compile does: Inductor benchmarking kernel candidates (the max-autotune
# modes turn coordinate descent on too), or the whole backward compiled again as one graph per length
# (compiled autograd). Proposed after every other move but those away from a promising value:
# nowhere measured did one pay for its compile (docs/decisions.md: "compile-heavy moves are proposed last").
COMPILE_HEAVY = {
    "mode": {"max-autotune-no-cudagraphs", "max-autotune"},
    "inductor.coordinate_descent_tuning": {True},
    "compiled_autograd": {True},
}


def compile_heavy_values(config: dict) -> list[tuple[str, object]]:
    """The COMPILE_HEAVY values a configuration holds, as (dimension, value); a modular configuration's part
    modes count as its mode."""
    parts = (config.get("part_modes") or {}).values() if config.get("scope") == "modular" else ()
    modes = [config.get("mode"), *sorted(parts)]
    values = [
        *(("mode", mode) for mode in dict.fromkeys(modes)),
        ("compiled_autograd", config.get("compiled_autograd")),
        ("inductor.coordinate_descent_tuning", (config.get("inductor") or {}).get("coordinate_descent_tuning")),
    ]
    return [(name, value) for name, value in values if any(_same(value, v) for v in COMPILE_HEAVY[name])]


# The compile cuts store (knowledge.cuts) also follows the whole model as one graph: a model of many
# blocks compiles them one after another there, and where that never fits the trial limit, a whole-model
# configuration is refused before launch as a compile-heavy value is (docs/decisions.md). A modular
# configuration compiles the workload's parts each whole, the whole model in all: it counts as one
# (as `cost.too_slow` counts it within a study).
WHOLE_MODEL = ("scope", "full")
WHOLE_SCOPES = ("full", "modular")


def compile_cut_values(config: dict) -> list[tuple[str, object]]:
    """What the compile cuts store keeps a configuration's outcome against: its COMPILE_HEAVY values and,
    where it compiles the whole model (as one graph, or its parts each whole), WHOLE_MODEL."""
    return compile_heavy_values(config) + ([WHOLE_MODEL] if config.get("scope") in WHOLE_SCOPES else [])


# The value a dimension takes when a move makes it apply and neither parent had it.
_PROMISING_VALUE = {
    **{name: True for name, values in PROMISING.items() if values == {True}},
    "activation_memory_budget": 0.5,
}  # the model's checkpointing turned off: half its activations kept

# A parent whose warm-up is at least this share of its projected run (warm-up plus the horizon's
# steps at its steady speed) first drops a graph it compiles besides the model's: at that share the
# same speed after a shorter warm-up scores more, below it what the graph gains pays (docs/decisions.md:
# "a parent heavy with warm-up first drops a graph it compiles besides the model's").
WARMUP_SHARE = 0.06


def trial_params(space, trial) -> dict:
    """A trial's Optuna parameters, with the dimensions it predates at their defaults (a study measured
    before the space gained them: its moves then change only what they move); plain torch.compile's:
    every dimension at its default."""
    own = dict(trial.params)
    return {**space.params_for(own), **own} if own else space.params_for({})


def incumbent(space, study, view: StudyView | None = None):
    """The best-scoring trial that ran cleanly (`StudyView.incumbent`), with its Optuna parameters: a
    recipe, neighbour or TPE trial, or plain torch.compile (its parameters: every dimension at its
    default). Not eager, not a finalist rerun. A trial measured again in a finalist round is judged by
    the mean of its scores: one run's score can be far from another's. (trial, params), or (None, None)."""
    best = view_of(study, view).incumbent
    if best is None:
        return None, None
    return best, trial_params(space, best)


def effects(study, view: StudyView | None = None) -> list[dict]:
    """The measured effect of each neighbour against its parent: trial, parent, every dimension in
    which their configurations differ (dimension: from -> to), whether that is one move (`single`: the
    dimension moved and those the move conditions, as the neighbour recorded them), and the ratio of
    their mean scores (finalist reruns included, as the report's plot has them) or the child's
    failure; `other_machine` where the two ran on different machines, whose hosts may differ in
    speed. A parent outside the space (plain torch.compile under a space file) differs in more than
    the move: the quickstart's trial 3 changed five dimensions of trial 1, not one."""
    view = view_of(study, view)
    means, rows = view.mean_scores, []
    for t in view.finished:
        r = view.records[t.number]
        if r.parent is None or r.status is None:
            continue
        parent, p = view.trials[r.parent], view.records[r.parent]
        before, after = config_columns(p.config), config_columns(r.config)
        changes = {
            name: (before.get(name), after.get(name))
            for name in sorted(set(before) | set(after))
            if before.get(name) != after.get(name)
        }
        row = {
            "trial": t.number,
            "parent": parent.number,
            "changed": changes,
            "status": r.status,
            "single": set(changes) <= set(r.changed or []),
        }
        if same_machine(r.worker, p.worker) is False:
            row["other_machine"] = True  # a resumed study on a new lease: the host's speed moved too
        if t.number in means and parent.number in means:
            row["effect"] = means[t.number] / means[parent.number] - 1
        else:
            row["reason"] = r.reason or ""
        peaks = (p.peak_mem_gb, r.peak_mem_gb)
        if all(peaks) and ("activation_memory_budget" in changes or r.over_memory_gb or p.over_memory_gb):
            row["peak_mem_gb"] = peaks  # a move made for memory: what it did to the peak
            row["over_limit"] = bool(r.over_memory_gb)
        rows.append(row)
    return rows


# A dimension whose moves gained at least this much steady speed (the median over the earlier studies of
# this model and device) is tried before PROMISE's order: past the noise of two runs (docs/measurement.md).
PAID = 1.03


def _paid(known: dict[str, float] | None) -> dict[str, float]:
    """The dimensions of `known` (each one's median gain here before) that gained at least PAID."""
    return {name: gain for name, gain in (known or {}).items() if gain >= PAID}


def _order(space, view: StudyView, known: dict[str, float] | None = None) -> list:
    """The space's searched dimensions, most promising first (see the module's docstring); `known`: each
    dimension's median gain in earlier studies of this model and device (knowledge.MoveGains.by_dimension)."""
    known = _paid(known)
    rank = {name: i for i, (name, _) in enumerate(PROMISE)}
    seen: dict[str, float] = {}
    for row in effects(view.study, view):
        for name in row["changed"] if row["single"] else ():  # a move of several says nothing of each
            seen[name] = max(seen.get(name, -1.0), row.get("effect", -1.0))
    dims = [d for d in space.dimensions if d.name not in space.fixed]
    return sorted(
        dims,
        key=lambda d: (
            0 if seen.get(d.name, 0) > 0 else 3 if d.name in seen else 1 if d.name in known else 2,
            -seen.get(d.name, 0) - known.get(d.name, 0),
            rank.get(d.name, len(rank)),
        ),
    )


# Graphs compiled besides the model's (compiled autograd: the whole backward again, per length).
_EXTRAS = shaping(Graphs.BESIDES)


def _same(a, b) -> bool:
    return type(a) is type(b) and a == b


def fastest(space, study, view: StudyView | None = None):
    """The trial of the search (`StudyView.searched`) with the highest steady speed that ran cleanly (its
    warm-up aside), and its parameters: the incumbent may have won on warm-up, and what made this one
    fast is worth borrowing. (trial, params), or (None, {})."""
    view = view_of(study, view)
    ok = [t for t in view.searched if view.records[t.number].status == Status.OK]
    top = max(ok, key=lambda t: view.records[t.number].steps_per_s or 0, default=None)
    return (None, {}) if top is None else (top, trial_params(space, top))


def warmup_share(study, trial) -> float:
    """The share of `trial`'s projected run at the study's horizon spent warming up: warm-up
    against warm-up plus the remaining steps at its steady speed (as `scoring.score` counts them)."""
    r = Record.of(trial)
    if not r.steps_per_s or not r.warmup_s:
        return 0.0
    horizon = study.user_attrs.get("horizon") or DEFAULT_HORIZON
    steady = max(horizon - (r.attrs.get("warmup_steps") or 0), 0) / r.steps_per_s
    return r.warmup_s / (r.warmup_s + steady)


def _drops_a_graph(name: str, value, base: dict) -> bool:
    return name in _EXTRAS and besides(base, name) and not besides({name: value}, name)


def _rank(name: str, value, base: dict, borrow: dict, heavy: bool = False, breaks_ask: bool = False) -> int:
    """-2: Dynamo's data-dependent capture where the parent's graph breaks name it (`breaks_ask`);
    -1, for a parent `heavy` with warm-up (WARMUP_SHARE): a graph it compiles besides the model's
    dropped; 0: towards the fastest trial's value; 1: towards a promising value; 2: neither;
    3: a move that multiplies the compile's work (COMPILE_HEAVY), or that capture where no break asks
    for it; 4: away from a promising value the incumbent has (even where the fastest trial did without it)."""
    if name == "capture_data_dependent" and value:
        return _capture_rank(breaks_ask)
    if heavy and _drops_a_graph(name, value, base):
        return -1
    towards = name in borrow and _same(borrow[name], value)
    promising = PROMISING.get(name, ())
    if any(_same(value, p) for p in promising):
        return 0 if towards else 1
    if any(_same(base.get(name), p) for p in promising):
        return 4
    if any(_same(value, p) for p in COMPILE_HEAVY.get(name, ())):
        return 0 if towards else 3
    return 0 if towards else 2


def _capture_rank(breaks_ask: bool) -> int:
    """Dynamo's data-dependent capture: first where the parent's graph breaks name it, else late."""
    return -2 if breaks_ask else 3


def _rank_lighter(name: str, value, base: dict, borrow: dict, breaks_ask: bool = False) -> int:
    """For a move from the fastest trial towards the incumbent: -2 and 3 as in `_rank` for Dynamo's
    data-dependent capture; 0 where it stops compiling a graph the incumbent does without (the optimizer
    step: a large share of the warm-up on the GPU models); 1 for the incumbent's other values; 2 for the rest."""
    if name == "capture_data_dependent" and value:
        return _capture_rank(breaks_ask)
    if _drops_a_graph(name, value, base) and name in borrow and not besides(borrow, name):
        return 0
    return 1 if name in borrow and _same(borrow[name], value) else 2


def neighbours_turn(study, proposals: int) -> bool:
    """Whether the next proposal is a neighbour of the incumbent rather than TPE's: every other one,
    and besides whenever TPE's proposals have taken longer than the neighbours so far (equal time,
    not equal turns): one TPE proposal cut at the trial limit can cost the time of several neighbours
    (docs/decisions.md: "neighbours and TPE's proposals share the time, not the turns")."""
    if proposals % 2 == 0:
        return True
    spent = {Role.NEIGHBOUR: 0.0, Role.SEARCH: 0.0}
    view = view_of(study)
    for t in view.finished:
        r = view.records[t.number]
        if r.role in spent:
            spent[r.role] += r.wall_s or 0.0
    return spent[Role.NEIGHBOUR] < spent[Role.SEARCH]


def next_neighbour(space, study, tried, cost=None, fits=None, known=None) -> dict | None:
    """The next untried, feasible neighbour: {"params", "changed", "parent", "parent_params",
    "config"}, or None. `tried(config, params)` says whether a configuration was measured or queued already;
    `fits(neighbour)`, where given, whether it fits what is left before the finalist round (others are passed over);
    `known`, each dimension's median gain in earlier studies here (`_order`).

    Two parents take turns, the one with fewer neighbours so far first (on a tie the incumbent,
    unless the fastest trial's warm-up is WARMUP_SHARE of its run or more): the incumbent (best score),
    whose changes towards the fastest trial's values come first and changes away from promising
    values last; and the fastest trial (best steady speed), when another, whose changes towards the
    incumbent's values come first, starting with a graph it compiles and the incumbent does not.
    The score trades steady speed against warm-up: the incumbent may win on warm-up alone, and
    the fastest trial without its costliest compile may keep its speed (docs/decisions.md: "a parent
    heavy with warm-up first drops a graph it compiles besides the model's")."""
    view = view_of(study)
    fit = fitting_move(space, study, tried, view)
    fit = fit if fit is None or fits is None or fits(fit) else None
    best, base = incumbent(space, study, view)
    speed = lambda t: view.records[t.number].steps_per_s or 0  # noqa: E731  (a refused parent's: unknown, 0)
    if best is None or (fit and speed(view.trials[fit["parent"]]) > speed(best)):
        return fit  # a configuration faster than any that fits, made to fit, goes first
    top, fast = fastest(space, study, view)
    # heavy with warm-up, unless a move that paid before here gains more than all of its warm-up could
    share = warmup_share(study, best)
    heavy = share >= WARMUP_SHARE and max((known or {}).values(), default=1.0) - 1 <= share
    asks = lambda t: bool(view.records[t.number].attrs.get("graph_break_fixes"))  # noqa: E731  (its breaks' hints name the capture)
    parents = [(best, base, fast, functools.partial(_rank, heavy=heavy, breaks_ask=asks(best)))]
    if top is not None and top.number != best.number:
        parents.append((top, fast, base, functools.partial(_rank_lighter, breaks_ask=asks(top))))
        children = {p.number: 0 for p, *_ in parents}
        for r in view.records:
            if r.parent in children:
                children[r.parent] += 1
        # on a tie, the incumbent first, unless the fastest trial is heavy with warm-up: its lighter move pays most
        fast_first = warmup_share(study, top) >= WARMUP_SHARE
        parents.sort(key=lambda p: (children[p[0].number], (p[0].number == best.number) == fast_first))
    for parent, own, borrow, rank in parents:
        found = _neighbour(space, view, tried, parent, own, borrow, rank, cost, fits, known)
        if found:
            return found
    return fit


def neighbour_cost(space, study, predictor, tried, fits=None, known=None) -> float | None:
    """What the next neighbour is expected to take (`neighbour_s`); with `fits` (a candidate's dict ->
    bool), the next one that fits. None if there is none, or its cost is unknown."""
    neighbour = next_neighbour(space, study, tried, predictor.predict, fits, known)
    return neighbour_s(study, predictor, neighbour) if neighbour else None


BUDGET = "activation_memory_budget"


def fitting_move(space, study, tried, view: StudyView | None = None) -> dict | None:
    """The move that may make a configuration fit the memory limit: the fastest trial that ran but
    needed more memory than --max-memory-gb, one rung down the budget ladder, or further where the
    peaks measured at its other rungs predict the next one will not fit either (`_rung`). None where
    the space offers no budget there (the model's own checkpointing is on), every such move was
    tried, or a rung fits already (`_fitted`: a lower one would recompute more for nothing). Where every
    configuration ran over the limit, it is the search's only way to one that fits
    (docs/decisions.md: "a configuration over the memory limit is moved down the budget ladder")."""
    dim = next((d for d in space.dimensions if d.name == BUDGET), None)
    if dim is None:
        return None
    view = view_of(study, view)
    over = [view.records[t.number] for t in view.searched if view.records[t.number].over_memory_gb]
    for r in sorted(over, key=lambda r: -(r.steps_per_s or 0)):
        if _fitted(view, r.config):
            continue  # a rung of its ladder fits already: a lower one recomputes more for no memory needed
        base = trial_params(space, view.trials[r.number])
        lower = sorted((v for v in dim.choices if v is not None and v < (base.get(BUDGET) or 1.0)), reverse=True)
        limit = _peak(r) - r.over_memory_gb
        peaks = _peaks_by_budget(view, r.config)
        for value in sorted(lower, key=lambda v: _rung(v, lower, peaks, limit)):
            params = space.params_for({**base, BUDGET: value})
            if not params or params.get(BUDGET) != value:
                continue
            config = space.suggest(optuna.trial.FixedTrial(params))
            if tried(config, params) or rules_refusal(config, space):
                continue
            changed = sorted(n for n in set(params) | set(base) if not _same(params.get(n), base.get(n)))
            return {"params": params, "changed": changed, "parent": r.number, "parent_params": base, "config": config}
    return None


def _peak(record: Record) -> float | None:
    """A trial's peak memory: measured, or where a gate refused it over the limit, the one it took in other
    studies of this workload here (gates.over_memory_before)."""
    return record.peak_mem_gb or record.attrs.get("known_peak_mem_gb")


def _but_budget(config: dict) -> dict:
    return {k: v for k, v in config.items() if k != BUDGET}


def _fitted(view: StudyView, config: dict) -> bool:
    """Whether `config` at some budget ran cleanly within the memory limit."""
    same = _but_budget(config)
    return any(r.status == Status.OK and _but_budget(r.config) == same for r in view.records if r.config)


def _peaks_by_budget(view: StudyView, config: dict) -> dict[float, float]:
    """The peak memory measured for `config` at each budget it ran with (None counted as 1.0)."""
    same = _but_budget(config)
    peaks = {}
    for r in view.records:
        seen = r.config or {}
        if _peak(r) and _but_budget(seen) == same:
            peaks[seen.get(BUDGET) or 1.0] = _peak(r)
    return peaks


def _rung(value: float, lower: list[float], peaks: dict[float, float], limit: float) -> tuple:
    """Which lower rung to try first: the highest one the measured peaks, extended as a line through the
    two lowest budgets measured, predict to fit the limit; with one budget measured, the next rung down
    (a step down the ladder); where no rung is predicted to fit, the lowest."""
    if len(peaks) < 2:
        return (0, -value)
    (b0, p0), (b1, p1) = sorted(peaks.items())[:2]
    slope = (p1 - p0) / (b1 - b0) if b1 != b0 else 0.0
    fits = [v for v in lower if p0 + slope * (v - b0) <= limit]
    return (0, -value) if value in fits else (1, value)


CHEAPEST_OF = 4  # moves of the first rank weighed by their predicted cost


def _neighbour(
    space, view: StudyView, tried, parent, base: dict, borrow: dict, rank, cost=None, fits=None, known=None
) -> dict | None:
    """The next untried, feasible neighbour of `parent` (parameters `base`) in `rank`'s order, a move
    bringing in what it conditions as `borrow` has it, else at its promising value. Among the first
    CHEAPEST_OF moves of the first rank, the one `cost(config)` (a predicted warm-up, None where it is
    unknown) says is cheapest: as likely to pay, it costs least (gain per second); unless the first is a move of
    a dimension that paid here before (`known`, PAID), which goes first."""
    moves = [
        (dim, value)
        for dim in _order(space, view, known)
        for value in dim.choices
        if not (dim.name in base and _same(base[dim.name], value))
    ]
    found, paid = [], _paid(known)
    for dim, value in sorted(moves, key=lambda m: rank(m[0].name, m[1], base, borrow)):  # a stable sort
        level = rank(dim.name, value, base, borrow)
        if found and (level != found[0][0] or len(found) >= CHEAPEST_OF or cost is None):
            break
        # what the move brings in: as `borrow` has it, else its promising value
        params = space.params_for({**_PROMISING_VALUE, **borrow, **base, dim.name: value})
        if not params or params == base or dim.name not in params:
            continue  # not offered here, or the dimension does not apply to the parent
        config = space.suggest(optuna.trial.FixedTrial(params))
        if tried(config, params) or rules_refusal(config, space):
            continue
        changed = sorted(n for n in set(params) | set(base) if not _same(params.get(n), base.get(n)))
        move = {"params": params, "changed": changed, "parent": parent.number, "parent_params": base, "config": config}
        if fits is not None and not fits(move):
            continue  # passed over: not expected to fit what is left before the round
        found.append((level, move))
        if len(found) == 1 and dim.name in paid:
            break  # a move that paid here before goes first, whatever a cheaper one costs
    if not found:
        return None
    predicted = [(cost(m["config"]) if cost else None) for _, m in found]
    best = min(range(len(found)), key=lambda i: (predicted[i] is None, predicted[i] or 0.0, i))
    return found[best][1]
