"""Minified repros and where numerics part: what `autocompile repro` leaves beside a failed trial.

002_86f4e0ea9600b3b4.txt's method for a compile that fails: find the failing layer (the triage
ladder, autocompile.trial.process.triage), then let torch's minifier cut the failure down to a
small self-contained `repro.py`. `make_repro` reruns the trial's configuration (a trial process of
its own, autocompile.trial.run_trial) with the minifier's environment: TORCHDYNAMO_REPRO_AFTER
"aot" when Inductor fails (the graph AOTAutograd hands it), "dynamo" when an earlier backend
layer does (the graph Dynamo captured), and TORCHDYNAMO_REPRO_LEVEL 2 for an error (the
minifier's launcher written when it is raised), 3 for a crash of the process (written before each
graph runs, as a segfault leaves no time after), 4 for accuracy. torch writes
`minifier_launcher.py` under its debug folder (TORCH_COMPILE_DEBUG_DIR, found by looking, not by
its layout); running it reduces the graph, writing a checkpoint for each smaller graph that still
fails and `repro.py` at the end. Within the time limit the minified `repro.py` is kept, else the
smallest checkpoint, else the unreduced graph; the trial's folder gets `repro/` with them, the
minifier's log and `summary.json`. With --accuracy, where the trial's record names the module whose
output or gradient first departs from eager's (`diverges_at`, autocompile.trial.divergence), the
rerun compiles that module alone on the inputs it got in an eager pass (the worker's
`accuracy_module`), so the minifier starts from its graphs, not the whole model's. A failure
raised at run time outside the graphs the minifier wraps (CUDA graphs' "accessing tensor output
of CUDAGraphs that has been overwritten by a subsequent run", inside loss.backward()) leaves no
launcher: where the rerun failed as the trial did, repro.py is then unreduced, the trial's snippet
on its workload in a plain training loop (autocompile.outputs.standalone). So is it where a failure
raised inside a compiled graph depends on what earlier steps left (Inductor's non-tree CUDA-graph
AssertionError): the launcher's graph, run alone, passes, and the minifier says so in its log
("Input graph did not fail the tester") within seconds; the launcher is kept as
minifier_launcher_does_not_fail.py, and only a minifier the limit stopped is "not reduced within
the limit". A study's trial whose folder is gone (a committed study keeps study.db only) is rerun
from a spec.json rebuilt from the study's storage (autocompile.outputs.rebuilt).
"""

from __future__ import annotations

import ast
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

from autocompile.engine.records import trial_folder
from autocompile.errors import UserError
from autocompile.outputs import rebuilt, standalone
from autocompile.trial import TrialRequest, run_trial
from autocompile.trial.process import TRIAGE_MEASURE
from autocompile.trial.result import Status

REPRO_DIR = "repro"  # in a trial's folder
SUMMARY = "summary.json"
CRASHES = (Status.FAILED, Status.COMPILE_ERROR, Status.CRASHED)
# A minifier check in a process of its own (--isolate) cost ~7 s each on 2 CPU cores, 42 of them
# for a 33-node toy graph: 4.8 min against 8 s in one process. In one process unless the trial's
# process died (a segfault would end the minifier too).
ISOLATE_WHEN = (Status.CRASHED,)
# The minifier's own words where the graph it was given does not fail when run alone (its first
# check, before cutting anything): torch/_functorch/fx_minifier.py's `minifier` (used by both
# after_aot and after_dynamo) raises the first; after_dynamo's accuracy backend logs the second
# and exits 0. A failure that depends on what earlier steps left gives such a launcher (docs/decisions.md:
# "Evidence moved out of the code").
DID_NOT_FAIL = ("Input graph did not fail the tester", "Input graph does not fail accuracy testing")
KEPT_LAUNCHER = "minifier_launcher.py"  # in repro/: the launcher the minifier ran
PASSING_LAUNCHER = "minifier_launcher_does_not_fail.py"  # in repro/: one whose graph did not fail alone


