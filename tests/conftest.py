import atexit
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

TOY = os.path.join(HERE, "toy_workloads.py")

# Short measurement windows: the tests check behaviour, not speed.
FAST = {"min_window_s": 0.05, "min_windows": 2, "max_windows": 3}

# What shapes the model's graphs, pinned at plain torch.compile's values (a search's `fixed`): a
# test searches only the dimensions it leaves free.
PLAIN_GRAPHS = {
    "scope": "full",
    "mode": "default",
    "dynamic": None,
    "fullgraph": False,
    "capture_data_dependent": False,
    "padding": "longest",
    "mark_dynamic": "off",
    "inductor.shape_padding": True,
    "inductor.epilogue_fusion": True,
    "inductor.aggressive_fusion": False,
    "compiled_autograd": False,
    "foreach_map_optimizer": False,
    "step_in_backward": False,
}


def toy(name: str = "toy") -> str:
    return f"{TOY}:{name}"


# One thread per trial: the suite runs on two xdist workers over two cores, and OpenMP threads
# that spin-wait on cores the other worker is compiling on made an eager toy run 50x slower in
# CI (4.5 steps/s against 200), which turned the tests' speed relations upside down.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# Inductor compiles in each compiled trial's own process, as test_parallel.py's ranks already did:
# otherwise every compiled trial starts a pool of compile workers (a process importing torch, and
# its forks) and waits for it before its warm-up, 5-7 s of a toy trial on 2 loaded cores
# (compile_pool_s, 2026-11-27), where the other xdist worker keeps the second core busy anyway.
# What the tests check does not depend on where Inductor compiles; the trials still wait for the
# pool as before (compile_pool_s, 0 without one).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# Inductor checks that the CPU's vector instructions work (a dry compile, then a dlopen in a child
# process, per instruction set) in every compiled trial's process, cached compile or not: 6.3 s of
# a compiled trial's preparation against 3.3 s without it (test_trial.py's 11, 2 loaded cores,
# 2026-11-26). Here the instruction sets /proc/cpuinfo lists are taken as working: the same one is
# picked, and each compiled trial of the suite spends those seconds once less.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")

# One CPU-probe cache for the whole test session, searches and commands included (the probe
# takes ~20 s once). Made by the first process of a run (xdist's workers inherit it), removed at its end.
# An error in the search's planning is raised in the suite, not contained (engine/contained.py).
os.environ.setdefault("AUTOCOMPILE_STRICT", "1")

if "AUTOCOMPILE_TOOLCHAIN_CACHE" not in os.environ:
    os.environ["AUTOCOMPILE_TOOLCHAIN_CACHE"] = tempfile.mkdtemp(prefix="autocompile-toolchain-")
    atexit.register(shutil.rmtree, os.environ["AUTOCOMPILE_TOOLCHAIN_CACHE"], ignore_errors=True)

# Inductor's C++ kernels built once per test session (tests/cxx/g++, named so for Inductor's compiler
# detection): every trial's Inductor cache starts empty, so each compiled trial of the suite built its
# kernels anew, about 1 s each (130 builds, 125 s of test_trial.py's 166 s on 2 cores, 2026-11-28).
# The same source with the same flags gives the same library; Inductor still generates each trial's
# code, and the trials still time their warm-ups (shorter by the builds skipped).
if "AUTOCOMPILE_TEST_CXX_CACHE" not in os.environ and "CXX" not in os.environ and shutil.which("g++"):
    os.environ["AUTOCOMPILE_TEST_REAL_CXX"] = shutil.which("g++")
    os.environ["CXX"] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cxx", "g++")
    os.environ["AUTOCOMPILE_TEST_CXX_CACHE"] = tempfile.mkdtemp(prefix="autocompile-cxx-")
    atexit.register(shutil.rmtree, os.environ["AUTOCOMPILE_TEST_CXX_CACHE"], ignore_errors=True)

