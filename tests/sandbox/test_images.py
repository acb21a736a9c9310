"""Base image builder: mirror discovery (fast) and the cached image (Docker)."""

from __future__ import annotations

import pytest

from kvagent.sandbox.images import apt_mirror, build_base_image


def test_mirror_from_deb822(tmp_path):
    d = tmp_path / "sources.list.d"
    d.mkdir()
    (d / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert apt_mirror("bookworm", tmp_path) == "http://mirror.example/debian"


def test_mirror_from_one_line_list(tmp_path):
    (tmp_path / "sources.list").write_text(
        "# comment\ndeb [arch=amd64] http://local.mirror/debian bookworm main\n"
    )
    assert apt_mirror("bookworm", tmp_path) == "http://local.mirror/debian"


def test_mirror_fallback(tmp_path):
    assert apt_mirror("bookworm", tmp_path) is None  # debootstrap then uses its own default


@pytest.mark.slow
def test_base_image_is_cached_by_tag(base_image):
    from kvagent.sandbox.docker_backend import docker_client

    assert build_base_image(base_image) == base_image  # present: returns without rebuilding
    cfg = docker_client().images.get(base_image).attrs["Config"]
    assert cfg["Cmd"] == ["/bin/bash"]
