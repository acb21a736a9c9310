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


def test_a_base_tag_names_its_debian_release(monkeypatch):
    """`kvagent/base:bullseye` is debootstrapped from bullseye (Python 3.9), not the default bookworm;
    any other tag from bookworm."""
    import kvagent.sandbox.images as images

    built = []
    monkeypatch.setattr(images, "image_exists", lambda tag, client=None: False)
    monkeypatch.setattr(images, "build_base_image", lambda **kw: built.append(kw) or kw["tag"])
    images.ensure_base_image("kvagent/base:bullseye")
    images.ensure_base_image("kvagent/base:trixie")
    images.ensure_base_image("my/base:latest")
    assert [b["suite"] for b in built] == ["bullseye", "trixie", "bookworm"]
    assert images.RELEASES["bullseye"].extra_packages == ("python3-distutils",)


def test_mirror_fallback(tmp_path):
    assert apt_mirror("bookworm", tmp_path) is None  # debootstrap then uses its own default


@pytest.mark.slow
def test_base_image_is_cached_by_tag(base_image):
    from kvagent.sandbox.docker_backend import docker_client

    assert build_base_image(base_image) == base_image  # present: returns without rebuilding
    cfg = docker_client().images.get(base_image).attrs["Config"]
    assert cfg["Cmd"] == ["/bin/bash"]
