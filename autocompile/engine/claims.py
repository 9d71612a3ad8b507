"""One worker's loop over a shared study: claim the next trial under the study's lock, run it, until the budget is spent.

The next trial is chosen as a single search chooses it (the baselines, the recipes, neighbours of the
incumbent alternating with TPE's proposals), but from what the whole study holds: a configuration
another worker measured, queued or is running is not started again. No GPU waits for eager: the other
workers start the recipes beside it, and a trial that ends first waits for eager's record, the reference
its judge needs (`Runner.finish`). The claim records role, config and worker at once, under
`autocompile.engine.storage.claim_lock`.

Under --timeout the workers share one end: the finalist round's start, the deadline less the round's
reserve (on every GPU of the search: `finalist_reserve`). A worker starts a trial only where it is
expected to fit before then; where the next one is not, a neighbour expected to fit goes next
(`_fit_instead`), and where none is, the worker stops. Where another worker's trial is expected to
end later (the round waits for it), that end is this worker's too (`kept_for_round`). The round starts
when the last worker stops.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import optuna

from autocompile.errors import UserError
from autocompile.engine.contained import contained
from autocompile.engine.cost import (
    BASELINE_SHARE,
    MIN_TRIAL_S,
    baseline_limit_s,
    expected_trial_s,
    first_run_s,
    neighbour_s,
)
from autocompile.engine.screening import screen_trial
from autocompile.engine.scoring import _judged_by_an_older_guard
from autocompile.engine.storage import claim_lock, counted, fail_stale, this_worker
from autocompile.engine.strategy import WHOLE_SCOPES, neighbour_cost, neighbours_turn, next_neighbour
from autocompile.engine.finalists import finalist_reserve
from autocompile.engine.gates import Outcome, View, plain_not_started, ran_its_course, too_little_left, why_not
from autocompile.engine.records import BASELINES, Record, Role, refused_before_launch, set_attrs
from autocompile.engine.runner import Runner, ask, new_trial, waiting
from autocompile.engine.studyview import StudyView, view_of
from autocompile.space import DEFAULTS, EAGER
from autocompile.trial.result import Status

BASELINE_CONFIGS = ((Role.EAGER, EAGER), (Role.COMPILE_DEFAULTS, DEFAULTS))
BASELINES_BY_ROLE = dict(BASELINE_CONFIGS)

MAX_DUPLICATES = 5  # proposals in a row already claimed elsewhere: the sampler has nothing new to offer


@dataclass
class LoopState:
    """What one worker's loop carries from one trial to the next."""

    recipes_queued: bool = False  # the recipes are queued (once the baselines were claimed)
    proposals: int = 0  # the sampler's and the neighbours' proposals claimed (strategy.neighbours_turn)
    duplicates: int = 0  # proposals in a row already claimed elsewhere (MAX_DUPLICATES ends the search)
    # near --timeout, a neighbour fits what is left (these seconds) where a typical trial or the next
    # proposal does not: it is proposed next (set by _out_of_time and _fit_instead, taken by _queue_proposals)
    neighbour_within: float | None = None
    fitted: bool = False  # this turn's proposal was chosen to fit: refused as not fitting, the worker stops
    claimed: object = None  # this turn's trial, claimed and not yet told: Ctrl-C fails it
    said_spent: bool = False  # the line that --trials is spent with time left was printed
    said_timeout: bool = False  # the line that --timeout ends the trials was printed (`_say_timeout`)
    reserve: float = 0.0  # what of --timeout this turn keeps for the finalist round (kept_for_round)

    def neighbour_goes_next(self, within_s: float) -> bool:
        """Make the next proposal a neighbour expected within `within_s`; whether it was not so already
        (then the search says so)."""
        already, self.neighbour_within = self.neighbour_within is not None, within_s
        return not already

    def neighbours_turn_now(self) -> float | None:
        """The seconds the next proposal, a neighbour, is to fit (`neighbour_goes_next`), or None; taken once."""
        within, self.neighbour_within = self.neighbour_within, None
        return within


