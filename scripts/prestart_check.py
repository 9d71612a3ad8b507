"""Whether a trial forked from autocompile's forking process (autocompile.trial.prestart) can use the
GPU here, and which of its imports, if any, starts CUDA (a child forked after that cannot use the GPU).

    python3 scripts/prestart_check.py   # on the GPU machine, after `source scripts/gpu_env.sh`
"""

import os
import sys

from autocompile.trial import prestart


def bad_fork_after(name: str) -> bool:
    __import__(name)
    return not prestart.fork_safe()


if __name__ == "__main__":
    if sys.argv[1:] == ["--imports"]:  # each import in turn, without the NVML check the forking process sets
        for name in prestart.PRELOAD_GPU:
            print(f"after import {name}: {'bad fork' if bad_fork_after(name) else 'fork safe'}")
        sys.exit(0)
    env = dict(os.environ)
    prestart.start(env, modules=prestart.PRELOAD_GPU)
    server = prestart.take(env)
    print("forking process:", "ready" if server else "not used (trials start fresh processes)")
    prestart.stop_all()
    sys.exit(0 if server else 1)
