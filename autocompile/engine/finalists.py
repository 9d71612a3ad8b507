"""The finalist round and the winner: the top configurations measured again, alternating with
eager, and the verdict chosen from that round; the time the round keeps under --timeout."""

from __future__ import annotations

import functools
import math
import statistics

from autocompile.trial.protocol import REPLAY_VERSION, STOP_S
from autocompile.engine.records import baseline_trial, eager_record, search_candidates
from autocompile.engine.runner import Runner, new_trial
from autocompile.engine.scoring import score

# choose_winner's rule; a stored verdict of an older rule is chosen again from its own rows (rechoose).
# 2: a runner-up's disagreement between its two runs no longer counts as noise against the leader.
# 3: each configuration's speed and score in the verdict, eager's alike, are the median of all its
#    measurements (its run in the search and its runs in the round; of two, their mean), not its
#    round's alone (`pooled`): the CPU quickstart's recipe ran 210 steps/s, then 127 in a rerun whose
#    windows spread 12.7%, and eager's one rerun (154, against 134 in the search) took the win from
#    a configuration 1.56x eager (2-core host, 2026-11-26).
# 4: two finalists within noise compare warm-ups on one footing: a warm-up reconstructed from cache
#    hits, against one measured cold, is scaled by what the round's cold runs showed of the
#    reconstruction (`_expected_cold`). captioner-fresh-6's trial 10 (22.2 s reconstructed) took the
#    win from trial 8 (27.9 s cold, reconstructed 19.2 s) and its own cold run (29.1 s) gave it back:
#    49 s of a 178 s round (H200, 2026-11-26).
# 5: where the round has no cold run of a reconstructed finalist to scale by, a reconstructed warm-up
#    counts as what the device's earlier cold runs of the model showed (`cold_scale`), as `cold_pick`
#    counted it when it chose which finalist to run cold.
WINNER_RULE = 5

# A finalist whose measurements disagree by more than FAR_SPREADS times the larger window spread
# among them, and by more than FAR_FLOOR, is measured once more, eager beside it, where the time
# left under --timeout holds both (`_measure_again`): a third measurement of each makes the median
# the middle one, so one disturbed run no longer moves the verdict. The CPU quickstart's quiet
# reruns disagree by 0-18% with their first runs; that recipe's 210 then 127 by 49%, its windows 12.7%.
FAR_SPREADS = 3
FAR_FLOOR = 0.2

# How far behind the leader's score a configuration may be and still be measured again: no further
# than the largest disagreement seen between two runs of one configuration (the captioner's trial 3,
# 16.7 then 12.2, 27%, host-bound; CUDA-graph and llama-8b configurations agree within 2%; H200,
# 2026-11-23). Further behind, a rerun cannot change the verdict: llama-8b-fresh's round kept 758 s
# of its 1500 s to measure plain torch.compile again (518 s of warm-up, 38% behind) and left no
# time for the neighbours (H200, 2026-11-23).
REACH = 0.3

# A finalist's rerun is stopped at this multiple of what its first run took (and never short of a
# minute more than that, nor past the trial limit): a rerun that takes far longer than its first
# run measures the machine, not the configuration, and must not take the other finalists' time.
# llama-8b-fresh-3's rerun of trial 4 (113 s the first time) was still compiling at the 240 s
# trial limit, and the round measured none of its three finalists (H200, 2026-11-25).
RERUN_LIMIT = 1.5


# What a warm rerun's warm-up is of its first run's cold one: it loads the code it compiled (the
# captioner's regional recipe, 13.2 s against 61.2 s cold, all graphs cache hits; H100, 2026-11-25,
# studies/runs/2026-11-25-captioner-warm-finalists.log). A third, for what a host adds.
WARM_SHARE = 1 / 3

# The round measures in windows of at least this many seconds (the search's: 0.5 s). On a shared
# 2-core host a 0.5 s window falls inside another process's compile burst or between two: the CPU
# quickstart's eager ran 138 steps/s in the search and 169 in its rerun, plain torch.compile 214
# then 181, which handed eager the win (2026-11-25); the round is what decides, so it measures
# long enough to average such bursts. A GPU model's windows are whole passes over its pool, longer
# already (llama-8b's: about 16 s), so there it changes nothing.
ROUND_MEASURE = {"min_window_s": 2.0}


