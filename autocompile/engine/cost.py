"""What a trial is expected to take: its first run, a rerun from its compiled code, a run from empty
caches, and what fits before the finalist round. The strategy, the claims, the gates and the
finalist plan ask here; nothing here runs a trial or tells the study.

- First run: a typical compiled trial (`expected_trial_s`), a configuration's twins measured so far
  (`twin_time`) and what they say it takes (`first_run_s`), whether its warm-up fits the trial limit
  (`too_slow`), its cold warm-up predicted from its parts (`Predictor`), and a neighbour's (`neighbour_s`;
  which neighbour is the strategy's: `strategy.neighbour_cost`).
- Rerun: a finalist's warm rerun (`rerun_estimate_s`), with the round's longer windows
  (`round_measure_extra_s`).
- Cold run: a finalist's run from empty caches (`cold_run_s`), scaled by what the device's earlier
  cold runs of the model showed (`cold_scale`), and what it takes over a warm rerun (`cold_over_warm_s`).
- Before the round: the share of what is left that plain torch.compile may take (`baseline_limit_s`),
  and what the round's runs take (`round_s`; the finalist plan chooses whose).

The measurements behind each number are in docs/decisions.md.
"""

from __future__ import annotations

import json
import os
import statistics

import optuna

from autocompile.engine.records import Record, Role, config_columns, full_record
from autocompile.space import DEFAULTS, Graphs, shaping
from autocompile.trial import caches
from autocompile.trial.graphs import cold_seconds, is_optimizer, ledger_path, read_ledger
from autocompile.trial.result import Status

# -- first run ---------------------------------------------------------------------------------

MIN_TRIAL_S = 30.0  # with less of --timeout left, no trial is started


