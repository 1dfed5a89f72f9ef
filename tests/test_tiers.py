"""Every test module is in exactly one tier (tests/conftest.py FAST_MODULES; the rest: integration)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FAST_MODULES, tier_of

HERE = Path(__file__).resolve().parent
MODULES = {p.stem for p in HERE.glob("test_*.py")}
PROCESS_MARKERS = ("pytest.mark.integration", "pytest.mark.dist", "pytest.mark.compose", "pytest.mark.vllm")


def test_every_fast_module_exists() -> None:
    assert sorted(FAST_MODULES - MODULES) == [], "FAST_MODULES names a module that no longer exists"


def test_each_module_has_one_tier() -> None:
    tiers = {m: tier_of(m) for m in MODULES}
    assert set(tiers.values()) <= {"fast", "integration"}
    assert {m for m, t in tiers.items() if t == "fast"} == FAST_MODULES


@pytest.mark.parametrize("module", sorted(FAST_MODULES))
def test_a_fast_module_starts_no_process(module: str) -> None:
    """A module that marks its own tests as process-level cannot be in the fast tier."""
    text = (HERE / f"{module}.py").read_text()
    if module != "test_tiers":
        assert not any(m in text for m in PROCESS_MARKERS), module
        assert "subprocess" not in text and "sys.executable" not in text, module


def test_the_marker_is_applied(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("fast") is not None
