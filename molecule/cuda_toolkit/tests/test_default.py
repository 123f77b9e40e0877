"""Molecule verify (testinfra) for cuda_toolkit installed offline from the bundle's local repository."""

from __future__ import annotations


def test_nvcc_reports_the_pinned_version(host):
    out = host.check_output("/usr/local/cuda/bin/nvcc --version")
    assert "release 12.4, V12.4.131" in out


def test_login_shell_finds_nvcc_through_profile(host):
    out = host.check_output("bash -lc 'command -v nvcc; nvcc --version'")
    assert out.splitlines()[0] == "/usr/local/cuda/bin/nvcc"
    assert "release 12.4" in out


def test_usr_local_cuda_points_at_the_toolkit(host):
    link = host.file("/usr/local/cuda")
    assert link.is_symlink
    assert link.linked_to == "/usr/lib/nvidia-cuda-toolkit"


def test_profile_script_is_managed(host):
    profile = host.file("/etc/profile.d/cuda.sh")
    assert profile.mode == 0o644
    assert "Ansible managed" in profile.content_string


def test_apt_reads_only_the_local_repository_for_cuda(host):
    sources = host.file("/etc/apt/sources.list.d/gpufleet-cuda-toolkit.list").content_string
    assert "deb [trusted=yes] file:/var/cache/gpufleet/cuda_toolkit/repo ./" in sources
    policy = host.check_output("apt-cache policy nvidia-cuda-toolkit")
    assert "file:/var/cache/gpufleet/cuda_toolkit/repo" in policy


def test_host_really_is_offline(host):
    # The lab's --offline hosts reach only the lab: Debian's mirror must not answer.
    result = host.run("timeout 5 bash -c 'exec 3<>/dev/tcp/deb.debian.org/80'")
    assert result.rc != 0
