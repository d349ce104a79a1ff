"""The parameter-server rules and layout in one process, against numbers worked out by hand."""
import pytest
import torch

from hvd_async.algorithms.base import parse_options
from hvd_async.algorithms.asgd import ASGDOptions
from hvd_async.algorithms.dcasgd import DCASGDOptions
from hvd_async.algorithms.softsync import SoftSyncOptions
from hvd_async.rules import DCRule, DCState, RunningMean, SGDRule, staleness_scaled_mean_
from hvd_async.transport.window import shard_bounds


def test_shards_are_contiguous_and_near_equal():
    assert shard_bounds(10, 1) == [(0, 10)]
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_bounds(2, 3) == [(0, 1), (1, 2), (2, 2)]  # more shards than elements: some empty
    with pytest.raises(ValueError, match="shards >= 1"):
        shard_bounds(5, 0)


def test_sgd_rule_momentum_and_weight_decay_by_hand():
    w, state = torch.tensor([1.0, -2.0]), {}
    rule = SGDRule()
    rule.apply_(w, torch.tensor([0.5, 1.0]), state, lr=0.1, momentum=0.9, weight_decay=0.1)
    # d = g + 0.1 w = [0.6, 0.8]; buf = d; w = [1 - 0.06, -2 - 0.08]
    assert torch.allclose(w, torch.tensor([0.94, -2.08]))
    rule.apply_(w, torch.tensor([0.5, 1.0]), state, lr=0.1, momentum=0.9, weight_decay=0.1)
    # d = [0.5 + 0.094, 1 - 0.208] = [0.594, 0.792]; buf = 0.9 * [0.6, 0.8] + d = [1.134, 1.512]
    assert torch.allclose(state["momentum_buffer"], torch.tensor([1.134, 1.512]))
    assert torch.allclose(w, torch.tensor([0.94 - 0.1134, -2.08 - 0.1512]))


def test_dc_rule_by_hand():
    w = torch.tensor([1.0, 2.0])
    state = DCRule(0.5).init(w)
    state.backup = {3: torch.tensor([0.5, 2.0])}
    DCRule(0.5).apply_(w, torch.tensor([2.0, -1.0]), state, lr=0.1, worker=3)
    # g + 0.5 g^2 (w - w_bak) = [2 + 0.5 * 4 * 0.5, -1 + 0] = [3, -1]
    assert torch.allclose(w, torch.tensor([0.7, 2.1]))


def test_dc_rule_adaptive_by_hand():
    w = torch.tensor([1.0])
    rule = DCRule(0.2, adaptive=True, ms_momentum=0.5, eps=1e-12)
    state = rule.init(w)
    state.backup = [torch.tensor([0.0])]
    rule.apply_(w, torch.tensor([2.0]), state, lr=0.1, worker=0)
    # MS = 0.5 * 4 = 2; lam = 0.2 / sqrt(2); step = 2 + lam * 4 * 1
    assert state.mean_square.item() == pytest.approx(2.0)
    assert w.item() == pytest.approx(1.0 - 0.1 * (2.0 + 0.2 / 2 ** 0.5 * 4.0), rel=1e-6)


def test_dc_rule_with_lam_zero_is_sgd():
    g = torch.tensor([0.3, -0.7])
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])
    DCRule(0.0).apply_(a, g, DCState(backup=[torch.zeros(2)]), lr=0.05)
    SGDRule().apply_(b, g, {}, lr=0.05)
    assert torch.equal(a, b)


def test_staleness_scaled_mean_by_hand():
    out = torch.zeros(2)
    staleness_scaled_mean_([torch.tensor([4.0, 8.0]), torch.tensor([6.0, 3.0])], [0, 3], out)
    assert out.tolist() == [(4.0 + 2.0) / 2, (8.0 + 1.0) / 2]
    staleness_scaled_mean_([torch.tensor([4.0, 8.0]), torch.tensor([6.0, 3.0])], [0, 3], out, scale=False)
    assert out.tolist() == [5.0, 5.5]
    with pytest.raises(ValueError, match="one staleness per gradient"):
        staleness_scaled_mean_([torch.zeros(2)], [0, 1], out)


