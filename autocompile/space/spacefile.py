"""The user's space file: [fix] values to pin, [exclude] values to leave out, [inductor] extra options to try."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from autocompile.errors import UserError


@dataclass
class SpaceFile:
    """A user's narrowing or extension of the space, read from a TOML or JSON file.

    fix: dimension -> value (as --set); exclude: dimension -> values left out;
    inductor: extra Inductor option -> values to try.
    """

    path: str
    fix: dict[str, Any] = field(default_factory=dict)
    exclude: dict[str, list] = field(default_factory=dict)
    inductor: dict[str, list] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return os.path.basename(self.path)


def _flatten(table: dict, prefix: str = "") -> dict:
    """{"inductor": {"shape_padding": [..]}} -> {"inductor.shape_padding": [..]}: TOML reads an
    unquoted dotted key as nested tables."""
    flat = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def load_space_file(path: str) -> SpaceFile:
    """Read a space file (TOML, or JSON by its .json suffix); UserError on anything malformed."""
    if not os.path.isfile(path):
        raise UserError(f"space file not found: {path}")
    try:
        if path.endswith(".json"):
            with open(path) as f:
                data = json.load(f)
        else:
            try:
                import tomllib
            except ImportError:  # Python 3.10
                try:
                    import tomli as tomllib
                except ImportError:
                    raise UserError(
                        f"{path}: reading TOML needs Python 3.11 (or the tomli package); or write the space file as JSON"
                    ) from None
            with open(path, "rb") as f:
                data = tomllib.load(f)
    except UserError:
        raise
    except (ValueError, OSError) as exc:  # JSONDecodeError and TOMLDecodeError are ValueErrors
        raise UserError(f"{path}: not a valid space file: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a space file is a table with [fix], [exclude] and [inductor] sections")
    unknown = sorted(set(data) - {"fix", "exclude", "inductor"})
    if unknown:
        raise UserError(f"{path}: unknown section(s) {', '.join(unknown)}; known: fix, exclude, inductor")
    sections = {}
    for name in ("fix", "exclude", "inductor"):
        table = data.get(name, {})
        if not isinstance(table, dict):
            raise UserError(f"{path}: [{name}] must be a table of NAME = VALUE lines")
        sections[name] = _flatten(table)
    for name in ("exclude", "inductor"):
        for key, values in sections[name].items():
            if not isinstance(values, list):
                values = sections[name][key] = [values]
            if not values:
                raise UserError(f"{path}: [{name}] {key} lists no value")
    return SpaceFile(path=path, **sections)
