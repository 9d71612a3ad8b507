"""What cannot work, or cannot pay off, before any process starts: each rule with its reason.

`doomed(config, traits, caps)` names a configuration that would run but is known to fail or
to waste its trial: more distinct compiled shapes than the recompile limit allows, or a code
path the GPU studies saw fail on this torch release. The search records such a configuration
infeasible with the reason, at no process cost (like `SearchSpace.rejection`'s cases).
"""

from __future__ import annotations

import math

# Failures seen on the GPU, keyed by the torch releases they were seen on (prefix of the version):
# (releases, predicate on the configuration, reason).
SEEN_FAILING = (
    (("2.11",), lambda c: c["inductor"].get("triton.cudagraph_trees") is False,
     "Inductor's non-tree CUDA-graph path (triton.cudagraph_trees=false) failed in training with "
     "`assert dst.data_ptr() == src.data_ptr()` on two models under torch 2.11 (llama-8b trial 14 and "
     "a 24-block encoder, H200, 2026-11-22)"),
)


def compiled_shapes(padding: str, pad_multiple: int | None, lengths: tuple[int, int], buckets: list[int]) -> int:
    """How many distinct lengths a varying dimension takes after padding, over its whole range
    (lowest, highest): what a training run sees, not only the batches a trial measures."""
    low, high = lengths
    if padding == "max":
        return 1
    if padding == "buckets":
        # bucket b takes the lengths above the bucket before it, up to b
        return sum(1 for i, b in enumerate(buckets) if b >= low and (i == 0 or buckets[i - 1] < high))
    if padding == "multiple":
        return math.ceil(high / pad_multiple) - math.ceil(low / pad_multiple) + 1
    return high - low + 1  # longest in the batch: every length


def doomed(config: dict, traits, caps) -> str | None:
    """Why a configuration that may run cannot work or cannot pay off here, or None."""
    if not config["compile"]:
        return None
    for releases, applies, reason in SEEN_FAILING:
        if caps.torch_version.startswith(releases) and applies(config):
            return reason
    return _a_float_lr_under_a_schedule(config, traits) or _over_the_recompile_limit(config, traits, caps)


def _a_float_lr_under_a_schedule(config: dict, traits) -> str | None:
    """A compiled optimizer step guards on its learning rate as a Python float: under a schedule
    each new value compiles the step again (test_apply shows it on the CPU; llama-8b's trial 12
    was still compiling after 300 s, H200, 2026-11-23)."""
    if config["compile_optimizer"] and traits.schedule and not config["lr_tensor"]:
        return ("a compiled optimizer step with the learning rate as a float compiles again for each new "
                "value the LR schedule gives it; set lr_tensor (the learning rate as a tensor)")
    return None


def _over_the_recompile_limit(config: dict, traits, caps) -> str | None:
    """dynamic=False compiles every distinct shape anew: more of them than the recompile limit
    and the rest falls back to eager (FailOnRecompileLimitHit, or a trial made infeasible)."""
    if config["dynamic"] is not False or not traits.varying or not traits.lengths:
        return None
    from autocompile.apply import bucket_lengths

    limit = config.get("recompile_limit") or caps.recompile_limit
    if not limit:
        return None
    shapes = compiled_shapes(config["padding"], config["pad_multiple"], traits.lengths, bucket_lengths(traits.lengths[1]))
    if shapes <= limit:
        return None
    how = {"longest": "padded to the longest in each batch", "max": "padded to the maximum",
           "buckets": "padded to buckets", "multiple": f"padded to a multiple of {config['pad_multiple']}"}
    return (f"dynamic=False compiles each distinct length anew: lengths {traits.lengths[0]}-{traits.lengths[1]} "
            f"{how[config['padding']]} give {shapes} shapes, above the recompile limit of {limit} (the rest "
            "would run eager); pad to fewer lengths (buckets, a larger multiple, max) or let dynamic shapes in")
