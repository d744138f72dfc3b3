"""The mutation operators: enumerate every mutation site of a module, and apply one.

A *site* is one small change to the module's syntax tree. Sites are found by a
deterministic walk, so the k-th site of a freshly parsed tree is always the
same change: a mutant is applied by parsing the pristine source again and
changing its k-th site, then compiling the tree (original line numbers kept).

Operators (``DEFAULT_OPERATORS`` unless ``--operators`` says otherwise):

``cmp``     a comparison negated: ``<`` / ``>=``, ``>`` / ``<=``, ``==`` / ``!=``,
            ``is`` / ``is not``, ``in`` / ``not in``
``not``     a condition negated (``if``, ``while``, ``x if c else y``, comprehension
            filters), or a ``not`` dropped
``const``   a number changed: 0 -> 1, 1 -> 0, other ints +1, 0.0 -> 1.0, other floats x2
``bool``    ``True`` / ``False`` swapped; ``and`` / ``or`` swapped
``stmt``    a statement inside a function removed (expression statements, await
            included; assignments; ``raise``)
``bound``   (not default) a boundary moved: ``<`` / ``<=``, ``>`` / ``>=``
``arith``   (not default) ``+`` / ``-``, ``*`` / ``/``, ``**`` -> ``*``

Never mutated, because a mutant there is either noise or cannot run: docstrings, ``...``,
annotations, ``assert`` statements (internal invariants), ``if TYPE_CHECKING:``
blocks, ``__all__``, imports, and calls to the module logger ``log.<level>(...)``
(removal or arguments: log text is asserted by the process tests, not the unit
tests this run uses). The run prints how many log calls it left alone.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["ALL_OPERATORS", "DEFAULT_OPERATORS", "Site", "apply_site", "find_sites"]

DEFAULT_OPERATORS = ("cmp", "not", "const", "bool", "stmt")
ALL_OPERATORS = (*DEFAULT_OPERATORS, "bound", "arith")

_NEGATED_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_BOUND_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
}
_ARITH: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult, ast.Pow: ast.Mult,
}
_REMOVABLE = (ast.Expr, ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Raise)


@dataclass(frozen=True)
class Site:
    """One mutation: where, what, and an id that survives unrelated edits of the file."""

    index: int
    op: str
    line: int
    qualname: str
    before: str
    after: str
    mutant_id: str

    @property
    def description(self) -> str:
        return f"{_short(self.before)} -> {_short(self.after)}"


# A site while walking: (operator, line, before text, after text, apply(node)).
_Change = tuple[str, int, str, str, Callable[[], None]]


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_log_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "log"
    )


def _is_docstring(node: ast.stmt) -> bool:
    """A docstring, or ``...`` (a Protocol's or an overload's body, never run)."""
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and (isinstance(node.value.value, str) or node.value.value is Ellipsis)
    )


def _skipped_statement(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assert | ast.Import | ast.ImportFrom):
        return True
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
        return True
    if isinstance(node, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
        return True
    return _is_docstring(node) or (isinstance(node, ast.Expr) and _is_log_call(node.value))


class _Walker:
    """Deterministic walk that lists every change the chosen operators allow."""

    def __init__(self, operators: tuple[str, ...]) -> None:
        self.ops = set(operators)
        self.changes: list[tuple[str, _Change]] = []  # (qualname, change)
        self.log_calls = 0
        self._names: list[str] = []

    def walk(self, node: ast.AST, in_function: bool = False) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            self._names.append(node.name)
            inner = in_function or not isinstance(node, ast.ClassDef)
            # Decorators, defaults and annotations left alone; the body's own
            # statements are removable like those of any nested block.
            self._statements(node, "body", node.body, inner)
            self._names.pop()
            return
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns", "type_comment"):
                continue
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self._statements(node, name, value, in_function)
                    continue
                for item in value:
                    if isinstance(item, ast.AST):
                        self.walk(item, in_function)
            elif isinstance(value, ast.AST):
                if _is_log_call(value):
                    self.log_calls += 1
                    continue
                self.walk(value, in_function)
        self._expression(node)

    def _statements(self, parent: ast.AST, field: str, body: list[ast.stmt],
                    in_function: bool) -> None:
        for i, item in enumerate(body):
            if _skipped_statement(item):
                self.log_calls += isinstance(item, ast.Expr) and _is_log_call(item.value)
                continue
            if in_function and isinstance(item, _REMOVABLE) and "stmt" in self.ops:
                self._remove(parent, field, i, item)
            self.walk(item, in_function)

    # -- the operators ---------------------------------------------------------

    def _add(self, op: str, node: ast.AST, before: str, after: str,
             apply: Callable[[], None]) -> None:
        line = getattr(node, "lineno", 0)
        self.changes.append((".".join(self._names) or "<module>", (op, line, before, after, apply)))

    def _remove(self, parent: ast.AST, field: str, index: int, stmt: ast.stmt) -> None:
        def apply() -> None:
            body = getattr(parent, field)
            body[index] = ast.copy_location(ast.Pass(), stmt)

        self._add("stmt", stmt, ast.unparse(stmt), "pass", apply)

    def _expression(self, node: ast.AST) -> None:
        if isinstance(node, ast.Compare):
            self._compare(node)
        elif isinstance(node, ast.If | ast.While | ast.IfExp):
            self._negate(node, "test")
        elif isinstance(node, ast.comprehension):
            for i in range(len(node.ifs)):
                self._negate_item(node, i)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and "not" in self.ops:
            operand = node.operand

            def drop_not() -> None:
                # ``not not x`` is ``x`` wherever a truth value is read, and
                # needs no access to the parent node.
                node.operand = ast.copy_location(ast.UnaryOp(ast.Not(), operand), operand)

            self._add("not", node, ast.unparse(node), ast.unparse(operand), drop_not)
        elif isinstance(node, ast.BoolOp) and "bool" in self.ops:
            new: ast.boolop = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            after = ast.unparse(ast.BoolOp(new, node.values))

            def swap_boolop() -> None:
                node.op = new

            self._add("bool", node, ast.unparse(node), after, swap_boolop)
        elif isinstance(node, ast.Constant):
            self._constant(node)
        elif isinstance(node, ast.BinOp | ast.AugAssign) and "arith" in self.ops:
            swapped = _ARITH.get(type(node.op))
            if swapped is not None:
                before = ast.unparse(node)
                old = node.op
                node.op = swapped()
                after = ast.unparse(node)
                node.op = old

                def swap_arith() -> None:
                    node.op = swapped()

                self._add("arith", node, before, after, swap_arith)

    def _compare(self, node: ast.Compare) -> None:
        for i, cmp in enumerate(node.ops):
            for op, table in (("cmp", _NEGATED_CMP), ("bound", _BOUND_CMP)):
                swapped = table.get(type(cmp))
                if swapped is None or op not in self.ops:
                    continue
                before = ast.unparse(node)
                node.ops[i] = swapped()
                after = ast.unparse(node)
                node.ops[i] = cmp

                def apply(i: int = i, swapped: type[ast.cmpop] = swapped) -> None:
                    node.ops[i] = swapped()

                self._add(op, node, before, after, apply)

    def _covered_elsewhere(self, test: ast.expr) -> bool:
        """True when negating ``test`` would duplicate another operator's mutant."""
        if isinstance(test, ast.Compare) and len(test.ops) == 1:
            return "cmp" in self.ops and type(test.ops[0]) in _NEGATED_CMP
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return True  # dropping the ``not`` is the same mutant
        return isinstance(test, ast.Constant)  # ``while True``: the bool operator's

    def _negate(self, node: ast.If | ast.While | ast.IfExp, field: str) -> None:
        test = getattr(node, field)
        if "not" not in self.ops or self._covered_elsewhere(test):
            return

        def apply() -> None:
            setattr(node, field, ast.copy_location(ast.UnaryOp(ast.Not(), test), test))

        self._add("not", test, ast.unparse(test), f"not ({ast.unparse(test)})", apply)

    def _negate_item(self, node: ast.comprehension, i: int) -> None:
        test = node.ifs[i]
        if "not" not in self.ops or self._covered_elsewhere(test):
            return

        def apply() -> None:
            node.ifs[i] = ast.copy_location(ast.UnaryOp(ast.Not(), test), test)

        self._add("not", test, ast.unparse(test), f"not ({ast.unparse(test)})", apply)

    def _constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool):
            if "bool" in self.ops:
                self._set_constant(node, "bool", not value)
            return
        if "const" not in self.ops:
            return
        if isinstance(value, int):
            self._set_constant(node, "const", 1 if value == 0 else 0 if value == 1 else value + 1)
        elif isinstance(value, float):
            self._set_constant(node, "const", 1.0 if value == 0.0 else value * 2)

    def _set_constant(self, node: ast.Constant, op: str, new: object) -> None:
        def apply() -> None:
            node.value = new

        self._add(op, node, repr(node.value), repr(new), apply)