def round_measure_extra_s(attrs: dict) -> float:
    """How much longer a run measures in the round than in its first run (ROUND_MEASURE): as many
    windows as it took then, each at least ROUND_MEASURE's length."""
    rate, steps, window = attrs.get("steps_per_s"), attrs.get("measured_steps"), attrs.get("window_steps")
    if not rate or not steps or not window:
        return 0.0
    window_s = window / rate
    return (steps / window) * max(0.0, ROUND_MEASURE["min_window_s"] - window_s)


def rerun_estimate_s(trial) -> float:
    """What a finalist's rerun is expected to take: its first run, less the part of its warm-up
    that loading its compiled code saves (WARM_SHARE), and more the longer windows of the round
    (ROUND_MEASURE). The reserve and the round's plan count this."""
    a = trial.user_attrs
    if not a.get("config", {}).get("compile"):
        return a.get("wall_s", 0) + round_measure_extra_s(a)
    measured = a.get("warmup_measured_s") or a.get("warmup_s") or 0
    return max(a.get("wall_s", 0) - (1 - WARM_SHARE) * measured, 0.0) + round_measure_extra_s(a)


def cold_check_s(study, k: int, limit_s: float | None = None) -> float:
    """What measuring a finalist's warm-up cold adds to the round, where `cold_pick` names one: its
    round's run is a cold one (`_rerun`), its first run with the compile time its cache hits saved,
    in place of a warm rerun."""
    scale = cold_scale(study)
    pick = cold_pick(contenders(study, k, limit_s), scale)
    if pick is None:
        return 0.0
    return max(_cold_run_s(pick, scale) - rerun_estimate_s(pick), 0.0)


def cold_scale(study) -> float:
    """How many times the seconds a reconstruction added a cold run is expected to take over the
    warm-up measured with the cache: what the device's earlier cold runs of this model took
    (`knowledge.cold`, recorded by the study as `cold_scale`), else 1."""
    return (study.user_attrs.get("cold_scale") or {}).get("scale", 1.0)


def cold_pick(finalists: list, scale: float = 1.0):
    """The finalist whose round run is from empty caches: the one the verdict most likely chooses,
    where its warm-up was reconstructed (None where that one's was measured cold), so that the winner
    needs no second cold run. The verdict compares the top two (`choose_winner`): of the leader and
    the runner-up by their first runs, the leader, or, where they are within noise of each other
    (their window spreads added), the one with the shorter warm-up (a reconstructed one as a cold run
    is expected to measure it, `scale`; WINNER_RULE 4 and 5). captioner-fresh-7's round ran its
    leader, trial 10, cold (29.8 s against 20.9 s reconstructed); trial 8, 0.15% behind it by their
    first runs with 18.8 s reconstructed, won on its warm-up and was run cold too (40 s), and the
    round's third finalist was left out for time. captioner-fresh-8's round ran its third finalist
    cold, the shortest reconstructed warm-up of three within noise, and the verdict went to the
    runner-up, which was run cold too (H200, 2026-11-26)."""
    if not finalists:
        return None
    leader = finalists[0]
    pair = [leader, *(t for t in finalists[1:2] if leader.value / t.value - 1 <= _spread(leader) + _spread(t))]
    quickest = min(pair, key=lambda t: _expected_cold_warmup(t, scale))
    return quickest if _reconstructed(quickest) else None


def _expected_cold_warmup(trial, scale: float) -> float:
    """A trial's warm-up as a cold run is expected to measure it (`_expected_cold`, by `scale`)."""
    a = trial.user_attrs
    return _expected_cold({"warmup_s": a.get("warmup_s") or math.inf, "warmup_reconstructed": _reconstructed(trial),
                           "reconstruction_added_s": _added_s(trial)}, None, scale)


def _spread(trial) -> float:
    return trial.user_attrs.get("cv") or 0.0


def _reconstructed(trial) -> bool:
    return trial.user_attrs.get("warmup_kind") == "reconstructed"


def _cold_run_s(trial, scale: float = 1.0) -> float:
    """What a run of `trial` from empty caches takes in the round: its run with the compile time its
    cache hits saved (scaled by what earlier cold runs showed: `cold_scale`), and the round's longer windows."""
    a = trial.user_attrs
    return a.get("wall_s", 0) + scale * _added_s(trial) + round_measure_extra_s(a)


def _added_s(trial) -> float:
    """The seconds a trial's reconstructed warm-up added for the graphs the shared cache had (0: none)."""
    return (trial.user_attrs.get("reconstruction") or {}).get("added_s", 0.0)