def work(runner: Runner, budget: dict, study_wide: bool = False) -> None:
    """Claim and run trials until the study's budget is spent, or --timeout (less the finalist round's
    reserve). With `study_wide`, the progress counts the study's trials (a worker), not this process's.
    Ctrl-C once a trial is claimed (running in the study) fails it as interrupted, wherever it comes:
    none is left running (a 2-worker test on a loaded machine caught one between claim and launch)."""
    loop = LoopState()
    while True:
        loop.claimed = None
        try:
            if not _next_trial(runner, budget, study_wide, loop):
                said_unexplored(runner)
                return
        except KeyboardInterrupt:
            if loop.claimed is not None:
                runner.abandon(loop.claimed)
            raise


def _next_trial(runner: Runner, budget: dict, study_wide: bool, loop: LoopState) -> bool:
    """One turn: claim the next trial (`loop.claimed`), gate it and run it (the runner judges it and tells
    the study, whose observers learn from it); False when the search's trials are done."""
    reserve = loop.reserve = kept_for_round(runner, budget, study_wide)
    if _out_of_time(runner, reserve, loop) or _budget_spent(runner, budget, reserve, loop):
        return _plain_compile_now(runner, reserve, study_wide)  # where it runs last; then on to the round
    claim = _claim_next(runner, budget, loop)
    if claim is None:  # refused before launch, a duplicate, or none left to claim
        return not _budget_spent(runner, budget, reserve, loop) and not _proposals_exhausted(runner, loop)
    return _run_claimed(runner, *claim, study_wide, loop)


def _claim_next(runner: Runner, budget: dict, loop: LoopState):
    """Under the study's lock, the stale trials failed: the next trial claimed (`_claim`), within the budget."""
    study = runner.study
    with claim_lock(runner.storage, runner.url, runner.settings.study):
        fail_stale(study)
        claim = None if counted(study) >= budget["trials"] else _claim(runner, loop)
        if isinstance(claim, tuple):
            loop.claimed = claim[0]
    return claim


def _proposals_exhausted(runner: Runner, loop: LoopState) -> bool:
    """Whether the sampler proposed MAX_DUPLICATES configurations already claimed in a row (said)."""
    if loop.duplicates < MAX_DUPLICATES:
        return False
    runner.progress.line(f"the sampler proposed {MAX_DUPLICATES} configurations already claimed in a row: stopping")
    return True


def _run_claimed(runner: Runner, trial, config: dict, role: Role, study_wide: bool, loop: LoopState) -> bool:
    """A claimed trial gated at its start (it fits before the finalist round; its screen) and run; False
    where it does not fit and no neighbour does (`_fit_instead`)."""
    study, settings, reserve = runner.study, runner.settings, loop.reserve
    if study_wide:
        runner.progress.done = counted(study) - 1  # this trial's place in the study's budget
    baseline = role in BASELINES
    if not baseline and runner.out_of_time(trial, config, reserve):
        return _fit_instead(runner, reserve, loop)  # a neighbour that fits next, or on to the finalist round
    loop.fitted = False
    if study_wide:
        expect_end(runner, trial, config, reserve)
    if settings.screen and not baseline and not screen_trial(runner, trial, config, role, settings.screen, reserve):
        return True  # pruned at its screen
    limit = _baseline_limit(runner, role, reserve) if baseline else None
    record = runner.run(trial, config, role, prunable=not baseline, limit_s=limit, keep_s=reserve)
    if baseline and record["status"] == Status.TIMEOUT and limit < settings.baseline_limit_s:
        runner.cut_baselines.add(role)  # not again in this search; a resumed one with more time measures it
    return True


def kept_for_round(runner: Runner, budget: dict, study_wide: bool = False) -> float:
    """What of --timeout this worker keeps for the finalist round: the round's reserve (on the budget's
    GPUs, `finalist_reserve`), or less where another worker runs a trial expected to end later than the
    reserve allows (its `expected_end`): the round waits for that trial, and this worker's GPU need not
    idle meanwhile (its next trial is chosen to fit, and cut, by then). Nothing without --timeout."""
    remaining, settings = runner.remaining(), runner.settings
    if remaining is None:
        return 0.0
    reserve = finalist_reserve(runner.study, settings.finalists, settings.trial_timeout_s, budget.get("gpus", 1))
    if not study_wide:
        return reserve
    running = runner.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    last = max((Record.of(t).attrs.get("expected_end", 0.0) for t in running), default=0.0) - time.time()
    return min(reserve, max(remaining - last, 0.0))


