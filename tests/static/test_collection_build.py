"""`ansible-galaxy collection build` ships the product and nothing of the test equipment, and declares what it uses."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = (
    "plugins/modules/stop_training.py", "plugins/modules/gpu_release.py", "plugins/modules/service_health.py",
    "plugins/filter/preflight_checks.py", "plugins/plugin_utils/ddtree_rules.py", "roles/release_venv/tasks/main.yml",
    "roles/sglang_release/files/check_server_args.py", "roles/preflight/meta/argument_specs.yml",
    "playbooks/pivot.yml", "playbooks/rollback_nextn.yml", "playbooks/vars/roles.yml",
    "inventory/production/hosts.yml", "requirements/release-sglang-0.5.23-cp312.txt", "docs/operations.md",
    # the release installs ddtree_runtime from the collection; the playbooks read its rules from there
    "ddtree_runtime/pyproject.toml", "ddtree_runtime/ddtree_runtime/sglang/config.py",
    "ddtree_runtime/ddtree_runtime/model_layout.py", "ddtree_runtime/csrc/tree.cu",
)
TEST_EQUIPMENT = ("lab/", "tests/", "molecule/", "inventory/lab", ".venv", ".cache", "artifacts/", "state/",
                  "ddtree_runtime/models/", "ddtree_runtime/tests/", ".ruff_cache", ".hypothesis", "__pycache__",
                  "labserver", "pivot_lab")


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> tarfile.TarFile:
    out = tmp_path_factory.mktemp("collection")
    subprocess.run([str(REPO / ".venv" / "bin" / "ansible-galaxy"), "collection", "build", "--output-path", str(out),
                    str(REPO)], check=True, capture_output=True, timeout=300)
    return tarfile.open(next(out.glob("pivot-ops-*.tar.gz")))


def test_the_artifact_holds_the_product(artifact: tarfile.TarFile) -> None:
    names = set(artifact.getnames())
    assert [path for path in PRODUCT if path not in names] == []


def test_the_artifact_holds_no_test_equipment(artifact: tarfile.TarFile) -> None:
    leaked = sorted(name for name in artifact.getnames()
                    if any(name.startswith(prefix) or f"/{prefix}" in name for prefix in TEST_EQUIPMENT))
    assert leaked == []


def test_the_manifest_declares_the_collections_the_roles_use(artifact: tarfile.TarFile) -> None:
    manifest = json.load(artifact.extractfile("MANIFEST.json"))  # type: ignore[arg-type]
    assert set(manifest["collection_info"]["dependencies"]) == {"community.general", "community.proxmox"}
