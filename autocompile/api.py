"""The search from Python, for notebooks: `autocompile.search("tiny-llama", trials=4, device="cpu")`.

Imports torch and Optuna only when called, so `import autocompile` stays light.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from autocompile.errors import UserError


@dataclass
class SearchResult:
    """What a search gives back: the winner (config and figures), its snippet, the Optuna study,
    and the whole summary (every trial's row, the finalist round, the horizon)."""

    summary: dict
    study: object = field(repr=False)

    @property
    def winner(self) -> dict | None:
        return self.summary["best"] and {k: v for k, v in self.summary["best"].items() if k != "snippet"}

    @property
    def snippet(self) -> str | None:
        return self.summary["best"] and self.summary["best"]["snippet"]


def study_name(model: str) -> str:
    """The default study name of a model: its name, or its file's or module's base name."""
    from autocompile.workloads.trainer import PREFIX

    model = model.removeprefix(PREFIX)  # --trainer FILE.py:FACTORY
    base = os.path.basename(model.split(":")[0]) if ":" in model else model
    return base.removesuffix(".py").replace(os.sep, "-")


def run(settings, verbosity: int = 1, gpus: list[str] | None = None) -> SearchResult:
    """Run (or resume) the search of `settings` (a SearchSettings) with the outputs a user gets:
    results.db and the dashboard's trial files kept up to date as trials finish, progress on
    stderr as verbose as asked. With several `gpus`, a worker process per GPU (autocompile.engine.workers),
    each keeping the same outputs up to date (`autocompile worker` gets them from `live_outputs`)."""
    from autocompile.outputs.dashboard import upload_study_files
    from autocompile.outputs.progress import progress_for
    from autocompile.outputs.table import search_summary
    from autocompile.engine.study import load_study, search_study, storage_url

    from autocompile.engine.settings import group_gpus

    if gpus and settings.device.startswith("cuda"):
        from autocompile.engine.workers import assign

        gpus = assign(gpus)  # within the GPUs this process was given (CUDA_VISIBLE_DEVICES)
    gpus = group_gpus(gpus, settings.nproc)  # --gpus 8 --nproc 2: four workers, two GPUs each
    workers = len(gpus or ())
    callbacks = live_outputs(settings.study_dir)
    if workers > 1:
        from autocompile.engine.workers import search_on_workers

        runner = search_on_workers(settings, gpus, verbosity, progress_for(verbosity, settings.trials), callbacks)
    else:
        if gpus and settings.device.startswith("cuda"):
            os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]  # --gpus 3,: that GPU only
        runner = search_study(settings, progress_for(verbosity, settings.trials), callbacks=callbacks)
    summary = search_summary(runner)
    study = load_study(settings.study, storage_url(settings.storage, settings.directory, settings.study, workers))
    upload_study_files(study, settings.study_dir)  # what the last callbacks could not see: the round's verdict
    return SearchResult(summary=summary, study=study)


def run_search(settings, progress=None, callbacks=()) -> dict:
    """Run (or resume) the search of `settings` in this process with only the given outputs (`callbacks`);
    its summary (see report.search_summary), the winner's files written beside the study."""
    from autocompile.outputs.table import search_summary
    from autocompile.engine.study import search_study

    return search_summary(search_study(settings, progress, callbacks))


def live_outputs(study_dir: str) -> list:
    """The callbacks (Optuna's signature) that keep what a user sees current as each trial finishes:
    results.db, and each trial's files with the winner's note in the dashboard's artifact store."""
    from autocompile.outputs.dashboard import ArtifactUploader
    from autocompile.outputs.results import FILE_NAME, ResultsTable

    return [ResultsTable(os.path.join(study_dir, FILE_NAME)), ArtifactUploader(study_dir)]


def search(
    model: str,
    trials: int = 10,
    device: str | None = None,
    study: str | None = None,
    directory: str = "studies",
    verbosity: int = 1,
    gpus: int | str | None = None,
    **options,
) -> SearchResult:
    """Search (or resume) as `autocompile search` does; `gpus` as --gpus (a count or "0,2"); `options`
    are SearchSettings' fields (timeout_s, trial_timeout_s, horizon, finalists, fixed, space_file, storage, ...)."""
    from autocompile.engine.settings import SearchSettings, resolve_device
    from autocompile.engine.workers import parse_gpus

    try:
        settings = SearchSettings(
            model=model,
            device=resolve_device(device),
            study=study or study_name(model),
            directory=directory,
            trials=trials,
            **options,
        )
    except TypeError as exc:  # an option SearchSettings does not have
        raise UserError(f"search(): {exc}") from None
    return run(settings, verbosity, gpus=None if gpus is None else parse_gpus(str(gpus)))
