"""Where a study lives and how several processes share it: which Optuna storage, the study-wide lock, stale trials.

- one process: the embedded SQLite file, sqlite:///DIR/STUDY/study.db (the default);
- several processes on one host: Optuna's JournalStorage on a file, journal:///DIR/STUDY/journal.log
  (Optuna's documentation recommends it over SQLite when processes write concurrently);
- several hosts: an RDB server, e.g. postgresql+psycopg://user@host/db (`pip install autocompile[postgres]`).

Trials are claimed under a study-wide lock (`claim_lock`): a file lock beside a file storage, a
PostgreSQL advisory lock on a server, so no two workers start the same configuration. A worker that
dies mid-trial leaves its trial RUNNING: on an RDB storage Optuna's heartbeat finds it stale
(`fail_stale_trials`); Optuna's JournalStorage has no heartbeat, so on one host the trial's worker pid
is checked instead. Either way the trial is failed and its configuration enqueued again
(Optuna's `RetryHeartbeatStaleTrialCallback`), once.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import warnings
import zlib

import optuna

from autocompile.errors import UserError
from autocompile.engine.records import Record, Role
from autocompile.trial import pid_alive

JOURNAL = "journal://"  # journal:///abs/path/journal.log: Optuna's JournalStorage on that file
HEARTBEAT_ENV = "AUTOCOMPILE_HEARTBEAT_S"
DEFAULT_HEARTBEAT_S = 30
RETRIES = 1  # a configuration whose worker died is tried again once
ATTEMPTS = 8  # opening a storage or study that another process is creating


def check_study_name(name: str) -> str:
    """A study name is a name: it becomes the folder DIR/NAME, so no path separator and no '..'."""
    if not name or name in (".", "..") or any(sep and sep in name for sep in ("/", os.sep, os.altsep)):
        raise UserError(
            f"study name {name!r}: a study name is a plain name (its files go to DIR/NAME/), "
            "without '/' or '..'; choose the folder with --dir"
        )
    return name


def storage_url(settings_storage: str | None, directory: str, study: str, workers: int = 1) -> str:
    """The given URL, else the study's file in DIR/STUDY: its journal if it has one (or several
    workers start a new study), else its SQLite file."""
    check_study_name(study)
    if settings_storage:
        return settings_storage
    folder = os.path.abspath(os.path.join(directory, study))
    journal, sqlite = os.path.join(folder, "journal.log"), os.path.join(folder, "study.db")
    if os.path.exists(journal) or (workers > 1 and not os.path.exists(sqlite)):
        return JOURNAL + journal
    return "sqlite:///" + sqlite


def storage_file(url: str) -> str | None:
    """The local file of a SQLite or journal URL (None for a server)."""
    for prefix in ("sqlite:///", JOURNAL):
        if url.startswith(prefix):
            return url[len(prefix) :]
    return None


def heartbeat_s() -> int:
    """Seconds between a running trial's heartbeats ($AUTOCOMPILE_HEARTBEAT_S, default 30); stale after twice that."""
    try:
        return max(1, int(float(os.environ.get(HEARTBEAT_ENV, DEFAULT_HEARTBEAT_S))))
    except ValueError:
        raise UserError(f"${HEARTBEAT_ENV} must be a number of seconds, not {os.environ[HEARTBEAT_ENV]!r}") from None


def _retry_callback():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=RETRIES)


def _rdb(url: str):
    beat = heartbeat_s()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.storages.RDBStorage(
            url, heartbeat_interval=beat, grace_period=2 * beat, heartbeat_stale_trial_callback=_retry_callback()
        )


def _journal(path: str):
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    return optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))


def _racing(error: Exception) -> bool:
    """Two processes creating the same schema or study at once: the loser tries again."""
    text = str(error)
    return (
        "IntegrityError" in type(error).__name__
        or isinstance(error, optuna.exceptions.DuplicatedStudyError)
        or any(sign in text for sign in ("already exists", "database is locked", "UNIQUE constraint"))
    )


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def open_storage(url: str, create_dir: str | None = None):
    """The Optuna storage of `url` (RDB storages with heartbeats); a one-line error if it cannot be opened.
    `create_dir` is made when the storage file lies in it (a file named elsewhere must find its folder)."""
    path = storage_file(url)
    if path and create_dir and os.path.dirname(os.path.abspath(path)) == os.path.abspath(create_dir):
        os.makedirs(create_dir, exist_ok=True)
    for attempt in range(ATTEMPTS):
        try:
            if url.startswith(JOURNAL):
                return _journal(storage_file(url))
            if url.startswith(("sqlite", "postgresql", "mysql")):
                return _rdb(url)
            return optuna.storages.get_storage(url)
        except Exception as exc:
            if _racing(exc) and attempt < ATTEMPTS - 1:
                time.sleep(0.2 * (attempt + 1))
                continue
            raise UserError(f"cannot open storage {url}: {_first_line(exc)}") from None


