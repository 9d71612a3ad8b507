"""Several workers on one study: on one host (journal file), against a PostgreSQL server, and a worker killed mid-trial."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import optuna
import pytest

from autocompile.storage import JOURNAL, load_study
from autocompile.study import SearchSettings
from autocompile.trial import pid_alive
from autocompile.workers import parse_gpus, search_on_workers
from conftest import FAST, HERE, toy

PG_BIN = "/usr/lib/postgresql/15/bin"
COUNTED = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
# Compiled trials are cut at 8 s (the baselines at 20 s): what is tested is who runs what, not speed;
# a whole-model compile that timed out makes the other whole-model configurations refused at no cost.
SEARCH = dict(model=toy(), device="cpu", trials=5, trial_timeout_s=8, baseline_timeout_s=20, measure=FAST, finalists=0)


@pytest.fixture(autouse=True)
def quick_heartbeat(monkeypatch):
    monkeypatch.setenv("AUTOCOMPILE_HEARTBEAT_S", "2")


def _counted(study) -> list:
    return [t for t in study.trials if t.state in COUNTED and t.user_attrs.get("role") != "finalist"]


def _config_key(trial) -> str:
    return json.dumps(trial.user_attrs["config"], sort_keys=True)


def _check_shared(study, trials: int) -> None:
    """Exactly `trials` counted, no configuration measured twice, both workers did some."""
    counted = _counted(study)
    assert len(counted) == trials, [(t.number, t.state.name, t.user_attrs.get("role")) for t in study.trials]
    keys = [_config_key(t) for t in counted]
    assert len(set(keys)) == len(keys)
    assert [t.user_attrs["role"] for t in counted[:1]] == ["eager"]
    assert len({t.user_attrs["worker"]["pid"] for t in counted}) == 2


def test_gpus_takes_a_count_or_a_list():
    assert parse_gpus("2") == ["0", "1"] and parse_gpus("0,2") == ["0", "2"] and parse_gpus("3,") == ["3"]
    with pytest.raises(Exception):
        parse_gpus("two")


def test_two_workers_on_one_host_share_a_study(tmp_path):
    settings = SearchSettings(study="two", directory=str(tmp_path), **SEARCH)
    summary = search_on_workers(settings, ["0", "1"])
    assert len(summary["rows"]) == settings.trials and all(r["status"] != "duplicate" for r in summary["rows"])
    _check_shared(load_study("two", JOURNAL + str(tmp_path / "two" / "journal.log")), settings.trials)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_postgres(*command: str) -> list[str]:
    """initdb and pg_ctl refuse to run as root: as root they run as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else list(command)


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL server of its own on 127.0.0.1 (the machine's PostgreSQL 15 binaries), its URL."""
    if not os.path.exists(os.path.join(PG_BIN, "initdb")):
        pytest.skip(f"no PostgreSQL 15 binaries in {PG_BIN} (.ci/run installs Debian's postgresql package)")
    pytest.importorskip("psycopg", reason="pip install autocompile[postgres]")
    folder = tempfile.mkdtemp(prefix="autocompile-pg-")
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
    data, port = os.path.join(folder, "data"), _free_port()
    subprocess.run(_as_postgres(f"{PG_BIN}/initdb", "-D", data, "-A", "trust", "-U", "postgres"), check=True,
                   capture_output=True)
    subprocess.run(_as_postgres(f"{PG_BIN}/pg_ctl", "-D", data, "-l", os.path.join(folder, "log"), "-w", "-o",
                                f"-p {port} -k {folder} -c listen_addresses=127.0.0.1", "start"),
                   check=True, capture_output=True)
    yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    subprocess.run(_as_postgres(f"{PG_BIN}/pg_ctl", "-D", data, "-m", "immediate", "stop"), capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def test_two_workers_share_a_study_on_postgresql(tmp_path, postgres):
    settings = SearchSettings(study="pg", directory=str(tmp_path), storage=postgres, **SEARCH)
    search_on_workers(settings, ["0", "1"])
    _check_shared(load_study("pg", postgres), settings.trials)


PARENT = """
import sys
sys.path.insert(0, {here!r})
from conftest import FAST, toy
from autocompile.study import SearchSettings
from autocompile.workers import search_on_workers
search_on_workers(SearchSettings(study="kill", directory={directory!r}, storage={storage!r}, **{search!r}), ["0", "1"])
"""


def _running_trial(study_dir: str, url: str, role: str):
    """(trial, its process's pid) of a running `role` trial whose process has started; None if none yet."""
    for t in load_study("kill", url).get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        path = os.path.join(study_dir, "trials", f"{t.number:04d}", "process.json")
        if t.user_attrs.get("role") == role and "worker" in t.user_attrs and os.path.exists(path):
            with open(path) as f:
                return t, json.load(f)["pid"]
    return None


def test_a_worker_killed_mid_trial_leaves_a_stale_trial_no_orphan_and_the_study_completes(tmp_path):
    url = JOURNAL + str(tmp_path / "kill" / "journal.log")
    search = {**SEARCH, "model": toy(), "measure": FAST}
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(here=HERE, directory=str(tmp_path), storage=url,
                                                                   search=search)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found, deadline = None, time.time() + 90
    while found is None and time.time() < deadline and parent.poll() is None:
        time.sleep(0.3)
        if os.path.exists(tmp_path / "kill" / "journal.log"):
            found = _running_trial(str(tmp_path / "kill"), url, "compile-defaults")
    assert found, "no compile-defaults trial was seen running"
    trial, pid = found
    os.kill(trial.user_attrs["worker"]["pid"], signal.SIGKILL)
    gone = time.time() + 10
    while pid_alive(pid) and time.time() < gone:
        time.sleep(0.1)
    assert not pid_alive(pid), "the trial process outlived its worker"
    out, _ = parent.communicate(timeout=150)
    assert parent.returncode == 0, out
    study = load_study("kill", url)
    stale = study.trials[trial.number]
    assert stale.state == optuna.trial.TrialState.FAIL and stale.user_attrs["reason"].startswith("stale"), out
    counted = _counted(study)
    assert len(counted) == SEARCH["trials"], out
    keys = [_config_key(t) for t in counted]
    assert len(set(keys)) == len(keys) and _config_key(stale) in keys  # tried again, once
