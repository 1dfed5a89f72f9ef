"""Every test module is in exactly one tier, named by the marker it declares at its top (tests/conftest.py
TIERS; a module that names none is integration), and the fast tier keeps its promise."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import TIERS

pytestmark = pytest.mark.fast

HERE = Path(__file__).resolve().parent
MODULES = sorted(p.stem for p in HERE.glob("test_*.py"))
PROCESS_MARKERS = ("integration", "e2e", "dist", "compose", "vllm", "netns", "configs", "gpu", "slow")


def module_marks(module: str) -> list[str]:
    """The marker names of the module's own `pytestmark = ...` (pytest.mark.X, alone or in a list)."""
    tree = ast.parse((HERE / f"{module}.py").read_text())
    marks: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in stmt.targets):
            for node in ast.walk(stmt.value):
                if isinstance(node, ast.Attribute) and getattr(node.value, "attr", None) == "mark":
                    marks.append(node.attr)
    return marks


def tier_of(module: str) -> str:
    named = [m for m in module_marks(module) if m in TIERS]
    return named[0] if named else "integration"


FAST = [m for m in MODULES if tier_of(m) == "fast"]


@pytest.mark.parametrize("module", MODULES)
def test_each_module_names_at_most_one_tier(module: str) -> None:
    assert len([m for m in module_marks(module) if m in TIERS]) <= 1, module


def test_the_fast_tier_is_a_real_subset() -> None:
    assert 30 <= len(FAST) < len(MODULES) - 30, FAST
    assert "test_tiers" in FAST


def test_a_module_without_a_tier_is_integration() -> None:
    assert tier_of("test_processes") == "integration"  # declares it
    assert "integration" not in module_marks("test_cli") and tier_of("test_cli") == "integration"


@pytest.mark.parametrize("module", FAST)
def test_a_fast_module_starts_no_process(module: str) -> None:
    """A fast module marks nothing process-level and starts no process."""
    text = (HERE / f"{module}.py").read_text()
    assert not set(module_marks(module)) & set(PROCESS_MARKERS), module
    if module != "test_tiers":
        assert not any(f"pytest.mark.{m}" in text for m in PROCESS_MARKERS), module
        assert "subprocess" not in text and "sys.executable" not in text, module


# `make test` keeps at least one whole run per major path; the e2e tier only repeats them (tests/conftest.py)
KEPT = {
    "GRPO `up` + replay --check": ("test_replay_outputs", "test_a_multi_process_up_run_passes_check"),
    "`up` with and without the fork server": (
        "test_proctitle",
        "test_up_and_every_actor_show_their_title_with_the_runs_name",
    ),
    "classic RL": ("test_supervisor", "test_the_env_runtime_replaces_a_crashed_env_actor_and_ends_with_the_learner"),
    "kill and resume, record whole": (
        "test_record_whole",
        "test_ctrl_c_between_the_checkpoint_and_the_ack_then_resume_keeps_every_row",
    ),
    "the API": ("test_api", "test_readme_example_runs"),
}
OPT_IN = {"e2e", "slow", "vllm", "compose", "dist", "gpu", "configs"}


def function_marks(module: str, name: str) -> list[str]:
    tree = ast.parse((HERE / f"{module}.py").read_text())
    fn = next(s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == name)
    return [n.attr for d in fn.decorator_list for n in ast.walk(d) if isinstance(n, ast.Attribute)]


@pytest.mark.parametrize("path", sorted(KEPT))
def test_make_test_keeps_a_whole_run_of_each_major_path(path: str) -> None:
    module, name = KEPT[path]
    assert not OPT_IN & {*module_marks(module), *function_marks(module, name)}, (path, module, name)


def test_the_e2e_tier_is_not_empty() -> None:
    assert any("pytest.mark.e2e" in (HERE / f"{m}.py").read_text() for m in MODULES if m != "test_tiers")


def test_the_marker_is_applied(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fast") is not None
    assert request.node.get_closest_marker("integration") is None
