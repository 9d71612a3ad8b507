"""The order in which a worker claims trials: plain torch.compile placed by what it is expected to cost."""

import os
from types import SimpleNamespace

import optuna
import pytest

from autocompile.api import run_search
from autocompile.engine.claims import MANY_BLOCKS, plain_compile_last, plain_compile_waits
from autocompile.engine.knowledge import PlainCompiles
from autocompile.engine.settings import SearchSettings
from autocompile.engine.strategy import WHOLE_SCOPES
from autocompile.engine.study import build_space, load_study
from autocompile.space import DEFAULTS, EAGER
from autocompile.trial import TrialRequest, run_trial
from conftest import FAST, GRAPH_CACHE, HISTORY, PLAIN_GRAPHS, toy

FIXED = {key: value for key, value in PLAIN_GRAPHS.items() if key != "scope"}  # the whole model against regional


def test_on_a_model_of_many_blocks_plain_torch_compile_runs_last_with_what_is_left(tmp_path):
    """Under --timeout, a model of MANY_BLOCKS repeated blocks or more is explored first: eager, then the
    recipes, and plain torch.compile last, with what is left before the finalist round."""
    settings = SearchSettings(
        model=toy("toy_many_blocks"),
        device="cpu",
        study="deep",
        directory=str(tmp_path),
        trials=2,  # eager and one recipe before plain torch.compile; a second would compile the optimizer step too
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
    # the recipes that compile the whole model are left out for the same reason: none is queued or run
    space = build_space(settings.model, "cpu", fixed=FIXED)
    assert any(space.suggest(optuna.trial.FixedTrial(p))["scope"] in WHOLE_SCOPES for p in space.starting_points())
    recipes = [t.user_attrs["config"] for t in study.trials if t.user_attrs.get("role") == "recipe"]
    assert recipes and not [c for c in recipes if c["scope"] in WHOLE_SCOPES], recipes


def test_plain_torch_compile_seen_cut_on_this_model_runs_last():
    """The knowledge store's `plain` learned captioner-fresh-12, whose plain torch.compile was cut while
    compiling after 303 s (H200, 2026-11-27): the next captioner study there under --timeout runs it last,
    saying so; without --timeout, or with no such knowledge on a model of few blocks, right after eager."""
    committed = load_study("captioner-fresh-12", f"sqlite:///{HISTORY}/captioner-fresh-12/study.db")
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


def test_plain_torch_compile_last_on_many_blocks_is_not_started_with_less_than_a_trial_left():
    """trainer-llama-8b-b5 (one H100, 2026-12-06): plain torch.compile, last for the model's 32 blocks, was
    started with 42 s left where each regional trial had taken 76 s, and gave nothing. Where it runs last
    for the model's blocks and was not seen here, it needs what a typical trial of the study took."""
    from autocompile.engine.gates import plain_not_started

    refusal = plain_not_started(42.0, None, blocks_trial_s=76.0)
    assert refusal is not None and "42 s left" in refusal.reason and "a trial of this study takes 76 s" in refusal.reason
    assert plain_not_started(80.0, None, blocks_trial_s=76.0) is None
    assert plain_not_started(42.0, None) is None  # few blocks: MIN_TRIAL_S is the bound
    assert plain_not_started(10.0, None) is not None
    seen = {"cut": True, "seconds": 300.0, "from": "study s trial 1"}
    assert "cut while compiling after 300 s" in plain_not_started(200.0, seen, blocks_trial_s=76.0).reason


def test_in_a_short_search_plain_torch_compile_waits_for_the_recipes_and_a_neighbour():
    """The CPU quickstart (--timeout 180, --baseline-timeout 90, one recipe; 2026-12-06): plain torch.compile
    warmed up for 49 s right after eager, and the recipe and a neighbour no longer fitted before the finalist
    round. Where plain torch.compile's limit would leave less than eager, the recipes, a neighbour and the
    round's rerun take at the least (MIN_TRIAL_S each), it waits for them; a longer search runs it right after eager."""
    from autocompile.engine.cost import MIN_TRIAL_S

    said = []

    def runner(timeout_s, baseline_s, recipes=1, finalists=1, trial_s=900.0):
        settings = SimpleNamespace(baseline_limit_s=baseline_s, trial_timeout_s=trial_s, finalists=finalists)
        space = SimpleNamespace(starting_points=lambda: [{}] * recipes)
        return SimpleNamespace(
            study=optuna.create_study(), settings=settings, space=space, remaining=lambda: timeout_s,
            progress=SimpleNamespace(line=said.append),
        )  # fmt: skip

    quickstart = runner(178.0, 90.0)
    why = plain_compile_waits(quickstart)
    assert why == (
        "run first, its 90 s limit would leave 88 s of the 178 s of --timeout, where eager, 1 recipe, a neighbour "
        f"and the finalist round's rerun take {4 * MIN_TRIAL_S:.0f} s at the least ({MIN_TRIAL_S:.0f} s each)"
    )
    assert said == [f"plain torch.compile runs after the recipes and a neighbour: {why}"]
    assert quickstart.study.user_attrs["plain_compile_waits"] == why  # decided once, for every worker
    assert plain_compile_waits(runner(1800.0, 600.0)) is None  # the GPU quickstart: right after eager
    assert plain_compile_waits(runner(None, 90.0)) is None  # no --timeout
    # test_shared_cache.py's search: its share of --timeout, 300 s, leaves 300 s
    assert plain_compile_waits(runner(600.0, 900.0, recipes=3, finalists=0, trial_s=60.0)) is None
    assert plain_compile_waits(runner(240.0, 120.0, recipes=3, finalists=0)) is not None  # 120 s left, 150 needed


def test_a_trial_cut_while_compiling_says_how_far_the_compile_got(tmp_path, monkeypatch):
    """The compiles a trial had finished when its limit cut it while compiling: from the worker's events."""
    from autocompile.trial.process import _how_far

    assert (
        _how_far([{"phase": "compiling"}, {"phase": "compiling", "compiled": 1}, {"phase": "compiling", "compiled": 2}])
        == ", 2 compiles finished by then"
    )
    assert _how_far([{"phase": "compiling"}]) == ", no compile finished by then"
    monkeypatch.delenv(GRAPH_CACHE, raising=False)  # compiled cold, so that the 6 s limit cuts it while compiling
    record = run_trial(
        TrialRequest(model=toy(), config={**EAGER, "compile": True}, device="cpu", trial_dir=str(tmp_path), timeout_s=6)
    )
    assert record["status"] == "timeout"
    assert ("finished by then" in record["reason"]) == (record["failed_phase"] == "compiling"), record["reason"]


def _full(config: dict) -> dict:
    """A configuration as the engine compares it (gates.already_tried): DEFAULTS filled in, for one stored
    before a setting was added."""
    return {**DEFAULTS, **config}


def _lora_3gpu_before(number: int):
    """lora-8b-3gpu-1 (four H200s, 2026-11-27), its journal's trials before `number`, in a study of their own;
    the lora-8b space as that search built it."""
    from autocompile.engine.storage import JOURNAL

    folder = f"{HISTORY}/lora-8b-3gpu-1"
    committed = load_study("lora-8b-3gpu-1", JOURNAL + folder + "/journal.log")
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number < number])
    return committed, study, folder, build_space("lora-8b", "cuda", memory_bound="--max-memory-gb eager")


