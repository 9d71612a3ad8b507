"""The pruning bound of a neighbour's warm-up with a ceiling on its steady speed: its parent's measured speed
times the most a neighbour of the same move has gained over its parent on the device. It cuts a slow warm-up earlier
than the bound that assumes any speed, and, replayed on every committed study with the gains of the others,
it would have cut no trial that won or came within noise of winning."""

from types import SimpleNamespace
import os

import optuna
import pytest

from autocompile.engine.knowledge import MoveGains, Paces, batch_layout, study_key, workload
from autocompile.engine.knowledge.paces import MARGIN, _pace
from autocompile.engine.scoring import PRUNE_SLACK, _at_most, optimistic_score
from autocompile.engine.storage import load_study
from conftest import HISTORY, replayed_studies


def test_a_ceiling_cuts_a_slow_warm_up_earlier():
    """A neighbour still compiling after 60 s at horizon 10000, its parent at 5 steps/s, the best score 4.9:
    assuming any speed, it could still reach 167; at most 1.1x its parent's speed, 5.3 at most, then below
    the best once its warm-up passes 10% of a run's time at that speed."""
    warming = [{"phase": "compiling", "t": 0.0}, {"phase": "compiling", "t": 30.0, "step": 8}]
    anything = optimistic_score(warming, 10000, now=60.0)
    capped = optimistic_score(warming, 10000, ceiling=5.0 * 1.1, now=60.0)
    assert anything == pytest.approx(10000 / 60) and capped == pytest.approx(10000 / (60 + 9992 / (5.5 * (1 + PRUNE_SLACK))))
    assert capped < anything
    cut = next(t for t in range(1, 3000) if optimistic_score(warming, 10000, ceiling=5.5, now=t) < 4.9)
    assert cut < next(t for t in range(1, 3000) if optimistic_score(warming, 10000, now=t) < 4.9)


def _studies():
    for path in replayed_studies():
        name = os.path.basename(os.path.dirname(path))
        study = load_study(name, f"sqlite:///{path}", folder=True)
        yield study.study_name, study


def _contenders(study) -> list:
    """The trials that won the study's finalist round or came within its noise of winning."""
    verdict = study.user_attrs.get("finalists") or {}
    rows = [r for r in verdict.get("candidates", []) if r.get("status") == "ok"]
    if not rows or verdict.get("winner") is None:
        return []
    best = max(r["score"] for r in rows)
    noise = verdict.get("noise") or 0.0
    chosen = {r["trial"] for r in rows if r["score"] >= best / (1 + noise)} | {verdict["winner"]}
    return [study.trials[n] for n in chosen if n < len(study.trials)]


def test_replayed_on_every_committed_study_the_ceiling_cuts_no_winner():
    studies = list(_studies())
    keyed = {}
    for name, study in studies:
        try:
            keyed[name] = study_key(study)
        except Exception:  # a study with no measured trial
            continue
    checked = 0
    for name, study in studies:
        if name not in keyed:
            continue
        gains = MoveGains(None, *keyed[name])
        for other, other_study in studies:  # what the device's other studies taught
            if other != name and other in keyed and keyed[other] == keyed[name]:
                for t in other_study.trials:
                    gains.take(other_study, t)
        horizon = study.user_attrs.get("horizon", 1000)
        for t in _contenders(study):
            a = t.user_attrs
            if "parent" not in a or not a.get("warmup_s") or not study.trials[a["parent"]].user_attrs.get("steps_per_s"):
                continue
            known = gains.ceiling(a.get("changed") or [], batch_layout(study.trials[a["parent"]].user_attrs.get("config")))
            if not known:
                continue  # a move the other studies never made: no ceiling
            started = t.datetime_start
            before = [
                u.value
                for u in study.trials
                if u.value
                and u.user_attrs.get("status") == "ok"
                and u.datetime_complete
                and started
                and u.datetime_complete < started
            ]
            if not before:
                continue
            ceiling = study.trials[a["parent"]].user_attrs["steps_per_s"] * known["ratio"]
            lowest = _at_most(horizon, a["warmup_s"], a.get("warmup_steps", 0), ceiling)  # at the warm-up's end
            assert lowest >= max(before), (name, t.number, lowest, max(before), known)
            checked += 1
    assert checked >= 10  # (26 winners or near: moves seen from parents of their layout)


def _paces_of_the_others(studies, keyed, name):
    """The paces the device's other studies of the same workload, torch and device measured."""
    paces = Paces(None, *keyed[name])
    for other, other_study in studies:
        if other != name and keyed.get(other) == keyed[name]:
            for t in other_study.trials:
                paces.take(other_study, t)
    return paces