def expect_end(runner: Runner, trial, config: dict, keep: float, limit_s: float | None = None) -> None:
    """When `trial` is expected to end (its user attr `expected_end`, epoch s), for the other workers'
    `kept_for_round`: after what its twins took or a typical trial takes (`cost.first_run_s`), and no
    later than its limit (`limit_s`) and what is left before the round (`keep` kept)."""
    remaining = runner.remaining()
    if remaining is None:
        return
    expected = min(first_run_s(runner.study, config), limit_s or runner.settings.trial_timeout_s, remaining - keep)
    trial.set_user_attr("expected_end", time.time() + max(expected, 0.0))


def _baseline_limit(runner: Runner, role: Role, reserve: float) -> float:
    """A baseline's time limit: --baseline-timeout; for plain torch.compile under --timeout, no more
    than BASELINE_SHARE of what is left before the finalist round (cost.baseline_limit_s), said."""
    settings, remaining = runner.settings, runner.remaining()
    limit = settings.baseline_limit_s
    if role != Role.COMPILE_DEFAULTS or remaining is None:
        return limit
    left = max(remaining - reserve, 0.0)
    bounded = baseline_limit_s(limit, settings.trial_timeout_s, left)
    if bounded is None:
        return limit
    bounded = min(bounded, left)  # no more than is left (after the recipes and a neighbour it waited for)
    share = (
        f"at most {BASELINE_SHARE:.0%} of"
        if bounded <= BASELINE_SHARE * left + 0.5
        else "a trial's limit, within"
        if bounded < left
        else "all of"
    )
    runner.progress.line(
        f"plain torch.compile gets {bounded:.0f} s of the {limit:.0f} s --baseline-timeout: {share} "
        f"the {left:.0f} s left before the finalist round"
    )
    return bounded


def _budget_spent(runner: Runner, budget: dict, reserve: float, loop: LoopState) -> bool:
    """Whether the study counts its --trials; where --timeout still leaves time before the finalist
    round, the line says so and what the refused proposals took of the budget (they count, at no cost)."""
    study = runner.study
    if counted(study) < budget["trials"]:
        return False
    remaining = runner.remaining()
    if remaining is not None and too_little_left(remaining - reserve) is None and not loop.said_spent:
        loop.said_spent = True
        refused = sum(refused_before_launch(Record.of(t)) for t in study.get_trials(deepcopy=False))
        runner.progress.line(
            f"--trials {budget['trials']} counted ({refused} of them refused before launch at no cost) with"
            f" {remaining - reserve:.0f} s of --timeout left before the finalist round: a larger --trials would use them"
        )
    return True


def _out_of_time(runner: Runner, reserve: float, loop: LoopState) -> bool:
    """Whether the next trial is not expected to fit what is left of --timeout, less the finalist
    round's reserve. A typical trial (expected_trial_s) is the bound, unless a neighbour is expected to
    fit (neighbour_cost): then it goes next, before TPE's turn."""
    remaining = runner.remaining()
    if remaining is None:
        return False
    left = remaining - reserve
    # a baseline owed: at the least a trial's MIN_TRIAL_S
    why = too_little_left(left) if _owed_baselines(runner) else too_little_left(left, expected_trial_s(runner.study))
    if why is None or loop.neighbour_within is not None:  # a neighbour that fits was already chosen to go next
        return False
    cost = _fitting_neighbour_s(runner, left) if loop.recipes_queued else None
    if cost is not None:
        if loop.neighbour_goes_next(left):
            runner.progress.line(
                f"{max(left, 0):.0f} s left before the finalist round: {why}, a neighbour about {cost:.0f} s; it goes next"
            )
        return False
    _say_timeout(runner, remaining, reserve, why, loop)
    return True