def test_a_gpu_whose_next_neighbour_does_not_fit_before_the_round_takes_one_that_does():
    """lora-8b-3gpu-1: GPU 1 stopped 139 s before the finalist round. Its next neighbour (trial 47: the
    incumbent, trial 44, with a compiled AdamW step) was expected to take 167 s by its twins, and 137 s were
    left. A move of the activation budget of the same parent, expected to take 97 s, would have fit."""
    from autocompile.engine.cost import Predictor, neighbour_s
    from autocompile.engine.strategy import neighbour_cost
    from autocompile.engine.strategy import next_neighbour

    committed, study, folder, space = _lora_3gpu_before(47)
    predictor = Predictor(study, folder)
    # configurations as the engine compares them: DEFAULTS filled in (a study stored before a setting was added)
    measured = [_full(t.user_attrs["config"]) for t in study.trials if "config" in t.user_attrs]
    # the incumbent's first moves taken: the loss not compiled apart and CUDA graphs, as on that GPU, and
    # each block's step in the backward, which the search has tried since
    for _ in range(3):
        measured.append(next_neighbour(space, study, lambda config, params: config in measured, predictor.predict)["config"])
    tried = lambda config, params: _full(config) in measured  # noqa: E731
    first = next_neighbour(space, study, tried, predictor.predict)
    assert first["config"] == _full(committed.trials[47].user_attrs["config"]) and first["parent"] == 44
    assert neighbour_s(study, predictor, first) == neighbour_cost(space, study, predictor, tried) > 137
    fits = lambda neighbour: (neighbour_s(study, predictor, neighbour) or 1e9) <= 137  # noqa: E731
    fitting = next_neighbour(space, study, tried, predictor.predict, fits)
    assert fitting["parent"] == 44 and fitting["changed"] == ["activation_memory_budget"]
    assert neighbour_cost(space, study, predictor, tried, fits) == neighbour_s(study, predictor, fitting) < 100
    assert neighbour_cost(space, study, predictor, tried, lambda neighbour: False) is None


