"""Run in-process workers (one thread each, over a loopback transport) and surface their failures."""
import threading


def run_workers(target, workers: int, *, timeout: float = 60) -> None:
    """``target(rank)`` on ``workers`` threads; re-raises the first failure; fails on a hang."""
    errors = []

    def wrap(rank):
        try:
            target(rank)
        except BaseException as exc:  # surface worker failures in the test thread
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(r,)) for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]
