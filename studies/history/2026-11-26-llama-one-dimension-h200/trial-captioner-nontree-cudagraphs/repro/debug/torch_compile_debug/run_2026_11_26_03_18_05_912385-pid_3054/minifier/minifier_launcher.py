
import os
os.environ['TORCH_CUDA_ARCH_LIST'] = '9.0a'
os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'] = '1'
os.environ['TORCHINDUCTOR_COMPILE_THREADS'] = '16'
os.environ['TORCHINDUCTOR_CACHE_DIR'] = '/root/autocompile-runs/trial-captioner-nontree-cudagraphs/repro/run/cache/inductor'
os.environ['TRITON_CACHE_DIR'] = '/root/autocompile-runs/trial-captioner-nontree-cudagraphs/repro/run/cache/triton'
os.environ['TORCHDYNAMO_REPRO_AFTER'] = 'aot'
os.environ['TORCHDYNAMO_REPRO_LEVEL'] = '2'
os.environ['TORCH_COMPILE_DEBUG_DIR'] = '/root/autocompile-runs/trial-captioner-nontree-cudagraphs/repro/debug'

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

torch._inductor.config.deterministic = False
torch._inductor.config.triton.cudagraphs = False
torch._inductor.config.triton.cudagraph_trees = True
torch._inductor.config.triton.store_cubin = False
torch._inductor.config.test_configs.runtime_triton_dtype_assert = False
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
# torch version: 2.11.0+cu130
# torch cuda version: 13.0
# torch git version: 70d99e998b4955e0049d13a98d77ae1b14db1f45


# CUDA Info: 
# nvcc: NVIDIA (R) Cuda compiler driver 
# Copyright (c) 2005-2025 NVIDIA Corporation 
# Built on Wed_Aug_20_01:58:59_PM_PDT_2025 
# Cuda compilation tools, release 13.0, V13.0.88 
# Build cuda_13.0.r13.0/compiler.36424714_0 

# GPU Hardware Info: 
# NVIDIA H200 : 1 

torch._higher_order_ops.triton_kernel_wrap.kernel_side_table.reset_table()

