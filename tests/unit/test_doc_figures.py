"""The figures README.md and docs/guide.md quote are their records' (issue 47): each claim below is
generated from a file in benchmarks/results/ (or, for the first setup's time, the commit that measured
it) and must stand in the document word for word; the rules of thumb's directions are checked against
the same numbers; and in the README, the guide's "Choosing an algorithm" and its defaults table no
figure stands outside a checked claim."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def record(name: str) -> dict:
    with open(os.path.join(RESULTS, name)) as f:
        return json.load(f)


def read(doc: str) -> str:
    with open(os.path.join(ROOT, doc)) as f:
        return f.read()


def flat(text: str) -> str:
    """Markdown's line breaks are spaces."""
    return " ".join(text.split())


def f2(x):
    return f"{x:.2f}"


def f3(x):
    return f"{x:.3f}"


def minutes(seconds: float) -> str:
    return f"{int(seconds) // 60} min {int(seconds) % 60} s"


def mean(name: str, algo: str, setting: str = "cnn-8") -> float:
    return record(name)["table"][setting]["algorithms"][algo]["mean_final_test_accuracy"]


def seeds(name: str, algo: str, setting: str = "cnn-8") -> str:
    found = record(name)["table"][setting]["algorithms"][algo]["seeds"]
    assert found == list(range(found[0], found[-1] + 1)), found
    return f"seeds {found[0]}-{found[-1]}"


def diverged(name: str, algo: str, setting: str = "cnn-4") -> str:
    """How many of the cell's runs diverged: "2 of 2"."""
    cell = record(name)["table"][setting]["algorithms"][algo]
    return f"{cell['diverged']} of {len(cell['seeds'])}"


# --- the claims: (document, a function of the records giving the exact text) --------------------------------

def _straggler():
    r = record("straggler_throughput.json")
    worker, factor = r["straggler"].split("=")
    return r, int(float(factor)), r["workers"]


def readme_straggler():
    r, factor, workers = _straggler()
    return (f"With a {factor}x straggler among {workers} workers, asgd trained {f2(r['ratio_to_ssgd']['asgd'])} times "
            f"as many samples per second as ssgd and reached ssgd's final accuracy minus 1 point "
            f"{f2(r['time_to_target_speedup']['asgd'])} times sooner (digits MLP, {r['compute_ms']:.0f} ms of injected "
            f"compute per step, median of {r['repeats']}; `benchmarks/results/straggler_throughput.json`)")


def readme_ci_time():
    return (f"`make test`'s tests took {minutes(record('ci_time.json')['make_test']['seconds'])} in a CI run on a "
            f"fresh clone (`benchmarks/results/ci_time.json`)")


def readme_seeds():
    return (f"were chosen on digits with {seeds('convergence_cnn8_one_commit.json', 'ssgd')}, the same seeds that "
            f"then scored them")


def _setup_commit() -> None:
    """No record file holds the first setup's time: the commit that added the figure says how it was
    measured (the README before issue 44 quoted it from there)."""
    message = subprocess.run(["git", "show", "-s", "--format=%B", "714672e"], cwd=ROOT, capture_output=True,
                             text=True).stdout
    if not message:
        pytest.skip("commit 714672e is not in this checkout's history")
    assert "5 min 44 s" in message and "fresh machine" in message, message


def setup_time():
    """The README's first-run figure, from benchmarks/speed/setup_time.py's record."""
    r = record("setup_time.json")
    prov = r["provenance"]
    present = "already installed" if all(r["debian_packages_present"].values()) else "partly installed"
    return (f"The first run took {minutes(r['first_make_train_seconds'])} on a fresh clone with an empty cache "
            f"({minutes(r['setup_seconds'])} of setup; Debian's packages {present}; {prov['machine']['cores_usable']} "
            f"cores, {prov['date_utc'][:10]}, `benchmarks/results/setup_time.json`); later runs take seconds. "
            + start_time())


def start_time():
    """The README's figures of the main job's start, from ``setup_time.py --job-only``'s record."""
    r = record("start_time.json")
    terminal, pipe = r["median"]["terminal"], r["median"]["pipe"]
    return (f"On a terminal the command's first line comes {terminal['first_line_seconds']:.2f} s after it (in a "
            f"log, {pipe['first_line_seconds']:.1f} s: the line naming the job, once the options are checked), "
            f"and worker 0's first training step {pipe['seconds_to_first_step']:.1f} s after (medians of "
            f"{len(r['runs']['pipe'])} runs each way, {r['provenance']['date_utc'][:10]}, "
            f"`benchmarks/results/start_time.json`)")


