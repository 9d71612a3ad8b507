"""The search space: which compile settings exist, where they mean something, and their defaults.

A configuration is a plain JSON-able dict (the keys of `DEFAULTS`). The space is a list of
`Dimension`s, each with the values it may take and a condition on the values chosen before
it, so one definition serves three uses: sampling define-by-run from an Optuna trial
(`SearchSpace.suggest`), listing (`SearchSpace.describe`, shown by `autocompile space`) and
validating a configuration a user wrote by hand (`SearchSpace.validate`).

Only what the installed torch and the device support is offered; what is left out is listed
with the reason. Conditions keep the search from sampling combinations that mean nothing;
`SearchSpace.rejection` names those that slip past them (a hand-written configuration, a
pinned value), so they are turned away before any trial starts. Users narrow or extend the
space with a space file (`load_space_file`: values to pin, to leave out, extra Inductor
options to try).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from autocompile.errors import UserError
from autocompile.space.rules import doomed

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
SCOPES = ("full", "regional", "modular")
PADDINGS = ("longest", "multiple", "buckets", "max")
MARK_DYNAMIC = ("off", "mark", "maybe")

# The configuration of plain `torch.compile(model)`: every key a configuration may hold.
DEFAULTS: dict[str, Any] = {
    "compile": True,
    "scope": "full",  # full model | regional: each repeated block | modular: the workload's parts
    "mode": "default",
    "part_modes": {},  # modular scope: part -> mode
    "dynamic": None,
    "fullgraph": False,
    "compile_optimizer": False,  # torch.compile(optimizer.step)
    "lr_tensor": False,  # with compile_optimizer: the learning rate as a tensor, so a scheduler does not recompile the step
    "fused_optimizer": False,  # switch the optimizer to its fused (single-kernel) implementation
    "compile_loss": False,  # compile the workload's criterion (outputs, batch) -> loss apart from the model
    "padding": "longest",  # of the varying batch dimensions
    "pad_multiple": None,  # with padding == "multiple"
    "mark_dynamic": "off",  # mark the varying dimensions dynamic: off | mark | maybe
    "inductor": {},  # Inductor config options that differ from the installed defaults
    "recompile_limit": None,  # None: torch's own
    "matmul_precision": None,  # None: torch's own ("highest"); "high" allows TF32
}
EAGER: dict[str, Any] = {**DEFAULTS, "compile": False}

# Recipes from the seed texts, tried right after the baselines so that a short search starts
# from known-good ground (each applies only where its values are offered).
STARTING_POINTS: list[dict] = [
    {"scope": "regional"},  # each block compiled once: short warm-up, usually near full speed
    {"scope": "regional", "fused_optimizer": True, "compile_loss": True, "padding": "multiple", "pad_multiple": 64},
    # (lr_tensor applies where the workload has an LR schedule: else each new LR recompiles the step)
    {"scope": "regional", "compile_optimizer": True, "lr_tensor": True, "padding": "multiple", "pad_multiple": 64},
    # CUDA only (skipped where reduce-overhead is not offered): CUDA graphs on a few fixed shapes
    {"scope": "regional", "mode": "reduce-overhead", "padding": "buckets", "compile_optimizer": True, "lr_tensor": True},
    # The seed's best by hand: the whole model, its varying length marked dynamic
    {"scope": "full", "mark_dynamic": "maybe", "fused_optimizer": True, "compile_loss": True},
    {"scope": "full", "mode": "max-autotune-no-cudagraphs", "compile_optimizer": True, "lr_tensor": True},
]

# Inductor options searched, with the values tried; each is offered only if the installed
# torch has the key with a value of the same type.
INDUCTOR_OPTIONS: dict[str, tuple] = {
    "shape_padding": (True, False),
    "epilogue_fusion": (True, False),
    "aggressive_fusion": (False, True),
}
INDUCTOR_OPTIONS_CUDA: dict[str, tuple] = {
    "coordinate_descent_tuning": (False, True),
}
INDUCTOR_OPTIONS_AUTOTUNE: dict[str, tuple] = {
    "max_autotune_gemm_backends": ("ATEN,TRITON", "TRITON", "ATEN"),
}
INDUCTOR_OPTIONS_CUDAGRAPHS: dict[str, tuple] = {
    "triton.cudagraph_trees": (True, False),
    # variable lengths: record a graph per shape (default) or run dynamic-shape graphs without
    "triton.cudagraph_skip_dynamic_graphs": (False, True),
    # re-recordings (new input addresses) allowed before a function falls back to no CUDA graph
    "triton.cudagraph_unexpected_rerecord_limit": (128, 16),
    # split graphs around ops CUDA graphs cannot hold, so the rest is still captured
    "graph_partition": (True, False),
}


def uses_cuda_graphs(config: dict) -> bool:
    modes = [config["mode"]] if config["scope"] != "modular" else list(config["part_modes"].values())
    return (
        any(mode in CUDA_GRAPH_MODES for mode in modes) or config["inductor"].get("triton.cudagraphs") is True
    )


def uses_autotune(config: dict) -> bool:
    modes = [config["mode"]] if config["scope"] != "modular" else list(config["part_modes"].values())
    return any(mode.startswith("max-autotune") for mode in modes) or config["inductor"].get("max_autotune") is True


# Where a grouped Inductor option means something, and why it is left out elsewhere.
_OPTION_GROUPS = (
    (INDUCTOR_OPTIONS, None, lambda c: True, None),
    (INDUCTOR_OPTIONS_CUDA, "tunes Triton kernels: needs CUDA", lambda c: True, None),
    (INDUCTOR_OPTIONS_AUTOTUNE, "max-autotune GEMM backends: needs CUDA", uses_autotune,
     "only matters with max-autotune (mode max-autotune or max-autotune-no-cudagraphs)"),
    (INDUCTOR_OPTIONS_CUDAGRAPHS, "CUDA-graph option: needs CUDA", uses_cuda_graphs,
     "only matters with CUDA graphs (mode reduce-overhead or max-autotune)"),
)


@dataclass
class Capabilities:
    """What the installed torch and the chosen device support."""

    device: str
    torch_version: str
    inductor_defaults: dict[str, Any]  # searched Inductor keys present here -> installed default
    has_mark_dynamic: bool
    has_maybe_mark_dynamic: bool
    recompile_limit_key: str | None
    recompile_limit: int | None = None  # Dynamo's default: compiles of one function before it runs eager

    @classmethod
    def detect(cls, device: str) -> "Capabilities":
        import torch
        import torch._dynamo
        import torch._dynamo.config as dynamo_config
        import torch._inductor.config as inductor_config

        wanted = {**INDUCTOR_OPTIONS, **INDUCTOR_OPTIONS_CUDA, **INDUCTOR_OPTIONS_AUTOTUNE, **INDUCTOR_OPTIONS_CUDAGRAPHS}
        present = {}
        for key in wanted:
            value = _inductor_default(inductor_config, key)
            if value is not _MISSING:
                present[key] = value
        limit_key = next((k for k in ("recompile_limit", "cache_size_limit") if hasattr(dynamo_config, k)), None)
        return cls(
            device=device,
            torch_version=torch.__version__,
            inductor_defaults=present,
            has_mark_dynamic=hasattr(torch._dynamo, "mark_dynamic"),
            has_maybe_mark_dynamic=hasattr(torch._dynamo, "maybe_mark_dynamic"),
            recompile_limit_key=limit_key,
            recompile_limit=getattr(dynamo_config, limit_key) if limit_key else None,
        )

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")


_MISSING = object()


def _inductor_default(inductor_config, key: str):
    node = inductor_config
    for part in key.split("."):
        try:
            node = getattr(node, part)
        except AttributeError:
            return _MISSING
    return node


def _fits(value, default) -> bool:
    """Whether `value` may be given for an Inductor option whose installed default is `default`
    (bool and int kept apart: True is an int to Python, not to a config)."""
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(default, str):
        return isinstance(value, str)
    if isinstance(default, (list, tuple)):
        return isinstance(value, (list, tuple))
    if isinstance(default, dict):
        return isinstance(value, dict)
    if default is None:  # an optional setting: its type is not known from the default
        return value is None or isinstance(value, (bool, int, float, str, list, tuple, dict))
    return False  # a group of options, a callable, an object: not something a configuration carries


def _member(value, choices) -> bool:
    """`value in choices`, but True is not 1 and 1.0 is not 1."""
    return any(type(value) is type(choice) and value == choice for choice in choices)


def _show(value) -> str:
    return json.dumps(value)


@dataclass
class Dimension:
    name: str  # the Optuna parameter name
    choices: tuple
    help: str
    active: Callable[[dict], bool] = lambda config: True

    def key_path(self) -> tuple[str, ...]:
        """Where the value goes in a configuration: ("mode",) or ("inductor", "shape_padding")."""
        if self.name.startswith("inductor."):
            return ("inductor", self.name[len("inductor."):])
        if self.name.startswith("mode."):
            return ("part_modes", self.name[len("mode."):])
        return (self.name,)


@dataclass
class WorkloadTraits:
    """What the space needs to know of a workload: found without running it."""

    varying: dict[str, tuple[int, int]] = field(default_factory=dict)
    parts: tuple[str, ...] = ()
    regions: list[str] | None = None  # repeated-block lists; None: not known before building
    fusable_optimizer: bool = False  # the optimizer has a fused implementation (Adam, AdamW, SGD)
    criterion: bool = False  # the loss comes as forward + criterion: the criterion can be compiled apart
    schedule: bool = False  # the learning rate follows a scheduler, changing during training
    lengths: tuple[int, int] | None = None  # the varying dimension's range (lowest, highest): None if unknown


@dataclass
class SpaceFile:
    """A user's narrowing or extension of the space, read from a TOML or JSON file.

    fix: dimension -> value (as --set); exclude: dimension -> values left out;
    inductor: extra Inductor option -> values to try.
    """

    path: str
    fix: dict[str, Any] = field(default_factory=dict)
    exclude: dict[str, list] = field(default_factory=dict)
    inductor: dict[str, list] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return os.path.basename(self.path)


def _flatten(table: dict, prefix: str = "") -> dict:
    """{"inductor": {"shape_padding": [..]}} -> {"inductor.shape_padding": [..]}: TOML reads an
    unquoted dotted key as nested tables."""
    flat = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def load_space_file(path: str) -> SpaceFile:
    """Read a space file (TOML, or JSON by its .json suffix); UserError on anything malformed."""
    if not os.path.isfile(path):
        raise UserError(f"space file not found: {path}")
    try:
        if path.endswith(".json"):
            with open(path) as f:
                data = json.load(f)
        else:
            try:
                import tomllib
            except ImportError:  # Python 3.10
                try:
                    import tomli as tomllib
                except ImportError:
                    raise UserError(f"{path}: reading TOML needs Python 3.11 (or the tomli package); "
                                    "or write the space file as JSON") from None
            with open(path, "rb") as f:
                data = tomllib.load(f)
    except UserError:
        raise
    except (ValueError, OSError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise UserError(f"{path}: not a valid space file: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a space file is a table with [fix], [exclude] and [inductor] sections")
    unknown = sorted(set(data) - {"fix", "exclude", "inductor"})
    if unknown:
        raise UserError(f"{path}: unknown section(s) {', '.join(unknown)}; known: fix, exclude, inductor")
    sections = {}
    for name in ("fix", "exclude", "inductor"):
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise UserError(f"{path}: [{name}] must be a table of NAME = VALUE lines")
        sections[name] = _flatten(table)
    for name in ("exclude", "inductor"):
        for key, values in sections[name].items():
            if not isinstance(values, list):
                values = sections[name][key] = [values]
            if not values:
                raise UserError(f"{path}: [{name}] {key} lists no value")
    return SpaceFile(path=path, **sections)


def _set(config: dict, path: tuple[str, ...], value) -> None:
    if len(path) == 1:
        config[path[0]] = value
    else:
        config[path[0]] = {**config[path[0]], path[1]: value}


def _toml_none(value, choices):
    """TOML has no null: "none" or "null" stands for None where None is a choice."""
    if isinstance(value, str) and value.lower() in ("none", "null") and _member(None, choices):
        return None
    return value


class SearchSpace:
    """The dimensions searched for one workload on one device with one torch."""

    def __init__(self, caps: Capabilities, traits: WorkloadTraits, fixed: dict | None = None,
                 space_file: SpaceFile | None = None):
        self.caps = replace(caps, inductor_defaults=dict(caps.inductor_defaults))  # extended by a space file
        self.traits = traits
        self.dimensions: list[Dimension] = []
        self.left_out: list[tuple[str, str]] = []  # (dimension or value, why)
        self.space_file = space_file
        self.excluded: dict[str, list] = {}  # dimension -> values a space file left out
        self._build()
        if space_file:
            self._extend(space_file)
            self._exclude(space_file)
        self.fixed = {}
        self.pinned_by: dict[str, str] = {}
        for name, value in (space_file.fix if space_file else {}).items():
            if name not in (fixed or {}):
                try:
                    self.fix(name, value, by=space_file.label)
                except UserError as exc:
                    raise UserError(f"{space_file.path}: [fix] {exc}") from None
        for name, value in (fixed or {}).items():
            self.fix(name, value)

    # -- building ---------------------------------------------------------------------------
    def _add(self, name, choices, help, active=lambda c: True):
        self.dimensions.append(Dimension(name, tuple(choices), help, active))

    def _build(self) -> None:
        caps, traits = self.caps, self.traits
        self.modes = modes = [m for m in MODES if caps.cuda or m not in CUDA_GRAPH_MODES]
        if not caps.cuda:
            self.left_out += [(f"mode={m}", "CUDA graphs need a CUDA device") for m in CUDA_GRAPH_MODES]

        scopes = ["full"]
        if traits.regions is None or traits.regions:
            scopes.append("regional")
        else:
            self.left_out.append(("scope=regional", "no repeated blocks (ModuleList of identical modules) found"))
        if len(traits.parts) >= 2:
            scopes.append("modular")
        else:
            self.left_out.append(("scope=modular", "the workload declares no natural parts"))
        self._add("scope", scopes, "what is compiled: the whole model, each repeated block, or each part")
        self._add("mode", modes, "torch.compile mode", lambda c: c["scope"] != "modular")
        for part in traits.parts if "modular" in scopes else ():
            self._add(f"mode.{part}", modes, f"mode for part {part!r}", lambda c: c["scope"] == "modular")
        self._add("dynamic", (None, True, False), "torch.compile dynamic: None = automatic")
        self._add("fullgraph", (False, True), "fail on graph breaks instead of falling back to eager")
        self._add("compile_optimizer", (False, True), "torch.compile(optimizer.step)")
        if traits.schedule:
            self._add("lr_tensor", (False, True), "the learning rate as a tensor: a scheduler's new value does "
                      "not recompile the compiled step", lambda c: c["compile_optimizer"])
        else:
            self.left_out.append(("lr_tensor", "the workload has no LR schedule: its learning rate never changes"))
        if traits.fusable_optimizer:
            self._add("fused_optimizer", (False, True), "the optimizer's fused implementation instead of foreach",
                      lambda c: not c["compile_optimizer"])
        else:
            self.left_out.append(("fused_optimizer", "the workload's optimizer has no fused implementation"))
        if traits.criterion:
            self._add("compile_loss", (False, True), "torch.compile the criterion (outputs, batch) -> loss apart")
        else:
            self.left_out.append(("compile_loss", "the workload gives its loss as one function, "
                                                  "not as forward + criterion"))

        if traits.varying:
            self._add("padding", PADDINGS, "how varying lengths are padded before the forward pass")
            self._add("pad_multiple", (8, 32, 64), "pad the longest up to a multiple of",
                      lambda c: c["padding"] == "multiple")
            marks = ["off"]
            if caps.has_mark_dynamic:
                marks.append("mark")
            if caps.has_maybe_mark_dynamic:
                marks.append("maybe")
            self._add("mark_dynamic", marks, "mark the varying dimensions dynamic",
                      lambda c: c["padding"] in ("longest", "multiple") and c["dynamic"] is None)
        else:
            self.left_out.append(("padding, mark_dynamic", "the workload has no varying dimension"))

        for options, why_not_here, active, _ in _OPTION_GROUPS:
            for key, values in options.items():
                if why_not_here and not caps.cuda:
                    self.left_out.append((f"inductor.{key}", why_not_here))
                elif key not in caps.inductor_defaults:
                    self.left_out.append((f"inductor.{key}", f"torch {caps.torch_version} has no such Inductor option"))
                elif not all(_fits(v, caps.inductor_defaults[key]) for v in values):
                    self.left_out.append((f"inductor.{key}", f"installed type {type(caps.inductor_defaults[key]).__name__} differs"))
                else:  # the installed default first: it is what a recipe leaves unchanged
                    default = caps.inductor_defaults[key]
                    values = (default, *[v for v in values if v != default])
                    self._add(f"inductor.{key}", values, f"Inductor option {key}", active)
        self.left_out.append(("matmul_precision, recompile_limit", "change numerics or limits: only set with --set"))

    def _extend(self, space_file: SpaceFile) -> None:
        """[inductor]: extra Inductor options to try, each checked against the installed torch."""
        import torch._inductor.config as inductor_config

        grouped = {key: group for group in _OPTION_GROUPS for key in group[0]}
        for key, values in space_file.inductor.items():
            key = key.removeprefix("inductor.")
            where = f"{space_file.path}: [inductor] {key}"
            default = _inductor_default(inductor_config, key)
            if default is _MISSING:
                raise UserError(f"{where}: torch {self.caps.torch_version} has no such Inductor option")
            if not _fits(default, default):  # a group of options, a callable, an object
                raise UserError(f"{where}: not an option a configuration can set "
                                f"(a {type(default).__name__} in torch._inductor.config)")
            for value in values:
                if not _fits(value, default):
                    raise UserError(f"{where}: {_show(value)} does not fit the installed option "
                                    f"(a {type(default).__name__}, default {default!r})")
            choices = (default, *[v for v in values if not _member(v, (default,))])
            name = f"inductor.{key}"
            existing = next((d for d in self.dimensions if d.name == name), None)
            if existing:
                existing.choices = choices
            elif key in grouped and grouped[key][1] and not self.caps.cuda:
                continue  # a CUDA-only option on another device: stays left out, with its reason
            else:
                active = grouped[key][2] if key in grouped else (lambda c: True)
                self._add(name, choices, f"Inductor option {key} (from {space_file.label})", active)
                self.left_out = [(n, why) for n, why in self.left_out if n != name]
            self.caps.inductor_defaults[key] = default

    def _known_names(self) -> set[str]:
        """Dimension names a space could have, here or elsewhere: those left out here included."""
        names = {d.name for d in self.dimensions}
        for name, _ in self.left_out:
            names.update(part.split("=", 1)[0].strip() for part in name.split(","))
        return names

    def _exclude(self, space_file: SpaceFile) -> None:
        """[exclude]: values taken out of their dimensions, each listed as left out."""
        known = self._known_names()
        here = {d.name: d for d in self.dimensions}
        elsewhere = {"scope": SCOPES, "mode": MODES, "mark_dynamic": MARK_DYNAMIC}  # values offered on other devices
        for name, values in space_file.exclude.items():
            where = f"{space_file.path}: [exclude] {name}"
            if name in ("matmul_precision", "recompile_limit"):
                raise UserError(f"{where}: not searched, so nothing to exclude; pin it in [fix]")
            if name not in known:
                raise UserError(f"{where}: no such dimension; known: {', '.join(sorted(known))}")
            dim = here.get(name)
            if dim is None:
                continue  # left out here already (another device, another workload)
            possible = dim.choices + tuple(elsewhere.get(name.split(".")[0], ()))
            for value in values:
                value = _toml_none(value, possible)
                if _member(value, dim.choices):
                    dim.choices = tuple(c for c in dim.choices if not _member(c, (value,)))
                    self.excluded.setdefault(name, []).append(value)
                    self.left_out.append((f"{name}={_show(value)}", f"excluded by {space_file.label}"))
                elif not _member(value, possible + tuple(self.excluded.get(name, ()))):
                    raise UserError(f"{where}: {_show(value)} is not one of its values {_show(list(possible))}")
            if not dim.choices:
                raise UserError(f"{where}: leaves the dimension with no value to try")

    def dimension(self, name: str) -> Dimension:
        for dim in self.dimensions:
            if dim.name == name:
                return dim
        raise UserError(f"unknown search dimension {name!r}; known: {', '.join(d.name for d in self.dimensions)}")

    def fix(self, name: str, value, by: str = "--set") -> None:
        """Pin a dimension to one value (it is then not searched), or set an unsearched key."""
        if name in ("matmul_precision", "recompile_limit"):
            self.fixed[name] = value
            self.pinned_by[name] = by
            return
        dim = self.dimension(name)
        value = _toml_none(value, dim.choices + tuple(self.excluded.get(name, ())))
        if _member(value, self.excluded.get(name, ())):
            raise UserError(f"{name}={_show(value)} is pinned ({by}) but excluded by {self.space_file.label}")
        if not _member(value, dim.choices):
            raise UserError(f"{name}={_show(value)} is not offered here; choices: {_show(list(dim.choices))}")
        self.fixed[name] = value
        self.pinned_by[name] = by

    # -- using ------------------------------------------------------------------------------
    def params_for(self, partial: dict) -> dict:
        """Optuna parameters for a configuration given in part: the rest at plain defaults.

        Returns {} where a value is not offered here (the recipe does not apply).
        """
        config = json.loads(json.dumps(DEFAULTS))
        params = {}
        for dim in self.dimensions:
            if not dim.active(config):
                continue
            node = DEFAULTS
            for key in dim.key_path():
                node = node.get(key) if isinstance(node, dict) else None
            value = self.fixed.get(dim.name, partial.get(dim.name, node if _member(node, dim.choices) else dim.choices[0]))
            if not _member(value, dim.choices):
                return {}
            if dim.name not in self.fixed:
                params[dim.name] = value
            _set(config, dim.key_path(), value)
        return params

    def starting_points(self) -> list[dict]:
        """Known-good recipes tried right after the baselines, as Optuna parameters."""
        points = []
        for recipe in STARTING_POINTS:
            params = self.params_for(recipe)
            if params and params not in points:
                points.append(params)
        return points

    def suggest(self, trial) -> dict:
        """Sample a configuration define-by-run: a dimension is asked only where it is active."""
        config = json.loads(json.dumps(DEFAULTS))
        for dim in self.dimensions:
            if not dim.active(config):
                continue
            if dim.name in self.fixed:
                value = self.fixed[dim.name]
            else:
                try:
                    value = trial.suggest_categorical(dim.name, list(dim.choices))
                except ValueError as exc:  # Optuna: a categorical's choices may not change within a study
                    if "dynamic value space" not in str(exc):
                        raise
                    raise UserError(
                        f"this study searched {dim.name} over other values than {_show(list(dim.choices))} "
                        "(a different space file or torch?): Optuna cannot change a dimension's values "
                        "within a study; use the same space file, or choose a new --study") from None
            _set(config, dim.key_path(), value)
        for name in ("matmul_precision", "recompile_limit"):
            if name in self.fixed:
                config[name] = self.fixed[name]
        return self.normalize(config)

    def normalize(self, config: dict) -> dict:
        """Drop Inductor options equal to the installed defaults, so snippets stay minimal."""
        config["inductor"] = {
            k: v for k, v in config["inductor"].items() if self.caps.inductor_defaults.get(k, _MISSING) != v
        }
        return config

    def validate(self, config: dict) -> dict:
        """Check a hand-written configuration's keys, types and values; fill in defaults; raise
        UserError on bad ones. Whether the combination can run here is `rejection`'s question."""
        if not isinstance(config, dict):
            raise UserError("a configuration is a JSON object, e.g. {\"scope\": \"regional\"}")
        unknown = sorted(set(config) - set(DEFAULTS))
        if unknown:
            raise UserError(f"unknown configuration key(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
        full = {**json.loads(json.dumps(DEFAULTS)), **config}
        if not isinstance(full["compile"], bool):
            raise UserError("compile must be true or false")
        if not full["compile"]:
            return {**EAGER, **{k: full[k] for k in ("padding", "pad_multiple")}}

        def check(name, value, choices):
            if not _member(value, choices):
                raise UserError(f"invalid value {_show(value)} for {name}; choices: {_show(list(choices))}")

        check("scope", full["scope"], SCOPES)
        check("mode", full["mode"], MODES)
        if not isinstance(full["part_modes"], dict):
            raise UserError("part_modes must be an object: part -> mode")
        if full["scope"] == "modular":
            modes = {part: full["part_modes"].get(part, full["mode"]) for part in self.traits.parts}
            for part, mode in {**full["part_modes"], **modes}.items():
                check(f"part_modes.{part}", mode, MODES)
            full["part_modes"] = {**full["part_modes"], **modes}
        for name in ("fullgraph", "compile_optimizer", "lr_tensor", "fused_optimizer", "compile_loss"):
            check(name, full[name], (False, True))
        check("dynamic", full["dynamic"], (None, True, False))
        check("padding", full["padding"], PADDINGS)
        if full["padding"] == "multiple":
            if not isinstance(full["pad_multiple"], int) or isinstance(full["pad_multiple"], bool) or full["pad_multiple"] < 1:
                raise UserError("padding 'multiple' needs pad_multiple, a positive integer")
        check("mark_dynamic", full["mark_dynamic"], MARK_DYNAMIC)
        if not isinstance(full["inductor"], dict):
            raise UserError("inductor must be an object of Inductor options")
        import torch._inductor.config as inductor_config

        for key, value in full["inductor"].items():
            default = _inductor_default(inductor_config, key)
            if default is _MISSING:
                raise UserError(f"torch {self.caps.torch_version} has no Inductor option {key!r}")
            if not _fits(value, default):
                raise UserError(f"Inductor option {key!r} takes a {type(default).__name__}, got {_show(value)}")
        limit = full["recompile_limit"]
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise UserError("recompile_limit must be a positive integer")
        check("matmul_precision", full["matmul_precision"], (None, "highest", "high", "medium"))
        return full

    def rejection(self, config: dict) -> str | None:
        """Why a (valid) configuration cannot work here, or means nothing; None if it may run.

        Conditions keep the sampler away from most of these; this catches the rest (a
        configuration written by hand, a pinned value, a recipe) before a trial is started.
        The baselines (eager, plain torch.compile) are references measured whatever the user
        pinned or excluded: only what cannot run at all is said of them.
        """
        c = {**json.loads(json.dumps(DEFAULTS)), **config}
        if not c["compile"]:
            return None
        caps, traits = self.caps, self.traits
        modes = list(c["part_modes"].values()) if c["scope"] == "modular" else [c["mode"]]
        graph_modes = [m for m in modes if m in CUDA_GRAPH_MODES]
        if graph_modes and not caps.cuda:
            return f"mode {graph_modes[0]!r} uses CUDA graphs, which need a CUDA device (this is {caps.device})"
        if c["inductor"].get("triton.cudagraphs") is True and not caps.cuda:
            return f"inductor triton.cudagraphs=true: CUDA graphs need a CUDA device (this is {caps.device})"
        if c["scope"] == "modular":
            if len(traits.parts) < 2:
                return "scope 'modular' compiles the workload's natural parts, and this one declares none"
            unknown = sorted(set(c["part_modes"]) - set(traits.parts))
            if unknown:
                return f"part_modes names part(s) {unknown} the workload does not have; parts: {list(traits.parts)}"
        if c["scope"] == "regional" and traits.regions == []:
            return "scope 'regional' compiles each repeated block, and this model has none (no ModuleList of identical modules)"
        if c["mark_dynamic"] != "off":
            how = "mark_dynamic" if c["mark_dynamic"] == "mark" else "maybe_mark_dynamic"
            if not traits.varying:
                return f"{how}: the workload has no varying dimension to mark"
            if c["padding"] == "max":
                return f"{how} with padding 'max': every batch is padded to one length, so nothing varies to mark"
            if c["dynamic"] is True:
                return f"{how} with dynamic=True: every dimension is compiled dynamic already, the marks change nothing"
            if c["dynamic"] is False:
                return (f"{how} with dynamic=False: the marks win (torch {caps.torch_version} compiles the marked "
                        "dimensions dynamic, one graph for all lengths), so this is dynamic=None with the marks "
                        "under another name")
        if c["compile_optimizer"] and c["fused_optimizer"]:
            return ("compile_optimizer with fused_optimizer: Dynamo does not trace into the fused step "
                    "(torch wraps it in torch.compiler.disable, 'don't trace into fused optimizer'), so the "
                    "compiled step runs the same fused kernel eagerly and only adds graph breaks; choose one")
        if c["fused_optimizer"] and not traits.fusable_optimizer:
            return "fused_optimizer: the workload's optimizer has no fused implementation"
        if c["lr_tensor"] and not c["compile_optimizer"]:
            return "lr_tensor keeps LR changes from recompiling a compiled optimizer step; the step is not compiled"
        if c["lr_tensor"] and not traits.schedule:
            return "lr_tensor: the workload has no LR schedule, so its learning rate never changes"
        if c["compile_loss"] and not traits.criterion:
            return "compile_loss: the workload gives its loss as one function, with no criterion to compile apart"
        for options, why_not_here, active, why_inactive in _OPTION_GROUPS:
            for key in options:
                if key not in c["inductor"] or c["inductor"][key] == caps.inductor_defaults.get(key, _MISSING):
                    continue
                if why_not_here and not caps.cuda:
                    return f"inductor.{key}: {why_not_here}"
                if why_inactive and not active(c):
                    return f"inductor.{key} {why_inactive}"
        if not self._baseline(c):
            return self._narrowing_rejection(c) or doomed(c, traits, caps)
        return None

    def _baseline(self, config: dict) -> bool:
        keys = [k for k in DEFAULTS if k not in ("matmul_precision", "recompile_limit")]
        return any(all(config[k] == base[k] for k in keys) for base in (DEFAULTS, EAGER))

    def _narrowing_rejection(self, config: dict) -> str | None:
        """A value the user pinned another way, or excluded, where its dimension applies."""
        for dim in self.dimensions:
            if not dim.active(config):
                continue
            value = self._value(dim, config)
            if dim.name in self.fixed and not _member(value, (self.fixed[dim.name],)):
                return (f"{dim.name} is pinned to {_show(self.fixed[dim.name])} ({self.pinned_by[dim.name]}), "
                        f"not {_show(value)}")
            if _member(value, self.excluded.get(dim.name, ())):
                return f"{dim.name}={_show(value)} is excluded by {self.space_file.label}"
        return None

    def _value(self, dim: Dimension, config: dict):
        """A dimension's value in a full configuration (an Inductor option at its installed default)."""
        path = dim.key_path()
        if path[0] == "inductor":
            return config["inductor"].get(path[1], self.caps.inductor_defaults.get(path[1]))
        if len(path) == 2:
            return config[path[0]].get(path[1])
        return config[path[0]]

    def searched_values(self, config: dict) -> dict:
        """Each searched (not pinned) dimension's value in a configuration, where it applies."""
        c = {**json.loads(json.dumps(DEFAULTS)), **config}
        return {d.name: self._value(d, c) for d in self.dimensions if d.name not in self.fixed and d.active(c)}

    def describe(self) -> dict:
        """What `autocompile space --json` prints."""
        return {
            "device": self.caps.device,
            "torch": self.caps.torch_version,
            "space_file": self.space_file.path if self.space_file else None,
            "dimensions": [
                {"name": d.name, "choices": list(d.choices), "help": d.help,
                 **({"fixed": self.fixed[d.name]} if d.name in self.fixed else {})}
                for d in self.dimensions
            ],
            "left_out": [{"name": name, "why": why} for name, why in self.left_out],
            "defaults": DEFAULTS,
        }
