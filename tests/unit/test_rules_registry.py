"""Rules against hand-computed numbers; the registry's one table and its errors."""
import pytest
import torch

from hvd_async import registry
from hvd_async.rules import SGDRule, mean_


def test_sgd_rule_hand_computed():
    w = torch.tensor([1.0, 2.0, -3.0])
    SGDRule().apply_(w, torch.tensor([0.5, -1.0, 2.0]), {}, lr=0.1)
    assert torch.allclose(w, torch.tensor([0.95, 2.1, -3.2]))


def test_sgd_rule_rejects_bad_lr():
    with pytest.raises(ValueError, match="lr must be > 0, got 0"):
        SGDRule().apply_(torch.zeros(2), torch.zeros(2), {}, lr=0)


def test_mean_is_exact_average_in_order():
    out = torch.empty(2)
    mean_([torch.tensor([1.0, 2.0]), torch.tensor([3.0, 6.0]), torch.tensor([2.0, 1.0])], out)
    assert out.tolist() == [2.0, 3.0]


def test_registry_names_every_algorithm_once():
    assert registry.NAMES == ("ssgd", "asgd", "dc-asgd", "lc-asgd", "od-sgd", "hpsgd", "gossip",
                              "easgd", "softsync", "dbs-asgd")
    assert "ssgd" in registry.built()
    assert registry.get("dc-asgd").uses_servers and not registry.get("gossip").uses_servers


def test_registry_errors_name_the_choices():
    with pytest.raises(ValueError, match=r"unknown algorithm 'sgd'; choose one of: ssgd, asgd"):
        registry.get("sgd")
    planned = [name for name in registry.NAMES if name not in registry.built()]
    if planned:
        with pytest.raises(NotImplementedError, match=f"'{planned[0]}' is planned but not built yet"):
            registry.strategy_class(planned[0])


def test_built_algorithms_import():
    for name in registry.built():
        cls = registry.strategy_class(name)
        assert cls.name == name