def guide_setup_time():
    _setup_commit()
    return ("The first run took 5 min 44 s on a fresh machine of this project (2 cores, no GPU and no CUDA "
            "toolkit, 2026-11-23: Debian's OpenMPI, the venv from PyPI, Horovod's build; measured in commit 714672e)")


def guide_second_setup():
    message = subprocess.run(["git", "show", "-s", "--format=%B", "a654f6d"], cwd=ROOT, capture_output=True,
                             text=True).stdout
    if not message:
        pytest.skip("commit a654f6d is not in this checkout's history")
    assert "first setup measured on another fresh machine (4 min 54 s)" in message, message
    return "4 min 54 s on another (2026-11-27, `make setup`; commit a654f6d)"


def guide_gpu_build():
    """The build's start and end lines in the device check's log."""
    name = "device/device_check_log_20261127.txt"
    with open(os.path.join(RESULTS, name)) as f:
        log = f.read()
    start = re.search(r"\[device_check (\d+):(\d+):(\d+)\] building horovod \(nccl\)", log).groups()
    end = re.search(r"\[device_check (\d+):(\d+):(\d+)\] horovod \(nccl\) built", log).groups()
    seconds = sum(60 ** (2 - i) * (int(b) - int(a)) for i, (a, b) in enumerate(zip(start, end)))
    return f"built it with NCCL in {minutes(seconds)} (`benchmarks/results/{name}`)"


def simulator_study():
    r = record("reproduce_compensation.json")
    workers = r["settings"]["workers"]
    return (f"ran {len(r['runs'])} such runs, {workers[0]} to {workers[-1]} workers, {r['settings']['epochs']} epochs "
            f"each, two at a time, in {r['real_seconds']:.0f} s")


STUDY_PARTS = {"odsgd": "od-sgd", "compensation": "compensation (digits)",
               "compensation_teacher": "compensation (teacher task)", "scaling": "scaling (digits)",
               "scaling_teacher": "scaling (teacher task)", "hetero": "dbs-asgd", "hpsgd": "hpsgd"}


def study_verdicts():
    """The reproduction study's verdicts, at the one commit every part and real record ran at."""
    parts = {part: record(f"reproduce_{part}.json") for part in STUDY_PARTS}
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "study"))
    from reproduce_page import REAL_RECORDS as reals  # the records the study's real checks read
    commits = {r["provenance"]["commit"] for r in parts.values()} | \
        {record(f"{name}.json")["provenance"]["commit"] for name in reals}
    assert len(commits) == 1, f"the study's parts and real records ran at several commits: {commits}"
    by_verdict = {v: [label for part, label in STUDY_PARTS.items() if parts[part]["verdict"] == v]
                  for v in ("reproduced", "partly", "not")}
    words = "; ".join(f"{verdict}: {', '.join(labels)}" for verdict, labels in by_verdict.items() if labels)
    return f"At commit {commits.pop()[:7]} (every part and the real runs it cites, `reproduce_*.json`) {words}."


def guide_ci_times():
    r = record("ci_time.json")
    return (f"its tests then took {minutes(r['make_test']['seconds'])} on this project's 2-core machine, and "
            f"`make test-cluster` {minutes(r['make_test_cluster']['seconds'])} (`bash .ci/run` on a fresh clone of "
            f"commit {r['provenance']['commit'][:7]}, {minutes(r['total_seconds'])} in all")


def rule_samples_per_second():
    r, factor, workers = _straggler()
    ratio = r["ratio_to_ssgd"]
    return (f"with emulated accelerators ({r['compute_ms']:.0f} ms of injected compute a step), against one worker of "
            f"{workers} {'three' if factor == 3 else factor} times slower, asgd, dc-asgd and "
            f"softsync trained {f2(ratio['asgd'])}, {f2(ratio['dc-asgd'])} and {f2(ratio['softsync'])} times as many "
            f"samples per second as ssgd (`straggler_throughput.json`)")


def rule_compensation():
    r = record("compensation_delay.json")
    at8 = {algo: r["mean"][algo]["8"]["test_accuracy"] for algo in ("asgd", "dc-asgd", "lc-asgd")}
    leads = [at8[a] - at8["asgd"] for a in ("dc-asgd", "lc-asgd")]
    assert all(abs(lead) < 0.01 for lead in leads), at8  # "by under a point", whichever the direction
    direction = "led" if all(lead > 0 for lead in leads) else "trailed" if all(lead < 0 for lead in leads) else \
        "straddled"
    accuracies = ", ".join(f"{algo} {f3(value)}" for algo, value in at8.items())
    return (f"at 8 workers (mean staleness {r['mean']['asgd']['8']['staleness_mean']:.1f}) delay compensation "
            f"{direction} plain asgd by under a point: {accuracies} (`compensation_delay.json`, {len(r['seeds'])} seeds)")