@pytest.mark.parametrize("scale", [True, False])
def test_the_running_mean_is_the_list_mean_to_the_bit(scale):
    """Folded in as the gradients land, one buffer: the same sum in the same order as the list form."""
    gen = torch.Generator().manual_seed(5)
    rounds = [[torch.randn(257, generator=gen) for _ in range(k)] for k in (3, 1, 4)]
    running = RunningMean(torch.zeros(257), scale=scale)
    for grads in rounds:
        staleness = [int(s) for s in torch.randint(0, 5, (len(grads),), generator=gen)]
        for grad, tau in zip(grads, staleness):
            running.add(grad, tau)
        want = staleness_scaled_mean_(grads, staleness, torch.empty(257), scale=scale)
        assert torch.equal(running.mean_(), want)
    with pytest.raises(ValueError, match="no gradient was added"):
        running.mean_()


@pytest.mark.parametrize("cls,options,match", [
    (DCASGDOptions, {"lam": -0.5}, "lam must be a number >= 0"),
    (DCASGDOptions, {"lam": "big"}, "lam must be a number >= 0"),
    (DCASGDOptions, {"ms_momentum": 1.0}, r"ms_momentum must be in \[0, 1\)"),
    (DCASGDOptions, {"adaptive": "yes"}, "adaptive must be True or False"),
    (SoftSyncOptions, {"n": 0}, "n must be an integer between 1 and the number of workers"),
    (ASGDOptions, {"pull_every": 1.5}, "pull_every must be an integer >= 1"),
    (DCASGDOptions, {"push_clip": 0.5}, "push_clip must be 0 .* or a factor >= 1"),
    (DCASGDOptions, {"push_clip": float("inf")}, "push_clip must be 0"),
])
def test_bad_options_name_the_value(cls, options, match):
    with pytest.raises(ValueError, match=match):
        parse_options(cls, "x", options)


def test_flat_model_views_and_copies():
    from hvd_async.algorithms.flat import FlatModel

    a, b = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.full((3,), 2.0))
    flat = FlatModel([a, b])
    assert flat.views and flat.flat.tolist() == [1, 1, 1, 1, 2, 2, 2]
    flat.flat[4] = 7.0  # the parameters are views into the flat buffer
    assert b[0].item() == 7.0
    a.grad = torch.full((2, 2), 0.5)
    assert flat.gather_grads().tolist() == [0.5] * 4 + [0.0] * 3  # no grad: zeros

    c = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))  # not float32: copied both ways
    flat = FlatModel([c])
    assert not flat.views
    flat.flat.fill_(3.0)
    flat.load_params()
    assert c.dtype == torch.float64 and c.tolist() == [3.0, 3.0]
    with torch.no_grad():
        c.add_(1.0)
    flat.store_params()
    assert flat.flat.tolist() == [4.0, 4.0]


def test_dc_rule_reuses_its_scratch_and_a_checkpoint_leaves_it_out():
    # the server's step allocates nothing per push (a fresh temporary of a large model costs its
    # pages' first-touch faults): the compensated step lands in the same scratch tensor each time
    rule = DCRule(2.0, adaptive=True)
    w = torch.randn(64)
    state = rule.init(w)
    state.backup = [w.clone() - 0.01]
    g1, g2 = torch.randn(64), torch.randn(64)
    ms = state.mean_square.clone()
    first = rule.compensated(w, g1, state, 0)
    ms = 0.95 * ms + 0.05 * g1 * g1
    want = g1 + 2.0 / torch.sqrt(ms + 1e-7) * g1 * g1 * (w - state.backup[0])
    assert torch.allclose(first, want, rtol=1e-5, atol=1e-7)
    second = rule.compensated(w, g2, state, 0)
    assert second.data_ptr() == first.data_ptr()
    assert not torch.equal(second, want)  # overwritten: the caller uses the step before the next call
    assert state.scratch.held and not state.scratch_diff.held
    assert set(state.saved()) == {"mean_square"}  # a checkpoint holds no scratch


class _Host:  # what a server program reads and calls on its shard, in memory
    def __init__(self, workers=2, numel=16):
        from types import SimpleNamespace

        self.spec = SimpleNamespace(workers=workers, outbox=True)
        self.weights, self.version = torch.randn(numel), 0
        self.outbox = [torch.zeros(numel) for _ in range(workers)]

    def add_sums(self, *sums):
        self.sums = sums

    def bump(self, staleness, pushes=1):
        self.version += 1

    def answer(self, *args):
        pass


