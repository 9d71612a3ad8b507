"""A trial's record, and the boundary where the study keeps it: its `Role`; what the engine decides
from it (`Record`, a typed dataclass read from the trial's user attributes, `Record.of`, with what a
record written before a key existed means, OLD_DEFAULTS); the whole record as written
(`FullRecord`: the trial's result, judged, scored and placed in the search), concise as the trial's
user attributes (`to_attrs`), whole in its result.json (`full_record`).

The study (and the dashboard that shows it) keeps each value of a record short: a long list
(window rates, recompile and graph-break reasons, losses, notes, triage rungs) becomes its
length and first item, a long text (the snippet) or mapping (the numerics series) its start.
The whole record is written to the trial's folder, `DIR/STUDY/trials/NNNN/result.json`
(uploaded to the dashboard as an artifact); `full_record` reads it back for whatever needs
more than the attributes hold. What the engine asks of a study's records (its baselines, its
candidates, its winner) is `engine.studyview`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from types import MappingProxyType

from autocompile.trial.result import Result, Status


class Role(str, Enum):
    """Why a trial was run. A string enum, like `Status`: the study holds the plain string."""

    EAGER = "eager"  # the eager baseline: the reference of every speed-up and numerics verdict
    COMPILE_DEFAULTS = "compile-defaults"  # plain torch.compile, the other baseline
    RECIPE = "recipe"  # a starting point of the space, queued after the baselines
    NEIGHBOUR = "neighbour"  # the incumbent (or the fastest trial) with one dimension moved
    SEARCH = "search"  # the sampler's (TPE's) proposal
    FINALIST = "finalist"  # a finalist measured again in the finalist round, or its cold check

    def __str__(self) -> str:
        return self.value


# Measured first, each under its own limit, never refused, pruned or screened.
BASELINES = (Role.EAGER, Role.COMPILE_DEFAULTS)


class FullRecord(Result, total=False):
    """A trial's whole record as written: its result (`trial.result.Result`), and what the engine adds
    to it. The engine reads a stored one back as a `Record`."""

    role: Role
    worker: str  # the process that ran it (host, boot, pid): a dead worker's trial is failed and tried again
    score: float  # its effective speed over the horizon (scoring.score); 0 for any status but ok
    numerics: dict  # its numerics against eager (scoring.numerics_verdict)
    over_memory_gb: float  # how far above --max-memory-gb it peaked (infeasible for it alone)
    known_peak_mem_gb: float  # refused before launch: the peak it took in other studies here (knowledge.peaks)
    predicted_warmup_s: float  # its cold warm-up as the cost model predicted it before launch
    compile_cache: str  # "shared": it compiled into the study's shared cache
    screen: dict  # its screen: measured with the repeated blocks cut (engine/screening.py)
    # a neighbour: the trial it moved from, its parameters, and the dimensions it moved
    parent: int
    parent_params: dict
    changed: list[str]
    # a finalist's rerun: the trial it measures again, in which round, and what it carried from it
    remeasure_of: int
    finalist_round: int
    cold_check: bool  # from empty caches, its warm-up measured cold
    warm_warmup_s: float  # its own warm-up, from the code its first run compiled
    warmup_carried_from: int
    replay_carried_from: int
    rejudged_from: int  # a new numerics verdict of that trial's measurement (engine/rejudge.py)


# What a record written before a key existed means by its absence: key -> (the key whose presence it
# qualifies, its value from the record and the trial's number). Read back through `from_attrs`.
OLD_DEFAULTS: dict[str, tuple[str, Callable[[Mapping, int | None], object]]] = {
    # before a warm-up said its kind, each was measured from empty caches (or was eager's own)
    "warmup_kind": ("warmup_s", lambda record, number: "cold" if (record.get("config") or {}).get("compile") else "eager"),
    # before a finding named the trial that made it, the trial itself ran the check
    "rng_dependent_from": ("rng_dependent", lambda record, number: number),
}


def with_old_defaults(attrs: Mapping, number: int | None = None) -> dict:
    """A trial's user attributes (or whole record): a copy, with what an older record means by a key
    it lacks (OLD_DEFAULTS); `number` is the trial's."""
    record = dict(attrs)
    for key, (qualifies, default) in OLD_DEFAULTS.items():
        if key not in record and qualifies in record:
            record[key] = default(record, number)
    return record


