"""Every committed study's outputs (best, best --json, best --pareto, the table and files `report` writes)
and `space` of the CPU workloads print byte for byte what tests/data/golden/ holds: what they printed before
the engine's inside was last reorganised. An intended change of an output regenerates the files
(`python tests/golden.py`) in the commit that makes it."""

import os

import pytest

from golden import GOLDEN, outputs


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
