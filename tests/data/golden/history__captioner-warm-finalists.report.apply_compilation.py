"""Compile settings for captioner (study 'captioner-warm-finalists', trial 2), found by autocompile.

Measured on NVIDIA H100 80GB HBM3 with torch 2.11.0+cu130: 10 steps/s steady (1.18x eager, torch.compile defaults not measured to a steady speed), warm-up 61.2 s.

Call apply_compilation(model, optimizer) once, after building both (and your LR scheduler,
if any: torch's LRScheduler wraps optimizer.step and cannot wrap a compiled one), a…