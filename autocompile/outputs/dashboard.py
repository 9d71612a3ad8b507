"""The study in optuna-dashboard: each trial's files as artifacts, and the winner as the study's note.

Every finished trial gets its files (the `apply_compilation.py` it ran, its log, its events,
its `result.json` with the recompile and graph-break reasons, the logs of its triage rungs, the
module-by-module comparison of a numerics failure, and `autocompile repro`'s repro when made)
in an Optuna artifact store beside the study, `DIR/STUDY/artifacts/`, so they open from the
trial's page. A trial that failed, recompiled or broke the graph also gets a tlparse report
of its TORCH_TRACE, when `tlparse` is installed (the search then asks each trial process for
a trace: see `tlparse_command`). `ArtifactUploader` does it as an Optuna callback after each
trial; `upload_study_files` does it for every finished trial of an existing study, once.

Optuna's `upload_artifact` records an artifact in the trial's system attributes, which a
finished trial refuses (UpdateFinishedTrialError), and callbacks only see finished trials.
So the files go through Optuna's `FileSystemArtifactStore` as designed, and each is
registered where optuna-dashboard also looks for a trial's artifacts: the study's system
attribute `dashboard:artifacts:<trial_id>:<artifact_id>` (the test opens one in a browser).
"""

from __future__ import annotations

import json
import mimetypes
import os
import shutil
import subprocess
import sys
import uuid

import optuna

from autocompile.engine.records import full_record, trial_folder
from autocompile.trial.result import FAILURES, Status

ARTIFACTS_DIR = "artifacts"  # DIR/STUDY/artifacts/
TRIAL_FILES = ("apply_compilation.py", "log.txt", "events.jsonl", "result.json", "log-hard-mark.txt")
# Made later, if at all: a numerics failure's comparison with eager (trial/divergence.py) and
# `autocompile repro`'s minified repro (outputs/repro.py), each in a folder of the trial's.
LATER_FILES = (
    ("divergence-log.txt", "divergence/log.txt"),
    ("divergence-result.json", "divergence/result.json"),
    ("repro.py", "repro/repro.py"),
    ("minifier_launcher.py", "repro/minifier_launcher.py"),
    ("minifier_launcher_does_not_fail.py", "repro/minifier_launcher_does_not_fail.py"),
    ("minifier-log.txt", "repro/minifier-log.txt"),
    ("repro-summary.json", "repro/summary.json"),
    ("repro-rerun-log.txt", "repro/run/log.txt"),
)
TRACE_DIR, REPORT_DIR = "trace", "tlparse"  # in a trial's folder: TORCH_TRACE's logs, tlparse's report
# Shown by a browser rather than downloaded.
MIMETYPES = {
    ".py": "text/plain",
    ".txt": "text/plain",
    ".jsonl": "text/plain",
    ".json": "application/json",
    ".html": "text/html",
    ".zip": "application/zip",
}
# A trial whose trace is worth a report: it failed, timed out or was judged infeasible.
FAILED = (*FAILURES, Status.TIMEOUT, Status.INFEASIBLE)
_TRIAL_KEY = "dashboard:artifacts:{trial_id}:"  # optuna-dashboard's key for a trial's artifact, in the study


def artifact_store(study_dir: str) -> optuna.artifacts.FileSystemArtifactStore:
    path = os.path.join(study_dir, ARTIFACTS_DIR)
    os.makedirs(path, exist_ok=True)
    return optuna.artifacts.FileSystemArtifactStore(path)


trial_dir = trial_folder  # a trial's folder: DIR/STUDY/trials/NNNN


def tlparse_command() -> str | None:
    """The tlparse executable (on PATH or beside this Python), or None: no trace reports then."""
    return shutil.which("tlparse") or shutil.which("tlparse", path=os.path.dirname(sys.executable))


def needs_trace_report(attrs: dict) -> bool:
    """A trial whose compile is worth reading: it failed, recompiled or broke the graph."""
    return attrs.get("status") in FAILED or bool(attrs.get("recompiles")) or bool(attrs.get("graph_breaks"))


def write_trace_report(folder: str) -> list[tuple[str, str]]:
    """tlparse's report of a trial's TORCH_TRACE, as (artifact name, path): its index page and
    the whole report zipped (its other pages are linked from the index); the trace stays in
    the trial's folder. [] without a trace or tlparse."""
    trace, report = os.path.join(folder, TRACE_DIR), os.path.join(folder, REPORT_DIR)
    tlparse = tlparse_command()
    logs = [os.path.join(trace, name) for name in os.listdir(trace)] if os.path.isdir(trace) else []
    if logs and tlparse and not os.path.exists(os.path.join(report, "index.html")):
        last = max(logs, key=os.path.getmtime)  # the measured run (a hard mark_dynamic's retry writes a second log)
        subprocess.run([tlparse, last, "-o", report, "--overwrite", "--no-browser"], capture_output=True, timeout=300)
    if not os.path.exists(os.path.join(report, "index.html")):
        return []
    archive = report + ".zip"
    if not os.path.exists(archive):
        shutil.make_archive(report, "zip", report)
    return [("tlparse.html", os.path.join(report, "index.html")), ("tlparse.zip", archive)]


