"""LC-ASGD's loss predictors and compensation rule, against synthetic loss curves and hand-computed numbers."""
import math
import statistics

import numpy as np
import pytest
import torch

from hvd_async.rules import DCRule, DCState, LCRule, SGDRule
from hvd_async.rules.loss_prediction import PREDICTORS, make_predictor

SHAPES = {  # L(v) = a * exp(-b v) + c
    "medium": (2.0, 0.01, 0.3),
    "slow": (1.0, 0.003, 0.05),
    "fast-knee": (3.0, 0.03, 0.5),
    "flat": (0.0, 0.01, 1.0),
}
HORIZONS = (4, 8, 16)
DEFAULT_THREADS = torch.get_num_threads()


@pytest.fixture(autouse=True)
def single_threaded_torch():
    """The mlp predictor's ops take microseconds; on a busy host torch's thread pool turns some into
    milliseconds (see MLPPredictor's tuning note), which would make this file take minutes."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(DEFAULT_THREADS)


def _curve(shape, seed, noise, versions):
    a, b, c = SHAPES[shape]
    v = np.arange(versions + max(HORIZONS) + 1)
    clean = a * np.exp(-b * v) + c
    rng = np.random.default_rng(seed)
    return clean, clean * np.exp(noise * rng.standard_normal(len(v)))


def _errors(name, shape, seed, noise, spacing, versions=600, **options):
    """Squared log errors of the predictor and of "the last observed value", h versions ahead,
    against the noisy held-out observation; points fed one at a time, every ``spacing`` versions."""
    _, observed = _curve(shape, seed, noise, versions)
    predictor = make_predictor(name, **options)
    mine, last = [], []
    for v in range(0, versions, spacing):
        predictor.observe(v, float(observed[v]))
        if not predictor.ready:
            continue
        for h in HORIZONS:
            target = math.log(observed[v + h])
            mine.append((math.log(predictor.predict(v + h)) - target) ** 2)
            last.append((math.log(observed[v]) - target) ** 2)
    return np.array(mine), np.array(last)


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_predictors_beat_the_last_value_on_noisy_decaying_curves(name):
    ratios = {}
    for shape in SHAPES:
        for spacing in (1, 4):  # every version (one worker) or every 4th (four workers)
            for seed, noise in enumerate((0.05, 0.1, 0.07)):
                mine, last = _errors(name, shape, seed, noise, spacing)
                ratios[shape, spacing, seed] = mine.mean() / last.mean()
    for key, ratio in sorted(ratios.items(), key=lambda item: -item[1])[:5]:
        print(f"\n{name} worst error ratios (predictor / last value): {key} {ratio:.3f}", end="")
    print(f"\n{name} mean ratio {np.mean(list(ratios.values())):.3f} over {len(ratios)} curves")
    assert max(ratios.values()) < 0.95, ratios
    assert np.mean(list(ratios.values())) < 0.8


def test_the_comparison_can_fail():
    # A two-point slope (decay 0.05) extrapolates the noise: it must lose to the last value.
    mine, last = _errors("linear", "medium", 0, 0.1, 1, decay=0.05)
    print(f"\nlinear decay=0.05 error ratio {mine.mean() / last.mean():.3f}")
    assert mine.mean() > last.mean()


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_flat_curves_do_not_blow_up(name):
    _, observed = _curve("flat", 3, 0.1, 400)
    predictor = make_predictor(name)
    worst = 0.0
    for v in range(400):
        predictor.observe(v, float(observed[v]))
        if predictor.ready:
            for h in (1, 16, 64, 10_000):  # 10_000 is answered at max_horizon
                worst = max(worst, abs(math.log(predictor.predict(v + h))))
    print(f"\n{name} flat curve, worst |log prediction / 1.0| {worst:.3f}")
    assert worst < 0.8  # 10% noise; without the span cap on the horizon this reached 2.5

    noiseless = make_predictor(name)
    for v in range(200):
        noiseless.observe(v, 0.7)
    assert noiseless.predict(250) == pytest.approx(0.7, rel=1e-3)


def test_linear_fit_matches_weighted_least_squares_by_hand():
    versions, losses, decay = [0, 3, 4, 9, 12], [2.0, 1.5, 1.6, 1.0, 0.9], 0.8
    predictor = make_predictor("linear", decay=decay, floor=0.2)
    for v, loss in zip(versions, losses):
        predictor.observe(v, loss)
    weights = decay ** np.arange(len(versions) - 1, -1, -1)
    # np.polyfit's w multiplies the residuals, so sqrt of the squared-error weights
    slope, intercept = np.polyfit(versions, np.log(np.array(losses) - 0.2), 1, w=np.sqrt(weights))
    assert predictor.predict(20) == pytest.approx(0.2 + math.exp(intercept + slope * 20), rel=1e-9)


def test_horizon_and_ratio_bounds():
    def halving(**options):  # versions 0..9, the loss halves every version
        predictor = make_predictor("linear", **options)
        for v in range(10):
            predictor.observe(v, 2.0 ** -v)
        return predictor

    predictor = halving(max_horizon=8, max_ratio=1000.0)
    assert predictor.predict(9 + 8) == pytest.approx(2.0 ** -17)
    assert predictor.predict(9 + 1000) == predictor.predict(9 + 8)  # capped at max_horizon
    predictor = halving(max_horizon=64, max_ratio=1000.0)
    assert predictor.predict(9 + 30) == pytest.approx(2.0 ** -18)  # capped at the span, 9 versions
    assert halving(max_ratio=4.0).predict(17) == pytest.approx(2.0 ** -9 / 4.0)  # window min / 4


def test_invalid_reports_are_ignored_and_counted():
    predictor = make_predictor("linear", floor=0.5)
    predictor.observe(5, 1.0)
    for version, loss in [(6, float("nan")), (6, float("inf")), (6, 0.5), (6, -1.0), (4, 1.0)]:
        predictor.observe(version, loss)
    assert len(predictor) == 1 and predictor.ignored == 5
    with pytest.raises(ValueError, match="version must be an integer.*got 6.5"):
        predictor.observe(6.5, 1.0)


@pytest.mark.parametrize("name", sorted(PREDICTORS))
def test_memory_is_bounded_by_the_window(name):
    predictor = make_predictor(name, window=32)
    for v in range(1000):
        predictor.observe(v, 1.0 + 1.0 / (v + 1))
    assert len(predictor) == 32 and predictor._versions.maxlen == 32
    if name == "mlp":
        assert predictor.updates == 1000 - 8  # one step per report from the 9th (context + 1) on
        # after k steps the window holds k (k + 1) / 2 pairs (end >= 7, later point after it), then
        # a full window 25 * 26 / 2 = 325; each step trains on at most `batch` of them
        pairs = [min(k * (k + 1) // 2, 325) for k in range(1, 993)]
        assert predictor.pairs_seen == sum(min(p, predictor.batch) for p in pairs) == 31604


def test_mlp_is_deterministic_and_falls_back_to_linear_before_warmup():
    _, observed = _curve("medium", 0, 0.07, 300)
    runs = [make_predictor("mlp", seed=s, warmup_steps=20) for s in (1, 1, 2)]
    linear = make_predictor("linear")
    for v in range(300):
        for predictor in runs + [linear]:
            predictor.observe(v, float(observed[v]))
        if v == 20:  # 13 steps taken (the first at 9 points): still the linear prediction
            assert runs[0].updates < 20 and runs[0].predict(v + 8) == linear.predict(v + 8)
    assert runs[0].predict(308) == runs[1].predict(308)
    assert runs[0].predict(308) != runs[2].predict(308) != linear.predict(308)


@pytest.mark.parametrize("name,options,match", [
    ("arima", {}, r"unknown loss predictor 'arima'; choose one of: linear, mlp"),
    ("linear", {"decay": 0.0}, r"decay must be a finite number in \(0.0, 1.0\], got 0.0"),
    ("linear", {"decay": 1.5}, "decay .* got 1.5"),
    ("linear", {"window": 1}, "window must be an integer >= 2, got 1"),
    ("linear", {"min_history": 40}, r"min_history must be <= window \(32\), got 40"),
    ("linear", {"max_horizon": 0}, "max_horizon must be an integer >= 1, got 0"),
    ("linear", {"max_ratio": 1.0}, "max_ratio .* got 1.0"),
    ("linear", {"floor": float("nan")}, "floor .* got nan"),
    ("linear", {"context": 4}, "bad option for loss predictor 'linear'.*context"),
    ("mlp", {"context": 32}, r"context must be < window \(32\), got 32"),
    ("mlp", {"lr": 0}, "lr .* got 0"),
    ("mlp", {"hidden": "16"}, "hidden must be an integer >= 1, got '16'"),
])
def test_bad_predictor_options_name_the_value(name, options, match):
    with pytest.raises(ValueError, match=match):
        make_predictor(name, **options)


@pytest.mark.parametrize("options,match", [
    ({"lam": -1.0}, "lam must be a number >= 0.*got -1.0"),
    ({"adaptive": "yes"}, "adaptive must be True or False, got 'yes'"),
    ({"loss_term": 1}, "loss_term must be True or False, got 1"),
    ({"predictor": "lstm"}, "predictor must be one of: linear, mlp; got 'lstm'"),
    ({"predictor_options": [1]}, r"predictor_options must be a dict of options, got \[1\]"),
    ({"predictor_options": {"floor": 1.0}}, "must not set 'floor' .*got 1.0"),
    ({"predictor_options": {"decay": 2.0}}, "decay .* got 2.0"),
    ({"r_min": 0.0}, r"r_min must be in \(0, 1\], got 0.0"),
    ({"r_max": 0.5}, "r_max must be >= 1 .*got 0.5"),
    ({"floor": float("inf")}, "floor must be a finite number, got inf"),
    ({"min_history": 1}, "min_history must be an integer >= 2, got 1"),
])
def test_bad_rule_options_name_the_value(options, match):
    with pytest.raises(ValueError, match=match):
        LCRule(**dict(dict(lam=0.04), **options))


def _setup(seed=0, n=6):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, generator=gen)
    backups = {m: w + 0.1 * torch.randn(n, generator=gen) for m in (0, 1)}
    grads = [torch.randn(n, generator=gen) for _ in range(5)]
    return w, backups, grads


def _decreasing_history(rule, state, worker):
    for v, loss in [(0, 2.0), (2, 1.7), (4, 1.4), (6, 1.25), (8, 1.1)]:
        rule.observe(state, worker, v, loss)


@pytest.mark.parametrize("adaptive", [False, True])
def test_without_loss_term_it_is_dc_asgd_exactly(adaptive):
    w, backups, grads = _setup()
    lc, dc = LCRule(0.5, adaptive=adaptive, loss_term=False), DCRule(0.5, adaptive=adaptive)
    s_lc, s_dc = lc.init(w), dc.init(w)
    s_lc.backup, s_dc.backup = dict(backups), dict(backups)
    _decreasing_history(lc, s_lc, 0)  # ignored without the loss term
    # the compensated gradient (each call advances its own state's mean square once)
    assert torch.equal(lc.compensated(w, grads[0], s_lc, 0, loss=1.1, version_now=20),
                       dc.compensated(w, grads[0], s_dc, 0))
    # and a run of steps from both workers, with momentum and weight decay
    w_lc, w_dc = w.clone(), w.clone()
    for i, g in enumerate(grads):
        lc.apply_(w_lc, g, s_lc, lr=0.1, worker=i % 2, momentum=0.9, weight_decay=0.01, loss=1.1,
                  version_now=20)
        dc.apply_(w_dc, g, s_dc, lr=0.1, worker=i % 2, momentum=0.9, weight_decay=0.01)
        assert torch.equal(w_lc, w_dc)
    if adaptive:
        assert torch.equal(s_lc.mean_square, s_dc.mean_square)
    assert s_lc.predictors == {} and s_lc.scale_sum == s_lc.scale_calls == 6


def test_at_the_algorithms_defaults_without_loss_term_lc_asgd_steps_as_dc_asgd():
    """lc-asgd's options default to dc-asgd's compensation (lam, adaptive, ms_momentum): switching
    the loss term off gives dc-asgd's default step, as the docs say."""
    from hvd_async.algorithms.dcasgd import DCASGDOptions
    from hvd_async.algorithms.lcasgd import LCASGDOptions

    dc_options = DCASGDOptions()
    lc = LCRule(**LCASGDOptions(loss_term=False).rule_options())
    dc = DCRule(dc_options.lam, adaptive=dc_options.adaptive, ms_momentum=dc_options.ms_momentum)
    w, backups, grads = _setup()
    s_lc, s_dc = lc.init(w), dc.init(w)
    s_lc.backup, s_dc.backup = dict(backups), dict(backups)
    w_lc, w_dc, w_sgd, s_sgd = w.clone(), w.clone(), w.clone(), {}
    for i, g in enumerate(grads):
        lc.apply_(w_lc, g, s_lc, lr=0.1, worker=i % 2, momentum=0.9, loss=1.1, version_now=20)
        dc.apply_(w_dc, g, s_dc, lr=0.1, worker=i % 2, momentum=0.9)
        SGDRule().apply_(w_sgd, g, s_sgd, lr=0.1, momentum=0.9)
        assert torch.equal(w_lc, w_dc)
    assert not torch.allclose(w_dc, w_sgd)  # the compensation acted: the comparison is not trivially equal


