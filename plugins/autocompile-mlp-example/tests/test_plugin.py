"""The example plugin works through every way a workload is named."""

import json
import os
import subprocess
import sys
import tomllib

import pytest

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(HERE))


def autocompile(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "autocompile", *args], capture_output=True, text=True, env=env)


def test_entry_point_names_the_factory():
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        entry = tomllib.load(f)["project"]["entry-points"]["autocompile.workloads"]["mlp-example"]
    sys.path.insert(0, HERE)
    import importlib

    module, attr = entry.split(":")
    workload = getattr(importlib.import_module(module), attr)()
    assert workload.name == "mlp-example" and not workload.varying


def test_a_compiled_trial_of_the_plugin_runs():
    out = autocompile(
        "trial",
        "--model",
        "autocompile_mlp_example:mlp_example",
        "--device",
        "cpu",
        "--config",
        '{"scope": "regional"}',
        "--json",
    )
    assert out.returncode == 0, out.stderr[-2000:]
    record = json.loads(out.stdout)
    assert record["status"] == "ok" and record["steps_per_s"] > 0
    assert record["regions"] == ["blocks"]


def test_installed_plugin_is_listed():
    from importlib.metadata import entry_points

    if "mlp-example" not in {ep.name for ep in entry_points(group="autocompile.workloads")}:
        pytest.skip("plugin not installed (.ci/run installs it)")
    out = autocompile("models")
    assert "mlp-example" in out.stdout
