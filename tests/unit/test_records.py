"""The benchmark records in benchmarks/results/ can be tied to the code (issues 19 and 20): every record
has a ``provenance`` block naming a commit that exists in the history, written from a clean tree,
with the machine, the versions and the command; and bench_check's flag rule flags a ratio that fell
below the committed record's spread, and only then."""
import glob
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "speed"))

import bench_check  # noqa: E402  (benchmarks/ is not a package)

PROVENANCE_KEYS = ("commit", "tree_clean", "machine", "versions", "command", "date_utc")


def _records():
    """Every JSON under benchmarks/results/ (subfolders too, e.g. the device runs'), by relative path."""
    out = {}
    for path in sorted(glob.glob(os.path.join(RESULTS, "**", "*.json"), recursive=True)):
        with open(path) as f:
            out[os.path.relpath(path, RESULTS)] = json.load(f)
    return out


RECORDS = _records()


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _commit_exists(sha) -> bool:
    return bool(sha) and _git("cat-file", "-e", f"{sha}^{{commit}}").returncode == 0


@pytest.fixture(scope="module")
def history():
    """The repository's history (skipped where there is none to look in, e.g. a copy without .git)."""
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("no git repository: the records' commits cannot be looked up")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("shallow clone: older commits are missing (git fetch --unshallow)")


def problems(name, record, commit_exists=_commit_exists) -> list:
    """What is wrong with one record's provenance (empty: nothing)."""
    if "provenance" not in record:
        return [f"{name}: no provenance block (write it through benchmarks/common.py save)"]
    prov, found = record["provenance"], []
    missing = [key for key in PROVENANCE_KEYS if key not in prov]
    if missing:
        return [f"{name}: provenance lacks {missing}"]
    if not commit_exists(prov["commit"]):
        found.append(f"{name}: commit {prov['commit']} is not in the history")
    if prov["tree_clean"] is not True:
        found.append(f"{name}: written from a dirty tree ({prov.get('dirty_files')}): commit, then rerun")
    if not (prov["machine"].get("cores_usable") and prov["machine"].get("cpu_model")):
        found.append(f"{name}: machine (cores, CPU model) missing")
    library = record.get("library")  # the study's simulated library (benchmarks/study/simjobs.py library_info)
    if library is not None and not (commit_exists(library.get("commit")) and library.get("library_modified") is False):
        found.append(f"{name}: library commit {library.get('commit')} unknown or modified at the run")
    return found


def test_records_exist():
    assert RECORDS, f"no records in {RESULTS}"


def test_every_record_has_provenance_with_a_known_commit_and_a_clean_tree(history):
    found = [p for name, record in RECORDS.items() for p in problems(name, record)]
    assert not found, "\n".join(found)


def test_commit_lookup_can_fail(history):
    """The lookup tells a missing commit from a present one."""
    assert _commit_exists(_git("rev-parse", "HEAD").stdout.strip())
    assert not _commit_exists("ba57d48" + "0" * 33)
    assert not _commit_exists(None)


def test_problems_catch_each_fault():
    """The record check fails on each fault, on a synthetic record (a commit lookup stands in for git)."""
    good = {"provenance": {"commit": "a" * 40, "tree_clean": True, "machine": {"cores_usable": 2, "cpu_model": "x"},
                           "versions": {}, "command": "python benchmarks/x.py", "date_utc": "2026-01-01T00:00:00"},
            "library": {"commit": "a" * 40, "library_modified": False}}
    known = {"a" * 40}.__contains__
    assert problems("new.json", good, known) == []
    assert problems("new.json", {}, known)
    for key, value in (("commit", "b" * 40), ("tree_clean", False), ("machine", {}), ("command", None)):
        bad = json.loads(json.dumps(good))
        if value is None:
            del bad["provenance"][key]
        else:
            bad["provenance"][key] = value
        assert problems("new.json", bad, known), key
    bad = dict(good, library={"commit": "a" * 40, "library_modified": True})
    assert problems("new.json", bad, known)


