#!/usr/bin/env bash
# Download, here, the wheels the GPU machine lacks (it has torch, triton, transformers,
# matplotlib, but no registry access): CPython 3.12, manylinux x86_64, into .whl/.
# On the GPU machine, scripts/gpu_env.sh installs them into /tmp/site.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude); mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
PY=${PYTHON:-python3}
# (optuna-dashboard is not among them: its 8 MB wheel would take the working tree past what a device call
# carries, 64 MiB, and the dashboard runs here, on a study brought back: `autocompile dashboard`)
WHEELS=(optuna==5.0.0 sqlalchemy==2.0.44 alembic==1.17.2 mako==1.3.10 colorlog==6.10.1 greenlet==3.2.4
        sqlite-utils==3.38 click-default-group==1.2.4 sqlite-fts4==1.0.3 tabulate==0.9.0)
mkdir -p .whl
for w in "${WHEELS[@]}"; do
  name=${w%%==*}
  ls .whl | grep -qi "^${name//-/_}-${w##*==}-" && continue
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d .whl "$w"
done
ls .whl
