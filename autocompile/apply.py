"""How a configuration is applied to a model: by generating the code a user would paste.

`render_snippet` turns a configuration into a standalone Python module (importing only torch)
that defines `apply_compilation(model, optimizer)` and `prepare_batch(batch)` (and, in every
snippet, `load_compile_cache(path)` for an exported compile cache). A trial applies
its configuration by executing exactly this code (`load_snippet`), and the winner's snippet is
the same text, so what was measured and what is emitted cannot drift apart.
"""

from __future__ import annotations

import inspect
import itertools
import json
import sys
import types
from dataclasses import dataclass, field, replace

from autocompile.space import DEFAULTS, INDUCTOR_OPTIONS_HOST, bucket_lengths, uses_cuda_graphs  # noqa: F401  (bucket_lengths: a snippet's BUCKETS)
from autocompile.parallel import literal as _literal
from autocompile.space.optimizer import foreach_map_refusal
from autocompile.workloads import SequenceLayout
from autocompile.workloads.checkpointing import HUGGING_FACE, ModelCheckpointing


@dataclass
class ModelInfo:
    """Facts about the model that the snippet needs, found by looking at the built model."""

    regions: list[str] = field(default_factory=list)  # ModuleLists of repeated blocks
    parts: tuple[str, ...] = ()
    varying: dict[str, tuple[int, int]] = field(default_factory=dict)  # batch key -> (dim, pad value)
    max_len: int = 0
    device_type: str = "cpu"
    recompile_limit_key: str | None = "recompile_limit"
    compiled_autograd_api: str | None = "_enable"  # see Capabilities.compiled_autograd_api
    parallel: str = "none"  # --parallel: ddp or fsdp2 wraps the model inside apply_compilation (autocompile.parallel)
    checkpointing: ModelCheckpointing | None = None  # the model's own activation checkpointing, where it has some
    layout: SequenceLayout | None = None  # how the varying sequences reach the model (packing)
    rows: int = 0  # the rows (sequences) of the workload's largest batch: what packed rows hold at most
    framework: str = ""  # "trainer": a Hugging Face Trainer's job, which the snippet enters through apply_to_trainer


def find_repeated_blocks(model) -> list[str]:
    """Paths of the outermost ModuleLists whose children are all of one class (2 or more).

    These are the transformer blocks of almost any model (``model.layers``,
    ``encoder.layer``, ``transformer.h``...), found without knowing the model's code.
    """
    import torch

    found: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        if not any(p.requires_grad for p in module.parameters()):
            continue
        if any(name.startswith(outer + ".") for outer in found):
            continue  # a list inside a block already compiled as a whole
        found.append(name)
    return found


def _kwargs(config: dict, mode: str, device_type: str) -> dict:
    """torch.compile keyword arguments. mode and options cannot both be given to
    torch.compile, so with Inductor options the mode is expanded into them, as Inductor's
    own mode table does."""
    kwargs: dict = {}
    backend = config.get("backend", "inductor")  # another backend only in failure triage
    if backend != "inductor":
        kwargs["backend"] = backend
    elif config["inductor"]:
        import torch._inductor

        options = dict(torch._inductor.list_mode_options(mode, config["dynamic"]))
        options.update(config["inductor"])
        kwargs["options"] = options
    elif mode != "default":
        kwargs["mode"] = mode
    if config["dynamic"] is not None:
        kwargs["dynamic"] = config["dynamic"]
    if config["fullgraph"]:
        kwargs["fullgraph"] = True
    return kwargs


def _host_options(config: dict) -> dict:
    """The configuration's Inductor options of the host's launch work (INDUCTOR_OPTIONS_HOST): they concern each
    compiled graph's wrapper, so every compile of the snippet takes them, the loss's and the optimizer step's too."""
    if config.get("backend", "inductor") != "inductor":
        return {}
    return {key: value for key, value in config["inductor"].items() if key in INDUCTOR_OPTIONS_HOST}


def alone(config: dict, info: ModelInfo, path: str) -> tuple[dict, ModelInfo]:
    """The configuration and facts whose snippet, given the module at `path` as its model, compiles
    that module by itself with the settings it has in the whole model's snippet: scope full, in
    the mode of its part under modular scope; in one process."""
    part = next((p for p in info.parts if path == p or path.startswith(p + ".")), None)
    mode = config["part_modes"].get(part, config["mode"]) if config["scope"] == "modular" and part else config["mode"]
    return {**config, "scope": "full", "mode": mode}, replace(info, regions=[], parts=(), parallel="none")


def render_snippet(config: dict, info: ModelInfo, header: str = "") -> str:
    """The standalone module that applies `config`: settings at the top, two small functions."""
    lines = _module_doc(header, info)
    checkpointing_doc, checkpointing_body, checkpointing_functions = _checkpointing_lines(config, info)
    lines += checkpointing_doc + _lm_loss_doc(config, info)
    lines += ['"""', "import torch", ""]
    settings, body, helpers = _apply_lines(config, info, checkpointing_body)
    pack_body, pack_functions = _pack_apply_lines(config, info)
    body += pack_body
    attention_body, attention_functions = _attention_lines(config)
    body += attention_body
    pack_functions += attention_functions
    experts_body, experts_functions = _experts_lines(config)
    body += experts_body
    pack_functions += experts_functions
    lm_loss_body, lm_loss_functions = _lm_loss_lines(config)
    body += lm_loss_body
    pack_functions += lm_loss_functions
    body += _optimizer_lines(config)
    step_settings, step_functions = _step_lines(config)
    if step_settings:
        body.append("    foreach_map_step(optimizer)  # the Adam/AdamW step as one compiled foreach_map function")
    overlap_settings, overlap_body, overlap_functions = _step_in_backward_lines(config, info)
    body += overlap_body
    pack_functions += overlap_functions
    settings += overlap_settings + step_settings
    loss_settings, loss_fn = _compile_loss_lines(config)
    settings += loss_settings
    lines += settings
    if settings:
        lines.append("")

    prep, prep_settings, prep_functions = _prepare_batch_body(config, info)
    lines += prep_settings
    if prep_settings:
        lines.append("")
    lines += helpers
    lines += ["", "def apply_compilation(model, optimizer):", '    """Compile in place; returns the same model and optimizer."""']
    lines += body
    lines += ["    return model, optimizer", "", ""]
    lines += step_functions
    lines += checkpointing_functions + pack_functions
    lines += loss_fn + ["", ""]
    lines += _backward_lines(config, info) + ["", ""]
    lines += prep_functions
    lines += ["def prepare_batch(batch):"]
    if config["padding"] == "pack":
        lines += PACK_DOC
    else:
        lines += ['    """Pads and marks the batch for the compiled model (call it where the collate ends)."""']
    lines += prep
    lines += ["    return batch", ""]
    if info.framework == "trainer":
        lines += _trainer_lines(config, drops_full_mask(config, info))
    lines += WARM_START
    return "\n".join(lines)


def drops_full_mask(config: dict, info: ModelInfo) -> bool:
    """Whether apply_to_trainer leaves an all-ones attention_mask out of the batch: for a causal decoder whose
    forward takes one (which treats such a mask as none), where prepare_batch does not pack, pad or mark
    the varying keys (the mask among them)."""
    layout = info.layout
    mask_taken = layout is not None and layout.causal and layout.mask == "attention_mask"
    marks = config["compile"] and config["mark_dynamic"] != "off"
    return mask_taken and not (info.varying and (config["padding"] != "longest" or marks))


def _trainer_lines(config: dict, full_mask_dropped: bool = False) -> list[str]:
    """apply_to_trainer(trainer): the snippet through a Hugging Face Trainer's own hooks, for its job."""
    lines = TRAINER_HOOKS[1:]
    lines += ["    loop_without_waits(trainer)  # batches copied and the logged loss filtered without waiting on the GPU"]
    if full_mask_dropped:
        lines += [
            "    if mask_read_by_model_only(trainer):",
            "        trainer.data_collator = without_full_mask(trainer.data_collator)  # no wait on the mask, read on the host",
            "        own_positions_not_read(trainer.model)  # nor on the position ids the model counts itself",
        ]
    if config["compile"] and config.get("compile_loss"):
        if config.get("lm_loss", "model") != "model":
            lines += [f"    linear_loss_on(trainer.model, {config['lm_loss']}_cross_entropy)  # read by model_loss below"]
        lines += [
            "    trainer.compute_loss_func = compile_loss(model_loss(trainer.model))  # the model's own loss, compiled apart"
        ]
    if config["compile"] and config.get("compiled_autograd"):
        lines += ["    trainer.accelerator.backward = lambda loss, **kwargs: backward(loss)  # under Compiled Autograd"]
    if config.get("clip_in_step"):
        lines += [
            "    clip_in_optimizer_step(trainer)  # the gradients scaled by the fused AdamW step, not by a pass of their own"
        ]
    lines += ["    return trainer"]
    return lines + TRAINER_HELPERS + (CLIP_IN_STEP if config.get("clip_in_step") else [])