def _walk(tree: ast.Module, operators: tuple[str, ...]) -> _Walker:
    walker = _Walker(operators)
    walker.walk(tree)
    return walker


def find_sites(source: str, relpath: str,
               operators: tuple[str, ...] = DEFAULT_OPERATORS) -> tuple[list[Site], int]:
    """Every site of ``source`` for ``operators``, and how many log calls were left alone."""
    walker = _walk(ast.parse(source), operators)
    sites: list[Site] = []
    seen: dict[str, int] = {}
    for index, (qualname, (op, line, before, after, _apply)) in enumerate(walker.changes):
        # The id names the change by its text and function, not its line, so
        # editing an unrelated part of the file keeps the equivalents file valid.
        text = f"{relpath}|{qualname}|{op}|{before}|{after}"
        nth = seen.get(text, 0)
        seen[text] = nth + 1
        digest = hashlib.sha256(f"{text}|{nth}".encode()).hexdigest()[:8]
        stem = relpath.rsplit("/", 1)[-1].removesuffix(".py")
        sites.append(Site(index, op, line, qualname, before, after, f"{stem}-{op}-{digest}"))
    return sites, walker.log_calls


def apply_site(source: str, filename: str, index: int,
               operators: tuple[str, ...] = DEFAULT_OPERATORS) -> object:
    """The code object of ``source`` with its ``index``-th site changed."""
    tree = ast.parse(source)
    walker = _walk(tree, operators)
    walker.changes[index][1][4]()
    ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec", dont_inherit=True)
