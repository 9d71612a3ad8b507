import dataclasses
import json
import re

import optuna
import pytest

from autocompile.errors import UserError
from autocompile.space import DEFAULTS, Capabilities, SearchSpace, WorkloadTraits
from autocompile.space.rules import doomed
from autocompile.engine.study import build_space
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
    for expected in [
        "scope",
        "mode",
        "mode.encoder",
        "mode.decoder",
        "dynamic",
        "fullgraph",
        "compile_optimizer",
        "fused_optimizer",
        "padding",
        "pad_multiple",
        "mark_dynamic",
        "inductor.shape_padding",
        "inductor.coordinate_descent_tuning",
        "inductor.triton.cudagraph_trees",
    ]:
        assert expected in dims
    assert dict((d.name, d.choices) for d in space.dimensions)["mode"] == (
        "default",
        "reduce-overhead",
        "max-autotune",
        "max-autotune-no-cudagraphs",
    )
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
    with pytest.raises(UserError, match='invalid value "fast" for mode'):
        space.validate({"mode": "fast"})
    assert "need a CUDA device" in space.rejection(space.validate({"mode": "reduce-overhead"}))  # valid, not possible here
    with pytest.raises(UserError, match="invalid value 1 for fullgraph"):
        space.validate({"fullgraph": 1})  # 1 == True to Python, not to a configuration
    with pytest.raises(UserError, match="unknown configuration key"):
        space.validate({"scopes": "full"})
    with pytest.raises(UserError, match="no Inductor option 'no_such_option'"):
        space.validate({"inductor": {"no_such_option": True}})
    with pytest.raises(UserError, match="takes a bool"):
        space.validate({"inductor": {"shape_padding": "yes"}})
    assert "declares none" in space.rejection(space.validate({"scope": "modular"}))
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


def test_pad_multiple_pins_to_any_positive_integer():
    """The search samples a few multiples; a pin may take another, and it is then no Optuna parameter."""
    space = build_space(toy(), "cpu", fixed={"padding": "multiple", "pad_multiple": 128})
    assert 128 not in space.dimension("pad_multiple").choices
    trial = optuna.create_study().ask()
    config = space.suggest(trial)
    assert config["pad_multiple"] == 128 and "pad_multiple" not in trial.params
    for bad in (0, -8, True, "wide"):
        with pytest.raises(UserError, match="not offered here"):
            build_space(toy(), "cpu", fixed={"padding": "multiple", "pad_multiple": bad})


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
    assert any(
        "has no such Inductor option" in why for name, why in space.left_out if name == "inductor.coordinate_descent_tuning"
    )
    json.dumps(space.describe())


# -- loss, LR schedule and CUDA-graph options --------------------------------------------------


def test_compile_loss_and_lr_tensor_are_offered_only_where_they_mean_something():
    plain = build_space(toy(), "cpu")  # forward + criterion, a constant LR
    assert "compile_loss" in names(plain) and "lr_tensor" not in names(plain)
    assert "no LR schedule" in dict(plain.left_out)["lr_tensor"]
    loss_only = build_space(toy("toy_loss_only"), "cpu")
    assert "compile_loss" not in names(loss_only) and "one function" in dict(loss_only.left_out)["compile_loss"]
    scheduled = build_space(toy("toy_scheduled"), "cpu")
    lr_tensor = scheduled.dimension("lr_tensor")
    assert lr_tensor.active({**DEFAULTS, "compile_optimizer": True}) and not lr_tensor.active(DEFAULTS)
    float_lr = scheduled.rejection({**DEFAULTS, "compile_optimizer": True, "lr_tensor": False})
    assert float_lr and "compiles again for each new value the LR schedule gives it" in float_lr
    assert scheduled.rejection({**DEFAULTS, "compile_optimizer": True, "lr_tensor": True}) is None
    assert plain.rejection({**DEFAULTS, "compile_optimizer": True}) is None  # no schedule: nothing changes
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen = set()
    for _ in range(30):
        trial = study.ask()
        config = scheduled.suggest(trial)
        study.tell(trial, 0.0)
        assert ("lr_tensor" in trial.params) == config["compile_optimizer"]
        seen.add((config["compile_optimizer"], config["lr_tensor"]))
    assert {(True, True), (True, False), (False, False)} <= seen and (False, True) not in seen
    # the recipe with the compiled step takes the tensor LR where there is a schedule
    assert any(p.get("compile_optimizer") and p.get("lr_tensor") for p in scheduled.starting_points())


