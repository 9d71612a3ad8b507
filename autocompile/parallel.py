"""DDP and FSDP2 in the snippet: where the model is wrapped or sharded relative to what is compiled.

Parallelism is applied in one place, inside `apply_compilation`, before (or around) compile, the
way torchtitan does: `apply_ddp(model)` puts DDP around the model; `apply_fsdp2(model, optimizer)`
calls `fully_shard` on each repeated block, then on the root. Both are emitted as code in the
snippet (which imports only torch), so a trial runs the very text a user pastes, and the user
reads in it where compile goes relative to DDP or `fully_shard`. `init_ranks` is the trial's
side: the process group a rank joins before it builds the model.
"""

from __future__ import annotations

import os

# What the snippet's docstring adds under each strategy.
PARALLEL_DOC = {
    "ddp": [
        "Distributed (DDP): call apply_compilation on every rank after",
        "torch.distributed.init_process_group, with the bare model on this rank's device: it wraps the",
        "model in DistributedDataParallel itself (apply_ddp) and returns the wrapped model.",
    ],
    "fsdp2": [
        "Distributed (FSDP2): call apply_compilation on every rank after",
        "torch.distributed.init_process_group, with the bare model on this rank's device: it shards",
        "each repeated block, then the root, with fully_shard itself (apply_fsdp2), and moves the",
        "optimizer (the same object, so an LR scheduler built on it stays valid) onto the sharded",
        "parameters. Build the optimizer before, as for one process.",
    ],
}

APPLY_DDP = '''
def apply_ddp(model):
    """DistributedDataParallel around the model, on this rank's device."""
    from torch.nn.parallel import DistributedDataParallel

    device = next(model.parameters()).device
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
'''.splitlines()

APPLY_FSDP2 = '''
def apply_fsdp2(model, optimizer, compile_block=None):
    """fully_shard on each repeated block, then on the root (torchtitan's order). With
    compile_block, each block is compiled first and the compiled module is sharded in its place
    (FSDP2's hooks then run outside the compiled graph). The optimizer, built on the unsharded
    parameters, takes the sharded ones in their place (it holds no state before its first step)."""
    from torch.distributed.fsdp import fully_shard

    names = {id(p): n for n, p in model.named_parameters()}
    groups = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    for path in FSDP_BLOCKS:
        blocks = model.get_submodule(path)
        for i, block in enumerate(blocks):
            if compile_block is not None:
                block = blocks[i] = compile_block(block)
            fully_shard(block, reshard_after_forward=RESHARD_AFTER_FORWARD)
    fully_shard(model, reshard_after_forward=RESHARD_AFTER_FORWARD)
    sharded = {n.replace("._orig_mod", ""): p for n, p in model.named_parameters()}
    for group, group_names in zip(optimizer.param_groups, groups):
        group["params"] = [sharded[n] for n in group_names]
    return model
'''.splitlines()


def literal(value) -> str:
    """A value as the snippet writes it: Python source, wrapped at 88 columns, keys in their order."""
    import pprint

    return pprint.pformat(value, width=88, sort_dicts=False)


def parallel_lines(config: dict, info, preamble: list[str], compiling: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(settings, apply_compilation's body, helper functions) under DDP or FSDP2; `preamble` holds
    the global settings, `compiling` what the scope compiles (autocompile.apply.render_snippet)."""
    if info.parallel == "ddp":
        return _ddp_lines(config, preamble, compiling)
    if info.parallel == "fsdp2":
        return _fsdp2_lines(config, info, preamble, compiling)
    raise ValueError(f"unknown parallel strategy {info.parallel!r}")


def _ddp_lines(config: dict, preamble: list[str], compiling: list[str]):
    settings, body = [], list(preamble)
    if config["compile"] and config["scope"] == "full":
        split = "at gradient buckets (torch's own optimize_ddp)"
        if config.get("optimize_ddp") is not None:
            settings.append(f"OPTIMIZE_DDP = {config['optimize_ddp']!r}  # how Dynamo treats DDP's gradient buckets")
            body.append("    torch._dynamo.config.optimize_ddp = OPTIMIZE_DDP")
            split = "per OPTIMIZE_DDP"
        body.append(f"    model = apply_ddp(model)  # first: Dynamo compiles the DDP module, its graph split {split}")
        body += compiling
    else:
        body += compiling
        body.append("    model = apply_ddp(model)  # after the blocks are compiled: DDP wraps the compiled model")
    return settings, body, APPLY_DDP


def _fsdp2_lines(config: dict, info, preamble: list[str], compiling: list[str]):
    settings = [
        f"FSDP_BLOCKS = {literal(info.regions)}  # lists of repeated blocks, each sharded on its own",
        f"RESHARD_AFTER_FORWARD = {config.get('reshard_after_forward', True)!r}  "
        "# free the gathered parameters after the forward",
    ]
    body = list(preamble)
    if config["compile"] and config["scope"] == "regional" and config.get("fsdp_compile_order", "before") == "before":
        body.append("    # each block compiled, then sharded (torchtitan's order)")
        body.append(
            "    model = apply_fsdp2(model, optimizer, compile_block=lambda block: torch.compile(block, **COMPILE_KWARGS))"
        )
    else:
        body.append("    model = apply_fsdp2(model, optimizer)  # sharded first: what follows compiles the sharded model")
        body += compiling
    return settings, body, APPLY_FSDP2


def init_ranks(device: str) -> tuple[int, int, str]:
    """Join the trial's process group from the launcher's environment (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT): NCCL with a GPU per rank on CUDA, gloo on the CPU.
    Returns (rank, world size, this rank's device)."""
    import datetime

    import torch
    import torch.distributed as dist

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if device.startswith("cuda"):
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    # the trial's own time limit ends a rank stuck in a collective; this one only bounds a lost peer
    dist.init_process_group(
        "nccl" if device.startswith("cuda") else "gloo",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=int(os.environ.get("AUTOCOMPILE_PG_TIMEOUT_S", "1800"))),
    )
    return rank, world, device
