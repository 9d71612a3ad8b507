"""How much a search says on stderr while it runs: -q nothing, default each phase, -v every event."""

from __future__ import annotations

import os

from autocompile.engine.runner import Progress

QUIET, NORMAL, VERBOSE = 0, 1, 2


class VerboseProgress(Progress):
    """Every event of a trial: each warm-up step that compiled, each measured window, with its figures."""

    def phase(self, number: int, label: str, event: dict) -> None:
        detail = ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in event.items() if k not in ("phase", "t")
        )
        self.line(
            f"  [{self.done + 1}/{self.total}] trial {number} {label}: {event.get('phase')}" + (f" ({detail})" if detail else "")
        )


def progress_for(verbosity: int, total: int) -> Progress:
    """The progress display a search gets at this verbosity (QUIET, NORMAL or VERBOSE)."""
    if verbosity <= QUIET:
        return Progress(total, stream=open(os.devnull, "w"))
    return VerboseProgress(total) if verbosity >= VERBOSE else Progress(total)
