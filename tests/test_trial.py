"""One trial in its own process: real compiles of real (tiny) models, and real failures."""

import json
import os

import pytest

from autocompile.engine.scoring import compare_losses
from autocompile.space import DEFAULTS, EAGER
from autocompile.trial import RECORD_FIELDS, TrialRequest, run_trial, triage
from conftest import FAST, GRAPH_CACHE, toy


def trial(tmp_path, toolchain_dir, model, config, timeout=300, ahead=False, preload=None, **kw):
    """One trial; `ahead`: in a process started ahead (autocompile.trial.prestart), as a GPU search's are,
    which imports `preload` (its default modules where None); the trial starts once those imports are done,
    as a search's next trial finds them done during the trial before it. Where the process start is not what
    a test checks, its compiled trials are forked so: the imports are paid once, not per trial."""
    request = TrialRequest(
        model=model,
        config={**DEFAULTS, **config},
        device="cpu",
        trial_dir=str(tmp_path / "t"),
        timeout_s=timeout,
        toolchain_dir=toolchain_dir,
        measure=FAST,
        **kw,
    )
    if ahead:
        from autocompile.trial import prestart
        from autocompile.trial.process import _child_env

        env = _child_env(request)
        prestart.start(env, **({"modules": preload} if preload else {}))
        server = prestart.take(env)  # its imports waited for, then it waits for the trial again
        if server is not None:
            prestart._release(prestart._key(env), server, alive=True)
    events = []
    record = run_trial(request, on_event=events.append)
    return record, events


def test_eager_and_compiled_trials_measure_and_keep_their_files(tmp_path, toolchain_dir, monkeypatch):
    monkeypatch.delenv(GRAPH_CACHE, raising=False)  # cold caches: every graph compiled, as a user's trial does
    # one length: one compile of each graph (what is checked does not need the toy's recompiles)
    eager, events = trial(tmp_path / "e", toolchain_dir, toy("toy_fixed"), EAGER)
    assert eager["status"] == "ok", eager["reason"]
    assert [e["phase"] for e in events if "step" not in e and "window" not in e][:3] == ["building", "warming up", "measuring"]
    assert eager["compiles"] == 0 and eager["recompiles"] == 0
    # the optimizer step as one compiled foreach_map function (its own graph) besides each block's
    regional, _ = trial(tmp_path / "r", toolchain_dir, toy("toy_fixed"), {"scope": "regional", "foreach_map_optimizer": True})
    assert regional["status"] == "ok", regional["reason"]
    for record in (eager, regional):
        for key in RECORD_FIELDS[:-1]:
            assert key in record
        assert record["steps_per_s"] > 0 and record["items_per_s"] > record["steps_per_s"]
        assert record["warmup_steps"] >= 4 and record["peak_mem_gb"] > 0
        assert 1 <= len(record["losses"]) <= 5
        # where a trial's first seconds went, before anything compiles (15 s of each llama-8b trial on an H200)
        assert set(record["build_s"]) == {"import_torch", "prepare", "workload", "batches", "model_and_optimizer"}
        assert all(s >= 0 for s in record["build_s"].values()) and record["build_s"]["import_torch"] > 0
    # Cold caches: a compiled warm-up is far longer than an eager one.
    assert regional["compiles"] >= 1 and regional["warmup_s"] > 3 * eager["warmup_s"]
    # The same seed gives the same first loss, compiled or not.
    assert regional["losses"][0] == pytest.approx(eager["losses"][0], rel=1e-4)
    # and the steps after it train as eager's AdamW does, within the numerics guard's tolerance
    assert len(regional["losses"]) >= 3 and not compare_losses(regional["losses"], eager["losses"], "cpu")["differs"]
    assert "foreach_map_step(optimizer)" in regional["snippet"]
    trial_dir = tmp_path / "r" / "t"
    assert (trial_dir / "apply_compilation.py").read_text() == regional["snippet"]
    assert json.loads((trial_dir / "result.json").read_text())["status"] == "ok"
    assert not (trial_dir / "cache").exists()  # the cold cache is thrown away after use


def test_graph_breaks_are_counted_with_their_reason(tmp_path, toolchain_dir):
    record, _ = trial(tmp_path, toolchain_dir, toy("toy_graph_break"), {"scope": "full"}, ahead=True)
    assert record["status"] == "ok", record["reason"]
    assert record["graph_breaks"] >= 1
    assert any("graph_break" in item["reason"] for item in record["graph_break_reasons"])


