"""The search space: which compile settings exist, where they mean something, and their defaults.

A configuration is a plain JSON-able dict (the keys of `DEFAULTS`). The space is a list of
`Dimension`s, each with the values it may take and a condition on the values chosen before
it, so one definition serves three uses: sampling define-by-run from an Optuna trial
(`SearchSpace.suggest`), listing (`SearchSpace.describe`, shown by `autocompile space`) and
validating a configuration a user wrote by hand (`SearchSpace.validate`).

Only what the installed torch and the device support is offered; what is left out is listed
with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from autocompile.errors import UserError

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
    "fused_optimizer": False,  # switch the optimizer to its fused (single-kernel) implementation
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
    {"scope": "regional", "compile_optimizer": True, "padding": "multiple", "pad_multiple": 64},
    {"scope": "regional", "fused_optimizer": True, "padding": "multiple", "pad_multiple": 64},
    # CUDA only (skipped where reduce-overhead is not offered): CUDA graphs on a few fixed shapes
    {"scope": "regional", "mode": "reduce-overhead", "padding": "buckets", "compile_optimizer": True},
    {"scope": "full", "mode": "max-autotune-no-cudagraphs", "compile_optimizer": True},
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
}


def uses_cuda_graphs(config: dict) -> bool:
    modes = [config["mode"]] if config["scope"] != "modular" else list(config["part_modes"].values())
    return (
        any(mode in CUDA_GRAPH_MODES for mode in modes) or config["inductor"].get("triton.cudagraphs") is True
    )


def uses_autotune(config: dict) -> bool:
    modes = [config["mode"]] if config["scope"] != "modular" else list(config["part_modes"].values())
    return any(mode.startswith("max-autotune") for mode in modes)


@dataclass
class Capabilities:
    """What the installed torch and the chosen device support."""

    device: str
    torch_version: str
    inductor_defaults: dict[str, Any]  # searched Inductor keys present here -> installed default
    has_mark_dynamic: bool
    has_maybe_mark_dynamic: bool
    recompile_limit_key: str | None

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


def _set(config: dict, path: tuple[str, ...], value) -> None:
    if len(path) == 1:
        config[path[0]] = value
    else:
        config[path[0]] = {**config[path[0]], path[1]: value}


class SearchSpace:
    """The dimensions searched for one workload on one device with one torch."""

    def __init__(self, caps: Capabilities, traits: WorkloadTraits, fixed: dict | None = None):
        self.caps = caps
        self.traits = traits
        self.dimensions: list[Dimension] = []
        self.left_out: list[tuple[str, str]] = []  # (dimension or value, why)
        self._build()
        self.fixed = {}
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
        if traits.fusable_optimizer:
            self._add("fused_optimizer", (False, True), "the optimizer's fused implementation instead of foreach",
                      lambda c: not c["compile_optimizer"])
        else:
            self.left_out.append(("fused_optimizer", "the workload's optimizer has no fused implementation"))

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

        groups = [(INDUCTOR_OPTIONS, lambda c: True, None)]
        cuda_only = [(INDUCTOR_OPTIONS_CUDA, lambda c: True, "tunes Triton kernels: needs CUDA"),
                     (INDUCTOR_OPTIONS_AUTOTUNE, uses_autotune, "max-autotune GEMM backends: needs CUDA"),
                     (INDUCTOR_OPTIONS_CUDAGRAPHS, uses_cuda_graphs, "CUDA-graph option: needs CUDA")]
        for options, active, why_not_here in groups + cuda_only:
            for key, values in options.items():
                if why_not_here and not caps.cuda:
                    self.left_out.append((f"inductor.{key}", why_not_here))
                elif key not in caps.inductor_defaults:
                    self.left_out.append((f"inductor.{key}", f"torch {caps.torch_version} has no such Inductor option"))
                elif not all(isinstance(v, type(caps.inductor_defaults[key])) for v in values):
                    self.left_out.append((f"inductor.{key}", f"installed type {type(caps.inductor_defaults[key]).__name__} differs"))
                else:  # the installed default first: it is what a recipe leaves unchanged
                    default = caps.inductor_defaults[key]
                    values = (default, *[v for v in values if v != default])
                    self._add(f"inductor.{key}", values, f"Inductor option {key}", active)
        self.left_out.append(("matmul_precision, recompile_limit", "change numerics or limits: only set with --set"))

    def dimension(self, name: str) -> Dimension:
        for dim in self.dimensions:
            if dim.name == name:
                return dim
        raise UserError(f"unknown search dimension {name!r}; known: {', '.join(d.name for d in self.dimensions)}")

    def fix(self, name: str, value) -> None:
        """Pin a dimension to one value (it is then not searched), or set an unsearched key."""
        if name in ("matmul_precision", "recompile_limit"):
            self.fixed[name] = value
            return
        dim = self.dimension(name)
        if value not in dim.choices:
            raise UserError(f"{name}={json.dumps(value)} is not offered here; choices: {json.dumps(list(dim.choices))}")
        self.fixed[name] = value

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
            value = self.fixed.get(dim.name, partial.get(dim.name, node if node in dim.choices else dim.choices[0]))
            if value not in dim.choices:
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
                value = trial.suggest_categorical(dim.name, list(dim.choices))
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
        """Check a hand-written configuration; fill in defaults; raise UserError on bad values."""
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
            if value not in choices:
                raise UserError(f"invalid value {json.dumps(value)} for {name}; choices: {json.dumps(list(choices))}")

        check("scope", full["scope"], SCOPES)
        allowed_modes = self.modes
        if full["mode"] in CUDA_GRAPH_MODES and not self.caps.cuda:
            raise UserError(f"mode {full['mode']!r} uses CUDA graphs and needs a CUDA device")
        check("mode", full["mode"], allowed_modes)
        if full["scope"] == "modular":
            if len(self.traits.parts) < 2:
                raise UserError("scope 'modular' needs a workload with natural parts; this one declares none")
            modes = {part: full["part_modes"].get(part, full["mode"]) for part in self.traits.parts}
            for part, mode in modes.items():
                check(f"part_modes.{part}", mode, allowed_modes)
            extra = set(full["part_modes"]) - set(self.traits.parts)
            if extra:
                raise UserError(f"part_modes names unknown part(s) {sorted(extra)}; parts: {list(self.traits.parts)}")
            full["part_modes"] = modes
        if full["scope"] == "regional" and self.traits.regions == []:
            raise UserError("scope 'regional' needs repeated blocks; none were found in this model")
        check("dynamic", full["dynamic"], (None, True, False))
        check("fullgraph", full["fullgraph"], (True, False))
        check("compile_optimizer", full["compile_optimizer"], (True, False))
        check("fused_optimizer", full["fused_optimizer"], (True, False))
        check("padding", full["padding"], PADDINGS)
        if full["padding"] == "multiple":
            if not isinstance(full["pad_multiple"], int) or full["pad_multiple"] < 1:
                raise UserError("padding 'multiple' needs pad_multiple, a positive integer")
        check("mark_dynamic", full["mark_dynamic"], MARK_DYNAMIC)
        if full["mark_dynamic"] != "off" and not self.traits.varying:
            raise UserError("mark_dynamic needs a workload with varying dimensions; this one has none")
        if not isinstance(full["inductor"], dict):
            raise UserError("inductor must be an object of Inductor options")
        import torch._inductor.config as inductor_config

        for key, value in full["inductor"].items():
            default = _inductor_default(inductor_config, key)
            if default is _MISSING:
                raise UserError(f"torch {self.caps.torch_version} has no Inductor option {key!r}")
            if default is not None and not isinstance(value, type(default)):
                raise UserError(f"Inductor option {key!r} takes a {type(default).__name__}, got {json.dumps(value)}")
        if full["recompile_limit"] is not None and (not isinstance(full["recompile_limit"], int) or full["recompile_limit"] < 1):
            raise UserError("recompile_limit must be a positive integer")
        check("matmul_precision", full["matmul_precision"], (None, "highest", "high", "medium"))
        return full

    def describe(self) -> dict:
        """What `autocompile space --json` prints."""
        return {
            "device": self.caps.device,
            "torch": self.caps.torch_version,
            "dimensions": [
                {"name": d.name, "choices": list(d.choices), "help": d.help,
                 **({"fixed": self.fixed[d.name]} if d.name in self.fixed else {})}
                for d in self.dimensions
            ],
            "left_out": [{"name": name, "why": why} for name, why in self.left_out],
            "defaults": DEFAULTS,
        }
