"""ssgd's non-finite guard on the device: the check is a tensor never read on the host. An optimizer that
takes torch.amp's ``found_inf`` (torch's fused SGD and Adam) skips on it in its own kernel; another
(unfused) has its step undone on the device (``StepUndo``). The device path is for GPUs; here
``checks.DEVICE_TYPES`` lets it run on CPU tensors (torch's fused optimizers and its GradScaler kernel run
on the CPU too), against the host path (the same optimizer unfused, ``undo_on_device=False``)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hvd_async import DistributedOptimizer
from hvd_async import checks
from hvd_async.algorithms import ssgd as ssgd_module
from hvd_async.transport import LoopbackGroup
from threads import run_workers

STEPS, BAD_STEP = 4, 2  # step 1 goes through the host path (the optimizer's state does not exist yet)


def _optimizer(kind, params, fused):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, fused=fused)
    if kind == "sgd-nesterov-wd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, fused=fused)
    if kind == "sgd-plain":  # no momentum: no optimizer state at all
        return torch.optim.SGD(params, lr=0.1, fused=fused)
    return torch.optim.Adam(params, lr=0.01, fused=fused)


def _train(workers, kind, path, bad, monkeypatch):
    """Every worker trains STEPS steps through ``path``: 'fused' (found_inf), 'undo' (unfused, undone on
    the device) or 'host' (unfused, read); worker ``workers - 1`` plants ``bad`` into one gradient element
    at BAD_STEP. Returns, per worker, the weights after each step, the optimizer state after the
    last, the skip count, and how often the host check (a read of the flag or the gradients) ran."""
    monkeypatch.setattr(checks, "DEVICE_TYPES", ("cuda", "cpu"))
    host_checks = []
    real_check = ssgd_module.SSGD._reduced_grads_finite
    monkeypatch.setattr(ssgd_module.SSGD, "_reduced_grads_finite",
                        lambda self: host_checks.append(1) or real_check(self))
    group = LoopbackGroup(workers)
    torch.manual_seed(0)  # (here: the workers' threads would interleave the global generator)
    models = [nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)) for _ in range(workers)]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    out = {}

    def worker(rank):
        model = models[rank]
        step = [0]
        if rank == workers - 1 and bad is not None:
            def plant(p):
                if step[0] == BAD_STEP:
                    p.grad.view(-1)[5] = bad

            model[0].weight.register_post_accumulate_grad_hook(plant)
        opt = DistributedOptimizer(_optimizer(kind, model.parameters(), path == "fused"),
                                   named_parameters=model.named_parameters(), algorithm="ssgd",
                                   transport=group.transport(rank), undo_on_device=path != "host")
        history = []
        for step[0] in range(1, STEPS + 1):
            g = torch.Generator().manual_seed(10 * rank + step[0])
            x, y = torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            history.append([p.detach().clone() for p in model.parameters()])
        state = [{k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()}
                 for s in opt.optimizer.state.values()]
        out[rank] = history, state, opt.stats()["skipped_nonfinite"]

    run_workers(worker, workers)
    return out, len(host_checks)


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("path,kind", [("fused", "sgd"), ("fused", "adam"), ("undo", "sgd"), ("undo", "adam"),
                                       ("undo", "sgd-nesterov-wd"), ("undo", "sgd-plain")])
@pytest.mark.parametrize("bad,skipped", [(float("nan"), 1), (float("inf"), 1), (1e20, 0), (None, 0)])
def test_device_skip_equals_the_host_check(workers, path, kind, bad, skipped, monkeypatch):
    """The same steps through a device path and the host path (the same optimizer unfused, the check
    read): equal weights after every step (bit for bit where the optimizer is the same), equal
    optimizer state, the same count; a non-finite average leaves weights and state as they were; the
    host check ran only where it must."""
    device, device_checks = _train(workers, kind, path, bad, monkeypatch)
    host, _ = _train(workers, kind, "host", bad, monkeypatch)
    # the host check ran once per worker, at step 1 (before the optimizer had state), never after
    assert device_checks == workers
    tolerance = dict(rtol=1e-5, atol=1e-6) if path == "fused" else dict(rtol=0, atol=0)
    for rank in range(workers):
        d_hist, d_state, d_skipped = device[rank]
        h_hist, h_state, h_skipped = host[rank]
        assert d_skipped == h_skipped == skipped
        for step, (d, h) in enumerate(zip(d_hist, h_hist), start=1):
            for a, b in zip(d, h):
                torch.testing.assert_close(a, b, **tolerance, msg=f"step {step} rank {rank}")
        if skipped:
            assert all(torch.equal(a, b) for a, b in zip(d_hist[BAD_STEP - 1], d_hist[BAD_STEP - 2]))
        for a, b in zip(d_state, h_state):
            for key in a:
                torch.testing.assert_close(torch.as_tensor(a[key]).float(), torch.as_tensor(b[key]).float(),
                                           **tolerance)
        assert all(bool(torch.isfinite(w).all()) for w in d_hist[-1])


def test_device_skips_are_read_every_100_steps_with_a_warning(monkeypatch, caplog):
    """One worker, fused SGD: every step from 2 on is non-finite; the count is read (and warned of) at
    step 100, not at each step, and the weights never move after step 1."""
    monkeypatch.setattr(checks, "DEVICE_TYPES", ("cuda", "cpu"))
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True),
                               named_parameters=model.named_parameters(), algorithm="ssgd",
                               transport=LoopbackGroup(1).transport(0))
    strategy = opt.strategy
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    for step in range(1, 101):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if step > 1:
            model.bias.grad[0] = float("nan")
        if step == 2:
            after_first = [p.detach().clone() for p in model.parameters()]
        with caplog.at_level("WARNING", logger="hvd_async.algorithms.ssgd"):
            opt.step()
        if step == 99:
            assert strategy._skipped == 0 and not caplog.records  # nothing read yet
    assert strategy._skipped == 99 and "99 step(s) up to step 100" in caplog.text
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), after_first))
    assert opt.stats()["skipped_nonfinite"] == 99


@pytest.mark.parametrize("found", [1.0, 0.0])
def test_undo_takes_back_state_the_step_created(found):
    """A parameter whose first gradient comes after the optimizer has state for the others: the step
    creates its momentum; undone, the parameter and its (absent) state are as before, the others'
    weights and momentum too; kept, the step stands, bit for bit as without the undo."""
    from hvd_async.algorithms.step_undo import StepUndo

    def setup():
        torch.manual_seed(0)
        a, b = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(2))
        opt = torch.optim.SGD([a, b], lr=0.1, momentum=0.9)
        a.grad = torch.ones(3)
        opt.step()  # a has momentum, b (no gradient yet) has none
        a.grad, b.grad = torch.full((3,), 2.0), torch.tensor([float("nan") if found else 0.5, 1.0])
        return a, b, opt

    a, b, opt = setup()
    before = [a.detach().clone(), b.detach().clone(), opt.state[a]["momentum_buffer"].clone()]
    undo = StepUndo()
    plan = undo.plan(opt, a.device)
    undo.copy(plan, torch.tensor(found))
    opt.step()
    assert "momentum_buffer" in opt.state[b]
    undo.undo(opt, plan, torch.tensor(found))
    if found:
        assert "momentum_buffer" not in opt.state.get(b, {})
        assert all(torch.equal(x, y) for x, y in zip(before, [a, b, opt.state[a]["momentum_buffer"]]))
    else:
        ra, rb, ropt = setup()
        ropt.step()
        assert torch.equal(a, ra) and torch.equal(b, rb)
        assert torch.equal(opt.state[b]["momentum_buffer"], ropt.state[rb]["momentum_buffer"])


def test_undo_declines_state_off_the_device_and_numbers():
    """plan() returns None (the caller reads the flag on the host) where a state tensor is on another
    device than the gradients or the state holds a number; it plans where the state is all tensors."""
    from hvd_async.algorithms.step_undo import StepUndo

    p = nn.Parameter(torch.randn(3))
    p.grad = torch.ones(3)
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    opt.step()
    assert StepUndo().plan(opt, p.device) is not None
    assert StepUndo().plan(opt, torch.device("meta")) is None  # (the parameter is elsewhere)
    opt.state[p]["count"] = 3
    assert StepUndo().plan(opt, p.device) is None


@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex64, torch.float64, torch.float16])
@pytest.mark.parametrize("found", [1.0, 0.0])
def test_undo_covers_every_element_size(dtype, found):
    """complex128 (16 bytes an element, undone as int64 pairs) as the others: undone, the parameter and
    its momentum are back bit for bit; kept, the step stands as without the undo."""
    from hvd_async.algorithms.step_undo import StepUndo

    def setup():
        torch.manual_seed(0)
        p = nn.Parameter(torch.randn(5, dtype=dtype))
        opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
        p.grad = torch.ones(5, dtype=dtype)
        opt.step()
        p.grad = torch.full((5,), 2.0, dtype=dtype)
        return p, opt

    p, opt = setup()
    before = [p.detach().clone(), opt.state[p]["momentum_buffer"].clone()]
    undo = StepUndo()
    plan = undo.plan(opt, p.device)
    undo.copy(plan, torch.tensor(found))
    opt.step()
    undo.undo(opt, plan, torch.tensor(found))
    if found:
        assert torch.equal(p, before[0]) and torch.equal(opt.state[p]["momentum_buffer"], before[1])
    else:
        rp, ropt = setup()
        ropt.step()
        assert torch.equal(p, rp) and not torch.equal(p, before[0])
        assert torch.equal(opt.state[p]["momentum_buffer"], ropt.state[rp]["momentum_buffer"])


def test_undo_follows_tensors_replaced_between_steps():
    """After ``load_state_dict`` (new momentum tensors) and ``p.data = ...`` (the same parameter, new
    storage) the undo restores the tensors the step changed, not the ones it saw the step before."""
    from hvd_async.algorithms.step_undo import StepUndo

    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(4))
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    undo = StepUndo()
    for step in range(3):
        p.grad = torch.randn(4)
        found = torch.tensor(0.0)
        plan = undo.plan(opt, p.device)
        undo.copy(plan, found)
        opt.step()
        undo.undo(opt, plan, found)
    opt.load_state_dict(opt.state_dict())
    p.data = p.data.clone()
    before = [p.detach().clone(), opt.state[p]["momentum_buffer"].clone()]
    p.grad = torch.full((4,), float("nan"))
    found = torch.tensor(1.0)
    plan = undo.plan(opt, p.device)
    undo.copy(plan, found)
    opt.step()
    undo.undo(opt, plan, found)
    assert torch.equal(p, before[0]) and torch.equal(opt.state[p]["momentum_buffer"], before[1])


def test_no_memory_for_the_copy_falls_back_to_the_host_read(monkeypatch, caplog):
    """The undo's copy does not fit: one warning, the step goes through the host read (and still skips
    a non-finite step), and later steps do not try the copy again."""
    from hvd_async.algorithms import step_undo

    monkeypatch.setattr(checks, "DEVICE_TYPES", ("cuda", "cpu"))
    tries = []

    def no_memory(self, plan, found):
        tries.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(step_undo.StepUndo, "copy", no_memory)
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters(), algorithm="ssgd",
                               transport=LoopbackGroup(1).transport(0))
    x, y = torch.randn(3, 4), torch.tensor([0, 1, 0])
    for step in range(1, 5):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if step == 3:
            model.bias.grad[0] = float("nan")
            before = [p.detach().clone() for p in model.parameters()]
        with caplog.at_level("WARNING", logger="hvd_async.algorithms.ssgd"):
            opt.step()
        if step == 3:
            assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))
    assert len(tries) == 1 and caplog.text.count("no device memory for the copy") == 1
    assert opt.stats()["skipped_nonfinite"] == 1