# One Inductor FX graph cache for the trials of the whole test session (autocompile/trial/process.py's
# TEST_GRAPH_CACHE): the suite's trials compile the same few toy graphs again and again, and a trial's
# Inductor compile of a graph an earlier trial compiled is loaded. Dynamo and AOTAutograd still trace each
# graph in each trial (AOTAutograd's cache stays the trial's own, so no warm-up is reconstructed), and its
# warm-up is shorter by Inductor's compiles only. Made by the first process of a run (xdist's workers
# inherit it), removed at its end. A test of cold compiles or of the compile caches takes it out of its
# environment: `cold_graphs` for a module, `monkeypatch.delenv(GRAPH_CACHE)` for a test.
GRAPH_CACHE = "AUTOCOMPILE_TEST_GRAPH_CACHE"
if GRAPH_CACHE not in os.environ:
    os.environ[GRAPH_CACHE] = tempfile.mkdtemp(prefix="autocompile-graphs-")
    atexit.register(shutil.rmtree, os.environ[GRAPH_CACHE], ignore_errors=True)


@pytest.fixture(scope="module")
def cold_graphs():
    """A module's trials compile every graph from empty caches: no graph of the session's cache (GRAPH_CACHE)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(GRAPH_CACHE, raising=False)
        yield


# The work units that take longest, longest first (a whole run on 2 loaded cores, setups included, its
# in-process compiles from an empty Inductor cache as in a clean CI machine's): they start first, and the
# short ones fill in beside them at the end. xdist's own order (most tests first) puts files of few long
# tests near the end, where one of them can leave a worker running alone; so does a long unit missing
# here. A unit not listed keeps its place after these. A name with "::" is a work unit split off its file
# (SPLIT), placed apart.
SLOWEST_FIRST = [
    "test_trial.py",
    "test_lm_loss.py",
    "test_shared_cache.py::own searches",
    "test_strategy.py",
    "test_packing.py::own searches",
    "test_scale.py",
    "test_scale.py::own searches",
    "test_repro.py",
    "test_shared_cache.py",
    "test_study.py::own searches",
    "test_parallel.py::fsdp2",
    "test_parallel.py::ddp",
    "test_parallel.py",
    "test_packing.py",
    "test_trainer.py",
    "test_trainer.py::own searches",
    "test_claims.py",
    "test_repro.py::own searches",
    "test_checkpointing.py::own searches",
    "test_apply.py",
    "test_numerics_dropout.py",
    "test_dashboard.py",
    "test_ceiling.py",
    "test_study.py",
    "test_screening.py",
    "test_checkpointing.py",
    "test_numerics_scaled.py",
    "test_graph_breaks.py",
    "test_moe.py",
    "test_activation_budget.py",
    "test_knowledge_failures.py",
    "test_horizon.py",
    "test_kernels.py",
    "test_divergence.py",
    "test_optimizer_step.py",
    "test_plugin.py",
    "test_found_layout.py",
    "test_golden.py",
    "test_outputs.py",
    "test_space.py",
    "test_knowledge_cuts.py",
    "test_workloads.py",
    "test_knowledge_cold.py",
    "test_layout.py",
    "test_finalists.py",
]

# --dist loadfile keeps a file on one worker, and xdist hands each worker two files ahead: the
# longest files (4-10 minutes each on 2 loaded cores, 2026-11-27) made the run end on one worker
# alone. Their tests that share no module fixture with the rest (a search or a trial of their own)
# are a work unit of their own, and a parametrised module fixture's tests one unit per parameter
# (each worker sets up only the fixtures of the units it runs).
SPLIT = {
    "test_study.py": {
        "test_a_search_whose_trials_all_crash_keeps_every_record",
        "test_a_compiled_result_that_differs_from_eager_is_infeasible",
        "test_the_search_timeout_bounds_the_search",
        "test_a_trial_that_cannot_win_is_pruned",
        "test_a_model_eager_cannot_fit_still_ends_with_a_winner_and_says_what_the_ratios_are_against",
    },
    "test_checkpointing.py": {
        "test_a_configuration_with_the_checkpointing_off_runs_through_trial",
        "test_a_search_turns_the_checkpointing_off_and_best_picks_under_a_memory_limit",
    },
    "test_shared_cache.py": {
        "test_a_move_of_the_optimizer_step_loads_the_model_graphs_and_reconstructs_the_cold_warm_up",
        "test_a_configuration_predicted_to_lose_is_pruned_before_launch_and_plain_compile_is_bounded",
    },
    "test_packing.py": {
        "test_packed_batches_train_like_the_padded_batch",
        "test_packed_shapes_repeat_within_the_row_count_rule",
    },
    "test_repro.py": {"test_a_crash_in_inductor_is_minified_to_a_repro_that_fails_alone"},
    "test_trainer.py": {
        "test_a_trial_of_a_trainer_s_job_runs_its_own_step_through_apply_to_trainer",
        "test_a_lora_trainer_with_checkpointing_is_offered_the_memory_axis_and_trains_alike_without_it",
    },
    "test_scale.py": {
        "test_two_workers_on_one_host_share_a_study",
        "test_a_worker_killed_mid_trial_leaves_a_stale_trial_no_orphan_and_the_study_completes",
        "test_a_trial_failed_as_stale_while_its_worker_ran_it_keeps_its_result_as_a_trial_of_its_own",
        "test_ctrl_c_kills_the_running_trial_marks_it_interrupted_and_keeps_the_finished_ones",
        "test_ctrl_c_stops_every_worker_and_keeps_the_finished_trials",
    },
}
PER_PARAMETER = {"test_parallel.py": ("ddp", "fsdp2")}  # the `searched` fixture's parameters


def work_unit(nodeid: str) -> str:
    """The work unit of a test: its file, or a unit split off its file ("tests/test_study.py::own searches")."""
    path, _, test = nodeid.partition("::")
    name = os.path.basename(path)
    function, _, parameters = test.partition("[")
    if function in SPLIT.get(name, ()):
        return path + "::own searches"
    for parameter in PER_PARAMETER.get(name, ()):
        if parameter in parameters.rstrip("]").split("-"):
            return f"{path}::{parameter}"
    return path


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # xdist's reordering by number of tests: off, for the order below
        config.option.loadscopereorder = False


def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with the work units of `work_unit`."""
    if getattr(config.option, "dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SplitFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SplitFiles(config, log)


# The quick subset (`-m "not slow"`, at most 5 minutes on 2 cores) leaves out the tests that took 15 s or
# more (setup included) in a whole run of the suite on 2 loaded cores, and every test of a module fixture
# that runs a search or a round: the whole suite runs them all.
SLOW_FIXTURES = {
    "from_python",
    "searched",
    "neighbours",
    "shared_search",
    "screened_study",
    "round_on_two",
    "with_a_round",
    "searches",
    "study",
    "exported",
    "postgres",
    "llama_copy",
}
SLOW = {
    "test_activation_budget.py::test_a_configuration_over_the_memory_limit_is_measured_again_with_a_lower_budget",
    "test_checkpointing.py::test_a_configuration_with_the_checkpointing_off_runs_through_trial",
    "test_checkpointing.py::test_a_search_turns_the_checkpointing_off_and_best_picks_under_a_memory_limit",
    "test_checkpointing.py::test_the_snippet_switches_the_model_s_checkpointing_and_trains_like_eager_as_built",
    "test_claims.py::test_on_a_model_of_many_blocks_plain_torch_compile_runs_last_with_what_is_left",
    "test_dashboard.py::test_each_trials_files_are_uploaded_once",
    "test_dashboard.py::test_the_exported_cache_is_loaded_by_a_fresh_trial",
    "test_divergence.py::test_the_first_module_whose_output_departs_is_named_in_the_record_and_its_reason",
    "test_found_layout.py::test_a_found_layout_that_is_right_is_trained_and_measured",
    "test_found_layout.py::test_a_wrong_found_layout_is_refused_by_the_packing_check_before_anything_is_measured",
    "test_golden.py::test_every_committed_study_prints_what_it_printed",
    "test_horizon.py::test_without_horizon_steps_the_horizon_is_what_eager_runs_in_ten_budgets",
    "test_knowledge_failures.py::test_a_value_that_failed_twice_the_same_way_is_not_offered_in_the_next_study",
    "test_numerics_dropout.py::test_a_correct_compile_of_a_model_with_dropout_passes_under_every_seed",
    "test_numerics_dropout.py::test_the_replay_loads_the_optimizer_step_the_measured_run_compiled",
    "test_numerics_scaled.py::test_a_compile_three_percent_off_is_infeasible_under_every_seed",
    "test_packing.py::test_a_model_that_mixes_packed_sequences_is_refused_by_the_guard",
    "test_packing.py::test_packed_batches_train_like_the_padded_batch",
    "test_packing.py::test_packed_shapes_repeat_within_the_row_count_rule",
    "test_parallel.py::test_a_failing_rank_ends_the_whole_trial",
    "test_parallel.py::test_a_search_under_ddp_or_fsdp2_ends_with_a_winner",
    "test_parallel.py::test_the_numerics_guard_replays_on_every_rank",
    "test_parallel.py::test_the_winners_snippet_trains_under_torchrun_as_the_trial_did",
    "test_repro.py::test_a_crash_in_inductor_is_minified_to_a_repro_that_fails_alone",
    "test_repro.py::test_a_graph_that_fails_only_after_earlier_steps_gets_an_unreduced_repro_from_a_study_that_lost_its_folder",
    "test_repro.py::test_an_accuracy_repro_compiles_the_module_where_the_numerics_part_alone",
    "test_scale.py::test_a_worker_killed_mid_trial_leaves_a_stale_trial_no_orphan_and_the_study_completes",
    "test_scale.py::test_the_finalist_round_splits_its_finalists_over_the_workers",
    "test_scale.py::test_two_workers_on_one_host_share_a_study",
    "test_scale.py::test_two_workers_share_a_study_on_postgresql",
    "test_screening.py::test_a_screened_search_promotes_through_the_pruner",
    "test_shared_cache.py::test_a_configuration_predicted_to_lose_is_pruned_before_launch_and_plain_compile_is_bounded",
    "test_shared_cache.py::test_a_leader_with_a_reconstructed_warm_up_is_measured_cold_by_its_round_run",
    "test_shared_cache.py::test_a_move_of_the_optimizer_step_loads_the_model_graphs_and_reconstructs_the_cold_warm_up",
    "test_shared_cache.py::test_trials_after_the_baselines_share_one_cache_and_carry_a_reconstructed_warm_up",
    "test_strategy.py::test_neighbours_change_one_dimension_of_the_incumbent_and_record_their_parent",
    "test_strategy.py::test_the_finalist_round_runs_under_a_tight_timeout",
    "test_study.py::test_a_compiled_result_that_differs_from_eager_is_infeasible",
    "test_study.py::test_a_model_eager_cannot_fit_still_ends_with_a_winner_and_says_what_the_ratios_are_against",
    "test_study.py::test_a_trial_that_cannot_win_is_pruned",
    "test_study.py::test_search_measures_baselines_then_recipes",
    "test_study.py::test_the_search_timeout_bounds_the_search",
    "test_trial.py::test_a_hang_is_killed_at_the_time_limit",
    "test_trial.py::test_a_hard_mark_the_model_refuses_falls_back_to_maybe_and_the_study_does_not_try_it_again",
    "test_trial.py::test_eager_and_compiled_trials_measure_and_keep_their_files",
    "test_trial.py::test_graph_breaks_are_counted_with_their_reason",
    "test_trial.py::test_recompiles_on_every_length_hit_the_limit",
    "test_trial.py::test_triage_names_inductor_when_only_inductor_fails",
}


def _slow(item) -> bool:
    path, _, test = item.nodeid.partition("::")
    return f"{os.path.basename(path)}::{test.partition('[')[0]}" in SLOW or bool(SLOW_FIXTURES & set(item.fixturenames))


# The earlier studies the tests replay (their study.db or journal.log and their trials' records), as
# studies/history/ held them at 66abc85 (studies/INDEX.md): a fixture of its own, unpacked once per test
# run (xdist's workers inherit it) and removed at its end. The rest of each folder stays in git's history.
HISTORY_ARCHIVE = os.path.join(HERE, "data", "history.tar.xz")
if "AUTOCOMPILE_TEST_HISTORY" not in os.environ:
    import tarfile

    os.environ["AUTOCOMPILE_TEST_HISTORY"] = tempfile.mkdtemp(prefix="autocompile-history-")
    with tarfile.open(HISTORY_ARCHIVE) as archive:
        archive.extractall(
            os.environ["AUTOCOMPILE_TEST_HISTORY"], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {})
        )
    atexit.register(shutil.rmtree, os.environ["AUTOCOMPILE_TEST_HISTORY"], ignore_errors=True)