def _odsgd():
    """od-sgd's gaps to ssgd in points (window, allreduce), ssgd's mean, the number of seeds."""
    r = record("overlap_accuracy.json")
    gap = r["gap_points_to_ssgd"]
    return f"{gap['od-sgd window']:+.2f}", f"{gap['od-sgd allreduce']:+.2f}", f3(r["mean_test_accuracy"]["ssgd"]), \
        len(r["seeds"])


def rule_odsgd():
    window, allreduce, ssgd, n = _odsgd()
    return (f"od-sgd ended {window} points (window) and {allreduce} points (allreduce) from ssgd's {ssgd} at equal "
            f"epochs (`overlap_accuracy.json`, {n} seeds)")


def bench_straggler():
    r = record("straggler_throughput.json")
    ratio, speedup = r["ratio_to_ssgd"], r["time_to_target_speedup"]
    return (f"median: asgd {f2(ratio['asgd'])}, dc-asgd {f2(ratio['dc-asgd'])}, softsync {f2(ratio['softsync'])}; "
            f"time to ssgd's final accuracy minus 1 point ({r['target_accuracy']:.4f}), ssgd's over theirs: asgd "
            f"{f2(speedup['asgd'])}")


def bench_compensation():
    r = record("compensation_delay.json")
    row = lambda algo: " / ".join(f3(r["mean"][algo][str(n)]["test_accuracy"]) for n in r["worker_counts"])
    staleness = " / ".join(f"{r['mean']['asgd'][str(n)]['staleness_mean']:.1f}" for n in r["worker_counts"])
    return f"asgd {row('asgd')}, dc-asgd {row('dc-asgd')}, lc-asgd {row('lc-asgd')} (mean staleness {staleness})"


def bench_overlap():
    window, allreduce, ssgd, _ = _odsgd()
    return f"{window} points (window) and {allreduce} (allreduce) from ssgd's {ssgd}"


def _commit(name: str) -> str:
    return record(name)["provenance"]["commit"][:7]


def bench_compensation_commit():
    r = record("compensation_delay.json")
    return f"digits, {len(r['seeds'])} seeds; `compensation_delay.json`, commit {_commit('compensation_delay.json')}"


def bench_hetero():
    r = record("compensation_hetero.json")
    algos = ("asgd", "softsync", "dbs-asgd")
    errors = sorted(set(round(100 * e, 1) for e in r["batch_size_errors"]))
    return (f"commit {_commit('compensation_hetero.json')}): dbs-asgd's batch sizes were off the inverse-speed "
            f"split by {' to '.join(f'{e:g}%' for e in (errors[0], errors[-1]))} (`batch_size_errors`, "
            f"{len(r['seeds'])} seeds); accuracy " + ", ".join(f"{a} {f3(r['mean'][a]['final_test_accuracy'])}"
                                                            for a in algos)
            + ", train loss " + " / ".join(f"{r['mean'][a]['final_train_loss']:.3f}" for a in algos)
            + ", samples/s " + " / ".join(f"{r['mean'][a]['samples_per_second']:.0f}" for a in algos))


def bench_overlap_speed():
    t, b = record("overlap_throughput.json"), record("overlap_budget.json")
    runs = len([x for x in t["runs"] if x["variant"] == "ssgd"])
    ratios = ", ".join(f"{k} {f2(v)}" for k, v in t["ratio_to_ssgd"].items() if k != "ssgd")
    hp = next(k for k in b["mean_accuracy_at_budget"] if k.startswith("hpsgd"))
    at = b["mean_accuracy_at_budget"]
    return (f"on resnet18 with injected compute ({t['compute_ms']} ms, ssgd's measured exchange wait), median "
            f"samples/s over ssgd's ({runs} repeats): {ratios}; at a fixed wall-clock budget with a straggler, "
            f"{hp} {f3(at[hp])} against ssgd's {f3(at['ssgd'])} (`overlap_*.json`, commit "
            f"{_commit('overlap_throughput.json')})")


def bench_scaling():
    r = record("scaling_scaling.json")
    words = []
    for workers, times in r["time_to_target"].items():
        words.append(f"{workers} workers " + ", ".join(
            f"{a} {t['mean']:.2f} s" if t["mean"] is not None else f"{a} never" for a, t in times.items()))
    return (f"mean seconds to {r['target']} test accuracy over {len(r['seeds'])} seeds: " + "; ".join(words)
            + f" (`scaling_scaling.json`, commit {_commit('scaling_scaling.json')})")


