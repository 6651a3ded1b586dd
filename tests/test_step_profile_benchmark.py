"""benchmarks/step_profile.py's split of GPU time by kernel family (the profile itself needs a GPU)."""

import pytest

from benchmarks.step_profile import kernel_family, launches


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("triton_poi_fused_add_addcmul_convolution_leaky_relu_max_pool2d_permute_3", "triton pointwise"),
        ("triton_red_fused_add_div_expand_mul_slice_sub_sum_unbind_view_176", "triton reduction"),
        ("triton_per_fused__softmax_sum_12", "triton reduction"),
        ("void fft2d_r2c_16x16<float>(float2*, float const*, int, int, int, int, int, int, int)", "conv/gemm"),
        ("void flip_filter<float, float>(float*, float const*, int, int, int, int)", "conv/gemm"),
        ("void cudnn::engines_precompiled::convertTensor_kernel<float, float, float>", "layout"),
        ("void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688fprop_optimized_tf32_128x128_16x4_nhwc>", "conv/gemm"),
        ("sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x64x32", "conv/gemm"),
        ("void at::native::(anonymous namespace)::conv_depthwise2d_grad_weight_kernel<float>", "conv/gemm"),
        ("void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true>", "layout"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::WelfordOps>>", "reduction"),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "other"),
        ("void at::native::(anonymous namespace)::max_pool_backward_nchw<float, float, int>", "other"),
    ],
)
def test_kernels_fall_into_their_family(name, family):
    assert kernel_family(name) == family


def test_launches_lists_the_costliest_kernels_a_step_with_their_grids():
    def kernel(name, dur, grid, occupancy):
        args = {"grid": grid, "block": [512, 1, 1], "est. achieved occupancy %": occupancy}
        return {"cat": "kernel", "name": name, "dur": dur, "args": args}

    trace = {
        "traceEvents": [
            kernel("cutlass_fprop_128x128", 32.0, [5, 1, 1], 0),
            kernel("cutlass_fprop_128x128", 30.0, [5, 1, 1], 0),
            kernel("triton_red_fused_var_mean_0", 88.0, [512, 1, 1], 50),
            kernel("triton_poi_fused_add_1", 3.0, [64, 1, 1], 100),
            {"cat": "cpu_op", "name": "aten::conv2d", "dur": 1000.0},  # not a kernel: left out
        ]
    }
    lines = launches(trace, steps=2, rows=2).splitlines()
    assert lines[0].startswith("| kernel | calls a step | µs a step")
    assert lines[2] == "| triton_red_fused_var_mean_0 | 0.5 | 44.0 | 88.0 | [512, 1, 1] | [512, 1, 1] | 50 |"
    assert lines[3] == "| cutlass_fprop_128x128 | 1.0 | 31.0 | 31.0 | [5, 1, 1] | [512, 1, 1] | 0 |"
    assert len(lines) == 4  # the two costliest only
