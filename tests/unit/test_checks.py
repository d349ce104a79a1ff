"""all_finite: the screen by sums and its exact fallback; the GPU forms (a fused norm, a flag computed
on the device) checked here on CPU tensors, with the same cases."""
import pytest
import torch

from hvd_async.algorithms.ssgd import device_flag
from hvd_async.checks import all_finite, all_finite_fused, finite_in_fp16, norm_if_finite


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
def test_a_non_finite_element_anywhere_is_found(bad, dtype):
    tensors = [torch.ones(7, dtype=dtype), torch.zeros(3, 5, dtype=dtype)]
    assert all_finite(tensors)
    tensors[1][2, 4] = bad
    assert not all_finite(tensors)


def test_opposite_infinities_do_not_cancel():
    assert not all_finite([torch.tensor([float("inf")]), torch.tensor([float("-inf")])])


def test_large_finite_values_whose_sum_overflows_are_finite():
    big = torch.full((4,), 3.0e38)  # the fp32 sums overflow; every element is finite
    assert bool(torch.isinf(big.sum()))
    assert all_finite([big, big.clone()])
    half = torch.full((8,), 60000.0, dtype=torch.float16)  # fp16's own sum would overflow
    assert all_finite([half])


def test_nothing_to_check_is_finite():
    assert all_finite([])


@pytest.mark.parametrize("value,fits", [(65504.0, True), (65519.0, True), (65520.0, False), (1e5, False),
                                        (-65519.0, True), (-65520.0, False), (float("nan"), False),
                                        (float("inf"), False), (float("-inf"), False), (-3.5, True)])
def test_finite_in_fp16_is_exactly_what_rounds_to_a_finite_half(value, fits):
    grad = torch.linspace(-2.0, 2.0, 1000)
    grad[617] = value
    assert bool(torch.isfinite(grad.half()).all()) == fits  # what the wire would carry
    assert finite_in_fp16(grad) == fits


def test_finite_in_fp16_passes_large_values_whose_squares_trip_the_screen():
    grad = torch.full((1000,), 30000.0)  # the sum of squares is far above 65520², every element fits
    assert finite_in_fp16(grad)
    grad[999] = 70000.0
    assert not finite_in_fp16(grad)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_the_gpu_forms_find_a_non_finite_element_anywhere(bad, dtype):
    tensors = [torch.ones(7, dtype=dtype), torch.zeros(3, 5, dtype=dtype), torch.full((4,), 2.0, dtype=torch.float32)]
    assert all_finite_fused(tensors, foreach=False)
    assert float(device_flag([torch.dot(t.reshape(-1), t.reshape(-1)).float() for t in tensors])) == 0.0
    tensors[1][2, 4] = bad
    assert not all_finite_fused(tensors, foreach=False)
    assert float(device_flag([torch.dot(t.reshape(-1), t.reshape(-1)).float() for t in tensors])) == 1.0


def test_the_fused_norm_falls_back_to_the_exact_check_on_overflow():
    big = torch.full((4,), 3.0e38)  # the norm overflows; every element is finite
    assert bool(torch.isinf(torch.nn.utils.get_total_norm([big], 2.0)))
    assert all_finite_fused([big, big.clone()], foreach=False)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_norm_if_finite_is_none_for_a_non_finite_element_and_the_norm_otherwise(bad):
    grad = torch.arange(1000, dtype=torch.float32) / 1000
    assert norm_if_finite(grad) == pytest.approx(float(grad.double().norm()), rel=1e-6)
    grad[517] = bad
    assert norm_if_finite(grad) is None


def test_norm_if_finite_keeps_finite_values_whose_squares_overflow():
    grad = torch.full((4,), 3e38)  # finite, but the norm's squares overflow fp32
    assert norm_if_finite(grad) == float("inf")
