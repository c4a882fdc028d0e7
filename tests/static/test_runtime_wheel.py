"""ddtree_runtime's wheel, built as a release venv builds it (from the source the release_venv role packs), holds the
product and nothing of the test equipment, and imports nothing but itself, the standard library and what it runs with:
the lab's server and the test doubles live on the lab's side (lab/files/labserver: its own distribution)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNTIME_PYTHON = REPO / ".venv-rt" / "bin" / "python"  # made by lab/setup.sh; it has setuptools, as a release venv
PACK_SOURCE = REPO / "roles" / "release_venv" / "files" / "pack_source.py"
PRODUCT = (
    "ddtree_runtime/__init__.py", "ddtree_runtime/tree.py", "ddtree_runtime/verify.py", "ddtree_runtime/sampling.py",
    "ddtree_runtime/tokenizer.py", "ddtree_runtime/model_layout.py", "ddtree_runtime/ops.py", "ddtree_runtime/check.py",
    "ddtree_runtime/sglang/plugin.py", "ddtree_runtime/sglang/config.py", "ddtree_runtime/reference/decoding.py",
    "ddtree_runtime/reference/tiny.py", "ddtree_runtime/eval/backends.py", "ddtree_runtime/bench/tau.py",
    "ddtree_runtime/acceptance/suite.py", "ddtree_runtime/train/pair.py",
)
TEST_EQUIPMENT = ("labserver", "pivot_lab", "tests/", "conftest", "fake_", "models/", "lab/")
MATH = frozenset({f"ddtree_runtime.{name}" for name in ("tree", "verify", "sampling", "tokenizer")})
"""The trees, their verification, sampling and the tokenizer: what the engines (reference/, sglang/, eval/) build on."""
RUNS_WITH = frozenset({
    "torch", "numpy", "safetensors",  # its dependencies
    "transformers", "tokenizers",  # optional: Hugging Face tokenizer files, the [reference] parity checks
    "sglang",  # the server its plugin registers into
})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("runtime-wheel")
    packed = subprocess.run([sys.executable, str(PACK_SOURCE), str(REPO / "ddtree_runtime"), str(out / "source")],
                            check=True, capture_output=True, text=True, timeout=120)
    archive = packed.stdout.strip()
    environment = {**os.environ, "DDTREE_BUILD_CUDA": "0"}
    subprocess.run([str(RUNTIME_PYTHON), "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "--disable-pip-version-check", "--quiet", "-w", str(out / "wheel"), archive],
                   check=True, capture_output=True, timeout=300, env=environment)
    return zipfile.ZipFile(next((out / "wheel").glob("ddtree_runtime-*.whl")))


def modules(names: set[str]) -> set[str]:
    """The importable modules of a wheel's files (packages by their ``__init__``)."""
    dotted = {name.removesuffix(".py").replace("/", ".") for name in names if name.endswith(".py")}
    return {name.removesuffix(".__init__") for name in dotted}


def absolute_imports(source: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_the_wheel_holds_the_product(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert [path for path in PRODUCT if path not in names] == []


def test_the_wheel_holds_no_test_equipment(wheel: zipfile.ZipFile) -> None:
    code = [name for name in wheel.namelist() if ".dist-info/" not in name]
    leaked = sorted(name for name in code if any(part in name for part in TEST_EQUIPMENT))
    assert leaked == []


def test_the_product_imports_only_itself_the_standard_library_and_what_it_runs_with(wheel: zipfile.ZipFile) -> None:
    own = modules(set(wheel.namelist()))
    strays = {}
    for name in sorted(n for n in wheel.namelist() if n.endswith(".py")):
        for module in absolute_imports(wheel.read(name).decode()):
            top = module.split(".")[0]
            if top == "ddtree_runtime":
                if module not in own:
                    strays.setdefault(name, []).append(module)
            elif top not in sys.stdlib_module_names and top not in RUNS_WITH:
                strays.setdefault(name, []).append(module)
    assert strays == {}


def test_the_math_imports_no_engine(wheel: zipfile.ZipFile) -> None:
    upward = {}
    for module in sorted(MATH):
        imported = absolute_imports(wheel.read(module.replace(".", "/") + ".py").decode())
        found = sorted(m for m in imported if m.split(".")[0] == "ddtree_runtime" and m not in MATH)
        if found:
            upward[module] = found
    assert upward == {}
