"""docs/results_fmnist.md is generated from the Fashion-MNIST grid's records, and every record of
the grid comes from one clean commit after benchmarks/protocol.md's (the pre-registration)."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
GRID = ("convergence_fmnist.json", "convergence_fmnist_straggler.json")
PROTOCOL_SEEDS = {101, 102, 103, 104, 105}


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def test_the_page_is_what_the_records_give():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_fmnist_doc.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_grid_ran_after_its_protocol_at_one_clean_commit_on_its_seeds():
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        return  # an sdist: no history to check against
    protocol = git("log", "--diff-filter=A", "--format=%H", "--", "benchmarks/protocol.md").splitlines()[-1]
    commits = set()
    for name in GRID:
        path = os.path.join(RESULTS, name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            record = json.load(f)
        prov = record["provenance"]
        assert prov["tree_clean"], name
        assert prov["commit"] != protocol, f"{name}: the grid must run at a commit after the protocol's"
        follows = subprocess.run(["git", "merge-base", "--is-ancestor", protocol, prov["commit"]], cwd=ROOT)
        assert follows.returncode == 0, f"{name}: commit {prov['commit'][:10]} does not follow the protocol's {protocol[:10]}"
        assert {r["seed"] for r in record["runs"]} <= PROTOCOL_SEEDS, name
        commits.add(prov["commit"])
    assert len(commits) <= 1, f"the grid's records come from more than one commit: {sorted(commits)}"


V2_SEEDS = {201, 202, 203, 204, 205}


def test_the_second_grid_ran_after_its_protocol_at_one_clean_commit_on_its_seeds():
    """benchmarks/protocol_v2.md's real records (convergence_fmnist_v2_*.json, the simulator's
    ..._sim_*.json aside): each part at a clean commit after the protocol's last change (it was
    amended before any run), all parts at one commit, only the protocol's fresh seeds."""
    if not os.path.isdir(os.path.join(ROOT, ".git")):
        return
    added = git("log", "-1", "--format=%H", "--", "benchmarks/protocol_v2.md").splitlines()
    names = sorted(n for n in os.listdir(RESULTS)
                   if n.startswith("convergence_fmnist_v2_") and n.endswith(".json") and "_sim" not in n)
    if not added:
        assert not names, f"{names}: v2 records without a committed benchmarks/protocol_v2.md"
        return
    protocol, commits = added[-1], set()
    for name in names:
        with open(os.path.join(RESULTS, name)) as f:
            record = json.load(f)
        for part in record.get("parts", []) + [record["provenance"]]:
            assert part["tree_clean"], name
            assert part["commit"] != protocol, f"{name}: the grid must run at a commit after the protocol's"
            follows = subprocess.run(["git", "merge-base", "--is-ancestor", protocol, part["commit"]], cwd=ROOT)
            assert follows.returncode == 0, f"{name}: commit {part['commit'][:10]} does not follow {protocol[:10]}"
            commits.add(part["commit"])
        assert {r["seed"] for r in record["runs"]} <= V2_SEEDS, name
    assert len(commits) <= 1, f"the second grid's records come from more than one commit: {sorted(commits)}"


def _row(seconds):
    return {"seconds_to_target": seconds, "cpu_utilisation": [None] * len(seconds), "core_wait": [],
            "seeds": list(range(201, 201 + len(seconds)))}


def test_the_extrapolation_judges_only_what_the_simulator_agreed_on():
    """protocol v2: the simulator's 16-64-worker cells are reported for the agreeing (setting,
    algorithm) pairs only; a cell's criterion is taken over them, and not judged where a baseline it
    names did not agree."""
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    from gen_fmnist_doc import extrapolated, v2_table

    rows = {"ssgd": _row([30.0] * 5), "lb-sgd": _row([12.0] * 5), "ssgd-loo": _row([11.0] * 5),
            "asgd": _row([10.0] * 5), "lc-asgd": _row([5.0] * 5)}
    cell = {"algorithms": rows}
    judged = extrapolated("fmnist-v2-16-steady", cell, {"ssgd", "lb-sgd", "ssgd-loo", "asgd"})
    assert judged["best"] == "asgd" and judged["passes"] is True  # lc-asgd, faster, did not agree
    unjudged = extrapolated("fmnist-v2-16-steady", cell, {"ssgd", "ssgd-loo", "asgd", "lc-asgd"})
    assert unjudged["passes"] is None and unjudged["unagreed"] == ["lb-sgd"]
    assert unjudged["against"]["lb-sgd"]["median"] == 12.0  # the baseline's median as run, shown
    transient = extrapolated("fmnist-v2-32-transient", {"algorithms": {
        "ssgd": _row([20.0] * 5), "backup-sgd": _row([16.0] * 5), "lb-sgd": _row([18.0] * 5),
        "asgd": _row([13.0] * 5)}}, {"ssgd", "backup-sgd", "lb-sgd", "asgd"})
    assert transient["criterion"] == "b2" and transient["passes"] is False  # 13 > 16 / 1.3
    for row in rows.values():
        row.update(final_test_accuracy=[0.75] * 5, mean_final_test_accuracy=0.75, gap_to_ssgd=0.0, diverged=0,
                   passes=True)
    table = "\n".join(v2_table("fmnist-v2-16-steady", {**unjudged, "ssgd_mean": 0.75, "target": 0.74},
                               {"ssgd", "ssgd-loo", "asgd", "lc-asgd"}))
    assert "| lb-sgd | not shown to agree |" in table and "not claimed" in table
    assert "not judged: the simulator was not shown to agree on lb-sgd" in table