from torch.nn import *
class Repro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()



    def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, primals_13, primals_14, primals_15, primals_16, primals_17):
        var_mean = torch.ops.aten.var_mean.correction(primals_3, [2], correction = 0, keepdim = True)
        getitem = var_mean[0]
        getitem_1 = var_mean[1];  var_mean = None
        add = torch.ops.aten.add.Tensor(getitem, 1e-12);  getitem = None
        rsqrt = torch.ops.aten.rsqrt.default(add);  add = None
        sub = torch.ops.aten.sub.Tensor(primals_3, getitem_1)
        mul = torch.ops.aten.mul.Tensor(sub, rsqrt);  sub = None
        mul_1 = torch.ops.aten.mul.Tensor(mul, primals_1);  mul = None
        add_1 = torch.ops.aten.add.Tensor(mul_1, primals_2);  mul_1 = primals_2 = None
        convert_element_type = torch.ops.prims.convert_element_type.default(primals_5, torch.bfloat16);  primals_5 = None
        convert_element_type_1 = torch.ops.prims.convert_element_type.default(primals_4, torch.bfloat16);  primals_4 = None
        convert_element_type_2 = torch.ops.prims.convert_element_type.default(add_1, torch.bfloat16);  add_1 = None
        view = torch.ops.aten.view.default(convert_element_type_2, [12608, 768]);  convert_element_type_2 = None
        permute = torch.ops.aten.permute.default(convert_element_type_1, [1, 0]);  convert_element_type_1 = None
        addmm = torch.ops.aten.addmm.default(convert_element_type, view, permute);  convert_element_type = None
        view_1 = torch.ops.aten.view.default(addmm, [64, 197, 768]);  addmm = None
        view_2 = torch.ops.aten.view.default(view_1, [64, 197, -1, 64]);  view_1 = None
        permute_1 = torch.ops.aten.permute.default(view_2, [0, 2, 1, 3]);  view_2 = None
        convert_element_type_6 = torch.ops.prims.convert_element_type.default(primals_7, torch.bfloat16);  primals_7 = None
        convert_element_type_7 = torch.ops.prims.convert_element_type.default(primals_6, torch.bfloat16);  primals_6 = None
        permute_2 = torch.ops.aten.permute.default(convert_element_type_7, [1, 0]);  convert_element_type_7 = None
        addmm_1 = torch.ops.aten.addmm.default(convert_element_type_6, view, permute_2);  convert_element_type_6 = None
        view_4 = torch.ops.aten.view.default(addmm_1, [64, 197, 768]);  addmm_1 = None
        view_5 = torch.ops.aten.view.default(view_4, [64, 197, -1, 64]);  view_4 = None
        permute_3 = torch.ops.aten.permute.default(view_5, [0, 2, 1, 3]);  view_5 = None
        convert_element_type_12 = torch.ops.prims.convert_element_type.default(primals_9, torch.bfloat16);  primals_9 = None
        convert_element_type_13 = torch.ops.prims.convert_element_type.default(primals_8, torch.bfloat16);  primals_8 = None
        permute_4 = torch.ops.aten.permute.default(convert_element_type_13, [1, 0]);  convert_element_type_13 = None
        addmm_2 = torch.ops.aten.addmm.default(convert_element_type_12, view, permute_4);  convert_element_type_12 = None
        view_7 = torch.ops.aten.view.default(addmm_2, [64, 197, 768]);  addmm_2 = None
        view_8 = torch.ops.aten.view.default(view_7, [64, 197, -1, 64]);  view_7 = None
        permute_5 = torch.ops.aten.permute.default(view_8, [0, 2, 1, 3]);  view_8 = None
        _scaled_dot_product_cudnn_attention = torch.ops.aten._scaled_dot_product_cudnn_attention.default(permute_1, permute_3, permute_5, None, True, scale = 0.125)
        getitem_2 = _scaled_dot_product_cudnn_attention[0]
        getitem_3 = _scaled_dot_product_cudnn_attention[1]
        getitem_8 = _scaled_dot_product_cudnn_attention[6]
        getitem_9 = _scaled_dot_product_cudnn_attention[7];  _scaled_dot_product_cudnn_attention = None
        permute_6 = torch.ops.aten.permute.default(getitem_2, [0, 2, 1, 3])
        view_9 = torch.ops.aten.view.default(permute_6, [64, 197, -1]);  permute_6 = None
        convert_element_type_18 = torch.ops.prims.convert_element_type.default(primals_11, torch.bfloat16);  primals_11 = None
        convert_element_type_19 = torch.ops.prims.convert_element_type.default(primals_10, torch.bfloat16);  primals_10 = None
        view_10 = torch.ops.aten.view.default(view_9, [12608, 768]);  view_9 = None
        permute_7 = torch.ops.aten.permute.default(convert_element_type_19, [1, 0]);  convert_element_type_19 = None
        addmm_3 = torch.ops.aten.addmm.default(convert_element_type_18, view_10, permute_7);  convert_element_type_18 = view_10 = None
        view_11 = torch.ops.aten.view.default(addmm_3, [64, 197, 768])
        add_2 = torch.ops.aten.add.Tensor(view_11, primals_3);  view_11 = None
        var_mean_1 = torch.ops.aten.var_mean.correction(add_2, [2], correction = 0, keepdim = True)
        getitem_11 = var_mean_1[0]
        getitem_12 = var_mean_1[1];  var_mean_1 = None
        add_3 = torch.ops.aten.add.Tensor(getitem_11, 1e-12);  getitem_11 = None
        rsqrt_1 = torch.ops.aten.rsqrt.default(add_3);  add_3 = None
        sub_1 = torch.ops.aten.sub.Tensor(add_2, getitem_12)
        mul_2 = torch.ops.aten.mul.Tensor(sub_1, rsqrt_1);  sub_1 = None
        mul_3 = torch.ops.aten.mul.Tensor(mul_2, primals_12);  mul_2 = None
        add_4 = torch.ops.aten.add.Tensor(mul_3, primals_13);  mul_3 = primals_13 = None
        convert_element_type_23 = torch.ops.prims.convert_element_type.default(primals_15, torch.bfloat16);  primals_15 = None
        convert_element_type_24 = torch.ops.prims.convert_element_type.default(primals_14, torch.bfloat16);  primals_14 = None
        convert_element_type_25 = torch.ops.prims.convert_element_type.default(add_4, torch.bfloat16);  add_4 = None
        view_12 = torch.ops.aten.view.default(convert_element_type_25, [12608, 768]);  convert_element_type_25 = None
        permute_8 = torch.ops.aten.permute.default(convert_element_type_24, [1, 0]);  convert_element_type_24 = None
        addmm_4 = torch.ops.aten.addmm.default(convert_element_type_23, view_12, permute_8);  convert_element_type_23 = None
        view_13 = torch.ops.aten.view.default(addmm_4, [64, 197, 3072])
        convert_element_type_29 = torch.ops.prims.convert_element_type.default(view_13, torch.float32);  view_13 = None
        mul_4 = torch.ops.aten.mul.Tensor(convert_element_type_29, 0.5)
        mul_5 = torch.ops.aten.mul.Tensor(convert_element_type_29, 0.7071067811865476);  convert_element_type_29 = None
        erf = torch.ops.aten.erf.default(mul_5);  mul_5 = None
        add_5 = torch.ops.aten.add.Tensor(erf, 1);  erf = None
        mul_6 = torch.ops.aten.mul.Tensor(mul_4, add_5);  mul_4 = add_5 = None
        convert_element_type_30 = torch.ops.prims.convert_element_type.default(mul_6, torch.bfloat16);  mul_6 = None
        convert_element_type_31 = torch.ops.prims.convert_element_type.default(primals_17, torch.bfloat16);  primals_17 = None
        convert_element_type_32 = torch.ops.prims.convert_element_type.default(primals_16, torch.bfloat16);  primals_16 = None
        view_14 = torch.ops.aten.view.default(convert_element_type_30, [12608, 3072]);  convert_element_type_30 = None
        permute_9 = torch.ops.aten.permute.default(convert_element_type_32, [1, 0]);  convert_element_type_32 = None
        addmm_5 = torch.ops.aten.addmm.default(convert_element_type_31, view_14, permute_9);  convert_element_type_31 = None
        view_15 = torch.ops.aten.view.default(addmm_5, [64, 197, 768]);  addmm_5 = None
        add_6 = torch.ops.aten.add.Tensor(view_15, add_2);  view_15 = add_2 = None
        permute_10 = torch.ops.aten.permute.default(permute_9, [1, 0]);  permute_9 = None
        permute_14 = torch.ops.aten.permute.default(permute_8, [1, 0]);  permute_8 = None
        permute_18 = torch.ops.aten.permute.default(permute_7, [1, 0]);  permute_7 = None
        permute_24 = torch.ops.aten.permute.default(permute_4, [1, 0]);  permute_4 = None
        permute_29 = torch.ops.aten.permute.default(permute_2, [1, 0]);  permute_2 = None
        permute_34 = torch.ops.aten.permute.default(permute, [1, 0]);  permute = None
        return (add_6, primals_1, primals_3, primals_12, getitem_1, rsqrt, view, permute_1, permute_3, permute_5, getitem_2, getitem_3, getitem_8, getitem_9, addmm_3, getitem_12, rsqrt_1, view_12, addmm_4, view_14, permute_10, permute_14, permute_18, permute_24, permute_29, permute_34)

