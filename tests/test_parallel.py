"""Trials of several ranks under DDP and FSDP2, on the CPU with gloo: spaces, searches, failing ranks, the numerics
guard, the snippet under torchrun."""

import json
import os
import subprocess
import sys

import pytest

from autocompile.cli import main
from autocompile.engine.records import trial_folder
from autocompile.trial import TrialRequest, run_trial
from autocompile.trial.process import TEST_GRAPH_CACHE, _test_graph_cache
from autocompile.space import EAGER
from conftest import FAST, ROOT, toy

# The dimensions a test leaves free are the strategy's own; the rest at plain torch.compile's values.
PINNED = {
    "mode": "default",
    "dynamic": None,
    "fullgraph": False,
    "padding": "longest",
    "mark_dynamic": "off",
    "inductor.shape_padding": True,
    "inductor.epilogue_fusion": True,
    "inductor.aggressive_fusion": False,
    "compiled_autograd": False,
    "compile_optimizer": False,
    "fused_optimizer": False,
    "compile_loss": False,
    "foreach_map_optimizer": False,
}


# Under DDP, an Inductor option is left free too: with scope regional winning, optimize_ddp does not
# apply (Dynamo compiles the DDP module only with scope full) and Compiled Autograd is refused (it needs
# the full scope's python_reducer), so epilogue fusion is the move left. No recipe sets it.
FREE = {"ddp": {k: v for k, v in PINNED.items() if k != "inductor.epilogue_fusion"}, "fsdp2": PINNED}