CLIP_IN_STEP = '''

def clip_in_optimizer_step(trainer):
    """The Trainer's gradient clipping (max_grad_norm) folded into its fused Adam/AdamW step: its
    _clip_grad_norm computes the norm, and hands the clip to the optimizer as the scale its fused kernel
    divides each gradient by (grad_scale, as a GradScaler's unscaling sets it), instead of scaling every
    gradient in a pass of its own. Returns the norm before clipping, as the Trainer's does."""
    max_norm = trainer.args.max_grad_norm

    def clip_grad_norm(model):
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # torch's, in accelerate's wrapper
        optimizer.grad_scale = ((norm.float() + 1e-6) / max_norm).clamp(min=1.0)  # 1 / torch's clip coefficient
        return norm

    trainer._clip_grad_norm = clip_grad_norm
'''.splitlines()


def without_code(config: dict) -> list[str]:
    """The winner as the Trainer's own settings, where they can say it (a whole-model compile in a mode:
    TrainingArguments; each repeated block compiled alone: accelerate's TorchDynamoPlugin), else []."""
    if not config.get("compile") or config.get("scope") not in ("full", "regional"):
        return []
    if any(config.get(key, value) != value for key, value in DEFAULTS.items() if key not in ("compile", "scope", "mode")):
        return []
    mode = config.get("mode", "default")
    lines = [f'TrainingArguments(..., torch_compile=True, torch_compile_mode="{mode}")']
    if config["scope"] == "regional":
        lines += [
            "with each repeated block compiled alone, which accelerate's TorchDynamoPlugin does "
            "(use_regional_compilation): ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION=true in the environment, or "
            "in accelerate's config file: dynamo_config: {dynamo_backend: INDUCTOR, dynamo_mode: "
            f"{mode}, dynamo_use_regional_compilation: true}}"
        ]
    return lines


# apply_to_trainer's hooks, the same for every configuration of a Trainer's job.
TRAINER_HOOKS = '''
def apply_to_trainer(trainer):
    """Apply these settings to a Hugging Face Trainer (TRL's SFTTrainer too): call it once, after
    building the Trainer and before trainer.train(); returns the trainer. The Trainer's own
    torch_compile is turned off, so nothing compiles twice. apply_compilation runs when the Trainer
    creates its optimizer (after it sets its activation checkpointing), on the model and that
    optimizer; every batch goes through prepare_batch before the Trainer's training step. The loop's
    waits on the GPU that change nothing trained go (loop_without_waits, without_full_mask,
    own_positions_not_read)."""
    trainer_compile_off(trainer)
    create_optimizer = trainer.create_optimizer

    def create_optimizer_and_compile(*args, **kwargs):
        optimizer = create_optimizer(*args, **kwargs)
        if not getattr(trainer, "compiled_by_apply_to_trainer", False):
            apply_compilation(trainer.model, optimizer)
            trainer.compiled_by_apply_to_trainer = True
        return optimizer

    trainer.create_optimizer = create_optimizer_and_compile
    training_step = trainer.training_step

    def training_step_prepared(model, inputs, *args, **kwargs):
        return training_step(model, prepare_batch(inputs), *args, **kwargs)

    trainer.training_step = training_step_prepared'''.splitlines()

TRAINER_HELPERS = '''

def trainer_compile_off(trainer):
    """The Trainer's own torch_compile off: accelerate would compile the whole model again."""
    trainer.args.torch_compile = False
    plugin = getattr(trainer.accelerator.state, "dynamo_plugin", None)
    if plugin is not None:
        from accelerate.utils import DynamoBackend

        plugin.backend = DynamoBackend.NO


def loop_without_waits(trainer):
    """The Trainer's loop without two of its waits on the GPU, training the same: batches copied to the
    device from pinned memory without waiting (non_blocking), and the NaN/inf filter of the logged loss
    (logging_nan_inf_filter) computed on the device, where the loop's own check reads each loss back."""
    if trainer.args.dataloader_pin_memory:
        trainer.accelerator.dataloader_config.non_blocking = True
    if trainer.args.logging_nan_inf_filter:
        nan_filter_on_device(trainer)


def nan_filter_on_device(trainer):
    """Each step's loss as the loop's NaN/inf filter adds it to the logged loss: the loss where finite, else
    the mean of those since the last log. The loop's check is off during training steps only (evaluation
    reads the same argument); a Trainer whose loop keeps no _tr_loss on the device keeps its check."""
    from transformers import TrainerCallback

    class CheckOnAgain(TrainerCallback):
        def on_substep_end(self, args, state, control, **kwargs):
            args.logging_nan_inf_filter = True

        on_step_end = on_substep_end

    training_step = trainer.training_step

    def training_step_filtered(*args, **kwargs):
        loss = training_step(*args, **kwargs)
        logged = getattr(trainer, "_tr_loss", None)  # the loop's sum since the last log, on the device
        if logged is None:
            return loss
        trainer.args.logging_nan_inf_filter = False  # the loop's check, until the step ends
        mean = logged / (1 + trainer.state.global_step - trainer._globalstep_last_logged)
        return torch.where(torch.isfinite(loss), loss, mean)

    trainer.training_step = training_step_filtered
    trainer.add_callback(CheckOnAgain)


def mask_read_by_model_only(trainer):
    """Whether the batch's attention_mask is read by the model alone: the Trainer's own compute_loss (TRL's
    counts the tokens from the mask) and no count of the non-padding tokens seen (which reads it)."""
    from transformers import Trainer

    counts = getattr(trainer.args, "include_num_input_tokens_seen", "no") == "non_padding"
    return type(trainer).compute_loss is Trainer.compute_loss and not counts


def without_full_mask(collate):
    """The collate, with an attention_mask of all ones left out of its batches, read on the host: the model
    treats such a mask as none, but finds it all ones only by reading it back from the GPU."""

    def collate_without_full_mask(features):
        batch = collate(features)
        mask = batch.get("attention_mask") if hasattr(batch, "get") else None
        if isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and bool(mask.all()):
            del batch["attention_mask"]
        return batch

    return collate_without_full_mask


def own_positions_not_read(model):
    """For a batch without attention_mask, Hugging Face's causal mask reads the position ids back from the
    GPU, to find sequences packed into one row. Where the batch brings no position_ids the model counts
    each row from 0, one sequence a row: the read is skipped, and the mask is the same (SDPA's is_causal)."""
    from transformers import masking_utils

    find = getattr(masking_utils, "find_packed_sequence_indices", None)
    if find is None:
        return
    own = [False]  # whether the forward running now counts its own position ids

    def note_positions(module, args, kwargs):
        own[0] = kwargs.get("position_ids") is None

    def find_packed_sequence_indices(position_ids):
        return None if own[0] else find(position_ids)

    model.register_forward_pre_hook(note_positions, with_kwargs=True)
    model.register_forward_hook(lambda *args: own.__setitem__(0, False), always_call=True)
    masking_utils.find_packed_sequence_indices = find_packed_sequence_indices


def model_loss(model):
    """The model's own loss (a causal LM head's loss_function: labels shifted, float32, padding
    ignored) as the Trainer's compute_loss_func takes it: (outputs, labels, num_items_in_batch)."""
    loss_function = model.loss_function

    def loss(outputs, labels, num_items_in_batch=None):
        logits = outputs["logits"]
        return loss_function(logits, labels, vocab_size=logits.shape[-1], num_items_in_batch=num_items_in_batch)

    return loss
'''.splitlines()


