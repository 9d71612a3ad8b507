"""An error in the search's own planning is contained: a gate that raises refuses nothing, a neighbour that
cannot be chosen leaves the turn to TPE. The search goes on; the error goes to its log with its traceback
and into the study (`ATTR`: where, what, how often), and the search's last lines say so. One record the
planning code did not expect (a trial refused before launch has no speed; a compile torch left unnamed)
stopped two GPU searches within five minutes (docs/decisions.md). Where `STRICT` is set in the environment
(the test suite sets it), the error is raised: a test never passes over one."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import TypeVar

STRICT = "AUTOCOMPILE_STRICT"
ATTR = "planning_errors"  # {"where: Error: message": count}
T = TypeVar("T")


def contained(where: str, study, fallback: T, call: Callable[..., T], *args, **kwargs) -> T:
    """`call(*args, **kwargs)`, or `fallback` where it raises (kept in `study`, printed with its traceback)."""
    try:
        return call(*args, **kwargs)
    except Exception as exc:
        if os.environ.get(STRICT):
            raise
        said = f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
        print(f"autocompile: an internal error in {said}; the search goes on without it (please report it)", file=sys.stderr)
        traceback.print_exc()
        try:
            kept = dict(study.user_attrs.get(ATTR) or {})
            kept[said] = kept.get(said, 0) + 1
            study.set_user_attr(ATTR, kept)
        except Exception as unkept:  # no study, or one that cannot be written (a report on a read-only copy)
            print(f"autocompile: the error is not kept in the study: {type(unkept).__name__}", file=sys.stderr)
        return fallback


def summary(study) -> str | None:
    """The search's line on the errors it contained, or None."""
    kept = study.user_attrs.get(ATTR) or {}
    if not kept:
        return None
    first = next(iter(kept))
    return (
        f"planning: {sum(kept.values())} internal errors contained, the search went on without their answers "
        f"(study attribute {ATTR!r}; first: {first})"
    )
