"""DistributedOptimizer in one process: argument checks, forwarding to the wrapped optimizer, state_dict."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hvd_async import DistributedOptimizer
from hvd_async.wrapping import where_supported  # the table the messages name the algorithms from
from hvd_async.transport import LoopbackGroup


def _setup(**options):
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(),
                               transport=LoopbackGroup(1).transport(0), **options)
    return model, opt


def _step(model, opt):
    opt.zero_grad()
    F.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 0])).backward()
    opt.step()


def test_forwards_param_groups_and_works_with_lr_scheduler():
    model, opt = _setup()
    assert opt.param_groups is opt.optimizer.param_groups
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _step(model, opt)
    sched.step()
    assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)


def test_state_dict_is_torchs_and_the_algorithm_state_round_trips_apart():
    model, opt = _setup()
    for _ in range(3):
        _step(model, opt)
    state = opt.state_dict()
    assert set(state) == {"state", "param_groups"}, "torch's own format, as hvd.broadcast_optimizer_state needs"
    assert state["state"], "momentum buffers missing"
    algo = opt.algorithm_state_dict()
    assert algo["algorithm"] == "ssgd" and algo["strategy"]["steps"] == 3
    model2, opt2 = _setup()
    plain = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    plain.load_state_dict(state)  # a plain optimizer takes it as it is
    opt2.load_state_dict(state)
    opt2.load_algorithm_state_dict(algo)
    assert opt2.strategy.steps == 3
    buf = opt2.optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(buf, state["state"][0]["momentum_buffer"])
    legacy = {"algorithm": "ssgd", "optimizer": state, "strategy": {"steps": 5}}  # written by 0.1's state_dict()
    opt2.load_state_dict(legacy)
    assert opt2.strategy.steps == 5
    with pytest.raises(ValueError, match="not an optimizer state_dict"):
        opt2.load_state_dict({"steps": 3})
    with pytest.raises(ValueError, match="from algorithm 'asgd', this optimizer runs 'ssgd'"):
        opt2.load_algorithm_state_dict(dict(algo, algorithm="asgd"))


@pytest.mark.parametrize("kwargs,error,match", [
    ({"algorithm": "sgd"}, ValueError, "unknown algorithm 'sgd'; choose one of: ssgd"),
    ({"backward_passes_per_step": 0}, ValueError, "backward_passes_per_step must be an integer >= 1, got 0"),
    ({"compression": "int4"}, ValueError, "compression must be 'none', 'fp16'"),
    ({"op": "max"}, ValueError, "op must be 'average' or 'sum'"),
    ({"op": "sum", "gradient_predivide_factor": 2.0}, ValueError,  # Horovod's check and words
     "gradient_predivide_factor not supported with op != Average"),
    ({"lam": 0.1}, TypeError, "unknown option\\(s\\) 'lam' for algorithm 'ssgd'; accepted: backward_passes_per_step"),
])
def test_bad_options_say_what_is_accepted(kwargs, error, match):
    with pytest.raises(error, match=match):
        _setup(**kwargs)


def test_a_speed_only_option_without_effect_warns_at_the_callers_line():
    """num_groups under an algorithm that makes no grouped allreduce: a warning (it changes speed, not
    results) naming the algorithms where it works, shown at the line that built the optimizer."""
    makers = ", ".join(sorted(where_supported()["num_groups"]))  # (ssgd and the others grouping allreduces)
    assert "ssgd" in makers.split(", ") and "hpsgd" not in makers.split(", ")
    with pytest.warns(UserWarning, match=f"num_groups=2 has no effect under hpsgd: .* only these algorithms make: "
                                         f"{makers}$") as caught:
        model = nn.Linear(4, 2)
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(),
                             algorithm="hpsgd", transport=LoopbackGroup(1).transport(0), num_groups=2)
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, caught[0].lineno)] and \
        "DistributedOptimizer(" in open(__file__).read().splitlines()[caught[0].lineno - 1], \
        "the warning names the line that built the optimizer"


def test_rejects_non_optimizer_and_unnamed_parameters():
    model = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="must be a torch.optim.Optimizer"):
        DistributedOptimizer(model, transport=LoopbackGroup(1).transport(0))
    extra = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD(list(model.parameters()) + [extra], lr=0.1)
    with pytest.raises(ValueError, match="does not name 1 of the optimizer's parameters"):
        DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                             transport=LoopbackGroup(1).transport(0))
    dup = [("w", p) for p in model.parameters()]
    with pytest.raises(ValueError, match="parameter names must be unique; duplicated: w"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=dup,
                             transport=LoopbackGroup(1).transport(0))


def test_needs_init_without_explicit_transport():
    model = nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match=r"call hvd_async.init\(\) first"):
        DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                             named_parameters=model.named_parameters())


def test_step_reads_a_loss_that_requires_grad_detached_without_a_warning():
    model, opt = _setup()
    loss = F.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 0]))
    loss.backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when a tensor that requires grad becomes a float
        opt.step(loss=loss)
    assert opt.strategy.reported_loss == float(loss.detach())


def _horovods_step_warning() -> str:
    """The text ``horovod.torch.DistributedOptimizer.step`` warns with after ``synchronize()`` (from its source)."""
    import ast
    import inspect

    import horovod.torch.optimizer as hvd_optimizer

    tree = ast.parse(inspect.getsource(hvd_optimizer._DistributedOptimizer))
    step = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "step")
    return next(node.args[0].value for node in ast.walk(step)
                if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "warn")


@pytest.mark.parametrize("algorithm", ["ssgd", "hpsgd"])
def test_step_after_synchronize_warns_horovods_text_once_per_such_step(algorithm):
    """Horovod's text, once per step() that follows synchronize() outside skip_synchronize(); none for a
    plain step or one inside the context."""
    model, opt = _setup(algorithm=algorithm)

    def warned(synchronize, skip):
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(3, 4)), torch.tensor([0, 1, 0])).backward()
        if synchronize:
            opt.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if skip:
                with opt.skip_synchronize():
                    opt.step()
            else:
                opt.step()
        return [str(w.message) for w in caught]

    assert [warned(True, False) for _ in range(3)] == [[_horovods_step_warning()]] * 3
    assert warned(True, True) == [] and warned(False, False) == [] and warned(False, True) == []
    opt.synchronize()
    opt.load_state_dict(opt.state_dict())  # Horovod's load_state_dict forgets the synchronize()
    assert warned(False, False) == []


def test_algorithm_state_carries_a_schema_version_and_an_unknown_one_is_refused():
    from hvd_async.checkpoint import CheckpointError

    model, opt = _setup()
    _step(model, opt)
    state = opt.algorithm_state_dict()
    assert state["version"] == 1
    with pytest.raises(CheckpointError, match=r"has schema version 2; this hvd_async reads version 1: load it "
                                              r"with the hvd_async that wrote it"):
        opt.load_algorithm_state_dict(dict(state, version=2, strategy={"steps": 9}))
    assert opt.strategy.steps == 1, "a refused state changed nothing"
    opt.load_algorithm_state_dict({"algorithm": "ssgd", "strategy": {"steps": 4}})  # written before the field
    assert opt.strategy.steps == 4
