"""The numerics guard catches an error smaller than dropout's noise (see test_numerics_dropout.py)."""

import pytest

from conftest import numerics_of_plain_compile

SEEDS = range(3)  # each seed a search of its own (about 30 s on 2 cores)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_compile_three_percent_off_is_infeasible_under_every_seed(tmp_path, seed):
    record = numerics_of_plain_compile(tmp_path, "toy_dropout_scaled", seed)
    assert record["status"] == "infeasible"
    assert record["reason"].startswith("numerics (replay): the loss of step 1 differs from eager by")
    assert record["numerics"]["differs"] and record["numerics"]["max_rel_diff"] > 0.01