def one_commit_column():
    name = "convergence_cnn8_one_commit.json"
    table = record(name)["table"]["cnn-8"]
    cells = ", ".join(f"{algo} {f3(cell['mean_final_test_accuracy'])}" for algo, cell in table["algorithms"].items()
                      if algo != "ssgd")
    assert all(cell["passes"] and not cell["diverged"] for cell in table["algorithms"].values())  # "every one passes"
    return f"ssgd {f3(table['ssgd_mean'])}, target {f3(table['target'])}): {cells}; every one passes and no run diverged"


# the defaults table of docs/guide.md: one claim per row that quotes a figure
def default_push_rate():
    return (f"dc-asgd ended at {f3(mean('convergence_before.json', 'dc-asgd', 'cnn-4'))} with "
            f"{diverged('convergence_before.json', 'dc-asgd')} runs diverged on the CNN at 4 "
            f"workers (`convergence_before.json`, digits, {seeds('convergence_before.json', 'dc-asgd', 'cnn-4')})")


def default_push_clip():
    r = record("replay_study_push_clip.json")
    acc = r["mean_final_test_accuracy"]
    return (f"five real dc-asgd runs at {r['workers']} workers ended at {f3(acc['real'])} with it, their orders "
            f"replayed without it at {f3(acc['replay --push-clip 0'])} (`replay_study_push_clip.json`, digits "
            f"{r['model'].upper()}, seeds {r['seeds'][0]}-{r['seeds'][-1]})")


def default_server_lookahead():
    return (f"dc-asgd at 8 workers went from {f3(mean('convergence.json', 'dc-asgd'))} (`convergence.json`) to "
            f"{f3(mean('convergence_lookahead.json', 'dc-asgd'))} (`convergence_lookahead.json`; digits CNN, "
            f"{seeds('convergence_lookahead.json', 'dc-asgd')})")


def default_worker_lookahead():
    on, off = "convergence_worker_lookahead_cnn8.json", "convergence_worker_lookahead_off_cnn8.json"
    return (f"at 8 workers asgd {f3(mean(on, 'asgd'))} with it and {f3(mean(off, 'asgd'))} without, dbs-asgd "
            f"{f3(mean(on, 'dbs-asgd'))} and {f3(mean(off, 'dbs-asgd'))} (`{on}`, `{off}`; digits CNN, "
            f"{seeds(on, 'asgd')})")


def default_momentum():
    return (f"softsync {f3(mean('convergence_before.json', 'softsync', 'cnn-4'))} with "
            f"{diverged('convergence_before.json', 'softsync')} runs diverged: "
            f"`convergence_before.json`, digits CNN at 4 workers, {seeds('convergence_before.json', 'softsync', 'cnn-4')}")


def default_lc_lam():
    name = "convergence_lc_dc_defaults.json"
    return (f"lc-asgd at 8 workers ended at {f3(mean(name, 'lc-asgd'))} against ssgd's {f3(mean(name, 'ssgd'))} "
            f"(`{name}`, digits CNN, {seeds(name, 'lc-asgd')})")


def _two_records(algo, first, first_label, second, second_label):
    """One algorithm at 8 workers in two records, each with what it ran."""
    return (f"at 8 workers {f3(mean(first, algo))} with {first_label} (`{first}`) and {f3(mean(second, algo))} with "
            f"{second_label} (`{second}`; digits CNN, {seeds(second, algo)})")


def default_easgd_tau():
    return _two_records("easgd", "convergence_cnn8_easgd_tau4.json", "`tau=4`", "convergence_cnn8_easgd_tau1.json", "1")


def default_gossip():
    return _two_records("gossip", "convergence_cnn8_lc_gossip.json", "push-sum", "convergence_cnn8.json", "pull")


def default_compensate():
    unc, alw = "convergence_dc_compensate.json", "convergence_cnn8_dc_always.json"
    return (f"`uncovered` ended at {f3(mean(unc, 'dc-asgd'))} and `always` at {f3(mean(alw, 'dc-asgd'))} at 8 "
            f"workers (`{unc}`, `{alw}`; digits CNN, {seeds(alw, 'dc-asgd')})")


def default_odsgd():
    name = "convergence_before.json"
    return (f"od-sgd {f3(mean(name, 'od-sgd', 'cnn-4'))} against ssgd's {f3(mean(name, 'ssgd', 'cnn-4'))}, digits "
            f"CNN at 4 workers, {seeds(name, 'od-sgd', 'cnn-4')}")