def _keyed(studies) -> dict:
    keyed = {}
    for name, study in studies:
        try:
            torch_version, device, _ = study_key(study)
        except Exception:  # a study with no measured trial
            continue
        keyed[name] = (torch_version, device, workload(study.user_attrs["settings"]))
    return keyed


def _best_before(study, t) -> float:
    started = t.datetime_start
    scores = [
        u.value
        for u in study.trials
        if u.value and u.user_attrs.get("status") == "ok" and u.datetime_complete and started and u.datetime_complete < started
    ]
    return max(scores, default=0.0)


def test_replayed_on_every_committed_study_a_configuration_s_own_pace_cuts_no_winner():
    """The ceiling of a configuration's own pace (the fastest it ran on the workload in the device's other studies,
    plus MARGIN), replayed on every committed study: at the end of the warm-up of each trial that won or came within
    noise of winning, its bound is still above the best score before it started."""
    studies = list(_studies())
    keyed = _keyed(studies)
    checked = 0
    for name, study in studies:
        if name not in keyed:
            continue
        paces = _paces_of_the_others(studies, keyed, name)
        horizon = study.user_attrs.get("horizon", 1000)
        for t in _contenders(study):
            a = t.user_attrs
            known = paces.ceiling(a.get("config") or {}, name) if a.get("warmup_s") else None
            best = _best_before(study, t)
            if not known or not best:
                continue
            ceiling = known["steps_per_s"] * (1 + MARGIN)
            lowest = _at_most(horizon, a["warmup_s"], a.get("warmup_steps", 0), ceiling)
            assert lowest >= best, (name, t.number, lowest, best, known)
            checked += 1
    assert checked >= 10


def test_a_recipe_that_lost_in_every_earlier_study_is_cut_at_the_start_of_its_warm_up():
    """lora-8b-1gpu-3 (H200, 2026-11-27) spent 46 s and 129 s on two recipes padded to 64 with the model's
    checkpointing as built, pruned after their measuring windows as in the earlier lora-8b studies. With the paces
    those studies measured, each is below the best score (trial 4's packing recipe) 20 s into its warm-up."""
    studies = list(_studies())
    keyed = _keyed(studies)
    name = "lora-8b-1gpu-3"
    study = dict(studies)[name]
    paces = _paces_of_the_others(studies, keyed, name)
    horizon = study.user_attrs["horizon"]
    warming = [{"phase": "compiling", "t": 0.0}]
    for number, took in ((5, 46), (6, 129)):
        t = study.trials[number]
        known = paces.ceiling(t.user_attrs["config"], name)
        assert known and known["of"] >= 2, known
        bound = optimistic_score(warming, horizon, ceiling=known["steps_per_s"] * (1 + MARGIN), now=20.0)
        assert bound < _best_before(study, t) == pytest.approx(study.trials[4].value)
        assert optimistic_score(warming, horizon, now=20.0) > 100  # without it: any speed, no cut
        assert t.user_attrs["status"] == "pruned" and t.user_attrs["wall_s"] > took - 1


def test_a_pace_is_kept_from_a_steady_speed_or_the_windows_a_trial_was_pruned_after():
    """A trial measured to a steady speed keeps it; one pruned after its windows keeps its fastest window; one
    pruned before two windows, one whose events were kept shortened to a text, or eager, keeps none."""
    from types import SimpleNamespace

    study = SimpleNamespace(study_name="s")
    config = {"compile": True, "scope": "regional"}
    windows = [{"phase": "measuring", "window": 1, "steps_per_s": 1.4}, {"phase": "measuring", "window": 2, "steps_per_s": 1.1}]
    trials = [
        {"status": "ok", "steps_per_s": 2.0, "config": config},
        {"status": "pruned", "events": windows, "config": config},
        {"status": "pruned", "events": windows[:1], "config": config},
        {"status": "pruned", "events": str(windows), "config": config},
        {"status": "ok", "steps_per_s": 9.0, "config": {"compile": False}},
    ]
    paces = Paces(None, "2.11", "NVIDIA H200", "lora-8b")
    kept = [paces.take(study, SimpleNamespace(number=n, user_attrs=a)) for n, a in enumerate(trials)]
    assert kept == [True, True, False, False, False]
    assert paces.ceiling(config) == {"steps_per_s": 2.0, "of": 2, "by": "s trial 0"}
    assert paces.ceiling(config, "s") is None  # the study's own runs are not an earlier study's
    assert workload({"model": "captioner", "seed": 0, "parallel": "ddp", "nproc": 2}) == "captioner|parallel=ddp|nproc=2"