def _module_doc(header: str, info: ModelInfo) -> list[str]:
    """The snippet's docstring but its closing quotes: the header (or a plain first line), how to
    call the snippet's functions, and what --parallel adds to that."""
    doc = header.strip() or "Compile settings found by autocompile."
    if info.framework == "trainer":
        return [
            '"""' + doc,
            "",
            "For a Hugging Face Trainer (TRL's SFTTrainer too): call apply_to_trainer(trainer) once, after",
            "building the Trainer and before trainer.train(). To start warm, call load_compile_cache(path)",
            "first with a cache from `autocompile export`.",
        ]
    lines = [
        '"""' + doc,
        "",
        "Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,",
        "if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and",
        "prepare_batch(batch) on every batch, right before the forward pass. Wrap your loss",
        "function (model outputs, batch) -> loss once with compile_loss(loss_fn), and call",
        "backward(loss) where you called loss.backward(). To start warm, call",
        "load_compile_cache(path) first with a cache from `autocompile export`.",
    ]
    if info.parallel != "none":
        from autocompile.parallel import PARALLEL_DOC

        lines += [""] + PARALLEL_DOC[info.parallel]
    return lines


def _apply_lines(config: dict, info: ModelInfo, checkpointing_body: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The settings, apply_compilation's first lines (the global settings, then what the scope
    compiles, both wrapped by DDP or FSDP2 under --parallel) and the helpers --parallel adds."""
    if not config["compile"]:
        settings, preamble, compiling = [], [], ["    # eager: nothing compiled"]
    else:
        settings, preamble = _global_lines(config, info)
        preamble += checkpointing_body
        scope_settings, compiling = _scope_lines(config, info)
        settings += scope_settings
    if info.parallel == "none":
        return settings, preamble + compiling, []
    from autocompile.parallel import parallel_lines

    parallel_settings, body, helpers = parallel_lines(config, info, preamble, compiling)
    return settings + parallel_settings, body, helpers


def _global_lines(config: dict, info: ModelInfo) -> tuple[list[str], list[str]]:
    """The settings and apply_compilation's lines for torch's global settings, set before anything
    is compiled: matmul precision, the activation memory budget, the recompile limit."""
    settings: list[str] = []
    preamble: list[str] = []
    if config["matmul_precision"]:
        preamble.append(f"    torch.set_float32_matmul_precision({config['matmul_precision']!r})")
    if config.get("activation_memory_budget") is not None:
        settings.append(
            f"ACTIVATION_MEMORY_BUDGET = {config['activation_memory_budget']!r}  "
            "# activations kept for the backward; the rest is recomputed"
        )
        preamble += [
            "    import torch._functorch.config  # AOTAutograd's partitioner reads it at each compile",
            "    torch._functorch.config.activation_memory_budget = ACTIVATION_MEMORY_BUDGET",
        ]
    if config["recompile_limit"] and info.recompile_limit_key:
        preamble.append(f"    torch._dynamo.config.{info.recompile_limit_key} = {config['recompile_limit']}")
    if config.get("capture_data_dependent"):  # .item() and nonzero traced, not graph breaks
        preamble += [
            "    torch._dynamo.config.capture_scalar_outputs = True  # Tensor.item() traced into the graph",
            "    torch._dynamo.config.capture_dynamic_output_shape_ops = True  # nonzero and the like too",
        ]
    return settings, preamble


def _scope_lines(config: dict, info: ModelInfo) -> tuple[list[str], list[str]]:
    """The settings and apply_compilation's lines that compile what the scope says: the whole model,
    each repeated block (regional) or each part with its own settings (modular)."""
    scope = config["scope"]
    if scope == "modular":
        per_part = {part: _kwargs(config, config["part_modes"][part], info.device_type) for part in info.parts}
        return [f"PART_COMPILE_KWARGS = {_literal(per_part)}  # each part with its own settings"], [
            "    for part, kwargs in PART_COMPILE_KWARGS.items():",
            "        model.get_submodule(part).compile(**kwargs)",
        ]
    settings = [f"COMPILE_KWARGS = {_literal(_kwargs(config, config['mode'], info.device_type))}"]
    if scope == "full":
        return settings, ["    model.compile(**COMPILE_KWARGS)  # in place: state_dict keys are unchanged"]
    settings.append(f"REGIONS = {_literal(info.regions)}  # lists of repeated blocks, each compiled alone")
    return settings, [
        "    for path in REGIONS:",
        "        for block in model.get_submodule(path):",
        "            block.compile(**COMPILE_KWARGS)",
    ]


def _optimizer_lines(config: dict) -> list[str]:
    """apply_compilation's lines for the optimizer: fused kernels, the learning rate as a tensor, the
    step compiled, under CUDA graphs of its own where the configuration says so (graph_step), its
    gradients at fixed addresses there and where static_grads says so."""
    body: list[str] = []
    if config["fused_optimizer"]:
        body += [
            "    for group in optimizer.param_groups:  # one fused kernel per step instead of foreach",
            '        group["foreach"], group["fused"] = False, True',
        ]
    graphed = bool(config["compile"] and config.get("graph_step"))
    if config["compile"] and config.get("lr_tensor"):
        body += _lr_tensor_lines(on_device=graphed)
    if config["compile"] and config["compile_optimizer"]:
        backend = config.get("backend", "inductor")  # another backend only in failure triage
        host = _host_options(config)
        if backend != "inductor":
            extra = f", backend={backend!r}"
        elif graphed:  # reduce-overhead's one option, beside the host's options (a mode and options do not mix)
            extra = f", options={_literal({'triton.cudagraphs': True, **host})}" if host else ', mode="reduce-overhead"'
        else:
            extra = f", options={_literal(host)}" if host else ""
        note = "  # one CUDA graph replayed a step" if graphed else ""
        body.append(f"    optimizer.step = torch.compile(optimizer.step{extra}){note}")
        if _marks_grads(config):
            body.append("    static_grads(optimizer)  # gradients at fixed addresses for CUDA graphs")
    return body


def _step_in_backward_lines(config: dict, info: ModelInfo) -> tuple[list[str], list[str], list[str]]:
    """The setting, apply_compilation's line and the function that step each repeated block's parameters in the
    backward (step_in_backward); the blocks are REGIONS' where the scope compiles them, else their own setting."""
    if not (config["compile"] and config.get("step_in_backward")):
        return [], [], []
    regional = config["scope"] == "regional" and info.parallel == "none"
    settings = [] if regional else [f"STEP_REGIONS = {_literal(info.regions)}  # lists of repeated blocks, each stepped apart"]
    regions = "REGIONS" if regional else "STEP_REGIONS"
    line = f"    step_in_backward(model, optimizer, {regions})  # each block's step beside the backward of the blocks before it"
    return settings, [line], STEP_IN_BACKWARD[1:] + ["", ""]


def _marks_grads(config: dict) -> bool:
    """Whether the snippet marks the compiled step's gradients static: static_grads, or graph_step's own."""
    return bool(config["compile"] and config["compile_optimizer"] and (config.get("static_grads") or config.get("graph_step")))


# The warm start, the same in every snippet: a compile cache saved by `autocompile export`.
WARM_START = '''
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
'''.splitlines()


# static_grads (001 step #3), emitted where the configuration says so.
STATIC_GRADS = '''
def static_grads(optimizer):
    """Gradients at fixed addresses for CUDA graphs (001 step #3): each gradient is marked static
    (torch._dynamo.mark_static_address) before the compiled step, so CUDA graphs read it where it
    is instead of copying it in, and optimizer.zero_grad() zeroes it in place (whatever set_to_none
    says: a freed gradient comes back at a new address). The first step copies each gradient into
    memory of its own: the first backward's gradients can be outputs of the model's CUDA graphs,
    which their next run overwrites (torch 2.11 raised "accessing tensor output of CUDAGraphs that
    has been overwritten" in the next backward). Zero gradients with optimizer.zero_grad()."""
    import functools

    compiled_step, zero_grad = optimizer.step, optimizer.zero_grad

    @functools.wraps(compiled_step)
    def step(*args, **kwargs):
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None and getattr(param.grad, "_dynamo_static_input_type", None) is None:
                    param.grad = param.grad.clone()  # our own memory, not a CUDA graph's output
                    torch._dynamo.mark_static_address(param.grad)
        return compiled_step(*args, **kwargs)

    optimizer.step = step
    optimizer.zero_grad = lambda set_to_none=True: zero_grad(set_to_none=False)
'''.splitlines()