def rerun_limit_s(first_wall_s: float, trial_timeout_s: float) -> float:
    """The time limit of a finalist's rerun (see RERUN_LIMIT)."""
    return min(trial_timeout_s, max(RERUN_LIMIT * first_wall_s, first_wall_s + 60))


def contenders(study, k: int, limit_s: float | None = None) -> list:
    """The top k distinct configurations that a rerun could still make the winner: best first,
    those within REACH of the leader's score, and whose first run took no longer than `limit_s`
    (the trial limit, which bounds a rerun: `too_long`)."""
    top = search_candidates(study)[:k]
    return [t for t in top if t.value >= (1 - REACH) * top[0].value and not too_long(t, limit_s)]


# A rerun's warm estimate rests on one measured share (WARM_SHARE): a finalist is measured again
# only where that estimate leaves this much of the trial limit to spare.
RERUN_HEADROOM = 0.8


def too_long(trial, limit_s: float | None) -> bool:
    """Whether a trial's rerun, warm (rerun_estimate_s), is expected to take longer than a rerun may
    (RERUN_HEADROOM of the trial limit): plain torch.compile, measured under the longer baseline limit.
    llama-8b-fresh-4's round, planned after the first recipe, kept 774 s of the 1500 s --timeout to
    measure it again (568 s of warm-up, 21% behind), which ended the search after three trials;
    its rerun was then cut at the 240 s trial limit (H200, 2026-11-25). The first run's own time
    is not the bound: captioner-fresh-4's leader took 243 s (149 s of it warming up) and was left
    out of the round, unconfirmed, though a warm rerun takes about 144 s (H100, 2026-11-25); llama-8b's
    plain torch.compile above, about 219 s warm, stays out."""
    return limit_s is not None and rerun_estimate_s(trial) > RERUN_HEADROOM * limit_s


def finalist_reserve(study, k: int, limit_s: float | None = None) -> float:
    """Seconds to keep for the finalist round under --timeout: what the current contenders (and eager)
    took in their own runs, which the round repeats. Kept from the start (a resumed study knows
    it at once) and updated as trials finish, so the round always runs. A tenth more for runs that
    take longer the second time (llama-8b's round kept 331 s, had 330 s and left out its third
    finalist, 45 s long, H200, 2026-11-23). Nothing while no compiled trial is a contender: the
    round measures contenders against eager, and without one it does not run (the CPU quickstart
    on a loaded host kept 72 s of its 180 for eager's rerun alone, so plain torch.compile got 41 s
    and no recipe ran, 2026-11-26)."""
    finalists = contenders(study, k, limit_s) if k > 0 else []
    if not finalists:
        return 0.0
    eager = eager_record(study) or {}
    reruns = sum(rerun_estimate_s(t) for t in finalists)
    eager_s = eager.get("wall_s", 0) + round_measure_extra_s(eager)
    return 1.1 * (reruns + eager_s + cold_check_s(study, k, limit_s))


def reserve_note(study, k: int, timeout_s: float | None, limit_s: float | None = None) -> str | None:
    """A line for the start of a search whose finalist round keeps more than half of --timeout, or
    None: a resumed search's round repeats its top trials, which may leave little room for new
    ones (the captioner's kept 626 s of 1020 s, room for one new trial; H200, 2026-11-23)."""
    reserve = finalist_reserve(study, k, limit_s) if timeout_s and k else 0.0
    if not timeout_s or reserve <= timeout_s / 2:
        return None
    n = len(contenders(study, k, limit_s))
    fewer = f"; --finalists {n - 1} keeps {finalist_reserve(study, n - 1, limit_s):.0f} s" if n > 1 else ""
    return (f"the finalist round keeps {reserve:.0f} s of the {timeout_s:.0f} s --timeout "
            f"(its {n} finalists and eager, measured again){fewer}")


