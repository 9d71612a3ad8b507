"""The order in which a worker claims trials: plain torch.compile placed by what it is expected to cost."""

import os
from types import SimpleNamespace

import optuna

from autocompile.api import run_search
from autocompile.engine.claims import MANY_BLOCKS, plain_compile_last
from autocompile.engine.knowledge import PlainCompiles
from autocompile.engine.settings import SearchSettings
from autocompile.engine.study import build_space, load_study
from autocompile.space import EAGER
from autocompile.trial import TrialRequest, run_trial
from conftest import FAST, PLAIN_GRAPHS, ROOT, toy

FIXED = {key: value for key, value in PLAIN_GRAPHS.items() if key != "scope"}  # the whole model against regional


def test_on_a_model_of_many_blocks_plain_torch_compile_runs_last_with_what_is_left(tmp_path):
    """Under --timeout, a model of MANY_BLOCKS repeated blocks or more is explored first: eager, then the
    recipes, and plain torch.compile last, with what is left before the finalist round."""
    settings = SearchSettings(
        model=toy("toy_many_blocks"),
        device="cpu",
        study="deep",
        directory=str(tmp_path),
        trials=3,
        timeout_s=600,
        trial_timeout_s=240,
        measure=FAST,
        horizon=100_000,
        finalists=0,
        prune=False,
        fixed=FIXED,
    )
    assert build_space(settings.model, "cpu").traits.blocks == 8 >= MANY_BLOCKS
    run_search(settings)
    study = load_study("deep", "sqlite:///" + os.path.join(settings.study_dir, "study.db"))
    roles = [t.user_attrs.get("role") for t in study.trials if "status" in t.user_attrs]
    assert roles[0] == "eager" and roles[-1] == "compile-defaults" and "recipe" in roles[1:-1], roles
    assert study.user_attrs["plain_compile_last"] == "its whole-model compile grows with the model's 8 repeated blocks"
    assert study.trials[-1].user_attrs["status"] == "ok"  # it had the time it needed


def test_plain_torch_compile_seen_cut_on_this_model_runs_last():
    """The knowledge store's `plain` learned captioner-fresh-12, whose plain torch.compile was cut while
    compiling after 303 s (H200, 2026-11-27): the next captioner study there under --timeout runs it last,
    saying so; without --timeout, or with no such knowledge on a model of few blocks, right after eager."""
    committed = load_study("captioner-fresh-12", f"sqlite:///{ROOT}/studies/history/captioner-fresh-12/study.db")
    plain = PlainCompiles(None, "2.11.0+cu130", "NVIDIA H200", "captioner")
    assert sum(plain.take(committed, t) for t in committed.trials) == 1
    assert plain.expected()["cut"] and plain.expected()["seconds"] > 300

    def runner(timeout_s, store, blocks=2):
        study = optuna.create_study()
        settings = SimpleNamespace(timeout_s=timeout_s, baseline_limit_s=300.0)
        space = SimpleNamespace(traits=SimpleNamespace(blocks=blocks))
        return SimpleNamespace(
            study=study, settings=settings, plain=store, space=space, progress=SimpleNamespace(line=lambda text: None)
        )

    why = plain_compile_last(runner(1500, plain))
    assert why.startswith("its whole-model compile was cut while compiling after 30") and "captioner-fresh-12 trial 1" in why
    assert plain_compile_last(runner(None, plain)) is None
    assert plain_compile_last(runner(1500, PlainCompiles(None, "2.11.0+cu130", "NVIDIA H200", "captioner"))) is None


def test_a_trial_cut_while_compiling_says_how_far_the_compile_got(tmp_path):
    """The compiles a trial had finished when its limit cut it while compiling: from the worker's events."""
    from autocompile.trial.process import _how_far

    assert (
        _how_far([{"phase": "compiling"}, {"phase": "compiling", "compiled": 1}, {"phase": "compiling", "compiled": 2}])
        == ", 2 compiles finished by then"
    )
    assert _how_far([{"phase": "compiling"}]) == ", no compile finished by then"
    record = run_trial(
        TrialRequest(model=toy(), config={**EAGER, "compile": True}, device="cpu", trial_dir=str(tmp_path), timeout_s=6)
    )
    assert record["status"] == "timeout"
    assert ("finished by then" in record["reason"]) == (record["failed_phase"] == "compiling"), record["reason"]
