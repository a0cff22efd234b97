# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""`trl.__version__`: TRL 1.16.0 with this fork's local label, so that version checks written for TRL accept it."""

import os
import subprocess
import sys

from packaging.specifiers import SpecifierSet
from packaging.version import Version

import trl


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_version_is_trl_1_16_with_a_local_label():
    version = Version(trl.__version__)
    assert version.public == "1.16.0" and version.local == "iterative.0.1"
    assert Version("1.16.0") < version < Version("1.16.1")  # above the release it follows, below the next one


def test_version_satisfies_the_minimums_downstream_libraries_ask_for():
    for minimum in (">=0.12", ">=0.19.1", ">=1.0", ">=1.16", "~=1.16"):
        assert SpecifierSet(minimum).contains(trl.__version__), minimum
    assert not SpecifierSet(">=1.17").contains(trl.__version__)


def test_the_package_metadata_has_the_same_version():
    done = subprocess.run(
        [sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == trl.__version__
