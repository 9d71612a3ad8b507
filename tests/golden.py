"""What the outputs print for every committed study, kept as files: `python tests/golden.py` writes them
(tests/data/golden/), and test_golden.py checks that the commands print them byte for byte, so that a
change of the engine's inside (a move, a split, a rename) is seen to change nothing a user reads."""

from __future__ import annotations

import contextlib
import glob
import io
import os
import shutil
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


def committed_studies() -> list[tuple[str, str]]:
    """(folder, study name) of every study committed under studies/ (its study.db, or its journal.log)."""
    found = []
    for name in ("study.db", "journal.log"):  # a search on several GPUs keeps its study in a journal file
        for path in glob.glob(os.path.join(ROOT, "studies", "**", name), recursive=True):
            folder = os.path.dirname(path)
            found.append((os.path.dirname(folder), os.path.basename(folder)))
    return sorted(found)


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


def _outputs() -> dict[str, str]:
    found = {}
    for directory, study in committed_studies():
        label = os.path.relpath(os.path.join(directory, study), os.path.join(ROOT, "studies")).replace(os.sep, "__")
        for name, extra in (("best", []), ("best-json", ["--json"]), ("best-pareto", ["--pareto"])):
            found[f"{label}.{name}.txt"] = _run(["best", "--study", study, "--dir", directory, *extra])
        with tempfile.TemporaryDirectory() as scratch:
            shutil.copytree(
                os.path.join(directory, study),
                os.path.join(scratch, study),
                ignore=shutil.ignore_patterns("report", "results.db", "artifacts"),
            )
            _run(["report", "--study", study, "--dir", scratch])
            for written in ("trials.txt", "apply_compilation.py", os.path.join("report", "report.md")):
                path = os.path.join(scratch, study, written)
                found[f"{label}.report.{os.path.basename(written)}"] = open(path).read() if os.path.exists(path) else ""
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
