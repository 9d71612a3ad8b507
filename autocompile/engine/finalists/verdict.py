"""The finalist round's verdict, pure: given the measured rows, which finalist wins and why.

No I/O and no trial running: the rows are built here from the runs the round made
(`finalists.round`), or from a stored round's trials (`rechosen`), and the winner chosen from them.
The reasons behind each rule are in docs/decisions.md.
"""

from __future__ import annotations

import functools
import statistics

from autocompile.engine.cost import added_s
from autocompile.engine.records import Record
from autocompile.engine.scoring import score
from autocompile.trial.protocol import REPLAY_VERSION
from autocompile.trial.result import Status

# choose_winner's rule; a stored verdict of an older rule is chosen again from its own rows (rechoose).
# 2: a runner-up's disagreement between its two runs no longer counts as noise against the leader.
# 3: each configuration's speed and score in the verdict, eager's alike, are the median of all its
#    measurements (its run in the search and its runs in the round; of two, their mean), not its
#    round's alone (`pooled`): one disturbed rerun must not hand the win to another.
# 4: two finalists within noise compare warm-ups on one footing: a warm-up reconstructed from cache
#    hits, against one measured cold, is scaled by what the round's cold runs showed of the
#    reconstruction (`expected_cold`).
# 5: where the round has no cold run of a reconstructed finalist to scale by, a reconstructed warm-up
#    counts as what the device's earlier cold runs of the model showed (`cold_scale`), as `cold_pick`
#    counted it when it chose which finalist to run cold.
# 6: where the horizon is the search's budget's (no --horizon-steps), two finalists within noise go to the
#    faster steady speed where it is ahead by more than the noise: for any run longer than that horizon it
#    wins; the shorter warm-up decides where the speeds are within noise too, or the user gave the horizon.
WINNER_RULE = 6


def reconstructed(trial) -> bool:
    """Whether a trial's warm-up was reconstructed from the shared cache's hits, not measured cold."""
    return Record.of(trial).warmup_kind == "reconstructed"


def choose_winner(
    rows: list[dict],
    eager_number: int,
    eager_score: float,
    horizon: int,
    scale: float = 1.0,
    prefer_speed: bool = False,
    footing: dict | None = None,
) -> dict:
    """The finalist round's verdict from its rows (trial, status, score, noise, spread, warmup_s):
    the best score, unless the top two are within noise (then the shorter warm-up), or eager
    scores above the chosen one. Returns winner, why, and the margin. A reconstructed warm-up counts
    as the round's cold runs measured the reconstruction, else as `scale` says (`expected_cold`).

    The noise is the leader's (its window spread or the gap between its two measurements, the
    larger) plus the runner-up's window spread: a runner-up whose own measurements disagree is
    less to be trusted, not a closer rival (WINNER_RULE 2). With `prefer_speed` (a horizon the budget
    gave, not the user), the faster steady speed first (WINNER_RULE 6). The rows of a round on several GPUs
    are on its reference GPU's footing (`footing`: `gpu_footing`), and its why says so."""
    ranked = sorted((row for row in rows if row["status"] == Status.OK), key=lambda row: row["score"], reverse=True)
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
            winner, why = _within_noise(rows, winner, second, margin, noise, scale, prefer_speed)
        else:
            why += f", {margin:.1%} ahead of trial {second['trial']} (noise {noise:.1%})"
    if eager_score > winner["score"]:
        why = (
            f"eager scores {eager_score:.3g} in the finalist round, above trial {winner['trial']}'s "
            f"{winner['score']:.3g}: at horizon {horizon} no compiled setting pays for its warm-up"
        )
        winner = {"trial": eager_number}
    return {**verdict, "winner": winner["trial"], "why": why + (on_footing(footing) if footing else "")}


