"""What the outputs print for every committed study, kept as files: `python tests/golden.py` writes them
(tests/data/golden/), and test_golden.py checks that the commands print them byte for byte, so that a
change of the engine's inside (a move, a split, a rename) is seen to change nothing a user reads."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GOLDEN = os.path.join(HERE, "data", "golden")
SPACES = [
    "tiny-llama",
    "tiny-captioner",
    "tiny-lora",
    os.path.join(HERE, "toy_workloads.py") + ":toy",
    os.path.join(HERE, "toy_workloads.py") + ":toy_checkpointed",
]


def tracked(root: str = ROOT, under: str = "studies") -> list[str]:
    """The files git tracks under root/under, relative to root: what a clone holds, never what a user's
    searches, reports or installs wrote beside them (the quickstart's study goes to studies/tiny-llama/)."""
    done = subprocess.run(["git", "-C", root, "ls-files", "-z", "--", under], capture_output=True, text=True, check=True)
    return sorted(path for path in done.stdout.split("\0") if path and os.path.exists(os.path.join(root, path)))


def committed_studies(root: str = ROOT) -> list[tuple[str, str]]:
    """(folder, study name) of every study committed under studies/ (its study.db, or its journal.log)."""
    found = []
    for path in tracked(root):
        if os.path.basename(path) in ("study.db", "journal.log"):  # a search on several GPUs keeps its study in a journal file
            folder = os.path.dirname(os.path.join(root, path))
            found.append((os.path.dirname(folder), os.path.basename(folder)))
    return sorted(found)


def label(directory: str, study: str, root: str = ROOT) -> str:
    """A study's name in tests/data/golden/: its folder under studies/, with __ for each /."""
    return os.path.relpath(os.path.join(directory, study), os.path.join(root, "studies")).replace(os.sep, "__")


def _run(args: list[str]) -> str:
    from autocompile.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return f"exit {code}\n--- stdout\n{out.getvalue()}--- stderr\n{err.getvalue()}"


@contextlib.contextmanager
def _figures_not_drawn():
    """`report`'s figures built but not drawn: each PNG is written empty. Drawing them took two thirds of
    these outputs' time (matplotlib's layout and rasteriser, 2026-11-27), and no text depends on a
    figure's pixels; the figures are checked drawn by test_outputs.py and test_scale.py."""
    from autocompile.outputs import plots

    def touch(figure, path):
        open(path, "wb").close()

    drawing, plots._save = plots._save, touch
    try:
        yield
    finally:
        plots._save = drawing


def outputs() -> dict[str, str]:
    """File name -> what it holds: each study's best, best --json, best --pareto and the table and files
    `report` writes (in a copy of the study, its figures not drawn), and `space` of the CPU workloads."""
    with _figures_not_drawn():
        return _outputs()


def _copy_tracked(folder: str, into: str) -> None:
    """The files git tracks in a study's folder, copied into `into`: not its report, results.db or artifacts
    (what `report` writes again), nor what a user's own runs added to the folder."""
    below = os.path.relpath(folder, ROOT)
    for path in tracked(ROOT, below):
        inside = os.path.relpath(path, below)
        if {"report", "results.db", "artifacts"} & set(inside.split(os.sep)):
            continue
        os.makedirs(os.path.dirname(os.path.join(into, inside)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), os.path.join(into, inside))


def _outputs() -> dict[str, str]:
    found = {}
    for directory, study in committed_studies():
        name_of = label(directory, study)
        for name, extra in (("best", []), ("best-json", ["--json"]), ("best-pareto", ["--pareto"])):
            found[f"{name_of}.{name}.txt"] = _run(["best", "--study", study, "--dir", directory, *extra])
        with tempfile.TemporaryDirectory() as scratch:
            _copy_tracked(os.path.join(directory, study), os.path.join(scratch, study))
            _run(["report", "--study", study, "--dir", scratch])
            for written in ("trials.txt", "apply_compilation.py", os.path.join("report", "report.md")):
                path = os.path.join(scratch, study, written)
                found[f"{name_of}.report.{os.path.basename(written)}"] = open(path).read() if os.path.exists(path) else ""
    for model in SPACES:
        name = os.path.basename(model).replace(":", "-").replace(".py", "")
        found[f"space.{name}.txt"] = _run(["space", "--model", model, "--device", "cpu"]).replace(HERE, "TESTS")
    return found


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    os.makedirs(GOLDEN, exist_ok=True)
    written = outputs()
    stale = sorted(set(os.listdir(GOLDEN)) - set(written))  # a study moved or renamed since they were written
    for name in stale:
        os.remove(os.path.join(GOLDEN, name))
    for name, text in written.items():
        with open(os.path.join(GOLDEN, name), "w") as f:
            f.write(text)
    print(f"wrote {len(written)} files in {GOLDEN}" + (f", removed {len(stale)} no study makes" if stale else ""))
