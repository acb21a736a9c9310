"""Which Python an instance image gets (issue 24): the spec's where a Debian release ships it, else
the nearest the source admits, and the note a run carries when it is not the spec's."""

from __future__ import annotations

import json

import pytest

from kvagent.errors import KvagentError
from kvagent.evals.interpreter import (
    LABEL_PYTHON,
    LABEL_SPEC_PYTHON,
    choose_python,
    environment_note,
    note_from_labels,
    requires_python,
)
from kvagent.sandbox.images import RELEASES, base_tag, release_for_python


def test_the_releases_the_mirror_serves():
    assert {r.suite: r.python for r in RELEASES.values()} == {
        "bullseye": "3.9",
        "bookworm": "3.11",
        "trixie": "3.13",
    }
    assert release_for_python("3.9").tag == base_tag("bullseye") == "kvagent/base:bullseye"
    with pytest.raises(
        KvagentError, match=r"no Debian release ships Python 3.7; base images have 3.9 \(bullseye\)"
    ):
        release_for_python("3.7")


@pytest.mark.parametrize(
    ("spec", "requires", "python", "why"),
    [
        ("3.9", None, "3.9", "spec"),  # Django 4.1/4.2, sympy, pytest, marshmallow, flask 2.0
        ("3.11", None, "3.11", "spec"),  # Django 5.x, flask 2.2+
        ("3.10", None, "3.9", "nearest"),  # a tie: the older one
        ("3.10", ">=3.10", "3.11", "nearest"),  # ... unless the source refuses it
        ("3.6", ">=3.6", "3.9", "nearest"),
        ("3.5", "!=3.9.*", "3.11", "nearest"),
        ("3.12", None, "3.11", "nearest"),
        ("3.10", ">=3.14", "3.9", "nearest"),  # nothing admitted: still the nearest
        (None, None, "3.11", "default"),  # no spec
        (None, ">=3.12", "3.13", "default"),
    ],
)
def test_choice(spec, requires, python, why):
    choice = choose_python(spec, requires=requires)
    assert (choice.python, choice.why) == (python, why)
    assert choice.release.python == python


def test_a_recipe_may_name_its_python_and_the_run_then_says_it_differs():
    choice = choose_python("3.9", requested="3.11")
    assert (choice.python, choice.why, choice.release.suite) == ("3.11", "recipe", "bookworm")
    assert choice.note == "environment differs: python 3.11 (spec 3.9)"
    assert choose_python("3.9").note is None and choose_python(None).note is None
    with pytest.raises(KvagentError, match="no Debian release ships Python 3.8"):
        choose_python("3.9", requested="3.8")


def test_the_note_comes_from_the_image_labels():
    assert environment_note("3.9", "3.10") == "environment differs: python 3.9 (spec 3.10)"
    assert environment_note("3.9", "3.9") is None and environment_note("3.9", None) is None
    assert note_from_labels({LABEL_PYTHON: "3.9", LABEL_SPEC_PYTHON: "3.10"}).endswith(
        "python 3.9 (spec 3.10)"
    )
    assert note_from_labels({LABEL_PYTHON: "3.9", LABEL_SPEC_PYTHON: ""}) is None  # no spec
    assert note_from_labels(None) is None  # not a kvagent image


def test_requires_python_from_each_place_a_source_states_it(tmp_path):
    assert requires_python(tmp_path) is None
    (tmp_path / "setup.py").write_text("setup(name='x', python_requires='>=3.6.1')\n")
    assert requires_python(tmp_path) == ">=3.6.1"
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n[options]\npython_requires = >=3.8\n")
    assert requires_python(tmp_path) == ">=3.8"
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nrequires-python = ">=3.10"\n')
    assert requires_python(tmp_path) == ">=3.10"


def test_recipe_python_is_optional_and_checked(tmp_path):
    from kvagent.evals.recipe import load_recipes

    f = tmp_path / "r.json"
    base = {"repo": "o/n", "source": {"sdist": "n==1.0"}}
    f.write_text(json.dumps({"recipes": {"o__n-1": base, "o__n-2": {**base, "python": "3.11"}}}))
    recipes = load_recipes([f])
    assert recipes["o__n-1"].python is None and recipes["o__n-2"].python == "3.11"
    # The spec's Python picks the image, so it is part of what the image is built from.
    assert recipes["o__n-1"].digest("3.9") != recipes["o__n-1"].digest("3.10")
    f.write_text(json.dumps({"recipes": {"o__n-1": {**base, "python": "python3"}}}))
    with pytest.raises(KvagentError, match=r"recipe 'o__n-1' .*: 'python' must be X.Y"):
        load_recipes([f])


def test_no_shipped_recipe_pins_a_python():
    """Every shipped recipe takes the spec's Python, so none can drift from it unseen."""
    from kvagent.evals.recipe import load_recipes

    assert {iid: r.python for iid, r in load_recipes().items() if r.python} == {}


def test_a_django_4x_image_is_built_on_bullseye_for_python_39(tmp_path, monkeypatch):
    """The build takes the spec's Python (Django 4.2-dev: 3.9): bullseye's base, wheels for cp39 on
    glibc 2.31, the labels the run's note is read from. Docker and the network are stood in for."""
    from pathlib import Path

    import kvagent.evals.images as images
    from kvagent.evals.datasets import load_instances

    (inst,) = load_instances(
        Path(__file__).parent / "data" / "harness_instances.jsonl", select="django__django-15851"
    )
    seen = {}

    def fake_sdist(requirement, log):
        src = tmp_path / "Django-4.1"
        (src / "tests").mkdir(parents=True, exist_ok=True)
        (src / "setup.cfg").write_text("[options]\npython_requires = >=3.8\n")
        import tarfile

        with tarfile.open(tmp_path / "Django-4.1.tar.gz", "w:gz") as t:
            t.add(src, arcname="Django-4.1")
        return tmp_path / "Django-4.1.tar.gz"

    monkeypatch.setattr(images, "fetch_sdist", fake_sdist)
    monkeypatch.setattr(images, "image_labels", lambda tag, client=None: None)
    monkeypatch.setattr(images, "ensure_base_image", lambda tag, log, client: seen.setdefault("base", tag))
    monkeypatch.setattr(
        images,
        "download_wheels",
        lambda reqs, dest, python, glibc, log: seen.update(python=python, glibc=glibc),
    )
    monkeypatch.setattr(
        images,
        "build_image",
        lambda ctx, tag, log_path, client: seen.update(dockerfile=(Path(ctx) / "Dockerfile").read_text()),
    )
    images.build_instance_image(inst)
    assert seen["base"] == "kvagent/base:bullseye" and (seen["python"], seen["glibc"]) == ("3.9", "2_31")
    assert seen["dockerfile"].startswith("FROM kvagent/base:bullseye\n")
    assert f'{LABEL_PYTHON}="3.9" {LABEL_SPEC_PYTHON}="3.9"' in seen["dockerfile"]
