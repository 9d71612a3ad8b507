"""A configuration's cold warm-up predicted before it is launched, from its parts as this study's
trials compiled them.

A trial's record lists the graphs it compiled and what each took cold (`autocompile.trial.graphs`;
a graph a shared cache had counts with its first compile's time). A configuration's warm-up is
predicted from its parts: the model's graphs, which depend on the settings that shape them (scope,
mode, shapes, Inductor options; not the optimizer step, the loss or the LR handling), taken from a
trial that compiled the same model graphs; the optimizer step's graphs, from a trial that compiled
the same step; and what a warm-up spends besides compiling (running steps, loading), from the
trials' own warm-ups. A configuration whose model graphs alone (SAFETY less, for the way compile
times vary between runs) already cap its score below the best so far at the horizon cannot win:
`ruled_out` says so before launch, at no process cost. Unknown parts give no prediction.
"""

from __future__ import annotations

import json
import os
import statistics

import optuna

from autocompile.engine.records import config_columns, full_record
from autocompile.trial import caches
from autocompile.space import DEFAULTS, Graphs, shaping
from autocompile.trial.graphs import cold_seconds, is_optimizer, ledger_path, read_ledger

# Settings that do not change the model's graphs: a move of these reuses them (and a shared cache has them).
NOT_MODEL = tuple(key for key in DEFAULTS if key not in shaping(Graphs.MODEL))
STEP = shaping(Graphs.STEP)  # what shapes the optimizer step's graphs
# A lower bound rules a configuration out only at this share of itself: graph compile times of one
# configuration varied by up to 15% between runs (the captioner's cold runs, H200, 2026-11-25).
SAFETY = 0.8


def model_key(config: dict) -> str:
    columns = config_columns(config)
    return json.dumps({k: v for k, v in sorted(columns.items()) if k not in NOT_MODEL}, default=str)


def step_key(config: dict) -> str | None:
    if not config.get("compile_optimizer"):
        return None
    columns = config_columns(config)
    return json.dumps([columns.get(k) for k in STEP], default=str)


class Predictor:
    """What this study's compiled trials say of each part's cold compile time."""

    def __init__(self, study, study_dir: str | None):
        cold = read_ledger(ledger_path(os.path.join(study_dir, caches.FOLDER))) if study_dir else {}
        # model key -> (seconds of the graphs besides the step's, whether they include the loss's), per trial
        self.model: dict[str, list[tuple[float, bool]]] = {}
        self.step: dict[str, list[float]] = {}  # step key -> seconds of the step's graphs, per trial
        self.rest: list[float] = []  # a warm-up's seconds besides its compiles
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            a = t.user_attrs
            if a.get("status") != "ok" or not a.get("config", {}).get("compile") or "remeasure_of" in a:
                continue
            graphs = full_record(t, study_dir).get("graphs")
            if isinstance(graphs, list) and graphs:  # not the shortened attribute of a trial whose folder is elsewhere
                self._learn(a["config"], graphs, cold, a)

    def _learn(self, config: dict, graphs: list[dict], cold: dict, attrs: dict) -> None:
        # a hit the ledger lacks: its load plus what torch says the cache saved
        seconds = [(g, g.get("s", 0) + g.get("saved_s", 0) if s is None else s)
                   for g, s in zip(graphs, cold_seconds(graphs, cold))]
        others = sum(s for g, s in seconds if not is_optimizer(g))
        self.model.setdefault(model_key(config), []).append((others, bool(config.get("compile_loss"))))
        if step_key(config):
            self.step.setdefault(step_key(config), []).append(sum(s for g, s in seconds if is_optimizer(g)))
        measured = attrs.get("warmup_measured_s") or attrs.get("warmup_s") or 0
        self.rest.append(max(measured - sum(g.get("s", 0) for g in graphs), 0.0))

    def model_floor(self, config: dict) -> float | None:
        """The least its model graphs took cold in a trial that compiled them and no graph `config`
        does not (a trial that compiled the loss apart counts only for one that does too); None: unknown."""
        loss = bool(config.get("compile_loss"))
        seen = [s for s, with_loss in self.model.get(model_key(config), []) if loss or not with_loss]
        return min(seen) if seen else None

    def predict(self, config: dict) -> float | None:
        """Its cold warm-up, or None where a part is unknown (model graphs not compiled in this study,
        an optimizer step no trial compiled). The model's part comes from trials that compiled the
        loss apart as `config` does, else from the others (the loss is a graph of seconds)."""
        if not config.get("compile"):
            return None
        seen = self.model.get(model_key(config), [])
        alike = [s for s, with_loss in seen if with_loss == bool(config.get("compile_loss"))]
        model = alike or [s for s, _ in seen]
        if not model or not self.rest:
            return None
        total = statistics.median(model) + statistics.median(self.rest)
        if step_key(config):
            step = self.step.get(step_key(config))
            if not step:
                return None
            total += statistics.median(step)
        return total

    def ruled_out(self, config: dict, best: float | None, horizon: int) -> str | None:
        """Why `config` cannot win before it runs (its model graphs' cold compile caps its score at the
        horizon below the best), or None."""
        floor = self.model_floor(config)
        if not config.get("compile") or floor is None or not best:
            return None
        bound = horizon / (SAFETY * floor)
        if bound >= best:
            return None
        return (f"predicted: its model graphs took {floor:.0f} s to compile cold in this study, so its score at "
                f"horizon {horizon} is at most {bound:.3g} (with {1 - SAFETY:.0%} margin), below the best so far "
                f"({best:.3g})")

