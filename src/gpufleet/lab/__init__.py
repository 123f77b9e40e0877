"""The test lab: a tool for developers and CI, not product API (no product module imports it).

Real systemd hosts (systemd-nspawn, one network namespace each) with SSH, booted in seconds from a cached
root file system (:mod:`~gpufleet.lab.rootfs`), on a private bridge (:mod:`~gpufleet.lab.net`), each in
its own cgroups (:mod:`~gpufleet.lab.host`); the CPU serving image (:mod:`~gpufleet.lab.serving_image`),
the tiny model (:mod:`~gpufleet.lab.tiny_model`, needs the ``lab`` extra) and ``make demo``
(:mod:`~gpufleet.lab.demo`).
"""

from __future__ import annotations

from gpufleet.lab.core import DEFAULT_LAB, HostStatus, Lab, LabHost, LabInventory
from gpufleet.lab.system import LabError

__all__ = ["DEFAULT_LAB", "HostStatus", "Lab", "LabError", "LabHost", "LabInventory"]
