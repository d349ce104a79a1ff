"""benchmarks/ keeps its scripts in folders by what they measure (speed/, study/, faults/, device/),
beside the one module they share (common.py) and their records (results/): no script sits directly in
benchmarks/ again, and each one puts benchmarks/ on sys.path so that ``from common import ...`` works
however it is run or imported."""
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(ROOT, "benchmarks")
GROUPS = ("speed", "study", "faults", "device")
FINDS_COMMON = "sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))"


def test_no_script_sits_directly_in_benchmarks():
    loose = sorted(name for name in os.listdir(BENCHMARKS) if name.endswith(".py") and name != "common.py")
    assert not loose, f"{loose}: put each benchmark in one of benchmarks/{{{','.join(GROUPS)}}}/"


def test_every_grouped_script_finds_common():
    scripts = sorted(glob.glob(os.path.join(BENCHMARKS, "*", "*.py")))
    assert {os.path.basename(os.path.dirname(p)) for p in scripts} == set(GROUPS), scripts
    missing = []
    for path in scripts:
        with open(path) as f:
            if FINDS_COMMON not in f.read():
                missing.append(os.path.relpath(path, ROOT))
    assert not missing, f"{missing}: put benchmarks/ on sys.path as the other scripts do ({FINDS_COMMON})"