# step_in_backward, emitted where the configuration says so: each repeated block's optimizer step as soon as the
# backward has its gradients, on a CUDA stream of its own, beside the backward of the blocks before it.
STEP_IN_BACKWARD = '''
def step_in_backward(model, optimizer, regions):
    """Each repeated block's optimizer step as soon as the backward has the block's last gradient, on a CUDA
    stream of its own, so that the memory-bound step runs beside the backward of the blocks before it (without
    CUDA, on the spot); optimizer.step() then waits for those steps and steps the rest (embeddings, head). The
    same update: a parameter's step reads its own gradient and state, with its group's settings of the moment
    (a scheduler's LR). For one backward per optimizer step with nothing between them that reads the gradients
    (no clipping, no accumulation): a second backward before optimizer.step() is an error, not a silent step."""
    import functools

    side = torch.cuda.Stream() if torch.cuda.is_available() else None
    stepped = set()  # the parameters stepped in this step's backward
    arrived = {}  # block index -> the parameters whose gradients are in
    step_groups = getattr(optimizer.step, "step_groups", None)  # a step that replaced the optimizer's (foreach_map_step)

    def block_step(params, by_group):
        groups = enumerate(zip(optimizer.param_groups, by_group))
        parts = [(i, {**group, "params": mine}) for i, (group, mine) in groups if mine]  # its settings of the moment
        stepped.update(params)
        if step_groups is not None:
            return step_groups(parts)  # one compiled graph for every block of the same shapes
        for _, group in parts:
            part = object.__new__(type(optimizer))  # the optimizer on these parameters, sharing its state
            part.__dict__.update(optimizer.__dict__)
            part.__dict__.pop("step", None)  # a scheduler's or a wrapper's patch of the whole optimizer's step
            part.param_groups = [group]
            part.step()

    def hook_for(index, params):
        by_group = [[p for p in group["params"] if p in params] for group in optimizer.param_groups]

        def hook(param):
            if param in stepped:
                raise RuntimeError("step_in_backward: a second backward before optimizer.step() (accumulation is not supported)")
            arrived.setdefault(index, set()).add(param)
            if len(arrived[index]) < len(params):
                return
            del arrived[index]
            if side is None:
                return block_step(params, by_group)
            side.wait_stream(torch.cuda.current_stream())  # the block's gradients written
            with torch.cuda.stream(side):
                block_step(params, by_group)

        return hook

    blocks = [block for path in regions for block in model.get_submodule(path)]
    owned = set()
    for index, block in enumerate(blocks):
        params = {p for p in block.parameters() if p.requires_grad}
        if owned & params:
            raise ValueError("step_in_backward: blocks share parameters, whose step would run once for each")
        owned |= params
        hook = hook_for(index, params)
        for param in params:
            param.register_post_accumulate_grad_hook(hook)
    own_step = optimizer.step

    @functools.wraps(own_step)
    def step(*args, **kwargs):
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)  # the blocks' steps done before anything reads them
        held = {p: p.grad for p in stepped}
        for param in held:
            param.grad = None  # stepped already: the optimizer's own step passes over them
        try:
            return own_step(*args, **kwargs)
        finally:
            for param, grad in held.items():
                param.grad = grad
            stepped.clear()
            arrived.clear()  # a block whose gradients did not all come was stepped just now, with the rest

    optimizer.step = step
'''.splitlines()


# The foreach_map step (001 step #4), emitted where the configuration says so: torch's Adam/AdamW
# arithmetic (torch.optim.adam's single-tensor step) as foreach_map ops. A foreach_map function may
# not close over anything, so every number it needs is an argument; the learning rate is a tensor
# (a scheduler's new value must not recompile the step), the other hyper-parameters are constants.
FOREACH_MAP_STEP = '''
def _first_moment(exp_avg, grad, beta1):
    return exp_avg.lerp(grad, 1 - beta1)


def _second_moment(exp_avg_sq, grad, beta2):
    return exp_avg_sq.mul(beta2).addcmul(grad, grad, value=1 - beta2)


def _first_moment_l2(exp_avg, grad, param, beta1, weight_decay):  # Adam's weight decay: added to the gradient
    return _first_moment(exp_avg, grad.add(param, alpha=weight_decay), beta1)


def _second_moment_l2(exp_avg_sq, grad, param, beta2, weight_decay):
    return _second_moment(exp_avg_sq, grad.add(param, alpha=weight_decay), beta2)


def _decayed(param, lr, weight_decay):  # AdamW's (decoupled) weight decay
    return param.mul(1 - lr * weight_decay)


def _updated(param, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps):
    step_size = lr / (1 - torch.pow(beta1, step))
    bias_correction2_sqrt = (1 - torch.pow(beta2, step)).sqrt()
    return param - step_size * exp_avg / (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps)


def _foreach_map_adam(groups):
    """One Adam/AdamW step over every parameter group, as foreach_map ops (state updated in place)."""
    foreach_map = torch._higher_order_ops.foreach_map
    for params, grads, exp_avgs, exp_avg_sqs, steps, lr, (beta1, beta2, eps, weight_decay, decoupled) in groups:
        torch._foreach_add_(steps, 1)
        if weight_decay != 0 and decoupled:
            torch._foreach_copy_(params, foreach_map(_decayed, params, lr, weight_decay))
        if weight_decay != 0 and not decoupled:
            exp_avgs_new = foreach_map(_first_moment_l2, exp_avgs, grads, params, beta1, weight_decay)
            exp_avg_sqs_new = foreach_map(_second_moment_l2, exp_avg_sqs, grads, params, beta2, weight_decay)
        else:
            exp_avgs_new = foreach_map(_first_moment, exp_avgs, grads, beta1)
            exp_avg_sqs_new = foreach_map(_second_moment, exp_avg_sqs, grads, beta2)
        params_new = foreach_map(_updated, params, exp_avgs_new, exp_avg_sqs_new, steps, lr, beta1, beta2, eps)
        # a higher-order op does not mutate its inputs: the new values are copied back in place
        torch._foreach_copy_(exp_avgs, exp_avgs_new)
        torch._foreach_copy_(exp_avg_sqs, exp_avg_sqs_new)
        torch._foreach_copy_(params, params_new)


def _adam_state(optimizer, param):
    """The parameter's Adam state under torch's names (a checkpoint loads either way), its step
    count on the parameter's device as torch's capturable and fused steps keep it."""
    state = optimizer.state[param]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    elif state["step"].device != param.device or state["step"].dtype != torch.float32:  # torch's own, on the CPU
        state["step"] = state["step"].to(device=param.device, dtype=torch.float32)
    return state


def foreach_map_step(optimizer):
    """Replace optimizer.step with the Adam/AdamW step as one compiled function of foreach_map ops,
    fused horizontally (001 step #4). It reads the hyper-parameters from optimizer.param_groups at
    every step (an LR scheduler's values included) and keeps its state in optimizer.state."""
    import functools
    import torch._higher_order_ops  # noqa: F401  (foreach_map)

    refusal = foreach_map_refusal(optimizer)
    if refusal:
        raise ValueError(f"foreach_map_step: {refusal}")
    compiled = torch.compile(_foreach_map_adam, **STEP_COMPILE_KWARGS)
    lrs = {}  # group index -> its learning rate as a tensor on its parameters' device

    @torch.no_grad()
    def step_groups(indexed):
        """Step (group index, group) pairs: the optimizer's own groups, or some of their parameters (step_in_backward)."""
        groups = []
        for index, group in indexed:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [_adam_state(optimizer, p) for p in params]
            if index not in lrs:
                lrs[index] = torch.zeros((), dtype=torch.float32, device=params[0].device)
            lrs[index].fill_(group["lr"])
            decoupled = group.get("decoupled_weight_decay", isinstance(optimizer, torch.optim.AdamW))
            groups.append((params, [p.grad for p in params], [s["exp_avg"] for s in states],
                           [s["exp_avg_sq"] for s in states], [s["step"] for s in states], lrs[index],
                           (*group["betas"], group["eps"], group["weight_decay"], bool(decoupled))))
        if groups:
            compiled(groups)

    @functools.wraps(optimizer.step)
    def step(closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        step_groups(enumerate(optimizer.param_groups))
        optimizer._opt_called = True  # what an LR scheduler's wrapper of the replaced step records
        return loss

    step.step_groups = step_groups
    optimizer.step = step
'''.splitlines()


# The model's own activation checkpointing switched, for a Hugging Face model (itself, or inside a
# wrapper such as peft's PeftModel), emitted where the configuration switches it.
HF_CHECKPOINTING = '''
# Hugging Face's switches, newest names first (transformers 5 renamed them from gradient_ to activation_)
_DISABLE = ("activation_checkpointing_disable", "gradient_checkpointing_disable")
_ENABLE = (("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
           ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"))


def _checkpointing_model(model):
    """The Hugging Face model in `model`: itself, or the one a wrapper (peft's PeftModel) holds."""
    for module in model.modules():
        if any(callable(getattr(type(module), name, None)) for name in _DISABLE):
            return module
    raise ValueError("no Hugging Face model with activation checkpointing in this model")


def _method(owner, names):
    return next(getattr(owner, name) for name in names if callable(getattr(type(owner), name, None)))


def model_checkpointing_off(model):
    """Turn the model's own activation checkpointing off: each block's forward runs once, and
    compile's partitioner chooses what to recompute in the backward (ACTIVATION_MEMORY_BUDGET)."""
    _method(_checkpointing_model(model), _DISABLE)()
'''.splitlines()

