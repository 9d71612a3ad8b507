
import os
os.environ['TORCH_CUDA_ARCH_LIST'] = '9.0a'
os.environ['TORCH_SYMM_MEM_DISABLE_MULTICAST'] = '1'
os.environ['TORCHINDUCTOR_COMPILE_THREADS'] = '16'
os.environ['TORCHINDUCTOR_CACHE_DIR'] = '/root/autocompile-runs/llama-8b/trials/0014/repro/run/cache/inductor'
os.environ['TRITON_CACHE_DIR'] = '/root/autocompile-runs/llama-8b/trials/0014/repro/run/cache/triton'
os.environ['TORCHDYNAMO_REPRO_AFTER'] = 'aot'
os.environ['TORCHDYNAMO_REPRO_LEVEL'] = '2'
os.environ['TORCH_COMPILE_DEBUG_DIR'] = '/root/autocompile-runs/llama-8b/trials/0014/repro/debug'

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

torch._inductor.config.max_autotune = False
torch._inductor.config.graph_partition = True
torch._inductor.config.max_autotune_gemm_backends = 'ATEN,TRITON,CPP'
torch._inductor.config.coordinate_descent_tuning = False
torch._inductor.config.aggressive_fusion = False
torch._inductor.config.deterministic = False
torch._inductor.config.benchmark_kernel = False
torch._inductor.config.triton.cudagraphs = False
torch._inductor.config.triton.cudagraph_trees = True
torch._inductor.config.triton.cudagraph_skip_dynamic_graphs = False
torch._inductor.config.triton.cudagraph_unexpected_rerecord_limit = 128
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



    def forward(self, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12):
        convert_element_type = torch.ops.prims.convert_element_type.default(primals_1, torch.float32)
        pow_1 = torch.ops.aten.pow.Tensor_Scalar(convert_element_type, 2)
        mean = torch.ops.aten.mean.dim(pow_1, [-1], True);  pow_1 = None
        add = torch.ops.aten.add.Tensor(mean, 1e-05);  mean = None
        rsqrt = torch.ops.aten.rsqrt.default(add);  add = None
        mul = torch.ops.aten.mul.Tensor(convert_element_type, rsqrt);  convert_element_type = None
        convert_element_type_1 = torch.ops.prims.convert_element_type.default(mul, torch.bfloat16);  mul = None
        mul_1 = torch.ops.aten.mul.Tensor(primals_2, convert_element_type_1);  convert_element_type_1 = None
        permute = torch.ops.aten.permute.default(primals_3, [1, 0])
        view = torch.ops.aten.view.default(mul_1, [1920, 4096]);  mul_1 = None
        mm = torch.ops.aten.mm.default(view, permute);  permute = None
        view_1 = torch.ops.aten.view.default(mm, [2, 960, 4096]);  mm = None
        view_2 = torch.ops.aten.view.default(view_1, [2, 960, -1, 128]);  view_1 = None
        permute_1 = torch.ops.aten.permute.default(view_2, [0, 2, 1, 3]);  view_2 = None
        permute_2 = torch.ops.aten.permute.default(primals_4, [1, 0])
        mm_1 = torch.ops.aten.mm.default(view, permute_2);  permute_2 = None
        view_4 = torch.ops.aten.view.default(mm_1, [2, 960, 1024]);  mm_1 = None
        view_5 = torch.ops.aten.view.default(view_4, [2, 960, -1, 128]);  view_4 = None
        permute_3 = torch.ops.aten.permute.default(view_5, [0, 2, 1, 3]);  view_5 = None
        permute_4 = torch.ops.aten.permute.default(primals_5, [1, 0])
        mm_2 = torch.ops.aten.mm.default(view, permute_4);  permute_4 = None
        view_7 = torch.ops.aten.view.default(mm_2, [2, 960, 1024]);  mm_2 = None
        view_8 = torch.ops.aten.view.default(view_7, [2, 960, -1, 128]);  view_7 = None
        permute_5 = torch.ops.aten.permute.default(view_8, [0, 2, 1, 3]);  view_8 = None
        unsqueeze = torch.ops.aten.unsqueeze.default(primals_6, 1)
        unsqueeze_1 = torch.ops.aten.unsqueeze.default(primals_7, 1)
        mul_2 = torch.ops.aten.mul.Tensor(permute_1, unsqueeze)
        slice_1 = torch.ops.aten.slice.Tensor(permute_1, 3, 0, 64)
        slice_2 = torch.ops.aten.slice.Tensor(permute_1, 3, 64, 9223372036854775807);  permute_1 = None
        neg = torch.ops.aten.neg.default(slice_2);  slice_2 = None
        cat = torch.ops.aten.cat.default([neg, slice_1], -1);  neg = slice_1 = None
        mul_3 = torch.ops.aten.mul.Tensor(cat, unsqueeze_1);  cat = None
        add_1 = torch.ops.aten.add.Tensor(mul_2, mul_3);  mul_2 = mul_3 = None
        mul_4 = torch.ops.aten.mul.Tensor(permute_3, unsqueeze);  unsqueeze = None
        slice_3 = torch.ops.aten.slice.Tensor(permute_3, 3, 0, 64)
        slice_4 = torch.ops.aten.slice.Tensor(permute_3, 3, 64, 9223372036854775807);  permute_3 = None
        neg_1 = torch.ops.aten.neg.default(slice_4);  slice_4 = None
        cat_1 = torch.ops.aten.cat.default([neg_1, slice_3], -1);  neg_1 = slice_3 = None
        mul_5 = torch.ops.aten.mul.Tensor(cat_1, unsqueeze_1);  cat_1 = unsqueeze_1 = None
        add_2 = torch.ops.aten.add.Tensor(mul_4, mul_5);  mul_4 = mul_5 = None
        _scaled_dot_product_cudnn_attention = torch.ops.aten._scaled_dot_product_cudnn_attention.default(add_1, add_2, permute_5, None, True, 0.0, True, scale = 0.08838834764831845)
        getitem = _scaled_dot_product_cudnn_attention[0]
        getitem_1 = _scaled_dot_product_cudnn_attention[1]
        getitem_6 = _scaled_dot_product_cudnn_attention[6]
        getitem_7 = _scaled_dot_product_cudnn_attention[7];  _scaled_dot_product_cudnn_attention = None
        permute_6 = torch.ops.aten.permute.default(getitem, [0, 2, 1, 3])
        view_9 = torch.ops.aten.view.default(permute_6, [2, 960, -1]);  permute_6 = None
        permute_7 = torch.ops.aten.permute.default(primals_8, [1, 0])
        view_10 = torch.ops.aten.view.default(view_9, [1920, 4096]);  view_9 = None
        mm_3 = torch.ops.aten.mm.default(view_10, permute_7);  view_10 = permute_7 = None
        view_11 = torch.ops.aten.view.default(mm_3, [2, 960, 4096])
        add_3 = torch.ops.aten.add.Tensor(primals_1, view_11);  view_11 = None
        convert_element_type_10 = torch.ops.prims.convert_element_type.default(add_3, torch.float32)
        pow_2 = torch.ops.aten.pow.Tensor_Scalar(convert_element_type_10, 2)
        mean_1 = torch.ops.aten.mean.dim(pow_2, [-1], True);  pow_2 = None
        add_4 = torch.ops.aten.add.Tensor(mean_1, 1e-05);  mean_1 = None
        rsqrt_1 = torch.ops.aten.rsqrt.default(add_4);  add_4 = None
        mul_6 = torch.ops.aten.mul.Tensor(convert_element_type_10, rsqrt_1);  convert_element_type_10 = None
        convert_element_type_11 = torch.ops.prims.convert_element_type.default(mul_6, torch.bfloat16);  mul_6 = None
        mul_7 = torch.ops.aten.mul.Tensor(primals_9, convert_element_type_11);  convert_element_type_11 = None
        permute_8 = torch.ops.aten.permute.default(primals_10, [1, 0])
        view_12 = torch.ops.aten.view.default(mul_7, [1920, 4096]);  mul_7 = None
        mm_4 = torch.ops.aten.mm.default(view_12, permute_8);  permute_8 = None
        view_13 = torch.ops.aten.view.default(mm_4, [2, 960, 14336])
        convert_element_type_14 = torch.ops.prims.convert_element_type.default(view_13, torch.float32);  view_13 = None
        neg_2 = torch.ops.aten.neg.default(convert_element_type_14)
        exp = torch.ops.aten.exp.default(neg_2);  neg_2 = None
        add_5 = torch.ops.aten.add.Tensor(exp, 1);  exp = None
        div = torch.ops.aten.div.Tensor(convert_element_type_14, add_5);  convert_element_type_14 = add_5 = None
        convert_element_type_15 = torch.ops.prims.convert_element_type.default(div, torch.bfloat16);  div = None
        permute_9 = torch.ops.aten.permute.default(primals_11, [1, 0])
        mm_5 = torch.ops.aten.mm.default(view_12, permute_9);  permute_9 = None
        view_15 = torch.ops.aten.view.default(mm_5, [2, 960, 14336])
        mul_8 = torch.ops.aten.mul.Tensor(convert_element_type_15, view_15);  convert_element_type_15 = view_15 = None
        permute_10 = torch.ops.aten.permute.default(primals_12, [1, 0])
        view_16 = torch.ops.aten.view.default(mul_8, [1920, 14336]);  mul_8 = None
        mm_6 = torch.ops.aten.mm.default(view_16, permute_10);  permute_10 = None
        view_17 = torch.ops.aten.view.default(mm_6, [2, 960, 4096]);  mm_6 = None
        add_6 = torch.ops.aten.add.Tensor(add_3, view_17);  add_3 = view_17 = None
        return (add_6, primals_1, primals_2, primals_3, primals_4, primals_5, primals_6, primals_7, primals_8, primals_9, primals_10, primals_11, primals_12, rsqrt, view, permute_5, add_1, add_2, getitem, getitem_1, getitem_6, getitem_7, mm_3, rsqrt_1, view_12, mm_4, mm_5, view_16)

