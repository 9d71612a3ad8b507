"""The numerics guard catches an error smaller than dropout's noise (see test_numerics_dropout.py)."""

import pytest

from autocompile.engine.scoring import judge
from autocompile.space import DEFAULTS
from autocompile.trial import TrialRequest, run_trial
from conftest import FAST, toy

SEEDS = range(3)  # each seed a trial of its own


@pytest.mark.parametrize("seed", SEEDS)
def test_a_compile_three_percent_off_is_infeasible_under_every_seed(tmp_path, seed):
    """Plain torch.compile's trial as a search under `seed` runs it (forked from a process that imported torch,
    FAST windows), judged by the search's own judge: its replay's verdict, which reads no eager baseline."""
    request = TrialRequest(
        model=toy("toy_dropout_scaled"),
        config=dict(DEFAULTS),
        device="cpu",
        trial_dir=str(tmp_path / "t"),
        seed=seed,
        timeout_s=300,
        measure=FAST,
        prestart=True,
    )
    record = judge(run_trial(request), None, "cpu", None)
    assert record["config"]["compile"] and record["rng_dependent"] is True
    assert record["status"] == "infeasible"
    assert record["reason"].startswith("numerics (replay): the loss of step 1 differs from eager by")
    assert record["numerics"]["differs"] and record["numerics"]["max_rel_diff"] > 0.01
