"""A role's templates rendered as Ansible renders them on a host: the role's defaults, then its vars, then the
host's variables, through Ansible's own Templar (the unit tests of the vllm_service and gateway templates)."""

from __future__ import annotations

from typing import Any

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from .conftest import REPO


def trusted(value: Any) -> Any:
    """Role files are trusted templates (as Ansible treats them when it loads a role)."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {key: trusted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [trusted(item) for item in value]
    return value


class RoleTemplates:
    """The role ``name``'s templates and variables on host node1, with ``host`` variables over them."""

    def __init__(self, name: str, **host: Any) -> None:
        self.dir = REPO / "roles" / name
        self.loader = DataLoader()
        self.variables: dict[str, Any] = {}
        for path in (self.dir / "defaults" / "main.yml", self.dir / "vars" / "main.yml"):
            self.variables |= trusted(self.loader.load_from_file(str(path)))
        self.variables |= {"inventory_hostname": "node1", "ansible_managed": "Ansible managed", **host}

    def render(self, template: str, **variables: Any) -> str:
        return str(self.value((self.dir / "templates" / template).read_text(encoding="utf-8"), **variables))

    def value(self, expression: str, **variables: Any) -> Any:
        templar = Templar(loader=self.loader, variables=self.variables | variables)
        return templar.template(trust_as_template(expression))