def test_fullgraph_turns_a_graph_break_into_a_compile_error(tmp_path, toolchain_dir):
    record, _ = trial(tmp_path, toolchain_dir, toy("toy_graph_break"), {"scope": "full", "fullgraph": True}, ahead=True)
    assert record["status"] == "compile_error"
    assert record["failed_phase"] == "compiling"
    # Triage: the graph break is Dynamo's, so even the eager backend fails, and the ladder stops there.
    request = TrialRequest(
        model=toy("toy_graph_break"),
        config=record["config"],
        device="cpu",
        trial_dir=str(tmp_path / "t"),
        timeout_s=300,
        toolchain_dir=toolchain_dir,
        measure=FAST,
    )
    record = triage(request, record)
    assert [(r["backend"], r["status"]) for r in record["triage"]] == [("eager", "compile_error")]
    assert record["failing_layer"].startswith("Dynamo") and "triage: fails in Dynamo" in record["reason"]


def test_triage_names_inductor_when_only_inductor_fails(tmp_path, toolchain_dir):
    """Inductor's own test hook makes its C++ code generation fail on ReLU: every backend of the
    ladder below it runs, so the failure is Inductor's."""
    config = {"scope": "full", "inductor": {"cpp.inject_relu_bug_TESTING_ONLY": "compile_error"}}
    record, _ = trial(tmp_path, toolchain_dir, toy("toy_relu"), config, ahead=True)
    assert record["status"] == "compile_error", record["reason"]
    request = TrialRequest(
        model=toy("toy_relu"),
        config=record["config"],
        device="cpu",
        trial_dir=str(tmp_path / "t"),
        timeout_s=300,
        toolchain_dir=toolchain_dir,
        measure=FAST,
    )
    record = triage(request, record)
    assert [(r["backend"], r["status"]) for r in record["triage"]] == [
        ("eager", "ok"),
        ("aot_eager", "ok"),
        ("aot_eager_decomp_partition", "ok"),
    ]
    assert record["failing_layer"].startswith("Inductor")
    assert "triage: fails in Inductor" in record["reason"]
    snippet = (tmp_path / "t" / "triage-aot_eager" / "apply_compilation.py").read_text()
    assert "'backend': 'aot_eager'" in snippet or '"backend": "aot_eager"' in snippet


def test_a_hard_mark_the_model_refuses_falls_back_to_maybe_and_the_study_does_not_try_it_again(tmp_path):
    # As on llama-8b (GPU, 2026-11-22): with the loss compiled apart, the labels' length is
    # marked dynamic but must equal the length of logits nobody marked, so Dynamo raises
    # ConstraintViolationError; the trial measures maybe_mark_dynamic instead and says so.
    # Two trials of one study (through the engine's runner, as a search runs them), no baselines.
    import io
    import pathlib

    from autocompile.engine.records import trial_folder
    from autocompile.engine.runner import Progress, new_trial
    from autocompile.engine.settings import SearchSettings
    from autocompile.engine.study import open_search

    settings = SearchSettings(
        model=toy("toy_fixed"),  # one length: the mark is refused all the same, and each graph compiles once
        device="cpu",
        study="m",
        directory=str(tmp_path),
        trial_timeout_s=300,
        measure=FAST,
        prune=False,
        triage=False,
        shared_cache=True,
    )
    runner = open_search(settings, Progress(2, io.StringIO()))
    asked = {**DEFAULTS, "scope": "regional", "compile_loss": True, "mark_dynamic": "mark"}
    record = runner.run(new_trial(runner.study), asked, "recipe", prunable=False)
    assert record["status"] == "ok", record["reason"]
    fallback = record["mark_dynamic_fallback"]
    assert fallback["asked"] == "mark" and fallback["used"] == "maybe" and "ConstraintViolation" in fallback["why"]
    assert record["config"]["mark_dynamic"] == "maybe" and "torch._dynamo.maybe_mark_dynamic" in record["snippet"]
    assert any("hard mark failed" in note for note in record["notes"])
    first = pathlib.Path(trial_folder(settings.study_dir, 0))
    assert "ConstraintViolationError" in (first / "log-hard-mark.txt").read_text()
    assert record["wall_s"] > fallback["first_wall_s"] > 0 and "learned_from" not in fallback
    # A second configuration asking for the hard mark on the same graphs (another optimizer step: not a
    # setting Dynamo's shape constraints depend on) starts with "maybe": the failed attempt is not run again.
    again = runner.run(new_trial(runner.study), {**asked, "fused_optimizer": True}, "recipe", prunable=False)
    assert again["status"] == "ok", again["reason"]
    assert again["mark_dynamic_fallback"]["learned_from"] == 0 and again["mark_dynamic_fallback"]["first_wall_s"] == 0
    assert again["config"] == {**asked, "fused_optimizer": True, "mark_dynamic": "maybe"}  # what it measured
    assert any("hard mark failed in trial 0" in note for note in again["notes"])
    second = pathlib.Path(trial_folder(settings.study_dir, 1))
    assert not (second / "log-hard-mark.txt").exists()
    assert json.loads((second / "result.json").read_text())["mark_dynamic_fallback"]["learned_from"] == 0
    # No eager baseline ran cleanly in this study: each compiled trial checks the randomness itself
    # (its eager first loss is the numerics reference), none carries it from another.
    for folder, attrs in ((first, record), (second, again)):
        assert "checking randomness" in (folder / "events.jsonl").read_text()
        assert attrs["rng_dependent"] is False and "rng_dependent_from" not in attrs
        assert attrs["numerics"]["method"] == "first loss"