# Selective checkpointing's policy, as torchtitan's: what matrix products and attention compute is kept,
# the rest (norms, activations, elementwise work) recomputed.
SELECTIVE_POLICY = '''
SAVED_OPS = ("mm", "addmm", "bmm", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")


def save_matmuls(ctx, op, *args, **kwargs):
    """The selective policy: keep the outputs of SAVED_OPS for the backward, recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    saved = {getattr(torch.ops.aten, name).default for name in SAVED_OPS if hasattr(torch.ops.aten, name)}
    return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context():
    """What torch.utils.checkpoint.checkpoint takes as context_fn for the policy."""
    import functools

    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return functools.partial(create_selective_checkpoint_contexts, save_matmuls)
'''.splitlines()

HF_SELECTIVE = '''
def model_checkpointing_selective(model):
    """Keep the model's own activation checkpointing, each checkpoint under the selective policy."""
    owner = _checkpointing_model(model)
    for method, key in _ENABLE:
        if callable(getattr(type(owner), method, None)):
            getattr(owner, method)(**{key: {"use_reentrant": False, "context_fn": selective_context()}})
            return
'''.splitlines()


def _checkpointing_lines(config: dict, info: ModelInfo) -> tuple[list[str], list[str], list[str]]:
    """The docstring's words, apply_compilation's line and the functions that switch the model's own
    activation checkpointing, where the configuration does (off, or selective); nothing otherwise."""
    how = config.get("activation_checkpointing", "as_built")
    found = info.checkpointing
    if not config["compile"] or how == "as_built" or found is None:
        return [], [], []
    if how == "off":
        doc = [
            "",
            "It turns the model's own activation checkpointing off (" + found.where + "): each block's",
            "forward runs once, and compile's partitioner recomputes what it does not keep instead.",
        ]
        call = found.off_name if found.kind != HUGGING_FACE else "model_checkpointing_off"
        body = [f"    {call}(model)  # the model's own activation checkpointing off: compile recomputes instead"]
    else:
        doc = [
            "",
            "It keeps the model's own activation checkpointing (" + found.where + ") under a selective",
            "policy: what matrix products and attention compute is kept, the rest recomputed.",
        ]
        if found.kind == HUGGING_FACE:
            body = ["    model_checkpointing_selective(model)  # matrix products and attention kept, the rest recomputed"]
        else:
            body = [f"    {found.selective_name}(model, selective_context())  # matrix products and attention kept"]
    if found.kind == HUGGING_FACE:
        blocks = [HF_CHECKPOINTING[1:]] + ([SELECTIVE_POLICY[1:], HF_SELECTIVE[1:]] if how == "selective" else [])
    else:
        blocks = [hook.splitlines() for hook in found.hooks] + ([SELECTIVE_POLICY[1:]] if how == "selective" else [])
    return doc, body, [line for block in blocks for line in block + ["", ""]]


def _step_lines(config: dict) -> tuple[list[str], list[str]]:
    """The settings and functions the optimizer step's options need: static_grads' and the
    foreach_map step's (with the refusal of optimizers it cannot stand in for, space/optimizer.py)."""
    functions: list[str] = []
    if _marks_grads(config):
        functions += STATIC_GRADS[1:] + ["", ""]
    if not (config["compile"] and config.get("foreach_map_optimizer")):
        return [], functions
    kwargs: dict = {}
    backend = config.get("backend", "inductor")  # another backend only in failure triage
    if backend != "inductor":
        kwargs["backend"] = backend
    if _host_options(config):
        kwargs["options"] = _host_options(config)
    if config.get("step_in_backward"):
        kwargs["dynamic"] = False  # a graph for the blocks' shapes, one for the rest's, neither for all lengths
    settings = [f"STEP_COMPILE_KWARGS = {_literal(kwargs)}  # the foreach_map optimizer step: a graph of its own"]
    functions += inspect.getsource(foreach_map_refusal).splitlines() + ["", ""] + FOREACH_MAP_STEP[1:] + ["", ""]
    return settings, functions


def _backward_lines(config: dict, info: ModelInfo) -> list[str]:
    """backward(loss): loss.backward(), or under Compiled Autograd (002): the autograd engine's whole
    backward traced and compiled as a graph of its own (dynamic shapes: one graph for all lengths)."""
    lines = ["def backward(loss):"]
    if not (config["compile"] and config.get("compiled_autograd")):
        return lines + ['    """The backward pass (call it where you called loss.backward())."""', "    loss.backward()"]
    api = info.compiled_autograd_api or "_enable"
    return lines + [
        '    """The backward pass, compiled by Compiled Autograd (call it where you called loss.backward())."""',
        "    import torch._dynamo.compiled_autograd",
        "",
        f"    with torch._dynamo.compiled_autograd.{api}(lambda graph: torch.compile(graph, dynamic=True)):",
        "        loss.backward()",
    ]


def _lr_tensor_lines(on_device: bool = False) -> list[str]:
    """PyTorch's recipe for a compiled optimizer step under an LR scheduler: the learning rate
    as a tensor, whose value the scheduler fills in (LRScheduler updates a tensor LR in place).
    As a Python float it is a constant of the compiled step, which then recompiles at every
    change (once per step under a warm-up), soon hitting the recompile limit. `on_device`: on the
    parameters' device, where the step's CUDA graphs read it (a CPU tensor keeps a graph from being
    recorded)."""
    lines = [
        "    # The learning rate as a tensor, so an LR scheduler's new value does not recompile the",
        "    # compiled optimizer step (a float LR is a constant of the compiled code).",
        "    for group in optimizer.param_groups:",
        '        device = group["params"][0].device',
    ]
    if on_device:
        lines += [
            "        # on the parameters' device: the step's CUDA graphs read it where the scheduler fills it in",
            '        group["lr"] = torch.tensor(float(group["lr"]), device=device)',
        ]
    else:
        lines += [
            "        # A fused kernel reads a tensor LR on the parameters' device (a CPU one it reads back",
            "        # as a number, which a CUDA graph would freeze); compiled steps take it on the CPU.",
            '        group["lr"] = torch.tensor(float(group["lr"]), device=device if group.get("fused") else "cpu")',
        ]
    return lines + [
        '        if group.get("foreach") and not group.get("capturable") and device.type == "cpu":',
        "            # foreach takes a tensor LR only when capturable, which needs an accelerator",
        "            # (on a GPU, torch.compile makes a fresh optimizer capturable itself)",
        '            group["foreach"] = False',
    ]


def _compile_loss_lines(config: dict) -> tuple[list[str], list[str]]:
    """compile_loss(loss_fn): the criterion compiled apart from the model when the
    configuration says so (one graph: fullgraph), else returned unchanged."""
    doc = [
        '    """Compile the loss function apart from the model, or not: use it once on the function',
        "    that turns the model's outputs and the batch into the loss, then call what it returns:",
        "    loss_fn = compile_loss(loss_fn); loss = loss_fn(model(...), batch).",
        '    """',
    ]
    settings = _loss_compile_settings(config)
    if not (config["compile"] and config.get("compile_loss")):
        return settings, ["def compile_loss(loss_fn):"] + doc + ["    return loss_fn  # not compiled in this configuration"]
    return settings, ["def compile_loss(loss_fn):"] + doc + [
        "    return torch.compile(loss_fn, fullgraph=True, **LOSS_COMPILE_KWARGS)"
    ]


def _loss_compile_settings(config: dict) -> list[str]:
    """LOSS_COMPILE_KWARGS, where a loss is compiled apart: the criterion (compile_loss), the chunked lm_loss."""
    if not config["compile"] or not (config.get("compile_loss") or config.get("lm_loss") == "chunked"):
        return []
    kwargs: dict = {}
    backend = config.get("backend", "inductor")
    if backend != "inductor":
        kwargs["backend"] = backend
    if config["dynamic"] is not None:
        kwargs["dynamic"] = config["dynamic"]
    if _host_options(config):
        kwargs["options"] = _host_options(config)
    return [f"LOSS_COMPILE_KWARGS = {_literal(kwargs)}  # the loss: one graph of its own"]


