"""tools/import_cycles.py: the project's check for module and package import circles (`make lint`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import import_cycles  # noqa: E402


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


ACYCLIC = {
    "pkg/__init__.py": "",
    "pkg/low/__init__.py": "",
    "pkg/low/a.py": "import os\n",
    "pkg/high/__init__.py": "",
    "pkg/high/b.py": "from pkg.low import a\nfrom ..low.a import x\n",
}


def test_an_acyclic_package_passes(tmp_path: Path) -> None:
    root = _package(tmp_path, ACYCLIC)
    assert import_cycles.check(root, ["pkg"], root / "none.txt") == []


def test_a_function_level_import_closes_a_planted_cycle(tmp_path: Path) -> None:
    root = _package(tmp_path, {**ACYCLIC, "pkg/low/a.py": "def f():\n    from pkg.high.b import y\n"})
    problems = import_cycles.check(root, ["pkg"], root / "none.txt")
    assert any("module import cycle: pkg.high.b <-> pkg.low.a" in p for p in problems), problems
    assert any("package import cycle: pkg.high <-> pkg.low" in p for p in problems), problems


def test_a_package_cycle_between_different_modules(tmp_path: Path) -> None:
    """high.b -> low.a and low.c -> high.d: no module circle, but low <-> high as packages."""
    files = {**ACYCLIC, "pkg/low/c.py": "from pkg.high import d\n", "pkg/high/d.py": ""}
    problems = import_cycles.check(_package(tmp_path, files), ["pkg"], tmp_path / "none.txt")
    assert problems == ["package import cycle: pkg.high <-> pkg.low\n    e.g. pkg.high -> pkg.low -> pkg.high"]


def test_type_checking_imports_do_not_count(tmp_path: Path) -> None:
    text = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high.b import y\n"
    root = _package(tmp_path, {**ACYCLIC, "pkg/low/a.py": text})
    assert import_cycles.check(root, ["pkg"], root / "none.txt") == []


def test_an_allowed_edge_exempts_its_cycle_only_and_must_exist(tmp_path: Path) -> None:
    root = _package(tmp_path, {**ACYCLIC, "pkg/low/a.py": "from pkg.high import b\n"})
    allow = root / "allowed.txt"
    allow.write_text("module pkg.low.a -> pkg.high.b  # planted\npackage pkg.low -> pkg.high  # planted\n")
    assert import_cycles.check(root, ["pkg"], allow) == []
    (root / "pkg/low/e.py").write_text("import pkg.high.f\n")  # a second circle through another edge
    (root / "pkg/high/f.py").write_text("import pkg.low.e\n")
    problems = import_cycles.check(root, ["pkg"], allow)
    assert problems == ["module import cycle: pkg.high.f <-> pkg.low.e\n    e.g. pkg.high.f -> pkg.low.e -> pkg.high.f"]
    (root / "pkg/low/a.py").write_text("")
    (root / "pkg/low/e.py").write_text("")
    problems = import_cycles.check(root, ["pkg"], allow)
    assert problems and all("no longer exists" in p for p in problems), problems


def test_an_allowed_edge_needs_a_reason(tmp_path: Path) -> None:
    root = _package(tmp_path, ACYCLIC)
    (root / "allowed.txt").write_text("module pkg.low.a -> pkg.high.b\n")
    with pytest.raises(SystemExit, match="reason"):
        import_cycles.check(root, ["pkg"], root / "allowed.txt")


def test_the_project_has_no_unlisted_cycle() -> None:
    assert import_cycles.main([]) == 0


def test_an_allowed_edge_that_closes_no_circle_must_go(tmp_path: Path) -> None:
    root = _package(tmp_path, ACYCLIC)
    allow = root / "allowed.txt"
    allow.write_text("module pkg.high.b -> pkg.low.a  # not a circle: a imports nothing\n")
    assert import_cycles.check(root, ["pkg"], allow) == [
        "allowed import edge closes no circle (remove it from allowed.txt): module pkg.high.b -> pkg.low.a"
    ]


LAYERED = {
    **ACYCLIC,
    "pkg/side/__init__.py": "",
    "pkg/side/c.py": "from pkg.low import a\n",
}
LAYERS = "pkg pkg.low\nisolated: pkg.high pkg.side\n"


def test_imports_down_the_layers_pass(tmp_path: Path) -> None:
    root = _package(tmp_path, {**LAYERED, "layers.txt": LAYERS})
    assert import_cycles.check(root, ["pkg"], root / "none.txt", root / "layers.txt") == []


def test_an_import_up_a_layer_fails_naming_both_packages(tmp_path: Path) -> None:
    files = {"pkg/low/a.py": "def f():\n    import pkg.side.c\n", "pkg/side/c.py": "import os\n"}
    root = _package(tmp_path, {**LAYERED, "layers.txt": LAYERS, **files})
    problems = import_cycles.check(root, ["pkg"], root / "none.txt", root / "layers.txt")
    assert problems == ["layer violation: pkg.low imports pkg.side, a higher layer (layers.txt)"]


def test_siblings_of_an_isolated_layer_may_not_import_each_other(tmp_path: Path) -> None:
    root = _package(tmp_path, {**LAYERED, "layers.txt": LAYERS, "pkg/side/c.py": "from pkg.high import b\n"})
    problems = import_cycles.check(root, ["pkg"], root / "none.txt", root / "layers.txt")
    assert problems == ["layer violation: pkg.side imports pkg.high, its sibling in an isolated layer (layers.txt)"]


def test_a_package_without_a_layer_fails(tmp_path: Path) -> None:
    root = _package(tmp_path, {**LAYERED, "layers.txt": "pkg pkg.low\nisolated: pkg.high\n"})
    problems = import_cycles.check(root, ["pkg"], root / "none.txt", root / "layers.txt")
    assert problems == ["package pkg.side has no layer in layers.txt"]


def test_the_project_is_layered() -> None:
    here = Path(__file__).resolve().parents[1]
    tools = here / "tools"
    assert (
        import_cycles.check(here, ["prl_actors"], tools / "import_cycles_allowed.txt", tools / "import_layers.txt")
        == []
    )
