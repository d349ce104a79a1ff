"""Bad input in one process, one case per row of docs/bad-input.md: every option of ``hvd-async train``
and ``simulate`` gives exit status 2 and one line naming the value and what is accepted; every keyword
of ``DistributedOptimizer`` and ``init`` raises with such a line. Cases that need MPI are in
tests/test_bad_input_mpi.py; rows whose test lives elsewhere are named in the table."""
import os
import struct

import pytest
import torch

import hvd_async as ha
from datafiles import write_cifar, write_imagenet, write_mnist
from hvd_async.job import cli, launcher
from hvd_async.transport import LoopbackGroup


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Bad input must be refused before mpirun starts anything."""
    def refuse(cmd):
        raise AssertionError(f"bad input reached the launcher: {cmd}")

    monkeypatch.setattr(launcher, "run", refuse)


def one_line(capsys, argv):
    """Run the CLI; return its one stderr line after checking exit 2, no traceback, nothing else."""
    code = cli.main(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith(f"hvd-async {argv[0]}: error: "), err
    assert "Traceback" not in out + err and not out, out + err
    return lines[0]


# (id, argv, the bad value as the line names it, what the line says is accepted); "{tmp}" is a
# fresh folder, "{file}" a file in it
TRAIN = [
    ("unknown-option", ["--bogus", "1"], "--bogus 1", "'hvd-async train --help' lists the accepted options"),
    ("missing-value", ["--lr"], "--lr", "expected one argument"),
    ("np-type", ["--np", "x"], "'x'", "invalid int value"),
    ("np-range", ["--np", "-1"], "-1", "--np must be >= 1"),
    ("servers-type", ["--servers", "two"], "'two'", "invalid int value"),
    ("servers-range", ["--servers", "-1"], "-1", "--servers must be >= 0"),
    ("servers-without-ps", ["--algo", "hpsgd", "--servers", "1"], "--servers 1", "use --servers 0"),
    # the fix named must be one the next run accepts: asgd needs its server, so more processes
    ("np-one-with-server", ["--algo", "asgd", "--np", "1"], "--np 1", "needs 1 parameter-server rank(s) beside"
     " its workers, and --np counts both; use --np 2 or more"),
    ("servers-np-one", ["--algo", "asgd", "--np", "1", "--servers", "1"], "--servers 1", "use --np 2 or more"),
    ("config-preset", ["--config", "dc-asgdd"], "dc-asgdd", "no such file or preset; the presets are: asgd, "
     "backup-sgd, dbs-asgd, dc-asgd,"),
    ("servers-od-allreduce", ["--algo", "od-sgd", "--od-exchange", "allreduce", "--servers", "1"],
     "--servers 1", "with --od-exchange allreduce uses no parameter server; use --servers 0"),
    ("dataset-without-dir", ["--dataset", "imagenet"], "--dataset imagenet", "needs --data-dir"),
    ("data-dir-file", ["--dataset", "cifar10", "--data-dir", "{file}"], "{file}", "is not a folder"),
    ("image-size-range", ["--image-size", "0"], "0", "--image-size must be >= 1"),
    ("image-size-type", ["--image-size", "big"], "'big'", "invalid int value"),
    ("epochs-type", ["--epochs", "1.5"], "'1.5'", "invalid int value"),
    ("lr-inf", ["--lr", "inf"], "inf", "--lr must be a finite number"),
    ("momentum-range", ["--momentum", "-0.5"], "-0.5", "--momentum must be >= 0"),
    ("momentum-one", ["--momentum", "1.5"], "1.5", "--momentum must be < 1"),
    ("weight-decay-range", ["--weight-decay", "-1"], "-1.0", "--weight-decay must be >= 0"),
    ("weight-decay-inf", ["--weight-decay", "inf"], "inf", "--weight-decay must be a finite number"),
    ("seed-range", ["--seed", "-1"], "-1", "--seed must be in 0..4294967295"),
    ("seed-large", ["--seed", "4294967296"], "4294967296", "--seed must be in 0..4294967295"),
    ("logdir-file", ["--logdir", "{file}"], "{file}", "exists and is not a folder"),
    ("metrics-out-folder", ["--metrics-out", "{tmp}"], "{tmp}", "give a file path"),
    ("straggler-format", ["--straggler", "slow"], "'slow'", "must be WORKER=FACTOR, e.g. 2=3"),
    ("straggler-factor", ["--straggler", "1=0.5"], "'1=0.5'", "FACTOR must be >= 1"),
    ("compute-ms-range", ["--compute-ms", "-1"], "-1.0", "--compute-ms must be >= 0"),
    ("compute-ms-inf", ["--compute-ms", "inf"], "inf", "--compute-ms must be a finite number"),
    ("straggler-without-device-time", ["--straggler", "1=3"], "--straggler 1=3",
     "stretches the emulated device time, and --compute-ms is 0; give --compute-ms MS > 0"),
    ("delay-dist-without-device-time", ["--delay-dist", "lognormal"], "--delay-dist lognormal",
     "draws each step's device time around --compute-ms, and --compute-ms is 0; give --compute-ms MS > 0"),
    ("delay-shape-pareto", ["--compute-ms", "20", "--delay-dist", "pareto", "--delay-shape", "1"], "--delay-shape 1.0",
     "pareto's alpha must be > 1"),
    ("evals-per-epoch-range", ["--evals-per-epoch", "0"], "0", "--evals-per-epoch must be >= 1"),
    ("backward-passes", ["--backward-passes-per-step", "0"], "0", "--backward-passes-per-step must be an integer >= 1"),
    ("lam-inf", ["--algo", "dc-asgd", "--lam", "inf"], "inf", "--lam must be a number >= 0 and finite"),
    # another algorithm's option: refused as the Python API refuses it (the job dropped it without a word)
    ("fp16-under-asgd", ["--algo", "asgd", "--fp16-allreduce"], "--fp16-allreduce",
     "has no meaning under asgd; it works with: lb-sgd, ssgd (leave it out here)"),
    ("lam-under-asgd", ["--algo", "asgd", "--lam", "1"], "--lam 1.0",
     "has no meaning under asgd; it works with: dc-asgd, lc-asgd (leave it out here)"),
    ("window-under-ssgd", ["--window", "8"], "--window 8", "has no meaning under ssgd; it works with: hpsgd"),
    ("deterministic-under-asgd", ["--algo", "asgd", "--deterministic"], "--deterministic",
     "the order in which the workers' pushes reach the servers changes from run to run"),
    ("softsync-n-zero", ["--algo", "softsync", "--softsync-n", "0"], "--softsync-n 0",
     "between 1 and the number of workers (3)"),
    ("predictor", ["--algo", "lc-asgd", "--predictor", "svm"], "'svm'", "choose from 'linear', 'mlp'"),
    ("r-min-above-1", ["--algo", "lc-asgd", "--r-min", "2"], "2.0", "--r-min must be in (0, 1]"),
    ("gossip-every", ["--algo", "gossip", "--gossip-every", "0"], "0", "--gossip-every must be an integer >= 1"),
    ("gossip-variant", ["--algo", "gossip", "--gossip-variant", "pushpull"], "'pushpull'",
     "choose from 'pull', 'push'"),
    ("gossip-topology", ["--algo", "gossip", "--gossip-topology", "star"], "'star'",
     "choose from 'random', 'ring', 'exponential'"),
    ("tau", ["--algo", "easgd", "--tau", "0"], "0", "--tau must be an integer >= 1"),
    ("alpha", ["--algo", "easgd", "--alpha", "1"], "1.0", "--alpha must be a number in (0, 1)"),
    ("alpha-and-rho", ["--algo", "easgd", "--alpha", "0.1", "--rho", "1"], "--alpha 0.1 --rho 1.0",
     "give --alpha or --rho, not both"),
    ("rho", ["--algo", "easgd", "--rho", "20"], "--rho 20.0", "it must be in (0, 1)"),
    ("local-lr-range", ["--algo", "od-sgd", "--local-lr", "-1"], "-1.0", "--local-lr must be a finite number >= 0"),
    ("local-lr-inf", ["--algo", "od-sgd", "--local-lr", "inf"], "inf", "--local-lr must be a finite number >= 0"),
    ("local-momentum", ["--algo", "od-sgd", "--local-momentum", "1"], "1.0", "--local-momentum must be in [0, 1)"),
    ("od-exchange", ["--algo", "od-sgd", "--od-exchange", "nccl"], "'nccl'", "choose from 'window', 'allreduce'"),
    ("window", ["--algo", "hpsgd", "--window", "0"], "0", "--window must be an integer >= 1"),
    ("merge-rate", ["--algo", "hpsgd", "--merge-rate", "0"], "0.0", "--merge-rate must be a finite number > 0"),
    ("merge-rate-inf", ["--algo", "hpsgd", "--merge-rate", "inf"], "inf", "--merge-rate must be a finite number > 0"),
    ("checkpoint-dir-file", ["--checkpoint-dir", "{file}"], "{file}", "exists and is not a folder"),
    ("checkpoint-every", ["--checkpoint-every", "5weeks"], "'5weeks'", "give N or Nepochs"),
    ("checkpoint-every-zero", ["--checkpoint-every", "0steps"], "'0steps'", "N >= 1"),
    ("keep-checkpoints", ["--keep-checkpoints", "0"], "0", "--keep-checkpoints must be >= 1"),
    ("resume-without-dir", ["--resume"], "--resume", "needs --checkpoint-dir"),
    ("worker-timeout", ["--worker-timeout", "0"], "0.0", "--worker-timeout must be a number of seconds > 0"),
    ("max-nonfinite", ["--max-nonfinite", "-1"], "-1", "--max-nonfinite must be >= 0"),
    ("progress", ["--progress", "fancy"], "'fancy'", "choose from 'auto', 'bar', 'epochs'"),
    ("max-restarts-range", ["--max-restarts", "-1"], "-1", "--max-restarts must be >= 0"),
    ("max-restarts-without-dir", ["--max-restarts", "2"], "--max-restarts 2", "needs --checkpoint-dir"),
    ("mpi-args-quote", ["--mpi-args", "--hostfile 'hosts"], "\"--hostfile 'hosts\"", "quote as in a shell"),
] + [(f"flag-{flag}", [f"--{flag}=yes"], "'yes'", "a flag: give it without a value")
     for flag in ("fp16-allreduce", "dc-adaptive", "no-loss-term", "easgd-sync", "no-overlap",
                  "drop-own-change", "resume", "deterministic")]

# hvd-async simulate's own options (the shared ones behave as under train)
SIMULATE = [
    ("np-mismatch", ["--workers", "4", "--np", "9"], "--np 9", "drop --np"),
    ("launcher-option", ["--mpi-args", "-x A"], "--mpi-args -x A", "'hvd-async simulate --help' lists"),
    ("delay-shape-constant", ["--delay-shape", "1"], "--delay-shape 1.0", "shapes are for uniform, lognormal, pareto"),
    ("delay-shape-uniform", ["--delay-dist", "uniform", "--delay-shape", "2"], "--delay-shape 2.0", "must be in [0, 1]"),
    ("latency-range", ["--latency-ms", "-1"], "-1.0", "--latency-ms must be a finite number >= 0"),
    ("latency-inf", ["--latency-ms", "inf"], "inf", "--latency-ms must be a finite number >= 0"),
    ("slow-factor-inf", ["--slow-factor", "inf"], "inf", "--slow-factor must be >= 1 and finite"),
    ("trace-out-file", ["--trace-out", "{file}"], "{file}", "exists and is not a folder"),
    ("replay-latency", ["--algo", "asgd", "--replay", "{tmp}", "--latency-ms", "1"], "--latency-ms",
     "--replay needs --latency-ms 0"),
]

# --config FILE.yaml: (id, the file's text, the bad value, what is accepted)
YAML = [
    ("type", "epochs: 2.5\n", "2.5", "(expected int)"),
    ("bool-for-int", "batch-size: yes\n", "True", "(expected int)"),
    ("flag-not-bool", "resume: 3\n", "3", "accepted: true or false"),
    ("choice", "predictor: svm\n", "'svm'", "choose from linear, mlp"),
    ("null", "np:\n", "np has no value", "give one or leave the key out"),
]


def _fill(items, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    file = tmp_path / "a-file"
    file.write_text("x")
    return [item.replace("{tmp}", str(folder)).replace("{file}", str(file)) for item in items]


@pytest.mark.parametrize("argv,bad,accepted", [case[1:] for case in TRAIN], ids=[case[0] for case in TRAIN])
def test_train_option(capsys, tmp_path, argv, bad, accepted):
    *argv, bad = _fill([*argv, bad], tmp_path)
    line = one_line(capsys, ["train", *argv])
    assert bad in line and accepted in line, line


@pytest.mark.parametrize("argv,bad,accepted", [case[1:] for case in SIMULATE], ids=[case[0] for case in SIMULATE])
def test_simulate_option(capsys, tmp_path, argv, bad, accepted):
    *argv, bad = _fill([*argv, bad], tmp_path)
    line = one_line(capsys, ["simulate", *argv])
    assert bad in line and accepted in line, line


@pytest.mark.parametrize("text,bad,accepted", [case[1:] for case in YAML], ids=[case[0] for case in YAML])
def test_config_file_value(capsys, tmp_path, text, bad, accepted):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    line = one_line(capsys, ["train", "--config", str(path)])
    assert str(path) in line and bad in line and accepted in line, line


def test_unknown_command(capsys):
    assert cli.main(["trian"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["hvd-async: error: unknown command 'trian'; choose one of: train, simulate, algorithms, doctor"]


# ---------------------------------------------------------------- dataset files in the wrong format
# (through hvd-async simulate, which reads the data in this process; tests/test_bad_input_mpi.py
# runs one case through hvd-async train)

def _mnist_bad_magic(root):
    write_mnist(str(root))
    path = root / "t10k-images-idx3-ubyte"
    path.write_bytes(struct.pack(">i", 1234567) + path.read_bytes()[4:])
    return path


def _mnist_truncated(root):
    write_mnist(str(root))
    path = root / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:100])
    return path


def _mnist_missing(root):
    write_mnist(str(root))
    os.remove(root / "train-labels-idx1-ubyte")
    return f"{root}: train-labels-idx1-ubyte"


def _cifar_not_pickle(root):
    folder, _ = write_cifar(str(root))
    path = os.path.join(folder, "data_batch_2")
    with open(path, "wb") as out:
        out.write(b"\x89PNG not a pickled batch")
    return path


def _cifar_missing(root):
    folder, _ = write_cifar(str(root))
    os.remove(os.path.join(folder, "batches.meta"))
    return "batches.meta"


def _imagenet_no_val(root):
    write_imagenet(str(root))
    os.rename(root / "val", root / "validation")
    return root / "val"


def _imagenet_not_an_image(root):
    write_imagenet(str(root))
    path = root / "train" / "cat" / "cat_1.png"
    path.write_bytes(b"GIF89a truncated")
    return path


DATA = [  # (id, dataset, make the bad files and return the path the line names, what the line says to do)
    ("mnist-bad-magic", "mnist", _mnist_bad_magic, "is not a valid MNIST idx file"),
    ("mnist-truncated", "mnist", _mnist_truncated, "replace it with the original uncompressed file"),
    ("mnist-missing-file", "mnist", _mnist_missing, "put the uncompressed idx files there"),
    ("cifar10-not-a-pickle", "cifar10", _cifar_not_pickle, "replace it with the file from cifar-10-python.tar.gz"),
    ("cifar10-missing-file", "cifar10", _cifar_missing, "extract cifar-10-python.tar.gz"),
    ("imagenet-no-val", "imagenet", _imagenet_no_val, "needs train/<class>/ and val/<class>/ image folders"),
    ("imagenet-not-an-image", "imagenet", _imagenet_not_an_image, "is not a readable image"),
]


@pytest.mark.parametrize("dataset,make,accepted", [case[1:] for case in DATA], ids=[case[0] for case in DATA])
def test_dataset_files_in_the_wrong_format(capsys, tmp_path, dataset, make, accepted):
    named = make(tmp_path)
    line = one_line(capsys, ["simulate", "--dataset", dataset, "--data-dir", str(tmp_path), "--image-size", "8",
                             "--workers", "1", "--epochs", "1", "--batch-size", "8"])
    assert str(named) in line and accepted in line, line


# ---------------------------------------------------------------- the Python API

def make_optimizer(algorithm="ssgd", optimizer=lambda params: torch.optim.SGD(params, lr=0.1), **options):
    param = torch.nn.Parameter(torch.zeros(3))
    return ha.DistributedOptimizer(optimizer([param]), named_parameters=[("w", param)], algorithm=algorithm,
                                   transport=LoopbackGroup(1).transport(0), **options)


INF, NAN = float("inf"), float("nan")
# (algorithm, keywords, exception, fragment of the one line); tests/unit/test_optimizer.py and
# tests/mpi/ps_checks.py (bad_input) hold more
KEYWORDS = [
    ("ssgd", {"backward_passes_per_step": 1.5}, ValueError, "backward_passes_per_step must be an integer >= 1, got 1.5"),
    ("ssgd", {"compression": 16}, ValueError, "compression must be 'none', 'fp16' or a horovod Compression class"),
    ("ssgd", {"op": None}, ValueError, "op must be 'average' or 'sum' (or hvd.Average / hvd.Sum), got None"),
    ("asgd", {"pull_every": 2.0}, ValueError, "pull_every must be an integer >= 1 (pull the global weights every k steps), got 2.0"),
    ("asgd", {"lam": 0.1}, TypeError, "unknown option(s) 'lam' for algorithm 'asgd'; accepted: pull_every"),
    ("dc-asgd", {"lam": "0.1"}, ValueError, "lam must be a number >= 0 and finite (0 turns compensation off), got '0.1'"),
    ("dc-asgd", {"lam": INF}, ValueError, "lam must be a number >= 0 and finite (0 turns compensation off), got inf"),
    ("dc-asgd", {"adaptive": "yes"}, ValueError, "adaptive must be True or False, got 'yes'"),
    ("dc-asgd", {"ms_momentum": "high"}, ValueError, "ms_momentum must be in [0, 1), got 'high'"),
    ("dc-asgd", {"ms_momentum": 1.0}, ValueError, "ms_momentum must be in [0, 1), got 1.0"),
    ("lc-asgd", {"lam": NAN}, ValueError, "lam must be a number >= 0 and finite (0 turns compensation off), got nan"),
    ("lc-asgd", {"loss_term": 1}, ValueError, "loss_term must be True or False, got 1"),
    ("lc-asgd", {"predictor": "svm"}, ValueError, "predictor must be one of: linear, mlp; got 'svm'"),
    ("lc-asgd", {"predictor_options": [8]}, ValueError, "predictor_options must be a dict of options, got [8]"),
    ("lc-asgd", {"predictor_options": {"hiden": 8}, "predictor": "mlp"}, ValueError,
     "predictor_options 'hiden' unknown to the 'mlp' predictor; accepted: batch, context, decay, hidden, lr"),
    ("lc-asgd", {"predictor_options": {"decay": 2}}, ValueError, "decay must be a finite number in (0.0, 1.0], got 2"),
    ("lc-asgd", {"predictor_options": {"floor": 1}}, ValueError, "predictor_options must not set 'floor' (got 1); pass floor="),
    ("lc-asgd", {"floor": INF}, ValueError, "floor must be a finite number, got inf"),
    ("lc-asgd", {"r_min": 0}, ValueError, "r_min must be in (0, 1], got 0"),
    ("lc-asgd", {"r_max": 0.5}, ValueError, "r_max must be >= 1 (r = 1 is the uncompensated step), got 0.5"),
    ("lc-asgd", {"min_history": 1}, ValueError, "min_history must be an integer >= 2, got 1"),
    ("lc-asgd", {"min_history": 100}, ValueError, "min_history must be <= window (32), got 100"),
    ("softsync", {"n": 0}, ValueError, "n must be an integer between 1 and the number of workers, got 0"),
    ("softsync", {"staleness_lr": "yes"}, ValueError, "staleness_lr must be True or False, got 'yes'"),
    ("dbs-asgd", {}, ValueError, "batch_size is required: pass the nominal batch per worker to the optimizer, "
                                 "DistributedOptimizer(..., algorithm='dbs-asgd', batch_size=32)"),
    ("dbs-asgd", {"batch_size": 0}, ValueError, "batch_size (the nominal batch per worker; the global batch is "
                                                "workers x batch_size) must be an integer >= 1, got 0"),
    ("dbs-asgd", {"batch_size": 32, "every": 0}, ValueError, "every must be an integer >= 1, got 0"),
    ("dbs-asgd", {"batch_size": 32, "smoothing": 1}, ValueError, "smoothing (weight of the past in the speed's "
                                                                 "moving average) must be in [0, 1), got 1"),
    ("dbs-asgd", {"batch_size": 32, "min_batch": 0}, ValueError, "min_batch must be an integer >= 1, got 0"),
    ("dbs-asgd", {"batch_size": 32, "min_batch": 8, "max_batch": 4}, ValueError,
     "max_batch must be an integer >= min_batch (8), got 4"),
    ("dbs-asgd", {"batch_size": 32, "pull_every": 0}, ValueError, "pull_every must be an integer >= 1 (pull the global weights every k steps), got 0"),
    ("od-sgd", {"local_lr": INF}, ValueError, "local_lr must be a finite number >= 0 (0: one-step-delayed ssgd), got inf"),
    ("od-sgd", {"local_momentum": 1}, ValueError, "local_momentum must be in [0, 1), got 1"),
    ("od-sgd", {"local_optimizer": "adam"}, ValueError, "local_optimizer must be a callable params -> "
                                                         "torch.optim.Optimizer, got 'adam'"),
    ("od-sgd", {"local_schedule": "cosine"}, ValueError, "local_schedule must be 'follow', 'fixed' or a callable "
                                                          "step -> lr, got 'cosine'"),
    ("od-sgd", {"exchange": "nccl"}, ValueError, "exchange must be one of window, allreduce, got 'nccl'"),
    ("hpsgd", {"window": 0}, ValueError, "window must be an integer >= 1 (local steps per exchange), got 0"),
    ("hpsgd", {"merge_rate": INF}, ValueError, "merge_rate must be a finite number > 0 (1.0 merges the whole "
                                               "average change), got inf"),
    ("hpsgd", {"overlap": 1}, ValueError, "overlap must be True or False, got 1"),
    ("hpsgd", {"keep_own_change": "no"}, ValueError, "keep_own_change must be True or False, got 'no'"),
    ("gossip", {"every": 0}, ValueError, "every must be an integer >= 1 (mix with a peer every k steps), got 0"),
    ("gossip", {"variant": "pushpull"}, ValueError, "variant must be one of pull, push (pull: average with a peer's "
                                                    "weights; push: push-sum), got 'pushpull'"),
    ("gossip", {"topology": "star"}, ValueError, "topology must be one of random, ring, exponential, got 'star'"),
    ("gossip", {"seed": -1}, ValueError, "seed must be an integer >= 0, got -1"),
    ("gossip", {"progress_interval": 0}, ValueError, "progress_interval must be in (0, 1] seconds, got 0"),
    ("easgd", {"tau": 0}, ValueError, "tau must be an integer >= 1 (local steps between elastic moves), got 0"),
    ("easgd", {"alpha": 1.5}, ValueError, "alpha must be a number in (0, 1) (the elastic moving rate; the paper "
                                          "suggests 0.9 / workers), got 1.5"),
    ("easgd", {"rho": -1}, ValueError, "rho must be a finite number > 0 (alpha = lr * rho), got -1"),
    ("easgd", {"alpha": 0.1, "rho": 1}, ValueError, "give alpha or rho, not both (alpha=0.1, rho=1); alpha = lr * rho"),
    ("easgd", {"synchronous": "yes"}, ValueError, "synchronous must be True or False, got 'yes'"),
]


def _keyword_id(case):
    algorithm, options = case[:2]
    return f"{algorithm}-" + "-".join(f"{k}={v}" for k, v in options.items()) if options else f"{algorithm}-none"


def _raises_one_line(exc, fragment, call):
    with pytest.raises(exc) as info:
        call()
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
    return message


@pytest.mark.parametrize("algorithm,options,exc,fragment", KEYWORDS, ids=[_keyword_id(c) for c in KEYWORDS])
def test_distributed_optimizer_keyword(algorithm, options, exc, fragment):
    _raises_one_line(exc, fragment, lambda: make_optimizer(algorithm, **options))


def test_distributed_optimizer_arguments():
    param = torch.nn.Parameter(torch.zeros(3))
    _raises_one_line(TypeError, "named_parameters must be an iterable of (name, parameter) pairs, e.g. "
                                "model.named_parameters(); got int",
                     lambda: ha.DistributedOptimizer(torch.optim.SGD([param], lr=0.1), named_parameters=5))
    _raises_one_line(TypeError, "transport must be a hvd_async.transport.Transport, got str; leave it out",
                     lambda: ha.DistributedOptimizer(torch.optim.SGD([param], lr=0.1), transport="mpi"))
    _raises_one_line(ValueError, "unknown algorithm 'dcasgd'; choose one of: ssgd, asgd, dc-asgd",
                     lambda: make_optimizer("dcasgd"))
    _raises_one_line(TypeError, "dc-asgd applies its SGD rule on the parameter servers: wrap a torch.optim.SGD "
                                "(got Adam); these run any optimizer: ssgd, asgd, hpsgd, gossip, easgd, dbs-asgd",
                     lambda: make_optimizer("dc-asgd", torch.optim.Adam))
    _raises_one_line(ValueError, "softsync: maximize=True is not supported on the server; minimise the negated",
                     lambda: make_optimizer("softsync", lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9,
                                                                                         maximize=True)))


@pytest.mark.parametrize("servers", ["1", -1, True, 1.5, None])
def test_init_servers(servers):
    _raises_one_line(ValueError, f"servers must be an integer >= 0, got {servers!r}", lambda: ha.init(servers=servers))
