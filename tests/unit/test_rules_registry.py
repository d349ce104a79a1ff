"""Rules against hand-computed numbers; the registry's one table and its errors."""
import pytest
import torch

from hvd_async import registry
from hvd_async.rules import SGDRule, mean_


def test_sgd_rule_hand_computed():
    w = torch.tensor([1.0, 2.0, -3.0])
    SGDRule().apply_(w, torch.tensor([0.5, -1.0, 2.0]), {}, lr=0.1)
    assert torch.allclose(w, torch.tensor([0.95, 2.1, -3.2]))


def test_sgd_rule_applies_a_rate_annealed_to_zero():
    """A schedule may take the rate to 0 (CosineAnnealingLR): the rule applies it, it does not raise
    (a server that raised here ended the job)."""
    w, state = torch.tensor([1.0, -2.0]), {}
    SGDRule().apply_(w, torch.tensor([0.5, 0.5]), state, lr=0.0, momentum=0.9, weight_decay=0.1)
    assert torch.equal(w, torch.tensor([1.0, -2.0])) and "momentum_buffer" in state


def test_sgd_rule_nesterov_matches_torch():
    torch.manual_seed(0)
    w0, grads = torch.randn(5), [torch.randn(5) for _ in range(4)]
    p = torch.nn.Parameter(w0.clone())
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    w, state = w0.clone(), {}
    for g in grads:
        p.grad = g.clone()
        opt.step()
        SGDRule().apply_(w, g, state, lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    torch.testing.assert_close(w, p.detach(), rtol=0, atol=1e-6)
    plain, state = w0.clone(), {}
    for g in grads:
        SGDRule().apply_(plain, g, state, lr=0.1, momentum=0.9, weight_decay=0.01)
    assert not torch.allclose(plain, w, atol=1e-4), "nesterov made no difference"


def test_mean_is_exact_average_in_order():
    out = torch.empty(2)
    mean_([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0]), torch.tensor([2.0, 1.0])], out)
    assert out.tolist() == [2.0, 3.0]


def test_registry_names_every_algorithm_once():
    assert len(set(registry.NAMES)) == len(registry.NAMES) and registry.NAMES[0] == "ssgd"  # the baseline first
    assert set(registry.NAMES) <= set(registry.names())  # (names(): with any plugins' too)
    assert registry.get("dc-asgd").uses_servers and not registry.get("gossip").uses_servers


def test_registry_errors_name_the_choices():
    with pytest.raises(ValueError, match=r"unknown algorithm 'sgd'; choose one of: ssgd, asgd"):
        registry.get("sgd")


def test_every_algorithm_imports():
    for name in registry.names():
        cls = registry.algorithm(name)
        assert cls.name == name