def bench_atomic_reads():
    """What a read MPI defines beside concurrent accumulates costs across hosts, per size."""
    name = "rma_atomic_reads_netns.json"
    r = record(name)
    sizes = "; ".join(f"{row['bytes'] // 1024 if row['bytes'] < 1 << 20 else row['bytes'] >> 20} "
                      f"{'KB' if row['bytes'] < 1 << 20 else 'MB'} {f2(row['atomic_over_raw'])} "
                      f"({f2(row['atomic_over_raw_min'])} to {f2(row['atomic_over_raw_max'])})" for row in r["rows"])
    return (f"raw `Accumulate` + `Get_accumulate(NO_OP)` over raw `Accumulate` + `Get`, median of {r['blocks']} "
            f"alternating blocks per size, each with its blocks' range, {r['workers']} workers and "
            f"{r['servers']} server on the three netns hosts (`{name}`, commit {r['provenance']['commit'][:7]}): "
            f"{sizes}")


# --- protocol v2 (benchmarks/protocol_v2.md): a cell is quoted once all its runs are in -------------------

def _v2_cell(workers: int, kind: str):
    """(the cell's table entry, or None while the record is missing or short of 5 seeds for any
    algorithm; the record's name)."""
    name = f"convergence_fmnist_v2_{workers}_{kind}.json"
    if not os.path.exists(os.path.join(RESULTS, name)):
        return None, name
    entry = record(name)["table"][f"fmnist-v2-{workers}-{kind}"]
    complete = all(len(row["seeds"]) == 5 for row in entry["algorithms"].values())
    return (entry if complete else None), name


