"""The finalist round and the winner: the top configurations measured again, alternating with eager,
and the verdict chosen from that round; the time the round keeps under --timeout.

    verdict.py  the verdict, pure: from the measured rows, which finalist wins and why (WINNER_RULE)
    plan.py     the round's time: its finalists, what each rerun takes and may take, its reserve
    round.py    the round run: the reruns, a third run where two disagree far, the verdict stored
    cold.py     the winner's warm-up measured cold where its runs had it reconstructed

What the rest of the package uses is here; a test that reaches one module's own parts imports that module.
"""

from autocompile.engine.finalists.cold import cold_check
from autocompile.engine.finalists.plan import (REACH, RERUN_HEADROOM, RERUN_LIMIT, ROUND_MEASURE, WARM_SHARE,
                                               cold_check_s, cold_pick, cold_scale, contenders, finalist_reserve,
                                               rerun_estimate_s, rerun_limit_s, reserve_note, round_measure_extra_s,
                                               too_long)
from autocompile.engine.finalists.round import rechoose, run_finalists
from autocompile.engine.finalists.verdict import WINNER_RULE, choose_winner, pooled

__all__ = ["WINNER_RULE", "choose_winner", "pooled", "REACH", "RERUN_HEADROOM", "RERUN_LIMIT", "ROUND_MEASURE",
           "WARM_SHARE", "cold_check_s", "cold_pick", "cold_scale", "contenders", "finalist_reserve",
           "rerun_estimate_s", "rerun_limit_s", "reserve_note", "round_measure_extra_s", "too_long", "cold_check",
           "rechoose", "run_finalists"]
