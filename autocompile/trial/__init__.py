"""One measurement in its own process: the parent's side (`process`: launch, limits, the kill of
the process group, events, the triage ladder) and the inside (`worker`: build, apply the snippet,
warm up, measure, replay), which agree on what `protocol` holds; what a trial reports, its status
and the fields of its result, is `result`.

`python -m autocompile.trial.worker SPEC.json` is the process a trial starts; nothing imports
`worker` in the parent. `prestart`: one process per search that imports torch once and forks
each compiled trial's process.
"""

from autocompile.trial.process import TrialRequest, pid_alive, reap_orphans, run_trial, stuck_in, triage
from autocompile.trial.protocol import die_with_parent
from autocompile.trial.result import RECORD_FIELDS

__all__ = ["RECORD_FIELDS", "TrialRequest", "die_with_parent", "pid_alive", "reap_orphans", "run_trial", "stuck_in", "triage"]