def _verdict(entry) -> str:
    """A v2 cell's (b1) or (b2) verdict in words; where it was not judged because the cell is CPU-bound,
    by how much."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "study"))
    from convergence import CPU_BOUND

    verdict = {True: "passed", False: "failed", None: "was not judged"}[entry["passes"]]
    if entry["passes"] is None and entry["cpu_bound"]:
        verdict += (f": the cell is CPU-bound (a worker's training thread waited for a core "
                    f"{100 * entry['max_core_wait']:.1f}% of its training time, the protocol's bound being "
                    f"{100 * CPU_BOUND:g}%), so its times are the 2 cores', not the emulated devices'")
    return verdict


def _v2_cells(kind: str) -> list:
    """Each complete cell of ``kind`` ("steady" or "transient"): its workers, the fastest asynchronous
    algorithm (``best``), its median seconds, whether it passed (a), the baselines' medians as the
    criterion read them (for (b2) the fastest synchronous baseline alone, a seed that never reached the
    target counting as never, which the per-algorithm median column does not), the verdict, the record."""
    cells = []
    for workers in (4, 8):
        entry, name = _v2_cell(workers, kind)
        if entry is not None:
            cells.append(dict(workers=workers, best=entry["best"], best_t=entry["best_median"],
                              accurate=entry["algorithms"][entry["best"]]["passes"], verdict=_verdict(entry),
                              against={a: v["median"] for a, v in entry["against"].items()}, name=name))
    return cells


def _records(cells) -> str:
    return ", ".join(f"`{c['name']}`" for c in cells)


def readme_transient():
    cells = _v2_cells("transient")
    said = "; ".join(f"at {c['workers']} workers {c['best']}{'' if c['accurate'] else ' (which failed criterion (a))'} "
                     f"reached it {t / c['best_t']:.2f}x sooner than {sync}, the fastest synchronous baseline "
                     f"({c['best_t']:.1f} s against {t:.1f} s, medians): (b2) {c['verdict']}"
                     for c in cells for sync, t in c["against"].items())
    return (f"With every worker's device time drawn at random each step (Pareto, tail index 3, mean 80 ms of "
            f"emulated accelerator time; Fashion-MNIST, LeNet, one epoch, seeds 201-205), the protocol asked the "
            f"fastest asynchronous algorithm to reach ssgd's accuracy minus 1 point 1.3x sooner than the fastest "
            f"synchronous baseline: {said} ({_records(cells)})")


def _seconds(t) -> str:
    """A median time to target in a sentence: "12.3 s", or "never"."""
    return "never" if t is None else f"{t:.1f} s"


def readme_steady():
    cells = _v2_cells("steady")
    said = "; ".join(f"at {c['workers']} workers {c['best']}{'' if c['accurate'] else ' (which failed criterion (a))'} "
                     f"took {_seconds(c['best_t'])}, against ssgd's {_seconds(c['against']['ssgd'])}, lb-sgd's "
                     f"{_seconds(c['against']['lb-sgd'])} and ssgd-loo's {_seconds(c['against']['ssgd-loo'])} "
                     f"(medians): (b1) {c['verdict']}" for c in cells)
    return (f"With worker 0's device time 3x the others' for the whole run (80 ms of emulated accelerator "
            f"time; Fashion-MNIST, LeNet, one epoch, seeds 201-205), the protocol asked the fastest asynchronous "
            f"algorithm to reach ssgd's accuracy minus 1 point in at most half of ssgd's time and within 1.1x of "
            f"lb-sgd's and of ssgd on the other workers alone (ssgd-loo): {said} ({_records(cells)})")


def _v2_page():
    """scripts/gen_fmnist_doc.py, which names the v2 cells and their records and judges the simulator's
    agreement (the generated page's rules, read here rather than written again)."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "study"))
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import gen_fmnist_doc

    return gen_fmnist_doc


def readme_v2_pending():
    """The v2 real cells whose records are not complete yet, by setting name."""
    page, pending = _v2_page(), []
    for setting in page.V2_CELLS:
        name = page.v2_record(setting)
        if os.path.exists(os.path.join(RESULTS, name)):
            rows = record(name)["table"][setting]["algorithms"].values()
            if all(len(row["seeds"]) == 5 for row in rows):
                continue
        pending.append(f"`{setting}`")
    if pending:
        return f"The second grid's cells still to run: {', '.join(pending)}"
    return "All of the second grid's real cells have run: " + _v2_criterion_a()


def guide_simulator_agreement():
    """Where protocol v2's simulator agreed with the real runs (the generated page's rule)."""
    page = _v2_page()
    real = {cell: record(page.v2_record(cell))["table"][cell] for cell in page.V2_CELLS}
    found = page.agreeing(real, record(page.V2_AGREEMENT)["table"])
    words = "; ".join(f"{', '.join(found.get(kind, [])) or 'no algorithm'} with {name}"
                      for kind, name in page.SETTING_NAMES.items())
    return ("Against real runs (protocol v2's agreement part: Fashion-MNIST, LeNet, emulated accelerators, 4 "
            "and 8 workers, seeds 201-205), its median time to target was within 15% of the real one at both "
            f"sizes for {words} (`convergence_fmnist_v2_sim_agreement.json`)")


def guide_simulator_extrapolation():
    """Protocol v2's simulated cells at 16, 32 and 64 workers, as the generated page reports them (over
    the algorithms the simulator agreed on), and ssgd's own accuracy after the one epoch."""
    page = _v2_page()
    real = {cell: record(page.v2_record(cell))["table"][cell] for cell in page.V2_CELLS}
    found = page.agreeing(real, record(page.V2_AGREEMENT)["table"])
    table = record(page.V2_EXTRAPOLATION)["table"]
    said = []
    for kind, what in (("-transient", "transient stragglers"), ("-steady", "a steady straggler")):
        cells = []
        for workers in (16, 32, 64):
            cell = f"fmnist-v2-{workers}{kind}"
            entry = page.extrapolated(cell, table[cell], set(found.get(kind, ())))
            verdict = {True: "passed", False: "failed", None: "not judged"}[entry["passes"]]
            if entry.get("unagreed"):
                verdict += f" ({', '.join(entry['unagreed'])} not shown to agree)"
            against = ", ".join(f"{a} {_seconds(v['median'])}" for a, v in entry["against"].items())
            cells.append(f"at {workers} {entry['best']} {_seconds(entry['best_median'])} against {against}: "
                         f"({entry['criterion']}) {verdict}")
        said.append(f"with {what}, " + "; ".join(cells))
    accuracy = ", ".join(f"{100 * table[f'fmnist-v2-{w}']['ssgd_mean']:.2f}% at {w}" for w in (16, 32, 64))
    return ("At 16, 32 and 64 workers (protocol v2's extrapolation, one epoch a run, seeds 201-205, over the "
            "algorithms that agreed), the fastest asynchronous algorithm's median time to target was, "
            + "; and ".join(said) + f". One epoch leaves ssgd's own accuracy at {accuracy} workers "
            "(the epoch's samples are shared by more workers, so it makes fewer of ssgd's steps as they grow), so "
            "these cells say little about accuracy (`convergence_fmnist_v2_sim.json`)")


def _v2_criterion_a() -> str:
    """Criterion (a) over the v2 real cells: the (setting, algorithm) pairs that fell short, with their
    mean and the target, or that none did."""
    page, short = _v2_page(), []
    for setting in page.V2_CELLS:
        table = record(page.v2_record(setting))["table"][setting]
        for algo, row in table["algorithms"].items():
            if not row["passes"]:
                short.append(f"{algo} in `{setting}` ({100 * row['mean_final_test_accuracy']:.2f}% against "
                             f"{100 * table['target']:.2f}%)")
    if not short:
        return "every algorithm reached ssgd's mean accuracy less a point (criterion (a)) in every cell"
    return ("every algorithm reached ssgd's mean accuracy less a point (criterion (a)) in every cell but "
            + "; ".join(short))


CLAIMS = [
    ("README.md", readme_v2_pending),
    ("README.md", readme_straggler), ("README.md", readme_steady), ("docs/guide.md", readme_steady), ("README.md", readme_ci_time), ("README.md", readme_seeds),
    ("README.md", setup_time), ("README.md", readme_transient), ("docs/guide.md", readme_transient),
    ("docs/guide.md", guide_setup_time), ("docs/guide.md", guide_ci_times), ("docs/guide.md", guide_simulator_agreement),
    ("docs/guide.md", guide_simulator_extrapolation),
    ("docs/guide.md", guide_second_setup), ("docs/guide.md", guide_gpu_build), ("docs/guide.md", simulator_study),
    ("docs/guide.md", rule_samples_per_second), ("docs/guide.md", rule_compensation), ("docs/guide.md", rule_odsgd),
    ("docs/guide.md", bench_straggler), ("docs/guide.md", bench_compensation), ("docs/guide.md", bench_overlap),
    ("docs/guide.md", study_verdicts), ("docs/guide.md", bench_compensation_commit), ("docs/guide.md", bench_hetero),
    ("docs/guide.md", bench_overlap_speed), ("docs/guide.md", bench_scaling),
    ("docs/guide.md", one_commit_column),
    ("docs/guide.md", default_push_rate), ("docs/guide.md", default_push_clip),
    ("docs/guide.md", default_server_lookahead), ("docs/guide.md", default_worker_lookahead),
    ("docs/guide.md", default_momentum), ("docs/guide.md", default_lc_lam), ("docs/guide.md", default_easgd_tau),
    ("docs/guide.md", default_gossip), ("docs/guide.md", default_compensate), ("docs/guide.md", default_odsgd),
    ("docs/guide.md", bench_atomic_reads),
]


def _situation_row(situation: str) -> str:
    rows = [line for line in read("README.md").splitlines() if line.startswith(f"| {situation}")]
    assert len(rows) == 1, situation
    return rows[0].split("|")[2]


@pytest.mark.parametrize("kind,situation", [("transient", "slowness that moves"),
                                            ("steady", "one node slow for good")])
def test_the_situation_row_names_what_won_its_cells(kind, situation):
    """The README's row for a kind of straggler names, among the asynchronous algorithms it advises,
    the fastest of every complete v2 cell of that kind where it also passed (a) and the criterion; and
    as the way to stay synchronous, the fastest synchronous baseline of those cells (leaving the slow
    node out, where ssgd-loo was that)."""
    advice = _situation_row(situation)
    asynchronous = advice.split(";")[0]
    synchronous = advice.split(";")[1] if ";" in advice else ""
    for workers in (4, 8):
        entry, name = _v2_cell(workers, kind)
        if entry is None or entry["passes"] is None:
            continue
        best = entry["best"]
        if entry["passes"] and entry["algorithms"][best]["passes"]:
            assert f"`{best}`" in asynchronous, (name, best, advice)
        baselines = {a: v["median"] for a, v in entry["against"].items() if a != "ssgd" or kind == "transient"}
        fastest = min(baselines, key=lambda a: baselines[a] if baselines[a] is not None else float("inf"))
        said = "leave the slow node out" if fastest == "ssgd-loo" else f"`{fastest}`"
        assert said in synchronous, (name, fastest, advice)


@pytest.mark.parametrize("doc,claim", CLAIMS, ids=[f"{d.split('/')[-1]}:{c.__name__}" for d, c in CLAIMS])
def test_the_document_quotes_its_record(doc, claim):
    text = claim()
    assert flat(text) in flat(read(doc)), f"{doc} must say, as its record gives it:\n  {text}"


# --- convergence tables: each row generated from its record ------------------------------------------------

def _cell(cell, mark_diverged=False) -> str:
    final = cell["final_test_accuracy"]
    text = f"{f3(cell['mean_final_test_accuracy'])} [{f3(min(final))}-{f3(max(final))}]"
    if mark_diverged and cell["diverged"]:
        return f"{text}, {cell['diverged']} diverged"
    return f"**{text}**" if cell["passes"] else text


def _algorithms(name: str, setting: str) -> dict:
    return record(name)["table"][setting]["algorithms"]


def _rows(columns, extra=None) -> list:
    """The rows of a table whose columns are (record, setting) cells, for each algorithm of the
    first column's record, those in every column; ``extra``: "points" (the gap to ssgd, in points)
    or "diverged" (a cell says how many runs diverged, not in bold)."""
    first = _algorithms(*columns[0])
    rows = []
    for algo in first:
        cells = [_algorithms(*column).get(algo) for column in columns]
        if None in cells:
            continue
        texts = [_cell(cell, mark_diverged=extra == "diverged") for cell in cells]
        if extra == "points":
            texts.append(f"{100 * cells[0]['gap_to_ssgd']:+.1f}")
        rows.append(f"| {algo} | " + " | ".join(texts) + " |")
    return rows


FOUR = ("mlp-4", "cnn-4", "cnn-8", "cnn-4-straggler")
TABLES = {
    "convergence.json (35d9876)": ([("convergence.json", s) for s in FOUR], None),
    "convergence_lookahead.json": ([("convergence_lookahead.json", s) for s in FOUR], None),
    "convergence_cnn8.json": ([("convergence_cnn8.json", "cnn-8")], "points"),
    "the workers' look-ahead": ([("convergence_worker_lookahead_cnn8.json", "cnn-8"),
                                 ("convergence_worker_lookahead_off_cnn8.json", "cnn-8")], None),
    "convergence_4workers.json": ([("convergence_4workers.json", s) for s in ("mlp-4", "cnn-4", "cnn-4-straggler")],
                                  None),
    "convergence_lc_dc_defaults.json": ([("convergence_lc_dc_defaults.json", s) for s in FOUR], None),
    "convergence_before.json": ([("convergence_before.json", "cnn-4")], "diverged"),
}


@pytest.mark.parametrize("table", TABLES)
def test_the_guides_convergence_tables_are_their_records(table):
    columns, extra = TABLES[table]
    guide = read("docs/guide.md")
    rows = _rows(columns, extra)
    assert len(rows) >= 2, rows
    missing = [row for row in rows if row not in guide]
    assert not missing, f"docs/guide.md's table from {table} must have the rows\n  " + "\n  ".join(missing)


# --- no figure outside a checked claim ---------------------------------------------------------------------

NUMBER = re.compile(r"(?<![\w.,-])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)*)(?![\w.,]\d)")
# what is not a measurement: the job's settings, versions, dates, sizes of the data, counts of workers,
# seeds and processes, and the README's stated thresholds (which tests/unit/test_readme.py runs)
# and the option values the defaults table names (push_clip's 1.5, the constant lam 0.04)
ALLOWED = re.compile(r"^(?:0\.1|0\.9|0\.04|1\.5|0\.28\.1|2\.1|4\.1|17|1|2|3|4|5|8|10|11|12|15|20|32|64|101|105|150|1,797|2019|2026)$")


def _uncovered(text: str, claims) -> list:
    text = flat(re.sub(r"```.*?```", "", text, flags=re.S))  # commands and code: tests/unit/test_readme.py runs them
    for claim in claims:
        text = text.replace(flat(claim()), "")
    text = re.sub(r"`[^`]*`", "", text)  # names, flags and file names
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"\b[0-9a-f]{7}\b|\d{4}-\d{2}-\d{2}|\d+-\d+|\d+x\d+", "", text)  # commits, dates, ranges, 8x8
    found = []
    for match in NUMBER.finditer(text):
        number = match.group(0).lstrip("+-")
        if not ALLOWED.match(number):
            found.append(text[max(0, match.start() - 40):match.end() + 20])
    return found


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def test_every_figure_in_the_readme_is_a_checked_claim():
    claims = [c for d, c in CLAIMS if d == "README.md"]
    found = _uncovered(read("README.md"), claims)
    assert not found, "figures in README.md that no claim of this test generates:\n" + "\n".join(found)


@pytest.mark.parametrize("heading", ["Choosing an algorithm", "Defaults and where they depart from the papers"])
def test_every_figure_in_the_guides_advice_is_a_checked_claim(heading):
    claims = [c for d, c in CLAIMS if d == "docs/guide.md"]
    found = _uncovered(_section(read("docs/guide.md"), heading), claims)
    assert not found, f"figures in the guide's '{heading}' that no claim generates:\n" + "\n".join(found)
