"""The roofline bounds used to refuse impossible timings and to rank shapes before anything is measured."""

from app.domain.families import get_family
from app.domain.roofline import estimate_us, floor_us


def test_big_gemm_floor_is_compute_bound_and_scales_with_cus():
    bf16 = get_family("bf16_gemm")
    shape = {"M": "8192", "N": "8192", "K": "8192"}
    full = floor_us(bf16, shape, "gfx942", 304)
    assert 800 < full < 900  # 1.1 TFLOP at 1307 TFLOP/s
    assert floor_us(bf16, shape, "gfx942", 152) == 2 * full  # half the CUs, half the peak
    assert floor_us(bf16, shape, "gfx942", 608) == full  # never above the full part's peak
    assert floor_us(get_family("a8w8_gemm"), dict(shape, q_dtype_w="torch.int8"), "gfx942", 304) < full


def test_decode_gemm_is_memory_bound_and_estimate_exceeds_floor():
    bf16 = get_family("bf16_gemm")
    shape = {"M": "1", "N": "8192", "K": "8192"}
    assert floor_us(bf16, shape, "gfx950", 256) * 1e-6 * 17.2e12 >= 8192 * 8192 * 2  # weights streamed once
    assert estimate_us(bf16, shape, "gfx950", 256) > floor_us(bf16, shape, "gfx950", 256)


def test_unknown_gfx_uses_the_fastest_device_and_moe_counts_routed_work():
    fmoe = get_family("fmoe")
    shape = {"token": "16", "model_dim": "7168", "inter_dim": "256", "expert": "256", "topk": "8",
             "use_g1u1": "1", "q_dtype_w": "torch.float8_e4m3fnuz"}
    assert 0 < floor_us(fmoe, shape, "gfx9999", 1) <= floor_us(fmoe, shape, "gfx942", 304)