def expected_trial_s(study) -> float:
    """What the next compiled trial is expected to take: the median time of the compiled trials
    measured so far (recipes, neighbours, TPE; pruned ones at the time they took), at least
    MIN_TRIAL_S. A trial that is not expected to fit what is left of --timeout is not started."""
    records = [Record.of(t) for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    walls = sorted(
        r.wall_s
        for r in records
        if r.wall_s and (r.config or {}).get("compile") and r.role not in (Role.COMPILE_DEFAULTS, Role.FINALIST)
    )
    return max(MIN_TRIAL_S, walls[len(walls) // 2]) if walls else MIN_TRIAL_S


def first_run_s(study, config: dict) -> float:
    """What `config`'s first run is expected to take: what its twins took (`twin_time`, exact), else
    what a typical compiled trial takes (`expected_trial_s`)."""
    need, _ = twin_time(study, config, exact=True)
    return need if need is not None else expected_trial_s(study)


# How much compile work a mode adds on top of the scope's graphs: the max-autotune modes benchmark
# kernels alike (CUDA graphs or not), matrix kernels and, by coordinate descent, the others;
# reduce-overhead records graphs in steps that cost as much as default's. Coordinate descent alone
# (TUNING_WEIGHT) is part of what a max-autotune mode does: a trial cut with it is evidence against
# a max-autotune mode on the same graphs, not the other way round.
MODE_WEIGHT = {"default": 0, "reduce-overhead": 0, "max-autotune-no-cudagraphs": 2, "max-autotune": 2}
TUNING_WEIGHT = 1
# Graphs compiled besides the model's (compiled autograd: the whole backward again, per length).
_EXTRAS = shaping(Graphs.BESIDES)
# A max-autotune mode benchmarks kernel candidates on top of what a lighter mode compiles: it took
# more than twice a lighter twin's warm-up wherever measured.
AUTOTUNE_FACTOR = 2.0
# Compiled autograd compiles the whole backward again, as one graph per length: 5.4x and 17x the
# warm-up of the same configuration without it, on the two GPU models measured.
AUTOGRAD_FACTOR = 5.0
_SHAPES = shaping(Graphs.SHAPES)  # what sets the shapes a trial compiles


def too_slow(study, config: dict, limit_s: float, explained=lambda config: None) -> str | None:
    """Why a configuration is expected not to finish its warm-up within `limit_s`, from the trials
    measured so far, or None: a trial in the same scope under a mode no heavier, compiling no
    graph this one does not (optimizer step, loss), took the whole limit or more to warm up, or
    was cut by its limit while compiling; or, for a max-autotune mode, a lighter one with the same
    shapes took half the limit (AUTOTUNE_FACTOR); for compiled autograd, a trial without it took a
    fifth (AUTOGRAD_FACTOR). A modular configuration compares with whole-model compiles
    (`_compile_work`). `explained(config)` gives a rule's reason for a trial whose time a rule
    explains (a float LR under a schedule compiles the step again and again): such a trial is no
    evidence about the others."""
    if not config.get("compile"):
        return None
    scope, weight = _compile_work(config)
    for t in study.get_trials(deepcopy=False):
        r = Record.of(t)
        seen = r.config or {}
        if not t.state.is_finished() or not seen.get("compile") or not _no_more_graphs(seen, config):
            continue
        seen_scope, seen_weight = _compile_work(seen)
        if seen_scope != scope or seen_weight > weight:
            continue
        factor, because = _factor(seen, config, seen_weight, weight)
        slow = (r.warmup_s or 0) * factor >= limit_s
        cut = r.status == Status.TIMEOUT and "while compiling" in (r.reason or "") and (r.wall_s or 0) >= 0.9 * limit_s
        if (slow or cut) and not explained(seen):
            how = f"took {r.warmup_s:.0f} s to warm up" if slow else f"was still compiling after {r.wall_s:.0f} s"
            if slow and because:
                how += because
            return (
                f"expected not to fit the {limit_s:.0f} s trial limit: "
                f"trial {t.number} ({seen['scope']}, {seen.get('mode')}) {how}"
            )
    return None


def _factor(seen: dict, config: dict, seen_weight: int, weight: int) -> tuple[float, str]:
    """How many times a measured trial's (`seen`) warm-up `config` is expected to take at least, and why:
    a max-autotune mode against a twin with the same shapes that tuned nothing (AUTOTUNE_FACTOR);
    compiled autograd against a trial without it (AUTOGRAD_FACTOR); else 1."""
    if config.get("compiled_autograd") and not seen.get("compiled_autograd"):
        return AUTOGRAD_FACTOR, (
            f", and compiled autograd takes over {AUTOGRAD_FACTOR:g}x the warm-up of a configuration without it"
        )
    if seen_weight == 0 < MODE_WEIGHT["max-autotune"] <= weight and all(seen.get(x) == config.get(x) for x in _SHAPES):
        return AUTOTUNE_FACTOR, f", and a max-autotune mode takes over {AUTOTUNE_FACTOR:g}x a lighter mode's warm-up"
    return 1.0, ""


def _compile_work(config: dict) -> tuple[str, int]:
    """What a configuration compiles, as too_slow compares it: the scope whose graphs it compiles,
    and its mode's weight. A modular configuration compiles the workload's parts each whole, the
    whole model in all, so it compares with a whole-model compile, at its heaviest part's mode."""
    tuning = TUNING_WEIGHT if (config.get("inductor") or {}).get("coordinate_descent_tuning") else 0
    if config.get("scope") == "modular":
        modes = (MODE_WEIGHT.get(m, 0) for m in (config.get("part_modes") or {}).values())
        return "full", max([tuning, *modes])
    return config.get("scope"), max(tuning, MODE_WEIGHT.get(config.get("mode"), 0))


def besides(config: dict, key: str) -> bool:
    """Whether `config`'s value of `key` (one of _EXTRAS) compiles a graph besides the model's: any but its default."""
    return config.get(key, DEFAULTS[key]) not in (None, False, DEFAULTS[key])


def _no_more_graphs(seen: dict, config: dict) -> bool:
    """Whether a measured configuration compiled no graph besides the model's that `config` does not."""
    return not any(besides(seen, x) and not besides(config, x) for x in _EXTRAS)


# What a twin shares: the scope, the mode and the shapes it compiles, and the attention it compiles into each
# block (FlexAttention's kernels and block mask compile for a minute on an 8B model, where the model's
# own attention adds nothing: docs/decisions.md, "a twin compiles the same attention").
_TWIN = ("scope", "mode", "pack_attention", *_SHAPES)


def twin_time(study, config: dict, exact: bool = False) -> tuple[float | None, list[int]]:
    """How long `config` is expected to take from its twins measured so far, and which they are:
    the longest wall time of the finished trials (finalist reruns included) that compile the same
    graphs in the same scope, mode, shapes and attention (_TWIN), and no graph it does not (too_slow's evidence: at
    least that long); with `exact`, every graph it does too (as long). (None, []) without a twin."""
    if not config.get("compile"):
        return None, []
    walls = {}
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)):
        r = Record.of(t)
        seen = r.config or {}
        if (
            r.wall_s
            and r.status in (Status.OK, Status.PRUNED, Status.TIMEOUT)
            and seen.get("compile")
            and all(seen.get(x, DEFAULTS[x]) == config.get(x, DEFAULTS[x]) for x in _TWIN)
            and _no_more_graphs(seen, config)
            and (not exact or _no_more_graphs(config, seen))
        ):
            walls[t.number] = r.wall_s
    return (max(walls.values()), sorted(walls)) if walls else (None, [])


# Settings that do not change the model's graphs: a move of these reuses them (and a shared cache has them).
NOT_MODEL = tuple(key for key in DEFAULTS if key not in shaping(Graphs.MODEL))
STEP = shaping(Graphs.STEP)  # what shapes the optimizer step's graphs


def graph_keys(columns: dict) -> tuple[str, str | None]:
    """A configuration's graphs as the Predictor keys them, from its columns (`records.config_columns`): its
    model graphs' (the settings that shape them), and its optimizer step's (None: the step is not compiled)."""
    model = json.dumps({k: v for k, v in sorted(columns.items()) if k not in NOT_MODEL}, default=str)
    step = json.dumps([columns.get(k) for k in STEP], default=str) if columns.get("compile_optimizer") else None
    return model, step


class Predictor:
    """A configuration's cold warm-up predicted before it is launched, from its parts as this study's
    compiled trials compiled them.

    A trial's record lists the graphs it compiled and what each took cold (`autocompile.trial.graphs`;
    a graph a shared cache had counts with its first compile's time). A configuration's warm-up is
    predicted from its parts: the model's graphs, which depend on the settings that shape them
    (NOT_MODEL's complement), taken from a trial that compiled the same model graphs; the optimizer
    step's graphs, from a trial that compiled the same step; and what a warm-up spends besides
    compiling (running steps, loading), from the trials' own warm-ups. Unknown parts give no
    prediction."""

    def __init__(self, study, study_dir: str | None):
        cold = read_ledger(ledger_path(os.path.join(study_dir, caches.FOLDER))) if study_dir else {}
        # model key -> (seconds of the graphs besides the step's, whether they include the loss's), per trial
        self.model: dict[str, list[tuple[float, bool]]] = {}
        self.step: dict[str, list[float]] = {}  # step key -> seconds of the step's graphs, per trial
        self.rest: list[float] = []  # a warm-up's seconds besides its compiles
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            r = Record.of(t)
            if r.status != Status.OK or not (r.config or {}).get("compile") or r.remeasure_of is not None:
                continue
            graphs, columns = full_record(t, study_dir).get("graphs"), config_columns(r.config)
            if isinstance(graphs, list) and graphs:  # not the shortened attribute of a trial whose folder is elsewhere
                self._learn(graph_keys(columns), graphs, cold, r)

    def _learn(self, keys: tuple[str, str | None], graphs: list[dict], cold: dict, record: Record) -> None:
        # a hit the ledger lacks: its load plus what torch says the cache saved
        seconds = [
            (g, g.get("s", 0) + g.get("saved_s", 0) if s is None else s) for g, s in zip(graphs, cold_seconds(graphs, cold))
        ]
        others = sum(s for g, s in seconds if not is_optimizer(g))
        model, step = keys
        self.model.setdefault(model, []).append((others, bool(record.config.get("compile_loss"))))
        if step:
            self.step.setdefault(step, []).append(sum(s for g, s in seconds if is_optimizer(g)))
        measured = record.warmup_measured_s or record.warmup_s or 0
        self.rest.append(max(measured - sum(g.get("s", 0) for g in graphs), 0.0))

    def model_floor(self, config: dict) -> float | None:
        """The least its model graphs took cold in a trial that compiled them and no graph `config`
        does not (a trial that compiled the loss apart counts only for one that does too); None: unknown."""
        loss = bool(config.get("compile_loss"))
        model, _ = graph_keys(config_columns(config))
        seen = [s for s, with_loss in self.model.get(model, []) if loss or not with_loss]
        return min(seen) if seen else None

    def predict(self, config: dict) -> float | None:
        """Its cold warm-up, or None where a part is unknown (model graphs not compiled in this study,
        an optimizer step no trial compiled). The model's part comes from trials that compiled the
        loss apart as `config` does, else from the others (the loss is a graph of seconds)."""
        if not config.get("compile"):
            return None
        model_key, step_key = graph_keys(config_columns(config))
        seen = self.model.get(model_key, [])
        alike = [s for s, with_loss in seen if with_loss == bool(config.get("compile_loss"))]
        model = alike or [s for s, _ in seen]
        if not model or not self.rest:
            return None
        total = statistics.median(model) + statistics.median(self.rest)
        if step_key:
            step = self.step.get(step_key)
            if not step:
                return None
            total += statistics.median(step)
        return total


def neighbour_s(study, predictor, neighbour: dict) -> float | None:
    """What a neighbour (next_neighbour's dict) is expected to take: its twins' time (twin_time), else its
    predicted cold warm-up plus what its parent's run took besides warming up; None if unknown."""
    need, _ = twin_time(study, neighbour["config"], exact=True)  # a lighter twin would say too little
    if need is not None:
        return need
    warmup = predictor.predict(neighbour["config"])
    parent = Record.of(study.trials[neighbour["parent"]])
    if warmup is None or not parent.wall_s:
        return None
    return warmup + max(parent.wall_s - (parent.warmup_measured_s or parent.warmup_s or 0), 0.0)


# -- before the round --------------------------------------------------------------------------

# Plain torch.compile may take at most this share of what is left of --timeout before the finalist
# round: a whole-model compile of a large model can take most of a search. Cut, it still says how
# long it had been warming up, which bounds its score (the summary's "at least Nx plain torch.compile's").
BASELINE_SHARE = 0.5


def baseline_limit_s(limit_s: float, trial_limit_s: float, before_round_s: float) -> float | None:
    """Plain torch.compile's time limit under --timeout, where BASELINE_SHARE of what is left before
    the finalist round (`before_round_s`) is less than its --baseline-timeout (`limit_s`): that share,
    and no less than the trial limit (nor more than `limit_s`); None where the share holds `limit_s`."""
    share = BASELINE_SHARE * before_round_s
    if share >= limit_s:
        return None
    return max(share, min(limit_s, trial_limit_s))


# -- rerun -------------------------------------------------------------------------------------

# What a warm rerun's warm-up is of its first run's cold one: it loads the code it compiled (about a
# fifth was measured; a third, for what a host adds).
WARM_SHARE = 1 / 3

# The round measures in windows of at least this many seconds (the search's: 0.5 s): on a shared host
# a short window falls inside another process's compile burst or between two, and the round is what
# decides, so it measures long enough to average such bursts. A GPU model's windows, whole passes
# over its pool, are longer already: there it changes nothing.
ROUND_MEASURE = {"min_window_s": 2.0}


def round_measure_extra_s(attrs: dict) -> float:
    """How much longer a run measures in the round than in its first run (ROUND_MEASURE): as many
    windows as it took then, each at least ROUND_MEASURE's length."""
    rate, steps, window = attrs.get("steps_per_s"), attrs.get("measured_steps"), attrs.get("window_steps")
    if not rate or not steps or not window:
        return 0.0
    window_s = window / rate
    return (steps / window) * max(0.0, ROUND_MEASURE["min_window_s"] - window_s)


def rerun_estimate_s(trial) -> float:
    """What a finalist's rerun is expected to take: its first run, less the part of its warm-up
    that loading its compiled code saves (WARM_SHARE), and more the longer windows of the round
    (ROUND_MEASURE). The reserve and the round's plan count this."""
    r = Record.of(trial)
    wall_s = r.wall_s or 0
    if not (r.config or {}).get("compile"):
        return wall_s + round_measure_extra_s(r.attrs)
    measured = r.warmup_measured_s or r.warmup_s or 0
    return max(wall_s - (1 - WARM_SHARE) * measured, 0.0) + round_measure_extra_s(r.attrs)


# -- cold run ----------------------------------------------------------------------------------


def added_s(trial) -> float:
    """The seconds a trial's reconstructed warm-up added for the graphs the shared cache had (0: none)."""
    return (Record.of(trial).attrs.get("reconstruction") or {}).get("added_s", 0.0)


def cold_scale(study) -> float:
    """How many times the seconds a reconstruction added a cold run is expected to take over the
    warm-up measured with the cache: what the device's earlier cold runs of this model took
    (`knowledge.cold`, recorded by the study as `cold_scale`), else 1."""
    return (study.user_attrs.get("cold_scale") or {}).get("scale", 1.0)


def cold_run_s(trial, scale: float = 1.0) -> float:
    """What a run of `trial` from empty caches takes in the round: its run with the compile time its
    cache hits saved (scaled by what earlier cold runs showed: `cold_scale`), and the round's longer windows."""
    r = Record.of(trial)
    return (r.wall_s or 0) + scale * added_s(trial) + round_measure_extra_s(r.attrs)


def cold_over_warm_s(trial, scale: float) -> float:
    """What the round's run of `trial` from empty caches takes over a warm rerun of it (none less)."""
    return max(cold_run_s(trial, scale) - rerun_estimate_s(trial), 0.0)


# -- the round ---------------------------------------------------------------------------------


def round_s(finalists: list, eager: dict, cold_s: float) -> float:
    """What the finalist round keeps for measuring `finalists` and eager (its record, `eager`) again,
    one of them from empty caches (`cold_s` more): what they took in their own runs as a rerun
    takes it, and a tenth more for runs that take longer the second time."""
    reruns = sum(rerun_estimate_s(t) for t in finalists)
    eager_s = eager.get("wall_s", 0) + round_measure_extra_s(eager)
    return 1.1 * (reruns + eager_s + cold_s)
