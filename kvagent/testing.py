"""Deterministic doubles of a model session and an engine, for tests of anything above the runtime
(the agent loop, chat, the eval runner): fixed replies played back over a real tokenizer. Also the
one-bug fixture instance (a git checkout and its SWE-bench record) that the eval tests and
scripts/kill_soak.py run on.

    session = ScriptedSession(tokenizer, ["<function=finish>...</function>"])
    result = run_episode(session, env, issue, tokenizer=tokenizer)
    record = calc_record(tmp_path / "repos", "fixture__calc-1")  # repos/fixture__calc-1 committed
"""

from __future__ import annotations

import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IM_END = "<|im_end|>"


@dataclass
class Generated:
    ids: list[int]
    text: str
    finish_reason: str


@dataclass
class FakeStats:
    """The fields of `kvagent.runtime.CacheStats` that the layers above read."""

    logical_length: int
    entries: list[int]
    total_kv_bytes: int
    rounds: int = 0
    evicted: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


class ScriptedSession:
    """Plays back fixed replies as a model would: stops after a stop string (finish `stop`), else
    ends the reply with `<|im_end|>` (finish `eos`); every returned id is fed, as the runtime does.

    With `on_token`, ids are handed out one at a time as `Session.generate` does: `on_token(id)`
    returning true ends the reply there (`interrupted`), and the rest of that reply is dropped.
    `after_token(n)`, if set, is called with the count of ids handed out so far (a test's hook)."""

    def __init__(
        self, tokenizer: Any, replies: Sequence[str], budget: int | None = None, layers: int = 2
    ) -> None:
        self.tokenizer = tokenizer
        self.replies = deque(replies)
        self.history: list[int] = []
        self.budget, self.layers = budget, layers
        self.calls: list[dict[str, Any]] = []
        self.appends: list[int] = []
        self.after_token: Callable[[int], None] | None = None
        self.handed = 0
        self.forgotten: list[list[int]] = []  # the positions of each forget() call
        self.rewound: list[int] = []  # the count of each rewind() call

    @property
    def logical_length(self) -> int:
        return len(self.history)

    @property
    def stats(self) -> FakeStats:
        held = len(self.history) if self.budget is None else min(len(self.history), self.budget)
        return FakeStats(len(self.history), [held] * self.layers, held * self.layers * 64)

    def append(self, ids: Sequence[int]) -> None:
        assert ids, "append of an empty chunk"
        self.appends.append(len(ids))
        self.history.extend(int(i) for i in ids)

    def generate(
        self,
        max_new_tokens: int,
        sampling: Any = None,
        stop: Sequence[str] = (),
        on_token: Callable[[int], bool | None] | None = None,
    ) -> Generated:
        assert max_new_tokens >= 1
        self.calls.append({"max_new_tokens": max_new_tokens, "sampling": sampling, "stop": list(stop)})
        if not self.replies:
            raise AssertionError("the scripted model ran out of replies")
        text = self.replies.popleft()
        cut = min((text.find(s) + len(s) for s in stop if s in text), default=-1)
        if cut >= 0:
            ids, reason = self.tokenizer.encode(text[:cut], add_special_tokens=False), "stop"
        else:
            ids = [
                *self.tokenizer.encode(text, add_special_tokens=False),
                self.tokenizer.convert_tokens_to_ids(IM_END),
            ]
            reason = "eos"
        if len(ids) > max_new_tokens:
            ids, reason = ids[:max_new_tokens], "length"
        out: list[int] = []
        for token in ids:
            out.append(token)
            self.history.append(token)
            self.handed += 1
            if self.after_token is not None:
                self.after_token(self.handed)
            if on_token is not None and on_token(token) and len(out) < len(ids):
                reason = "interrupted"
                break
        return Generated(out, self.tokenizer.decode(out), reason)

    def forget(self, positions: Sequence[int]) -> int:
        """Records the call (`forgotten`); like persistent mode, positions and history stay."""
        drop = sorted(set(int(p) for p in positions))
        assert all(0 <= p < len(self.history) for p in drop), "forget of a position not fed"
        self.forgotten.append(drop)
        return len(drop)

    def rewind(self, n: int) -> int:
        """Takes back the newest `n` ids, as Session.rewind does (never into the first append)."""
        assert 0 <= n <= len(self.history) - (self.appends[0] if self.appends else 0), (
            "rewind into the prompt"
        )
        del self.history[len(self.history) - n :]
        self.rewound.append(n)
        return n


class ScriptedEngine:
    """An engine double: `session(config)` plays back `replies(config)`; counts the sessions made."""

    def __init__(self, tokenizer: Any, replies: Callable[[Any], Sequence[str]]) -> None:
        self.tokenizer, self.replies = tokenizer, replies
        self.sessions = 0

    def session(self, config: Any) -> ScriptedSession:
        self.sessions += 1
        return ScriptedSession(self.tokenizer, list(self.replies(config)))

    def plan(self, config: Any) -> Any:
        """The plan `budget.check_run` asks (`Engine.plan`), of a one-layer model."""
        from kvagent.runtime.plan import CachePlan

        return CachePlan.prepare(config)


# ----------------------------------------------------------------------------- a fixture instance
# add() subtracts (the bug); sub() is right, so its test passes before and after the fix.
CALC_PY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
CALC_TEST_PATCH = """diff --git a/test_calc.py b/test_calc.py
new file mode 100644
--- /dev/null
+++ b/test_calc.py
@@ -0,0 +1,7 @@
+from calc import add, sub
+
+def test_add():
+    assert add(2, 3) == 5
+
+def test_sub():
+    assert sub(5, 3) == 2
"""


def git_repo(root: Path, files: Mapping[str, str]) -> str:
    """Writes `files` (relative path -> text) under `root` and commits them as the one base commit
    of a new repository; returns that commit's sha."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return head.stdout.strip()


def calc_record(repos: Path, instance_id: str, **fields: Any) -> dict[str, Any]:
    """The checkout `repos/instance_id` of CALC_PY and its SWE-bench record: test_add fails until
    add() is fixed, test_sub passes throughout; graded by pytest of this interpreter. `fields`
    replace or add record fields."""
    return {
        "instance_id": instance_id,
        "repo": "fixture/calc",
        "base_commit": git_repo(repos / instance_id, {"calc.py": CALC_PY}),
        "problem_statement": "add() subtracts instead of adding",
        "test_patch": CALC_TEST_PATCH,
        "patch": "",
        "FAIL_TO_PASS": ["test_calc.py::test_add"],
        "PASS_TO_PASS": ["test_calc.py::test_sub"],
        "log_parser": "parse_log_pytest",
        "test_cmd": f"{sys.executable} -m pytest -rA -p no:cacheprovider",
        **fields,
    }