def _say_timeout(runner: Runner, remaining: float, reserve: float, why: str, loop: LoopState) -> None:
    """The line that says --timeout ends the search's trials: what is left, kept for the round, and why;
    once (plain torch.compile, not started, sends the loop round again)."""
    if loop.said_timeout:
        return
    loop.said_timeout = True
    left = max(remaining, 0)
    kept = "of it kept" if reserve <= left else "kept"  # a round may be promised more than is left
    runner.progress.line(
        f"search timeout of {runner.settings.timeout_s or 0:.0f} s reached: {left:.0f} s left, "
        f"{reserve:.0f} s {kept} for the finalist round, and {why}"
    )


def _fit_instead(runner: Runner, reserve: float, loop: LoopState) -> bool:
    """After a proposal refused as not fitting before the finalist round: a neighbour expected to fit
    what is left goes next, so that this GPU does not idle while the others finish (True); False where
    none is, or where the refused one had been chosen to fit (this worker is done)."""
    remaining = runner.remaining() or 0.0
    left = remaining - reserve
    cost = None if loop.fitted or not loop.recipes_queued else _fitting_neighbour_s(runner, left)
    if cost is None:
        _say_timeout(runner, remaining, reserve, "neither the proposal refused nor a neighbour is expected to fit", loop)
        return False
    loop.neighbour_goes_next(left)
    runner.progress.line(f"{max(left, 0):.0f} s left before the finalist round: a neighbour of about {cost:.0f} s goes next")
    return True


def _fitting_neighbour_s(runner: Runner, within_s: float) -> float | None:
    """What the next neighbour expected to end within `within_s` is expected to take, or None (no such one)."""
    view = runner.view(before_round_s=within_s)
    return neighbour_cost(runner.space, runner.study, view.predictor(), runner.tried, _fits(view, within_s), runner.known_gains())


def _fits(view: View, within_s: float):
    """Whether a neighbour (next_neighbour's dict) is expected to end within `within_s`: its cost known
    (cost.neighbour_s) and within it, and no gate that refuses what does not fit says otherwise (`view`:
    the gates' view of the search with `within_s` left before the finalist round)."""
    predictor, startable = view.predictor(), _startable(view)

    def fits(neighbour: dict) -> bool:
        need = neighbour_s(view.study, predictor, neighbour)
        return need is not None and need <= within_s and startable(neighbour)

    return fits


def _startable(view: View):
    """Whether a neighbour would be started with what `view` has left before the finalist round: no gate refuses
    it as not fitting (`Runner.out_of_time`'s question). A turn asks it before proposing, so that a neighbour
    refused as not fitting is not proposed again each turn (llama-8b-fresh-14's trials 17, 19 and 21)."""
    return lambda neighbour: why_not(neighbour["config"], view, Outcome.NOT_STARTED) is None


def baselines_to_run(finished: list, limit_s: float) -> list[tuple[Role, dict]]:
    """The baselines (role, config) a search still owes its study: those never measured, and
    one that timed out under a shorter limit than `limit_s` (it is measured again)."""
    complete = [Record.of(t) for t in finished if t.state == optuna.trial.TrialState.COMPLETE]
    done = {r.role for r in complete if ran_its_course(r, limit_s) and not _judged_by_an_older_guard(r)}
    return [(role, config) for role, config in BASELINE_CONFIGS if role not in done]


def _owed_baselines(runner: Runner, deferred: bool = True, view: StudyView | None = None) -> list[tuple[Role, dict]]:
    """The baselines still owed, less those another worker is running and those this search cut by its budget,
    and plain torch.compile where it runs last (`plain_compile_last`) or waits for the recipes and a first
    proposal (`plain_compile_waits`), unless `deferred` is False."""
    view = view_of(runner.study, view)
    running = {view.records[t.number].role for t in view.running}
    owed = baselines_to_run(view.finished, runner.settings.baseline_limit_s)
    last = deferred and (plain_compile_last(runner) or (plain_compile_waits(runner) and not _explored(view)))
    return [
        (role, config)
        for role, config in owed
        if role not in running and role not in runner.cut_baselines and not (last and role == Role.COMPILE_DEFAULTS)
    ]


