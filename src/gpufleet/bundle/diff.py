"""What changed between two bundle locks, one line per change, for reviewing an upgrade bundle.

Files are paired by their path with the version taken out (``wheels/pydantic-2.14.3-cp311-...whl`` and
``wheels/pydantic-2.15.0-cp311-...whl`` are one wheel at two versions), so a version bump reads as a change,
not as a file removed and another added. A file whose bytes did not change but whose lock ``source`` did (a
new gpufleet commit names every wheel's source anew) is summed up in one line per source.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar

from gpufleet.bundle.lock import Lock, LockedFile


class _Pathed(Protocol):
    @property
    def path(self) -> str: ...


_T = TypeVar("_T", bound=_Pathed)


def _key(entry: LockedFile) -> str:
    return entry.path.replace(entry.version, "{version}") if entry.version else entry.path


def _short(digest: str) -> str:
    return digest.removeprefix("sha256:")[:12]


def _file(entry: LockedFile) -> str:
    version = f"version {entry.version}, " if entry.version else ""
    return f"{entry.path} ({version}{entry.size} bytes, sha256 {_short(entry.sha256)})"


def _by_key(lock: Lock) -> dict[str, list[LockedFile]]:
    keyed: dict[str, list[LockedFile]] = defaultdict(list)
    for entry in sorted(lock.files, key=lambda item: item.path):
        keyed[_key(entry)].append(entry)
    return keyed


def _changed(old: LockedFile, new: LockedFile) -> str | None:
    parts = []
    if old.version != new.version:
        parts.append(f"version {old.version or '-'} -> {new.version or '-'}")
    if old.sha256 != new.sha256:
        parts.append(f"sha256 {_short(old.sha256)} -> {_short(new.sha256)}")
    if old.size != new.size:
        parts.append(f"size {old.size} -> {new.size}")
    if not parts:
        return None
    path = old.path if old.path == new.path else f"{old.path} -> {new.path}"
    return f"changed {path}: " + "; ".join(parts)


def _files(old: Lock, new: Lock) -> Iterator[str]:
    before, after = _by_key(old), _by_key(new)
    sources: dict[tuple[str, str], int] = defaultdict(int)
    for key in sorted(before.keys() | after.keys()):
        olds, news = before.get(key, []), after.get(key, [])
        if len(olds) == len(news) == 1:  # one file at two versions (or the same): a change
            pairs = [(olds[0], news[0])]
        else:  # several files share the key: pair the same paths, the rest are removed and added
            paths = {entry.path for entry in news}
            pairs = [(o, n) for o in olds for n in news if o.path == n.path]
            yield from (f"removed {_file(entry)}" for entry in olds if entry.path not in paths)
            kept = {entry.path for entry in olds}
            yield from (f"added {_file(entry)}" for entry in news if entry.path not in kept)
        for was, now in pairs:
            if (line := _changed(was, now)) is not None:
                yield line
            elif was.source != now.source:
                sources[(was.source, now.source)] += 1
    for (was_source, now_source), count in sorted(sources.items()):
        yield f"source of {count} unchanged file(s): {was_source!r} -> {now_source!r}"


def _by_path(old: Sequence[_T], new: Sequence[_T]) -> Iterator[tuple[_T | None, _T | None]]:
    """(old, new) for every path in either list, by path; None where one side lacks it."""
    before, after = {item.path: item for item in old}, {item.path: item for item in new}
    for path in sorted(before.keys() | after.keys()):
        yield before.get(path), after.get(path)


def _images(old: Lock, new: Lock) -> Iterator[str]:
    for was, now in _by_path(old.images, new.images):
        if was is None and now is not None:
            yield f"added image {now.name}:{now.tag} (id {_short(now.id)}, vllm {now.vllm or '-'})"
        elif now is None and was is not None:
            yield f"removed image {was.name}:{was.tag} (id {_short(was.id)})"
        elif was is not None and now is not None and was != now:
            fields = ("id", "cuda", "vllm", "ray", "torch", "python", "compression")
            parts = [
                f"{name} {getattr(was, name) or '-'} -> {getattr(now, name) or '-'}"
                for name in fields
                if getattr(was, name) != getattr(now, name)
            ]
            yield f"changed image {now.name}:{now.tag}: " + "; ".join(parts)


def _models(old: Lock, new: Lock) -> Iterator[str]:
    for was, now in _by_path(old.models, new.models):
        if was is None and now is not None:
            yield f"added model {now.repo} at revision {now.revision}"
        elif now is None and was is not None:
            yield f"removed model {was.repo} (revision {was.revision})"
        elif was is not None and now is not None and was != now:
            yield f"changed model {now.repo}: revision {was.revision} -> {now.revision}"


def diff_locks(old: Lock, new: Lock) -> list[str]:
    """One line per difference (empty: the two locks describe the same bundle)."""
    lines = [f"manifest {old.manifest} -> {new.manifest}"] if old.manifest != new.manifest else []
    return [*lines, *_files(old, new), *_images(old, new), *_models(old, new)]