def test_a_pace_stored_before_a_setting_was_added_still_bounds_the_same_configuration():
    """A configuration stored before graph_step was a key of DEFAULTS is found by the same configuration with it
    at its default; with it on, it is another configuration."""
    from autocompile.space import DEFAULTS

    study = SimpleNamespace(study_name="s")
    before = {k: v for k, v in DEFAULTS.items() if k != "graph_step"}
    paces = Paces(None, "2.11", "NVIDIA H200", "llama-8b")
    for number, speed in enumerate((6.5, 6.4)):  # a pace bounds once seen TIMES times
        attrs = {"status": "ok", "steps_per_s": speed, "config": before}
        assert paces.take(study, SimpleNamespace(number=number, user_attrs=attrs))
    assert paces.ceiling(dict(DEFAULTS)) == {"steps_per_s": 6.5, "of": 2, "by": "s trial 0"}
    assert paces.ceiling({**DEFAULTS, "graph_step": True}) is None


def test_the_runner_bounds_a_trial_by_the_lower_of_its_move_s_ceiling_and_its_configuration_s_pace():
    """Runner._ceiling: a trial whose configuration ran in two other studies is bounded by the faster of those
    runs plus MARGIN, with the reason saying so; a neighbour whose move has a lower ceiling takes that one."""
    from types import MethodType, SimpleNamespace

    from autocompile.engine.runner import Runner

    config = {"compile": True, "scope": "regional", "mode": "default"}
    paces = Paces(None, "2.11", "NVIDIA H200", "lora-8b")
    for study, pace in (("a", 1.40), ("b", 1.46)):
        paces.take(
            SimpleNamespace(study_name=study),
            SimpleNamespace(number=3, user_attrs={"status": "ok", "steps_per_s": pace, "config": config}),
        )
    gains = MoveGains(None, "2.11", "NVIDIA H200", "lora-8b")
    parent = SimpleNamespace(number=1, user_attrs={"status": "ok", "steps_per_s": 1.2})
    for study in ("a", "b"):
        child = SimpleNamespace(number=2, user_attrs={"status": "ok", "steps_per_s": 1.26, "parent": 1, "changed": ["mode"]})
        gains.take(SimpleNamespace(study_name=study, get_trials=lambda deepcopy=False: [None, parent]), child)
    this = SimpleNamespace(study_name="c", get_trials=lambda deepcopy=False: [None, parent])
    runner = SimpleNamespace(paces=paces, gains=gains, study=this)
    for name in ("_ceiling", "_move_ceiling", "_pace_ceiling"):
        setattr(runner, name, MethodType(getattr(Runner, name), runner))
    recipe = SimpleNamespace(user_attrs={"config": config})
    ceiling, because = runner._ceiling(recipe)
    assert ceiling == pytest.approx(1.46 * (1 + MARGIN))
    assert (
        because == " (its steady speed at most 1.61 steps/s: its configuration ran at most 1.46 here, b trial 3, of 2, plus 10%)"
    )
    neighbour = SimpleNamespace(user_attrs={"config": config, "parent": 1, "changed": ["mode"]})
    ceiling, because = runner._ceiling(neighbour)  # 1.2 x 1.05 = 1.26, below the pace's 1.61
    assert ceiling == pytest.approx(1.26) and "the most a move of mode has gained" in because
    assert runner._ceiling(SimpleNamespace(user_attrs={"config": {**config, "mode": "max-autotune"}})) == (None, "")


def test_replayed_on_every_committed_study_a_known_peak_refuses_only_what_ran_over_the_memory_limit():
    """The gate `over memory before`, replayed on every committed study searched under --max-memory-gb with the
    peaks of the device's other studies of its workload: each measured trial it would have refused had peaked over
    that study's limit, and it refuses the recipes that the lora-8b searches under eager's memory ran to find so."""
    from autocompile.engine.gates import View, over_memory_before
    from autocompile.engine.knowledge import Peaks
    from autocompile.engine.studyview import StudyView

    studies = list(_studies())
    keyed = _keyed(studies)
    refused = {}
    for name, study in studies:
        limit_was = (study.user_attrs.get("search_settings") or {}).get("max_memory_gb")
        if name not in keyed or limit_was is None:
            continue
        peaks = Peaks(None, *keyed[name])
        for other, other_study in studies:
            if other != name and keyed.get(other) == keyed[name]:
                for t in other_study.trials:
                    peaks.take(other_study, t)
        limit = StudyView(study).memory_limit(limit_was)
        view = View(study, peaks=peaks, max_memory_gb=limit_was)
        for t in study.trials:
            a = t.user_attrs
            if a.get("peak_mem_gb") and a.get("wall_s") and over_memory_before(a["config"], view):
                assert a["peak_mem_gb"] > limit, (name, t.number, a["peak_mem_gb"], limit)
                refused.setdefault(name, []).append(t.number)
    assert refused["lora-8b-1gpu-6"] == [1, 2] and refused["lora-8b-1gpu-5"] == [1, 2]
    assert sum(map(len, refused.values())) >= 20


