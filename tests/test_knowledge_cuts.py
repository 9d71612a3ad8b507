"""Compile-heavy values cut while compiling, remembered across studies (engine/knowledge/cuts.py), on
the records of the committed GPU studies: the captioner's compiled autograd ran out of its 240 s
limit in captioner-fresh-5 and captioner-fresh-6 (TPE's trial 11 in each, H200, 2026-11-26)."""

from autocompile.cli import main
from autocompile.engine.knowledge import implicated
from autocompile.engine.strategy import compile_cut_values
from autocompile.engine.study import SearchSettings, compile_cuts as CompileMemory, load_study, open_search
from conftest import HISTORY, ROOT, toy

H200 = ("2.11.0+cu130", "NVIDIA H200")


def _learned(tmp_path, capsys) -> str:
    path = str(tmp_path / "failures.db")
    for name in ("captioner-fresh-5", "captioner-fresh-6"):
        assert main(["failures", "--failure-memory", path, "--learn", name, "--dir", HISTORY]) == 0
    assert (
        "learned from study 'captioner-fresh-6': 4 trials with compile-heavy, whole-model or implicated values remembered"
        in capsys.readouterr().out
    )
    return path


def test_a_compile_heavy_value_cut_twice_at_the_limit_is_refused_in_the_next_study_of_that_model(tmp_path, capsys):
    path = _learned(tmp_path, capsys)
    autograd = load_study("captioner-fresh-6", f"sqlite:///{HISTORY}/captioner-fresh-6/study.db").trials[11]
    config = autograd.user_attrs["config"]
    assert config["compiled_autograd"] and autograd.user_attrs["status"] == "timeout"
    memory = CompileMemory(path, *H200, "captioner")
    why = memory.reason(config, 240)
    assert why == (
        "expected not to fit the 240 s trial limit: compiled_autograd=true ran out of its limit while "
        "compiling 2 times here on captioner (study captioner-fresh-5 trial 11, study captioner-fresh-6 "
        "trial 11), and never warmed up within 240 s"
    ), why
    assert memory.reason(config, 500) is None  # cut at 241 s: nothing said of a longer limit
    assert memory.reason({**config, "compiled_autograd": False}, 240) is None
    assert CompileMemory(path, *H200, "llama-8b").reason(config, 240) is None  # another model
    assert CompileMemory(path, "2.12.0", H200[1], "captioner").reason(config, 240) is None  # another torch
    # max-autotune was cut once in these two studies (captioner-fresh-6's trial 12): not yet left out
    assert memory.reason({**config, "compiled_autograd": False, "mode": "max-autotune"}, 240) is None
    # a run that warmed up within the limit clears it
    memory.remember({"status": "ok", "warmup_s": 200.0}, config, "another", 3)
    assert memory.reason(config, 240) is None and memory.reason(config, 190) is not None


def test_a_value_a_neighbour_was_cut_compiling_twice_is_refused_in_the_next_study(tmp_path, capsys):
    """Outside COMPILE_HEAVY: the captioner's neighbour turning on triton.cudagraph_skip_dynamic_graphs
    (its parent, trial 10, warmed up in 20-30 s) was cut at 241 s while compiling in captioner-fresh-7
    (trial 22) and captioner-fresh-8 (trial 24), H200, 2026-11-26."""
    path = str(tmp_path / "failures.db")
    memory = CompileMemory(path, *H200, "captioner")
    study = load_study("captioner-fresh-8", f"sqlite:///{HISTORY}/captioner-fresh-8/study.db")
    skip, parent = study.trials[24].user_attrs, study.trials[10].user_attrs
    assert skip["changed"] == ["inductor.triton.cudagraph_skip_dynamic_graphs"] and skip["parent"] == 10
    assert implicated(skip, parent) == ["inductor.triton.cudagraph_skip_dynamic_graphs=true"]
    assert implicated(skip, {**parent, "warmup_s": 200.0}) == []  # the parent took long too: the move is not the cause
    assert main(["failures", "--failure-memory", path, "--learn", "captioner-fresh-7", "--dir", HISTORY]) == 0
    assert memory.reason(skip["config"], 240) is None  # once: not yet
    assert main(["failures", "--failure-memory", path, "--learn", "captioner-fresh-8", "--dir", HISTORY]) == 0
    why = memory.reason(skip["config"], 240)
    assert why == (
        "expected not to fit the 240 s trial limit: inductor.triton.cudagraph_skip_dynamic_graphs=true ran "
        "out of its limit while compiling 2 times here on captioner (study captioner-fresh-7 trial 22, study "
        "captioner-fresh-8 trial 24), and never warmed up within 240 s"
    ), why
    assert memory.reason(parent["config"], 240) is None
    # from now on a trial that warms up with it is stored too, and clears it
    later = _Study("later", [{"config": skip["config"], "status": "ok", "warmup_s": 60.0}])
    assert memory.take(later, later.trials[0])
    assert memory.reason(skip["config"], 240) is None


class _Trial:
    def __init__(self, number, attrs):
        self.number, self.user_attrs = number, attrs


