"""A plain training loop with a configuration's snippet pasted in, as a user runs it."""

from autocompile.apply import ModelInfo, find_repeated_blocks, load_snippet, render_snippet
from autocompile.space import DEFAULTS


def snippet_losses(workload, config, batches, options, attention=None):
    """The model trained on `batches` through the snippet of `config` (its attention set first where given),
    and the losses of its steps."""
    model, optimizer = workload.build(options)
    if attention:
        model.set_attn_implementation(attention)
    info = ModelInfo(regions=find_repeated_blocks(model), varying=dict(workload.varying), max_len=workload.max_len(options))
    snippet = load_snippet(render_snippet({**DEFAULTS, **config}, info))
    model, optimizer = snippet["apply_compilation"](model, optimizer)
    losses = []
    for batch in batches:
        batch = snippet["prepare_batch"](dict(batch))
        loss = workload.criterion(workload.forward(model, batch), batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss))
    return model, losses
