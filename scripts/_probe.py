"""What the probe scripts share (profile_step, host_reads, host_time): a workload built and a configuration's
snippet applied to it as a trial does, ready to step."""

import json
import tempfile


def training_for(model: str, config_path: str, device: str, **overrides):
    """The `Training` of `model` under the configuration in `config_path` (with `overrides`) on `device`."""
    from autocompile.engine.study import build_space
    from autocompile.trial.worker import _apply, _build, _write_snippet

    with open(config_path) as f:
        config = build_space(model, device, None, None, 0).validate({**json.load(f), **overrides})
    spec = {"model": model, "device": device, "config": config, "trial_dir": tempfile.mkdtemp()}
    result: dict = {"notes": []}
    setup, built = _build(spec, result)
    _write_snippet(spec, result, setup)
    return _apply(spec, result, setup, built)