# --- bench_check's flag rule -------------------------------------------------------------------------------

COMMITTED = {"ratio_median": 0.985, "ratio_q1": 0.962, "ratio_q3": 1.013, "ratio_min": 0.903, "ratio_max": 1.103}


def _committed():
    return bench_check.ssgd_figures(COMMITTED)["ssgd ours/horovod"]


def test_flag_below_the_committed_min():
    assert bench_check.flag(0.75, _committed()) == "FLAG"
    assert bench_check.flag(0.902, _committed()) == "FLAG"


def test_low_between_min_and_lower_quartile():
    assert bench_check.flag(0.93, _committed()) == "low"


def test_no_flag_at_or_above_the_min():
    assert bench_check.flag(0.97, _committed()) == ""
    assert bench_check.flag(1.2, _committed()) == ""
    assert bench_check.flag(0.903, _committed()) == "low"  # at the min: not below it, so no flag


def test_record_without_spread_uses_the_tolerance():
    legacy = bench_check.Figure(0.9)
    assert bench_check.flag(0.80, legacy, tolerance=0.10) == "FLAG"
    assert bench_check.flag(0.82, legacy, tolerance=0.10) == ""


def test_nothing_to_compare_is_not_a_flag():
    assert bench_check.flag(None, _committed()) == ""
    assert bench_check.flag(0.5, None) == ""


def test_rows_mark_flag_and_miss():
    quick = dict(COMMITTED, ratio_median=0.80, ratio_min=0.7, ratio_q1=0.75, ratio_max=0.9)
    (row,) = bench_check.rows_for("ssgd", quick, COMMITTED, 0.10)
    assert row["marks"] == ["FLAG", "miss"] and row["committed"] == 0.985 and row["committed_at"] == "legacy"
    (row,) = bench_check.rows_for("ssgd", COMMITTED, COMMITTED, 0.10)
    assert row["marks"] == []
    (row,) = bench_check.rows_for("ssgd", quick, None, 0.10)
    assert row["marks"] == ["miss"] and row["committed_at"] == "no committed figure"


def test_rma_rows_read_each_size():
    record = {"mode": "shm", "rows": [{"bytes": 1024, "ratio": 0.2, "ratio_min": 0.1, "ratio_q1": 0.15,
                                        "ratio_max": 0.3},
                                       {"bytes": 1024 ** 2, "ratio": 0.96}, {"bytes": 4 * 1024 ** 2, "ratio": 0.5}]}
    rows = {r["ratio"]: r for r in bench_check.rows_for("rma-shm", record, record, 0.10)}
    assert rows["rma shm 1KB raw/ours"]["marks"] == ["miss"]  # target 1/3
    assert rows["rma shm 1MB raw/ours"]["marks"] == []
    assert rows["rma shm 4MB raw/ours"]["marks"] == ["miss"]


def test_the_fixed_budget_keeps_the_shorter_runs_last_epoch():
    """hpsgd against ssgd at a fixed time: the budget is the shorter run's end; that run's last epoch
    counts even though the curve's times are rounded (to 4 decimals) and the run's total is not."""
    sys.path.insert(0, os.path.join(ROOT, "benchmarks", "study"))
    from reproduce import CHANCE, score_at_budget

    short = {"status": "ok", "sim_seconds": 1.23456789, "curve": [(0.6173, 0.5, 0), (1.2346, 0.9, 0)]}
    long = {"status": "ok", "sim_seconds": 2.5, "curve": [(1.25, 0.8, 0), (2.5, 0.95, 0)]}
    score_at_budget([short, long])
    assert short["accuracy_at_budget"] == 0.9  # (a budget from the unrounded totals gave 0.5)
    assert long["accuracy_at_budget"] == CHANCE  # no epoch of the longer run ended by then
