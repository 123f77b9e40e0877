"""The lookup plugin ``gpufleet_bundle_lock``: the roles' one reader of an offline bundle's lock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleLookupError
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import lookup_loader

from gpufleet.bundle.lock import LOCK_NAME, Lock, LockedFile, LockedImage, LockedModel, read_lock, write_lock

from .conftest import REPO

ANSIBLE_PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")
SHA = "ab" * 32


def a_lock(version: str = "27.5.1") -> Lock:
    return Lock(
        manifest="offline_bundle/manifest.yml",
        files=[
            LockedFile(
                path=f"docker/docker-{version}.tgz", size=3, sha256=SHA, version=version, source="url"
            ),
            LockedFile(
                path="models/org/tiny/config.json", size=2, sha256="cd" * 32, version="1", source="git"
            ),
        ],
        images=[
            LockedImage(
                name="org/img", tag="1", id=f"sha256:{'ef' * 32}", path="images/img.tar", compression="none"
            )
        ],
        models=[
            LockedModel(repo="org/tiny", revision="0" * 40, path="models/org/tiny", url="https://x/org/tiny")
        ],
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    root.mkdir()
    write_lock(root, a_lock())
    return root


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lookup keeps what it read under $XDG_CACHE_HOME/gpufleet/locks: a cache of this test's own."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache / "gpufleet" / "locks"


@pytest.fixture(scope="module")
def lookup() -> Any:
    lookup_loader.add_directory(str(REPO / "plugins" / "lookup"))
    plugin = lookup_loader.get("gpufleet_bundle_lock", loader=DataLoader(), templar=None)
    assert plugin is not None, "plugins/lookup/gpufleet_bundle_lock.py did not load"
    return plugin


def test_returns_the_lock_as_gpufleet_reads_it(lookup: Any, bundle: Path) -> None:
    [lock] = lookup.run([str(bundle)], variables={})
    assert lock == read_lock(bundle).model_dump(mode="json")
    assert lock["files"][0] == {
        "path": "docker/docker-27.5.1.tgz",
        "size": 3,
        "sha256": SHA,
        "version": "27.5.1",
        "source": "url",
    }
    assert lock["images"][0]["id"] == f"sha256:{'ef' * 32}"
    assert lock["models"][0]["revision"] == "0" * 40


# A worker process of its own, as Ansible runs each task: the lookup, then which gpufleet modules it imported.
_IN_A_WORKER = """
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import lookup_loader
lookup_loader.add_directory(sys.argv[1])
plugin = lookup_loader.get("gpufleet_bundle_lock", loader=DataLoader(), templar=None)
[lock] = plugin.run([sys.argv[2]], variables={})
print(json.dumps({"lock": lock, "imported": sorted(m for m in sys.modules if m.startswith("gpufleet."))}))
"""


def in_a_worker(bundle: Path) -> dict[str, Any]:
    argv = [sys.executable, "-c", _IN_A_WORKER, str(REPO / "plugins" / "lookup"), str(bundle)]
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    answer: dict[str, Any] = json.loads(ran.stdout)
    return answer


def test_a_later_task_reads_the_kept_lock_and_imports_no_reader(bundle: Path, own_cache: Path) -> None:
    """Each task runs in a fresh worker: the first reads the lock with gpufleet's reader (and keeps what it
    returned), a later one takes that and imports nothing of gpufleet (the reader cost each about 0.4 s)."""
    first, later = in_a_worker(bundle), in_a_worker(bundle)
    assert first["lock"] == later["lock"] == read_lock(bundle).model_dump(mode="json")
    assert "gpufleet.bundle.lock" in first["imported"]
    assert later["imported"] == []
    assert len(list(own_cache.glob("*.json"))) == 1


def test_a_rewritten_lock_is_read_again_not_taken_from_the_cache(lookup: Any, bundle: Path) -> None:
    [before] = lookup.run([str(bundle)], variables={})
    write_lock(bundle, a_lock("26.1.5"))  # the same path; another size, mtime and ctime
    [after] = lookup.run([str(bundle)], variables={})
    assert (before["files"][0]["version"], after["files"][0]["version"]) == ("27.5.1", "26.1.5")
    replaced = bundle.parent / "replacement"
    replaced.mkdir()
    write_lock(replaced, a_lock("25.0.0"))
    (replaced / LOCK_NAME).replace(bundle / LOCK_NAME)  # another inode, whatever the times
    assert lookup.run([str(bundle)], variables={})[0]["files"][0]["version"] == "25.0.0"


def test_returns_one_lock_per_bundle_in_order(lookup: Any, bundle: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    write_lock(other, a_lock("26.1.5"))
    locks = lookup.run([str(other), str(bundle)], variables={})
    assert [lock["files"][0]["version"] for lock in locks] == ["26.1.5", "27.5.1"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "missing"),
        ("files: [\n", "unreadable"),
        (yaml.safe_dump({"files": []}), "unreadable"),  # no manifest: not a lock gpufleet wrote
        (
            yaml.safe_dump({**a_lock().model_dump(), "files": [{"path": "x", "sha256": "short"}]}),
            "unreadable",
        ),
    ],
    ids=["missing", "not-yaml", "no-manifest", "bad-entry"],
)
def test_a_missing_or_corrupt_lock_fails_with_its_path_and_the_fix(
    lookup: Any, tmp_path: Path, content: str | None, why: str
) -> None:
    if content is not None:
        (tmp_path / LOCK_NAME).write_text(content, encoding="utf-8")
    with pytest.raises(AnsibleLookupError) as raised:
        lookup.run([str(tmp_path)], variables={})
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / LOCK_NAME}: {why}")
    assert "Fix: " in message


def test_an_empty_bundle_path_fails_with_the_fix(lookup: Any) -> None:
    with pytest.raises(AnsibleLookupError, match=r"found an empty path\. Fix: set gpufleet_bundle_dir"):
        lookup.run([""], variables={})


def run_play(tmp_path: Path, tasks: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """ansible-playbook on localhost with the repository's ansible.cfg, as the roles find the plugin."""
    playbook = tmp_path / "play.yml"
    play = {
        "name": "Lookup",
        "hosts": "localhost",
        "connection": "local",
        "gather_facts": False,
        "tasks": tasks,
    }
    playbook.write_text(yaml.safe_dump([play]), encoding="utf-8")
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", str(playbook)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_roles_get_one_bundles_lock_as_a_mapping(bundle: Path, tmp_path: Path) -> None:
    lookup = f"lookup('gpufleet_bundle_lock', {str(bundle)!r})"
    result = run_play(
        tmp_path,
        [
            {
                "name": "Read the lock through the repository's plugin path",
                "ansible.builtin.assert": {
                    "that": [
                        f"{lookup} is mapping",
                        f"{lookup}.files | map(attribute='path') | first == 'docker/docker-27.5.1.tgz'",
                        f"{lookup}.models[0].repo == 'org/tiny'",
                    ]
                },
            }
        ],
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok=1" in result.stdout


@pytest.mark.slow
def test_a_task_that_reads_a_missing_lock_fails_with_its_path_and_the_fix(tmp_path: Path) -> None:
    result = run_play(
        tmp_path,
        [
            {
                "name": "Read a lock that is not there",
                "ansible.builtin.debug": {
                    "msg": f"{{{{ lookup('gpufleet_bundle_lock', {str(tmp_path)!r}) }}}}"
                },
            }
        ],
    )
    said = " ".join((result.stdout + result.stderr).split())
    assert result.returncode == 2, said
    assert f"{tmp_path / LOCK_NAME}: missing; expected the lock written by `gpufleet bundle build`" in said
    assert "Fix: point at a built bundle directory." in said