def _prepare_batch_body(config: dict, info: ModelInfo) -> tuple[list[str], list[str], list[str]]:
    if config["padding"] == "pack" and info.varying:
        return _pack_lines(config, info)
    body: list[str] = []
    settings: list[str] = []
    padding = config["padding"]
    pads = info.varying and padding != "longest"
    marks = info.varying and config["compile"] and config["mark_dynamic"] != "off"
    if pads or marks:
        settings.append(f"VARYING = {_literal({k: tuple(v) for k, v in info.varying.items()})}  # key: (dim, pad value)")
    if pads:
        if padding == "max":
            settings.append(f"PAD_TO = {info.max_len}  # every batch padded to the longest possible")
            target = "PAD_TO"
        elif padding == "multiple":
            settings.append(f"PAD_MULTIPLE = {config['pad_multiple']}  # the longest in the batch, rounded up")
            target = "-(-length // PAD_MULTIPLE) * PAD_MULTIPLE"
        else:
            settings.append(f"BUCKETS = {bucket_lengths(info.max_len)}  # a few fixed lengths: one graph each")
            target = "next(b for b in BUCKETS if b >= length)"
        body += [
            "    for key, (dim, pad_value) in VARYING.items():",
            "        tensor = batch[key]",
            "        length = tensor.shape[dim]",
            f"        target = {target}",
            "        if target > length:",
            "            widths = [0, 0] * (tensor.dim() - 1 - dim) + [0, target - length]",
            "            batch[key] = torch.nn.functional.pad(tensor, widths, value=pad_value)",
        ]
    if marks:
        fn = "mark_dynamic" if config["mark_dynamic"] == "mark" else "maybe_mark_dynamic"
        body += ["    for key, (dim, _) in VARYING.items():", f"        torch._dynamo.{fn}(batch[key], dim)"]
    if config["compile"] and info.device_type == "cuda" and uses_cuda_graphs(config):
        body += CUDA_GRAPH_STEP
    return body, settings, []


CUDA_GRAPH_STEP = [
    "    # CUDA graphs reuse their output buffers: tell them a new training step begins",
    "    torch.compiler.cudagraph_mark_step_begin()",
]

# The packed batch, said in prepare_batch's docstring.
PACK_DOC = '''    """Packs the batch's sequences into rows for the compiled model (call it where the collate ends).

    The keys of VARYING come back packed: each sequence whole in one row, rows filled longest first, so
    no padding is computed but the rows' tails. POSITIONS is added: position ids that restart at each
    sequence, which the forward must pass to the model (they tell it where each sequence starts). MASK,
    where set: None for a causal decoder (it takes its mask from the position ids), or, for an encoder,
    a block-diagonal mask that keeps each sequence to itself. The loss covers the same tokens as the
    padded batch's: the real items are unchanged.

    Give it the batch on the host, in the collate or before moving it to the GPU: it reads each
    sequence's length, which on a GPU batch waits for the GPU to finish the step before. Then move the
    packed batch pinned and with non_blocking=True, as a DataLoader with pin_memory=True does.
    """'''.splitlines()

# Packing itself (torch only): the batch's sequences, read as right-padded rows, gathered into new rows.
PACK = '''
def pack_plan(batch):
    """Where each packed token comes from: the batch's sequences, read as right-padded rows, placed whole
    into rows of PACK_LENGTH tokens (the whole batch in one row of a multiple of PACK_MULTIPLE where
    PACK_LENGTH is None), first fit, longest first. Returns, for each packed token, its flat index in the
    batch (-1: the row's padded tail), its position, its sequence in the row, whether it starts one; and
    the packed shape."""
    real = batch[MASK].bool() if MASK else torch.stack([batch[k] != pad for k, (_, pad) in VARYING.items()]).any(0)
    width = real.shape[1]
    lengths = torch.where(real.any(1), width - real.flip(1).int().argmax(1), 0).tolist()
    capacity = max(PACK_LENGTH or sum(lengths), max(lengths))
    rows, room = [], []
    for i in sorted((i for i, n in enumerate(lengths) if n), key=lambda i: -lengths[i]):
        j = next((j for j, free in enumerate(room) if free >= lengths[i]), None)
        if j is None:
            rows.append([])
            room.append(capacity)
            j = len(rows) - 1
        rows[j].append(i)
        room[j] -= lengths[i]
    length = capacity if PACK_LENGTH else -(-capacity // PACK_MULTIPLE) * PACK_MULTIPLE
    source, positions, sequence, starts = [], [], [], []
    for members in rows:
        for k, i in enumerate(members):
            source += range(i * width, i * width + lengths[i])
            positions += range(lengths[i])
            sequence += [k] * lengths[i]
            starts += [True] + [False] * (lengths[i] - 1)
        tail = length - sum(lengths[i] for i in members)
        source += [-1] * tail
        positions += range(tail)  # the tail is a sequence of its own: it sees nothing real, nothing real sees it
        sequence += [len(members)] * tail
        starts += [False] * tail
    return source, positions, sequence, starts, (len(rows), length)


def pack(batch):
    """The batch with its sequences packed (pack_plan), position ids added, and its mask as the model
    needs it under packing."""
    source, positions, sequence, starts, shape = pack_plan(batch)
    device = batch[next(iter(VARYING))].device
    source = torch.tensor(source, device=device)
    tail, first = source < 0, torch.tensor(starts, device=device)
    for key, (_, pad_value) in VARYING.items():
        values = batch[key].reshape(-1)[source.clamp(min=0)].masked_fill(tail, pad_value)
        if key in SHIFTED:  # a loss that shifts its labels: no sequence learns to predict the next one's start
            values = values.masked_fill(first, pad_value)
        batch[key] = values.view(shape)
    batch[POSITIONS] = torch.tensor(positions, device=device).view(shape)
    if MASK and CAUSAL:
        batch[MASK] = None  # a causal decoder takes its packed mask from the position ids
    elif MASK:
        sequence = torch.tensor(sequence, device=device).view(shape)
        apart = sequence[:, None, :, None] != sequence[:, None, None, :]
        batch[MASK] = torch.zeros(apart.shape, dtype=MASK_DTYPE, device=device).masked_fill(
            apart, torch.finfo(MASK_DTYPE).min)
    return batch
'''.splitlines()


FLEX_ATTENTION = '''
def flex_attention_on(model):
    """The model's attention as FlexAttention (Hugging Face's set_attn_implementation on the model, or on
    the one a wrapper such as peft's holds): it builds a document mask from the position ids, and the
    blocks of a packed row where one sequence would see another are skipped, not computed and masked."""
    for module in model.modules():
        if callable(getattr(type(module), "set_attn_implementation", None)):
            module.set_attn_implementation("flex_attention")
            return
    raise ValueError("flex_attention_on: no Hugging Face model in this model")
'''.splitlines()


VARLEN_ATTENTION = '''
from torch.nn.attention.varlen import varlen_attn


def varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, position_ids=None, **kwargs):
    """A packed row's attention as Flash Attention over variable-length sequences (torch's varlen_attn):
    each sequence (where its position ids restart at 0) attends causally to itself only, and nothing
    across sequences is computed, not even masked. The model builds no mask for it (attention_mask None)."""
    if dropout:
        raise ValueError("varlen_attention: attention dropout is not supported")
    batch, heads, length, dim = query.shape
    if position_ids is None or position_ids.numel() != batch * length:
        raise ValueError("varlen_attention: the forward must pass the packed batch's position ids")
    # Where each sequence ends (the next token's position is 0, or the row's last token), in a fixed count
    # of MAX_SEQUENCES: the count not used ends where the last sequence does (zero-length sequences). No
    # value depends on the row's length, so one compiled graph serves every length.
    positions = position_ids.reshape(-1)
    ends = torch.cat([positions[1:] == 0, torch.ones_like(positions[:1], dtype=torch.bool)])
    ends = torch.nonzero_static(ends, size=MAX_SEQUENCES, fill_value=-1).reshape(-1) + 1
    cu_seq = torch.cat([torch.zeros_like(ends[:1]), ends.cummax(0).values]).to(torch.int32)
    query, key, value = (x.transpose(1, 2).reshape(batch * length, x.shape[1], dim) for x in (query, key, value))
{gqa}    out = varlen_attn(query, key, value, cu_seq, cu_seq, MAX_LEN, MAX_LEN, {causal})
    return out.view(batch, length, heads, dim), None


def varlen_attention_on(model):
    """The model's attention as varlen_attention (registered with Hugging Face's AttentionInterface, set on
    the model, or on the one a wrapper such as peft's holds)."""
    from transformers import AttentionInterface

    AttentionInterface.register("autocompile_varlen", varlen_attention)
    for module in model.modules():
        if callable(getattr(type(module), "set_attn_implementation", None)):
            module.set_attn_implementation("autocompile_varlen")
            return
    raise ValueError("varlen_attention_on: no Hugging Face model in this model")
'''

