"""Every role keeps its argument specs, its defaults, the pydantic models and the README in agreement."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.docs import render
from gpufleet.fleet.schema import VARIABLES, ServingSpec

from .conftest import REPO

ROLES = sorted(path.name for path in (REPO / "roles").iterdir() if path.is_dir())


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def spec_options(role: str) -> dict[str, Any]:
    specs = load(REPO / "roles" / role / "meta" / "argument_specs.yml")["argument_specs"]
    options: dict[str, Any] = specs["main"].get("options") or {}
    return options


@pytest.mark.parametrize("role", ROLES)
def test_role_has_the_standard_files(role: str) -> None:
    for relative in ("defaults/main.yml", "meta/argument_specs.yml", "tasks/main.yml", "README.md"):
        assert (REPO / "roles" / role / relative).is_file(), f"roles/{role}/{relative} is missing"


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_mirror_defaults(role: str) -> None:
    defaults: dict[str, Any] = load(REPO / "roles" / role / "defaults" / "main.yml") or {}
    options = spec_options(role)
    with_default = {name for name, option in options.items() if "default" in (option or {})}
    assert set(defaults) == with_default, f"roles/{role}: defaults and argument specs differ"
    for name, value in defaults.items():
        assert options[name].get("default") == value, f"roles/{role}: default of {name} differs"


@pytest.mark.parametrize("role", ROLES)
def test_role_inputs_are_prefixed_with_the_role_name(role: str) -> None:
    for name in spec_options(role):
        assert name.startswith((f"{role}_", "gpufleet_")), f"roles/{role}: {name} lacks the {role}_ prefix"


@pytest.mark.parametrize("role", ROLES)
def test_every_option_has_a_description(role: str) -> None:
    for name, option in spec_options(role).items():
        assert (option or {}).get("description"), f"roles/{role}: {name} has no description"


@pytest.mark.skipif(
    not (REPO / "roles/vllm_service").is_dir(), reason="the vllm_service role is not here yet"
)
def test_serving_model_matches_the_vllm_service_role() -> None:
    options = spec_options("vllm_service")
    for field_name, info in ServingSpec.model_fields.items():
        name = f"vllm_service_{field_name}"
        assert name in VARIABLES
        assert name in options, f"{name} is in ServingSpec but not in the role's argument specs"
        assert options[name].get("default") == info.default, f"default of {name} differs"


def test_readme_reference_is_current() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert render(readme, REPO) == readme, "README.md is stale: run .venv/bin/python -m gpufleet.docs"
    # A clone elsewhere (CI clones to another path) must render the same README: no checkout paths in it.
    assert str(REPO) not in readme, f"README.md names this checkout's path {REPO}: help texts must not"


def test_public_api_names_resolve() -> None:
    import gpufleet

    for name in gpufleet.__all__:
        assert getattr(gpufleet, name) is not None