def choose_winner(rows: list[dict], eager_number: int, eager_score: float, horizon: int, scale: float = 1.0) -> dict:
    """The finalist round's verdict from its rows (trial, status, score, noise, spread, warmup_s):
    the best score, unless the top two are within noise (then the shorter warm-up), or eager
    scores above the chosen one. Returns winner, why, and the margin. A reconstructed warm-up counts
    as the round's cold runs measured the reconstruction, else as `scale` says (`_expected_cold`).

    The noise is the leader's (its window spread or the gap between its two measurements, the
    larger) plus the runner-up's window spread: a runner-up whose own measurements disagree is
    less to be trusted, not a closer rival (the captioner's trial 3 ran at 17.3 then 12.7 steps/s
    and took the win from a CUDA-graph configuration steady at 19.9 and 19.6, H200, 2026-11-23)."""
    ranked = sorted((row for row in rows if row["status"] == "ok"), key=lambda row: row["score"], reverse=True)
    if not ranked:
        return {"winner": None}
    verdict = {}
    winner, why = ranked[0], f"trial {ranked[0]['trial']} has the best score in the finalist round"
    if len(ranked) > 1:
        second = ranked[1]
        margin = winner["score"] / second["score"] - 1
        noise = winner["noise"] + second.get("spread", second["noise"])
        verdict.update(margin=margin, noise=noise, within_noise=margin <= noise)
        if margin <= noise:
            ratio = _cold_ratio(rows)
            cold = functools.partial(_expected_cold, ratio=ratio, scale=scale)
            quicker = min(winner, second, key=cold)
            why = (f"trials {winner['trial']} and {second['trial']} are within noise ({margin:.1%} apart, "
                   f"noise {noise:.1%}): trial {quicker['trial']} wins with the shorter warm-up")
            scaled = [row for row in (winner, second) if cold(row) != row["warmup_s"]]
            source = "the round's cold runs" if ratio else "earlier cold runs of this model"
            why += "".join(f" (trial {row['trial']}'s {row['warmup_s']:.1f} s reconstructed is {cold(row):.1f} s "
                           f"as {source} measured the reconstruction)" for row in scaled)
            winner = quicker
        else:
            why += f", {margin:.1%} ahead of trial {second['trial']} (noise {noise:.1%})"
    if eager_score > winner["score"]:
        why = (f"eager scores {eager_score:.3g} in the finalist round, above trial {winner['trial']}'s "
               f"{winner['score']:.3g}: at horizon {horizon} no compiled setting pays for its warm-up")
        winner = {"trial": eager_number}
    return {**verdict, "winner": winner["trial"], "why": why}


def _cold_ratio(rows: list[dict]) -> float | None:
    """Cold over reconstructed warm-up, as the round's cold runs measured them (their median), or None."""
    ratios = [row["warmup_s"] / row["reconstructed_warmup_s"] for row in rows
              if row.get("status") == "ok" and row.get("reconstructed_warmup_s")]
    return statistics.median(ratios) if ratios else None


def _expected_cold(row: dict, ratio: float | None, scale: float = 1.0) -> float:
    """A finalist's warm-up as a cold run would measure it: a reconstructed one scaled by `ratio` (the
    round's cold runs), else with the seconds its reconstruction added scaled by `scale` (`cold_scale`)."""
    if not row.get("warmup_reconstructed"):
        return row["warmup_s"]
    if ratio:
        return row["warmup_s"] * ratio
    return row["warmup_s"] + (scale - 1) * row.get("reconstruction_added_s", 0.0)


