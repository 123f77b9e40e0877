"""Limits on an inventory's files, checked before ansible-core's loader sees them.

An alias bomb ("billion laughs": a few lines whose aliases expand to a billion values) makes Ansible's
templating run for hours; nesting thousands of levels deep ends in a RecursionError inside PyYAML or
Ansible; a file of gigabytes is read whole. gpufleet reads each file at most :data:`MAX_FILE_BYTES` (+1)
bytes, and walks the YAML as a stream of parser events, which needs no recursion and never expands an
alias: it counts the nesting and, for every anchor, how many values it stands for. Far above any real
inventory (gpufleet's own largest file is a few KiB, nested 8 levels), these limits are hit only by
mistakes and attacks, and then in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gpufleet.problems import Problem

MAX_FILE_BYTES = 4 * 1024 * 1024  # 4 MiB per file of the inventory (hosts files, group_vars, host_vars)
MAX_DEPTH = 64  # mappings and lists nested in one another
MAX_NODES = 1_000_000  # values in one file once every alias is expanded (a value: scalar, list or mapping)

# libyaml's parser when PyYAML has it (~10x faster); both produce events without recursion.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_FIX = "write the values out plainly; keep large or generated data out of the inventory directory"


def read_capped(file: Path) -> bytes:
    """The file's bytes, at most ``MAX_FILE_BYTES + 1`` of them: one more says it is too large."""
    if file.stat().st_size <= MAX_FILE_BYTES:
        return file.read_bytes()
    with file.open("rb") as handle:
        return handle.read(MAX_FILE_BYTES + 1)


def hazard(file: Path, data: bytes) -> Problem | None:
    """The first limit ``data`` (the start of ``file``, :func:`read_capped`) exceeds, or None.

    A file that is not YAML (an INI hosts file, a syntax error) passes: Ansible's own parsers say what is
    wrong with it, and an INI file can hold neither aliases nor nesting.
    """
    if len(data) > MAX_FILE_BYTES:
        try:
            size = file.stat().st_size
        except OSError:
            size = len(data)
        return Problem(
            str(file),
            "-i",
            f"a file of {size:,} bytes",
            f"at most {MAX_FILE_BYTES:,} bytes (4 MiB) per inventory file",
            "move the data out of the inventory directory (gpufleet and Ansible read every file in it); "
            "keep hosts and variables only",
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None  # said by the inventory reader, with the offset
    # libyaml reads ahead and stops at 1,000 levels before its events reach the count here; PyYAML's own
    # parser hands each event over as it goes, so its events find the nesting (and any later syntax error).
    for loader in dict.fromkeys((_LOADER, yaml.SafeLoader)):
        try:
            return _walk(file, text, loader)
        except yaml.YAMLError:
            continue
    return None


def _walk(file: Path, text: str, loader: type[yaml.SafeLoader]) -> Problem | None:
    """Depth and expanded size from the parser's events: a collection's size is 1 plus its contents'; an
    alias adds the size of the value its anchor names, so a billion laughs is counted, not built."""
    open_sizes: list[list[int]] = []  # per open collection: [its size so far]
    open_anchors: list[str | None] = []
    anchored: dict[str, int] = {}
    expanded = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_sizes) >= MAX_DEPTH:
                return _problem(
                    file,
                    event,
                    f"values nested more than {MAX_DEPTH} levels deep",
                    f"at most {MAX_DEPTH} levels of nested mappings and lists",
                )
            open_sizes.append([1])
            open_anchors.append(event.anchor)
            expanded += 1
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            (size,), anchor = open_sizes.pop(), open_anchors.pop()
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
            expanded += 1
        elif isinstance(event, yaml.AliasEvent):
            size, anchor = anchored.get(event.anchor or "", 1), None
            expanded += size
        else:
            continue  # stream and document start and end
        if anchor is not None:
            anchored[anchor] = size
        if open_sizes:
            open_sizes[-1][0] += size
        if expanded > MAX_NODES:
            return _problem(
                file,
                event,
                f"aliases that expand to more than {MAX_NODES:,} values (an alias bomb?)",
                f"at most {MAX_NODES:,} values once aliases are expanded",
            )
    return None


def _problem(file: Path, event: yaml.Event, found: str, expected: str) -> Problem:
    line = event.start_mark.line + 1 if event.start_mark is not None else 0
    return Problem(f"{file}:{line}" if line else str(file), "-i", found, expected, _FIX)
