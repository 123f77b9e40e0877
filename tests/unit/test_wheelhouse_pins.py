"""The bundle's wheelhouse pins every dependency gpufleet needs at run time (pip download --no-deps)."""

from __future__ import annotations

import re
from importlib.metadata import distribution
from pathlib import Path

import yaml
from packaging.requirements import Requirement

MANIFEST = Path(__file__).resolve().parents[2] / "offline_bundle" / "manifest.yml"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure(name: str, seen: set[str] | None = None) -> set[str]:
    """Every distribution ``name`` needs at run time, as installed here (no extras, this platform)."""
    seen = set() if seen is None else seen
    for line in distribution(name).requires or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = canonical(requirement.name)
        if key not in seen:
            seen.add(key)
            runtime_closure(requirement.name, seen)
    return seen


def test_every_runtime_dependency_of_gpufleet_is_pinned_in_the_wheelhouse() -> None:
    pins = yaml.safe_load(MANIFEST.read_text())["wheels"]["pip"]["requirements"]
    pinned = {canonical(pin.split("==")[0]) for pin in pins}
    needed = runtime_closure("gpufleet")
    assert needed, "gpufleet's installed metadata lists no dependency: the check would be empty"
    assert not needed - pinned, f"add to offline_bundle/manifest.yml wheels: {sorted(needed - pinned)}"
