"""hvd_async.DynamicBatchSampler under dbs-asgd under mpirun: 3 workers' batch sizes follow an injected
change of speed (the slow worker's batches shrink to about a third, and grow back when it speeds up
while another slows down), and examples/dbs_asgd.py runs. The sampler's own logic is tested in one
process in tests/unit/test_batch_sampler.py."""
import re
import statistics

from procs import mpirun, python


def _sizes(out: str):
    found = {}
    for worker, epoch, sizes in re.findall(r"^SIZES worker (\d) epoch (\d): ([\d ]+)$", out, re.M):
        found[int(worker), int(epoch)] = [int(s) for s in sizes.split()]
    return found


def test_batch_sizes_follow_an_injected_speed_change():
    result = mpirun(4, python("tests/mpi/dbs_sampler_job.py"), timeout=240)
    assert result.returncode == 0, result.out[-4000:]
    sizes = _sizes(result.out)
    assert sorted(sizes) == [(w, e) for w in range(3) for e in range(4)], result.out[-3000:]
    # the end of each phase: the last 8 batches of epochs 1 and 3 (3x slow: a share of about 1/7 of 24, 3.4)
    end = {(w, e): statistics.mean(sizes[w, e][-8:]) for w in range(3) for e in (1, 3)}
    assert end[2, 1] < 0.6 * min(end[0, 1], end[1, 1]), end  # worker 2 slow
    assert end[0, 3] < 0.6 * min(end[1, 3], end[2, 3]), end  # then worker 0 slow, worker 2 back
    assert end[2, 3] > 1.5 * end[2, 1] and end[0, 3] < end[0, 1] / 1.5, end
    total = re.search(r"^TOTAL (\d+) of (\d+)$", result.out, re.M)
    assert total and 0 <= int(total.group(1)) - int(total.group(2)) < 24, result.out[-2000:]


def test_the_example_runs():
    result = mpirun(4, python("examples/dbs_asgd.py", "--epochs", "3", "--slow", "2=3"), timeout=240)
    assert result.returncode == 0, result.out[-4000:]
    accuracy = re.search(r"epoch 3: accuracy on all of digits ([\d.]+)", result.out)
    assert accuracy and float(accuracy.group(1)) > 0.8, result.out[-3000:]
    # (not anchored to line ends: mpirun may still glue two ranks' lines together, hvd_async.init or not)
    lines = re.findall(r"worker (\d): batch sizes this epoch \d+ to \d+, \d+ steps, last (\d+)", result.out)
    assert len(lines) == 9, result.out[-3000:]
    last = {int(worker): int(size) for worker, size in lines[-3:]}  # epoch 3's (1/7 of 96 for worker 2)
    assert last[2] < 0.6 * min(last[0], last[1]), lines
