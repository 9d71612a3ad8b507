"""The pruning bound of a neighbour's warm-up with a ceiling on its steady speed: its parent's measured speed
times the most a neighbour of the same move has gained over its parent on the device. It cuts a slow warm-up earlier
than the bound that assumes any speed, and, replayed on every committed study with the gains of the others,
it would have cut no trial that won or came within noise of winning."""

import glob
import os

import pytest

from autocompile.engine.knowledge import MoveGains, study_key
from autocompile.engine.scoring import PRUNE_SLACK, _at_most, optimistic_score
from autocompile.engine.storage import load_study
from conftest import ROOT


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
    for path in sorted(glob.glob(os.path.join(ROOT, "studies", "**", "study.db"), recursive=True)):
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
            known = gains.ceiling(a.get("changed") or [])
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
    assert checked >= 10  # (18: the neighbours that won or came within noise, of moves seen in other studies)