def _within_noise(
    rows: list[dict], winner: dict, second: dict, margin: float, noise: float, scale: float, prefer_speed: bool = False
) -> tuple[dict, str]:
    """Of the top two within noise, with `prefer_speed` the faster where its steady speed is ahead by more
    than the noise; else the one with the shorter warm-up (each as a cold run would measure it:
    `expected_cold`); and why."""
    faster, slower = sorted((winner, second), key=lambda row: row.get("steps_per_s", 0), reverse=True)
    ahead = faster["steps_per_s"] / slower["steps_per_s"] - 1 if prefer_speed else 0.0
    if prefer_speed and ahead > noise:
        return faster, (
            f"trials {winner['trial']} and {second['trial']} are within noise ({margin:.1%} apart, noise "
            f"{noise:.1%}): trial {faster['trial']} wins with the faster steady speed ({ahead:.1%} ahead), "
            "which a run longer than the horizon this search's budget gave pays for"
        )
    ratio = _cold_ratio(rows)
    cold = functools.partial(expected_cold, ratio=ratio, scale=scale)
    quicker = min(winner, second, key=cold)
    why = (
        f"trials {winner['trial']} and {second['trial']} are within noise ({margin:.1%} apart, "
        f"noise {noise:.1%}): trial {quicker['trial']} wins with the shorter warm-up"
    )
    scaled = [row for row in (winner, second) if cold(row) != row["warmup_s"]]
    source = "the round's cold runs" if ratio else "earlier cold runs of this model"
    why += "".join(
        f" (trial {row['trial']}'s {row['warmup_s']:.1f} s reconstructed is {cold(row):.1f} s "
        f"as {source} measured the reconstruction)"
        for row in scaled
    )
    return quicker, why


def _cold_ratio(rows: list[dict]) -> float | None:
    """Cold over reconstructed warm-up, as the round's cold runs measured them (their median), or None."""
    ratios = [
        row["warmup_s"] / row["reconstructed_warmup_s"]
        for row in rows
        if row.get("status") == Status.OK and row.get("reconstructed_warmup_s")
    ]
    return statistics.median(ratios) if ratios else None


def expected_cold(row: dict, ratio: float | None, scale: float = 1.0) -> float:
    """A finalist's warm-up as a cold run would measure it: a reconstructed one scaled by `ratio` (the
    round's cold runs), else with the seconds its reconstruction added scaled by `scale` (`cold_scale`)."""
    if not row.get("warmup_reconstructed"):
        return row["warmup_s"]
    if ratio:
        return row["warmup_s"] * ratio
    return row["warmup_s"] + (scale - 1) * row.get("reconstruction_added_s", 0.0)


def pooled(measurements: list[dict], horizon: int, warmup_s: float | None = None) -> tuple[float, float]:
    """A configuration's steady speed and score from all its measurements (its run in the search and
    its runs in the round, records or trial attributes): the median of each, the mean of two. Each
    score is taken at `warmup_s` (a finalist's carried or cold warm-up), else at its own (eager's)."""
    paces = [m["steps_per_s"] for m in measurements]
    scores = [
        score({**m, "status": Status.OK, **({} if warmup_s is None else {"warmup_s": warmup_s})}, horizon) for m in measurements
    ]
    return statistics.median(paces), statistics.median(scores)


def gpu_footing(eager_runs: list[dict], gpus: dict[int, str]) -> dict:
    """How a round on several GPUs (`gpus`: each finalist's, by number, the first GPU's first) compares
    finalists measured on different ones: each GPU's finalists, its eager speed in the round (the median
    of its clean eager runs there), the reference GPU (the first with one), and each GPU's scale onto it,
    the reference's eager over its own (1 where its eager did not run cleanly). A finalist's round speeds
    times its GPU's scale are its ratio to its own GPU's eager times the reference's eager: GPUs of one
    host that run at different speeds (their clocks, their neighbours' load) compare as one. Warm-ups
    are taken as measured."""
    order = list(dict.fromkeys(gpus.values()))
    paces = {
        gpu: statistics.median(x["steps_per_s"] for x in eager_runs if x.get("gpu") == gpu)
        for gpu in order
        if any(x.get("gpu") == gpu for x in eager_runs)
    }
    reference = next((gpu for gpu in order if gpu in paces), None)
    return {
        "finalists": {gpu: [n for n, g in gpus.items() if g == gpu] for gpu in order},
        "reference": reference,
        "eager_steps_per_s": paces,
        "scales": {gpu: paces[reference] / paces[gpu] if gpu in paces else 1.0 for gpu in order},
    }