def run_finalists(runner: Runner, k: int, rounds: int = 1) -> dict | None:
    """Measure the contenders (the top k, within REACH of the leader) again, alternating with
    eager, and choose the winner.

    Each round runs eager then the finalists (in reverse order every other round), so drift
    of the machine reaches all of them alike. The winner has the best score in the round;
    when the top two are within noise (see choose_winner), the one with the shorter warm-up wins.
    """
    study, progress = runner.study, runner.progress
    eager = baseline_trial(study, "eager")
    trial_limit = runner.settings.trial_timeout_s
    candidates = contenders(study, k, trial_limit)
    if not candidates:
        return None
    if eager is None:  # eager did not fit: the finalists are measured again among themselves
        progress.line("finalist round: without eager (its baseline did not run cleanly): the finalists alone")
    top, chosen = search_candidates(study)[:k], {c.number for c in candidates}
    for t in top:
        if too_long(t, trial_limit):
            progress.line(f"finalist round: trial {t.number} not measured again: its run took {t.user_attrs['wall_s']:.0f} s, "
                          f"a warm rerun about {rerun_estimate_s(t):.0f} s, more than {RERUN_HEADROOM:.0%} of the "
                          f"{trial_limit:.0f} s trial limit a rerun has")
        elif t.number not in chosen:
            progress.line(f"finalist round: trial {t.number} not measured again: its score {t.value:.3g} is "
                          f"{1 - t.value / top[0].value:.0%} behind the leader's, more than a rerun moves ({REACH:.0%})")
    finalists, overrun = _plan(runner, eager, candidates, rounds)
    numbers = [t.number for t in finalists]
    reference = [eager] if eager is not None else []
    done = study.user_attrs.get("finalists")
    if done and done.get("finalists") == numbers and done.get("numerics_guard") == REPLAY_VERSION:
        # this round was run already for these finalists, under the current numerics guard
        return done if done.get("winner_rule") == WINNER_RULE else rechoose(study, runner.settings.horizon, progress.line)
    pick = cold_pick(finalists, cold_scale(study))
    cold = f"; trial {pick.number}, its warm-up reconstructed, from empty caches: its warm-up measured cold" \
        if pick is not None else ""
    progress.line(f"finalist round: trials {', '.join(map(str, numbers))} measured again, alternating with eager; "
                  f"each starts from the code its first run compiled, whose cold warm-up and numerics it carries{cold}")
    progress.total = progress.done + rounds * (len(finalists) + len(reference))
    runs: dict[int, list[dict]] = {t.number: [] for t in [*reference, *finalists]}
    for r in range(rounds):
        order = [*reference, *(finalists if r % 2 == 0 else finalists[::-1])]
        for original in order:
            remaining = runner.remaining()
            # the round was planned from what its runs took (the reserve): a run is left out only
            # when what it took no longer fits, and the first round's eager and leader always run
            must = r == 0 and original.number in {x.number for x in (*reference, finalists[0], pick) if x is not None}
            if remaining is not None and not must and remaining + overrun < rerun_estimate_s(original):
                progress.line(f"finalist round: search timeout reached, trial {original.number} not measured again")
                break
            cold = r == 0 and original is pick
            record = _rerun(runner, original, r, overrun, cold)
            if cold and record["status"] != "ok":  # its speed measured all the same, warm as the others'
                progress.line(f"finalist round: the cold run of trial {original.number} ended {record['status']}: "
                              "measured again from its compiled code, its warm-up stays reconstructed")
                runs[original.number].append(record)
                record = _rerun(runner, original, r, overrun, cold=False)
            runs[original.number].append(record)
    verdict = _verdict(runner, eager, finalists, runs, rounds)
    if _measure_again(runner, eager, finalists, runs, verdict["candidates"], rounds):
        verdict = _verdict(runner, eager, finalists, runs, rounds)
    if verdict["winner"] is not None:
        progress.line("finalists: " + verdict["why"])
        verdict = cold_check(runner, verdict, [_check(study.trials[n], x) for n, xs in runs.items()
                                               for x in xs if x.get("cold")])
    study.set_user_attr("finalists", verdict)
    return verdict


def _verdict(runner: Runner, eager, finalists: list, runs: dict[int, list[dict]], rounds: int) -> dict:
    """The round's verdict from its runs: each finalist's row and eager's speed and score, each from
    all its measurements (`pooled`: its run in the search and its runs in the round), and the winner."""
    horizon = runner.settings.horizon
    eager_runs = [x for x in runs[eager.number] if x["status"] == "ok"] if eager is not None else []
    eager_measured = [eager.user_attrs, *eager_runs] if eager_runs else []
    eager_pace, eager_score = pooled(eager_measured, horizon) if eager_measured else (None, 0.0)
    rows = [_row(t, runs[t.number], eager_pace, horizon) for t in finalists]
    return {"finalists": [t.number for t in finalists], "rounds": rounds, "eager_steps_per_s": eager_pace,
            "eager_paces": [m["steps_per_s"] for m in eager_measured], "eager_score": eager_score,
            "candidates": rows, "numerics_guard": REPLAY_VERSION, "winner_rule": WINNER_RULE,
            **choose_winner(rows, eager.number if eager else None, eager_score, horizon, cold_scale(runner.study))}


def _measure_again(runner: Runner, eager, finalists: list, runs: dict[int, list[dict]], rows: list[dict],
                   rounds: int) -> bool:
    """Each finalist whose measurements disagree far beyond their noise (`far_apart`) measured once
    more, eager before it, where what is left of --timeout holds both reruns (no time is taken from
    the search for it); whether any ran. Its line says which, or why not."""
    progress, ran = runner.progress, False
    for t, row in zip(finalists, rows):
        if not far_apart(row):
            continue
        pair = [x for x in (eager, t) if x is not None]
        need, remaining = sum(rerun_estimate_s(x) for x in pair), runner.remaining()
        ran_as = (f"finalist round: trial {t.number} ran {' then '.join(f'{p:.3g}' for p in row['paces'])} steps/s "
                  f"({row['agreement']:.0%} apart, its windows within {row['spread']:.0%})")
        if remaining is not None and remaining < need:
            progress.line(f"{ran_as}, not measured a third time: {max(remaining, 0):.0f} s left, a rerun of "
                          f"it{' and eager' if eager else ''} takes about {need:.0f} s")
            continue
        progress.line(f"{ran_as}: measured a third time{', eager beside it' if eager else ''}")
        progress.total += len(pair)
        for x in pair:
            runs[x.number].append(_rerun(runner, x, rounds, 0.0, cold=False))
        ran = True
    return ran


