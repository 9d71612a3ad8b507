# Source this on the GPU machine, in the repository root: installs the carried wheels
# (.whl, see scripts/gpu_wheels.sh) into /tmp/site and puts them and the checkout on PYTHONPATH.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
# Hosts of several GPUs: NVLink multicast stays off in every process started there.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
autocompile() { python3 -m autocompile "$@"; }
export -f autocompile
