"""What a study's earlier trials found out that a new trial need not find out again: whether the
loss depends on the random stream, and which hard mark_dynamic Dynamo refused.

Each saves seconds of every compiled trial on a large model (on llama-8b, the randomness check's three
eager forwards took 3.2-4.1 s of each; a refused hard mark, 21 s of each trial that asked for it). The
trial obeys what it is passed (TrialRequest) and says so in its record.
"""

from __future__ import annotations

from autocompile.engine.records import Record, Role, with_old_defaults
from autocompile.engine.studyview import view_of
from autocompile.space import DEFAULTS, Graphs, shaping

# The settings Dynamo's shape constraints depend on: those that shape the graphs it traces
# (space.GRAPHS). A hard mark refused under one set of these is refused again under it.
GRAPH_KEYS = shaping(Graphs.TRACED)


def _finished(study) -> list:
    """The study's finished trials, first first (a trial told failed may have found it too)."""
    return [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]


def rng_dependent(study) -> dict | None:
    """Whether the loss depends on the random stream (dropout), as an earlier compiled trial of the
    study found it: {"value": bool, "from": the trial that ran the check}, for the trial's measure
    (the worker then skips the check's three eager forwards). None, and the trial checks, where no
    trial has found it yet, or where the study's eager baseline did not run cleanly: then the
    check's eager first loss is the numerics reference (scoring.numerics_verdict)."""
    view = view_of(study)
    if view.baseline_trial(Role.EAGER) is None:
        return None
    for t in view.finished:
        record = Record.of(t)
        value = record.attrs.get("rng_dependent")
        if isinstance(value, bool):
            return {"value": value, "from": with_old_defaults(record.attrs, t.number)["rng_dependent_from"]}
    return None


def mark_refused_in(study, config: dict) -> int | None:
    """The earlier trial of the study whose hard mark_dynamic Dynamo refused (its record's
    `mark_dynamic_fallback`) under the same GRAPH_KEYS as `config`, which asks for "mark": the trial
    then measures "maybe" at once (trial.process.run_trial). None: the hard mark is tried."""
    config = {**DEFAULTS, **config}
    if not config["compile"] or config["mark_dynamic"] != "mark":
        return None
    for t in _finished(study):
        record = Record.of(t)
        fallback = record.attrs.get("mark_dynamic_fallback")
        measured = {**DEFAULTS, **(record.config or {})}
        if isinstance(fallback, dict) and all(measured[key] == config[key] for key in GRAPH_KEYS):
            return fallback.get("learned_from", t.number)
    return None


def measured_as(study, config: dict) -> dict:
    """The configuration a trial of `config` measures: "maybe" for a hard mark the study saw refused
    under the same graphs (mark_refused_in), else `config` itself."""
    return {**config, "mark_dynamic": "maybe"} if mark_refused_in(study, config) is not None else config
