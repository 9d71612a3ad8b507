"""Run the numerics replay alone for trials of a study, and print the verdict it gives.

For a configuration measured before the current replay existed: nothing is measured again.
    python scripts/replay_check.py studies/captioner 21 19
Prints one line per trial and writes DIR/replay-check-NNNN/result.json for each.
"""

import json
import os
import sys

from autocompile.engine.scoring import numerics_verdict
from autocompile.engine.study import load_study
from autocompile.trial import TrialRequest, run_trial


def main(study_dir: str, numbers: list[int]) -> None:
    name = os.path.basename(os.path.normpath(study_dir))
    study = load_study(name, "sqlite:///" + os.path.abspath(os.path.join(study_dir, "study.db")))
    settings = study.user_attrs["settings"]
    for number in numbers:
        config = study.trials[number].user_attrs["config"]
        request = TrialRequest(
            model=settings["model"],
            config=config,
            device=settings["device"],
            trial_dir=os.path.join(study_dir, f"replay-check-{number:04d}"),
            batch_size=settings["batch_size"],
            seq_len=settings["seq_len"],
            seed=settings["seed"],
            timeout_s=900,
            measure={"replay_only": True},
        )
        record = run_trial(request)
        verdict = numerics_verdict(record, None, settings["device"]) if record["status"] == "ok" else None
        print(
            json.dumps(
                {
                    "trial": number,
                    "status": record["status"],
                    "reason": record.get("reason", "")[:200],
                    "wall_s": round(record["wall_s"], 1),
                    "verdict": verdict,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1], [int(n) for n in sys.argv[2:]])
