"""Every committed study's outputs (best, best --json, best --pareto, the table and files `report` writes)
and `space` of the CPU workloads print byte for byte what tests/data/golden/ holds: what they printed before
the engine's inside was last reorganised. An intended change of an output regenerates the files
(`python tests/golden.py`) in the commit that makes it. The studies are those git tracks: what a user's
own searches leave in the clone (README's quickstart writes studies/tiny-llama/) changes no verdict."""

import glob
import os
import shutil
import subprocess

import pytest

from conftest import ROOT, replayed_studies
from golden import GOLDEN, committed_studies, label, outputs, tracked


@pytest.fixture(scope="module")
def printed():
    return outputs()


def test_every_committed_study_prints_what_it_printed(printed):
    kept = set(os.listdir(GOLDEN))
    assert set(printed) == kept, (sorted(set(printed) - kept), sorted(kept - set(printed)))
    differ = []
    for name, text in printed.items():
        with open(os.path.join(GOLDEN, name)) as f:
            if f.read() != text:
                differ.append(name)
    assert not differ, differ


def test_a_study_a_user_s_search_leaves_in_the_clone_is_no_committed_study(tmp_path):
    """In a copy of the tree, what README's first command leaves (a study under studies/, with its trials and report, the
    knowledge store, .venv) is on disk, and neither the golden files' studies nor the replayed ones list it:
    both are what git tracks, which are the studies tests/data/golden/ holds outputs for."""
    clone = tmp_path / "clone"  # the files git tracks here, in a repository of their own: a clone of this tree
    for path in tracked(ROOT, "."):
        (clone / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), clone / path)
    subprocess.run(["git", "init", "-q"], cwd=clone, check=True)
    subprocess.run(["git", "add", "-A"], cwd=clone, check=True)
    committed, replayed = committed_studies(str(clone)), replayed_studies(str(clone))
    written = clone / "studies" / "tiny-llama"  # a real study folder, as a search writes it
    shutil.copytree(clone / "studies" / "captioner", written)
    (written / "report" / "report.md").write_text("a report of a user's own\n")
    (clone / "studies" / "knowledge.db").write_bytes((clone / "studies" / "captioner" / "study.db").read_bytes())
    (clone / ".venv").mkdir()

    on_disk = glob.glob(str(clone / "studies" / "**" / "study.db"), recursive=True)
    assert str(written / "study.db") in on_disk  # what listing the folder finds
    assert committed_studies(str(clone)) == committed and (str(clone / "studies"), "tiny-llama") not in committed
    assert replayed_studies(str(clone)) == replayed and str(written / "study.db") not in replayed
    golden = {name.split(".")[0] for name in os.listdir(GOLDEN) if not name.startswith("space.")}
    assert {label(folder, study, str(clone)) for folder, study in committed} == golden
