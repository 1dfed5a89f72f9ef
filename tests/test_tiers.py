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


def test_the_marker_is_applied(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fast") is not None
    assert request.node.get_closest_marker("integration") is None
