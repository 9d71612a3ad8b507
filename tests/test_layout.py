"""The package's layers and the docs hold: `lint-imports` keeps the contracts of pyproject.toml (a layer
imports only the layers below it, no import circles), `ruff check` finds nothing under the rules of
pyproject.toml and `ruff format --check` nothing to change, `mkdocs build --strict` builds docs/ (a
broken link or a page missing from the nav fails), and README stays a page read in minutes."""

import os
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
