"""Re-judging the numerics of trials measured under an older numerics guard, without measuring again.

Optuna keeps a finished trial as it was told, so a new verdict comes as a new trial: the same
configuration and measurement (speed, warm-up, memory), the current guard's replay, and
`rejudged_from` naming the trial it re-judges. The original stays in the study, as it was.
"""

from __future__ import annotations

import json
import os

import optuna

from autocompile.engine.records import Record, full_record, save_record, to_attrs, trial_folder
from autocompile.engine.scoring import _judged_by_an_older_guard, judge, score, violation
from autocompile.engine.studyview import eager_record
from autocompile.trial import TrialRequest, run_trial
from autocompile.trial.result import Status

# What the new trial does not copy from the original: its verdict, and what follows from it.
_VERDICT_KEYS = ("status", "reason", "numerics", "score", "replay", "over_memory_gb")


def to_rejudge(study) -> list:
    """Trials that ran to a measurement and were made infeasible by an older numerics guard,
    and are not re-judged yet."""
    records = [Record.of(t) for t in study.trials]
    done = {r.attrs.get("rejudged_from") for r in records}
    return [
        t
        for t, r in zip(study.trials, records)
        if t.state == optuna.trial.TrialState.COMPLETE and t.number not in done and r.steps_per_s and _judged_by_an_older_guard(r)
    ]


def rejudge(study, study_dir: str, timeout_s: float = 900.0, dry_run: bool = False, say=print) -> list[dict]:
    """Replay each distinct configuration of `to_rejudge(study)` with the current guard and add
    the re-judged trials; returns their records."""
    settings, horizon = study.user_attrs["settings"], study.user_attrs.get("horizon", 1000)
    eager, replays, records = eager_record(study), {}, []
    for original in to_rejudge(study):
        first = Record.of(original)
        say(f"trial {original.number}: {first.reason[:120]}")
        if dry_run:
            continue
        config = first.config
        key = json.dumps(config, sort_keys=True)
        if key not in replays:
            request = TrialRequest(
                model=settings["model"],
                config=config,
                device=settings["device"],
                trial_dir=os.path.join(study_dir, "trials", f"rejudge-{original.number:04d}"),
                batch_size=settings["batch_size"],
                seq_len=settings["seq_len"],
                seed=settings["seed"],
                timeout_s=timeout_s,
                measure={"replay_only": True},
                nproc=settings.get("nproc", 1),
                parallel=settings.get("parallel", "none"),
            )
            replays[key] = run_trial(request)
        replayed = replays[key]
        if replayed["status"] != Status.OK or "error" in replayed.get("replay", {}):
            say(f"  the replay did not finish: {replayed.get('reason') or replayed.get('replay')}")
            continue
        measured = {k: v for k, v in full_record(original, study_dir).items() if k not in _VERDICT_KEYS}
        record = judge(
            {**measured, "status": Status.OK, "reason": "", "replay": replayed["replay"]}, eager, settings["device"], None
        )
        record["score"] = score(record, horizon)
        record["rejudged_from"] = original.number
        record["notes"] = list(record.get("notes", [])) + [
            f"re-judged from trial {original.number}: its measurement, the numerics of the current replay"
        ]
        save_record(trial_folder(study_dir, len(study.trials)), record)  # the number add_trial gives it
        study.add_trial(
            optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE,
                value=record["score"],
                params=original.params,
                distributions=original.distributions,
                user_attrs=to_attrs(record),
                system_attrs={"constraints": [violation(record)]},
            )
        )
        say(
            f"  re-judged as trial {len(study.trials) - 1}: {record['status']}"
            + (f" ({record['reason'][:120]})" if record["reason"] else "")
            + f", numerics {record['numerics']['max_rel_diff']:.2%} off (tolerance {record['numerics']['tolerance']:.0%})"
        )
        records.append(record)
    return records
