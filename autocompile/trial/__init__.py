"""One measurement in its own process: the parent's side (`process`: launch, limits, the kill of
the process group, events, the triage ladder) and the inside (`worker`: build, apply the snippet,
warm up, measure, replay), which agree on what `protocol` holds; what a trial reports, its status
and the fields of its result, is `result`.

`python -m autocompile.trial.worker SPEC.json` is the process a trial starts; nothing imports
`worker` in the parent. `prestart`: the next trial's process, started ahead to do its imports
while the trial before it runs.
"""

from autocompile.trial.process import TrialRequest, die_with_parent, pid_alive, reap_orphans, run_trial, stuck_in, triage
from autocompile.trial.result import RECORD_FIELDS

__all__ = ["RECORD_FIELDS", "TrialRequest", "die_with_parent", "pid_alive", "reap_orphans", "run_trial", "stuck_in", "triage"]