HISTORY = os.environ["AUTOCOMPILE_TEST_HISTORY"]


def replayed_studies(root: str = ROOT) -> list[str]:
    """The study.db of every committed study, in the order of their paths: the files git tracks under root's
    studies/ (tests/golden.py's `tracked`) and the earlier studies of the fixture, as studies/history/ held them;
    never a study a user's search wrote beside them."""
    import tarfile

    from golden import tracked

    found = {path: os.path.join(root, path) for path in tracked(root) if os.path.basename(path) == "study.db"}
    with tarfile.open(HISTORY_ARCHIVE) as archive:
        for name in archive.getnames():
            if os.path.basename(name) == "study.db":
                found[os.path.join("studies", "history", name)] = os.path.join(HISTORY, name)
    return [found[path] for path in sorted(found)]


def pytest_collection_modifyitems(items):
    for item in items:
        if _slow(item):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

    # stable: a unit's tests keep their order
    items.sort(key=lambda item: rank.get(os.path.basename(work_unit(item.nodeid)), len(rank)))


@pytest.fixture(scope="module", autouse=True)
def failure_memory(tmp_path_factory):
    """Each test module has a failure memory of its own (never the user's): what one module's
    searches fail on does not leave values out in another's. Its folder, as $AUTOCOMPILE_CACHE."""
    before = os.environ.get("AUTOCOMPILE_CACHE")
    os.environ["AUTOCOMPILE_CACHE"] = folder = str(tmp_path_factory.mktemp("cache"))
    yield folder
    if before is None:
        os.environ.pop("AUTOCOMPILE_CACHE", None)
    else:
        os.environ["AUTOCOMPILE_CACHE"] = before


