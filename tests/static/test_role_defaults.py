"""Every default a role's argument spec documents is also a real default of the role.

Ansible validates a role's arguments against meta/argument_specs.yml but does not set the defaults it
documents: a role included without a variable would otherwise fail on an undefined variable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


def documented_defaults(role: Path) -> dict[str, Any]:
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return {name: option["default"] for spec in specs.values()
            for name, option in spec.get("options", {}).items() if "default" in option}


def role_defaults(role: Path) -> dict[str, Any]:
    path = role / "defaults" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


@pytest.mark.parametrize("role", sorted(p.name for p in ROLES.iterdir()))
def test_documented_defaults_are_the_roles_defaults(role: str) -> None:
    documented = documented_defaults(ROLES / role)
    actual = role_defaults(ROLES / role)
    wrong = {name: (value, actual.get(name, "<missing>")) for name, value in documented.items()
             if name not in actual or actual[name] != value}
    assert not wrong, f"{role}: argument spec default -> defaults/main.yml: {wrong}"