def trial_files(folder: str, attrs: dict) -> list[tuple[str, str]]:
    """A trial's files, as (artifact name, path): those that exist and are not empty."""
    files = [(name, os.path.join(folder, name)) for name in TRIAL_FILES]
    files += [(name, os.path.join(folder, path)) for name, path in LATER_FILES]
    for rung in attrs.get("triage") or []:
        files.append((f"triage-{rung['backend']}-log.txt", os.path.join(folder, f"triage-{rung['backend']}", "log.txt")))
    if needs_trace_report(attrs):
        files += write_trace_report(folder)
    else:
        shutil.rmtree(os.path.join(folder, TRACE_DIR), ignore_errors=True)  # a clean compile: nothing to read
    return [(name, path) for name, path in files if os.path.isfile(path) and os.path.getsize(path)]


def uploaded(study, trial) -> dict[str, str]:
    """The artifacts a trial has already: file name -> artifact id."""
    prefix = _TRIAL_KEY.format(trial_id=trial._trial_id)
    attrs = study._storage.get_study_system_attrs(study._study_id)
    metas = [json.loads(value) for key, value in attrs.items() if key.startswith(prefix)]
    return {meta["filename"]: meta["artifact_id"] for meta in metas}


def _attach(study, trial, store, name: str, path: str) -> str:
    """Write one file to the store and register it as an artifact of a (finished) trial."""
    artifact_id = str(uuid.uuid4())
    guessed, encoding = mimetypes.guess_type(name)
    mimetype = MIMETYPES.get(os.path.splitext(name)[1]) or guessed or "application/octet-stream"
    with open(path, "rb") as f:
        store.write(artifact_id, f)
    meta = {"artifact_id": artifact_id, "filename": name, "mimetype": mimetype, "encoding": encoding}
    study._storage.set_study_system_attr(
        study._study_id, _TRIAL_KEY.format(trial_id=trial._trial_id) + artifact_id, json.dumps(meta)
    )
    return artifact_id


def upload_trial_files(study, trial, study_dir: str, store=None) -> list[str]:
    """Upload a finished trial's files that it does not have yet; returns their names."""
    folder = trial_dir(study_dir, trial.number)
    if not trial.state.is_finished() or not os.path.isdir(folder):
        return []  # running, or rejected before launch: no files
    store = store or artifact_store(study_dir)
    have = uploaded(study, trial)
    names = []
    for name, path in trial_files(folder, full_record(trial, study_dir)):
        if name not in have:
            _attach(study, trial, store, name, path)
            names.append(name)
    return names


def upload_study_files(study, study_dir: str) -> int:
    """Upload the files of every finished trial of a study (none twice), then the winner's note.
    Returns how many files were uploaded."""
    store = artifact_store(study_dir)
    count = sum(len(upload_trial_files(study, t, study_dir, store)) for t in study.get_trials(deepcopy=False))
    save_winner_note(study, study_dir)
    return count


class ArtifactUploader:
    """Optuna callback: the files of each trial as it finishes, and the winner's note kept current."""

    def __init__(self, study_dir: str):
        self.study_dir, self.store = study_dir, None  # made with the first trial: bad input leaves no folder

    def __call__(self, study, frozen_trial) -> None:
        self.store = self.store or artifact_store(self.study_dir)
        upload_trial_files(study, frozen_trial, self.study_dir, self.store)
        save_winner_note(study, self.study_dir)


def winner_note(study, study_dir: str | None = None) -> str:
    """The study page's note (Markdown): the current winner, its speed-ups and its snippet (whole
    from the trial's result.json in study_dir: the study holds only its start)."""
    from autocompile.outputs.table import format_best, format_finalists, summarize

    summary = summarize(study, study_dir)  # writes nothing
    best = summary["best"]
    if best is None:
        return f"# {study.study_name}\n\nNo trial has run cleanly yet."
    lines = [f"# {study.study_name}: the winner at a horizon of {summary['horizon']} steps", "", format_best(best), ""]
    if summary.get("finalists"):
        lines += ["```", format_finalists(summary["finalists"]), "```", ""]
    lines += [
        f"The snippet (trial {best['number']}'s files hold the code it ran, its log and its reasons):",
        "",
        "```python",
        best["snippet"].rstrip(),
        "```",
    ]
    return "\n".join(lines)


def save_winner_note(study, study_dir: str | None = None) -> None:
    """Write the winner's note on the study page, unless it says that already (or
    optuna-dashboard, whose format the note has, is not installed)."""
    try:
        from optuna_dashboard import get_note, save_note
    except ImportError:
        return
    body = winner_note(study, study_dir)
    if get_note(study) != body:
        save_note(study, body)


def serve(study, url: str, study_dir: str, host: str = "127.0.0.1", port: int = 8080) -> None:
    """Upload what is missing, then serve the study with its artifact store (blocks): optuna-dashboard's
    WSGI app, its importances answered as the report has them (`without_flat_importances`)."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    import optuna_dashboard

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:  # not a line per request on the terminal
            pass

    upload_study_files(study, study_dir)
    storage = study._storage if url.startswith("journal:") else url  # a journal file has no URL Optuna knows
    app = optuna_dashboard.wsgi(storage, artifact_store=artifact_store(study_dir))
    make_server(host, port, without_flat_importances(app, study), handler_class=Quiet).serve_forever()


def without_flat_importances(app, study):
    """The dashboard's app, but for a study whose parameter importances Optuna cannot tell apart it
    draws none: optuna-dashboard then draws 1/n for every parameter, which says nothing
    (`plots.param_importances`, as the report has them)."""
    path = f"/api/studies/{study._study_id}/param_importances"

    def wrapped(environ, start_response):
        from autocompile.outputs.plots import param_importances

        if environ.get("PATH_INFO") == path and not param_importances(study):
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps({"param_importances": [[] for _ in study.directions]}).encode()]
        return app(environ, start_response)

    return wrapped
