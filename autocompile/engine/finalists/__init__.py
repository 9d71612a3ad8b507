"""The finalist round and the winner: the top configurations measured again, alternating with eager,
and the verdict chosen from that round; the time the round keeps under --timeout.

    verdict.py  the verdict, pure: from the measured rows, which finalist wins and why (WINNER_RULE)
    plan.py     the round's plan: its finalists, each one's GPU, what each rerun may take, its reserve
                (engine/cost.py says what each run is expected to take)
    round.py    the round run: the reruns, a third run where two disagree far, the verdict stored
    lanes.py    the round's GPUs at once: each GPU's runs in a thread, the study told from one
    cold.py     the winner's warm-up measured cold where its runs had it reconstructed

What the rest of the package uses is here; a test that reaches one module's own parts imports that module.
"""

from autocompile.engine.finalists.cold import cold_check
from autocompile.engine.finalists.plan import (
    REACH,
    RERUN_LIMIT,
    cold_check_s,
    cold_pick,
    contenders,
    finalist_reserve,
    rerun_limit_s,
    reserve_note,
    split,
)
from autocompile.engine.finalists.round import rechoose, run_finalists
from autocompile.engine.finalists.verdict import WINNER_RULE, choose_winner, gpu_footing, pooled

__all__ = [
    "WINNER_RULE",
    "choose_winner",
    "gpu_footing",
    "pooled",
    "REACH",
    "RERUN_LIMIT",
    "cold_check_s",
    "cold_pick",
    "contenders",
    "finalist_reserve",
    "rerun_limit_s",
    "reserve_note",
    "split",
    "cold_check",
    "rechoose",
    "run_finalists",
]
