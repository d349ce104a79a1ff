"""The mailbox protocol's typed requests and answers (hvd_async.transport.window.layout): what a
worker encodes the server program decodes, with its kind and payload; bad kinds and fields are refused."""
import numpy as np
import pytest

from hvd_async.transport import window as W


def test_a_request_round_trips_through_the_header():
    header = np.full(W.H_LEN, 9.0)  # stale bytes from the last request are overwritten
    W.encode_request(header, W.Kind.PUSH, {0: 0.05, 4: 2.5})
    request = W.Request.decode(header, shard=0, worker=1)
    assert request.kind is W.Kind.PUSH and request.kind.answered
    assert request.payload.tolist() == [0.05, 0, 0, 0, 2.5, 0, 0] and len(request.payload) == W.PAYLOAD_LEN
    header[W.H_PAYLOAD] = 7.0  # the program gets its own copy: the next receive cannot change it
    assert request.payload[0] == 0.05
    W.encode_request(header, W.Kind.IDLE, None)
    assert W.Request.decode(header, 0, 1).kind is W.Kind.IDLE and not W.Kind.IDLE.answered
    assert not W.Request.decode(header, 0, 1).payload.any()


def test_bad_kinds_and_fields_are_refused_by_name():
    header = np.zeros(W.H_LEN)
    header[W.H_KIND] = 9
    with pytest.raises(RuntimeError, match="server 2: unknown request kind 9 from worker 3"):
        W.Request.decode(header, 2, 3)
    with pytest.raises(ValueError, match=f"payload field {W.PAYLOAD_LEN} is outside 0..{W.PAYLOAD_LEN - 1}"):
        W.encode_request(header, W.Kind.PUSH, {W.PAYLOAD_LEN: 1.0})


def test_answers_read_by_name():
    rows = np.zeros((2, W.R_LEN))
    rows[:, W.R_VERSION], rows[:, W.R_STALENESS], rows[:, W.R_PUSHES] = (12, 13), (1, 0), (40, 41)
    rows[:, W.R_STATUS] = W.Status.APPLIED
    answers = W.Answers(rows)
    assert answers.versions.tolist() == [12, 13] and answers.staleness.tolist() == [1, 0]
    assert answers.pushes == 40 and answers.all(W.Status.APPLIED) and not answers.all(W.Status.SKIPPED)
    rows[1, W.R_STATUS] = W.Status.SKIPPED
    assert not answers.all(W.Status.APPLIED)


def test_a_push_names_its_inbox_slot():
    header = np.zeros(W.H_LEN)
    W.encode_request(header, W.Kind.PUSH, {0: 0.1}, slot=2)
    assert W.Request.decode(header, shard=0, worker=4).slot == 2
    W.encode_request(header, W.Kind.PUSH, {0: 0.1})  # no slot named: the worker's own
    assert W.Request.decode(header, shard=0, worker=4).slot == 4


def test_a_pool_only_where_fewer_slots_than_workers():
    spec = lambda slots, mode="mailbox": W.WindowSpec("dc-asgd", mode, 10, 1, 4, slots=slots)  # noqa: E731
    assert (spec(0).pooled, spec(0).inbox_slots) == (False, 4)
    assert (spec(4).pooled, spec(9).inbox_slots) == (False, 4)
    assert (spec(2).pooled, spec(2).inbox_slots) == (True, 2)
    assert not spec(2, mode="accumulate").pooled


def test_fp16_slots_widen_into_one_shared_buffer():
    """One fp32 buffer for every slot (not one per worker): each read is the slot as it is now."""
    import torch
    from hvd_async.transport.window.host import WidenedSlots

    slots = [torch.full((5,), float(s) + 0.5, dtype=torch.float16) for s in range(3)]
    wide = WidenedSlots(slots)
    first = wide[0]
    assert first.dtype == torch.float32 and first.tolist() == [0.5] * 5
    second = wide[2]
    assert second.data_ptr() == first.data_ptr() and second.tolist() == [2.5] * 5