def minifier_setting(record: dict, accuracy: bool) -> tuple[str | None, int, str]:
    """(TORCHDYNAMO_REPRO_AFTER, TORCHDYNAMO_REPRO_LEVEL, why) for a failed record; after None when
    no minifier reaches the failure (Dynamo's own graph capture fails: there is no graph yet)."""
    layer = record.get("failing_layer") or ""
    level = 4 if accuracy else 3 if record.get("status") == Status.CRASHED else 2
    if accuracy and accuracy_module(record):
        return (
            "aot",
            level,
            (
                f"accuracy: {accuracy_module(record)} (where the numerics part) compiled alone, "
                "its graphs against their eager run (level 4)"
            ),
        )
    if accuracy:
        return "aot", level, "accuracy: Inductor's graphs against their eager run (level 4)"
    if layer.startswith("Dynamo"):
        return None, level, "the failure is in Dynamo's graph capture, before any backend gets a graph"
    if layer.startswith(("AOTAutograd", "decompositions")):
        return "dynamo", level, f"triage: fails in {layer}: the graph Dynamo captured"
    return (
        "aot",
        level,
        (f"triage: fails in {layer}" if layer else "no triage in the record: Inductor assumed")
        + ": the graph AOTAutograd hands Inductor",
    )


def accuracy_module(record: dict) -> str | None:
    """The module an accuracy repro compiles alone: where the numerics part (`diverges_at`), if found."""
    return (record.get("diverges_at") or {}).get("module")


def _request(folder: str, out: str, env: dict, limit_s: float, module: str | None) -> TrialRequest:
    """The failed trial's request (its spec.json), run briefly in `out` with the minifier's
    environment; with `module`, that module compiled alone (the worker's `accuracy_module`)."""
    spec = _spec(folder)
    return TrialRequest(
        model=spec["model"],
        config=spec["config"],
        device=spec["device"],
        trial_dir=out,
        batch_size=spec.get("batch_size"),
        seq_len=spec.get("seq_len"),
        seed=spec.get("seed", 0),
        timeout_s=limit_s,
        toolchain_dir=spec.get("toolchain_dir"),
        header=spec.get("header", ""),
        blocks=spec.get("blocks"),
        env=env,
        measure={**TRIAGE_MEASURE, "minifier_rerun": True, **({"accuracy_module": module} if module else {})},
    )


def graph_lines(path: str) -> int:
    """Lines of the graph in a minifier's file: the body of its `Repro.forward`."""
    with open(path) as f:
        text = f.read()
    body = text.split("def forward(", 1)[-1].split("\n\n", 1)[0]
    return sum(1 for line in body.splitlines()[1:] if line.strip())


def _launcher(debug_dir: str) -> str | None:
    found = glob.glob(os.path.join(debug_dir, "**", "minifier_launcher.py"), recursive=True)
    return max(found, key=os.path.getmtime) if found else None


def _smallest_checkpoint(debug_dir: str) -> str | None:
    """The smallest graph the minifier reached that still fails (checkpoints/<nodes>.py), passing
    over a file the time limit cut while it was written (empty, or not Python yet)."""
    found = [
        p
        for p in glob.glob(os.path.join(debug_dir, "**", "checkpoints", "*.py"), recursive=True)
        if os.path.basename(p)[:-3].isdigit()
    ]
    return next((p for p in sorted(found, key=lambda p: int(os.path.basename(p)[:-3])) if _whole(p)), None)


def _whole(path: str) -> bool:
    """Whether a minifier's file was written to the end: Python that holds a graph."""
    try:
        with open(path) as f:
            ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return False
    return graph_lines(path) > 0


