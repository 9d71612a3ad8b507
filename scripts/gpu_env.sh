# Source this on the GPU machine, in the repository root: installs the carried wheels
# (.whl, see scripts/gpu_wheels.sh) into /tmp/site and puts them and the checkout on PYTHONPATH.
# Installed once per machine: a later call's install would replace the files under a study that
# runs in the background (an export started beside one failed importing sqlalchemy, 2026-11-25).
wanted=$(cd .whl && ls *.whl | sort | md5sum)
if [ "$(cat /tmp/site/.wheels 2>/dev/null)" != "$wanted" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
  echo "$wanted" > /tmp/site/.wheels
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
# Hosts of several GPUs: NVLink multicast stays off in every process started there.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
autocompile() { python3 -m autocompile "$@"; }
export -f autocompile