def test_push_clip_bounds_a_push_out_of_line_and_barely_moves_its_mean():
    from hvd_async.algorithms.compensation import PushClip

    clip = PushClip(1.5)
    assert clip.scale(2.0) == 1.0 and clip.mean == 2.0  # the first push sets the mean, never clipped
    assert clip.scale(2.5) == 1.0  # within 1.5 x 2.0
    mean = clip.mean
    assert clip.scale(100.0) == pytest.approx(1.5 * mean / 100.0)  # scaled to the bound
    assert clip.mean == pytest.approx(0.9 * mean + 0.1 * 1.5 * mean)  # the bound entered the mean, not 100


def test_dc_program_clips_the_pushed_step_and_checkpoints_the_mean():
    from hvd_async.algorithms.dcasgd import DCPayload, DCProgram

    # one shard holding the whole gradient: no whole norm sent (0), the shard's own is the gradient's
    payload = DCPayload(lr=0.1, momentum=0.0, weight_decay=0.0, nesterov=False, grad_norm=0.0)
    moves = {}
    for push_clip in (0.0, 1.5):
        host = _Host()
        torch.manual_seed(0)
        host.weights = torch.zeros(16)
        program = DCProgram(host, _dc_options(lam=0.0, adaptive=False, ms_momentum=0.95, push_clip=push_clip))
        for m in (0, 1):
            program.on_push(m, torch.ones(16), payload)
        before = host.weights.clone()
        pushed = torch.full((16,), 40.0)  # 40 times the others' norm
        program.on_push(0, pushed, payload)
        moves[push_clip] = float((host.weights - before).norm())
        assert torch.equal(pushed, torch.full((16,), 40.0))  # scaled in a copy: the inbox slot is read only
    assert moves[0.0] == pytest.approx(0.1 * 40.0 * 4.0)  # --push-clip 0: the step as it came
    assert moves[1.5] == pytest.approx(0.1 * 1.5 * 4.0)  # scaled to 1.5 x the running mean norm (4)
    state = program.state_dict()
    assert state["push_clip_mean"] == pytest.approx(program.push_clip.mean)
    again = DCProgram(_Host(), _dc_options(lam=0.0, adaptive=False, ms_momentum=0.95, push_clip=1.5))
    again.load_state_dict(state)
    assert again.push_clip.mean == program.push_clip.mean


def test_dc_program_checkpoint_holds_no_scratch():
    from hvd_async.algorithms.dcasgd import DCPayload, DCProgram

    host = _Host()
    program = DCProgram(host, _dc_options(lam=2.0, adaptive=True, ms_momentum=0.95, lookahead=True))
    payload = DCPayload(lr=0.05, momentum=0.9, weight_decay=0.0, nesterov=False)
    for m in (0, 1, 0):
        g = torch.randn(16)
        program.on_push(m, g, payload)
    compensation_sq, grad_sq = host.sums
    assert grad_sq == pytest.approx(float(g.norm()) ** 2)
    assert compensation_sq > 0
    assert set(program.state_dict()["rule"]) == {"mean_square"}


def _allocations(call, numel: int) -> list:
    """The ops inside ``call()`` that allocated a tensor of ``numel`` fp16 elements or more (a Python
    number's own small tensor aside)."""
    from torch.profiler import profile

    with profile(profile_memory=True) as prof:
        call()
    return [(e.name, e.cpu_memory_usage) for e in prof.events() if e.cpu_memory_usage >= 2 * numel]


def test_fp16_slots_enter_the_arithmetic_through_kept_buffers_with_the_same_numbers():
    # under fp16 compression a worker's backup and its answer are fp16 slots; mixed into the fp32
    # arithmetic, torch cast them through a fresh temporary on every push (lookahead_cost.py --wire fp16)
    from hvd_async.algorithms.ps import Lookahead

    n = 4096
    torch.manual_seed(0)
    w, g = torch.randn(n), torch.randn(n)
    half = (w - 0.01 * torch.randn(n)).half()
    rule = DCRule(2.0, adaptive=True)
    steps = []
    for backup in (half, half.float()):
        state = rule.init(w)
        state.backup = [backup]
        rule.compensated(w, g, state, 0)  # the scratch exists from now on
        steps.append(rule.compensated(w, g, state, 0).clone())
    assert torch.equal(steps[0], steps[1])
    state.backup = [half]
    assert _allocations(lambda: rule.compensated(w, g, state, 0), n) == []

    look = Lookahead(w)
    look.total.copy_(torch.randn(n))
    out = torch.empty(n, dtype=torch.float16)
    look.answer(out, w, 0.05)
    assert torch.equal(out, torch.add(w, look.total, alpha=-0.05).half())
    assert _allocations(lambda: look.answer(out, w, 0.07), n) == []
    assert torch.equal(out, torch.add(w, look.total, alpha=-0.07).half())
    fp32 = Lookahead(w)
    fp32.answer(torch.empty(n), w, 0.05)
    assert fp32.wide is None  # fp32 slots are written directly