def load_args(reader):
    buf0 = reader.storage(None, 15728640, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf0, (2, 960, 4096), dtype=torch.bfloat16, requires_grad=True)  # primals_1
    buf1 = reader.storage(None, 8192, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf1, (4096,), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_2
    buf2 = reader.storage(None, 33554432, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf2, (4096, 4096), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_3
    buf3 = reader.storage(None, 8388608, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf3, (1024, 4096), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_4
    buf4 = reader.storage(None, 8388608, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf4, (1024, 4096), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_5
    buf5 = reader.storage(None, 245760, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf5, (1, 960, 128), dtype=torch.bfloat16, is_leaf=True)  # primals_6
    buf6 = reader.storage(None, 245760, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf6, (1, 960, 128), dtype=torch.bfloat16, is_leaf=True)  # primals_7
    buf7 = reader.storage(None, 33554432, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf7, (4096, 4096), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_8
    buf8 = reader.storage(None, 8192, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf8, (4096,), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_9
    buf9 = reader.storage(None, 117440512, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf9, (14336, 4096), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_10
    buf10 = reader.storage(None, 117440512, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf10, (14336, 4096), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_11
    buf11 = reader.storage(None, 117440512, device=device(type='cuda', index=0), dtype_hint=torch.bfloat16)
    reader.tensor(buf11, (4096, 14336), dtype=torch.bfloat16, requires_grad=True, is_leaf=True)  # primals_12
load_args._version = 0
mod = Repro()
if __name__ == '__main__':
    from torch._dynamo.repro.after_aot import run_repro
    with torch.no_grad():
        run_repro(mod, load_args, accuracy=False, command='minify', save_dir='/root/autocompile-runs/llama-8b/trials/0014/repro/debug/torch_compile_debug/run_2026_11_26_03_25_25_388260-pid_9233/minifier/checkpoints', tracing_mode='real', check_str=None)
        # To run it separately, do 
        # mod, args = run_repro(mod, load_args, accuracy=False, command='get_args', save_dir='/root/autocompile-runs/llama-8b/trials/0014/repro/debug/torch_compile_debug/run_2026_11_26_03_25_25_388260-pid_9233/minifier/checkpoints', tracing_mode='real', check_str=None)
        # mod(*args)