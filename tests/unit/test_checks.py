"""all_finite: the screen by sums and its exact fallback."""
import pytest
import torch

from hvd_async.checks import all_finite


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
