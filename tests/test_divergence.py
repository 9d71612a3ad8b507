"""Where numerics part: a configuration whose loss is off is compared with eager module by module."""

from autocompile.engine.study import load_study
from autocompile.outputs.table import format_table, summarize
from conftest import numerics_of_plain_compile


def test_the_first_module_whose_output_departs_is_named_in_the_record_and_its_reason(tmp_path):
    record = numerics_of_plain_compile(tmp_path, "toy_dropout_block_scaled", 0, triage=True)
    assert record["status"] == "infeasible" and record["reason"].startswith("numerics (replay)")
    found = record["diverges_at"]
    # Block 0 agrees with eager; block 1 is 30% off, and every module after it inherits that.
    assert (found["module"], found["pass"]) == ("blocks.1", "forward")
    assert abs(found["rel_error"] - 0.3) < 1e-3
    assert "diverges first at blocks.1 (forward, relative error 30.00%)" in record["reason"]
    # The results table (trials.txt, `report`) says it beside the trial's reason.
    study = load_study("s", "sqlite:///" + str(tmp_path / "s" / "study.db"))
    table = format_table(summarize(study, str(tmp_path / "s"))["rows"])
    assert "[diverges first at blocks.1 (forward, 30.00%)]" in table.splitlines()[2]
