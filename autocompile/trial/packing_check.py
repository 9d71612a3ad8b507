"""Whether a packed configuration trains what the padded batch trains: the trial's packing check, run eager
on the first batches before anything compiles (the numerics guard's, found before the compile's cost).

Two questions, asked apart because rounding answers one and not the other:

- **What each token sees** (`blind_to`). Outputs that must not depend on some tokens must not move when
  those tokens change: the other sequences of a packed row when its first sequence changes, and, in a causal
  decoder, a sequence's earlier tokens when its later ones change. The two runs compared have the same
  shapes and kernels, so such outputs stay the same bit for bit (masked scores add exact zeros); a model
  whose packed sequences see each other moves them by the attention's share of its outputs. No rounding
  of bf16 over 32 layers comes near, which is why this is the check that separates.
- **Agreement with the padded batch** (`apart`). Packed, the real tokens' outputs against the padded
  batch's, under the model's own attention: a gross check (tokens gathered to the wrong places, an
  attention that computes something else). Other shapes and kernels round otherwise: 4.2-5.5% (norm) on
  the 8B Llamas in bf16 (H200), 0.17% for a 6-layer one in bf16 on the CPU, 1e-7 in float32;
  hence tolerances by the weights' precision.
"""

from __future__ import annotations

from autocompile.apply import load_snippet
from autocompile.trial.protocol import PACKING_CHECK_VERSION
from autocompile.trial.result import Status
from autocompile.workloads.layout import LABELS

# How far the packed batch's outputs may part from the padded batch's (norm of the difference over the padded's),
# by the precision of the model's weights: rounding is the dtype's, not the device's (a 6-layer Llama in bf16
# on the CPU: 0.17%; the 8B Llamas in bf16 on CUDA: 4-5.5%).
PACKED_TOLERANCE = {"float32": 1e-3, "half": 0.2}
# How far outputs that must not see some tokens may move when those change: nothing, but a margin for a
# kernel whose rounding would depend on another row's values.
BLIND_TOLERANCE = 1e-4
# Batches of the pool looked at for one whose packed rows hold two sequences or more (what `Check.blind` needs).
LOOK_AT = 8
# What `Check.blind` measures: what each says when it moves, and why it did.
BLIND_QUESTIONS = (
    (
        "other_sequences_moved",
        "changing the first sequence of a packed row, its other sequences' outputs",
        "the sequences of a packed row see each other; the workload's forward must pass the position ids to the model "
        "(a causal decoder takes its mask from them), or, for an encoder, the block-diagonal mask (SequenceLayout)",
    ),
    (
        "earlier_tokens_moved",
        "changing a packed sequence's later tokens, its earlier tokens' outputs",
        "packed, a causal decoder's tokens see their sequence's later ones: the attention it packs with is not causal",
    ),
)


def packed_alike(torch, spec: dict, events, result: dict, setup, model) -> bool:
    """For a packed configuration: whether the model, eager and before anything is compiled, gives the packed
    batch (under the attention the configuration packs with) what it gives the padded batch (under its own),
    its sequences blind to each other and, causal, to their own later tokens. Where not, the trial is
    infeasible with the reason, and the check's figures go to `result["packing_check"]`."""
    if spec["config"].get("padding") != "pack" or not setup.info.varying:
        return True
    events.emit(phase="checking packing")
    snippet = load_snippet(setup.snippet, "<packing check>")
    check = Check(torch, setup, snippet, model)
    padded = check.run(dict(setup.batches[0]))
    for name in ("flex_attention_on", "varlen_attention_on"):  # the attention packed rows go through
        if name in snippet:
            snippet[name](model)  # (as apply_compilation sets it next)
    found = {"tolerance": check.tolerance, **check.apart(padded)}
    if check.per_token:
        found.update(check.blind())
    found.update(check.labels())
    result["packing_check"] = found
    if check.per_token and found["blind_batch"] is None:
        result.setdefault("notes", []).append(
            f"packing check: no packed row of the first {LOOK_AT} batches held two sequences, so what each sequence "
            "sees was not asked (only the agreement with the padded batch)"
        )
    why = _why_not(found, check)
    if why is None:
        return True
    verdict = {"method": "packing check", "version": PACKING_CHECK_VERSION, **found}  # not a guard since replaced
    result.update(status=Status.INFEASIBLE, reason=f"numerics (packing check): {why}", numerics=verdict)
    return False