# A model of this many repeated blocks or more compiles whole for many minutes (its whole-model compile
# grows with its blocks): under --timeout the search explores first, and plain torch.compile runs last.
MANY_BLOCKS = 8


def _plain_seen(runner: Runner) -> dict | None:
    """Plain torch.compile's whole-model compile on this model here before (the knowledge store's `plain`)."""
    return runner.plain.expected() if runner.plain is not None else None


def _blocks(runner: Runner) -> int:
    """The model's repeated blocks (0 without a space)."""
    return runner.space.traits.blocks if runner.space is not None else 0


def plain_compile_last(runner: Runner) -> str | None:
    """Why plain torch.compile runs last under --timeout, with what is left before the finalist round, or
    None (it runs right after eager): its whole-model compile was cut, or warmed up beyond its limit, on this
    model here before (the knowledge store's `plain`), or the model has MANY_BLOCKS repeated blocks or more.
    Decided once per study (its `plain_compile_last`), so that every worker and a resumed search agree."""
    study, settings = runner.study, runner.settings
    if "plain_compile_last" in study.user_attrs:
        return study.user_attrs["plain_compile_last"]
    why = None
    if settings.timeout_s:
        seen, blocks = _plain_seen(runner), _blocks(runner)
        if seen and (seen["cut"] or seen["seconds"] >= settings.baseline_limit_s):
            how = "was cut while compiling after" if seen["cut"] else "warmed up in"
            why = (
                f"its whole-model compile {how} {seen['seconds']:.0f} s on this model here ({seen['from']}), "
                f"against its {settings.baseline_limit_s:.0f} s limit"
            )
        elif not seen and blocks >= MANY_BLOCKS:
            why = f"its whole-model compile grows with the model's {blocks} repeated blocks"
    study.set_user_attr("plain_compile_last", why)
    if why:
        runner.progress.line(f"plain torch.compile runs last, with what is left before the finalist round: {why}")
    return why


def plain_compile_waits(runner: Runner) -> str | None:
    """Why plain torch.compile waits for the recipes and a first proposal (a neighbour) in a short search,
    or None (it runs right after eager): under --timeout, run first at its limit it would leave less than
    what eager, the recipes, a neighbour and the finalist round's rerun take at the least (MIN_TRIAL_S each).
    It then runs after them, with what is left, at most its limit. Decided once per study (its
    `plain_compile_waits`), so that every worker and a resumed search agree."""
    study, settings, remaining = runner.study, runner.settings, runner.remaining()
    if "plain_compile_waits" in study.user_attrs:
        return study.user_attrs["plain_compile_waits"]
    why = None
    if remaining is not None and runner.space is not None:
        limit = baseline_limit_s(settings.baseline_limit_s, settings.trial_timeout_s, remaining)
        limit = min(limit or settings.baseline_limit_s, remaining)
        recipes = len(runner.space.starting_points())
        need = (2 + recipes + (settings.finalists > 0)) * MIN_TRIAL_S
        if remaining - limit < need:
            why = (
                f"run first, its {limit:.0f} s limit would leave {remaining - limit:.0f} s of the {remaining:.0f} s "
                f"of --timeout, where eager, {recipes} recipe{'s' if recipes != 1 else ''}, a neighbour and the "
                f"finalist round's rerun take {need:.0f} s at the least ({MIN_TRIAL_S:.0f} s each)"
            )
    study.set_user_attr("plain_compile_waits", why)
    if why:
        runner.progress.line(f"plain torch.compile runs after the recipes and a neighbour: {why}")
    return why


def _explored(view: StudyView) -> bool:
    """Whether a proposal after the recipes (a neighbour, or TPE's) has run: what plain torch.compile waits
    for in a short search (`plain_compile_waits`); one refused before launch did not run."""
    finished = (view.records[t.number] for t in view.finished)
    return any(r.role in (Role.NEIGHBOUR, Role.SEARCH) and (r.wall_s or 0.0) > 0.0 for r in finished)