class _Study:
    """A study of finished first runs, as the memory reads one."""

    def __init__(self, name, attrs):
        self.study_name, self.trials = name, [_Trial(i, a) for i, a in enumerate(attrs)]

    def get_trials(self, deepcopy=False):
        return self.trials


def test_failures_lists_the_cuts_and_forgets_them(tmp_path, capsys):
    path = _learned(tmp_path, capsys)
    assert main(["failures", "--failure-memory", path]) == 0
    assert (
        "compiled_autograd=true  [torch 2.11.0+cu130, NVIDIA H200, captioner]  cut 2 times, after 241, 241 s"
        in capsys.readouterr().out
    )
    assert main(["failures", "--failure-memory", path, "--forget", "compiled_autograd=true"]) == 0
    assert "forgot 2 remembered outcomes" in capsys.readouterr().out
    config = {"compile": True, "scope": "regional", "mode": "reduce-overhead", "compiled_autograd": True}
    assert CompileMemory(path, *H200, "captioner").reason(config, 240) is None
    assert main(["failures", "--failure-memory", path, "--forget", "compiled_autograd=true"]) == 2
    assert "no remembered failure with compiled_autograd=true" in capsys.readouterr().err
    assert main(["failures", "--failure-memory", path, "--learn", "no-such-study", "--dir", HISTORY]) == 2
    assert "no study 'no-such-study'" in capsys.readouterr().err


def test_a_search_refuses_before_launch_what_the_memory_says_will_not_fit(tmp_path):
    """The search's own refusal (Runner.refusal) asks the memory, keyed by the search's model, torch and device."""
    import torch

    model, path = toy("toy"), str(tmp_path / "failures.db")
    settings = SearchSettings(
        model=model, device="cpu", study="s", directory=str(tmp_path), trials=1, trial_timeout_s=60, memory_path=path
    )
    memory = CompileMemory(path, torch.__version__, "cpu", model)
    config = {"compile": True, "scope": "regional", "mode": "default", "compiled_autograd": True}
    for study in ("a", "b"):
        memory.remember(
            {"status": "timeout", "reason": "no result within the 60 s limit (while compiling)", "wall_s": 60.4}, config, study, 2
        )
    runner = open_search(settings)
    assert "compiled_autograd=true ran out of its limit while compiling 2 times here on" in runner.refusal(config)
    assert runner.refusal({**config, "compiled_autograd": False}) is None


def test_the_whole_model_cut_at_the_limit_in_each_study_is_refused_before_launch_and_a_heavy_mode_named_first():
    """lora-8b's whole-model recipes ran out of their 240 s while compiling in each of its searches (H200, torch
    2.11, 2026-11-27: 480 s of lora-8b-fresh-2's 1335 s); the committed store (studies/gpu-knowledge.db, learned
    from every committed study) refuses a whole-model configuration there at that limit, names a heavy mode's
    cuts before the whole model's where both hold, and refuses nothing regional nor at a limit the whole model
    warmed up within (llama-8b: 363 s)."""
    store = f"{ROOT}/studies/gpu-knowledge.db"
    lora, llama = CompileMemory(store, *H200, "lora-8b"), CompileMemory(store, *H200, "llama-8b")
    full = {"compile": True, "scope": "full", "mode": "default", "dynamic": None}
    assert 'scope="full" ran out of its limit while compiling' in lora.reason(full, 240)
    assert lora.reason({**full, "scope": "regional"}, 240) is None
    autotune = lora.reason({**full, "mode": "max-autotune-no-cudagraphs"}, 240)
    assert 'mode="max-autotune-no-cudagraphs" ran out' in autotune, autotune
    assert 'scope="full" ran out' in llama.reason(full, 240) and llama.reason(full, 400) is None


def test_a_modular_configuration_counts_as_the_whole_model_where_the_whole_model_never_fitted():
    """captioner-fresh-14 (H200, torch 2.11, 2026-11-28): its neighbour 21 compiled the encoder and the decoder
    each whole (modular, default modes) and was cut at its 240 s limit while compiling: 243 s, where the search's
    other neighbours took 33-80 s. Plain torch.compile of the captioner had run out of its limit in each of 13
    earlier runs. The committed store refuses it now as the whole model it amounts to, a part's heavy mode named
    as the mode; the search's regional winner is not refused."""
    store = f"{ROOT}/studies/gpu-knowledge.db"
    memory = CompileMemory(store, *H200, "captioner")
    study = load_study("captioner-fresh-14", f"sqlite:///{HISTORY}/captioner-fresh-14/study.db")
    modular, winner = study.trials[21].user_attrs, study.trials[15].user_attrs
    assert modular["config"]["scope"] == "modular" and modular["status"] == "timeout" and modular["wall_s"] > 240
    why = memory.reason(modular["config"], 240)
    assert why.startswith('expected not to fit the 240 s trial limit: scope="full", which it amounts to, ran out'), why
    assert memory.reason(winner["config"], 240) is None
    autotune = {**modular["config"], "part_modes": {"encoder": "default", "decoder": "max-autotune"}}
    assert dict(compile_cut_values(autotune)) == {"mode": "max-autotune", "scope": "full"}