@dataclass(frozen=True)
class Record:
    """What the engine decides from a trial's stored record: its outcome, its place in the search, its
    steady speed, warm-up and memory, and where it ran. Read from the trial's user attributes (`of`,
    `from_attrs`); each field is None where the record lacks its key. The measurement's detail beside
    these (window rates, losses, numerics series, ...) is the worker's `Result`: concise in `attrs` (as
    stored, without OLD_DEFAULTS: `with_old_defaults`), whole in the trial's result.json (`full_record`)."""

    number: int | None = None  # the trial's
    status: Status | str | None = None  # how it ended (a plain string, equal to its `Status`)
    reason: str | None = None  # why it ended so ("" for ok)
    role: Role | str | None = None  # why it was run (a plain string, equal to its `Role`)
    config: dict | None = None  # the configuration measured
    # a neighbour: the trial it moved from, and the dimensions it moved
    parent: int | None = None
    changed: list[str] | None = None
    score: float | None = None  # its effective speed over the horizon (scoring.score)
    steps_per_s: float | None = None  # its steady speed
    items_per_s: float | None = None
    warmup_s: float | None = None  # its warm-up, of `warmup_kind` (cold, reconstructed or eager)
    warmup_kind: str | None = None
    warmup_measured_s: float | None = None  # a reconstructed warm-up's measured one
    peak_mem_gb: float | None = None
    over_memory_gb: float | None = None  # how far above --max-memory-gb it peaked
    numerics: dict | None = None  # its numerics against eager (scoring.numerics_verdict)
    recompiles: int | None = None
    graph_breaks: int | None = None
    wall_s: float | None = None  # its process's whole time (0 for one refused before launch)
    worker: dict | None = None  # the process that ran it (host, boot, pid, gpu)
    gpu: int | str | None = None  # the GPU a finalist round of several ran it on
    compile_cache: str | None = None  # "shared": it compiled into the study's shared cache
    # a finalist's rerun: the trial it measures again, and in which round
    remeasure_of: int | None = None
    finalist_round: int | None = None
    attrs: Mapping = field(default_factory=dict)  # the user attributes it was read from, as the study holds them

    @classmethod
    def from_attrs(cls, attrs: Mapping, number: int | None = None) -> Record:
        """A trial's user attributes (or whole record) as its record, each field with what an older record
        means by a key it lacks (OLD_DEFAULTS); `number` is the trial's."""
        known = with_old_defaults(attrs, number)
        return cls(number=number, attrs=MappingProxyType(dict(attrs)), **{key: known.get(key) for key in _READ})

    @classmethod
    def of(cls, trial) -> Record:
        """A study's trial's record, from its user attributes (a stand-in for one may lack a number)."""
        return cls.from_attrs(trial.user_attrs, getattr(trial, "number", None))


_READ = tuple(f.name for f in fields(Record) if f.name not in ("number", "attrs"))  # each read from the key of its name