def _rerun(runner: Runner, original, r: int, overrun: float, cold: bool) -> dict:
    """Finalist `original` measured again in round `r`: from the code its first run compiled, its
    cold warm-up and numerics carried; or, `cold`, from empty caches, its warm-up measured cold
    (the finalist `cold_pick` names, its warm-up reconstructed: the run its cold check would have
    been, in place of a warm rerun; llama-8b-fresh-6's round spent 33 s rerunning its leader warm, then 95 s
    cold, H200, 2026-11-26). A rerun may take longer than its first run (a loaded host compiles
    slower): it is not cut short of its limit (RERUN_LIMIT), even past --timeout, nor let run beyond it."""
    trial = new_trial(runner.study)
    trial.set_user_attr("remeasure_of", original.number)
    trial.set_user_attr("finalist_round", r)
    if cold:
        trial.set_user_attr("cold_check", True)
    first_s = _cold_run_s(original, cold_scale(runner.study)) if cold else original.user_attrs["wall_s"]
    limit = rerun_limit_s(first_s, runner.settings.trial_timeout_s)
    remaining = runner.remaining()
    keep = -overrun if remaining is None else min(-overrun, remaining - limit - STOP_S)  # its whole limit
    record = runner.run(trial, dict(original.user_attrs["config"]), "finalist", prunable=False,
                        limit_s=limit, keep_s=keep, first=original, cold=cold, measure=ROUND_MEASURE)
    return {**record, "trial": trial.number, "cold": cold}


def _check(first, run: dict) -> dict:
    """A cold run of finalist `first` in the round, as `cold_check` lists it."""
    check = {"trial": run["trial"], "of": first.number, "status": run["status"],
             "reconstructed_warmup_s": first.user_attrs["warmup_s"]}
    if run["status"] == "ok":
        check.update(cold_warmup_s=run["warmup_s"], agreement=first.user_attrs["warmup_s"] / run["warmup_s"] - 1)
    return check


def cold_check(runner: Runner, verdict: dict, checks: list | None = None) -> dict:
    """The winner's warm-up measured cold, where its runs had it reconstructed (a shared compile cache
    had some of its graphs): the round's cold run of it (`checks`, the leader's), else a run of its
    own from empty caches (`_measure_cold`). Its cold warm-up can put another finalist ahead; where
    that one's warm-up was reconstructed too, it is measured cold in turn, so that the winner's
    warm-up is always one measured cold (or says it is not: a cold run that failed). `cold_checks`
    lists every check, `cold_check` is the winner's."""
    checks = list(checks or [])
    for check in checks:
        if check["status"] == "ok":
            runner.progress.line(f"finalist round: trial {check['of']} warmed up in {check['cold_warmup_s']:.1f} s "
                                 f"cold in the round, reconstructed {check['reconstructed_warmup_s']:.1f} s "
                                 f"({check['agreement']:+.0%})")
    while (first := _reconstructed_winner(runner.study, verdict, checks)) is not None:
        verdict, check = _measure_cold(runner, verdict, first)
        checks.append(check)
        if check["status"] != "ok":
            break
    if not checks:
        return verdict
    winners = [c for c in checks if c["of"] == verdict["winner"]]
    return {**verdict, "cold_checks": checks, "cold_check": (winners or checks)[-1]}


def _reconstructed_winner(study, verdict: dict, checks: list):
    """The verdict's winner where its warm-up was reconstructed and not yet measured cold, else None."""
    row = next((r for r in verdict["candidates"] if r["trial"] == verdict["winner"]), None)
    if row is None or any(c["of"] == row["trial"] for c in checks):
        return None
    first = study.trials[row["trial"]]
    return first if first.user_attrs.get("warmup_kind") == "reconstructed" else None