def load_args(reader):
    buf0 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf0, (768,), requires_grad=True, is_leaf=True)  # primals_1
    buf1 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf1, (768,), requires_grad=True, is_leaf=True)  # primals_2
    buf2 = reader.storage(None, 38731776, device=device(type='cuda', index=0))
    reader.tensor(buf2, (64, 197, 768), requires_grad=True)  # primals_3
    buf3 = reader.storage(None, 2359296, device=device(type='cuda', index=0))
    reader.tensor(buf3, (768, 768), requires_grad=True, is_leaf=True)  # primals_4
    buf4 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf4, (768,), requires_grad=True, is_leaf=True)  # primals_5
    buf5 = reader.storage(None, 2359296, device=device(type='cuda', index=0))
    reader.tensor(buf5, (768, 768), requires_grad=True, is_leaf=True)  # primals_6
    buf6 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf6, (768,), requires_grad=True, is_leaf=True)  # primals_7
    buf7 = reader.storage(None, 2359296, device=device(type='cuda', index=0))
    reader.tensor(buf7, (768, 768), requires_grad=True, is_leaf=True)  # primals_8
    buf8 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf8, (768,), requires_grad=True, is_leaf=True)  # primals_9
    buf9 = reader.storage(None, 2359296, device=device(type='cuda', index=0))
    reader.tensor(buf9, (768, 768), requires_grad=True, is_leaf=True)  # primals_10
    buf10 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf10, (768,), requires_grad=True, is_leaf=True)  # primals_11
    buf11 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf11, (768,), requires_grad=True, is_leaf=True)  # primals_12
    buf12 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf12, (768,), requires_grad=True, is_leaf=True)  # primals_13
    buf13 = reader.storage(None, 9437184, device=device(type='cuda', index=0))
    reader.tensor(buf13, (3072, 768), requires_grad=True, is_leaf=True)  # primals_14
    buf14 = reader.storage(None, 12288, device=device(type='cuda', index=0))
    reader.tensor(buf14, (3072,), requires_grad=True, is_leaf=True)  # primals_15
    buf15 = reader.storage(None, 9437184, device=device(type='cuda', index=0))
    reader.tensor(buf15, (768, 3072), requires_grad=True, is_leaf=True)  # primals_16
    buf16 = reader.storage(None, 3072, device=device(type='cuda', index=0))
    reader.tensor(buf16, (768,), requires_grad=True, is_leaf=True)  # primals_17
load_args._version = 0
mod = Repro()
if __name__ == '__main__':
    from torch._dynamo.repro.after_aot import run_repro
    with torch.no_grad():
        run_repro(mod, load_args, accuracy=False, command='minify', save_dir='/root/autocompile-runs/trial-captioner-nontree-cudagraphs/repro/debug/torch_compile_debug/run_2026_11_26_03_18_05_912385-pid_3054/minifier/checkpoints', tracing_mode='real', check_str=None)
        # To run it separately, do 
        # mod, args = run_repro(mod, load_args, accuracy=False, command='get_args', save_dir='/root/autocompile-runs/trial-captioner-nontree-cudagraphs/repro/debug/torch_compile_debug/run_2026_11_26_03_18_05_912385-pid_3054/minifier/checkpoints', tracing_mode='real', check_str=None)
        # mod(*args)