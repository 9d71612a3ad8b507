"""Compile settings for lora-8b (study 'lora-8b-30min-1', trial 4), found by autocompile.

Measured on NVIDIA H100 80GB HBM3 with torch 2.11.0+cu130: 2.3 steps/s steady (2.54x eager, torch.compile defaults not measured to a steady speed), warm-up 28.7 s.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), and
prepare_…