def test_a_trial_whose_windows_never_settled_is_kept_at_its_fastest_window():
    """lora-8b-2gpu-2 (H200, 2026-11-28) trial 31, reduce-overhead with coordinate descent, recorded 224 CUDA graphs
    in its first measuring window and ran out of its limit after two: 0.50 then 2.83 steps/s, 0.85 in the mean.
    Kept at 0.85, that pace would bound the configuration's next trial at 0.94 steps/s and prune it however fast it
    runs once settled; it is kept at its fastest window, as a pruned trial's is."""
    journal = optuna.storages.journal.JournalFileBackend(f"{HISTORY}/lora-8b-2gpu-2/journal.log")
    study = optuna.load_study(study_name="lora-8b-2gpu-2", storage=optuna.storages.JournalStorage(journal))
    unsettled = study.trials[31]
    assert unsettled.user_attrs["status"] == "ok" and unsettled.user_attrs["steps_per_s"] < 0.9
    assert max(unsettled.user_attrs["window_rates"]) > 2.8
    paces = Paces(None, "2.11.0+cu130", "NVIDIA H200", "lora-8b")
    for name in ("a", "b"):
        assert paces.take(SimpleNamespace(study_name=name), unsettled)
    assert paces.ceiling(unsettled.user_attrs["config"])["steps_per_s"] == max(unsettled.user_attrs["window_rates"])
    steady = study.trials[15].user_attrs  # the winner, settled: its fastest window within 2% of its steady speed
    assert steady["steps_per_s"] <= _pace(steady) <= 1.02 * steady["steps_per_s"]


def test_a_move_s_ceiling_holds_only_over_the_batch_layout_its_parents_had(tmp_path):
    """A move to reduce-overhead that lost twice over padded batches (0.59x at best) bounds that move from a
    padded parent, not from one packed under varlen attention, where CUDA graphs meet one shape per length.
    A store written before the layout was kept opens with the column added, and its old rows bound nothing."""
    import sqlite_utils

    from autocompile.space import DEFAULTS

    padded = {**DEFAULTS, "compile": True, "padding": "multiple"}
    packed = {**padded, "padding": "pack", "pack_attention": "varlen"}
    gains = MoveGains(None, "2.11", "NVIDIA H200", "llama-8b")
    for study, ratio in (("a", 0.53), ("b", 0.59)):
        parent = SimpleNamespace(number=1, user_attrs={"status": "ok", "steps_per_s": 5.0, "config": padded})
        child = {"status": "ok", "steps_per_s": 5.0 * ratio, "parent": 1, "changed": ["mode"]}
        assert gains.take(
            SimpleNamespace(study_name=study, get_trials=lambda deepcopy=False: [None, parent]),
            SimpleNamespace(number=2, user_attrs=child),
        )
    assert batch_layout(padded) == "multiple" and batch_layout(packed) == "pack/varlen"
    assert gains.ceiling(["mode"], "multiple") == {"ratio": pytest.approx(0.59), "of": 2, "by": "b trial 2 (mode)"}
    assert gains.ceiling(["mode"], "pack/varlen") is None

    old = sqlite_utils.Database(tmp_path / "knowledge.db")  # the gains table as the first stores wrote it
    old["gains"].insert_all(
        [
            {
                "torch": "2.11",
                "device": "NVIDIA H200",
                "model": "llama-8b",
                "study": s,
                "trial": 2,
                "parent": 1,
                "moved": "mode",
                "parent_steps_per_s": 5.0,
                "steps_per_s": 2.9,
            }
            for s in ("a", "b")
        ],
        pk=("torch", "device", "model", "study", "trial"),
    )
    reopened = MoveGains(str(tmp_path / "knowledge.db"), "2.11", "NVIDIA H200", "llama-8b")
    assert "layout" in reopened.db["gains"].columns_dict and reopened.db["gains"].count == 2
    assert reopened.ceiling(["mode"], "multiple") is None and reopened.ceiling(["mode"], "longest") is None