def _measure_cold(runner: Runner, verdict: dict, first) -> tuple[dict, dict]:
    """One cold run of finalist `first`: its warm-up and score replace its row's (the reconstructed
    warm-up kept beside) and the winner is chosen again; the new verdict and the check."""
    study, progress = runner.study, runner.progress
    row = next(r for r in verdict["candidates"] if r["trial"] == first.number)
    progress.line(f"finalist round: trial {first.number}'s warm-up was reconstructed from cache hits: measured cold")
    trial = new_trial(study)
    trial.set_user_attr("remeasure_of", first.number)
    trial.set_user_attr("cold_check", True)
    limit = rerun_limit_s(_cold_run_s(first, cold_scale(study)), runner.settings.trial_timeout_s)
    record = runner.run(trial, dict(first.user_attrs["config"]), "finalist", prunable=False, limit_s=limit,
                        keep_s=-limit, first=first, cold=True, measure=ROUND_MEASURE)
    check = _check(first, {**record, "trial": trial.number})
    if record["status"] != "ok":
        progress.line(f"finalist round: the cold run of trial {first.number} ended {record['status']}: "
                      f"its warm-up stays reconstructed")
        return verdict, check
    cold_row = {**row, "warmup_s": record["warmup_s"], "reconstructed_warmup_s": row["warmup_s"],
                "warmup_reconstructed": False, "reruns": [*row["reruns"], trial.number]}
    cold_row = _pool_row(cold_row, _measurements(study, cold_row), verdict["eager_steps_per_s"], runner.settings.horizon)
    rows = [r if r is not row else cold_row for r in verdict["candidates"]]
    eager = baseline_trial(study, "eager")
    again = {**verdict, "candidates": rows,
             **choose_winner(rows, eager.number if eager else None, verdict["eager_score"], runner.settings.horizon,
                             cold_scale(study))}
    progress.line(f"finalist round: trial {first.number} warmed up in {record['warmup_s']:.1f} s cold, reconstructed "
                  f"{row['warmup_s']:.1f} s ({check['agreement']:+.0%}); " + again["why"])
    return again, check


def _plan(runner: Runner, eager, candidates: list, rounds: int) -> tuple[list, float]:
    """The finalists whose reruns fit what is left of --timeout, best first, and by how much the
    round may run past it (when none fits, the best is measured all the same)."""
    finalists, remaining, overrun = [], runner.remaining(), 0.0
    eager_s = rerun_estimate_s(eager) if eager is not None else 0.0
    budget = None if remaining is None else (remaining - cold_check_s(runner.study, len(candidates))) / rounds - eager_s
    for t in candidates:
        if budget is not None and rerun_estimate_s(t) > budget:
            runner.progress.line(f"finalist round: no time left to measure trial {t.number} again "
                                 f"(it took {t.user_attrs['wall_s']:.0f} s, a rerun is expected to take "
                                 f"{rerun_estimate_s(t):.0f} s)")
            break
        finalists.append(t)
        budget = None if budget is None else budget - rerun_estimate_s(t)
    if not finalists:  # the round always runs: the best of them at least, past --timeout if need be
        finalists = candidates[:1]
        limit = runner.settings.trial_timeout_s
        overrun = (rerun_limit_s(finalists[0].user_attrs["wall_s"], limit)
                   + (rerun_limit_s(eager_s, limit) if eager is not None else 0.0) - max(remaining, 0.0))
        runner.progress.line(f"finalist round: trial {finalists[0].number} measured again even though it runs past "
                             f"--timeout, by up to {overrun:.0f} s: the winner comes from the round")
    return finalists, overrun


def pooled(measurements: list[dict], horizon: int, warmup_s: float | None = None) -> tuple[float, float]:
    """A configuration's steady speed and score from all its measurements (its run in the search and
    its runs in the round, records or trial attributes): the median of each, the mean of two. Each
    score is taken at `warmup_s` (a finalist's carried or cold warm-up), else at its own (eager's)."""
    paces = [m["steps_per_s"] for m in measurements]
    scores = [score({**m, "status": "ok", **({} if warmup_s is None else {"warmup_s": warmup_s})}, horizon)
              for m in measurements]
    return statistics.median(paces), statistics.median(scores)


