"""autocompile: search for the fastest torch.compile settings of a training workload.

Public modules: `autocompile.workloads` (the registry of training jobs), `autocompile.space`
(what is searched), `autocompile.apply` (how a configuration becomes code), `autocompile.trial`
(one isolated measurement), `autocompile.study` (the Optuna search), `autocompile.runner` (one trial
against the study), `autocompile.finalists` (the finalist round), `autocompile.scoring`
(score, numerics verdict, pruner), `autocompile.strategy` (what is proposed after the
recipes), `autocompile.report` (tables and the winner), `autocompile.outputs` (results.db,
plots, the Pareto choice, the dashboard, the warm start).
Modules starting with `_` are private. `search(model, ...)` runs a search from Python.
"""

from autocompile.api import SearchResult, search

__version__ = "0.1.0"
