"""One cell of the fault matrix (tests/test_faults.py, benchmarks/faults/faults.py): a user's Horovod-style
script under ``algorithm=ALGO`` in which one rank fails in one way (``FAULT``) after a few steps.
Every other worker trains on, then runs the collectives a script ends with (``load_global_model``,
an ``hvd.allreduce`` of a metric). The job must end within seconds of the fault: never a hang.

Environment: ALGO, FAULT (one of FAULTS), SERVERS (0 for algorithms without servers), LEAVER (the
worker that fails, default 1), STEPS (default 30), STEP_SECONDS (compute time injected per step).

Faults (the leaving worker's):
  raise       an exception in its step code, uncaught
  data-error  the job's DataError on that worker alone: the real ``hvd_async.job.job_process.main``
              runs this cell (``hvd-async train`` with a data loader that fails on one worker)
  exit0       ``sys.exit(0)`` in the middle of training (the exit hook closes what is open)
  close       an error it catches, then ``opt.close()`` in ``finally``, then the script returns
  server      an exception inside the server program (server rank 0)
  kill-worker SIGKILL of the leaving worker
  kill-server SIGKILL of server rank 0
"""
import os
import signal
import sys
import time

FAULTS = ("raise", "data-error", "exit0", "close", "server", "kill-worker", "kill-server")

ALGO = os.environ.get("ALGO", "asgd")
FAULT = os.environ.get("FAULT", "exit0")
SERVERS = int(os.environ.get("SERVERS", "1"))
LEAVER = int(os.environ.get("LEAVER", "1"))
STEPS = int(os.environ.get("STEPS", "30"))
FAULT_STEP = 5
STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.05"))


def mark(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def inject_server_fault() -> None:
    """Make the server program raise: at its third request (the mailbox programs: dc-asgd, softsync,
    od-sgd), or, for the programs that take no requests (asgd's and easgd's accumulates land by
    themselves), in the host's loop once the shard has taken 3 pushes."""
    from hvd_async.transport.window import host

    calls = []
    original_poll = host.ShardHost.poll

    def on_request(program, *args):
        calls.append(1)
        if len(calls) == 3:
            mark(f"FAULT server on server 0 at step 0 t={time.time():.3f}")
            raise RuntimeError("injected fault in the server program")
        return program._unfaulty_on_request(*args)

    def poll(self, *args, **kwargs):
        program = self.program
        if type(program).on_request is not host.ServerProgram.on_request and \
                not hasattr(program, "_unfaulty_on_request"):
            program._unfaulty_on_request = program.on_request
            program.on_request = lambda *a: on_request(program, *a)
        elif type(program).on_request is host.ServerProgram.on_request:
            if self.version >= 3:
                mark(f"FAULT server on server 0 at step 0 t={time.time():.3f}")
                raise RuntimeError("injected fault in the server program")
        return original_poll(self, *args, **kwargs)

    host.ShardHost.poll = poll


def data_error_job() -> int:
    """The real job with a loader that raises the job's DataError on the leaving worker alone."""
    from hvd_async import data
    from hvd_async.job import job_process, train

    original = data.load_dataset_on

    def failing(comm, *args, **kwargs):
        splits = original(comm, *args, **kwargs)
        if comm.rank == LEAVER:  # (the job loads over the workers' communicator)
            class Unreadable(type(splits.train)):
                def __getitem__(self, i):
                    mark(f"FAULT data-error on worker {LEAVER} at step 0 t={time.time():.3f}")
                    raise data.DataError(f"image {i} of worker {LEAVER}'s share is not a readable image "
                                         f"(injected fault)")
            splits.train.__class__ = Unreadable
        return splits

    data.load_dataset_on = failing
    argv = ["--algo", ALGO, "--servers", str(SERVERS), "--epochs", "2", "--dataset", "digits", "--model", "mlp"]
    return job_process.main(argv, train.train_worker)


def main() -> None:
    if FAULT == "data-error":
        from hvd_async.job.job_process import exit_process

        exit_process(data_error_job())
    import horovod.torch as hvd
    import torch
    import torch.nn.functional as F

    import hvd_async as ha

    if FAULT == "server":
        inject_server_fault()
    ha.init(servers=SERVERS)
    if ha.is_server():
        if FAULT == "kill-server" and ha.world_rank() == 0:
            import threading

            def kill():
                mark(f"FAULT kill-server on server 0 at step 0 t={time.time():.3f}")
                os.kill(os.getpid(), signal.SIGKILL)

            threading.Timer(3.0, kill).start()
        ha.serve()
        sys.exit(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = ha.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                  named_parameters=model.named_parameters(), algorithm=ALGO,
                                  **({"batch_size": 16} if ALGO == "lb-sgd" else {}))
    me = ha.rank()
    leaving = me == LEAVER
    try:
        for step in range(STEPS):
            if leaving and step == FAULT_STEP:
                mark(f"FAULT {FAULT} on worker {me} at step {step} t={time.time():.3f}")
                if FAULT == "raise":
                    raise RuntimeError(f"injected error in worker {me}'s step code")
                if FAULT == "exit0":
                    sys.exit(0)
                if FAULT == "close":
                    raise ValueError(f"injected error on worker {me}, caught by the script")
                if FAULT == "kill-worker":
                    os.kill(os.getpid(), signal.SIGKILL)
            g = torch.Generator().manual_seed(me * 1000 + step)
            x, y = torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            time.sleep(STEP_SECONDS)
    except ValueError as exc:  # the 'close' cell: the script catches its own error...
        mark(f"worker {me} caught: {exc}")
    finally:
        if FAULT == "close" and leaving:  # ...and closes in finally, then returns normally
            opt.close()
    if FAULT == "close" and leaving:
        mark(f"WORKER {me} LEFT")
        return
    opt.load_global_model()
    loss = hvd.allreduce(torch.tensor([float(step)]), name="steps")
    mark(f"WORKER {me} DONE steps={loss.item():g}")


if __name__ == "__main__":
    main()