def on_footing(footing: dict) -> str:
    """What a verdict's why adds of a round on several GPUs (its `gpu_footing`)."""
    listed = "; ".join(
        f"GPU {gpu}: trial{'s' if len(ns) > 1 else ''} {', '.join(map(str, ns))}" for gpu, ns in footing["finalists"].items()
    )
    if footing["reference"] is None:
        return f" (the round ran on {len(footing['scales'])} GPUs at once, {listed}; no eager ran cleanly: speeds as measured)"
    eager = footing["eager_steps_per_s"]
    speeds = ", ".join(
        f"GPU {gpu}'s {eager[gpu]:.3g} steps/s"
        if gpu in eager
        else f"GPU {gpu}'s did not run cleanly (its finalists' speeds as measured)"
        for gpu in footing["scales"]
    )
    return (
        f" (the round ran on {len(footing['scales'])} GPUs at once, {listed}; each finalist beside its own GPU's "
        f"eager, its speeds in the round taken as their ratio to that eager times GPU {footing['reference']}'s "
        f"eager; eager ran {speeds})"
    )


def round_verdict(
    eager,
    finalists: list,
    runs: dict[int, list[dict]],
    rounds: int,
    horizon: int,
    scale: float,
    prefer_speed: bool = False,
    gpus: dict[int, str] | None = None,
) -> dict:
    """The round's verdict from its runs: each finalist's row and eager's speed and score, each from
    all its measurements (`pooled`: its run in the search and its runs in the round), and the winner.
    Where the round was given GPUs (`gpus`: each finalist's, by number, the first GPU's first), each row
    names its GPU; on several, each finalist's round runs are put on the reference GPU's footing
    (`gpu_footing`), and eager's are the reference GPU's."""
    eager_runs = [x for x in runs[eager.number] if x["status"] == Status.OK] if eager is not None else []
    where = gpu_footing(eager_runs, gpus) if gpus and len(set(gpus.values())) > 1 else None
    if where and where["reference"] is not None:
        eager_runs = [x for x in eager_runs if x.get("gpu") == where["reference"]]
    eager_measured = [Record.of(eager).attrs, *eager_runs] if eager_runs else []
    eager_pace, eager_score = pooled(eager_measured, horizon) if eager_measured else (None, 0.0)
    gpus, scales = gpus or {}, where["scales"] if where else {}
    rows = [
        _row(t, runs[t.number], eager_pace, horizon, gpus.get(t.number), scales.get(gpus.get(t.number), 1.0)) for t in finalists
    ]
    return {
        "finalists": [t.number for t in finalists],
        "rounds": rounds,
        "eager_steps_per_s": eager_pace,
        "eager_paces": [m["steps_per_s"] for m in eager_measured],
        "eager_score": eager_score,
        "candidates": rows,
        "numerics_guard": REPLAY_VERSION,
        "winner_rule": WINNER_RULE,
        **({"footing": where} if where else {}),
        **choose_winner(rows, eager.number if eager else None, eager_score, horizon, scale, prefer_speed, where),
    }


def _row(t, runs: list[dict], eager_pace: float | None, horizon: int, gpu: str | None = None, eager_scale: float = 1.0) -> dict:
    """A finalist's row in the verdict: its measurements in the search and in the round (on `gpu`, put on the
    reference GPU's footing by `eager_scale`: `gpu_footing`), their noise, and its speed and score from all of
    them (`pooled`)."""
    ok = [x for x in runs if x["status"] == Status.OK]
    where = {} if gpu is None else {"gpu": gpu, "eager_scale": eager_scale}
    if not runs:
        return {
            "trial": t.number,
            "config": Record.of(t).config,
            "status": Status.NOT_RUN,
            "reason": "no time left in the round",
            **where,
        }
    if not ok:
        return {
            "trial": t.number,
            "config": Record.of(t).config,
            "status": Status.FAILED_AGAIN,
            "reason": "; ".join(x.get("reason", "") for x in runs),
            **where,
        }
    cold = [x for x in ok if x.get("cold")]  # its warm-up measured cold in the round: that one stands
    warmup_s = statistics.mean(x["warmup_s"] for x in cold or ok)
    first = Record.of(t)
    row = {
        "trial": t.number,
        "config": first.config,
        "status": Status.OK,
        "reruns": [x["trial"] for x in ok],
        "search_steps_per_s": first.steps_per_s,
        "search_score": t.value,
        "warmup_s": warmup_s,
        **where,
    }
    if cold:
        row["reconstructed_warmup_s"] = first.warmup_s
    else:
        row["warmup_reconstructed"] = reconstructed(t)
        if reconstructed(t):
            row["reconstruction_added_s"] = added_s(t)
    return pool_row(row, [first.attrs, *(scaled(x, eager_scale) for x in ok)], eager_pace, horizon)