def _row(t, runs: list[dict], eager_pace: float | None, horizon: int) -> dict:
    """A finalist's row in the verdict: its measurements in the search and in the round, their noise,
    and its speed and score from all of them (`pooled`)."""
    ok = [x for x in runs if x["status"] == "ok"]
    if not runs:
        return {"trial": t.number, "config": t.user_attrs["config"], "status": "not run",
                "reason": "no time left in the round"}
    if not ok:
        return {"trial": t.number, "config": t.user_attrs["config"], "status": "failed again",
                "reason": "; ".join(x.get("reason", "") for x in runs)}
    cold = [x for x in ok if x.get("cold")]  # its warm-up measured cold in the round: that one stands
    warmup_s = statistics.mean(x["warmup_s"] for x in cold or ok)
    row = {"trial": t.number, "config": t.user_attrs["config"], "status": "ok", "reruns": [x["trial"] for x in ok],
           "search_steps_per_s": t.user_attrs["steps_per_s"], "search_score": t.value, "warmup_s": warmup_s}
    if cold:
        row["reconstructed_warmup_s"] = t.user_attrs["warmup_s"]
    else:
        row["warmup_reconstructed"] = _reconstructed(t)
        if _reconstructed(t):
            row["reconstruction_added_s"] = _added_s(t)
    return _pool_row(row, [t.user_attrs, *ok], eager_pace, horizon)


def _pool_row(row: dict, measurements: list[dict], eager_pace: float | None, horizon: int) -> dict:
    """`row` with its speed, score and noise from `measurements` (its first run's, then its reruns')."""
    paces = [m["steps_per_s"] for m in measurements]
    steady, pooled_score = pooled(measurements, horizon, row["warmup_s"])
    agreement = (max(paces) - min(paces)) / statistics.mean(paces)
    spread = max(m.get("cv", 0) for m in measurements)
    return {**row, "paces": paces, "steps_per_s": steady, "score": pooled_score,
            "vs_eager": steady / eager_pace if eager_pace else None,
            "agreement": agreement, "spread": spread, "noise": max(agreement, spread)}


def far_apart(row: dict) -> bool:
    """Whether a finalist's measurements disagree far beyond their windows' spread (FAR_SPREADS, FAR_FLOOR)."""
    return row["status"] == "ok" and row["agreement"] > max(FAR_SPREADS * row["spread"], FAR_FLOOR)


def _measurements(study, row: dict) -> list[dict]:
    """A finalist's measurements as its trials hold them: its first run's, then its reruns'."""
    return [study.trials[row["trial"]].user_attrs, *(study.trials[n].user_attrs for n in row["reruns"])]


def rechoose(study, horizon: int, say=print) -> dict | None:
    """The study's finalist verdict chosen again under the current rule from the round's own runs,
    without measuring: each candidate's speed, score and noise from its trials (`pooled`), eager's
    from its run in the search and its speed and score in the round (an older round kept eager's
    score only as its rerun's, found by that speed). Stored, and said when the winner changes."""
    verdict = study.user_attrs.get("finalists")
    eager = baseline_trial(study, "eager")
    if not verdict or verdict.get("winner_rule") == WINNER_RULE or eager is None:
        return verdict
    eager_score = verdict.get("eager_score")
    if eager_score is None:  # an older round kept eager's speed only: its rerun's score, found by that speed
        reruns = [t.value for t in study.trials if t.user_attrs.get("remeasure_of") == eager.number
                  and t.user_attrs.get("steps_per_s") == verdict.get("eager_steps_per_s")]
        eager_score = reruns[-1] if reruns else verdict.get("eager_steps_per_s") or 0.0
    eager_measured = [eager.user_attrs]
    if verdict.get("eager_steps_per_s"):  # the round's eager, its warm-up eager's first
        eager_measured.append({**eager.user_attrs, "steps_per_s": verdict["eager_steps_per_s"]})
    eager_pace, _ = pooled(eager_measured, horizon)
    eager_score = statistics.median([eager.value, eager_score]) if verdict.get("eager_steps_per_s") else eager.value
    rows = [row if row["status"] != "ok" else _pool_row(
        {"warmup_reconstructed": not row.get("reconstructed_warmup_s") and _reconstructed(study.trials[row["trial"]]),
         **row}, _measurements(study, row), eager_pace, horizon) for row in verdict["candidates"]]
    kept = {k: v for k, v in verdict.items() if k not in ("margin", "noise", "within_noise", "winner", "why")}
    again = {**kept, "candidates": rows, "eager_steps_per_s": eager_pace, "eager_score": eager_score,
             "eager_paces": [m["steps_per_s"] for m in eager_measured], "winner_rule": WINNER_RULE,
             **choose_winner(rows, eager.number, eager_score, horizon, cold_scale(study))}
    if again["winner"] != verdict.get("winner"):
        say(f"finalist round of trials {', '.join(map(str, verdict['finalists']))} chosen again under the current "
            f"rule: trial {again['winner']} wins (was trial {verdict.get('winner')}): {again['why']}")
    study.set_user_attr("finalists", again)
    return again