def _minify(launcher: str, out: str, limit_s: float, isolate: bool) -> tuple[int | None, float]:
    """Run the launcher in its folder (it writes repro.py there), its output to minifier-log.txt;
    (its exit status, None where the limit stopped it; seconds)."""
    started = time.time()
    with open(os.path.join(out, "minifier-log.txt"), "w") as log:
        process = subprocess.Popen(
            [sys.executable, launcher, "minify", "--isolate" if isolate else "--no-isolate"],
            cwd=os.path.dirname(launcher),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        try:
            process.wait(timeout=max(1.0, limit_s))
            return process.returncode, time.time() - started
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            return None, time.time() - started


def minifier_outcome(log: str, status: int | None) -> str:
    """How a minifier run ended, from its log and exit status (None: the time limit stopped it):
    "did not fail" (its input graph passed alone: nothing to cut), "minified", "timed out", or
    "stopped" (it raised something else)."""
    if said_did_not_fail(log):
        return "did not fail"
    if status is None:
        return "timed out"
    return "minified" if status == 0 else "stopped"


def said_did_not_fail(log: str) -> str | None:
    """The minifier's words saying its input graph did not fail alone, if its log has them."""
    return next((words for words in DID_NOT_FAIL if words in log), None)


def last_error(log: str) -> str:
    """The minifier's last exception line (`Type: message`), for a line that says why it stopped."""
    found = re.findall(r"^(\w[\w.]*(?:Error|Exception)\b.*)$", log, re.MULTILINE)
    return found[-1][:200] if found else "no exception in its log"


def _runnable(text: str) -> str:
    """A launcher's text as a repro that runs the graph once (command 'run') instead of minifying it."""
    return re.sub(r"command='minify'", "command='run'", text)


def make_repro(folder: str, number: int | str, record: dict, limit_s: float = 600.0, accuracy: bool = False) -> dict:
    """A minified repro of the failure of the trial in `folder` (a study's trial `number`, or a trial
    run by hand) in its repro/, the minifier given `limit_s` (the rerun has the trial's own limit),
    or an unreduced one where the minifier cannot take the failure; returns the summary (also
    written to repro/summary.json), whose `line` says in one line what was got."""
    _check(folder, number, record, accuracy)
    after, level, why = minifier_setting(record, accuracy)
    out = os.path.join(folder, REPRO_DIR)
    summary = {
        "trial": number,
        "after": after,
        "level": level,
        "why": why,
        "limit_s": limit_s,
        "module": accuracy_module(record) if accuracy else None,
        "rebuilt_from": _spec(folder).get("rebuilt_from"),
    }
    launcher = _earlier_launcher(out, summary)
    _clear(out, keep_debug=launcher is not None)
    if after is None:
        snippet = (
            "apply_compilation.py"
            if os.path.exists(os.path.join(folder, "apply_compilation.py"))
            else "configuration (its folder is gone: spec.json was rebuilt from the study)"
        )
        return _finish(out, summary, None, f"no minifier reaches it ({why}); the trial's {snippet} with its model is the repro")
    if launcher:
        summary["rerun"] = "skipped: the minifier launcher an earlier `repro` of this trial left was minified again"
    else:
        launcher = _rerun(folder, out, summary, after, level)
    if launcher is None and accuracy:
        return _finish(
            out,
            summary,
            None,
            f"the rerun ({summary['rerun']['status']}) left no minifier launcher: "
            "no compiled graph's result departs from its eager run, so the difference is made above the "
            "backend (in what Dynamo traced; diverges_at says where)",
        )
    if launcher is None:
        return _unminified(folder, out, summary, record)
    shutil.copy(launcher, os.path.join(out, KEPT_LAUNCHER))
    summary["graph_lines_before"] = graph_lines(launcher)
    status, summary["minifier_s"] = _minify(launcher, out, limit_s, summary.get("isolate", False))
    with open(os.path.join(out, "minifier-log.txt"), errors="replace") as f:
        summary["minifier"] = outcome = minifier_outcome(f.read(), status)
    minified = os.path.join(os.path.dirname(launcher), "repro.py")
    if outcome == "minified" and os.path.exists(minified):
        return _finish(out, summary, minified, "minified")
    if outcome == "did not fail" and accuracy:
        return _finish(
            out,
            summary,
            None,
            f"the minifier's graph{' of ' + summary['module'] if summary['module'] else ''} "
            f"agreed with its eager run alone ({summary['minifier_s']:.0f} s): the difference needs the "
            "run around it",
        )
    if outcome == "did not fail":
        return _passes_alone(folder, out, summary, record)
    return _cut_short(out, summary, launcher, limit_s)


def _cut_short(out: str, summary: dict, launcher: str, limit_s: float) -> dict:
    """The minifier stopped before the end, at the limit or by an error of its own: the smallest
    failing graph it reached, else the unreduced graph, and a line that says which stop it was."""
    if summary["minifier"] == "timed out":
        stop = f"not reduced to the end within the {limit_s:g} s limit"
    else:
        with open(os.path.join(out, "minifier-log.txt"), errors="replace") as f:
            stop = f"the minifier stopped after {summary['minifier_s']:.0f} s ({last_error(f.read())})"
    checkpoint = _smallest_checkpoint(os.path.join(out, "debug"))
    if checkpoint:
        return _finish(out, summary, checkpoint, f"{stop}: the smallest failing graph it reached")
    with open(os.path.join(out, "repro.py"), "w") as f, open(launcher) as source:
        f.write(_runnable(source.read()))
    more = " (a longer --timeout minifies it further, without rerunning the trial)" if summary["minifier"] == "timed out" else ""
    return _finish(out, summary, os.path.join(out, "repro.py"), f"{stop.replace(' to the end', '')}: the unreduced graph{more}")


def _passes_alone(folder: str, out: str, summary: dict, record: dict) -> dict:
    """The minifier's launcher ran its graph alone and it did not fail (its log says so): the failure
    needs the run around the graph (state an earlier step left, as CUDA graphs' buffers), which the
    minifier cannot take. The launcher is kept under a name that says so, and repro.py is the
    unreduced training script, as for a failure that leaves no launcher."""
    os.replace(os.path.join(out, KEPT_LAUNCHER), os.path.join(out, PASSING_LAUNCHER))
    if not isinstance(summary["rerun"], dict):  # the launcher was an earlier repro's: how its rerun failed
        if not summary.get("rerun_before"):
            _rerun(folder, out, summary, summary["after"], summary["level"])
        else:
            summary["rerun"] = {**summary.pop("rerun_before"), "by": "the earlier repro that wrote the launcher"}
    with open(os.path.join(out, "minifier-log.txt"), errors="replace") as f:
        said = said_did_not_fail(f.read())
    outside = (
        f'the minifier\'s graph did not fail alone ("{said}", after {summary["minifier_s"]:.0f} s; its '
        f"launcher kept as {PASSING_LAUNCHER}; the rerun that wrote it took {summary['rerun']['wall_s']:.0f} s): "
        "the failure needs the run around the graph (what earlier steps left)"
    )
    return _unminified(folder, out, summary, record, outside)


def recurred(record: dict, rerun: dict) -> str | None:
    """How the rerun failed as the trial did (the same status, and the same reason or at least the
    same exception type), or None."""
    if rerun.get("status") != record.get("status"):
        return None
    first, again = (r.get("reason", "")[:400] for r in (record, rerun))
    if first == again:
        return "the same reason"
    kind = first.split(":", 1)[0]
    return f"the same exception type ({kind})" if kind and kind == again.split(":", 1)[0] else None


def _unminified(folder: str, out: str, summary: dict, record: dict, outside: str | None = None) -> dict:
    """No launcher from the rerun (or, with `outside`, one whose graph did not fail alone): where
    it failed as the trial did, the failure is outside what the minifier can take, and an unreduced
    repro.py (autocompile.outputs.standalone) reruns the configuration on the workload; where it
    did not fail so, no repro, and the line says which."""
    rerun = summary["rerun"]
    summary["recurred"] = same = recurred(record, rerun)
    if same is None and rerun["status"] in (Status.OK, Status.INFEASIBLE):
        return _finish(
            out,
            summary,
            None,
            f"the rerun did not fail ({rerun['status']}): the failure did not recur, "
            "so it is flaky or depends on the machine or its load",
        )
    if same is None:
        left = "a minifier launcher whose graph did not fail alone" if outside else "no minifier launcher"
        return _finish(
            out,
            summary,
            None,
            f"the rerun failed otherwise ({rerun['status']}: {rerun['reason'][:160]}), not as the trial did, and left {left}",
        )
    outside = (
        f"{outside}; the rerun failed with {same}"
        if outside
        else f"the failure happens {'at run time, ' if rerun['status'] == Status.FAILED else ''}outside what the "
        f"minifier watches (it left no launcher; the rerun failed with {same})"
    )
    spec = _spec(folder)
    if spec.get("parallel", "none") != "none":
        return _finish(
            out,
            summary,
            None,
            f"{outside}; the trial ran {spec.get('nproc')} ranks under "
            f"{spec['parallel']}: its apply_compilation.py under torchrun is the repro",
        )
    snippet = os.path.join(folder, "apply_compilation.py")
    if not os.path.exists(snippet):  # a folder rebuilt from the study (outputs/rebuilt.py): the rerun rendered it
        snippet = os.path.join(out, "run", "apply_compilation.py")
    script = standalone.write_script(folder, out, record, snippet)
    summary.update(repro=script, script_lines=standalone.script_lines(script))
    summary["how"] = f"{outside}; repro.py reruns the configuration on the workload: {summary['script_lines']} lines"
    summary["line"] = f"unreduced repro: {script}: {summary['how']}; run it with python to see the failure"
    return _write_summary(out, summary)


def _spec(folder: str) -> dict:
    with open(os.path.join(folder, "spec.json")) as f:
        return json.load(f)


def _check(folder: str, number: int, record: dict, accuracy: bool) -> None:
    """A one-line error unless the trial ran and failed the way asked about."""
    if not os.path.exists(os.path.join(folder, "spec.json")):
        raise UserError(f"trial {number} has no files in {folder}: it never ran")
    _check_failed(number, record, accuracy)


def _check_failed(number: int | str, record: dict, accuracy: bool) -> None:
    numerics = bool(record.get("numerics", {}).get("differs"))
    if accuracy and not numerics:
        raise UserError(f"trial {number} is {record.get('status')!r}, not a numerics failure: --accuracy has nothing to find")
    if record.get("status") not in CRASHES and not accuracy:
        raise UserError(
            f"trial {number} is {record.get('status')!r}, not a failed compile: nothing to reproduce"
            + (" (a numerics failure: --accuracy)" if numerics else "")
        )


def _earlier_launcher(out: str, summary: dict) -> str | None:
    """The launcher an earlier `repro` of the trial wrote with the same setting, so that a longer
    --timeout minifies further without rerunning the configuration (minutes on a large model)."""
    try:
        with open(os.path.join(out, SUMMARY)) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return None
    keys = ("after", "level", "module")
    if [earlier.get(key) for key in keys] != [summary[key] for key in keys]:
        return None
    if earlier.get("minifier") == "did not fail":  # nothing to minify further: rerun, for a fresh verdict
        return None
    summary["isolate"] = earlier.get("isolate", False)
    rerun = earlier.get("rerun") if isinstance(earlier.get("rerun"), dict) else earlier.get("rerun_before")
    if rerun:  # how the configuration failed when it wrote the launcher, for a graph that then passes alone
        summary["rerun_before"] = rerun
    return _launcher(os.path.join(out, "debug"))


def _clear(out: str, keep_debug: bool) -> None:
    """An empty repro/ (but the minifier's debug folder, where its launcher is used again)."""
    if os.path.isdir(out):
        for name in os.listdir(out):
            path = os.path.join(out, name)
            if name == "debug" and keep_debug:
                for old in glob.glob(os.path.join(path, "**", "minifier", "repro.py"), recursive=True):
                    os.remove(old)  # the earlier minifier's result: not this one's
            elif os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    os.makedirs(out, exist_ok=True)


def _rerun(folder: str, out: str, summary: dict, after: str, level: int) -> str | None:
    """The configuration once more (or the module where the numerics part, alone) with the minifier's
    environment; the launcher it wrote, or None."""
    limit_s = _spec(folder).get("timeout_s", 900.0)
    debug = os.path.abspath(os.path.join(out, "debug"))  # absolute: the rerun works in its own folder
    env = {"TORCHDYNAMO_REPRO_AFTER": after, "TORCHDYNAMO_REPRO_LEVEL": str(level), "TORCH_COMPILE_DEBUG_DIR": debug}
    rerun = run_trial(_request(folder, os.path.abspath(os.path.join(out, "run")), env, limit_s, summary["module"]))
    summary["rerun"] = {"status": rerun["status"], "reason": rerun.get("reason", "")[:400], "wall_s": rerun["wall_s"]}
    summary["isolate"] = rerun["status"] in ISOLATE_WHEN
    return _launcher(debug)


def _finish(out: str, summary: dict, repro: str | None, how: str) -> dict:
    """Copy the repro into `out`, count its graph, write summary.json; the summary with its line."""
    alone = f" of {summary['module']} alone" if summary.get("module") else ""
    if repro:
        target = os.path.join(out, "repro.py")
        if os.path.abspath(repro) != os.path.abspath(target):
            shutil.copy(repro, target)
        summary.update(repro=target, graph_lines=graph_lines(target))
        before = summary.get("graph_lines_before")
        size = f"{summary['graph_lines']} graph lines" + (f" (from {before})" if before else "")
        summary["line"] = f"repro{alone}: {target}: {how}, {size}; run it with python to see the failure"
    else:
        summary["line"] = f"no repro{alone}: {how}"
    summary["how"] = how
    return _write_summary(out, summary)


def _write_summary(out: str, summary: dict) -> dict:
    if summary.get("rebuilt_from"):
        summary["line"] += " (the trial's spec rebuilt from the study: its folder was gone)"
    with open(os.path.join(out, SUMMARY), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def summary_of(study_dir: str, number: int) -> dict | None:
    """The repro summary of trial `number`, if `autocompile repro` made one."""
    try:
        with open(os.path.join(trial_folder(study_dir, number), REPRO_DIR, SUMMARY)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def repro_trial(study, study_dir: str, number: int, limit_s: float = 600.0, accuracy: bool = False) -> dict:
    """`autocompile repro`: the repro of a study's trial `number` (the caller attaches its files to
    the trial's dashboard files: autocompile.outputs.dashboard.upload_trial_files, which reads this
    module's summaries through the table)."""
    from autocompile.engine.records import full_record

    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    if number not in trials:
        raise UserError(f"study {study.study_name!r} has no trial {number} (it has 0 to {len(trials) - 1})")
    trial, folder = trials[number], trial_folder(study_dir, number)
    record = full_record(trial, study_dir)
    if not rebuilt.has_spec(folder):  # a committed study leaves the trials' folders out: the storage has the rest
        rebuilt.check_ran(trial, record)
        _check_failed(number, record, accuracy)  # before a file is written for a trial with nothing to reproduce
        rebuilt.rebuild(study, trial, folder, record)
    return make_repro(folder, number, record, limit_s, accuracy)


def repro_folder(folder: str, limit_s: float = 600.0, accuracy: bool = False) -> dict:
    """`autocompile repro --trial-dir`: the repro of a trial run by hand (`autocompile trial --dir`),
    from the record its folder keeps (result.json)."""
    try:
        with open(os.path.join(folder, "result.json")) as f:
            record = json.load(f)
    except (OSError, ValueError):
        raise UserError(f"{folder} holds no trial record (result.json): run `autocompile trial --dir {folder}` first")
    return make_repro(folder, os.path.basename(os.path.normpath(folder)), record, limit_s, accuracy)
