"""docs/: the guide's complete example is examples/guide_example.py word for word and runs under
mpirun; docs/cli.md is what scripts/gen_cli_docs.py makes of the parsers today; the guide's links
and images exist."""
import os
import re
import subprocess
import sys

from procs import ROOT, mpirun, python

GUIDE = os.path.join(ROOT, "docs", "guide.md")


def _guide() -> str:
    with open(GUIDE) as f:
        return f.read()


def test_guide_embeds_the_example_verbatim():
    with open(os.path.join(ROOT, "examples", "guide_example.py")) as f:
        example = f.read()
    blocks = re.findall(r"```python\n(.*?)```", _guide(), re.S)
    assert example in blocks, "docs/guide.md must hold examples/guide_example.py verbatim in a python block"


def test_guide_example_runs_with_a_parameter_server():
    result = mpirun(3, python("examples/guide_example.py", "--algo", "dc-asgd", "--epochs", "10"), timeout=240)
    assert result.returncode == 0, result.out[-4000:]
    found = dict(re.findall(r"worker (\d) of 2: dc-asgd test accuracy ([0-9.]+)", result.out))
    assert sorted(found) == ["0", "1"], result.out[-2000:]
    # opt.load_global_model() left the same global weights on both workers: the same accuracy
    assert len(set(found.values())) == 1 and float(found["0"]) > 0.8, found


def test_cli_reference_is_up_to_date():
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_cli_docs.py"), "--check"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_guide_links_and_images_exist():
    text = _guide()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the guide links nothing?"
    missing = [t for t in local if t != "results.md"  # docs/results.md: the reproduction study's page
               and not os.path.exists(os.path.normpath(os.path.join(ROOT, "docs", t)))]
    assert not missing, missing
    assert "results.md" in local
    for algo in __import__("hvd_async").registry.names():  # every algorithm has its section
        assert re.search(rf"^### `?{re.escape(algo)}`?\b", text, re.M), algo


def test_the_fault_matrix_in_reliability_md_is_the_records():
    """docs/reliability.md's fault matrix is generated from benchmarks/results/faults*.json."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_faults_doc.py"), "--check"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_server_capacity_table_in_the_guide_is_its_record():
    """docs/guide.md's server capacity table is generated from benchmarks/results/push_bandwidth.json."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_capacity_doc.py"), "--check"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
