"""autocompile: search for the fastest torch.compile settings of a training workload.

The layers, top to bottom (docs/architecture.md): `cli` and `api` (`search(model, ...)` runs a
search from Python); `outputs` (the table, results.db, plots, the dashboard, the warm start), fed
by the engine's callbacks; `engine` (how a study proceeds, Optuna underneath); `trial` (one
measurement in its own process); `apply` (a configuration as the code a user pastes); `space`
(what is searched) and `workloads` (the registry of training jobs). Modules starting with `_` are
private.
"""

from autocompile.api import SearchResult, search

__all__ = ["SearchResult", "search"]

__version__ = "0.1.0"
