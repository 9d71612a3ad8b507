"""The `autocompile` command: search, worker, trial, best, report, models, space, knowledge, export, rejudge, dashboard,
screen-check.

Bad input ends in one line on stderr and exit status 2; an interrupted search in exit 130.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from autocompile.api import study_name
from autocompile.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UserError(f"{message} (see '{self.prog} --help')")


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}: {text}")
        return value

    return parse


_positive_int, _non_negative_int = _int_at_least(1), _int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def _memory_limit(text: str):
    """--max-memory-gb: a positive number of GB, or "eager" (eager's peak as the workload built it)."""
    return text if text == "eager" else _positive_float(text)


def _parse_set(items: list[str] | None) -> dict:
    """--set KEY=VALUE (VALUE as JSON, else a plain string) -> {KEY: VALUE}."""
    fixed = {}
    for item in items or []:
        if "=" not in item:
            raise UserError(f"--set takes KEY=VALUE, got {item!r}")
        key, raw = item.split("=", 1)
        try:
            fixed[key.strip()] = json.loads(raw)
        except ValueError:
            fixed[key.strip()] = raw
    return fixed


def _device(requested: str | None, need_gpu: bool = True) -> str:
    from autocompile.engine.settings import resolve_device  # torch only when a command needs it

    return resolve_device(requested, need_gpu)


def _load_config(text: str) -> dict:
    if text.startswith("@"):
        try:
            with open(text[1:]) as f:
                text = f.read()
        except OSError as exc:
            raise UserError(f"cannot read config file {text[1:]}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise UserError(f"--config is not valid JSON: {exc}") from None


def _workload_args(p: argparse.ArgumentParser) -> None:
    job = p.add_mutually_exclusive_group(required=True)
    job.add_argument("--model", help="workload name (see `autocompile models`), module:factory or file.py:factory")
    job.add_argument(
        "--trainer",
        metavar="FILE.py:FACTORY",
        help="a factory that returns a Hugging Face Trainer (or TRL SFTTrainer), built but not trained: its job is searched",
    )
    p.add_argument("--device", help="cuda or cpu (default: cuda if there is a GPU)")
    p.add_argument("--batch-size", type=_positive_int, help="override the workload's batch size")
    p.add_argument("--seq-len", type=_positive_int, help="override the workload's longest sequence")
    p.add_argument("--seed", type=int, default=0, help="seed for weights, batches and the sampler")


def _storage_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default="studies", help="where studies live: DIR/STUDY/ (default: studies)")
    p.add_argument("--storage", help="an Optuna storage URL (default: sqlite:///DIR/STUDY/study.db)")


def _versions() -> str:
    """autocompile's version and those of the torch, triton (if any) and optuna it runs on."""
    from importlib import metadata

    from autocompile import __version__

    found = []
    for name in ("torch", "triton", "optuna"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return f"autocompile {__version__} ({', '.join(found)})"


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="show the versions of autocompile, torch, triton, optuna")

    def __call__(self, parser, namespace, values, option_string=None):
        print(_versions())
        parser.exit()


def _verbosity_args(p: argparse.ArgumentParser, default) -> None:
    """-q / -v, before or after the command (`autocompile -q search ...`, `autocompile search -q ...`)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "-q", "--quiet", dest="verbosity", action="store_const", const=0, default=default, help="only results and errors"
    )
    group.add_argument(
        "-v",
        "--verbose",
        dest="verbosity",
        action="store_const",
        const=2,
        default=default,
        help="more detail: every event of each trial",
    )


def _memory_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--knowledge-store",
        "--failure-memory",
        dest="failure_memory",
        metavar="PATH",
        help="the knowledge store's file (default: $AUTOCOMPILE_CACHE/knowledge.db, else ~/.cache/autocompile/knowledge.db; "
        "an old failures.db there is read where no knowledge.db is)",
    )


def _gpus(text: str) -> list[str]:
    from autocompile.engine.workers import parse_gpus

    try:
        return parse_gpus(text)
    except UserError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _gpus_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpus",
        type=_gpus,
        default=None,
        metavar="N|all|I,J",
        help="a worker process per GPU this process was given (CUDA_VISIBLE_DEVICES, else the host's), "
        "sharing the study: a count (4), all, or indices among them (0,2) "
        "(default 1); with --device cpu, N workers on the CPU (for testing)",
    )


def _parallel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--parallel",
        choices=("none", "ddp", "fsdp2"),
        default="none",
        help="each trial's ranks share the model with DDP or FSDP2 (fully_shard per block, then the root); "
        "none: one process (default)",
    )
    p.add_argument(
        "--nproc",
        type=_positive_int,
        default=1,
        help="ranks per trial on this host (default 1): a GPU each on CUDA (NCCL), processes on the CPU (gloo)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="autocompile", description="Search for the fastest torch.compile settings of a training workload.")
    parser.add_argument("--version", action=_Version)
    _verbosity_args(parser, default=1)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("search", help="run or resume a search")
    _workload_args(p)
    _storage_args(p)
    p.add_argument("--study", help="study name (default: the model name)")
    p.add_argument(
        "--trials",
        type=_non_negative_int,
        default=10,
        help="trials to run now, baselines included (default 10; 0: only the finalist round)",
    )
    p.add_argument("--timeout", type=_positive_float, help="bound on this search's wall time, seconds")
    p.add_argument("--trial-timeout", type=_positive_float, default=900.0, help="limit for one trial, seconds (default 900)")
    p.add_argument(
        "--baseline-timeout",
        type=_positive_float,
        help="limit for the baselines (eager, plain torch.compile), seconds (default: --trial-timeout); "
        "a baseline that timed out under a shorter limit is measured again on resume",
    )
    p.add_argument(
        "--horizon-steps",
        type=_positive_int,
        default=None,
        help="steps of your training run, over which the warm-up is amortised (default: the steps eager "
        "runs in ten times this search's budget, --timeout or its trials at their limit)",
    )
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="pin a search dimension, e.g. --set scope=regional")
    p.add_argument("--space", metavar="FILE", help="a space file (TOML or JSON): [fix], [exclude], [inductor]")
    p.add_argument(
        "--max-memory-gb",
        type=_memory_limit,
        metavar="GB|eager",
        help="trials whose peak memory is above this are infeasible; eager: above eager's peak as the "
        "workload built it (its own checkpointing on): no more memory than the job takes now",
    )
    p.add_argument(
        "--finalists",
        type=_non_negative_int,
        default=3,
        help="top configurations measured again at the end, alternating with eager (default 3; 0: none)",
    )
    p.add_argument("--no-prune", action="store_true", help="let every trial finish, even one that can no longer win")
    p.add_argument(
        "--no-triage",
        action="store_true",
        help="do not rerun compile failures with simpler backends to name the failing layer, nor "
        "compare numerics failures with eager module by module to find where they part",
    )
    p.add_argument(
        "--no-trace",
        action="store_true",
        help="no TORCH_TRACE in the trials (written when tlparse is installed, for the dashboard's reports)",
    )
    p.add_argument(
        "--screen",
        type=_positive_int,
        metavar="K",
        help="screen each trial first with the model's repeated blocks cut to K; the top half go on to a "
        "full trial (off by default; see `autocompile screen-check`)",
    )
    p.add_argument(
        "--shared-cache",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="trials after the baselines share one compile cache, each graph compiled once in the study, "
        "their cold warm-up reconstructed (off by default until validated: `autocompile cache-check`)",
    )
    p.add_argument(
        "--prestart",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fork each compiled trial from a process that imported torch, Dynamo and Inductor once, "
        "instead of importing them in each trial's own process (default: on)",
    )
    _gpus_arg(p)
    _parallel_args(p)
    _memory_args(p)

    p = sub.add_parser("worker", help="join a running study (from another host) and run its trials until its budget is spent")
    p.add_argument("--study", required=True)
    p.add_argument("--storage", required=True, help="the study's storage URL, e.g. postgresql+psycopg://user@host/db")
    p.add_argument(
        "--dir", default="studies", help="where this host keeps the trials' files: DIR/STUDY/trials (default: studies)"
    )
    p.add_argument("--timeout", type=_positive_float, help="stop after this many seconds (the study's own deadline holds too)")
    _gpus_arg(p)

    p = sub.add_parser("trial", help="measure one configuration in an isolated process")
    _workload_args(p)
    p.add_argument("--config", required=True, help='configuration as JSON, or @file.json (e.g. \'{"scope": "regional"}\')')
    p.add_argument("--trial-timeout", type=_positive_float, default=900.0)
    p.add_argument("--dir", help="keep the trial's files here (default: a temporary folder)")
    p.add_argument(
        "--triage", action="store_true", help="if it fails to compile, rerun it with simpler backends to name the failing layer"
    )
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    _parallel_args(p)

    p = sub.add_parser("best", help="print the winning snippet of a study")
    p.add_argument("--study", required=True)
    _storage_args(p)
    p.add_argument("--json", action="store_true", help="the winner's configuration and measurements as JSON")
    p.add_argument(
        "--horizon",
        type=_positive_int,
        metavar="H",
        help="the winner for a run of H steps, from the measured trials (default: the study's horizon)",
    )
    p.add_argument(
        "--pareto",
        action="store_true",
        help="list the front of steady throughput against warm-up, and the horizons where each wins; "
        "and against peak memory, where the study searched it",
    )
    p.add_argument(
        "--max-memory-gb",
        type=_positive_float,
        metavar="X",
        help="the winner among the configurations whose peak memory was at most X GB, from the measured trials (no new search)",
    )

    p = sub.add_parser(
        "report",
        help="write DIR/STUDY/report/ (PNG plots, report.md), DIR/STUDY/results.db, and "
        "trials.txt, results.json and the winner's snippet again",
    )
    p.add_argument("--study", required=True)
    _storage_args(p)

    p = sub.add_parser(
        "repro",
        help="a repro.py of a failed trial, kept in its folder and its dashboard files: "
        "minified by torch's minifier (for the layer triage found), or, for a failure "
        "at run time outside the graphs it watches, the snippet on the workload unreduced",
    )
    p.add_argument("--study", help="the study (with --trial)")
    p.add_argument("--trial", type=_non_negative_int, help="the failed trial's number")
    p.add_argument(
        "--trial-dir", help="instead of --study and --trial: the folder of a trial run by hand (`autocompile trial --dir DIR`)"
    )
    _storage_args(p)
    p.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        help="seconds for the minifier (default 600; the rerun has the trial's own limit); past it, the "
        "smallest failing graph reached is kept, and a later repro with more time goes on from there",
    )
    p.add_argument(
        "--accuracy",
        action="store_true",
        help="for a numerics failure: the minifier's accuracy mode (TORCHDYNAMO_REPRO_LEVEL=4), on the "
        "module where the numerics part (diverges_at) compiled alone, if the record names one",
    )

    sub.add_parser("models", help="list the workloads")

    p = sub.add_parser("space", help="show the search space for a model and device")
    _workload_args(p)
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    p.add_argument("--space", metavar="FILE", help="a space file (TOML or JSON): [fix], [exclude], [inductor]")
    p.add_argument(
        "--max-memory-gb", type=_memory_limit, metavar="GB|eager", help="the space of a search under this memory limit"
    )
    p.add_argument("--json", action="store_true")
    _parallel_args(p)
    _memory_args(p)

    p = sub.add_parser(
        "knowledge",
        aliases=["failures"],
        help="list the knowledge store: values left out after failing twice the same way, cuts, cold runs, gains",
    )
    _memory_args(p)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--forget", metavar="DIM=VALUE", help="forget the failures with this value (e.g. fullgraph=true)")
    group.add_argument("--forget-all", action="store_true", help="forget everything remembered")
    group.add_argument(
        "--learn",
        metavar="STUDY",
        help="remember what a finished study's trials with compile-heavy "
        "values (max-autotune, coordinate descent, compiled autograd) "
        "or the whole model as one graph took, or that they ran out of "
        "their limit while compiling, "
        "and what its finalist round's cold runs took against the "
        "warm-ups reconstructed from a shared cache",
    )
    p.add_argument("--dir", default="studies", help="where --learn's study lives: DIR/STUDY/ (default: studies)")

    p = sub.add_parser(
        "rejudge",
        help="re-judge the numerics of trials measured under an older guard, and choose "
        "the finalist round's winner again under the current rule (nothing measured again)",
    )
    p.add_argument("--study", required=True)
    _storage_args(p)
    p.add_argument("--dry-run", action="store_true", help="list the trials it would re-judge")

    p = sub.add_parser("export", help="run the winner once more and save its compile cache, for a warm start")
    p.add_argument("--study", required=True)
    _storage_args(p)
    p.add_argument("--out", help="where the cache and the snippet go (default: DIR/STUDY/export)")
    p.add_argument("--trial", type=_non_negative_int, help="export this trial's configuration instead of the winner's")
    p.add_argument("--trial-timeout", type=_positive_float, default=900.0, help="limit for the run, seconds (default 900)")
    p.add_argument(
        "--check", action="store_true", help="then run the winner again, loading the cache, and compare the two warm-ups"
    )

    p = sub.add_parser(
        "screen-check",
        help="how well screening at K blocks ranks a finished study's configurations (Spearman's rho): DIR/STUDY/screening.md",
    )
    p.add_argument("--study", required=True)
    _storage_args(p)
    p.add_argument("--blocks", type=_positive_int, required=True, metavar="K", help="the repeated blocks kept")
    p.add_argument("--limit", type=_positive_int, default=10, help="configurations measured, best first (default 10)")
    p.add_argument("--timeout", type=_positive_float, help="bound on the whole check, seconds")
    p.add_argument("--trial-timeout", type=_positive_float, default=900.0, help="limit for one screen, seconds (default 900)")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="measure every screen now, even those a search with --screen K or an earlier check made "
        "(used as they are otherwise)",
    )
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="STUDY",
        help="another study of the same workload (in --dir) whose configurations join the check; repeatable",
    )

    p = sub.add_parser(
        "cache-check",
        help="how well a shared compile cache's reconstructed warm-up matches a cold one "
        "(decides --shared-cache; table in DIR/cache-check-MODEL/cache-check.md)",
    )
    _workload_args(p)
    p.add_argument("--groups", type=_positive_int, default=2, help="recipes whose graphs are shared (default 2)")
    p.add_argument(
        "--per-group",
        type=_positive_int,
        default=4,
        help="configurations per recipe: it, and its moves of the optimizer step and the loss (default 4)",
    )
    p.add_argument("--trial-timeout", type=_positive_float, default=600.0, help="limit for one run, seconds (default 600)")
    p.add_argument(
        "--dir",
        default="studies",
        help="the check goes to DIR/cache-check-MODEL (default: studies); a check that was cut continues there",
    )

    p = sub.add_parser("dashboard", help="open a study in optuna-dashboard")
    p.add_argument("--study", required=True)
    _storage_args(p)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    for p in {id(p): p for p in sub.choices.values()}.values():  # an alias's parser once
        _verbosity_args(p, default=argparse.SUPPRESS)  # the main parser's value stands unless given here
    return parser


def cmd_search(args) -> int:
    from autocompile.outputs.dashboard import tlparse_command
    from autocompile.api import run
    from autocompile.outputs.table import format_summary, no_winner_line
    from autocompile.engine.records import Role
    from autocompile.engine.settings import SearchSettings
    from autocompile.engine.studyview import EAGER_PEAK

    settings = SearchSettings(
        model=args.model,
        device=_device(args.device),
        study=args.study or study_name(args.model),
        directory=args.dir,
        storage=args.storage,
        trials=args.trials,
        timeout_s=args.timeout,
        trial_timeout_s=args.trial_timeout,
        baseline_timeout_s=args.baseline_timeout,
        horizon=args.horizon_steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        seed=args.seed,
        fixed=_parse_set(args.set),
        space_file=args.space,
        max_memory_gb=args.max_memory_gb,
        finalists=args.finalists,
        prune=not args.no_prune,
        triage=not args.no_triage,
        trace=tlparse_command() is not None and not args.no_trace,  # tlparse reports in the dashboard
        memory_path=args.failure_memory,
        screen=args.screen,
        shared_cache=args.shared_cache,
        nproc=args.nproc,
        parallel=args.parallel,
        prestart=args.prestart,
    )
    if args.trials == 0:  # only the finalist round: of a study that has trials
        existing, _ = _existing_study(argparse.Namespace(storage=args.storage, dir=args.dir, study=settings.study))
        if not existing.trials:
            raise UserError(
                f"study {settings.study!r} has no trials: --trials 0 runs only the finalist round of a study that has some"
            )
    summary = run(settings, args.verbosity, gpus=args.gpus).summary
    print(format_summary(summary))
    if summary["best"] is None:
        limit = settings.max_memory_gb
        if limit == EAGER_PEAK:  # eager's peak as built
            limit = next((r["peak_mem_gb"] for r in summary["rows"] if r["role"] == Role.EAGER), None)
        print(no_winner_line(summary["rows"], os.path.join(settings.study_dir, "trials"), limit))
        return 1
    print(f"snippet written to {os.path.join(settings.study_dir, 'apply_compilation.py')}:")
    print()
    print(summary["best"]["snippet"])
    return 0


def cmd_worker(args) -> int:
    from autocompile.api import live_outputs
    from autocompile.outputs.progress import progress_for
    from autocompile.engine.workers import join, run_workers

    if args.gpus and len(args.gpus) > 1:
        from autocompile.engine.study import load_study

        device = load_study(args.study, args.storage).user_attrs.get("settings", {}).get("device", "cuda")
        from autocompile.engine.workers import assign

        gpus = assign(args.gpus) if device.startswith("cuda") else args.gpus
        codes = run_workers(args.study, args.storage, args.dir, gpus, device, args.verbosity, args.timeout)
        if 130 in codes:
            raise KeyboardInterrupt
        return max(codes)
    count = join(
        args.study,
        args.storage,
        args.dir,
        progress_for(args.verbosity, 0),
        args.timeout,
        callbacks=live_outputs(os.path.join(args.dir, args.study)),
    )
    print(f"study {args.study!r}: {count} trials counted; this worker is done")
    return 0


def _refuse_or_note(space, config: dict) -> None:
    """`trial` refuses a configuration that cannot run here; one the search leaves out only because
    it is predicted to fail or not pay (rules.doomed: a failure seen on this torch, a recompile per
    LR value) runs as asked, with a note: reproducing such a failure is a reason to run it."""
    import json

    from autocompile.space import DEFAULTS, doomed

    reason = space.rejection(config)
    predicted = doomed({**json.loads(json.dumps(DEFAULTS)), **config}, space.traits, space.caps)
    if reason and reason != predicted:
        raise UserError(f"this configuration cannot run here: {reason}")
    if predicted:
        print(
            f"note: a search would not launch this configuration ({predicted}); running it as asked", file=sys.stderr, flush=True
        )


def cmd_trial(args) -> int:
    from autocompile.engine.scoring import score
    from autocompile.engine.study import build_space
    from autocompile.trial import RECORD_FIELDS, TrialRequest, run_trial, triage
    from autocompile.trial.result import Status

    from autocompile.engine.settings import check_parallel

    device = _device(args.device)
    check_parallel(args.parallel, args.nproc)
    config = _load_config(args.config)
    space = build_space(args.model, device, args.batch_size, args.seq_len, args.seed, parallel=args.parallel)
    config = space.validate(config)
    _refuse_or_note(space, config)
    trial_dir = args.dir or tempfile.mkdtemp(prefix="autocompile-trial-")
    request = TrialRequest(
        model=args.model,
        config=config,
        device=device,
        trial_dir=trial_dir,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        seed=args.seed,
        timeout_s=args.trial_timeout,
        nproc=args.nproc,
        parallel=args.parallel,
    )
    last = {}

    def show(event):
        if event.get("phase") != last.get("phase") and not args.json:
            print(f"  {event['phase']}", file=sys.stderr, flush=True)
        last.update(event)

    record = run_trial(request, on_event=show)
    if args.triage and record["status"] == Status.COMPILE_ERROR:
        print("  compile error: rerunning with simpler backends to find the layer", file=sys.stderr, flush=True)
        record = triage(request, record)
    record["score"] = score(record)
    if args.json:
        print(json.dumps(record, indent=1, default=str))
    else:
        for key in RECORD_FIELDS:
            value = record.get(key)
            print(f"{key:>14}: {value:.4g}" if isinstance(value, float) else f"{key:>14}: {value}")
        for item in record.get("graph_break_reasons") or []:
            print(f"   graph break x{item['count']}: {item['reason']}")
        for reason in record.get("recompile_reasons") or []:
            print(f"     recompile: {reason}")
        for rung in record.get("triage") or []:
            print(f"{'triage':>14}: backend {rung['backend']}: {rung['status']} {rung['reason'][:120]}")
        for note in record.get("notes") or []:
            print(f"          note: {note}")
        print(f"{'files':>14}: {trial_dir}")
    return 0 if record["status"] == Status.OK else 1


def _existing_study(args):
    """(study, storage URL) of --study in --dir or --storage; a one-line error if absent."""
    from autocompile.engine.storage import load_study, storage_file, storage_url

    url = storage_url(args.storage, args.dir, args.study)
    path = storage_file(url)
    if path and not os.path.exists(path):
        raise UserError(f"no study {args.study!r}: {path} does not exist (give --dir or --storage)")
    return load_study(args.study, url, folder=not args.storage), url


def cmd_best(args) -> int:
    from autocompile.outputs.table import format_best, format_effects, format_failures, summarize

    study, _ = _existing_study(args)
    # The study's folder holds each trial's whole record (the winner's snippet); nothing is written
    summary = summarize(study, os.path.join(args.dir, args.study), horizon=args.horizon, max_memory_gb=args.max_memory_gb)
    if summary["best"] is None and args.max_memory_gb is not None:
        from autocompile.outputs.pareto import measured_points

        least = min((p.figures["peak_mem_gb"] for p in measured_points(study, float("inf"))), default=None)
        raise UserError(
            f"study {args.study!r} measured no configuration within {args.max_memory_gb:g} GB"
            + (f": the least any needed was {least:.2f} GB" if least else "")
        )
    if summary["best"] is None:
        raise UserError(f"study {args.study!r} has no trial that ran cleanly yet")
    if args.pareto:
        from autocompile.outputs.pareto import format_front, format_memory_front, searched_memory

        print(format_front(study, summary["horizon"]))
        if searched_memory(study) or args.max_memory_gb is not None:
            print()
            print(format_memory_front(study, summary["horizon"], args.max_memory_gb))
    elif args.json:
        print(json.dumps({k: v for k, v in summary["best"].items() if k != "snippet"}, indent=1, default=str))
    else:
        if args.verbosity:
            print(format_best(summary["best"]), file=sys.stderr)
            if _round_owed(study):
                print(
                    f"note: study {args.study!r} has no finalist round yet (its search stopped before it, or still "
                    "runs): the winner is the best single measurement; the same search command resumes it",
                    file=sys.stderr,
                )
            if summary["effects"]:
                print(format_effects(summary["effects"]), file=sys.stderr)
            failures = format_failures(summary["rows"], args.study)
            if failures:
                print(failures, file=sys.stderr)
            _print_without_code(summary["best"])
        print(summary["best"]["snippet"])
    return 0


def _print_without_code(best: dict) -> None:
    """For a Trainer's job, the winner as the Trainer's own settings too, where they can say it."""
    from autocompile.apply import without_code

    if "def apply_to_trainer(" not in best["snippet"]:
        return
    form = without_code(best.get("config") or {})
    if form:
        print("without code, the same settings:\n  " + "\n  ".join(form), file=sys.stderr)
    else:
        print("call apply_to_trainer(trainer) before trainer.train(): the Trainer's settings cannot say it", file=sys.stderr)


def _round_owed(study) -> bool:
    """Whether the study's search plans a finalist round that has not given its verdict."""
    planned = (study.user_attrs.get("search_settings") or {}).get("finalists", 0)
    return bool(planned) and not study.user_attrs.get("finalists")


def cmd_report(args) -> int:
    from autocompile.outputs.plots import write_report
    from autocompile.outputs.results import FILE_NAME, write_results
    from autocompile.outputs.table import summarize

    study, _ = _existing_study(args)
    study_dir = os.path.join(args.dir, args.study)
    summarize(study, study_dir, write=True)  # trials.txt, results.json and the winner's snippet, as the study now reads
    results = write_results(study, os.path.join(study_dir, FILE_NAME))
    report = write_report(study, study_dir)
    print(f"report: {report}\nresults table: {results}")
    return 0


def cmd_repro(args) -> int:
    from autocompile.outputs.dashboard import upload_study_files
    from autocompile.outputs.repro import repro_folder, repro_trial

    if args.trial_dir:
        if args.study or args.trial is not None:
            raise UserError("give --trial-dir, or --study with --trial, not both")
        summary = repro_folder(args.trial_dir, args.timeout, args.accuracy)
        print(summary["line"])
        return 0 if summary.get("repro") else 1
    if not args.study or args.trial is None:
        raise UserError("say which trial: --study NAME --trial N, or --trial-dir DIR")
    study, _ = _existing_study(args)
    study_dir = os.path.join(args.dir, args.study)
    summary = repro_trial(study, study_dir, args.trial, args.timeout, args.accuracy)
    upload_study_files(study, study_dir)  # the repro's files join the trial's in the dashboard
    print(summary["line"])
    return 0 if summary.get("repro") else 1


def cmd_models(args) -> int:
    from autocompile.workloads import list_workloads

    rows = list_workloads()
    width = max(len(name) for name, _ in rows)
    for name, description in rows:
        print(f"{name.ljust(width)}  {description}")
    return 0


def cmd_space(args) -> int:
    from autocompile.engine.study import build_space, memory_bound

    from autocompile.engine.settings import check_parallel

    device = _device(args.device, need_gpu=False)
    check_parallel(args.parallel, args.nproc)
    bound = memory_bound(args.max_memory_gb, device)
    space = build_space(
        args.model, device, args.batch_size, args.seq_len, args.seed, _parse_set(args.set), args.space, bound, args.parallel
    )
    described = space.describe()
    described["left_out"] += _remembered(space, device, args.failure_memory)
    if args.json:
        print(json.dumps(described, indent=1))
        return 0
    narrowed = f", narrowed by {described['space_file']}" if described["space_file"] else ""
    ranks = f", {args.nproc} ranks under {args.parallel}" if args.parallel != "none" else ""
    print(f"search space on {described['device']} with torch {described['torch']}{ranks}{narrowed}:")
    width = max(len(item["name"]) for item in described["dimensions"] + described["left_out"])
    for dim in described["dimensions"]:
        pinned = f"  (pinned to {json.dumps(dim['fixed'])})" if "fixed" in dim else ""
        where = f"  (where {dim['where']})" if "where" in dim else ""
        print(f"  {dim['name']:<{width}}  {json.dumps(dim['choices'])}{pinned}{where}")
    if described["layout"]:
        print(f"packing's sequence layout: {described['layout']}")
    print("left out:")
    for item in described["left_out"]:
        print(f"  {item['name']:<{width}}  {item['why']}")
    return 0


def _remembered(space, device: str, path: str | None) -> list[dict]:
    """The failure memory's left-out values for this space's torch and device, as `left_out` items."""
    from autocompile.engine.knowledge import Failures, device_name, store_path, why

    path = store_path(path)
    if not os.path.exists(path):
        return []
    failures = Failures(path, space, device_name(device))
    return [{"name": entry["item"], "why": why(entry), "trials": entry["trials"]} for entry in failures.left_out()]


def cmd_knowledge(args) -> int:
    from autocompile.engine import knowledge
    from autocompile.engine.study import learn_from

    path = knowledge.store_path(args.failure_memory)
    if args.learn:
        study, _ = _existing_study(argparse.Namespace(study=args.learn, dir=args.dir, storage=None))
        learned = learn_from(path, study)
        held, cold, gains = learned["cuts"], learned["cold"], learned["gains"]
        print(
            f"learned from study {args.learn!r}: {held} {'trial' if held == 1 else 'trials'} with compile-heavy, "
            "whole-model or implicated values remembered, "
            f"and {cold} cold {'run' if cold == 1 else 'runs'} of the finalist round, "
            f"in {path}; {gains} {'neighbour' if gains == 1 else 'neighbours'} against "
            f"{'its parent' if gains == 1 else 'their parents'} too, and {learned['paces']} "
            f"{'pace' if learned['paces'] == 1 else 'paces'} and {learned['peaks']} peak "
            f"{'memory' if learned['peaks'] == 1 else 'memories'} of the configurations measured"
        )
        return 0
    if args.forget or args.forget_all:
        count = knowledge.forget(path, None if args.forget_all else args.forget)
        print(f"forgot {count} remembered {'outcome' if count == 1 else 'outcomes'} in {path}")
        return 0
    _list_knowledge(path)
    return 0


def _list_knowledge(path: str) -> None:
    """`autocompile knowledge`: the values left out, the compile cuts and the cold runs the store holds."""
    from autocompile.engine.knowledge import listing, why

    known = listing(path)
    entries, trials = known["left_out"], known["failed_trials"]
    print(
        f"knowledge store {path}: {trials} failed {'trial' if trials == 1 else 'trials'} remembered, "
        f"{len(entries)} {'value' if len(entries) == 1 else 'values'} left out"
    )
    for entry in entries:
        print(f"  {entry['item']}  [torch {entry['torch']}, {entry['device']}]  {why(entry)}")
    cuts = known["cuts"]
    if cuts:
        print(
            "ran out of the trial limit while compiling (for that model, a configuration with one is refused under a "
            "trial limit where two such cuts took 90% of it or more):"
        )
    for cut in cuts:
        warmed = f", warmed up in {cut['warmed_in_s']:.0f} s at most" if cut["warmed_in_s"] else ""
        print(
            f"  {cut['item']}  [torch {cut['torch']}, {cut['device']}, {cut['model']}]  cut {cut['cuts']} times, "
            f"after {cut['cut_after_s']} s{warmed}"
        )
    plain: dict = {}
    for row in known["plain"]:
        plain.setdefault((row["torch"], row["device"], row["model"]), []).append(row)
    for (torch_version, device, model), rows in plain.items():
        cut = [r["seconds"] for r in rows if r["outcome"] == "cut"]
        warmed = [r["seconds"] for r in rows if r["outcome"] == "warmed"]
        print(
            f"plain torch.compile [torch {torch_version}, {device}, {model}]: "
            + (f"warmed up in {min(warmed):.0f}-{max(warmed):.0f} s" if warmed else "never warmed up")
            + (f", cut while compiling after up to {max(cut):.0f} s" if cut else "")
            + f" ({len(rows)} {'run' if len(rows) == 1 else 'runs'})"
        )
    for gain in known["gains"]:
        print(
            f"neighbours against their parents [torch {gain['torch']}, {gain['device']}, {gain['model']}]: "
            f"{gain['moves']}, the most "
            f"one gained {gain['ratio']:.2f}x its parent's steady speed (the ceiling of a neighbour's pruning bound)"
        )
    for pace in known["paces"]:
        print(
            f"configurations measured [torch {pace['torch']}, {pace['device']}, {pace['model']}]: "
            f"{pace['configurations']} in {pace['runs']} runs (the ceiling of the same configuration's pruning bound)"
        )
    for peak in known["peaks"]:
        print(
            f"peak memory measured [torch {peak['torch']}, {peak['device']}, {peak['model']}]: "
            f"{peak['configurations']} configurations in {peak['runs']} runs (one over a search's --max-memory-gb "
            f"twice is refused before launch)"
        )
    for cold in known["cold"]:
        print(
            f"cold runs of the finalist round [torch {cold['torch']}, {cold['device']}, {cold['model']}]: the latest "
            f"{cold['runs']} took {cold['scale']:.2f}x the seconds their reconstructed warm-ups added (the next "
            f"round plans with it)"
        )


def cmd_export(args) -> int:
    from autocompile.outputs.export import check_warm_start, chosen, export
    from autocompile.trial.result import Status

    study, _ = _existing_study(args)
    out = args.out or os.path.join(args.dir, args.study, "export")
    number, _ = chosen(study, args.trial)  # a clear error before anything runs
    print(f"running trial {number} of {args.study!r} once more to save its compile cache in {out}", file=sys.stderr, flush=True)
    cold = export(study, out, args.trial, args.trial_timeout)
    cache = cold["cache"]
    print(f"compile cache: {cache['path']} ({cache['bytes'] / 2**20:.1f} MB, key in {os.path.basename(cache['path'])}.json)")
    print(f"snippet: {cold['snippet_path']} (call load_compile_cache({cache['path']!r}) before the first step)")
    if args.check:
        warm = check_warm_start(study, cold, args.trial, args.trial_timeout)
        if warm["status"] != Status.OK:
            raise UserError(f"the run that loads the cache ended {warm['status']}: {warm.get('reason', '')}")
        print(
            f"warm-up cold {cold['warmup_s']:.1f} s ({_caches(cold)}), with the cache loaded {warm['warmup_s']:.1f} s "
            f"({_caches(warm)}): {cold['warmup_s'] / warm['warmup_s']:.1f}x shorter"
            + ("" if warm.get("cache_loaded") else "; the cache was NOT loaded: see the log")
        )
    return 0


def _caches(record: dict) -> str:
    counts = record.get("compile_caches") or {}
    return ", ".join(f"{key} {n}" for key, n in sorted(counts.items())) or "no cache counts"


def cmd_dashboard(args) -> int:
    study, url = _existing_study(args)  # a clear error for a wrong name, before the server starts
    try:
        import optuna_dashboard  # noqa: F401
    except ImportError:
        raise UserError("optuna-dashboard is not installed: pip install optuna-dashboard") from None
    from autocompile.outputs.dashboard import serve

    study_dir = os.path.join(args.dir, args.study)
    print(
        f"optuna-dashboard for {url} on http://{args.host}:{args.port}/ (trial files from "
        f"{os.path.join(study_dir, 'artifacts')})",
        file=sys.stderr,
        flush=True,
    )
    serve(study, url, study_dir, host=args.host, port=args.port)
    return 0


def cmd_rejudge(args) -> int:
    from autocompile.engine.finalists import WINNER_RULE, rechoose
    from autocompile.engine.rejudge import rejudge, to_rejudge
    from autocompile.outputs.table import summarize

    study, _ = _existing_study(args)
    study_dir = os.path.join(args.dir, args.study)
    if not to_rejudge(study):
        print(f"study {args.study!r}: every verdict comes from the current numerics guard")
    else:
        rejudge(study, study_dir, dry_run=args.dry_run)
    verdict = study.user_attrs.get("finalists")
    if verdict and verdict.get("winner_rule") != WINNER_RULE and not args.dry_run:
        rechoose(study, study.user_attrs.get("horizon", 1000))
        summarize(study, study_dir, write=True)  # the winner's files, as the round now chooses
    return 0


def cmd_screen_check(args) -> int:
    from autocompile.outputs.screencheck import check_screening, write_check

    study, _ = _existing_study(args)
    others = [_existing_study(argparse.Namespace(study=name, dir=args.dir, storage=None))[0] for name in args.also]
    command = (
        f"autocompile screen-check --study {args.study} --blocks {args.blocks} --limit {args.limit} --dir {args.dir}"
        + (f" --storage {args.storage}" if args.storage else "")
        + (f" --timeout {args.timeout:g}" if args.timeout else "")
        + f" --trial-timeout {args.trial_timeout:g}"
        + (" --fresh" if args.fresh else "")
        + "".join(f" --also {name}" for name in args.also)
    )
    result = check_screening(
        study,
        args.dir,
        args.blocks,
        limit=args.limit,
        timeout_s=args.timeout,
        trial_timeout_s=args.trial_timeout,
        command=command,
        fresh=args.fresh,
        others=others,
    )
    md, _ = write_check(result, os.path.join(args.dir, args.study))
    rho = "n/a (fewer than 3 configurations screened cleanly)" if result["rho"] is None else f"{result['rho']:.2f}"
    print(
        f"Spearman rho between screened (at {args.blocks} blocks) and full scores: {rho} over "
        f"{result['ranked']} configurations; table in {md}"
    )
    return 0 if result["rho"] is not None else 1


def cmd_cache_check(args) -> int:
    from autocompile.engine.study import build_space
    from autocompile.outputs.cachecheck import check_cache, format_check

    device = _device(args.device)
    space = build_space(args.model, device, args.batch_size, args.seq_len, args.seed)
    out = os.path.join(args.dir, "cache-check-" + study_name(args.model))
    command = (
        f"autocompile cache-check --model {args.model} --device {device} --groups {args.groups} "
        f"--per-group {args.per_group} --trial-timeout {args.trial_timeout:g} --dir {args.dir}"
    )
    state = check_cache(
        space,
        args.model,
        device,
        out,
        args.groups,
        args.per_group,
        args.trial_timeout,
        command,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    with open(os.path.join(out, "cache-check.md"), "w") as f:
        f.write(format_check(state))
    print(format_check(state))
    return 0 if state["rows"] else 1


COMMANDS = {
    "screen-check": cmd_screen_check,
    "cache-check": cmd_cache_check,
    "search": cmd_search,
    "worker": cmd_worker,
    "rejudge": cmd_rejudge,
    "trial": cmd_trial,
    "best": cmd_best,
    "report": cmd_report,
    "models": cmd_models,
    "repro": cmd_repro,
    "space": cmd_space,
    "knowledge": cmd_knowledge,
    "failures": cmd_knowledge,  # its name before it listed the whole store
    "export": cmd_export,
    "dashboard": cmd_dashboard,
}


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "trainer", None):  # a Trainer's job is the model "trainer:FILE.py:FACTORY"
            from autocompile.workloads.trainer import PREFIX

            args.model = PREFIX + args.trainer
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"autocompile: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autocompile: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`autocompile best | head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
