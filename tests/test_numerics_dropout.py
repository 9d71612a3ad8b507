"""The numerics guard on a model with dropout p = 0.3, through `autocompile search` as a user runs it.

Two draws of dropout's masks move this model's loss by more than a 3% error in its output does,
so comparing first losses of runs whose masks differ decides by chance. The guard replays the
first steps with the same random stream on both sides; under six seeds a correct compile passes
and a compile whose output is 3% off is infeasible (the scaled variant: tests/test_numerics_scaled.py).
"""

import json

import pytest

from autocompile.engine.scoring import compare_losses
from conftest import numerics_of_plain_compile

SEEDS = range(6)  # each seed a search of its own (about 25 s on 2 cores)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_correct_compile_of_a_model_with_dropout_passes_under_every_seed(tmp_path, seed):
    record = numerics_of_plain_compile(tmp_path, "toy_dropout", seed)
    assert record["rng_dependent"] is True
    assert record["status"] == "ok", record["reason"]
    numerics = record["numerics"]
    assert numerics["method"] == "replay" and not numerics["differs"]
    assert numerics["max_rel_diff"] < 1e-4, json.dumps(numerics)
    # What the guard compared before: the measured run's first losses against eager's, drawn with
    # other masks. Chance alone puts them beyond the tolerance, under every seed.
    assert compare_losses(record["losses"], record["eager_losses"], "cpu")["differs"]