@pytest.mark.parametrize("program_name, options", [
    ("dc-asgd", dict(lam=2.0, adaptive=True, ms_momentum=0.95, lookahead=True)),
    ("dc-asgd", dict(lam=0.5, adaptive=False, ms_momentum=0.95, compensate="uncovered")),
    ("dc-asgd", dict(lam=0.0, adaptive=False, ms_momentum=0.95)),
    ("lc-asgd", dict(lam=2.0, adaptive=True, ms_momentum=0.95, r_min=0.5)),
])
def test_the_reported_compensation_is_the_step_minus_the_gradient(program_name, options):
    # dc-asgd measures its term before the gradient joins it (no pass of its own): the size reported
    # must still be ||step - g||^2 of the step applied, push by push, and 0 where the term is off
    import copy

    from hvd_async.algorithms.dcasgd import DCASGDOptions, DCProgram
    from hvd_async.algorithms.lcasgd import LCASGDOptions, LCPayload, LCProgram

    torch.manual_seed(1)
    host = _Host(workers=3, numel=64)
    make, options_cls = (DCProgram, DCASGDOptions) if program_name == "dc-asgd" else (LCProgram, LCASGDOptions)
    program = make(host, _dc_options(options_cls, **options))
    sizes, zero = [], 0
    for i, m in enumerate((0, 1, 2, 0, 0, 1, 2, 2, 0)):
        payload = LCPayload(lr=0.05, momentum=0.9, weight_decay=1e-4, nesterov=False, loss=2.0 - 0.1 * i)
        g = torch.randn(64)
        twin = copy.deepcopy(program)  # the same state: its step is the one this push applies
        step = twin.compensated(m, g, payload).clone()
        twin_weights = twin.host.weights.clone()
        program.on_push(m, g, payload)
        twin.sgd.apply_(twin_weights, step, twin.momentum[m], **payload.sgd_kwargs())
        # the step measured is the step applied (the program adds its parts into the momentum buffer
        # without forming it: the same to fp32 rounding)
        torch.testing.assert_close(host.weights, twin_weights, rtol=1.3e-6, atol=1e-6)
        compensation_sq, grad_sq = host.sums
        assert compensation_sq == pytest.approx(float((step - g).norm()) ** 2, rel=1e-5, abs=1e-12)
        assert grad_sq == pytest.approx(float(g.norm()) ** 2)
        sizes.append(compensation_sq)
        zero += compensation_sq == 0.0
    if options["lam"] == 0.0:
        assert zero == len(sizes)
    elif options.get("compensate") == "uncovered":  # a push at zero delay: no term, nothing measured
        assert 0 < zero < len(sizes)
    else:  # (a push at the weights its worker holds has no drift: 0 there too)
        assert sizes[-1] > 0 and zero < len(sizes) // 2


def test_the_dc_term_joined_with_the_gradient_is_the_compensated_step_bit_for_bit():
    torch.manual_seed(2)
    w, g = torch.randn(256), torch.randn(256)
    for rule in (DCRule(2.0, adaptive=True), DCRule(0.3), DCRule(0.0)):
        states = [rule.init(w), rule.init(w)]
        for state in states:
            state.backup = {0: w - 0.01 * torch.randn(256)}
        states[1].backup = {0: states[0].backup[0].clone()}
        for active in (True, False):
            whole = rule.compensated(w, g, states[0], 0, active=active).clone()
            term = rule.term(w, g, states[1], 0, active=active)
            assert (term is None) == (not (rule.lam and active))
            assert torch.equal(rule.joined(term, g, states[1]), whole)


def _dc_options(options_cls=DCASGDOptions, **given):
    """dc-asgd's (or lc-asgd's) options with the look-ahead and the push clip off unless given."""
    return options_cls(**dict(dict(lookahead=False, push_clip=0.0), **given))