def test_without_loss_term_and_lam_zero_it_is_sgd():
    w, backups, grads = _setup()
    rule, a, b, s_sgd = LCRule(0.0, loss_term=False), w.clone(), w.clone(), {}
    state = rule.init(w)
    state.backup = backups
    for g in grads:
        rule.apply_(a, g, state, lr=0.05, worker=1, momentum=0.9, weight_decay=0.1, loss=1.0,
                    version_now=3)
        SGDRule().apply_(b, g, s_sgd, lr=0.05, momentum=0.9, weight_decay=0.1)
    assert torch.equal(a, b)


def test_loss_term_scales_the_dc_step_by_the_hand_computed_ratio():
    w, backups, grads = _setup()
    rule = LCRule(0.5, floor=0.1)
    state = rule.init(w)
    state.backup = backups
    _decreasing_history(rule, state, 0)
    predicted = state.predictors[0].predict(16)
    assert 0.1 < predicted < 1.1  # decreasing history: predicted below the last report
    r = math.sqrt((predicted - 0.1) / (1.1 - 0.1))
    assert 0.25 < r < 1.0
    expected = w - 0.1 * r * DCRule(0.5).compensated(w, grads[0], DCState(backup=backups), 0)
    out = w.clone()
    rule.apply_(out, grads[0], state, lr=0.1, worker=0, loss=1.1, version_now=16)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-7)
    assert state.scale_sum == pytest.approx(r)


