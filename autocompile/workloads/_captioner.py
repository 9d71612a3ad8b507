"""The image captioner of the seed guide: a ViT encoder and a GPT-2 decoder, random weights.

Captions follow the guide's length mix: 90% short, 9% medium, 1% long. transformers' own
loss in VisionEncoderDecoderModel is bypassed: the loss is computed explicitly here, so
it never costs a graph break whatever the installed release does.
"""

from __future__ import annotations

import contextlib
import random

import torch

from autocompile.workloads import Workload, WorkloadOptions
from autocompile.workloads._batching import causal_lm_loss, count_labels, sample_length, token_batch

PAD_ID, START_ID, END_ID = 0, 1, 2


def _make(name, description, vit, gpt2, vocab, image_size, batch_size, bins, pool, gpu_only=False):
    max_caption = max(high for _, high, _ in bins) + 1  # + the end token

    def build(options: WorkloadOptions):
        from transformers import GPT2Config, ViTConfig, VisionEncoderDecoderConfig, VisionEncoderDecoderModel

        encoder = ViTConfig(image_size=image_size, **vit)
        decoder = GPT2Config(
            vocab_size=vocab,
            n_positions=max(max_caption, 256),
            use_cache=False,
            bos_token_id=START_ID,
            eos_token_id=END_ID,
            **gpt2,
        )
        if options.blocks:  # screening: both stacks of repeated blocks cut, built that way
            encoder.num_hidden_layers = min(options.blocks, encoder.num_hidden_layers)
            decoder.n_layer = min(options.blocks, decoder.n_layer)
        config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
        config.decoder_start_token_id, config.pad_token_id, config.eos_token_id = START_ID, PAD_ID, END_ID
        torch.manual_seed(options.seed)
        with torch.device(options.device):
            model = VisionEncoderDecoderModel(config=config)
        model.encoder.pooler = None  # unused: its parameters would get no gradient
        model.train()
        return model, torch.optim.Adam(model.parameters())

    def batches(options: WorkloadOptions, n: int) -> list[dict]:
        rng = random.Random(options.seed)
        size = options.batch_size or batch_size
        generator = torch.Generator().manual_seed(options.seed)
        out = []
        for _ in range(n):
            lengths = [sample_length(rng, bins) + 1 for _ in range(size)]
            input_ids, labels = token_batch(rng, lengths, vocab, PAD_ID, START_ID)
            for row, length in enumerate(lengths):
                labels[row, length - 1] = END_ID
            images = torch.randn(size, 3, image_size, image_size, generator=generator)
            out.append(
                {
                    "pixel_values": images.to(options.device),
                    "decoder_input_ids": input_ids.to(options.device),
                    "labels": labels.to(options.device),
                    "decoder_attention_mask": (input_ids != PAD_ID).to(options.device),
                }
            )
        return out

    def forward(model, batch):
        cuda = batch["pixel_values"].is_cuda
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
        with autocast:
            return model(
                pixel_values=batch["pixel_values"],
                decoder_input_ids=batch["decoder_input_ids"],
                decoder_attention_mask=batch["decoder_attention_mask"],
            ).logits

    def criterion(logits, batch):  # outside autocast: the cross-entropy runs in float32
        return causal_lm_loss(logits, batch["labels"])

    return Workload(
        name=name,
        description=description,
        build=build,
        batches=batches,
        forward=forward,
        criterion=criterion,
        count=count_labels,
        unit="tokens",
        varying={"decoder_input_ids": (1, PAD_ID), "labels": (1, -100), "decoder_attention_mask": (1, 0)},
        max_len=lambda options: max_caption,
        parts=("encoder", "decoder"),
        batch_pool=pool,
        gpu_only=gpu_only,
    )


def captioner() -> Workload:
    return _make(
        "captioner",
        "ViT-Base encoder + GPT-2 decoder image captioner of the seed guide, batch 64, Adam, bf16 autocast",
        vit={},  # ViT-Base defaults: 12 layers, hidden 768, patch 16
        gpt2={},  # GPT-2 small defaults: 12 layers, hidden 768
        vocab=1024,
        image_size=224,
        batch_size=64,
        bins=[(5, 31, 0.90), (33, 63, 0.09), (65, 255, 0.01)],
        pool=16,
    )


def tiny_captioner() -> Workload:
    return _make(
        "tiny-captioner",
        "the captioner at toy size (2+2 layers, hidden 32, 32x32 images), batch 8",
        vit=dict(patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
        gpt2=dict(n_embd=32, n_layer=2, n_head=2),
        vocab=128,
        image_size=32,
        batch_size=8,
        bins=[(5, 15, 0.90), (17, 31, 0.09), (33, 63, 0.01)],
        pool=8,
    )
