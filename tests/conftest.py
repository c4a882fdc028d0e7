"""Shared pytest set-up for the controller-side suite (runs in .venv, Python >= 3.12)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Test helpers (labctl, ...) import as plain modules.
sys.path.insert(0, str(REPO / "tests" / "support"))


def pytest_configure() -> None:
    # Every ansible/molecule/ansible-lint call made by a test uses the project's venv and config.
    venv_bin = REPO / ".venv" / "bin"
    os.environ["PATH"] = f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    os.environ.setdefault("ANSIBLE_NOCOLOR", "1")
    os.environ.setdefault("ANSIBLE_FORCE_COLOR", "0")
    # The lab hosts' compile cache for the Pythons the tests start, the controller's module runs above all
    # (tests/support/controller_site/sitecustomize.py); kept in this checkout, never in the machine's /var/cache.
    site = REPO / "tests" / "support" / "controller_site"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("PIVOT_LAB_PYC_CACHE", str(REPO / ".cache" / "controller-pyc"))
