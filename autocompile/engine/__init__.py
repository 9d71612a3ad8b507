"""How a study proceeds, with Optuna underneath: the settings of a search (`settings`), opening or
resuming its study (`study`), the order of proposals (`strategy`), one trial against the study
(`runner`), one worker's loop and several workers (`claims`, `workers`), the finalist round
(`finalists`), scores and the pruner (`scoring`), what finished trials taught across studies
(`knowledge`), screening (`screening`), storages and locks (`storage`), a trial's record as the
study holds it (`records`), what is asked of the study's trials, answered once (`studyview`), and
judging again under a newer rule (`rejudge`).

The engine never imports `autocompile.outputs`: outputs hang on its callbacks, with Optuna's
signature `callback(study, frozen_trial)`.
"""
