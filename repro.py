
import os
os.environ['TORCHINDUCTOR_CACHE_DIR'] = '/tmp/w31b/s/trials/0001/repro/run/cache/inductor'
os.environ['TRITON_CACHE_DIR'] = '/tmp/w31b/s/trials/0001/repro/run/cache/triton'
os.environ['TORCH_COMPILE_DEBUG_DIR'] = '/tmp/w31b/s/trials/0001/repro/debug'
os.environ['_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR'] = '140506970115104'
os.environ.pop('TORCHDYNAMO_REPRO_AFTER', None)
os.environ.pop('TORCHDYNAMO_REPRO_LEVEL', None)

import torch
from torch import tensor, device
import torch.fx as fx
from torch._dynamo.testing import rand_strided
from math import inf
import torch._inductor.inductor_prims



import torch._dynamo.config
import torch._inductor.config
import torch._functorch.config
import torch.fx.experimental._config

torch._inductor.config.fallback_random = True
torch._inductor.config.cpp.inject_relu_bug_TESTING_ONLY = 'accuracy'
torch._inductor.config.comprehensive_padding = True
torch._inductor.config.deterministic = False
torch._inductor.config.inplace_buffers = True
torch._inductor.config.triton.store_cubin = False
torch._functorch.config.functionalize_rng_ops = False
torch._functorch.config.fake_tensor_allow_unsafe_data_ptr_access = True
torch._functorch.config.unlift_effect_tokens = False
torch._functorch.config.selective_decompose = False



isolate_fails_code_str = None





if "__compile_source__" in globals():
    import inspect as __after_aot_inspect
    import linecache as __after_aot_linecache
    __after_aot_filename = __after_aot_inspect.currentframe().f_code.co_filename
    __after_aot_linecache.cache[__after_aot_filename] = (
        len(__compile_source__),
        None,
        __compile_source__.splitlines(True),
        __after_aot_filename,
    )
# torch version: 2.13.0+cpu
# torch cuda version: None
# torch git version: cf30153c4c131c8164ee7798e5022d810682e2cb


# torch.cuda.is_available()==False, no GPU info collected
torch._higher_order_ops.triton_kernel_wrap.kernel_side_table.reset_table()

from torch.nn import *
class Repro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()



    def forward(self, primals_1, primals_2, primals_3):
        permute = torch.ops.aten.permute.default(primals_1, [1, 0])
        addmm = torch.ops.aten.addmm.default(primals_2, primals_3, permute);  primals_2 = permute = None
        relu = torch.ops.aten.relu.default(addmm);  addmm = None
        le = torch.ops.aten.le.Scalar(relu, 0)
        return (relu, primals_1, primals_3, le)

def load_args(reader):
    buf0 = reader.storage('086d2719da2e3c32312dfd2e327807666fe38f01', 4096)
    reader.tensor(buf0, (32, 32), requires_grad=True, is_leaf=True)  # primals_1
    buf1 = reader.storage('bb1aa9d00ac27796b0cd12a2525447689a223f14', 128)
    reader.tensor(buf1, (32,), requires_grad=True, is_leaf=True)  # primals_2
    buf2 = reader.storage('03c1e9371eb79c1172e6deee53eadd9211507c5c', 2048)
    reader.tensor(buf2, (16, 32), requires_grad=True, is_leaf=True)  # primals_3
load_args._version = 0
mod = Repro()
if __name__ == '__main__':
    from torch._dynamo.repro.after_aot import run_repro
    with torch.no_grad():
        run_repro(mod, load_args, accuracy=True, command='run', save_dir='/tmp/w31b/s/trials/0001/repro/debug/torch_compile_debug/run_2026_11_25_19_27_00_337906-pid_31533/minifier/checkpoints', tracing_mode='real', check_str=None)
        # To run it separately, do 
        # mod, args = run_repro(mod, load_args, accuracy=True, command='get_args', save_dir='/tmp/w31b/s/trials/0001/repro/debug/torch_compile_debug/run_2026_11_25_19_27_00_337906-pid_31533/minifier/checkpoints', tracing_mode='real', check_str=None)
        # mod(*args)