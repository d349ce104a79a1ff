"""A new algorithm takes four places (issue 60): its module, its registry row, its preset and its guide
section. This test adds a throw-away algorithm in exactly those four places, in a copy of the checkout,
regenerates the page derived from the parsers (docs/cli.md and the guide's option tables, by
``scripts/gen_cli_docs.py``), and runs there what goes through every algorithm: the registry's,
architecture, configuration, preset, CLI and docs tests (the parametrized ones for the new algorithm
alone), one epoch of it under mpirun from its preset, and a simulated run. A list of names, a count of
algorithms or a page that has to be edited by hand for a new algorithm fails one of them."""
import os
import shutil
import subprocess
import sys

from procs import ROOT, run

NAME = "toy-asgd"

MODULE = '''"""toy-asgd: asgd under another name with one option of its own (tests/test_four_places.py's)."""
from dataclasses import dataclass

from ..options import option
from .asgd import ASGDAlgorithm, ASGDOptions


@dataclass
class ToyASGDOptions(ASGDOptions):
    toy_knob: int = option(1, "a throw-away option (changes nothing)", flag="--toy-knob")

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.toy_knob, int) and self.toy_knob >= 1):
            raise ValueError(f"toy_knob must be an integer >= 1, got {self.toy_knob!r}")


class ToyASGDAlgorithm(ASGDAlgorithm):
    """asgd's strategy and windows, its own options."""

    Options = ToyASGDOptions
'''

ROW = '''    AlgorithmInfo("toy-asgd", "asgd under another name (a test's throw-away algorithm)",
                  "none", True, "hvd_async.algorithms.toy:ToyASGDAlgorithm"),
'''

PRESET = '''# toy-asgd: asgd under another name (tests/test_four_places.py)
# When to use: never; a test's throw-away algorithm.
algo: toy-asgd
np: 3
servers: 1
dataset: digits
model: mlp
epochs: 1
lr: 0.1                   # ours
toy-knob: 1               # ours (its default)
'''

SECTION = '''### `toy-asgd`
asgd under another name, with one option that changes nothing: the throw-away algorithm of
`tests/test_four_places.py`.

<!-- options: toy-asgd -->
<!-- /options -->

'''


def _copy_checkout(dest: str) -> None:
    """The checkout's tracked files as they are now (links kept)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src, dst = os.path.join(ROOT, rel), os.path.join(dest, rel)
        if not os.path.lexists(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            shutil.copy2(src, dst)


def _edit(path: str, before: str, text: str) -> None:
    """Insert ``text`` before the first line that starts with ``before``."""
    with open(path) as f:
        lines = f.readlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(before))
    with open(path, "w") as f:
        f.writelines(lines[:at] + [text] + lines[at:])


def test_a_new_algorithm_takes_four_places(tmp_path):
    copy = str(tmp_path / "checkout")
    _copy_checkout(copy)
    # 1. its module
    with open(os.path.join(copy, "hvd_async", "algorithms", "toy.py"), "w") as f:
        f.write(MODULE)
    # 2. its registry row, the last of the built-in ones
    registry_py = os.path.join(copy, "hvd_async", "registry.py")
    text = open(registry_py).read()
    end = text.index("\n)\n", text.index("_ROWS = ("))
    with open(registry_py, "w") as f:
        f.write(text[:end + 1] + ROW + text[end + 1:])
    # 3. its preset (launch/presets links to the packaged ones)
    with open(os.path.join(copy, "hvd_async", "presets", f"{NAME}.yaml"), "w") as f:
        f.write(PRESET)
    # 4. its guide section, after the last algorithm's
    _edit(os.path.join(copy, "docs", "guide.md"), "## What is built and how it is tested", SECTION)

    env = {"PYTHONPATH": copy}  # this copy's hvd_async, ahead of the installed checkout
    generated = run([sys.executable, os.path.join("scripts", "gen_cli_docs.py")], cwd=copy, env=env, timeout=120)
    assert generated.returncode == 0, generated.out
    assert "--toy-knob" in open(os.path.join(copy, "docs", "cli.md")).read()  # derived, not written

    tests = ["tests/unit/test_rules_registry.py::test_registry_names_every_algorithm_once",
             "tests/unit/test_rules_registry.py::test_every_algorithm_imports",
             "tests/unit/test_architecture.py",
             "tests/unit/test_config.py::test_every_preset_is_valid",
             "tests/unit/test_config.py::test_another_algorithms_option_is_refused_only_where_given",
             "tests/unit/test_config.py::test_help_texts_take_their_lists_of_algorithms_from_the_registry",
             "tests/unit/test_guide_example.py::test_cli_reference_is_up_to_date",
             "tests/unit/test_guide_example.py::test_guide_links_and_images_exist",
             "tests/unit/test_readme.py::test_the_registry_listing",
             "tests/unit/test_readme.py::test_the_situation_table_names_registered_algorithms_with_their_servers",
             "tests/test_cli.py::test_help_texts",
             "tests/test_presets.py::test_one_preset_per_algorithm",
             f"tests/test_presets.py::test_preset_parses_validates_and_cites_its_values[{NAME}]",
             f"tests/test_presets.py::test_preset_holds_the_declared_defaults[{NAME}]",
             f"tests/test_presets.py::test_preset_trains_on_digits[{NAME}]"]
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=copy, env=env,
                 timeout=600)
    assert result.returncode == 0, result.out[-6000:]
    summary = result.out.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary  # (a skip is no pass)

    simulated = run([sys.executable, "-m", "hvd_async.job.cli", "simulate", "--algo", NAME, "--workers", "3",
                     "--epochs", "1", "--toy-knob", "2"], cwd=copy, env=env, timeout=300)
    assert simulated.returncode == 0 and "accuracy" in simulated.out, simulated.out[-3000:]