@pytest.fixture(scope="module", autouse=True)
def one_compile_thread():
    """Inductor compiles in each rank's own process: otherwise each rank of a 2-rank trial on these 2
    busy cores starts a pool of compile workers sized for the whole machine, and a compiled trial
    waited 5-15 s for its ranks' pools (2026-11-25). What these tests check (roles, statuses, the
    numerics verdict, the snippet under torchrun) does not depend on where Inductor compiles."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "1")
        yield


def _space(capsys, *flags) -> dict:
    assert main(["space", "--model", toy(), "--device", "cpu", "--json", *flags]) == 0
    return {d["name"]: d["choices"] for d in json.loads(capsys.readouterr().out)["dimensions"]}


def test_the_strategies_dimensions_exist_only_under_parallel(capsys):
    single = _space(capsys)
    ddp = _space(capsys, "--parallel", "ddp", "--nproc", "2")
    fsdp2 = _space(capsys, "--parallel", "fsdp2", "--nproc", "2")
    assert not {"optimize_ddp", "fsdp_compile_order", "reshard_after_forward"} & set(single)
    # the rest unchanged, but for each block's step in the backward: under DDP a gradient is whole once reduced
    assert {k: v for k, v in ddp.items() if k != "optimize_ddp"} == {k: v for k, v in single.items() if k != "step_in_backward"}
    assert "step_in_backward" in single and "step_in_backward" not in ddp
    assert ddp["optimize_ddp"][0] is None and "no_optimization" in ddp["optimize_ddp"]  # null: torch's own
    assert fsdp2["fsdp_compile_order"] == ["before", "after"] and fsdp2["reshard_after_forward"] == [True, False]
    assert main(["search", "--model", toy(), "--device", "cpu", "--nproc", "2"]) == 2
    assert "add --parallel ddp or --parallel fsdp2" in capsys.readouterr().err


def _pgid_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid`, from the process table."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append(int(entry))
    return members


@pytest.mark.parametrize(
    "name, status, timeout_s",
    [("toy_rank1_crash", "crashed", 120), ("toy_rank1_oom", "oom", 120), ("toy_rank1_hang", "timeout", 15)],
)
def test_a_failing_rank_ends_the_whole_trial(tmp_path, name, status, timeout_s):
    group = {}

    def note_group(event=None):  # the launcher's pid, from the trial's own process file, while it runs
        if not group:
            with open(tmp_path / "t" / "process.json") as f:
                group["pid"] = json.load(f)["pid"]

    record = run_trial(
        TrialRequest(
            model=toy(name),
            config=dict(EAGER),
            device="cpu",
            trial_dir=str(tmp_path / "t"),
            nproc=2,
            parallel="ddp",
            timeout_s=timeout_s,
            measure=FAST,
        ),
        on_event=note_group,
        heartbeat=note_group,  # the first comes at once: on a loaded host a hang may end before any event
    )
    assert record["status"] == status, record["reason"]
    if status != "timeout":
        assert record["reason"].startswith("rank 1 of 2: ") and record["failed_rank"] == 1
    assert group["pid"] and _pgid_members(group["pid"]) == []  # every rank and the launcher are gone


def test_the_group_s_failure_is_the_rank_that_failed_first(tmp_path):
    """torch's launcher names the first failed rank among those that had exited when it woke: on a
    loaded host that may be rank 0, failed in a collective after rank 1 ran out of memory and left
    (toy_rank1_oom read `failed` then, not `oom`). The cause is the record written first, and a rank
    that ended without one (a crash) comes before a peer that wrote one; a rank the launcher stopped
    (SIGTERM) is no cause."""
    import signal

    from autocompile.trial.ranks import _first_failure

    spec = {"result": str(tmp_path / "result.json")}
    for path, status, at in ((tmp_path / "result-rank1.json", "oom", 1), (tmp_path / "result.json", "failed", 2)):
        path.write_text(json.dumps({"status": status, "reason": ""}))
        os.utime(path, ns=(at * 10**9, at * 10**9))
    assert _first_failure(spec, [1, 1], 0) == 1 and _first_failure(spec, [1, 1], 1) == 1
    assert _first_failure(spec, [1, -signal.SIGTERM], 0) == 0  # rank 1 still running: the launcher stopped it
    os.remove(tmp_path / "result-rank1.json")
    assert _first_failure(spec, [1, -signal.SIGSEGV], 0) == 1  # rank 1 died without a record


def test_the_numerics_guard_replays_on_every_rank(tmp_path):
    """A loss that depends on dropout is judged by the replay on each rank, eager wrapped as the
    configuration is (the models' collectives need every rank): plain torch.compile of
    toy_dropout_block_scaled (a block 30% off when compiled, hidden in dropout's noise) under DDP is
    a numerics failure, as in one process, and the module-by-module comparison names the block;
    toy_dropout's replay under FSDP2 (eager sharded alike) agrees."""
    from autocompile.engine.scoring import judge, numerics_tolerance
    from autocompile.space import DEFAULTS
    from autocompile.trial.divergence import locate

    def judged(name: str, parallel: str, config: dict, measure: dict) -> dict:
        record = run_trial(
            TrialRequest(
                model=toy(name),
                config=config,
                device="cpu",
                trial_dir=str(tmp_path / name),
                nproc=2,
                parallel=parallel,
                timeout_s=300,
                measure=measure,
            )
        )
        return judge(record, None, "cpu", None)  # the engine's verdict (runner._tell), from rank 0's record

    request = TrialRequest(
        model=toy("toy_dropout_block_scaled"),
        config=dict(DEFAULTS),
        device="cpu",
        trial_dir=str(tmp_path / "scaled"),
        nproc=2,
        parallel="ddp",
        timeout_s=300,
        measure=FAST,
    )
    scaled = judge(run_trial(request), None, "cpu", None)  # measured, then replayed; the engine's verdict
    assert scaled["status"] == "infeasible" and scaled["rng_dependent"], scaled["reason"]
    assert scaled["reason"].startswith("numerics (replay): the loss of step")
    ranks = scaled["replay"]["ranks"]
    assert len(ranks) == 2 and len(scaled["ranks"]) == 2 and scaled["numerics"]["ranks"] == 2
    assert all(max(abs(t / e - 1) for t, e in zip(r["trial"], r["eager"])) > 0.005 for r in ranks)  # each rank saw it
    # where: compared with eager module by module, as a search's triage does, under DDP too (its
    # `module.` prefix is not the model's): the second block, 30% off when compiled
    located = locate(request, scaled, numerics_tolerance("cpu"))
    assert located["diverges_at"] == {"module": "blocks.1", "pass": "forward", "rel_error": pytest.approx(0.3, rel=1e-3)}
    assert "diverges first at blocks.1 (forward" in located["reason"]
    # The control: the replay alone (as `autocompile rejudge` runs it), under FSDP2 with a strategy setting
    plain = judged("toy_dropout", "fsdp2", {**DEFAULTS, "reshard_after_forward": False}, {"replay_only": True})
    assert plain["status"] == "ok" and plain["numerics"]["method"] == "replay", plain["reason"]
    assert not plain["numerics"]["differs"] and len(plain["replay"]["ranks"]) == 2, plain["numerics"]


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def searched(request, tmp_path_factory):
    """A 2-rank search as a user runs it: baselines, a recipe and a neighbour (no finalist round: the
    trials are what differs from one process, and each compiled one takes ~40 s on 2 busy cores)."""
    from autocompile.api import run_search
    from autocompile.engine.settings import SearchSettings

    directory = tmp_path_factory.mktemp(request.param)
    settings = SearchSettings(
        model=toy("toy_fixed"),
        device="cpu",
        study="s",
        directory=str(directory),
        trials=4,
        trial_timeout_s=300,
        measure=FAST,
        finalists=0,
        fixed=FREE[request.param],
        nproc=2,
        horizon=100_000,
        parallel=request.param,
    )
    return request.param, settings, run_search(settings)


def test_a_search_under_ddp_or_fsdp2_ends_with_a_winner(searched):
    parallel, settings, summary = searched
    from autocompile.engine.study import load_study

    study = load_study("s", "sqlite:///" + os.path.join(settings.study_dir, "study.db"))
    trials = [t for t in study.trials if t.user_attrs.get("role") != "finalist"]
    roles = [t.user_attrs.get("role") for t in trials]
    assert roles[:2] == ["eager", "compile-defaults"] and "recipe" in roles and "neighbour" in roles, roles
    ok = [t for t in trials if t.user_attrs.get("status") == "ok"]
    # measured, stopped once it could no longer win, or refused by a rule before launch: none failed
    assert len(ok) >= 2 and all(t.user_attrs.get("status") in ("ok", "pruned", "infeasible") for t in trials), [
        (t.user_attrs.get("status"), t.user_attrs.get("reason")) for t in trials
    ]
    records = {}
    for t in ok:  # every measured trial ran as a group of two, rank 0 speaking for both
        with open(os.path.join(trial_folder(settings.study_dir, t.number), "result.json")) as f:
            records[t.number] = json.load(f)
        assert len(records[t.number]["ranks"]) == 2 and all(r["losses"] for r in records[t.number]["ranks"])
    from autocompile.engine.scoring import numerics_verdict

    compiled = [n for n in records if n != trials[0].number]  # each rank's first losses against eager's same rank
    verdicts = [numerics_verdict(records[n], records[trials[0].number], "cpu") for n in compiled]
    assert compiled and all(v["method"] == "first losses" and v["ranks"] == 2 and not v["differs"] for v in verdicts)
    assert all(records[n]["numerics"]["ranks"] == 2 for n in compiled)  # as the engine judged them
    best = summary["best"]
    assert best is not None and f"apply_{parallel}(model" in best["snippet"]
    # resumed without --parallel: one clear line
    assert (
        main(
            [
                "search",
                "--model",
                toy("toy_fixed"),
                "--device",
                "cpu",
                "--study",
                "s",
                "--dir",
                settings.directory,
                "--trials",
                "0",
            ]
        )
        == 2
    )


SCRIPT = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
import toy_workloads
from autocompile.workloads import WorkloadOptions
exec(open({snippet!r}).read())  # the winner's snippet, pasted
dist.init_process_group("gloo")
workload = toy_workloads.toy_fixed()
options = WorkloadOptions(device="cpu", seed=0)
model, optimizer = workload.build(options)
batches = workload.batches(options, workload.batch_pool)
model, optimizer = apply_compilation(model, optimizer)
loss_fn = compile_loss(workload.criterion)
losses = []
for step in range(5):
    batch = prepare_batch(dict(batches[step % len(batches)]))
    loss = loss_fn(workload.forward(model, batch), batch)
    backward(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(float(loss.detach()))
if dist.get_rank() == 0:
    print("LOSSES", json.dumps(losses))
dist.destroy_process_group()
"""


def _compiled_winner(settings, summary) -> int:
    """The winner, or where a noisy toy measurement made eager win, the best compiled trial: the
    snippet under test compiles."""
    from autocompile.engine.study import load_study

    if summary["best"]["config"]["compile"]:
        return summary["best"]["number"]
    study = load_study("s", "sqlite:///" + os.path.join(settings.study_dir, "study.db"))
    compiled = [t for t in study.trials if t.user_attrs.get("status") == "ok" and t.user_attrs["config"]["compile"]]
    return max(compiled, key=lambda t: t.value).number


def test_the_winners_snippet_trains_under_torchrun_as_the_trial_did(searched, tmp_path):
    parallel, settings, summary = searched
    from autocompile.engine.scoring import compare_losses
    from autocompile.trial.ranks import free_port

    number = _compiled_winner(settings, summary)
    folder = trial_folder(settings.study_dir, number)
    snippet = tmp_path / "apply_compilation.py"
    with open(os.path.join(folder, "apply_compilation.py")) as f:  # the text the trial ran, as emitted
        snippet.write_text(f.read())
    assert f"apply_{parallel}(model" in snippet.read_text()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(tests=os.path.join(ROOT, "tests"), snippet=str(snippet)))
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # Inductor's cache as a trial's (process._child_env): a folder of its own, its FX graphs the session's
    # (conftest.GRAPH_CACHE), so a graph the trial compiled is loaded, as the suite's trials load each
    # other's. Dynamo and AOTAutograd trace the snippet's model under torchrun as ever; a graph the snippet
    # makes otherwise than the trial did (another shape, another Inductor setting) has another key and is
    # compiled. The losses below are the proof either way.
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")
    if os.environ.get(TEST_GRAPH_CACHE):
        _test_graph_cache(env["TORCHINDUCTOR_CACHE_DIR"])
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    losses = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("LOSSES"))[7:])
    with open(os.path.join(folder, "result.json")) as f:
        trial_losses = json.load(f)["losses"]
    verdict = compare_losses(losses, trial_losses, "cpu")
    assert not verdict["differs"], verdict


def _render(parallel: str, **changes) -> str:
    from autocompile.apply import ModelInfo, render_snippet
    from autocompile.space import DEFAULTS

    return render_snippet({**DEFAULTS, **changes}, ModelInfo(regions=["blocks"], parallel=parallel))


def test_the_snippet_says_where_compile_goes_relative_to_ddp_and_fully_shard():
    def order(text, *needles):
        return [text.index(n) for n in needles] == sorted(text.index(n) for n in needles)

    full = _render("ddp", optimize_ddp="no_optimization")
    # DDP first, then the DDP module compiled (Dynamo splits its graph per optimize_ddp)
    assert order(full, "optimize_ddp = OPTIMIZE_DDP", "model = apply_ddp(model)", "model.compile(**COMPILE_KWARGS)")
    assert order(_render("ddp", scope="regional"), "block.compile(**COMPILE_KWARGS)", "model = apply_ddp(model)")
    before = _render("fsdp2", scope="regional", reshard_after_forward=False)
    assert "compile_block=lambda block: torch.compile(block, **COMPILE_KWARGS)" in before
    assert "RESHARD_AFTER_FORWARD = False" in before and "FSDP_BLOCKS = ['blocks']" in before
    after = _render("fsdp2", scope="regional", fsdp_compile_order="after")
    assert order(after, "model = apply_fsdp2(model, optimizer)", "block.compile(**COMPILE_KWARGS)")
    assert "apply_ddp" not in _render("none") and "fully_shard" not in _render("none")
    assert "model = apply_ddp(model)" in _render("ddp", compile=False)  # the eager baseline under DDP too


def test_the_strategies_rules():
    from autocompile.engine.study import build_space
    from autocompile.space import DEFAULTS

    ddp, single = (build_space(toy(), "cpu", parallel=p) for p in ("ddp", "none"))
    assert "optimize_ddp splitting the graph" in ddp.rejection({**DEFAULTS, "fullgraph": True})
    assert ddp.rejection({**DEFAULTS, "fullgraph": True, "optimize_ddp": "no_optimization"}) is None
    assert ddp.rejection({**DEFAULTS, "scope": "regional", "fullgraph": True}) is None  # DDP's split is the full scope's
    assert "set compiled_autograd" in ddp.rejection({**DEFAULTS, "optimize_ddp": "python_reducer"})
    assert "C++ DDP Reducer" in ddp.rejection({**DEFAULTS, "scope": "regional", "compiled_autograd": True})
    assert ddp.rejection({**DEFAULTS, "optimize_ddp": "python_reducer", "compiled_autograd": True}) is None
    assert "--parallel fsdp2" in ddp.rejection({**DEFAULTS, "reshard_after_forward": False})
    assert "--parallel ddp" in single.rejection({**DEFAULTS, "optimize_ddp": "no_optimization"})