# In pack, under varlen attention: the sequences a packed batch holds fit the attention's fixed count.
VARLEN_CHECK = [
    "    if positions.count(0) > MAX_SEQUENCES:  # each sequence, and each row's tail, starts at position 0",
    '        raise ValueError(f"pack: {positions.count(0)} sequences in a packed batch, MAX_SEQUENCES is {MAX_SEQUENCES}")',
]


def varlen_attention_lines() -> list[str]:
    """VARLEN_ATTENTION as the installed torch calls it: causal by window (torch 2.11 on) or by flag (2.10),
    grouped key/value heads given as they are where varlen_attn takes them, repeated where it does not."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal = "window_size=(-1, 0)" if "window_size" in params else "is_causal=True"
    causal += ", scale=scaling" if "scale" in params else ""
    gqa = ""
    if "enable_gqa" in params:
        causal += ", enable_gqa=key.shape[1] != heads"
    else:
        gqa = (
            "    if key.shape[1] != heads:  # grouped key/value heads: this torch's varlen_attn takes them repeated\n"
            "        key, value = (x.repeat_interleave(heads // x.shape[1], dim=1) for x in (key, value))\n"
        )
    if "scale" not in params:
        gqa += (
            "    if scaling is not None and abs(scaling - dim**-0.5) > 1e-6:  # this torch's varlen_attn: 1/sqrt(dim)\n"
            '        raise ValueError("varlen_attention: this torch\'s varlen_attn takes no scale")\n'
        )
    return VARLEN_ATTENTION.format(gqa=gqa, causal=causal).splitlines()[1:]


SDPA_FLASH = '''
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa_flash(module, query, key, value, attention_mask, **kwargs):
    """The model's own SDPA attention with its kernel chosen among SDPA_BACKENDS: Flash Attention, the
    memory-efficient kernel where a mask needs one, else math; never cuDNN's, which plans each new sequence
    length on the host. The choice is traced into the compiled graphs, so compile caches keep them apart."""
    with sdpa_kernel(SDPA_BACKENDS):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def sdpa_flash_on(model):
    """The model's attention as sdpa_flash, set on the model (or on the one a wrapper such as peft's holds):
    registered with Hugging Face's AttentionInterface under a name without "flash" (which it would take for
    its own Flash Attention), its masks built as SDPA's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("autocompile_sdpa", sdpa_flash)
    AttentionMaskInterface.register("autocompile_sdpa", sdpa_mask)
    for module in model.modules():
        if callable(getattr(type(module), "set_attn_implementation", None)):
            module.set_attn_implementation("autocompile_sdpa")
            return
    raise ValueError("sdpa_flash_on: no Hugging Face model in this model")
'''.splitlines()


def _attention_lines(config: dict) -> tuple[list[str], list[str]]:
    """apply_compilation's line and the functions that choose the SDPA kernel of the model's own attention."""
    if config.get("attention", "model") == "model":
        return [], []
    line = "    sdpa_flash_on(model)  # the model's SDPA attention on Flash Attention's kernels, not cuDNN's"
    return [line], SDPA_FLASH[1:] + ["", ""]


EXPERTS_ON = '''
def experts_on(model, implementation):
    """The experts of a Hugging Face mixture of experts computed by another of transformers' implementations, set
    on the model (or on the one a wrapper such as peft's holds), which passes it to its sub-models."""
    for module in model.modules():
        if callable(getattr(type(module), "set_experts_implementation", None)):
            module.set_experts_implementation(implementation)
            return
    raise ValueError("experts_on: no Hugging Face model in this model")
'''.splitlines()


def _experts_lines(config: dict) -> tuple[list[str], list[str]]:
    """apply_compilation's line and the function that switch the implementation of a mixture of experts' experts."""
    how = config.get("experts", "model")
    if how == "model":
        return [], []
    line = f'    experts_on(model, "{how}")  # the experts computed by transformers\' {how} implementation'
    return [line], EXPERTS_ON[1:] + ["", ""]


LINEAR_LOSS_ON = '''
class HiddenHead(torch.nn.Linear):
    """The model's output head passing the last hidden states through, its weight kept where it was (state_dict
    keys, tied weights and the optimizer unchanged): the loss multiplies them by it, a chunk of tokens at a time."""

    def forward(self, hidden):
        return hidden


def linear_loss_on(model, cross_entropy):
    """The Hugging Face causal LM in the model (itself, or the one a wrapper such as peft's holds) with its head
    bypassed, and its loss_function computing cross_entropy(hidden, weight, targets, ignore_index) from what it
    then calls its logits: its last hidden states. The whole [tokens, vocabulary] logits never exist."""
    for module in model.modules():
        if type(module).__name__.endswith("ForCausalLM"):
            head = module.get_output_embeddings()
            head.__class__ = HiddenHead
            module.loss_function = linear_loss_function(head, cross_entropy)
            return model
    raise ValueError("linear_loss_on: no Hugging Face causal LM in this model")


def linear_loss_function(head, cross_entropy):
    """transformers' ForCausalLMLoss from the last hidden states: the labels shifted (unless given shifted), -100
    ignored, the sum over the tokens divided by num_items_in_batch where the Trainer counts them, else their mean."""

    def loss_function(logits, labels, vocab_size=None, num_items_in_batch=None, ignore_index=-100, shift_labels=None, **kwargs):
        hidden = logits.reshape(-1, logits.shape[-1])  # the head passed its input through
        if shift_labels is None:
            shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
        targets = shift_labels.reshape(-1).to(hidden.device)
        total = cross_entropy(hidden, head.weight, targets, ignore_index)
        if num_items_in_batch is None:
            return total / (targets != ignore_index).sum()
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    return loss_function
'''.splitlines()

FUSED_CROSS_ENTROPY = '''
def fused_cross_entropy(hidden, weight, targets, ignore_index):
    """torch's linear cross-entropy summed over the tokens, on its chunked path: each chunk's logits give their
    gradients in the forward. allow_retain_graph: what it sets itself under torch.compile, set here without a warning."""
    options = torch.nn.LinearCrossEntropyOptions(allow_retain_graph=True)
    loss = torch.nn.functional.linear_cross_entropy(
        hidden, weight, targets, ignore_index=ignore_index, reduction="sum", options=options
    )
    return loss.float()
'''.splitlines()

CHUNKED_CROSS_ENTROPY = '''
LOSS_CHUNKS = 8  # the tokens' logits computed in this many chunks, one at a time


