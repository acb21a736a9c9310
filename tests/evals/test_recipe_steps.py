"""Recipe fields env / pre_install / install, and the verdicts of `kvagent images check`."""

from __future__ import annotations

import json

import pytest

from kvagent.errors import KvagentError
from kvagent.evals.check import format_report, judge
from kvagent.evals.recipe_steps import EDITABLE, Steps, dockerfile_lines, install_command, parse_steps

WHERE = "recipe 'x__y-1' in r.json"


def test_fields_parse():
    s = parse_steps(
        {"env": {"SETUPTOOLS_SCM_PRETEND_VERSION": "7.4.0"}, "pre_install": ["touch a"], "install": "make"},
        WHERE,
    )
    assert s == Steps({"SETUPTOOLS_SCM_PRETEND_VERSION": "7.4.0"}, ("touch a",), "make")
    assert parse_steps({}, WHERE) == Steps()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"env": ["A=1"]}, "env"),
        ({"env": {"A": 1}}, "env"),
        ({"env": {"1A": "x"}}, "env"),
        ({"pre_install": "apt-get install x"}, "pre_install"),
        ({"pre_install": [""]}, "pre_install"),
        ({"install": ""}, "install"),
        ({"install": ["pip", "install"]}, "install"),
    ],
)
def test_bad_fields_are_named(raw, field):
    with pytest.raises(KvagentError, match=rf"^recipe 'x__y-1' in r.json: field '{field}'"):
        parse_steps(raw, WHERE)


def test_multi_line_steps_are_refused():
    with pytest.raises(KvagentError, match="one line each"):
        parse_steps({"install": "a\nb"}, WHERE)


def test_install_order_recipe_then_spec_then_kvagent():
    assert install_command(Steps(install="make"), "pip install -e .") == "make"
    assert install_command(Steps(), "pip install -e .") == "pip install -e ."
    assert install_command(Steps(), None) == EDITABLE


def test_dockerfile_lines():
    pre, chain = dockerfile_lines(Steps({"V": "1 2"}, ("touch a",)), "python -m pip install -e .")
    assert pre.splitlines() == [
        "RUN git config --system --add safe.directory '*'",
        'ENV V="1 2"',
        "RUN touch a",
    ]
    # The spec's install first, then kvagent's offline editable install.
    assert chain == f"(python -m pip install -e .) || ({EDITABLE})"
    # A recipe's own install is not second-guessed.
    assert dockerfile_lines(Steps(install="make"), "x")[1] == "(make)"


def _graded(f2p_ok, f2p_bad, p2p_bad=(), resolved=False, error=None, missing=()):
    return {
        "resolved": resolved,
        "error": error,
        "missing_tests": list(missing),
        "tests_status": {
            "FAIL_TO_PASS": {"success": list(f2p_ok), "failure": list(f2p_bad)},
            "PASS_TO_PASS": {"success": [], "failure": list(p2p_bad)},
        },
    }


def test_judge_verified():
    out = judge(_graded([], ["t1"]), _graded(["t1"], [], resolved=True))
    assert out == {
        "reasons": [],
        "empty_fails": True,
        "f2p_fail_before": True,
        "tests_found": True,
        "gold_resolves": True,
    }


def test_judge_refuses_a_gold_run_whose_log_lacks_names():
    """Even where swebench would call the gold patch resolved (a FAIL_ONLY repository counts an
    absent test as passing), a name with no result in the log is not verified; the reason shows
    the first missing names."""
    missing = [f"test_{i} (app.tests.T)" for i in range(7)]
    out = judge(_graded([], ["t1"]), _graded(["t1"], [], resolved=True, missing=missing))
    assert out["tests_found"] is False and out["gold_resolves"] is True
    (reason,) = out["reasons"]
    assert reason.startswith("7 FAIL_TO_PASS/PASS_TO_PASS names are not in the gold run's test output: ")
    assert "test_0 (app.tests.T), test_1 (app.tests.T)" in reason and reason.endswith("(+2 more)")


def test_judge_names_each_failure():
    out = judge(_graded(["t1"], ["t2"]), _graded(["t1"], ["t2"], ["p1"]))
    assert out["f2p_fail_before"] is False and out["gold_resolves"] is False and out["empty_fails"] is True
    text = "\n".join(out["reasons"])
    assert "FAIL_TO_PASS pass before the gold patch: t1" in text
    assert "FAIL_TO_PASS still fail: t2" in text and "PASS_TO_PASS fail: p1" in text
    out = judge(_graded([], [], error="test_patch did not apply"), None)
    assert out["empty_fails"] is False and "empty patch: test_patch did not apply" in out["reasons"]


def test_format_report():
    rep = {"instance_id": "x__y-1", "builds": True, "f2p_fail_before": False, "empty_fails": True}
    rep |= {"gold_resolves": None, "ok": False, "reasons": ["why"]}
    rep["environment"] = "environment differs: python 3.9 (spec 3.10)"
    assert format_report(rep).splitlines() == [
        "x__y-1  builds yes  tests_found -  f2p_fail_before NO  empty_fails yes  gold_resolves -  => NOT verified",
        "    environment differs: python 3.9 (spec 3.10)",
        "    why",
    ]


def test_recipe_file_errors_name_the_field(tmp_path):
    from kvagent.evals.recipe import load_recipes

    f = tmp_path / "r.json"
    base = {"repo": "o/n", "source": {"sdist": "n==1.0"}}
    f.write_text(json.dumps({"format": 1, "recipes": {"o__n-1": {**base, "env": {"A": 2}}}}))
    with pytest.raises(KvagentError, match=rf"recipe 'o__n-1' in {f}: field 'env'"):
        load_recipes([f])
    f.write_text(json.dumps({"format": 1, "recipes": {"o__n-1": {**base, "install": "make"}}}))
    r = load_recipes([f])["o__n-1"]
    assert r.steps.install == "make" and "install" not in r.extra
    # The steps are part of what the image is built from.
    f.write_text(json.dumps({"format": 1, "recipes": {"o__n-1": {**base, "install": "make all"}}}))
    assert load_recipes([f])["o__n-1"].digest() != r.digest()


def test_git_source_with_unset_variable_is_named(tmp_path, monkeypatch):
    from kvagent.evals.images import build_instance_image
    from kvagent.evals.recipe import load_recipes

    f = tmp_path / "r.json"
    src = {"git": "$KVAGENT_TEST_UNSET_MIRRORS/o/n", "commit": "abc"}
    f.write_text(json.dumps({"format": 1, "recipes": {"o__n-1": {"repo": "o/n", "source": src}}}))
    monkeypatch.delenv("KVAGENT_TEST_UNSET_MIRRORS", raising=False)

    class _Client:  # the image is "missing", the base "present": the build reaches the source
        class images:
            @staticmethod
            def get(tag):
                if "base" in tag:
                    return object()
                import docker

                raise docker.errors.ImageNotFound(tag)

    with pytest.raises(KvagentError, match=r"field 'source.git' .*KVAGENT_TEST_UNSET_MIRRORS.*not set"):
        build_instance_image("o__n-1", recipes=load_recipes([f]), client=_Client())