def said_unexplored(runner: Runner) -> str | None:
    """Under --timeout, the line said where the search's trials end with no recipe or no neighbour
    measured (a result with a speed), what became of each, or None."""
    if runner.deadline is None:
        return None
    view = runner.look()
    finished = [view.records[t.number] for t in view.finished]
    missing = []
    for role in (Role.RECIPE, Role.NEIGHBOUR):
        ran = [r for r in finished if r.role == role]
        if not any(r.status == Status.OK for r in ran):
            how = ", ".join(f"trial {r.number} {'failed' if r.status is None else r.status}" for r in ran) or "none started"
            missing.append(f"no {role.value} measured ({how})")
    if not missing:
        return None
    line = f"the search's trials end with {' and '.join(missing)}"
    runner.progress.line(line)
    return line


def _plain_compile_now(runner: Runner, reserve: float, study_wide: bool = False) -> bool:
    """At the end of the exploration: plain torch.compile where it was left to run last, with what is left
    (its limit that, at most its own), or recorded as not run where too little is left for what it is
    expected to take. Whether it ran or was recorded (the search then goes on to the finalist round)."""
    config = dict(BASELINES_BY_ROLE[Role.COMPILE_DEFAULTS])
    with claim_lock(runner.storage, runner.url, runner.settings.study):
        if not (plain_compile_last(runner) or plain_compile_waits(runner)) or not any(
            role == Role.COMPILE_DEFAULTS for role, _ in _owed_baselines(runner, deferred=False)
        ):
            return False
        trial = new_trial(runner.study)
        # claimed: no other worker starts it
        set_attrs(trial, {"role": Role.COMPILE_DEFAULTS, "config": config, "worker": this_worker()})
    left = max((runner.remaining() or 0.0) - reserve, 0.0)
    blocks_trial_s = expected_trial_s(runner.study) if _blocks(runner) >= MANY_BLOCKS else None
    refusal = plain_not_started(left, _plain_seen(runner), blocks_trial_s)
    if refusal is not None:
        runner.refuse(trial, config, Role.COMPILE_DEFAULTS, refusal)
        runner.cut_baselines.add(Role.COMPILE_DEFAULTS)
        return True
    limit = min(runner.settings.baseline_limit_s, left)
    runner.progress.line(f"plain torch.compile, last: {limit:.0f} s of the {left:.0f} s left before the finalist round")
    if study_wide:
        expect_end(runner, trial, config, reserve, limit)
    record = runner.run(trial, config, Role.COMPILE_DEFAULTS, prunable=False, limit_s=limit, keep_s=reserve)
    if record["status"] == Status.TIMEOUT:
        runner.cut_baselines.add(Role.COMPILE_DEFAULTS)
    return True


def _claim(runner: Runner, loop: LoopState):
    """Under the study's lock: choose the next trial and claim it (role, config and worker recorded
    at once, so no other worker starts the same). Returns (trial, config, role); None when it was
    refused before launch or is a duplicate."""
    study, view = runner.study, runner.look()
    pending = _owed_baselines(runner, view=view)
    _queue_proposals(runner, loop, pending)
    trial = ask(study)
    try:
        return _attribute(runner, trial, pending, loop)
    except KeyboardInterrupt:  # Ctrl-C between ask and launch: nothing ran
        set_attrs(trial, {"status": Status.INTERRUPTED, "reason": "interrupted"})
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise


