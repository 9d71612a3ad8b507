"""Variable-length batches as a typical collate function leaves them: padded to the longest."""

from __future__ import annotations

import random

import torch

IGNORE_INDEX = -100  # what cross-entropy skips: the label value of padding


def sample_length(rng: random.Random, bins: list[tuple[int, int, float]]) -> int:
    """A length from weighted (low, high, weight) bins, uniform inside a bin (high included)."""
    low, high, _ = rng.choices(bins, weights=[w for _, _, w in bins], k=1)[0]
    return rng.randint(low, high)


def token_batch(rng: random.Random, lengths: list[int], vocab: int, pad_id: int, start_id: int | None):
    """input_ids and next-token labels for sequences of the given lengths, padded to the longest.

    With start_id, each sequence is [start] + tokens[:-1] -> tokens (the captioner's layout);
    without, input_ids[i] predicts labels[i] = input_ids[i + 1] (causal LM over a text).
    """
    longest = max(lengths)
    input_ids = torch.full((len(lengths), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(lengths), longest), IGNORE_INDEX, dtype=torch.long)
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    for row, length in enumerate(lengths):
        if start_id is None:
            text = torch.randint(3, vocab, (length + 1,), generator=generator)
            input_ids[row, :length] = text[:-1]
            labels[row, :length] = text[1:]
        else:
            tokens = torch.randint(3, vocab, (length,), generator=generator)
            input_ids[row, 0] = start_id
            input_ids[row, 1:length] = tokens[:-1]
            labels[row, :length] = tokens
    return input_ids, labels


def count_labels(batch: dict) -> int:
    """Real tokens in a batch: the labels that are not padding."""
    return int((batch["labels"] != IGNORE_INDEX).sum())


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over non-padding positions, computed in float32 like transformers does."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX)


def causal_lm(model):
    """The Hugging Face causal LM in `model` (itself, or the one a wrapper such as peft's holds), or None."""
    return next((m for m in model.modules() if type(m).__name__.endswith("ForCausalLM")), None)


class ModelsLoss:
    """A causal LM job's criterion(logits, batch): its model's own loss_function (transformers' ForCausalLMLoss over
    the labels as given, already shifted), the same float32 mean over real tokens as causal_lm_loss. It reads the
    model last built (`of`), so where a configuration's lm_loss gives that loss_function the hidden states, the
    criterion follows: the workload's `own_loss`."""

    def __init__(self):
        self.lm = None

    def of(self, model):
        """`model`, its causal LM (itself, or the one a wrapper such as peft's holds) now the one whose loss is taken."""
        self.lm = causal_lm(model)
        return model

    def __call__(self, logits, batch):
        if self.lm is None:
            return causal_lm_loss(logits, batch["labels"])
        return self.lm.loss_function(logits, None, vocab_size=logits.shape[-1], shift_labels=batch["labels"])
