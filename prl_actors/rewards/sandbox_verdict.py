"""Where a test's pass or fail is decided: outside the sandbox, from values it returns as data.

A test `assert f([3, 1]) == [1, 3]` is split into a probe, `f([3, 1])`, the only part that needs the
model's program, and a verdict, `__v0 == [1, 3]`. Only the probes enter the sandbox; it answers one
line per test with the probes' values, encoded as plain data (numbers, strings, bytes, None and
containers of them: sandbox_values.py's `encode` runs inside). The verdict is then evaluated here, on the decoded
values (simple comparisons of plain data), or, when it calls functions (`set(__v0) == {1, 3}`,
`math.isclose(__v0, 0.5)`), in a second sandbox that runs the row's `test_setup` and the verdicts
but never the model's program.

Why this is sound: everything the model's program can touch (its memory, the harness it shares a
process with, the result pipe) can only change the values it reports, and a value is just its
answer; the expected values never enter its sandbox, so forging a pass means producing the right
answer. A test's own imports before its assert are its `prelude`, run before its probes and its
verdict. Tests of other shapes (not one `assert` after imports, or a probe that uses a comprehension's own
variable, as in `assert all(f(i) for i in xs)`) are run whole inside, their verdict reported by the
sandbox itself (`inside`), which a hostile program can forge: docs/SECURITY.md.
"""

from __future__ import annotations

import ast
import builtins
import json
import operator
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from prl_actors.rewards.sandbox_values import decode

COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}  # fmt: skip


COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
SCOPES = (ast.Lambda, ast.NamedExpr, *COMPREHENSIONS)


class Unjudgeable(ValueError):
    """A verdict this module does not evaluate itself (it calls something): the judge sandbox does."""


@dataclass
class Split:
    """One test: the probes the sandbox evaluates, and the verdict over their values `__v0`, `__v1`..."""

    probes: list[str] = field(default_factory=list)
    verdict: str = "__v0"
    inside: bool = False  # the whole test ran in the sandbox: its single probe is the verdict itself
    prelude: str = ""  # the test's own imports before its assert: run before its probes and its verdict


def split_tests(code: str, setup: str, tests: Sequence[str]) -> list[Split]:
    """Each test split into probes and a verdict (see the module docstring)."""
    trusted = _names_bound(setup) | set(dir(builtins)) | set(sys.stdlib_module_names)
    program = _names_bound(code, program=True)
    return [_split(test, trusted - program) for test in tests]


def _names_bound(source: str, program: bool = False) -> set[str]:
    """Top-level names `source` binds; for the program, not a plain `import math` of a stdlib module
    (the judge imports the real one)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            bound = {(a.asname or a.name).split(".")[0]: a for a in node.names}
            names |= {n for n, a in bound.items() if not program or not _plain_stdlib(node, a)}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def _plain_stdlib(node: ast.Import | ast.ImportFrom, alias: ast.alias) -> bool:
    return isinstance(node, ast.Import) and alias.asname is None and alias.name in sys.stdlib_module_names


def _split(test: str, trusted: set[str]) -> Split:
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return Split([], "False")  # a test that does not parse fails
    *imports, last = tree.body or [ast.Pass()]
    if not isinstance(last, ast.Assert) or not all(isinstance(n, ast.Import | ast.ImportFrom) for n in imports):
        return Split([test], inside=True)
    prelude = "\n".join(ast.unparse(n) for n in imports)
    lifter = _Lifter(trusted | _names_bound(prelude))
    try:
        verdict = ast.unparse(lifter.visit(last.test))
    except RecursionError:
        return Split([test], inside=True)
    return Split([test], inside=True) if lifter.local else Split(lifter.probes, verdict, prelude=prelude)


class _Lifter(ast.NodeTransformer):
    """Replaces each outermost expression that needs the program (a name it may define, or a call,
    attribute or subscript of one) by a placeholder `__vN`, collecting its source as a probe."""

    def __init__(self, trusted: set[str]) -> None:
        self.trusted, self.local = set(trusted), False
        self.probes: list[str] = []

    def visit(self, node: ast.AST) -> Any:
        if isinstance(node, SCOPES):
            return self._scope(node)
        if isinstance(node, ast.expr) and self._is_probe(node):
            self.probes.append(ast.unparse(node))
            self.trusted.add(f"__v{len(self.probes) - 1}")
            return ast.Name(id=f"__v{len(self.probes) - 1}", ctx=ast.Load())
        return self.generic_visit(node)

    def _scope(self, node: ast.expr) -> ast.expr:
        """A lambda or comprehension binds names of its own: the iterable of a comprehension's first
        `for` (evaluated outside it) may hold probes, `all(x > 0 for x in f(3))`; anything else
        in it that needs the program makes the whole test run inside (`self.local`)."""
        bound: set[str] = set()
        if isinstance(node, COMPREHENSIONS):
            node.generators[0].iter = self.visit(node.generators[0].iter)
            bound = {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Lambda):
            a = node.args
            bound = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg] if x is not None}
        self.local = self.local or self._untrusted(node, bound)
        return node

    def _untrusted(self, node: ast.AST, bound: set[str] = frozenset()) -> bool:  # type: ignore[assignment]
        return any(isinstance(n, ast.Name) and n.id not in self.trusted and n.id not in bound for n in ast.walk(node))

    def _is_probe(self, node: ast.expr) -> bool:
        head: ast.expr = node
        while isinstance(head, ast.Call | ast.Attribute | ast.Subscript):
            head = head.func if isinstance(head, ast.Call) else head.value
        return head is not node and self._untrusted(head) or isinstance(node, ast.Name) and self._untrusted(node)


def decode_line(line: bytes, count: int) -> list[Any] | None:
    """The values of one test's `count` probes from the sandbox's line; None when a probe raised,
    the line is malformed or the count differs (the test fails)."""
    try:
        data = json.loads(line)
        if not isinstance(data, list) or len(data) != count:
            return None
        return [decode(x) for x in data]
    except (ValueError, TypeError, RecursionError, MemoryError, OverflowError):
        return None


def judge(verdict: str, values: Sequence[Any]) -> bool:
    """The verdict evaluated on plain data, here; Unjudgeable when it calls anything."""
    try:
        return bool(_eval(ast.parse(verdict, mode="eval").body, values))
    except (TypeError, ValueError, ArithmeticError, RecursionError, MemoryError, LookupError):
        return False


def _eval(node: ast.expr, values: Sequence[Any]) -> Any:
    if isinstance(node, ast.Name) and node.id.startswith("__v"):
        return values[int(node.id[3:])]
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, values)
            if not COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        results = (_eval(v, values) for v in node.values)
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _eval(node.operand, values)
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        items = [_eval(e, values) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise Unjudgeable(ast.unparse(node)) from None


def judgeable_here(verdict: str) -> bool:
    """`judge` can evaluate this verdict itself (no calls, attributes or arithmetic beyond literals)."""
    try:
        _eval(ast.parse(verdict, mode="eval").body, _Anything())
    except Unjudgeable:
        return False
    except (TypeError, ValueError, ArithmeticError, RecursionError, LookupError, SyntaxError):
        return True
    return True


class _Anything(Sequence[Any]):
    """Stand-in values for `judgeable_here`: every placeholder is None."""

    def __getitem__(self, i: Any) -> Any:
        return None

    def __len__(self) -> int:
        return 1 << 30