def _why_not(found: dict, check) -> str | None:
    """Why the packed batch does not train what the padded one does (eager, before anything compiled), or None."""
    why = _labels_why_not(found, check.setup.info.layout)
    if why:
        return f"{why}, eager, before anything compiled"
    for key, what, why in BLIND_QUESTIONS:
        if found.get(key, 0) > BLIND_TOLERANCE:
            return f"{what} moved by {found[key]:.2%} (norm; nothing may move), eager, before anything compiled: {why}"
    if found["max_rel_diff"] > check.tolerance:
        return (
            f"packed, the first batch's outputs part from the padded batch's by {found['max_rel_diff']:.1%} (norm) "
            f"(tolerance {check.tolerance:.1%}), eager, before anything compiled: the packed batch computes "
            "something else than the padded one"
        )
    return None


class Check:
    """The model's outputs on batches of the pool, padded and packed (the snippet's `pack_plan`, `prepare_batch`)."""

    def __init__(self, torch, setup, snippet: dict, model):
        self.torch, self.setup, self.snippet, self.model = torch, setup, snippet, model
        weight = next(model.parameters())
        self.device = weight.device
        full = not weight.is_floating_point() or torch.finfo(weight.dtype).bits >= 32
        self.tolerance = PACKED_TOLERANCE["float32" if full else "half"]
        self.per_token = bool(setup.workload.split_loss)  # outputs per token, not one loss

    def run(self, batch: dict, loss: bool = False):
        """The forward's first output per token (the loss, where the workload gives only that or `loss` asks
        for it), float, seeded."""
        from autocompile.trial.divergence import first_tensor

        torch, workload = self.torch, self.setup.workload
        devices = [torch.cuda.current_device()] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            torch.manual_seed(0)
            if self.per_token and not loss:
                return first_tensor(workload.forward(self.model, batch)).float()
            return workload.loss(self.model, batch).reshape(1).float()

    def labels(self) -> dict:
        """For a layout found from the model (not declared), where the batch has labels: whether the workload's
        loss reads them, and each row's first one (a loss that shifts its labels itself never does), padded,
        on the first batch; nothing where not asked."""
        layout, batch = self.setup.info.layout, self.setup.batches[0]
        if layout is None or not layout.source or LABELS not in self.setup.info.varying or batch[LABELS].shape[1] < 2:
            return {}
        pad = self.setup.info.varying[LABELS][1]
        known = batch[LABELS][batch[LABELS] != pad].unique()
        if known.numel() < 2:
            return {}
        base = self.run(dict(batch), loss=True)
        noise = max(4 * float((self.run(dict(batch), loss=True) - base).abs()), 1e-7 * float(base.abs()))
        first = self._loss_moved(batch, 0, known, base) > noise
        return {"labels_first_read": first, "labels_read": first or self._loss_moved(batch, 1, known, base) > noise}

    def _loss_moved(self, batch: dict, at: int, known, base) -> float:
        """How far the loss moves when each row's label at `at` is another one the batch holds."""
        return float((self.run(_relabelled(batch, at, known), loss=True) - base).abs())

    def apart(self, padded) -> dict:
        """The packed batch's outputs against the padded batch's, over the real tokens."""
        torch, batch = self.torch, self.setup.batches[0]
        packed = self.run(self.snippet["prepare_batch"](dict(batch)))
        if self.per_token and padded.dim() >= 2:
            source = torch.tensor(self.snippet["pack_plan"](dict(batch))[0], device=self.device)
            padded = padded.reshape(-1, *padded.shape[2:])[source[source >= 0]]
            packed = packed.reshape(-1, *packed.shape[2:])[source >= 0]
        return {"max_rel_diff": _moved(padded, packed)}

    def blind(self) -> dict:
        """Outputs that must not see some tokens, moved when those change (0 where they do not); on the first
        batch of the pool whose packed rows hold two sequences or more."""
        for index, batch in enumerate(self.setup.batches[:LOOK_AT]):
            _, _, sequence, _, shape = self.snippet["pack_plan"](dict(batch))
            sequence = self.torch.tensor(sequence, device=self.device).view(shape)
            packed = self.snippet["prepare_batch"](dict(batch))
            real = real_tokens(packed, {key: pad for key, (_, pad) in self.snippet["VARYING"].items()})
            shared = ((sequence == 1) & real).any(1, keepdim=True)  # rows holding a second sequence
            if not bool(shared.any()):
                continue
            first = (sequence == 0) & shared
            outputs = self.run(packed)
            found = {
                "blind_batch": index,
                "other_sequences_moved": self._moved_by(packed, outputs, first, real & shared & ~first),
            }
            if getattr(self.setup.info.layout, "causal", False):
                later = first & (self.torch.cumsum(first.int(), 1) > first.sum(1, keepdim=True) // 2)
                found["earlier_tokens_moved"] = self._moved_by(packed, outputs, later, first & ~later)
            return found
        return {"blind_batch": None}  # no row of the batches looked at held two sequences: not asked

    def _moved_by(self, packed: dict, outputs, change, keep) -> float:
        """How far the outputs at `keep` (`outputs`: the packed batch's) move when the inputs at `change` take
        another value (each key's first value in the batch: a token the model knows)."""
        if not bool(keep.any()) or not bool(change.any()):
            return 0.0
        altered = dict(packed)
        for key in self.snippet["VARYING"]:
            # a causal decoder's mask, left out once packed; an encoder's block-diagonal one, not per token
            if packed.get(key) is None or packed[key].shape[:2] != change.shape:
                continue
            tensor = packed[key].clone()
            # (a copy of the first value: CUDA refuses to write a tensor from a view of itself)
            tensor[change] = tensor.reshape(-1, *tensor.shape[2:])[0].clone()
            altered[key] = tensor
        return _moved(outputs[keep], self.run(altered)[keep])


def _labels_why_not(found: dict, layout) -> str | None:
    """Why the labels, packed as the layout found from the model says, are not what the loss takes, or None."""
    if "labels_read" not in found:
        return None
    declare = "declare Workload.layout (a SequenceLayout) to pack it"
    if not found["labels_read"]:
        return (
            f"the workload's loss reads none of the batch's {LABELS!r} (changing them moved nothing): what it trains "
            f"on, packed, is not known; {declare}"
        )
    if found["labels_first_read"] and LABELS in layout.shifted:
        return (
            f"the workload's loss reads each sequence's first label ({LABELS!r}): they come shifted already, where the layout "
            "found from the model took its loss to shift them (a causal LM's own loss does): packed so, each "
            f"sequence's first label would be dropped; {declare}, its shifted=()"
        )
    if not found["labels_first_read"] and LABELS not in layout.shifted:
        return (
            f"the workload's loss never reads a sequence's first label ({LABELS!r}): it shifts them itself, where the layout "
            "found from the model took it not to: packed so, each sequence would learn to predict the next one's "
            f"first token; {declare}, its shifted=({LABELS!r},)"
        )
    return None


def _relabelled(batch: dict, at: int, known):
    """The batch with each row's label at `at` another label the batch holds."""
    labels = batch[LABELS].clone()
    labels[:, at] = known[(labels[:, at] == known[0]).long()]
    return {**batch, LABELS: labels}


def _moved(reference, other) -> float:
    return float((reference - other).norm() / reference.norm().clamp(min=1e-12))


def real_tokens(batch: dict, varying: dict):
    """Where a batch's varying keys ({key: pad value}) hold a real token (any key not at its pad value)."""
    import torch

    # (a causal decoder's packed batch has no mask: its key is None, and its position ids say the rest; an
    # encoder's holds a block-diagonal one, rows by tokens by tokens, which says nothing of single tokens)
    tokens = {key: batch[key] for key in varying if batch.get(key) is not None and batch[key].dim() == 2}
    return torch.stack([value != varying[key] for key, value in tokens.items()]).any(0)