def scaled(measurement: dict, eager_scale: float) -> dict:
    """A round's measurement on the reference GPU's footing (`gpu_footing`): its speed times its GPU's scale."""
    if eager_scale == 1.0:
        return measurement
    return {**measurement, "steps_per_s": measurement["steps_per_s"] * eager_scale}


def pool_row(row: dict, measurements: list[dict], eager_pace: float | None, horizon: int) -> dict:
    """`row` with its speed, score and noise from `measurements` (its first run's, then its reruns')."""
    paces = [m["steps_per_s"] for m in measurements]
    steady, pooled_score = pooled(measurements, horizon, row["warmup_s"])
    agreement = (max(paces) - min(paces)) / statistics.mean(paces)
    spread = max(m.get("cv", 0) for m in measurements)
    return {
        **row,
        "paces": paces,
        "steps_per_s": steady,
        "score": pooled_score,
        "vs_eager": steady / eager_pace if eager_pace else None,
        "agreement": agreement,
        "spread": spread,
        "noise": max(agreement, spread),
    }


def measurements(trials: list, row: dict) -> list[dict]:
    """A finalist's measurements as its trials (the study's, by number) hold them: its first run's,
    then its reruns' (on a round of several GPUs, on the reference GPU's footing: `scaled`)."""
    scale = row.get("eager_scale", 1.0)
    return [Record.of(trials[row["trial"]]).attrs, *(scaled(Record.of(trials[n]).attrs, scale) for n in row["reruns"])]


def rechosen(verdict: dict, eager, trials: list, horizon: int, scale: float, prefer_speed: bool = False) -> dict:
    """A stored verdict of an older rule chosen again under WINNER_RULE from the round's own runs
    (`trials`: the study's, by number), without measuring: each candidate's speed, score and noise from
    its trials (`pooled`), eager's from its run in the search and its speed and score in the round."""
    eager_measured = [Record.of(eager).attrs]
    if verdict.get("eager_steps_per_s"):  # the round's eager, its warm-up eager's first
        eager_measured.append({**eager_measured[0], "steps_per_s": verdict["eager_steps_per_s"]})
    eager_pace, _ = pooled(eager_measured, horizon)
    eager_score = (
        statistics.median([eager.value, _round_eager_score(verdict, eager, trials)])
        if verdict.get("eager_steps_per_s")
        else eager.value
    )
    rows = [
        row
        if row["status"] != Status.OK
        else pool_row(
            {"warmup_reconstructed": not row.get("reconstructed_warmup_s") and reconstructed(trials[row["trial"]]), **row},
            measurements(trials, row),
            eager_pace,
            horizon,
        )
        for row in verdict["candidates"]
    ]
    kept = {k: v for k, v in verdict.items() if k not in ("margin", "noise", "within_noise", "winner", "why")}
    return {
        **kept,
        "candidates": rows,
        "eager_steps_per_s": eager_pace,
        "eager_score": eager_score,
        "eager_paces": [m["steps_per_s"] for m in eager_measured],
        "winner_rule": WINNER_RULE,
        **choose_winner(rows, eager.number, eager_score, horizon, scale, prefer_speed, verdict.get("footing")),
    }


def _round_eager_score(verdict: dict, eager, trials: list) -> float:
    """Eager's score in a stored round: as the verdict kept it, else (an older round kept eager's speed
    only) its rerun's, found by that speed."""
    eager_score = verdict.get("eager_score")
    if eager_score is None:
        records = [(t, Record.of(t)) for t in trials]
        reruns = [
            t.value for t, r in records if r.remeasure_of == eager.number and r.steps_per_s == verdict.get("eager_steps_per_s")
        ]
        eager_score = reruns[-1] if reruns else verdict.get("eager_steps_per_s") or 0.0
    return eager_score
