"""Child process of `kvagent.evals.specs`: asks swebench 4.x for each instance's spec and eval script.

swebench 5 dropped the per-(repo, version) specs from its code (its datasets carry `eval_script`
instead), and one interpreter cannot import two swebench releases, so the last release with them
runs here, first on sys.path, while the parent keeps swebench 5. Run as
`python _swebench_specs_child.py SPECS_WHEEL < instances.json > specs.json`; imports no kvagent.
"""

import json
import sys
import types


def main() -> None:
    wheel = sys.argv[1]
    # sys.path[0] is this file's folder (kvagent/evals), whose datasets.py would shadow HF datasets.
    sys.path[0] = wheel
    # swebench 4's top-level __init__ imports its whole toolchain (collect, versioning, docker
    # builds); the spec modules need none of it, so the package is entered without running it.
    pkg = types.ModuleType("swebench")
    pkg.__path__ = [f"{wheel}/swebench"]
    sys.modules["swebench"] = pkg

    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.python import get_test_directives, make_eval_script_list_py

    out = {}
    for inst in json.load(sys.stdin):
        specs = MAP_REPO_VERSION_TO_SPECS.get(inst["repo"], {}).get(inst["version"])
        if specs is None:
            versions = sorted(MAP_REPO_VERSION_TO_SPECS.get(inst["repo"], {}))
            out[inst["instance_id"]] = {"error": "no spec", "versions": versions}
            continue
        script = make_eval_script_list_py(
            inst, specs, "testbed", "/testbed", inst["base_commit"], inst["test_patch"]
        )
        out[inst["instance_id"]] = {
            "specs": specs,
            "directives": get_test_directives(inst),
            "eval_script_list": script,
        }
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