def test_cuda_graph_options_apply_only_with_cuda_graph_modes():
    cuda = build_space(toy(), "cuda")
    extra = [
        "inductor.triton.cudagraph_skip_dynamic_graphs",
        "inductor.triton.cudagraph_unexpected_rerecord_limit",
        "inductor.graph_partition",
    ]
    for name in extra + ["inductor.triton.cudagraph_trees"]:
        dim = cuda.dimension(name)
        assert dim.choices[0] == cuda.caps.inductor_defaults[name[len("inductor.") :]]  # the installed default first
        assert dim.active({**DEFAULTS, "mode": "reduce-overhead"}) and not dim.active(DEFAULTS)
    assert cuda.dimension("inductor.triton.cudagraph_unexpected_rerecord_limit").choices == (128, 16)
    left_out = dict(build_space(toy(), "cpu").left_out)
    assert all("needs CUDA" in left_out[name] for name in extra)


# -- space files ----------------------------------------------------------------------------------


def space_file(tmp_path, text, name="narrow.toml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_space_file_excludes_values_from_what_suggest_samples(tmp_path):
    path = space_file(
        tmp_path,
        """
[exclude]
padding = ["max", "buckets"]
dynamic = ["none"]          # TOML has no null
mode = ["max-autotune-no-cudagraphs", "reduce-overhead"]   # the second is CUDA-only: ignored here
inductor.shape_padding = [false]
""",
    )
    space = build_space(toy(), "cpu", space_file=path)
    assert space.dimension("padding").choices == ("longest", "multiple")
    assert space.dimension("mode").choices == ("default",)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(40):
        trial = study.ask()
        config = space.suggest(trial)
        study.tell(trial, 0.0)
        assert config["padding"] in ("longest", "multiple") and config["dynamic"] is not None
        assert config["mode"] == "default" and "shape_padding" not in config["inductor"]
    left_out = {item["name"]: item["why"] for item in space.describe()["left_out"]}
    assert left_out['padding="max"'] == "excluded by narrow.toml"
    assert left_out["dynamic=null"] == "excluded by narrow.toml"
    assert space.rejection(DEFAULTS) is None  # the baseline (dynamic=None) is measured all the same
    assert space.rejection({**DEFAULTS, "dynamic": True, "padding": "max"}) == 'padding="max" is excluded by narrow.toml'


def test_a_space_file_pins_values_and_set_overrides_it(tmp_path):
    path = space_file(tmp_path, '{"fix": {"scope": "regional", "fullgraph": true}}', name="pins.json")
    space = build_space(toy(), "cpu", fixed={"fullgraph": False}, space_file=path)
    assert space.fixed == {"scope": "regional", "fullgraph": False}
    assert 'pinned to "regional" (pins.json)' in space.rejection({**DEFAULTS, "scope": "full", "dynamic": True})


def test_an_extra_inductor_option_is_sampled_and_reaches_the_snippet(tmp_path):
    from autocompile.apply import ModelInfo, load_snippet, render_snippet

    path = space_file(tmp_path, '[inductor]\nmax_fusion_size = [16]\n"triton.unique_kernel_names" = [true]\n')
    space = build_space(toy(), "cpu", space_file=path)
    assert space.dimension("inductor.max_fusion_size").choices == (64, 16)  # the installed default first
    sampled = set()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        trial = study.ask()
        sampled.add(space.suggest(trial)["inductor"].get("max_fusion_size", 64))
        study.tell(trial, 0.0)
    assert sampled == {64, 16}
    config = space.suggest(optuna.trial.FixedTrial(space.params_for({"inductor.max_fusion_size": 16})))
    assert config["inductor"] == {"max_fusion_size": 16}  # defaults dropped
    kwargs = load_snippet(render_snippet(config, ModelInfo()))["COMPILE_KWARGS"]
    assert kwargs["options"]["max_fusion_size"] == 16


@pytest.mark.parametrize(
    "text, error",
    [
        ("[fix\nscope = 1", "not a valid space file"),
        ("[colours]\nred = 1", "unknown section"),
        ('[exclude]\nflavour = ["x"]', "no such dimension"),
        ('[exclude]\nscope = ["everything"]', '"everything" is not one of its values'),
        ('[exclude]\nscope = ["full", "regional"]', "leaves the dimension with no value"),
        ("[exclude]\nscope = []", "lists no value"),
        ('[fix]\nscope = "modular"', '[fix] scope="modular" is not offered here'),
        ("[exclude]\nrecompile_limit = [8]", "nothing to exclude"),
        ('[fix]\npadding = "max"\n[exclude]\npadding = ["max"]', "excluded by"),
        ("[inductor]\nno_such_option = [true]", "has no such Inductor option"),
        ("[inductor]\nmax_fusion_size = [true]", "does not fit the installed option (a int"),
        ("[inductor]\ntriton = [true]", "not an option a configuration can set"),
    ],
)
def test_a_bad_space_file_is_one_clear_error(tmp_path, text, error):
    with pytest.raises(UserError, match=re.escape(error)):
        build_space(toy(), "cpu", space_file=space_file(tmp_path, text))


def test_a_missing_space_file_and_the_cli(tmp_path, capsys):
    from autocompile.cli import main

    with pytest.raises(UserError, match="space file not found"):
        build_space(toy(), "cpu", space_file=str(tmp_path / "nope.toml"))
    path = space_file(tmp_path, "[exclude]\ncompile_optimizer = [true]\n")
    assert main(["space", "--model", toy(), "--device", "cpu", "--space", path]) == 0
    out = capsys.readouterr().out
    assert "narrowed by" in out and re.search(r"compile_optimizer=true\s+excluded by narrow.toml", out)
    assert main(["space", "--model", toy(), "--device", "cpu", "--space", str(tmp_path / "nope.toml")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_study_resumed_with_other_values_says_so():
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(multivariate=True, n_startup_trials=1, seed=0))
    wide = build_space(toy(), "cpu")
    for _ in range(2):
        trial = study.ask()
        wide.suggest(trial)
        study.tell(trial, 1.0)
    narrow = build_space(toy(), "cpu")
    narrow.dimension("padding").choices = ("longest", "multiple")
    with pytest.raises(UserError, match="other values.*new --study"):
        narrow.suggest(study.ask())


# -- rejection ------------------------------------------------------------------------------------

CPU_TOY = dict(
    varying={"input_ids": (1, 0)},
    regions=["blocks"],
    fusable_optimizer=True,
    criterion=True,
    schedule=True,
    foreach_map_refusal=None,
)


@pytest.mark.parametrize(
    "device, traits, config, reason",
    [
        ("cpu", {}, {"mode": "reduce-overhead"}, "uses CUDA graphs, which need a CUDA device"),
        ("cpu", {}, {"inductor": {"triton.cudagraphs": True}}, "CUDA graphs need a CUDA device"),
        ("cpu", {}, {"scope": "modular"}, "declares none"),
        ("cpu", {"parts": ("a", "b")}, {"scope": "modular", "part_modes": {"a": "default", "c": "default"}}, "part(s) ['c']"),
        ("cpu", {"regions": []}, {"scope": "regional"}, "this model has none"),
        ("cpu", {"varying": {}}, {"mark_dynamic": "mark"}, "no varying dimension"),
        ("cpu", {}, {"mark_dynamic": "mark", "padding": "max"}, "nothing varies"),
        ("cpu", {}, {"mark_dynamic": "maybe", "dynamic": True}, "the marks change nothing"),
        ("cpu", {}, {"mark_dynamic": "mark", "dynamic": False}, "the marks win"),
        ("cpu", {}, {"compile_optimizer": True, "fused_optimizer": True}, "don't trace into fused optimizer"),
        ("cpu", {"fusable_optimizer": False}, {"fused_optimizer": True}, "no fused implementation"),
        ("cpu", {}, {"lr_tensor": True}, "the step is not compiled"),
        ("cpu", {"schedule": False}, {"compile_optimizer": True, "lr_tensor": True}, "no LR schedule"),
        ("cpu", {"criterion": False}, {"compile_loss": True}, "no criterion"),
        ("cpu", {}, {"inductor": {"coordinate_descent_tuning": True}}, "needs CUDA"),
        ("cuda", {}, {"inductor": {"triton.cudagraph_trees": False}}, "only matters with CUDA graphs"),
        ("cuda", {}, {"inductor": {"max_autotune_gemm_backends": "TRITON"}}, "only matters with max-autotune"),
        (
            "cpu",
            {},
            {"compile_optimizer": True, "lr_tensor": True, "static_grads": True},
            "its effect is on CUDA graphs, which need",
        ),
        ("cuda", {}, {"mode": "reduce-overhead", "static_grads": True}, "marks the gradients a compiled optimizer step reads"),
        ("cuda", {}, {"compile_optimizer": True, "lr_tensor": True, "static_grads": True}, "this configuration uses none"),
        ("cpu", {}, {"foreach_map_optimizer": True, "compile_optimizer": True, "lr_tensor": True}, "choose one"),
        ("cpu", {}, {"foreach_map_optimizer": True, "fused_optimizer": True}, "foreach_map_optimizer with fused_optimizer"),
        ("cpu", {"foreach_map_refusal": "the optimizer is SGD: x"}, {"foreach_map_optimizer": True}, "the optimizer is SGD"),
    ],
)
def test_each_impossible_or_meaningless_combination_is_named(device, traits, config, reason):
    space = SearchSpace(Capabilities.detect(device), WorkloadTraits(**{**CPU_TOY, **traits}))
    full = space.validate(config)
    assert reason in space.rejection(full)


def test_possible_combinations_pass_and_cuda_graph_options_with_cuda_graphs():
    cpu = SearchSpace(Capabilities.detect("cpu"), WorkloadTraits(**CPU_TOY))
    for config in (
        {},
        {"compile": False, "padding": "max"},
        {
            "scope": "regional",
            "compile_optimizer": True,
            "lr_tensor": True,
            "compile_loss": True,
            "mark_dynamic": "mark",
            "padding": "multiple",
            "pad_multiple": 8,
        },
        {"fused_optimizer": True, "dynamic": False, "padding": "buckets"},
    ):
        assert cpu.rejection(cpu.validate(config)) is None, config
    cuda = SearchSpace(Capabilities.detect("cuda"), WorkloadTraits(**CPU_TOY))
    assert cuda.rejection(cuda.validate({"mode": "reduce-overhead", "inductor": {"triton.cudagraph_trees": False}})) is None
    assert (
        cuda.rejection(
            cuda.validate({"mode": "max-autotune", "compile_optimizer": True, "lr_tensor": True, "static_grads": True})
        )
        is None
    )
    assert cpu.rejection(cpu.validate({"foreach_map_optimizer": True})) is None
    # a suggested configuration never needs rejecting for what the conditions already prevent
    # (a doomed one, possible but futile, is refused by rules.doomed with its own reason)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    for _ in range(60):
        trial = study.ask()
        config = cuda.suggest(trial)
        study.tell(trial, 0.0)
        assert cuda.rejection(config) in (None, doomed(config, cuda.traits, cuda.caps)), config


def test_trial_turns_an_impossible_config_away_in_one_line(capsys):
    from autocompile.cli import main

    code = main(["trial", "--model", toy(), "--device", "cpu", "--config", '{"mark_dynamic": "mark", "padding": "max"}'])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "cannot run here: mark_dynamic with padding 'max'" in err


def test_trial_runs_a_configuration_the_search_predicts_to_fail_with_a_note(capsys):
    """`trial` is how a user reproduces a failure: a configuration the search leaves out only as
    predicted to fail (rules.doomed) is let through with one note; one that cannot run is still refused."""
    from autocompile.cli import _refuse_or_note

    space = build_space(toy(), "cpu")
    predicted = {"dynamic": False, "padding": "longest"}  # a compile per length, past the recompile limit
    config = space.validate(predicted)
    assert space.rejection(config) == doomed({**DEFAULTS, **config}, space.traits, space.caps) is not None
    _refuse_or_note(space, config)
    err = capsys.readouterr().err
    assert err.startswith("note: a search would not launch this configuration (") and err.count("\n") == 1
    with pytest.raises(UserError, match="mark_dynamic with padding 'max'"):
        _refuse_or_note(space, space.validate({"mark_dynamic": "mark", "padding": "max"}))


def test_the_varlen_recipe_is_offered_where_varlen_attention_is():
    def varlen(points):
        return [p for p in points if p.get("pack_attention") == "varlen"]

    cuda = varlen(build_space("tiny-llama", "cuda").starting_points())
    assert len(cuda) == 1 and cuda[0]["padding"] == "pack" and cuda[0]["compile_optimizer"] and cuda[0]["lr_tensor"]
    assert varlen(build_space("tiny-llama", "cpu").starting_points()) == []  # Flash Attention's kernels: CUDA only
    assert varlen(build_space(toy(), "cuda").starting_points()) == []  # a model that cannot pack


def test_the_cpp_wrapper_is_predicted_to_fail_on_the_release_it_failed_on():
    """llama-8b (H200, torch 2.11, 2026-11-29): the C++ wrapper failed to compile both configurations tried; on
    that release the search does not launch it, on another it does (the rule is the release's, not the option's)."""
    space = build_space("tiny-llama", "cuda")
    config = space.validate({"scope": "regional", "inductor": {"cpp_wrapper": True}})
    for release, refused in (("2.11.0+cu130", True), ("2.13.0", False)):
        caps = dataclasses.replace(space.caps, torch_version=release)
        why = doomed({**DEFAULTS, **config}, space.traits, caps)
        assert (why is not None and "cpp_wrapper=true" in why) is refused, (release, why)
