import json

import optuna
import pytest

from autocompile.errors import UserError
from autocompile.space import DEFAULTS, Capabilities, SearchSpace, WorkloadTraits
from autocompile.study import build_space
from conftest import toy


def names(space):
    return [d.name for d in space.dimensions]


def test_cpu_space_leaves_out_cuda_only_values_and_says_why():
    space = build_space(toy(), "cpu")
    described = space.describe()
    modes = next(d["choices"] for d in described["dimensions"] if d["name"] == "mode")
    assert modes == ["default", "max-autotune-no-cudagraphs"]
    left_out = {item["name"]: item["why"] for item in described["left_out"]}
    assert "CUDA graphs" in left_out["mode=reduce-overhead"]
    assert "inductor.coordinate_descent_tuning" in left_out
    assert "scope=modular" in left_out  # the toy declares no parts
    assert space.traits.regions == ["blocks"]  # found on the meta device, not hard-coded


def test_cuda_space_of_the_captioner_lists_every_dimension():
    """Listing a CUDA space needs no GPU: it is derived from the installed torch."""
    space = build_space("captioner", "cuda")
    dims = names(space)
    for expected in ["scope", "mode", "mode.encoder", "mode.decoder", "dynamic", "fullgraph", "compile_optimizer",
                     "fused_optimizer", "padding", "pad_multiple", "mark_dynamic", "inductor.shape_padding",
                     "inductor.coordinate_descent_tuning", "inductor.triton.cudagraph_trees"]:
        assert expected in dims
    assert dict((d.name, d.choices) for d in space.dimensions)["mode"] == (
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    assert space.traits.regions == ["encoder.layers", "decoder.transformer.h"]


def test_suggest_is_conditional():
    space = build_space(toy(), "cpu")
    seen_multiple = seen_other = 0
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        trial = study.ask()
        config = space.suggest(trial)
        study.tell(trial, 0.0)
        assert set(config) == set(DEFAULTS)
        if config["padding"] == "multiple":
            seen_multiple += 1
            assert "pad_multiple" in trial.params and config["pad_multiple"] in (8, 32, 64)
        else:
            seen_other += 1
            assert "pad_multiple" not in trial.params and config["pad_multiple"] is None
        if config["compile_optimizer"]:
            assert "fused_optimizer" not in trial.params
        if config["mark_dynamic"] != "off":
            assert config["dynamic"] is None and config["padding"] in ("longest", "multiple")
        # Inductor options equal to the installed default are dropped from the config.
        for key, value in config["inductor"].items():
            assert space.caps.inductor_defaults[key] != value
    assert seen_multiple and seen_other


def test_validate_rejects_bad_values_with_the_choices():
    space = build_space(toy(), "cpu")
    with pytest.raises(UserError, match="invalid value \"fast\" for mode"):
        space.validate({"mode": "fast"})
    with pytest.raises(UserError, match="needs a CUDA device"):
        space.validate({"mode": "reduce-overhead"})
    with pytest.raises(UserError, match="unknown configuration key"):
        space.validate({"scopes": "full"})
    with pytest.raises(UserError, match="no Inductor option 'no_such_option'"):
        space.validate({"inductor": {"no_such_option": True}})
    with pytest.raises(UserError, match="takes a bool"):
        space.validate({"inductor": {"shape_padding": "yes"}})
    with pytest.raises(UserError, match="needs a workload with natural parts"):
        space.validate({"scope": "modular"})
    with pytest.raises(UserError, match="pad_multiple"):
        space.validate({"padding": "multiple"})
    assert space.validate({"scope": "regional"})["scope"] == "regional"


def test_fixing_a_dimension_pins_it():
    space = build_space(toy(), "cpu", fixed={"scope": "regional", "recompile_limit": 16})
    study = optuna.create_study()
    trial = study.ask()
    config = space.suggest(trial)
    assert config["scope"] == "regional" and "scope" not in trial.params
    assert config["recompile_limit"] == 16
    with pytest.raises(UserError, match="not offered here"):
        build_space(toy(), "cpu", fixed={"mode": "max-autotune"})
    with pytest.raises(UserError, match="unknown search dimension"):
        build_space(toy(), "cpu", fixed={"colour": "blue"})


def test_starting_points_fit_the_space():
    cpu = build_space(toy(), "cpu").starting_points()
    assert cpu[0]["scope"] == "regional"
    assert all(p.get("mode") != "reduce-overhead" for p in cpu)  # the CUDA-graph recipe is skipped on CPU
    cuda = build_space(toy(), "cuda").starting_points()
    assert any(p.get("mode") == "reduce-overhead" for p in cuda)


def test_an_option_missing_from_the_installed_torch_is_left_out():
    caps = Capabilities.detect("cuda")
    caps.inductor_defaults.pop("coordinate_descent_tuning")
    space = SearchSpace(caps, WorkloadTraits())
    assert "inductor.coordinate_descent_tuning" not in names(space)
    assert any("has no such Inductor option" in why for name, why in space.left_out
               if name == "inductor.coordinate_descent_tuning")
    json.dumps(space.describe())