def plain(value):
    """`value` with each status or role in it (the enums) as the plain string the study stores."""
    if isinstance(value, Enum):
        return value.value
    if type(value) is dict:
        return {key: plain(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(plain(item) for item in value)
    return value


def status_of(trial) -> str:
    """A finished trial's status; for one told without a record, what its state says: pruned, else
    interrupted (the search stopped during it)."""
    status = Record.of(trial).status
    if status is None:
        return Status.PRUNED.value if trial.state.name == "PRUNED" else Status.INTERRUPTED.value
    return status


ATTR_CHARS = 300  # the longest a user attribute's value may be, as JSON
# The configuration stays whole: the search reads it back to resume, dedupe and take
# neighbours. It is one flat mapping of settings (up to ~450 characters with Inductor options).
WHOLE = ("config",)


def _json(value) -> str:
    return json.dumps(value, default=str)


def shortened(value, limit: int = ATTR_CHARS):
    """`value` if its JSON is at most `limit` long; else a mapping with its long values shortened
    (where that is enough), or a text saying what it was."""
    text = _json(value)
    if len(text) <= limit:
        return value
    if isinstance(value, dict):  # stays a mapping where it can: a verdict's method, figures stay readable
        for inner_limit in (60, 30):
            inner = {key: shortened(item, inner_limit) for key, item in value.items()}
            if len(_json(inner)) <= limit:
                return inner
        kept = {
            key: item
            for key, item in value.items()
            if item is None or isinstance(item, (bool, int, float)) or (isinstance(item, str) and len(item) <= 30)
        }
        kept["…"] = f"{len(value) - len(kept)} more keys in result.json"
        if len(_json(kept)) <= limit:
            return kept
        head = f"{len(value)} keys (all in result.json): "
    elif isinstance(value, (list, tuple)):
        head = f"{len(value)} items (all in result.json); first: "
        text = _json(value[0])
    else:
        head, text = "", str(value)
    cut = max(limit - len(head) - 4, 0)
    while cut > 0 and len(_json(head + text[:cut] + "…")) > limit:
        cut -= 10  # escapes (newlines, quotes) make the JSON longer than the text
    return head + text[:cut] + "…"


def to_attrs(record: Mapping) -> dict:
    """The record as the trial's user attributes: every value at most ATTR_CHARS of JSON (but WHOLE's),
    each status and role the plain string of its value."""
    return {key: plain(value) if key in WHOLE else shortened(plain(value)) for key, value in record.items()}


def refused_before_launch(record: Record) -> bool:
    """Whether a trial was refused by a gate at no process cost: infeasible or pruned before launch."""
    return record.wall_s == 0.0 and record.status in (Status.INFEASIBLE, Status.PRUNED)


def set_attrs(trial, attrs: Mapping) -> None:
    """Write `attrs` to the trial's user attributes, each status and role the plain string of its value
    (a whole record goes through `to_attrs` first, to be kept concise)."""
    for key, value in attrs.items():
        trial.set_user_attr(key, plain(value))


def snippet_header(model: str, study: str, number: int) -> str:
    """The first line of a study's trial's snippet (its apply_compilation.py)."""
    return f"Compile settings for {model} (study {study!r}, trial {number}), found by autocompile."


def trial_folder(study_dir: str, number: int) -> str:
    return os.path.join(study_dir, "trials", f"{number:04d}")


def save_record(folder: str, record: Mapping) -> None:
    """Write the whole record to folder/result.json (the folder the trial ran in)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "result.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)


def full_record(trial, study_dir: str | None) -> FullRecord:
    """A trial's whole record: its user attributes, with each value they hold shortened read back
    from its result.json. A study made before attributes were concise holds it all already."""
    attrs = dict(trial.user_attrs)
    if not study_dir:
        return attrs
    try:
        with open(os.path.join(trial_folder(study_dir, trial.number), "result.json")) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return attrs
    for key, value in saved.items():
        if key not in attrs or (attrs[key] != value and shortened(value) == attrs[key]):
            attrs[key] = value
    return attrs


def speedup(value: float | None, base: float | None) -> str:
    return f"{value / base:.2f}x" if value and base else "-"


def config_columns(config: dict) -> dict:
    """A configuration flattened: one column per dimension, `inductor.KEY` and `mode.PART` included."""
    from autocompile.space import DEFAULTS

    columns = {}
    for key, value in {**DEFAULTS, **config}.items():
        if key == "inductor":
            columns.update({f"inductor.{k}": v for k, v in value.items()})
        elif key == "part_modes":
            columns.update({f"mode.{part}": mode for part, mode in value.items()})
        else:
            columns[key] = value
    return columns


def carried(record: FullRecord, first: Mapping, number: int, warm_up: bool = True) -> FullRecord:
    """A finalist's rerun that started from the code its first run (trial `number`, whole record
    `first`) compiled: its warm warm-up kept apart, the first run's cold warm-up carried as its
    own, and the first run's numerics replay with it (not run again), so that its score is the
    score of the configuration as a user meets it, cold. Without `warm_up` (a rerun from empty
    caches, its warm-up cold already), the numerics alone."""
    if record.get("status") != Status.OK:
        return record
    first = with_old_defaults(first, number)
    if warm_up:
        record["warm_warmup_s"] = record.get("warmup_measured_s", record.get("warmup_s"))
        for key in ("warmup_measured_s", "reconstruction"):
            record.pop(key, None)
        record.update(
            warmup_s=first.get("warmup_s"),
            warmup_steps=first.get("warmup_steps"),
            warmup_carried_from=number,
            warmup_kind=first.get("warmup_kind"),
        )
    if first.get("replay") and not record.get("replay"):
        record.update(replay=first["replay"], replay_carried_from=number)
    return record