def test_ratio_is_clipped_to_r_min_and_r_max():
    w, backups, _ = _setup()
    for r_max in (1.0, 2.0):
        rule = LCRule(0.0, r_min=0.25, r_max=r_max)
        state = rule.init(w)
        _decreasing_history(rule, state, 0)
        predicted = state.predictors[0].predict(10)
        assert rule.scale(state, 0, 100.0, 10) == 0.25  # sqrt(~1 / 100) = 0.1, clipped
        assert rule.scale(state, 0, predicted / 2.25, 10) == pytest.approx(min(1.5, r_max))
        assert rule.scale(state, 0, predicted / 100, 10) == r_max  # 10, clipped


def test_histories_are_per_worker_and_unready_or_bad_losses_give_one():
    w, _, _ = _setup()
    rule = LCRule(0.04, min_history=4)
    state = rule.init(w)
    for v, loss in [(1, 3.0), (3, 2.0), (5, 1.5)]:
        rule.observe(state, 1, v, loss)
    assert not state.predictors[1].ready and rule.scale(state, 1, 1.5, 40) == 1.0
    rule.observe(state, 1, 7, 1.2)
    before = state.predictors[1].predict(12)
    _decreasing_history(rule, state, 0)
    assert state.predictors[1].predict(12) == before  # worker 0's reports are not worker 1's
    assert rule.scale(state, 2, 1.0, 40) == 1.0  # no history at all
    for bad in (None, float("nan"), 0.0, -1.0):
        assert rule.scale(state, 0, bad, 40) == 1.0
    assert rule.scale(state, 0, 1.1, 40) < 1.0


