"""The package's layers and the docs hold: `lint-imports` keeps the contracts of pyproject.toml (a layer
imports only the layers below it, no import circles), `ruff check` finds nothing under the rules of
pyproject.toml and `ruff format --check` nothing to change, `mkdocs build --strict` builds docs/ (a
broken link or a page missing from the nav fails), and README stays a page read in minutes."""

import os
import re
import subprocess
import sys

from conftest import ROOT


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)


def test_the_import_contracts_are_kept():
    done = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_ruff_finds_nothing():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache"],  # the whole repository, as pyproject.toml scopes it
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_the_code_is_as_ruff_formats_it():
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_the_docs_build_strictly(tmp_path):
    done = subprocess.run(
        [_tool("mkdocs"), "build", "--strict", "-q", "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "architecture" / "index.html").exists()


def test_the_readme_is_short():
    with open(os.path.join(ROOT, "README.md")) as f:
        assert len(f.read().splitlines()) <= 250


def test_ci_runs_readme_s_two_commands_in_order():
    """.ci/run does what a newcomer does in one clone: README's first set-up command (the search), then its
    second (the tests), each as README writes it."""
    with open(os.path.join(ROOT, "README.md")) as f:
        setup = next(part for part in f.read().split("\n## ") if part.startswith("Set-up"))
    blocks = re.findall(r"```bash\n(.*?)```", setup, re.S)
    search, tests = (block.strip() for block in blocks[:2])
    assert search == "bash scripts/quickstart.sh" and "pytest" in tests
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        lines = [line.strip() for line in f]
    assert search in lines and tests in lines and lines.index(search) < lines.index(tests)
