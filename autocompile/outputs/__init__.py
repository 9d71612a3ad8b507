"""What the user sees of a study, each output read from the study's own storage.

`results` (DIR/STUDY/results.db, an SQL table of the trials), `pareto` (the winner for another
horizon, and the front of speed against warm-up), `plots` (DIR/STUDY/report/: PNGs and
report.md), `progress` (how much a search says while it runs), `dashboard` (each trial's files in
optuna-dashboard, the winner's note), `export` (the compile cache for a warm start). The search tells them about
each finished trial through callbacks with Optuna's signature, `callback(study, frozen_trial)`.
"""
