"""A screened trial's workload: the same model with each list of repeated blocks cut to its first k
(the search's side of screening is `autocompile.engine.screening`)."""

from __future__ import annotations

import dataclasses


def cut_blocks(model, k: int) -> dict[str, tuple[int, int]]:
    """Cut each list of repeated blocks of `model` to its first k, in place.
    Returns {path: (blocks before, after)} for the lists that were longer than k."""
    from autocompile.apply import find_repeated_blocks

    cut = {}
    for path in find_repeated_blocks(model):
        blocks = model.get_submodule(path)
        if len(blocks) > k:
            cut[path] = (len(blocks), k)
            del blocks[k:]  # ModuleList and Sequential both take a slice
    return cut


def _over_kept_parameters(optimizer, model):
    """The optimizer again, of its class and with each group's settings, over the parameters the
    model still has (the cut blocks' would hold memory and slots in a fused or compiled step)."""
    kept = {id(p) for p in model.parameters()}
    groups = [
        {
            **{key: value for key, value in group.items() if key != "params"},
            "params": [p for p in group["params"] if id(p) in kept],
        }
        for group in optimizer.param_groups
    ]
    try:
        rebuilt = type(optimizer)([group for group in groups if group["params"]])
    except TypeError:  # an optimizer that needs more to be built: its cut parameters get no gradient
        return optimizer
    rebuilt.defaults.update(optimizer.defaults)
    return rebuilt


def screened(workload, k: int):
    """`workload` with its repeated blocks cut to k: built that way where its builder honours
    WorkloadOptions.blocks (the built-in ones), cut after it is built otherwise (a file workload)."""
    build = workload.build

    def build_screened(options):
        model, optimizer = build(dataclasses.replace(options, blocks=k))
        if cut_blocks(model, k):
            optimizer = _over_kept_parameters(optimizer, model)
        return model, optimizer

    return dataclasses.replace(workload, build=build_screened)
