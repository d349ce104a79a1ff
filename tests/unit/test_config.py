"""Option parsing and validation: YAML presets under flags, and a one-line error for every bad value."""
import pytest

from hvd_async import registry
from hvd_async.job import config


def _validate(argv, world_size=None):
    return config.validate(config.parse(argv), world_size=world_size)


def test_defaults():
    spec = _validate([])
    assert (spec.algo, spec.layout.world_size, spec.layout.servers, spec.layout.workers, spec.job.dataset,
            spec.job.model) == ("ssgd", 4, 0, 4, "digits", "mlp")


def test_yaml_file_under_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("epochs: 3\nbatch-size: 16\nlr: '0.05'\nstraggler: {1: 2.5}\ncompute_ms: 5\n")
    job = _validate(["--config", str(path), "--epochs", "7"]).job
    assert job.epochs == 7          # the flag wins
    assert job.batch_size == 16 and job.lr == 0.05 and job.compute_ms == 5.0
    assert job.stragglers == {1: 2.5}
    job = _validate(["--config", str(path), "--straggler", "3=2"]).job
    assert job.stragglers == {3: 2.0}  # a flag replaces the file's list, it does not add to it


@pytest.mark.parametrize("text,match", [
    ("epochs: 3\nlearning_rate: 1\n", "unknown option 'learning_rate'; no option is named like it; the keys are "
                                      "the long options of 'hvd-async train --help' without their '--'$"),
    ("epochs: 3\nlamda: 1\n", "unknown option 'lamda'; did you mean lam\\? the keys are the long options"),
    ("epochs: [1\n", "is not valid YAML"),
    ("- 1\n- 2\n", "must hold a mapping"),
    ("epochs: many\n", "epochs: invalid value 'many'"),
])
def test_bad_yaml(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match=match) as info:
        _validate(["--config", str(path)])
    assert len(str(info.value)) < 200 + len(str(path)), "one short line (it listed every option: 900 characters)"


