"""A Hugging Face Trainer fine-tune as its users write one: the job `autocompile search --trainer` reads.

    autocompile search --trainer examples/trainer_llama.py:tiny --device cpu --trials 6 --timeout 240
    autocompile search --trainer examples/trainer_llama.py:llama_8b           # one GPU of 80 GB or more

Each factory returns a `transformers.Trainer`, built but not trained: a causal LM of random weights (no
download), a tokenizer made here, token ids of a fine-tuning length mix (most sequences well below the
longest), `DataCollatorForLanguageModeling` padding each batch to its longest, the Trainer's own
optimizer (fused AdamW), LR schedule and gradient clipping.
"""

from __future__ import annotations

import os
import random
import tempfile

import torch

# Most sequences well below the longest, a tail up to it: (low, high, weight) as fractions of the longest.
LENGTHS = [(1 / 16, 1 / 4, 0.50), (1 / 4, 1 / 2, 0.35), (1 / 2, 1.0, 0.15)]
LLAMA_3_1_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
TINY = dict(
    vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)


def tokenizer():
    """A tokenizer with a pad token (id 0), made here: the collator pads with it."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<unk>")), pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def token_ids(n: int, longest: int, vocab: int, seed: int = 0) -> list[dict]:
    """n examples of token ids, their lengths drawn from LENGTHS (a list is a dataset to the Trainer)."""
    rng = random.Random(seed)
    examples = []
    for _ in range(n):
        low, high, _ = rng.choices(LENGTHS, weights=[w for _, _, w in LENGTHS])[0]
        length = rng.randint(max(2, int(low * longest)), max(2, int(high * longest)))
        examples.append({"input_ids": [rng.randrange(3, vocab) for _ in range(length)]})
    return examples


def causal_lm(config: dict, device: str, dtype: torch.dtype, longest: int):
    """A LlamaForCausalLM of random weights, built in place on the device."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**config, max_position_embeddings=max(longest, 2048), pad_token_id=0, use_cache=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)


def make_trainer(config: dict, batch_size: int, longest: int, device: str, dtype: torch.dtype, **arguments):
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=os.environ.get("TRAINER_OUT") or tempfile.mkdtemp(prefix="trainer-"),
        per_device_train_batch_size=batch_size,
        learning_rate=1e-5,
        warmup_steps=100,
        max_steps=10000,
        logging_steps=500,
        save_strategy="no",
        report_to=[],
        seed=0,
        use_cpu=device == "cpu",
        **arguments,
    )
    model = causal_lm(config, device, dtype, longest)
    dataset = token_ids(4096, longest, config["vocab_size"])
    collator = DataCollatorForLanguageModeling(tokenizer(), mlm=False)
    return Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator)


def llama_8b():
    """The Llama 3.1 8B architecture in bf16, batch 2 of up to 2048 tokens, on the GPU."""
    return make_trainer(LLAMA_3_1_8B, int(os.environ.get("TRAINER_BATCH", 2)), 2048, "cuda", torch.bfloat16, bf16=True)


def tiny():
    """The same job at toy size, on the CPU."""
    return make_trainer(TINY, 8, 64, "cpu", torch.float32)
