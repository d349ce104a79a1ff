"""hvd_async.init makes a multi-rank job's unbuffered stdout and stderr line-buffered
(runtime._whole_lines), so that a print reaches mpirun as one write: unbuffered, print writes a
line's text and its newline separately, and mpirun can put another rank's output between the two.
A stream over a raw file that records each write shows the writes a print makes."""
import io

from hvd_async import runtime


class Writes(io.RawIOBase):
    """A raw file that keeps each write it is given."""

    def __init__(self):
        self.calls = []

    def writable(self):
        return True

    def write(self, data):
        self.calls.append(bytes(data))
        return len(data)


def _stream():
    raw = Writes()
    return raw, io.TextIOWrapper(raw, write_through=True)  # as python -u / PYTHONUNBUFFERED makes stdout


def test_an_unbuffered_print_is_two_writes():
    raw, out = _stream()
    print("epoch 1: accuracy 0.9", file=out)
    assert raw.calls == [b"epoch 1: accuracy 0.9", b"\n"]


def test_after_whole_lines_a_print_is_one_write_at_once():
    raw, out = _stream()
    runtime._whole_lines(out)
    print("epoch 1:", "accuracy 0.9", file=out)
    assert raw.calls == [b"epoch 1: accuracy 0.9\n"]  # written at the newline, not held
    out.write("partial")
    assert raw.calls[1:] == []
    out.flush()  # text without a newline waits for one, or for flush() (tqdm flushes)
    assert raw.calls[1:] == [b"partial"]


def test_a_buffered_or_foreign_stream_is_left_as_it_is():
    raw = Writes()
    buffered = io.TextIOWrapper(io.BufferedWriter(raw))
    runtime._whole_lines(buffered)
    assert not buffered.line_buffering
    runtime._whole_lines(io.StringIO())  # (pytest's capture, a notebook's stream: not a TextIOWrapper)