def create_or_load(name: str, storage, **kwargs):
    """optuna.create_study(load_if_exists=True), tried again when another process created it first."""
    for attempt in range(ATTEMPTS):
        try:
            return optuna.create_study(study_name=name, storage=storage, load_if_exists=True, **kwargs)
        except Exception as exc:
            if not _racing(exc) or attempt == ATTEMPTS - 1:
                raise
            time.sleep(0.2 * (attempt + 1))


def load_study(name: str, url: str, folder: bool = False, **kwargs):
    """The study `name` in `url`. With `folder` (the URL is DIR/NAME's own file), the one study the
    file holds answers to the folder's name too: a workload's folder keeps its study under the name it ran under."""
    storage = open_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage, **kwargs)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        if folder and len(names) == 1:
            return optuna.load_study(study_name=names[0], storage=storage, **kwargs)
        raise UserError(f"no study named {name!r} in {url}" + (f"; studies there: {', '.join(names)}" if names else "")) from None


def this_boot() -> str | None:
    """This machine since its last boot (Linux's boot id), None where unknown. Leased GPU machines
    share one host name ("vm"), so two measurements come from one machine only if their boots match:
    a workload bound by the host runs at different speeds on two of them (the captioner's eager: 8.2
    and 13.3 steps/s on two machines of one kind)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def same_machine(a: dict | None, b: dict | None) -> bool | None:
    """Whether two records ("worker" attrs, screen records) were made on one machine; None where
    either does not say."""
    if not a or not b or not a.get("boot") or not b.get("boot"):
        return None
    return a["boot"] == b["boot"]


def this_worker() -> dict:
    """What a trial records of the process running it (user attr "worker"), the machine's boot too, and the
    GPU (or CPU worker) of a search on several that started it (`workers.run_workers`)."""
    gpu = os.environ.get("AUTOCOMPILE_WORKER")
    return {"host": socket.gethostname(), "pid": os.getpid(), "boot": this_boot(), **({"gpu": gpu} if gpu else {})}


def _dead_here(trial) -> bool:
    worker = Record.of(trial).worker or {}
    return worker.get("host") == socket.gethostname() and worker.get("pid") != os.getpid() and not pid_alive(worker["pid"])


def _fail_dead_workers(study) -> int:
    """A storage without heartbeats (the journal): RUNNING trials whose worker on this host is dead
    are failed and their configuration enqueued again, as Optuna's heartbeat would."""
    failed = 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if not _dead_here(trial):
            continue
        storage = study._storage
        storage.set_trial_user_attr(trial._trial_id, "reason", f"stale: its worker (pid {Record.of(trial).worker['pid']}) died")
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            if storage.set_trial_state_values(trial._trial_id, state=optuna.trial.TrialState.FAIL):
                _retry_callback()(study, storage.get_trial(trial._trial_id))
                failed += 1
    return failed


def fail_stale(study) -> int:
    """Fail the trials of dead workers (Optuna's heartbeat, or the pid on one host); how many."""
    running = lambda: len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))  # noqa: E731
    before = running()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental API
        optuna.storages.fail_stale_trials(study)
    return before - running() + _fail_dead_workers(study)


@contextlib.contextmanager
def file_lock(path: str):
    """An exclusive lock on `path` (made if missing) among the processes of this host."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def claim_lock(storage, url: str, study_name: str):
    """The study-wide lock under which a worker chooses and claims its next trial."""
    path = storage_file(url)
    if path:
        with file_lock(os.path.join(os.path.dirname(path), "claims.lock")):
            yield
    elif url.startswith("postgresql"):
        yield from _advisory_lock(storage, study_name)
    else:
        yield  # another server: no lock (a configuration may rarely run twice)


def _advisory_lock(storage, study_name: str):
    """PostgreSQL's session advisory lock, keyed by the study's name."""
    from sqlalchemy import text

    key = zlib.crc32(("autocompile:" + study_name).encode())
    with storage.engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
        try:
            yield
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            connection.commit()


def counted(study) -> int:
    """Trials that count against the study's budget: finished ones that ran or were refused, and
    running ones (claimed); not failed ones (interrupted, cut by --timeout, duplicates), not the finalist round's."""
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.RUNNING)
    return sum(Record.of(t).role != Role.FINALIST for t in study.get_trials(deepcopy=False, states=states))


def set_budget(study, trials: int, deadline: float | None, gpus: int = 1) -> dict:
    """The study's budget, read by every worker: this many counted trials in all, until `deadline` (epoch s),
    the finalist round then run on `gpus` GPUs at once (its reserve is what the longest GPU's share takes)."""
    budget = {"trials": trials, "deadline": deadline, **({"gpus": gpus} if gpus > 1 else {})}
    study.set_user_attr("budget", budget)
    return budget
