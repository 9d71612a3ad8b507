"""Small workloads for the tests, loaded the way users load theirs: `tests/toy_workloads.py:NAME`.

A toy token model (embedding, two repeated blocks, head) compiles in seconds on 2 CPU
cores. Variants misbehave on purpose, each in a real way: a graph break, a crash of the
process, a hang, an allocation the machine cannot satisfy.
"""

from __future__ import annotations

import os
import random
import signal
import time

import torch

from autocompile.workloads import Workload, WorkloadOptions

VOCAB, WIDTH, MAX_LEN = 64, 32, 48


class Block(torch.nn.Module):
    def __init__(self, eager_oom: bool = False):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 2 * WIDTH)
        self.down = torch.nn.Linear(2 * WIDTH, WIDTH)
        self.eager_oom = eager_oom

    def forward(self, x):
        if self.eager_oom and torch.is_grad_enabled() and not torch.compiler.is_compiling():
            torch.empty(2**44)  # eager training keeps what a compiled block does not: it does not fit
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Toy(torch.nn.Module):
    def __init__(self, graph_break: bool = False, differs_compiled: bool = False, depth: int = 2, eager_oom: bool = False):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList([Block(eager_oom) for _ in range(depth)])
        self.head = torch.nn.Linear(WIDTH, VOCAB)
        self.graph_break = graph_break
        self.differs_compiled = differs_compiled

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        if self.graph_break == "item":  # a data-dependent scalar: Dynamo breaks the graph there unless it captures it
            x = x * (1 + (input_ids > VOCAB // 2).sum().item() % 2)
        elif self.graph_break:
            torch._dynamo.graph_break()  # what a print() in a model does
        if self.differs_compiled and torch.compiler.is_compiling():
            x = x * 1.5  # a model whose compiled result is not its eager one
        return self.head(x)


def _workload(
    name: str,
    graph_break=False,
    loss_hook=None,
    lengths=(8, MAX_LEN),
    differs=False,
    split_loss=True,
    schedule=None,
    depth=2,
    pool=4,
    eager_oom=False,
    output_hook=None,
) -> Workload:
    def build(options: WorkloadOptions):
        torch.manual_seed(options.seed)
        model = Toy(graph_break, differs, depth, eager_oom).to(options.device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batches(options: WorkloadOptions, n: int):
        rng = random.Random(options.seed)
        size = options.batch_size or 4
        out = []
        for _ in range(n):
            length = rng.randint(*lengths)
            ids = torch.randint(1, VOCAB, (size, length + 1), generator=torch.Generator().manual_seed(rng.randrange(2**31)))
            out.append({"input_ids": ids[:, :-1].to(options.device), "labels": ids[:, 1:].to(options.device)})
        return out

    def forward(model, batch):
        if loss_hook:
            loss_hook()
        logits = model(batch["input_ids"])
        return output_hook(model, logits) if output_hook else logits

    def criterion(logits, batch):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    def loss(model, batch):
        return criterion(forward(model, batch), batch)

    return Workload(
        name=name,
        description=f"test workload {name}",
        build=build,
        batches=batches,
        count=lambda batch: int((batch["labels"] != -100).sum()),
        unit="tokens",
        varying={"input_ids": (1, 0), "labels": (1, -100)},
        max_len=lambda options: MAX_LEN,
        batch_pool=pool,
        **({"forward": forward, "criterion": criterion} if split_loss else {"loss": loss}),
        schedule=schedule,
    )


def toy() -> Workload:
    return _workload("toy")


def toy_fixed() -> Workload:
    """Every batch the same length: nothing to pad, nothing to recompile."""
    return _workload("toy-fixed", lengths=(MAX_LEN, MAX_LEN))


def toy_item() -> Workload:
    """A model that reads a data-dependent scalar (Tensor.item()) in its forward, at one length: the whole
    model compiled breaks its graph there, unless Dynamo is told to capture it."""
    return _workload("toy-item", graph_break="item", lengths=(MAX_LEN, MAX_LEN))


def toy_deep() -> Workload:
    """Six repeated blocks, one length, two batches: a model to screen with its blocks cut (its
    builder ignores WorkloadOptions.blocks, as a user's file does: they are cut after it is built)."""
    return _workload("toy-deep", lengths=(16, 16), depth=6, pool=2)


def toy_graph_break() -> Workload:
    # One length: each piece around the break compiles once (the test is about the break).
    return _workload("toy-graph-break", graph_break=True, lengths=(MAX_LEN, MAX_LEN))


def toy_differs() -> Workload:
    return _workload("toy-differs", differs=True, lengths=(MAX_LEN, MAX_LEN))


def toy_crash() -> Workload:
    return _workload("toy-crash", loss_hook=lambda: os.kill(os.getpid(), signal.SIGSEGV))


def toy_hang() -> Workload:
    return _workload("toy-hang", loss_hook=lambda: time.sleep(3600))


def toy_oom() -> Workload:
    # A real allocation the machine cannot satisfy (2**44 floats = 64 TiB).
    return _workload("toy-oom", loss_hook=lambda: torch.empty(2**44))


def toy_eager_oom() -> Workload:
    """Eager training runs out of memory (each block asks for 64 TiB unless it runs compiled), as
    llama-8b's eager AdamW does on an 80 GB card; compiled, it fits."""
    return _workload("toy-eager-oom", lengths=(MAX_LEN, MAX_LEN), eager_oom=True)


def toy_loss_only() -> Workload:
    """The loss as one function, as plugins written before forward/criterion give it."""
    return _workload("toy-loss-only", split_loss=False)


def toy_scheduled() -> Workload:
    """The learning rate changes every step (LambdaLR), as under a warm-up schedule."""
    return _workload(
        "toy-scheduled", schedule=lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / 100)
    )


not_a_workload = 42


class ReluBlock(Block):
    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


def toy_relu() -> Workload:
    """ReLU blocks: Inductor's test hook `cpp.inject_relu_bug_TESTING_ONLY` breaks exactly these."""
    workload = _workload("toy-relu", lengths=(MAX_LEN, MAX_LEN))  # one graph per rung
    plain_build = workload.build

    def build(options: WorkloadOptions):
        model, optimizer = plain_build(options)
        model.blocks = torch.nn.ModuleList([ReluBlock(), ReluBlock()]).to(options.device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    workload.build = build
    return workload


def _inductor_bug(name: str, bug: str) -> Workload:
    """ReLU blocks with Inductor's own test hook set by the model's builder (as a custom op's import
    would register one): eager and every backend below Inductor are right; Inductor is not. One
    length: one graph."""
    import torch._inductor.config as inductor_config

    workload = toy_relu()
    plain_build = workload.build

    def build(options: WorkloadOptions):
        inductor_config.cpp.inject_relu_bug_TESTING_ONLY = bug
        return plain_build(options)

    workload.build, workload.name = build, name
    return workload


def toy_inductor_crash() -> Workload:
    """Compiled by Inductor, its ReLU fails C++ code generation: a compile error of Inductor's."""
    return _inductor_bug("toy-inductor-crash", "compile_error")


def toy_inductor_wrong() -> Workload:
    """Compiled by Inductor, its ReLU computes relu(x) + 1: a numerics failure of Inductor's."""
    return _inductor_bug("toy-inductor-wrong", "accuracy")


class DropoutBlock(torch.nn.Sequential):
    """Linear, GELU (or ReLU), dropout p = 0.3; compiled, its output is multiplied by `scale_when_compiled`."""

    def __init__(self, scale_when_compiled: float = 1.0, relu: bool = False, p: float = 0.3):
        activation = torch.nn.ReLU() if relu else torch.nn.GELU()
        super().__init__(torch.nn.Linear(WIDTH, WIDTH), activation, torch.nn.Dropout(p))
        self.scale_when_compiled = scale_when_compiled

    def forward(self, x):
        out = super().forward(x)
        return out * self.scale_when_compiled if torch.compiler.is_compiling() and self.scale_when_compiled != 1.0 else out


class DropoutMLP(torch.nn.Module):
    """Three linear blocks with dropout p = 0.3, and a head: a loss that depends on the random stream."""

    def __init__(
        self, scaled_when_compiled: bool = False, scaled_block: int | None = None, relu_block: int | None = None, p: float = 0.3
    ):
        super().__init__()
        # A block's error reaches the loss damped (by the next blocks' small weights): 30%, not the head's 3%
        self.blocks = torch.nn.ModuleList(DropoutBlock(1.3 if i == scaled_block else 1.0, i == relu_block, p) for i in range(3))
        self.head = torch.nn.Linear(WIDTH, 8)
        self.scaled_when_compiled = scaled_when_compiled

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        out = self.head(x)
        if self.scaled_when_compiled and torch.compiler.is_compiling():
            out = out * 1.03  # a 3% error in the output, smaller than dropout's own noise on the loss
        return out


def _dropout_workload(
    name: str, scaled_when_compiled: bool, scaled_block: int | None = None, relu_block: int | None = None, p: float = 0.3
) -> Workload:
    def build(options: WorkloadOptions):
        torch.manual_seed(options.seed)
        model = DropoutMLP(scaled_when_compiled, scaled_block, relu_block, p).to(options.device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batches(options: WorkloadOptions, n: int):
        generator = torch.Generator().manual_seed(options.seed)
        size = options.batch_size or 16
        return [
            {
                "x": torch.randn(size, WIDTH, generator=generator).to(options.device),
                "y": (0.1 * torch.randn(size, 8, generator=generator)).to(options.device),
            }
            for _ in range(n)
        ]

    def loss(model, batch):
        return torch.nn.functional.mse_loss(model(batch["x"]), batch["y"])

    return Workload(
        name=name,
        description=f"test workload {name}",
        build=build,
        batches=batches,
        loss=loss,
        count=lambda batch: batch["x"].shape[0],
        batch_pool=2,
    )


def toy_dropout() -> Workload:
    return _dropout_workload("toy-dropout", scaled_when_compiled=False)


def toy_dropout_scaled() -> Workload:
    """Compiled, its output is 3% larger: a real numerical error, hidden in dropout's noise."""
    return _dropout_workload("toy-dropout-scaled", scaled_when_compiled=True)


def toy_dropout_block_scaled() -> Workload:
    """Compiled, its second block's output is 30% larger: the numerics part from eager's at `blocks.1`."""
    return _dropout_workload("toy-dropout-block-scaled", scaled_when_compiled=False, scaled_block=1)


def toy_block_inductor_wrong() -> Workload:
    """The three blocks without dropout (the numerics judged on the first losses: no replay), the
    second's activation a ReLU (the others' GELU), which Inductor computes as relu(x) + 1 (its test
    hook, set by the builder as a custom op's import would register one): the numerics part at
    `blocks.1`, in Inductor's code, where the accuracy minifier finds them. The hook is an Inductor
    setting, so a minified repro.py carries it and fails alone."""
    import torch._inductor.config as inductor_config

    workload = _dropout_workload("toy-block-inductor-wrong", scaled_when_compiled=False, relu_block=1, p=0.0)
    plain_build = workload.build

    def build(options: WorkloadOptions):
        inductor_config.cpp.inject_relu_bug_TESTING_ONLY = "accuracy"
        return plain_build(options)

    workload.build = build
    return workload


def _compiled(model) -> bool:
    """Whether torch.compile reached the model or any of its modules (torch.compile's wrapper, or
    Module.compile's compiled call)."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(model, OptimizedModule) or any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules())


def _on_rank_1(action):
    """`action` in rank 1 of a trial of several ranks only: the others run as usual, and wait for it."""
    return lambda: action() if os.environ.get("RANK") == "1" else None


def toy_rank1_crash() -> Workload:
    return _workload("toy-rank1-crash", loss_hook=_on_rank_1(lambda: os.kill(os.getpid(), signal.SIGSEGV)))


def toy_rank1_hang() -> Workload:
    return _workload("toy-rank1-hang", loss_hook=_on_rank_1(lambda: time.sleep(3600)))


def toy_rank1_oom() -> Workload:
    return _workload("toy-rank1-oom", loss_hook=_on_rank_1(lambda: torch.empty(2**44)))


class ShiftedToy(Toy):
    """The toy whose compiled forward adds its `shift` buffer (0 at first) to the token ids."""

    def __init__(self):
        super().__init__()
        self.register_buffer("shift", torch.zeros((), dtype=torch.long))

    def forward(self, input_ids):
        if torch.compiler.is_compiling():
            input_ids = input_ids + self.shift
        return super().forward(input_ids)


def toy_runtime_fail_in_graph() -> Workload:
    """Compiled, its second step's forward raises inside the compiled graph (Inductor's bounds check
    of the embedding: the token ids are shifted past the vocabulary by a buffer the first compiled
    step sets): a failure at run time that depends on state from the step before, as CUDA graphs'
    non-tree AssertionError (`dst.data_ptr() == src.data_ptr()`, H200, torch 2.11) does. The
    minifier (level 2) writes a launcher when it is raised, but its graph, run alone on the inputs
    it makes up (zeros for the ids and the shift), does not fail: "Input graph did not fail the
    tester". Eager never shifts, and trains."""
    compiled_steps = [0]

    def hook(model, logits):
        if logits.requires_grad and _compiled(model):
            compiled_steps[0] += 1
            if compiled_steps[0] == 1:
                with torch.no_grad():
                    model.shift.fill_(VOCAB)  # the next compiled forward indexes past the embedding
        return logits

    def build(options: WorkloadOptions):
        # One thread: Inductor then emits no OpenMP region, and its bounds check raises a
        # RuntimeError (thrown inside a parallel region it ends the process: SIGABRT, seen here).
        torch.set_num_threads(1)
        torch.manual_seed(options.seed)
        model = ShiftedToy().to(options.device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    workload = _workload("toy-runtime-fail-in-graph", lengths=(MAX_LEN, MAX_LEN), output_hook=hook)
    workload.build = build
    return workload


class CheckpointedToy(Toy):
    """The toy with torch.utils.checkpoint around each block, on as built, as a model of one's own
    fits a card: its workload declares how to switch it (Workload.checkpointing)."""

    def __init__(self):
        super().__init__()
        self.checkpointing = True
        self.context_fn = None  # a selective policy's, where one is given

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for block in self.blocks:
            if self.checkpointing and self.training:
                policy = {"context_fn": self.context_fn} if self.context_fn else {}
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False, **policy)
            else:
                x = block(x)
        return self.head(x)


def checkpointing_off(model):
    model.checkpointing = False


def checkpointing_selective(model, context_fn):
    model.context_fn = context_fn


def toy_checkpointed() -> Workload:
    from autocompile.workloads import Checkpointing

    workload = _workload("toy-checkpointed", lengths=(MAX_LEN, MAX_LEN))

    def build(options: WorkloadOptions):
        torch.manual_seed(options.seed)
        model = CheckpointedToy().to(options.device)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    workload.build = build
    workload.checkpointing = Checkpointing(off=checkpointing_off, selective=checkpointing_selective)
    return workload


def gpt2_checkpointed() -> Workload:
    """A Hugging Face model autocompile has no code for (GPT-2's LM head at toy size), built with its
    gradient checkpointing on as a fine-tuning script does, declaring nothing about it."""
    workload = _workload("gpt2-checkpointed", lengths=(MAX_LEN, MAX_LEN))

    def build(options: WorkloadOptions):
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(options.seed)
        config = GPT2Config(
            vocab_size=VOCAB,
            n_positions=MAX_LEN,
            n_embd=WIDTH,
            n_layer=2,
            n_head=4,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            use_cache=False,
        )
        with torch.device(options.device):
            model = GPT2LMHeadModel(config)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def forward(model, batch):
        return model(input_ids=batch["input_ids"]).logits

    workload.build, workload.forward = build, forward
    workload.loss = lambda model, batch: workload.criterion(forward(model, batch), batch)
    return workload


def tiny_encoder() -> Workload:
    """A masked-LM encoder (BERT's architecture at toy size), batches of a length mix padded to their longest
    with their attention mask, as a new user's fine-tune gives them: packing needs the block mask built."""
    from autocompile.workloads import SequenceLayout

    def build(options: WorkloadOptions):
        from transformers import BertConfig, BertForMaskedLM

        torch.manual_seed(options.seed)
        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=WIDTH,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=2 * WIDTH,
            max_position_embeddings=2 * MAX_LEN,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        config._attn_implementation = "sdpa"
        with torch.device(options.device):
            model = BertForMaskedLM(config)
        model.train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batches(options: WorkloadOptions, n: int):
        rng = random.Random(options.seed)
        generator = torch.Generator().manual_seed(options.seed)
        out = []
        for _ in range(n):
            lengths = [rng.randint(4, MAX_LEN) for _ in range(options.batch_size or 4)]
            longest = max(lengths)
            ids = torch.zeros(len(lengths), longest, dtype=torch.long)
            labels = torch.full((len(lengths), longest), -100)
            for row, length in enumerate(lengths):
                ids[row, :length] = torch.randint(3, VOCAB, (length,), generator=generator)
                chosen = torch.rand(length, generator=generator) < 0.15  # masked-LM: 15% of tokens predicted
                labels[row, :length][chosen] = ids[row, :length][chosen]
                ids[row, :length][chosen] = 2  # the [MASK] token
            mask = (torch.arange(longest)[None] < torch.tensor(lengths)[:, None]).long()
            out.append(
                {
                    "input_ids": ids.to(options.device),
                    "attention_mask": mask.to(options.device),
                    "labels": labels.to(options.device),
                }
            )
        return out

    def forward(model, batch):
        return model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch.get("position_ids")
        ).logits

    def criterion(logits, batch):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100)

    return Workload(
        name="tiny-encoder",
        description="a masked-LM encoder at toy size",
        build=build,
        batches=batches,
        forward=forward,
        criterion=criterion,
        count=lambda batch: int(batch["attention_mask"].sum()),
        unit="tokens",
        varying={"input_ids": (1, 0), "attention_mask": (1, 0), "labels": (1, -100)},
        max_len=lambda options: MAX_LEN,
        batch_pool=4,
        layout=SequenceLayout(positions="position_ids", mask="attention_mask", causal=False),
    )


def llama_positions_dropped() -> Workload:
    """tiny-llama whose forward drops the position ids its layout says it passes: packed, its sequences see
    each other (a wrong declaration the numerics guard must catch)."""
    from autocompile.workloads import get_workload

    workload = get_workload("tiny-llama")
    workload.forward = lambda model, batch: model(input_ids=batch["input_ids"]).logits
    forward, criterion = workload.forward, workload.criterion
    workload.loss = lambda model, batch: criterion(forward(model, batch), batch)
    workload.name = "llama-positions-dropped"
    return workload


def toy_many_blocks() -> Workload:
    """Eight repeated blocks, one length: a model whose whole-model compile grows with its blocks."""
    return _workload("toy-many-blocks", lengths=(16, 16), depth=8, pool=2)


def _tiny_llama(options: WorkloadOptions):
    """A Llama causal LM of random weights at toy size, on the device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(options.seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=WIDTH,
        intermediate_size=2 * WIDTH,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2 * MAX_LEN,
        pad_token_id=0,
        use_cache=False,
    )
    config._attn_implementation = "sdpa"
    with torch.device(options.device):
        return LlamaForCausalLM(config)


def _text_batches(options: WorkloadOptions, n: int) -> list[dict]:
    """Batches as a Hugging Face collator for causal LM gives them: input_ids padded to the longest, their
    attention mask, labels the input ids with padding ignored (the model's own loss shifts them)."""
    rng = random.Random(options.seed)
    generator = torch.Generator().manual_seed(options.seed)
    out = []
    for _ in range(n):
        lengths = [rng.randint(4, MAX_LEN) for _ in range(options.batch_size or 4)]
        ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
        for row, length in enumerate(lengths):
            ids[row, :length] = torch.randint(3, VOCAB, (length,), generator=generator)
        mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
        batch = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        out.append({key: value.to(options.device) for key, value in batch.items()})
    return out


def _undeclared(name: str, description: str, build, loss=None, forward=None, criterion=None) -> Workload:
    """A Hugging Face model's fine-tune on `_text_batches` that declares no SequenceLayout."""
    return Workload(
        name=name,
        description=description,
        build=build,
        batches=_text_batches,
        loss=loss,
        forward=forward,
        criterion=criterion,
        count=lambda batch: int(batch["attention_mask"].sum()),
        unit="tokens",
        varying={"input_ids": (1, 0), "attention_mask": (1, 0), "labels": (1, -100)},
        max_len=lambda options: MAX_LEN,
        batch_pool=4,
    )


def hf_causal_lm() -> Workload:
    """A Hugging Face causal LM that declares no layout; its loss the model's own (labels shifted by it),
    given as forward + criterion."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    def build(options: WorkloadOptions):
        model = _tiny_llama(options)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def forward(model, batch):
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        return model(**inputs).logits

    def criterion(logits, batch):
        return ForCausalLMLoss(logits, batch["labels"], vocab_size=logits.shape[-1])

    return _undeclared("hf-causal-lm", "a Llama causal LM declaring no layout", build, forward=forward, criterion=criterion)


def hf_peft() -> Workload:
    """peft's LoRA on a Hugging Face causal LM, declaring no layout; its loss the model's (`model(**batch).loss`)."""

    def build(options: WorkloadOptions):
        import peft

        config = peft.LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
        model = peft.get_peft_model(_tiny_llama(options), config)
        return model, torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

    return _undeclared("hf-peft", "LoRA on a Llama declaring no layout", build, loss=lambda model, batch: model(**batch).loss)


def hf_encoder() -> Workload:
    """tiny_encoder (BERT's masked LM) declaring no layout."""
    workload = tiny_encoder()
    workload.layout, workload.name = None, "hf-encoder"
    return workload


def llama_undeclared() -> Workload:
    """tiny-llama without its declared layout: its labels come shifted already (labels[i] = input_ids[i + 1]),
    which the layout found from its model (a causal LM's own loss shifts them) gets wrong."""
    from autocompile.workloads import get_workload

    workload = get_workload("tiny-llama")
    workload.layout, workload.name = None, "llama-undeclared"
    return workload
