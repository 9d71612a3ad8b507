# Unreduced repro of the trial in /root/autocompile-runs/trial-captioner-nontree-cudagraphs, written by `autocompile repro`; it failed with
#   AssertionError:
# while compiling, outside the compiled graphs torch's minifier watches: there is no minified graph.
# Below: the trial's apply_compilation.py as it ran (pasted as is), then its workload ('captioner')
# in a plain training loop. Run it with `python repro.py` where autocompile (and the workload's
# module) imports: it exits 1 with the exception when the failure recurs. The trial compiled cold
# (empty caches): `TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python repro.py` does too.
"""Compile settings found by autocompile.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss
function (model outputs, batch) -> loss once with compile_loss(loss_fn), and call
backward(loss) where you called loss.backward(). To start warm, call
load_compile_cache(path) first with a cache from `autocompile export`.
"""
import torch

COMPILE_KWARGS = {'options': {'triton.cudagraphs': True, 'triton.cudagraph_trees': False}}
REGIONS = ['encoder.layers', 'decoder.transformer.h']  # lists of repeated blocks, each compiled alone
LOSS_COMPILE_KWARGS = {}  # the loss: one graph of its own

VARYING = {'decoder_input_ids': (1, 0), 'labels': (1, -100), 'decoder_attention_mask': (1, 0)}  # key: (dim, pad value)
BUCKETS = [16, 32, 64, 128, 256]  # a few fixed lengths: one graph each


def apply_compilation(model, optimizer):
    """Compile in place; returns the same model and optimizer."""
    for path in REGIONS:
        for block in model.get_submodule(path):
            block.compile(**COMPILE_KWARGS)
    for group in optimizer.param_groups:  # one fused kernel per step instead of foreach
        group["foreach"], group["fused"] = False, True
    return model, optimizer


def compile_loss(loss_fn):
    """Compile the loss function apart from the model, or not: use it once on the function
    that turns the model's outputs and the batch into the loss, then call what it returns:
    loss_fn = compile_loss(loss_fn); loss = loss_fn(model(...), batch).
    """
    return torch.compile(loss_fn, fullgraph=True, **LOSS_COMPILE_KWARGS)


def backward(loss):
    """The backward pass (call it where you called loss.backward())."""
    loss.backward()


def prepare_batch(batch):
    """Pads and marks the batch for the compiled model (call it where the collate ends)."""
    for key, (dim, pad_value) in VARYING.items():
        tensor = batch[key]
        length = tensor.shape[dim]
        target = next(b for b in BUCKETS if b >= length)
        if target > length:
            widths = [0, 0] * (tensor.dim() - 1 - dim) + [0, target - length]
            batch[key] = torch.nn.functional.pad(tensor, widths, value=pad_value)
    # CUDA graphs reuse their output buffers: tell them a new training step begins
    torch.compiler.cudagraph_mark_step_begin()
    return batch


def compile_cache_key():
    """What a compile cache is only valid for: the torch, triton and device that made it."""
    try:
        import triton
    except ImportError:
        triton = None
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"torch": torch.__version__, "triton": getattr(triton, "__version__", None), "device": device}


def load_compile_cache(path):
    """Load the compile cache that `autocompile export` saved at `path` (a .bin file, its key
    in path + ".json"), so the first steps reuse its compiled code instead of compiling it.
    Call it once before the first compiled step. It loads only when its key is the running
    torch, triton and device; otherwise it says why and does nothing. Returns whether it loaded.

    The file holds code that torch will run: load only a cache from your own export.
    """
    import json

    with open(path + ".json") as f:
        made_with = json.load(f)["key"]
    running = compile_cache_key()
    if made_with != running:
        print(f"load_compile_cache: not loaded: {path} was made with {made_with}, this is {running}")
        return False
    with open(path, "rb") as f:
        torch.compiler.load_cache_artifacts(f.read())
    return True


# ---- autocompile repro: the snippet above, on the trial's workload, in a plain training loop ----
import sys
import traceback

import torch

from autocompile.workloads import WorkloadOptions, get_workload

MODEL = 'captioner'
OPTIONS = WorkloadOptions(device='cuda', batch_size=None, seq_len=None, seed=0)
BLOCKS = None  # a screened trial's repeated blocks cut to this many (None: all of them)
POOL = 16  # distinct batches, cycled through as the trial did
STEPS = 320  # the trial's warm-up bound (it failed while compiling)
TRIAL_FAILED_WITH = 'AssertionError:'


def workload():
    built = get_workload(MODEL)
    if BLOCKS:
        from autocompile.trial.screened import screened

        built = screened(built, BLOCKS)
    return built


def train(job) -> None:
    model, optimizer = job.build(OPTIONS)
    batches = job.batches(OPTIONS, POOL)
    scheduler = job.schedule(optimizer) if job.schedule else None  # before apply_compilation, as the snippet says
    model, optimizer = apply_compilation(model, optimizer)
    if job.split_loss:  # the criterion apart from the model, compiled where the configuration says so
        criterion = compile_loss(job.criterion)
        compute_loss = lambda batch: criterion(job.forward(model, batch), batch)
    else:
        compute_loss = lambda batch: job.loss(model, batch)
    run_backward = globals().get("backward") or (lambda loss: loss.backward())
    for step in range(STEPS):
        batch = prepare_batch(dict(batches[step % POOL]))
        run_backward(compute_loss(batch))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if OPTIONS.device.startswith("cuda"):
            torch.cuda.synchronize()  # a failure shows at the step that made it, as in the trial's warm-up
        print(f"step {step + 1} done", flush=True)


if __name__ == "__main__":
    try:
        train(workload())
    except Exception as error:
        traceback.print_exc()
        first = f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
        same = first.split(":")[0] == TRIAL_FAILED_WITH.split(":")[0]
        print(f"failed, {'as the trial did' if same else 'not as the trial did (' + TRIAL_FAILED_WITH + ')'}: "
              f"{first}", file=sys.stderr)
        sys.exit(1)
    print(f"did not reproduce: {STEPS} steps ran cleanly; the trial failed with {TRIAL_FAILED_WITH}")