def test_a_neighbour_that_moves_to_flexattention_is_no_twin_of_one_on_the_model_s_attention():
    """lora-8b-1gpu-2 (four H200s, 2026-11-27): with 66 s left before the round, trial 21 (trial 20, CUDA graphs
    and FlexAttention, in the default mode) was expected to take 61 s, the wall time of trials 4, 10 and 12, which
    compiled the model's own attention; cut while compiling at 61 s. FlexAttention's kernels and block mask are
    graphs of their own: a trial on the model's attention is no twin of it, and what it costs is unknown."""
    from autocompile.engine.cost import Predictor, neighbour_s, twin_time

    folder = f"{HISTORY}/lora-8b-1gpu-2"
    committed = load_study("lora-8b-1gpu-2", f"sqlite:///{folder}/study.db")
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number < 21])
    flex = committed.trials[21].user_attrs["config"]
    assert flex["pack_attention"] == "flex" and committed.trials[21].user_attrs["status"] == "timeout"
    assert twin_time(study, flex, exact=True) == (None, [])
    assert twin_time(study, {**flex, "pack_attention": "model"}, exact=True)[1] == [4, 10, 12]
    assert neighbour_s(study, Predictor(study, folder), {"config": flex, "parent": 20}) is None


def test_a_worker_refused_a_trial_for_its_time_takes_a_neighbour_that_fits_once(tmp_path, capsys):
    """After a refusal for time, `_fit_instead` sends the worker to a neighbour expected within what is left
    (the next proposal, `_queue_proposals`); where none is, or the refused one had been chosen to fit, the
    worker is done and the round comes."""
    import time

    from autocompile.engine.claims import LoopState, _fit_instead, _queue_proposals
    from autocompile.engine.runner import Progress, Runner

    _, study, _, space = _lora_3gpu_before(47)
    settings = SearchSettings(model="tiny-llama", device="cpu", study="p", directory=str(tmp_path), trial_timeout_s=240)
    reserve = 170.0

    def runner_with(left_s: float) -> Runner:
        deadline = time.time() + reserve + left_s
        return Runner(study, study._storage, "memory", settings, Progress(2), deadline=deadline, space=space)

    loop = LoopState(recipes_queued=True)
    assert not _fit_instead(runner_with(40), reserve, loop)  # the cheapest neighbour takes 59 s by its twins
    assert _fit_instead(runner_with(100), reserve, loop) and 90 < loop.neighbour_within <= 100
    assert "100 s left before the finalist round: a neighbour of about 97 s goes next" in capsys.readouterr().err
    _queue_proposals(runner_with(100), loop, [])
    queued = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert loop.fitted and loop.neighbour_within is None and len(queued) == 1
    assert queued[0].user_attrs["role"] == "neighbour" and queued[0].user_attrs["parent"] == 44
    assert queued[0].user_attrs["changed"] == ["step_in_backward"]  # the first fitting move in the order
    assert not _fit_instead(runner_with(100), reserve, loop)  # that one refused too: done