class ChunkedCrossEntropy(torch.autograd.Function):
    """Cross-entropy of hidden @ weight.T summed over the tokens, LOSS_CHUNKS chunks of them one at a time: each
    chunk's logits (float32) give its loss and its gradients at once, so the backward only scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index):
        total = hidden.new_zeros((), dtype=torch.float32)
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        grad_hidden = []
        for rows, labels in zip(hidden.tensor_split(LOSS_CHUNKS), targets.tensor_split(LOSS_CHUNKS)):
            logits = (rows @ weight.T).float()
            kept = labels != ignore_index
            labels = torch.where(kept, labels, 0)[:, None]
            total = total + ((logits.logsumexp(-1) - logits.gather(1, labels)[:, 0]) * kept).sum()
            grad = logits.softmax(-1).scatter_add(1, labels, torch.full_like(labels, -1, dtype=logits.dtype))
            grad = (grad * kept[:, None]).to(hidden.dtype)  # softmax less the one-hot label, on kept tokens
            grad_hidden.append(grad @ weight)
            if grad_weight is not None:
                grad_weight += (grad.T @ rows).float()
        ctx.save_for_backward(torch.cat(grad_hidden), None if grad_weight is None else grad_weight.to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_total = grad_total.to(grad_hidden.dtype)
        return grad_hidden * grad_total, None if grad_weight is None else grad_weight * grad_total, None, None


# ChunkedCrossEntropy compiled: each chunk's products, softmax and gradients in a few kernels
chunked_cross_entropy = torch.compile(ChunkedCrossEntropy.apply, fullgraph=True, **LOSS_COMPILE_KWARGS)
'''.splitlines()


def _lm_loss_doc(config: dict, info: ModelInfo) -> list[str]:
    """What a training loop must know where apply_compilation takes the loss from the hidden states."""
    if info.framework == "trainer" or not _lm_loss_lines(config)[0]:
        return []
    return [
        "",
        "apply_compilation makes the model's logits its last hidden states, which its loss_function takes:",
        "compute the loss through the model (labels=...) or its loss_function, not from the logits.",
    ]


def _lm_loss_lines(config: dict) -> tuple[list[str], list[str]]:
    """apply_compilation's line and the functions that compute a causal LM's loss from its last hidden states."""
    how = config.get("lm_loss", "model")
    if how == "model" or not config["compile"]:
        return [], []
    line = f"    linear_loss_on(model, {how}_cross_entropy)  # the loss from the hidden states: no whole logits"
    functions = FUSED_CROSS_ENTROPY if how == "fused" else CHUNKED_CROSS_ENTROPY
    return [line], LINEAR_LOSS_ON[1:] + ["", ""] + functions[1:] + ["", ""]


def _pack_apply_lines(config: dict, info: ModelInfo) -> tuple[list[str], list[str]]:
    """What apply_compilation does for packed batches: the encoder mask's dtype taken from the model, and
    the attention switched to FlexAttention where the configuration says so."""
    if config["padding"] != "pack" or not info.varying:
        return [], []
    layout = info.layout or SequenceLayout()
    body = []
    if layout.mask and not layout.causal:
        body += [
            "    global MASK_DTYPE  # the packed rows' block-diagonal mask is added to the attention scores",
            "    MASK_DTYPE = next(model.parameters()).dtype",
        ]
    if config.get("pack_attention", "model") == "flex":
        body += ["    flex_attention_on(model)  # packed rows: a document mask, blocks across sequences skipped"]
        return body, FLEX_ATTENTION[1:] + ["", ""]
    if config.get("pack_attention", "model") == "varlen":
        body += ["    varlen_attention_on(model)  # packed rows: Flash Attention over each sequence, nothing across"]
        return body, varlen_attention_lines() + ["", ""]
    return body, []


def _pack_lines(config: dict, info: ModelInfo) -> tuple[list[str], list[str], list[str]]:
    """prepare_batch's body, its settings and `pack`, where the configuration packs the batch."""
    layout = info.layout or SequenceLayout()
    one_row = config.get("pack_length", "longest") == "batch"
    settings = [
        f"VARYING = {_literal({k: tuple(v) for k, v in info.varying.items()})}  # key: (dim, pad value)",
        (
            "PACK_LENGTH = None  # the whole batch in one row, its length a multiple of PACK_MULTIPLE"
            if one_row
            else f"PACK_LENGTH = {info.max_len}  # tokens a packed row holds: the workload's longest sequence"
        ),
        f"PACK_MULTIPLE = {config['pad_multiple'] if one_row else 1}",
        f"POSITIONS = {layout.positions!r}  # the key the forward passes to the model as its position ids",
        f"MASK = {layout.mask!r}  # the key of the padding mask the forward passes, if any",
        f"CAUSAL = {layout.causal!r}  # a causal decoder: its mask comes from the position ids",
        f"SHIFTED = {_literal(tuple(layout.shifted))}  # labels the loss shifts: each sequence's first ignored",
    ]
    settings.append(
        "MASK_DTYPE = torch.float32  # a non-causal mask's under packing: the model's, set by apply_compilation"
        if layout.mask and not layout.causal
        else "MASK_DTYPE = None  # no block-diagonal mask: MASK is None or CAUSAL"
    )
    function = PACK[1:]
    if config.get("pack_attention", "model") == "varlen":
        settings += [
            f"MAX_SEQUENCES = {2 * max(info.rows, 1)}  # varlen attention: sequences in a packed batch, tails too, at most",
            f"MAX_LEN = {info.max_len}  # varlen attention: the longest sequence",
        ]
        at = function.index("    batch[POSITIONS] = torch.tensor(positions, device=device).view(shape)")
        function = function[:at] + VARLEN_CHECK + function[at:]
    body = ["    batch = pack(batch)"]
    if config["compile"] and info.device_type == "cuda" and uses_cuda_graphs(config):
        body += CUDA_GRAPH_STEP
    return body, settings, function + ["", ""]


_LOADED = itertools.count()


def load_snippet(source: str, filename: str | None = None) -> dict:
    """Execute a rendered snippet as a module of its own; returns its namespace (apply_compilation,
    prepare_batch). The module is in sys.modules under a name of its own, as the pasted file is
    once imported: Dynamo finds the globals of a function it inlines from another module's code
    (foreach_map calls the step's functions from torch's) by importing that function's module.
    Each load has a file name of its own too: torch 2.13 confused the foreach_map subgraphs of two
    snippets loaded under one name (AdamW's step, then Adam's, in one process: Inductor's
    "A subgraph argument other than striding has been modified")."""
    number = next(_LOADED)
    module = types.ModuleType(f"autocompile_snippet_{number}")
    sys.modules[module.__name__] = module
    exec(compile(source, filename or f"<apply_compilation {number}>", "exec"), module.__dict__)
    return module.__dict__


def describe_config(config: dict) -> str:
    """One short line for progress output and tables."""
    from autocompile.space import DEFAULTS

    config = {**DEFAULTS, **config}  # records written before a key existed
    if not config["compile"]:
        return (
            "eager"
            + ("" if config["padding"] == "longest" else f" pad={config['padding']}")
            + (" fused-opt" if config.get("fused_optimizer") else "")
        )
    parts = [config["scope"]]
    if config["scope"] == "modular":
        parts.append(",".join(f"{p}={m}" for p, m in config["part_modes"].items()))
    else:
        parts.append(config["mode"])
    if config["dynamic"] is not None:
        parts.append(f"dynamic={config['dynamic']}")
    if config["fullgraph"]:
        parts.append("fullgraph")
    if config.get("capture_data_dependent"):
        parts.append("capture-dd")
    if config["compile_optimizer"]:
        parts.append("opt")
    if config.get("lr_tensor"):
        parts.append("lr-tensor")
    if config.get("compile_loss"):
        parts.append("loss")
    if config.get("fused_optimizer"):
        parts.append("fused-opt")
    if config.get("foreach_map_optimizer"):
        parts.append("foreach-map-opt")
    if config.get("clip_in_step"):
        parts.append("clip-in-step")
    if config.get("step_in_backward"):
        parts.append("step-in-backward")
    if config.get("static_grads"):
        parts.append("static-grads")
    if config.get("attention", "model") != "model":
        parts.append(f"attn-{config['attention']}")
    if config.get("experts", "model") != "model":
        parts.append(f"experts-{config['experts']}")
    if config.get("lm_loss", "model") != "model":
        parts.append(f"loss-{config['lm_loss']}")
    if config["padding"] == "pack":
        one_row = config.get("pack_length", "longest") == "batch"
        parts.append(
            "pack"
            + (f"=one-row{config['pad_multiple']}" if one_row else "=rows")
            + ("" if config.get("pack_attention", "model") == "model" else f"-{config['pack_attention']}")
        )
    elif config["padding"] != "longest":
        parts.append(f"pad={config['padding']}" + (f"{config['pad_multiple']}" if config["padding"] == "multiple" else ""))
    if config["mark_dynamic"] != "off":
        parts.append(f"{config['mark_dynamic']}_dynamic")
    if config.get("compiled_autograd"):
        parts.append("compiled-autograd")
    if config.get("activation_checkpointing", "as_built") != "as_built":
        parts.append(f"model-ckpt={config['activation_checkpointing']}")
    if config.get("activation_memory_budget") is not None:
        parts.append(f"act-budget={config['activation_memory_budget']:g}")
    if config.get("optimize_ddp") is not None:
        parts.append(f"optimize_ddp={config['optimize_ddp']}")
    if config.get("fsdp_compile_order", "before") != "before" and config["scope"] == "regional":
        parts.append(f"compiled-{config['fsdp_compile_order']}-shard")
    if config.get("reshard_after_forward") is False:
        parts.append("no-reshard")
    for key, value in config["inductor"].items():
        parts.append(f"{key}={json.dumps(value)}")
    return " ".join(parts)


__all__ = ["ModelInfo", "render_snippet", "load_snippet", "find_repeated_blocks", "describe_config"]