def _queue_proposals(runner: Runner, loop: LoopState, pending: list) -> None:
    """The recipes once the baselines are claimed (those not tried yet), then a neighbour of the
    incumbent every other proposal, alternating with TPE's, and in a row while TPE's proposals have
    taken more time than the neighbours (strategy.neighbours_turn)."""
    study, space = runner.study, runner.space
    if not pending and not loop.recipes_queued:
        # After the baselines (study.ask would hand a queued recipe to a baseline); a
        # recipe already tried in this study is not queued again.
        whole, whole_last = 0, plain_compile_last(runner)  # the whole model's compile runs last: so do its recipes
        for params in space.starting_points():
            config = space.suggest(optuna.trial.FixedTrial(params))
            if whole_last and config.get("scope") in WHOLE_SCOPES:
                whole += 1
                continue
            if why_not(config, runner.view(params=params), Outcome.DUPLICATE) is None:
                study.enqueue_trial(params, user_attrs={"role": Role.RECIPE.value, "config": config})
        loop.recipes_queued = True
        if whole:
            runner.progress.line(
                f"the {whole} recipe{'s' if whole != 1 else ''} that compile the whole model left out, for the same reason "
                "as plain torch.compile runs last; the neighbours still move the scope"
            )
    proposing = loop.recipes_queued and not pending  # a baseline owed (plain torch.compile that waited) goes first
    within = loop.neighbours_turn_now() if proposing else None
    if proposing and (within is not None or neighbours_turn(study, loop.proposals)) and not waiting(study):
        if within is not None:
            fits = _fits(runner.view(before_round_s=within), within)
        else:  # under --timeout, the moves that would be started with what is left before the round
            remaining = runner.remaining()
            fits = None if remaining is None else _startable(runner.view(before_round_s=remaining - loop.reserve))
        # alternating with TPE's proposals; what paid on this model before first; the cheaper of equally promising
        # moves first. Where choosing fails, TPE's proposal takes the turn (engine.contained).
        choose = lambda: next_neighbour(space, study, runner.tried, runner.predictor().predict, fits, runner.known_gains())  # noqa: E731
        neighbour = contained("choosing the next neighbour", study, None, choose)
        loop.fitted = within is not None and neighbour is not None
        if neighbour:
            study.enqueue_trial(
                neighbour["params"],
                user_attrs={"role": Role.NEIGHBOUR.value, **{k: neighbour[k] for k in ("parent", "parent_params", "changed")}},
            )


def _attribute(runner: Runner, trial, pending: list, loop: LoopState):
    """Give the asked trial its role and config, and record them with this worker; refuse it (None)
    where a gate does (engine/gates.py): a duplicate, one that cannot work here or cannot win."""
    space = runner.space
    if hasattr(runner.storage, "record_heartbeat"):
        runner.storage.record_heartbeat(trial._trial_id)  # stale from now on if this worker dies
    role, config = _role_and_config(runner, trial, pending, loop)
    if "matmul_precision" in space.fixed or "recompile_limit" in space.fixed:
        config.update({k: v for k, v in space.fixed.items() if k in ("matmul_precision", "recompile_limit")})
    baseline = role in BASELINES
    refusal = (
        None
        if baseline
        else why_not(
            config, runner.view(params=trial.params, exclude=trial.number), Outcome.DUPLICATE, Outcome.INFEASIBLE, Outcome.PRUNED
        )
    )
    if refusal and refusal.outcome is Outcome.DUPLICATE:  # TPE ignores it, the budget does not count it
        runner.refuse(trial, config, role, refusal)
        loop.duplicates += 1
        return None
    loop.duplicates = 0
    set_attrs(trial, {"role": role, "config": config, "worker": this_worker()})
    if refusal:
        runner.refuse(trial, config, role, refusal)
        return None
    return trial, config, role


def _role_and_config(runner: Runner, trial, pending: list, loop: LoopState) -> tuple[Role, dict]:
    """A retried trial (its worker died) keeps its role and config; else the next baseline owed, or the sampler's proposal."""
    record = Record.of(trial)
    if "failed_trial" in runner.storage.get_trial_system_attrs(trial._trial_id) and record.config is not None:
        return record.role or Role.SEARCH, dict(record.config)
    if pending:
        role, config = pending[0]
        return role, json.loads(json.dumps(config))
    try:
        config = runner.space.suggest(trial)
    except UserError:  # e.g. a space that differs from the study's: nothing ran
        runner.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    role = record.role or Role.SEARCH
    loop.proposals += role in (Role.SEARCH, Role.NEIGHBOUR)
    return role, config
