"""Every module's and filter's DOCUMENTATION, EXAMPLES and RETURN parse as YAML (ansible-doc and ansible-test sanity
refuse one that does not, a plain scalar with ': ' in it for example; this finds it in a second)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

PLUGINS = Path(__file__).resolve().parents[3] / "plugins"
FILES = sorted([*PLUGINS.glob("modules/*.py"), *PLUGINS.glob("filter/*.py"), *PLUGINS.glob("callback/*.py")])


def documentation(path: Path) -> dict[str, str]:
    tree = ast.parse(path.read_text())
    return {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            for target in node.targets if isinstance(target, ast.Name)
            and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(node.value, ast.Constant)}


@pytest.mark.parametrize("path", FILES, ids=[f"{p.parent.name}/{p.name}" for p in FILES])
def test_the_documentation_is_yaml(path: Path) -> None:
    found = documentation(path)
    assert "DOCUMENTATION" in found, f"{path} has no DOCUMENTATION"
    for name, text in found.items():
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise AssertionError(f"{path.name} {name}: {exc}") from exc
    assert isinstance(yaml.safe_load(found["DOCUMENTATION"]), dict)