def test_an_error_in_planning_is_contained_kept_in_the_study_and_said_at_the_end(monkeypatch, capsys):
    """lora-8b-2gpu-1 (H200, 2026-11-28) lost both its workers within five minutes to a KeyError in choosing the
    next neighbour: the parent of the move it chose, recipe 2, had been refused before launch and had no speed.
    That line, on lora-8b-2gpu-2's recipe 2 (refused the same way), is contained now: the search goes on without
    the answer (a gate that raises refuses nothing), the error goes to the log with its traceback and into the
    study, and the search's last lines count it. In the suite (AUTOCOMPILE_STRICT) it is raised."""
    from autocompile.engine.contained import ATTR, STRICT, contained, summary
    from autocompile.engine.gates import Gate, Outcome, View

    journal = optuna.storages.journal.JournalFileBackend(f"{HISTORY}/lora-8b-2gpu-2/journal.log")
    committed = optuna.load_study(study_name="lora-8b-2gpu-2", storage=optuna.storages.JournalStorage(journal))
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), direction="maximize")
    study.add_trials(committed.trials[:5])
    refused = study.trials[2]
    assert refused.user_attrs["reason"].startswith("rejected before launch: over the memory limit before it runs")
    old_line = lambda: refused.user_attrs["steps_per_s"]  # noqa: E731  (strategy.next_neighbour before 32fc73b)
    with pytest.raises(KeyError):
        contained("choosing the next neighbour", study, None, old_line)
    monkeypatch.delenv(STRICT)
    assert contained("choosing the next neighbour", study, None, old_line) is None
    broken = Gate("broken", Outcome.INFEASIBLE, lambda config, view: view.study.trials[2].user_attrs["steps_per_s"])
    assert broken.why_not(refused.user_attrs["config"], View(study)) is None
    err = capsys.readouterr().err
    assert "autocompile: an internal error in choosing the next neighbour: KeyError: 'steps_per_s'; the search goes on" in err
    assert err.count("Traceback (most recent call last)") == 2
    assert study.user_attrs[ATTR] == {
        "choosing the next neighbour: KeyError: 'steps_per_s'": 1,
        "the gate 'broken': KeyError: 'steps_per_s'": 1,
    }
    assert summary(study).startswith("planning: 2 internal errors contained, the search went on without their answers")
    assert summary(committed) is None
    assert contained("choosing the next neighbour", None, "fallback", old_line) == "fallback"  # nowhere to keep it
    assert "the error is not kept in the study: AttributeError" in capsys.readouterr().err


def test_a_neighbour_that_would_not_be_started_is_not_proposed(tmp_path):
    """llama-8b-fresh-14 (one H200, 2026-11-29): with 76 s left before the finalist round, the neighbour moving
    trial 15 to FlexAttention (its twin, trial 11, took 111 s) was proposed, refused as not fitting, and proposed
    again on each turn after (trials 17, 19 and 21). A turn now passes over a neighbour the time gate would refuse
    (`claims._startable`, the question `Runner.out_of_time` asks)."""
    from autocompile.engine.claims import _startable
    from autocompile.engine.runner import Progress, Runner
    from autocompile.engine.strategy import next_neighbour

    folder = f"{HISTORY}/llama-8b-fresh-14"
    committed = load_study("llama-8b-fresh-14", f"sqlite:///{folder}/study.db")
    flex = committed.trials[17].user_attrs
    assert flex["status"] == "not started" and flex["config"]["pack_attention"] == "flex" and flex["parent"] == 15
    space = build_space("llama-8b", "cuda")
    settings = SearchSettings(model="tiny-llama", device="cpu", study="p", directory=str(tmp_path), trial_timeout_s=240)
    study = optuna.create_study(direction="maximize")
    study.add_trials([t for t in committed.trials if t.number < 17])
    # the moves left untried: that one and trial 18's (CUDA graphs); among moves as promising, the cheaper first,
    # flex's here, as on that GPU (its store's estimates then)
    untried = [_full(flex["config"]), _full(committed.trials[18].user_attrs["config"])]
    tried = lambda config, params: _full(config) not in untried  # noqa: E731
    cost = lambda config: 1.0 if config["pack_attention"] == "flex" else None  # noqa: E731

    runner = Runner(study, study._storage, "memory", settings, Progress(2), deadline=None)

    def proposed(left_s: float) -> dict:
        fits = _startable(runner.view(before_round_s=left_s))
        assert fits({"config": flex["config"]}) is (left_s > 111)
        return next_neighbour(space, study, tried, cost, fits=fits)

    assert next_neighbour(space, study, tried, cost)["config"] == untried[0]
    assert proposed(1000)["config"] == untried[0]  # time enough: the move it was
    assert proposed(76)["config"] == untried[1]  # 76 s: the other move