def test_what_a_study_learned_is_passed_only_where_it_holds():
    """engine/learned.py on a study's records: a refused hard mark is learned for the same graph
    settings only (the optimizer step, LR, Inductor options and mode are not among them); the
    randomness check's answer only where the eager baseline ran cleanly, from the trial that checked."""
    import optuna

    from autocompile.engine.learned import mark_refused_in, rng_dependent
    from autocompile.engine.gates import already_tried

    study = optuna.create_study(direction="maximize")

    def add(**attrs):
        study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs=attrs))

    asked = {**DEFAULTS, "scope": "regional", "compile_loss": True, "mark_dynamic": "mark"}
    add(role="compile-defaults", status="ok", config=DEFAULTS, rng_dependent=True)
    assert rng_dependent(study) is None  # no eager baseline ran cleanly: each trial checks (eager_first_loss)
    add(role="eager", status="ok", config=EAGER)
    add(
        role="recipe",
        status="ok",
        config={**asked, "mark_dynamic": "maybe"},
        rng_dependent=True,
        rng_dependent_from=0,
        mark_dynamic_fallback={"asked": "mark", "used": "maybe", "first_wall_s": 21.0},
    )
    add(
        role="recipe",
        status="ok",
        config={**asked, "mark_dynamic": "maybe", "fused_optimizer": True},
        mark_dynamic_fallback={"asked": "mark", "used": "maybe", "first_wall_s": 0.0, "learned_from": 2},
    )
    assert rng_dependent(study) == {"value": True, "from": 0}
    same_graphs = {
        **asked,
        "compile_optimizer": True,
        "lr_tensor": True,
        "mode": "max-autotune-no-cudagraphs",
        "inductor": {"shape_padding": False},
    }
    assert mark_refused_in(study, same_graphs) == 2
    # what such a configuration measures ("maybe") was measured already: it is not proposed again
    assert already_tried(study, {**asked, "fused_optimizer": True}, {}, 300)
    assert not already_tried(study, same_graphs, {}, 300)
    for other in (
        {"compile_loss": False},
        {"scope": "full"},
        {"dynamic": True},
        {"fullgraph": True},
        {"padding": "multiple", "pad_multiple": 64},
        {"compiled_autograd": True},
        {"mark_dynamic": "maybe"},
    ):
        assert mark_refused_in(study, {**asked, **other}) is None, other


def test_the_warm_up_waits_a_whole_quiet_pass_where_cuda_graphs_are_recorded():
    """Inductor's CUDA-graph trees record a graph the second time it runs, so a length the pool brings
    once is recorded a pass later: there the warm-up ends after a whole pass without a compile event,
    elsewhere after 3 quiet steps; a spec's own settle_steps (triage's 1) stands. The captioner's pool
    under `--seed 1` is such a pool: one of its 16 batches pads to the 128 bucket, and every
    reduce-overhead trial of captioner-fresh-9 recorded 36 graphs while measuring (H200, 2026-11-26)."""
    from autocompile.trial.worker import settle_steps

    graphs = {**DEFAULTS, "compile": True, "scope": "regional", "mode": "reduce-overhead"}
    assert settle_steps({"config": graphs, "device": "cuda"}, 16) == 16
    assert (
        settle_steps(
            {
                "config": {**graphs, "scope": "modular", "part_modes": {"encoder": "default", "decoder": "max-autotune"}},
                "device": "cuda:1",
            },
            16,
        )
        == 16
    )
    assert settle_steps({"config": graphs, "device": "cuda", "settle_steps": 1}, 16) == 1
    assert settle_steps({"config": graphs, "device": "cpu"}, 16) == 3  # no CUDA graphs on the CPU
    for other in ({"mode": "default"}, {"mode": "max-autotune-no-cudagraphs"}, {"compile": False}):
        assert settle_steps({"config": {**graphs, **other}, "device": "cuda"}, 16) == 3, other