def test_predictor_timing_counters_increase():
    w, _, _ = _setup()
    rule = LCRule(0.04, predictor="mlp")
    state = rule.init(w)
    _decreasing_history(rule, state, 0)
    seconds, calls = state.predictor_seconds, state.predictor_calls
    assert calls == 5 and seconds > 0
    rule.scale(state, 0, 1.0, 12)
    assert state.predictor_calls == 6 and state.predictor_seconds > seconds


@pytest.mark.parametrize("seed", [0, 1])
def test_ratio_is_one_at_zero_delay_and_moves_away_with_the_delay(seed):
    """The ratio's two ends are the predictor's (at the version pulled and at the version applied to):
    at zero delay r is 1 whatever the mini-batch noise; the longer the delay on a falling loss, the
    further below 1. The pushed loss as denominator (the call without version_pulled) is a random
    rate cut at zero delay: its mean sits well below 1 on the same reports."""
    _, observed = _curve("medium", seed, 0.2, 400)
    rule = LCRule(0.0, r_min=0.01)
    state = rule.init(torch.zeros(1))
    values = {0: [], 4: [], 16: []}
    for v in range(20, 400):
        rule.observe(state, 0, v, float(observed[v]))  # the push's own report first, as the server does
        for delay in values:
            values[delay].append(rule.scale(state, 0, float(observed[v]), v + delay, version_pulled=v))
    means = {delay: statistics.mean(r) for delay, r in values.items()}
    old = statistics.mean(rule.scale(state, 0, float(observed[v]), v) for v in range(20, 400))
    assert means[0] == pytest.approx(1.0, abs=0.02)
    assert means[0] > means[4] > means[16]
    assert old < 0.98