@pytest.fixture(scope="session")
def toolchain_dir():
    return os.environ["AUTOCOMPILE_TOOLCHAIN_CACHE"]


def copy_study(directory, name: str, into, new_name: str) -> None:
    """Study `name` in `directory` copied, its trial folders with it, as study `new_name` in `into`:
    measurements a test's searches share (each baseline pair of a toy costs ~30 s on CI's 2 cores),
    each resumed from its own copy. Trial numbers are kept (Optuna's copy_study adds the trials in order).
    The compile caches a search dropped at its end stay dropped: a finalist round of the copy compiles
    its reruns cold (test_strategy.py's tight-timeout round from a copy took 150 s against 128 s)."""
    import shutil

    import optuna

    source, target = os.path.join(str(directory), name), os.path.join(str(into), new_name)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("study.db", "study.db-*", "results.db"))
    optuna.copy_study(
        from_study_name=name,
        from_storage="sqlite:///" + os.path.join(source, "study.db"),
        to_storage="sqlite:///" + os.path.join(target, "study.db"),
        to_study_name=new_name,
    )


def numerics_of_plain_compile(tmp_path, workload: str, seed: int, triage: bool = False) -> dict:
    """A search of two trials (eager, then plain torch.compile) on a toy workload, from Python as a
    user runs it (autocompile.search, which `autocompile search` calls); the compiled trial's record,
    with the eager baseline's first losses beside it. FAST windows: the numerics are under test, not
    the speed (the command's default windows and its own torch import cost ~10 s a search). Without
    `triage` (--no-triage), a numerics failure is not compared with eager module by module (diverges_at)."""
    import autocompile

    autocompile.search(
        toy(workload),
        trials=2,
        device="cpu",
        study="s",
        directory=str(tmp_path),
        verbosity=0,
        finalists=0,
        seed=seed,
        triage=triage,
        measure=FAST,
    )
    record = plain_compile_record(tmp_path)
    assert record["study_trials"] == 2
    return record


def command(*args: str) -> subprocess.CompletedProcess:
    """`autocompile ARGS` run by the command's own function in this process, as its entry point calls it: its
    exit status and what it printed. A process of its own imports torch (transformers, peft) anew, seconds on
    2 busy cores, where the test is about what the command prints, not about its process."""
    import contextlib
    import io

    from autocompile.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's own exits (--help, --version, a usage error)
            code = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(["autocompile", *args], code, out.getvalue(), err.getvalue())


def plain_compile_record(tmp_path) -> dict:
    """Plain torch.compile's record (trial 1) in study 's' under `tmp_path`, with the eager baseline's
    first losses beside it and the number of trials the study holds."""
    from autocompile.engine.study import load_study

    study = load_study("s", "sqlite:///" + str(tmp_path / "s" / "study.db"))
    eager, compiled = (t.user_attrs for t in study.trials[:2])
    assert eager["role"] == "eager" and compiled["role"] == "compile-defaults"
    return {**compiled, "eager_losses": eager["losses"], "study_trials": len(study.trials)}


def drawn_image(path) -> tuple:
    """A drawn PNG's size, its number of colours and the share of its most common one (the background)."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    return image.size, len(colours), max(n for n, _ in colours) / (image.size[0] * image.size[1])