def test_recompiles_on_every_length_hit_the_limit(tmp_path, toolchain_dir):
    limit = 1  # the first new length already goes past it: one compile, then the limit
    config = {"scope": "full", "dynamic": False, "recompile_limit": limit}
    record, _ = trial(tmp_path, toolchain_dir, toy(), config, ahead=True)
    assert record["recompiles"] >= limit
    assert record["recompile_limit_hit"] and record["status"] == "infeasible"
    assert "recompile limit" in record["reason"]
    assert any("size mismatch" in reason for reason in record["recompile_reasons"])


def test_a_crash_is_recorded_with_its_signal_and_phase(tmp_path, toolchain_dir):
    record, _ = trial(tmp_path, toolchain_dir, toy("toy_crash"), EAGER)
    assert record["status"] == "crashed" and "prestarted" not in record  # an eager trial: a fresh process
    assert "SIGSEGV" in record["reason"] and record["failed_phase"] == "warming up"
    with open(record["log"]) as f:  # where it was, from faulthandler, in the trial's log
        assert "Fatal Python error: Segmentation fault" in f.read()


def test_a_forked_compiled_trial_that_crashes_is_recorded_crashed_with_its_signal(tmp_path, toolchain_dir):
    """Forked from the process that imported torch once, its exit status relayed by that process:
    the crash is seen when it happens, with its signal, not at the time limit."""
    record, _ = trial(tmp_path, toolchain_dir, toy("toy_crash"), {"scope": "full"}, timeout=120, ahead=True)
    assert record["status"] == "crashed" and record["prestarted"], record["reason"]
    assert "SIGSEGV" in record["reason"] and record["wall_s"] < 100


def test_a_forking_process_whose_imports_started_cuda_is_not_used(tmp_path, toolchain_dir, capsys):
    """A child forked after CUDA started cannot use the GPU: the forking process says so instead of
    "ready", and this environment's trials start fresh processes, said once, the process not started again."""
    from autocompile.trial import prestart

    prestart.stop_all()  # not the process an earlier test left waiting for this environment
    preload = (*prestart.PRELOAD, "toy_bad_fork")
    record, _ = trial(tmp_path, toolchain_dir, toy("toy_fixed"), {"scope": "regional"}, timeout=120, ahead=True, preload=preload)
    try:
        assert record["status"] == "ok" and not record.get("prestarted"), record["reason"]
        assert "trials start fresh processes: unsafe: the imports started CUDA" in capsys.readouterr().err
        assert len(prestart._unsafe) == 1 and not prestart._waiting and not prestart._busy
    finally:
        prestart._unsafe.clear()


def test_a_hang_is_killed_at_the_time_limit(tmp_path, toolchain_dir):
    # A compiled trial in a process started ahead, as a GPU search's are: its stacks go to its own
    # log, its process group is killed. It hangs in its first eager forward (the randomness check).
    # 20 s: torch imported ahead, the forked process reaches the hanging loss (prepare, build) with
    # time to spare when loaded.
    record, _ = trial(tmp_path, toolchain_dir, toy("toy_hang"), {"scope": "regional"}, timeout=20, ahead=True)
    assert record["status"] == "timeout" and record["prestarted"]
    assert "20 s limit" in record["reason"] and record["wall_s"] < 35
    # asked for its stacks before the kill, it says where it was: in the toy's loss, asleep
    assert "toy_workloads.py" in record["stuck_in"] and record["stuck_in"].endswith("in <lambda>")
    assert record["reason"].endswith(f"(while checking randomness, in {record['stuck_in']})")
    assert any("trial/worker.py" in frame for frame in record["stack"])


def test_an_allocation_too_large_is_out_of_memory(tmp_path, toolchain_dir):
    record, _ = trial(tmp_path, toolchain_dir, toy("toy_oom"), EAGER)
    assert record["status"] == "oom", record["reason"]


def test_a_broken_model_name_fails_cleanly(tmp_path, toolchain_dir):
    record, _ = trial(tmp_path, toolchain_dir, "no-such-model", EAGER)
    assert record["status"] == "failed" and "unknown model" in record["reason"]
    assert os.path.exists(record["log"])