@pytest.mark.parametrize("argv,match", [
    (["--algo", "sgd"], "unknown algorithm 'sgd'; choose one of: ssgd, asgd, dc-asgd"),
    (["--dataset", "svhn"], "unknown dataset 'svhn'; choose one of: digits, fashion-mnist, synthetic, teacher, mnist, cifar10, imagenet"),
    (["--model", "vgg"], "unknown model 'vgg'; choose one of: mlp, cnn, lenet, resnet18, resnet50"),
    (["--lr", "0"], "--lr must be > 0, got 0.0"),
    (["--lr", "nan"], "--lr must be > 0, got nan"),
    (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
    (["--epochs", "-2"], "--epochs must be >= 1, got -2"),
    (["--np", "0"], "--np must be >= 1, got 0"),
    (["--np", "3", "--servers", "3"], "--servers 3 leaves no worker: --np 3 counts every MPI process"),
    (["--servers", "1"], "--servers 1: algorithm 'ssgd' uses no parameter server"),
    (["--compute-ms", "5", "--straggler", "4=2"], "there is no worker 4; the job has 4 worker\\(s\\), numbered 0..3"),
    (["--straggler", "1=0.5"], "FACTOR must be >= 1"),
    (["--straggler", "x"], "must be WORKER=FACTOR"),
    (["--compute-ms", "-1"], "--compute-ms must be >= 0"),
    (["--dataset", "mnist"], "--dataset mnist needs --data-dir"),
    (["--dataset", "cifar10", "--data-dir", "/nonexistent/x"], "--data-dir /nonexistent/x does not exist"),
    (["--epochs", "x"], "argument --epochs: invalid int value: 'x'"),
    (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
])
def test_bad_values_get_one_clear_line(argv, match):
    with pytest.raises(config.ConfigError, match=match) as info:
        _validate(argv)
    assert "\n" not in str(info.value)


def test_np_must_match_the_mpi_world():
    args = config.parse(["--np", "4"], launcher=False)
    with pytest.raises(config.ConfigError, match="--np 4 does not match the 2 MPI processes"):
        config.validate(args, world_size=2)
    spec = config.validate(config.parse([], launcher=False), world_size=3)  # no --np: the world decides
    assert spec.layout.workers == 3


def test_every_preset_is_valid():
    import glob
    import os

    from hvd_async import registry

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    presets = sorted(glob.glob(os.path.join(root, "launch", "presets", "*.yaml")))
    assert {"ssgd.yaml", "asgd.yaml", "dc-asgd.yaml", "softsync.yaml", "od-sgd.yaml", "hpsgd.yaml",
            "lc-asgd.yaml", "dbs-asgd.yaml", "gossip.yaml", "easgd.yaml", "backup-sgd.yaml", "lb-sgd.yaml"} <= {os.path.basename(p) for p in presets}
    for path in presets:
        spec = _validate(["--config", path])
        assert spec.algo == os.path.basename(path)[:-5]
        assert spec.layout.servers == (0 if spec.algo in registry.serverless() else 1)
        assert spec.algorithm is not None


def test_a_preset_by_name_from_any_folder(tmp_path, monkeypatch):
    """--config NAME reads the packaged preset (hvd_async/presets, package data; launch/presets in the
    checkout), from a folder that holds neither; a file of that name in the folder wins."""
    monkeypatch.chdir(tmp_path)
    assert config.preset_names() == sorted(config.preset_names()) and "dc-asgd" in config.preset_names()
    spec = _validate(["--config", "dc-asgd", "--epochs", "2"])
    assert (spec.algo, spec.layout.servers, spec.job.epochs) == ("dc-asgd", 1, 2)
    assert spec.algorithm.given["lam"] == 2.0  # the preset's own value
    (tmp_path / "dc-asgd").write_text("algo: asgd\n")
    assert _validate(["--config", "dc-asgd"]).algo == "asgd"


def test_another_algorithms_option_is_refused_only_where_given(tmp_path):
    """The defaults of the flags never count as given: every algorithm validates with none set; a value
    the user set for another algorithm (a flag, or a key of the --config file) gets the API's refusal."""
    from hvd_async import registry

    for name in registry.names():
        extra = ["--np", "5", "--batch-size", "8"]
        assert _validate(["--algo", name, *extra]).algo == name
    path = tmp_path / "run.yaml"
    path.write_text("algo: asgd\nlam: 1\n")
    with pytest.raises(config.ConfigError, match=r"^--lam 1.0 has no meaning under asgd; it works with: dc-asgd, "
                                                 r"lc-asgd \(leave it out here\)$"):
        _validate(["--config", str(path)])
    assert _validate(["--config", str(path), "--algo", "dc-asgd"]).algo == "dc-asgd"


def test_train_help_says_what_and_shows_examples_before_the_options(capsys, monkeypatch):
    """hvd-async train --help: a short usage line, what the command does and examples, then the options;
    every example parses and validates (an example under mpirun as the job does, at its -np)."""
    import shlex

    from hvd_async.job import cli

    monkeypatch.setenv("COLUMNS", "100")
    assert cli.main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    head = text[:text.index("\noptions:")].splitlines()
    assert head[0].startswith("usage: hvd-async train ") and head[1] == "", head[:3]  # one line of usage
    assert len(head) <= 16 and "examples:" in head, head
    examples = [shlex.split(line.split("  #")[0]) for line in head if line.startswith("  ")]
    assert len(examples) >= 3 and any("--config" in argv for argv in examples), examples
    for argv in examples:
        if argv[0] == "mpirun":
            _validate(argv[argv.index("hvd_async.job.train") + 1:], world_size=int(argv[2]))
        else:
            assert argv[:2] == ["hvd-async", "train"], argv
            config.launch_options(config.parse(argv[2:]), _validate(argv[2:]))


def test_server_threads_is_a_job_option_checked_at_construction():
    from hvd_async.job.jobspec import JobOptions

    assert JobOptions().server_threads is None  # the rank's share of its node's cores
    assert JobOptions(server_threads=3).server_threads == 3
    with pytest.raises(ValueError, match="server_threads must be >= 1"):
        JobOptions(server_threads=0)


def _help_of(parser, dest: str) -> str:
    return " ".join(next(a.help for a in parser._actions if a.dest == dest).split())


def test_help_texts_take_their_lists_of_algorithms_from_the_registry(monkeypatch):
    """--deterministic names the algorithms whose sums are an allreduce, simulate's --replay those it
    can replay, and a flag two algorithms declare with different help texts names each text's own:
    each list follows the registry (here: one row more), none is typed in a help text."""
    from hvd_async.algorithms import groups
    from hvd_async.sim import options as sim_options

    assert _help_of(config.build_parser(), "deterministic").startswith(
        f"{', '.join(registry.repeatable())}, od-sgd --od-exchange allreduce: reduce tensor by tensor")
    assert _help_of(sim_options.build_parser(), "replay").startswith(
        f"{', '.join(registry.replayable())}: make the pushes land")
    lookahead = _help_of(config.build_parser(), "lookahead")
    takes = {n: c.Options for n, c in registry.algorithms().items() if c.Options is not None}
    workers = [n for n, o in takes.items() if issubclass(o, groups.WorkerLookaheadOption)]
    servers = [n for n, o in takes.items() if issubclass(o, groups.LookaheadOption) and n not in workers]
    assert workers and servers
    assert lookahead.startswith(f"{', '.join(workers)}: on the workers: after each pull"), lookahead
    assert f" / {', '.join(servers)}: on the servers: answer each push" in lookahead, lookahead

    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.ALGORITHMS))
    registry.register("ssgd-copy", type("SSGDCopy", (registry.algorithm("ssgd"),), {}),
                      summary="a plugin's synchronous algorithm")
    assert registry.repeatable()[-1] == "ssgd-copy"
    assert _help_of(config.build_parser(), "deterministic").startswith(
        f"{', '.join(registry.repeatable())}, od-sgd")
