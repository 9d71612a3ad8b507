"""The knowledge store: what finished trials taught across studies, in one SQLite file on the machine.

`schema` is the file (its path, tables, the observers' interface); each observer is told every
finished trial as an Optuna callback and answers one question: `failures` (values that failed twice
the same way: left out), `cuts` (values cut at the trial limit while compiling: refused), `cold`
(the finalist round's cold runs: the scale its next round plans with), `gains` (how far a neighbour
has gone past its parent: the ceiling of a neighbour's pruning bound), `paces` (how fast a configuration has
run on a workload: the ceiling of its next trial's pruning bound), `peaks` (how much memory a configuration
has taken on a workload: refused where a search's limit is below it), `plain` (what plain torch.compile's
whole-model compile took: where it runs in the next study). `store` forgets, lists and
learns over all of them. The store knows no search policy: the engine passes it in.
"""

from autocompile.engine.knowledge.cold import ColdRuns
from autocompile.engine.knowledge.cuts import CompileCuts, implicated
from autocompile.engine.knowledge.failures import Failures, signature, why
from autocompile.engine.knowledge.gains import MoveGains, batch_layout
from autocompile.engine.knowledge.paces import Paces, workload
from autocompile.engine.knowledge.peaks import Peaks
from autocompile.engine.knowledge.plain import PlainCompiles
from autocompile.engine.knowledge.schema import Observer, device_name, store_path
from autocompile.engine.knowledge.store import forget, learn, listing, study_key

__all__ = [
    "ColdRuns",
    "CompileCuts",
    "Failures",
    "MoveGains",
    "Observer",
    "Paces",
    "Peaks",
    "PlainCompiles",
    "batch_layout",
    "device_name",
    "forget",
    "implicated",
    "learn",
    "listing",
    "signature",
    "store_path",
    "study_key",
    "workload",
    "why",
]