def test_a_compile_stack_cut_at_100_frames_names_its_compile_stage(tmp_path):
    """faulthandler writes 100 frames at most, innermost first: a deep compile's stack ends before
    the worker's frames. The thread that took the signal is the main one, and where it was is named by
    the innermost frame of a compile stage, not by the fake-tensor internals every stage calls."""
    from autocompile.trial.process import stuck_in

    site = "/venv/lib/python3.12/site-packages"
    frames = [f'  File "{site}/torch/_subclasses/fake_tensor.py", line {1000 + i} in dispatch' for i in range(60)]
    frames += [f'  File "{site}/torch/_functorch/_aot_autograd/graph_capture.py", line 96 in _create_graph']
    frames += [f'  File "{site}/torch/_dynamo/output_graph.py", line {2000 + i} in compile' for i in range(39)]
    log = tmp_path / "log.txt"
    log.write_text(
        "\n".join(
            [
                "Thread 0x00007fd491dff6c0 (most recent call first):",
                '  File "/usr/lib/python3.12/threading.py", line 1010 in run',
                "",
                "Current thread 0x00007fd936ee7140 (most recent call first):",
                *frames,
                "  ...",
                "",
            ]
        )
    )
    where, stack = stuck_in(str(log))
    assert where == "torch/_functorch/_aot_autograd/graph_capture.py:96 in _create_graph"
    assert stack[0] == "torch/_subclasses/fake_tensor.py:1000 in dispatch" and len(stack) == 40


def test_measurement_stops_once_its_windows_agree(tmp_path):
    """Windows of whole passes until the steady speed's 95% interval is within TARGET_INTERVAL: the record
    keeps every window, and the measurement stopped at the first window count where the interval of the
    windows past the settling ones (`settled`, MSER) was tight enough (at least two), or at the cap."""
    from autocompile.trial.worker import MAX_WINDOWS, TARGET_INTERVAL, interval, settled

    assert interval([10.0, 10.0]) == 0 and interval([10.0]) == float("inf")
    assert interval([9.0, 11.0]) > TARGET_INTERVAL > interval([10.0, 10.01, 9.99])
    # llama-8b-fresh-10's trial 2 (H200): two windows still rising, then steady; a flat run settles at once
    assert settled([4.98, 5.269, 5.938, 5.994, 6.083, 5.96, 6.033, 6.153]) == 2
    assert settled([10.0, 10.2, 9.9, 10.1, 10.0, 9.8]) == 0 and settled([5.0, 6.0]) == 0
    # a finalist rerun of the CPU quickstart: faster windows, then a lower tail that stays; the tail is the steady speed
    assert settled([238, 245, 263, 222, 176, 193, 184, 174]) == 4
    record = run_trial(
        TrialRequest(
            model=toy("toy_fixed"),
            config=EAGER,
            device="cpu",
            trial_dir=str(tmp_path),
            timeout_s=120,
            measure={"min_window_s": 0.1},
        )
    )
    rates = record["window_rates"]
    assert record["status"] == "ok" and 2 <= len(rates) <= MAX_WINDOWS
    first = next((k for k in range(2, len(rates) + 1) if interval(rates[settled(rates[:k]) : k]) <= TARGET_INTERVAL), None)
    assert first == len(rates) or (first is None and len(rates) == MAX_WINDOWS), rates
    cut = record["settling_windows"]
    assert cut == settled(rates) and record["interval"] == pytest.approx(interval(rates[cut:]))
    assert min(rates[cut:]) <= record["steps_per_s"] <= max(rates[cut:])


def test_a_configuration_the_packing_check_refused_is_not_proposed_again():
    """llama-8b-fresh-13 (2026-11-28, one host of four H200s) ran the same varlen neighbour 13 times: each was
    refused by the packing check, whose record said no method, so each was taken as judged by a guard since
    replaced and measured again. A refusal of the current check stands (already tried); one of the first
    check (5% against the padded batch, no version) is measured again."""
    import optuna

    from autocompile.engine.gates import already_tried
    from autocompile.trial.protocol import PACKING_CHECK_VERSION

    config = {**DEFAULTS, "scope": "regional", "padding": "pack", "pack_length": "batch"}
    reason = "numerics (packing check): changing the first sequence of a packed row, ..."
    for numerics, tried in (({"method": "packing check", "version": PACKING_CHECK_VERSION}, True), ({}, False)):
        study = optuna.create_study(direction="maximize")
        attrs = dict(role="neighbour", status="infeasible", reason=reason, config=config)
        if numerics:
            attrs["numerics"] = numerics
        study.add_trial(optuna.trial.create_trial(value=0.0, user_attrs=attrs))
        assert already_tried(study, config, {}, 300) is tried
