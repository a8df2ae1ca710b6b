"""Mutation operators: the bug classes of a kernel library, as edits of a ``@triton.jit``
function's source.

Each operator looks at one kind of AST node of the function's body and proposes edits of
that node's source span alone (the rest of the file stays byte for byte), each valid
Python and aimed at being valid Triton:

* ``compare_flip``: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=`` (a mask or bound
  off at its edge);
* ``off_by_one``: the pointer of a ``tl.load`` / ``tl.store`` moved by one element
  (``p + off`` -> ``p + off + 1``, also the ``cu_seqlens`` read of a wrong sequence end),
  a compared bound one less (``o < T`` -> ``o < T - 1``), a loop one trip short
  (``range(n)`` -> ``range(n - 1)``);
* ``drop_term``: ``a + b`` -> ``a``, ``a - b`` -> ``a``, ``acc += x`` -> ``acc = x``
  (``rsqrt(ss + eps)`` -> ``rsqrt(ss)``);
* ``scale_term``: the added term doubled (``a + b`` -> ``a + 2 * b``, ``acc += 2 * x``);
* ``wrong_index``: a sequence or head index used in addressing taken from a neighbour
  (``i_h`` -> ``(i_h ^ 1)``; names ``i_b*``, ``i_h*``, ``i_n*``, ``bos``, ``eos``);
* ``swap_broadcast``: ``x[:, None]`` <-> ``x[None, :]``;
* ``change_constant``: a float constant changed (``c`` -> ``2c``, ``0.0`` -> ``1.0``), a
  reduction over the other axis (``axis=0`` <-> ``axis=1``), ``maximum`` <-> ``minimum``
  and ``max`` <-> ``min``.

Rewrites (``REWRITES``) are the other family: edits a kernel developer makes on purpose,
equal in exact arithmetic, which change at most the rounding. Run as mutants
(``mutate --rewrites``) they measure the checks' false fails: each should survive.

* ``reassociate``: ``a + b + c`` -> ``a + (b + c)``, ``a * b * c`` -> ``a * (b * c)``, where
  the expression holds a float (a block value ``b_*``, a float constant, a call of
  ``FLOAT_CALLS``): integer offsets reassociate exactly, and would only cost runs;
* ``reciprocal``: ``a / b`` -> ``a * (1.0 / b)``;
* ``exp_as_exp2``: ``tl.exp(x)`` -> ``tl.exp2(x * 1.4426950408889634)`` (``log2(e)``).
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from typing import Iterator

OPERATORS = ("compare_flip", "off_by_one", "drop_term", "scale_term", "wrong_index", "swap_broadcast", "change_constant")
REWRITES = ("reassociate", "reciprocal", "exp_as_exp2")
LOG2_E = "1.4426950408889634"
FLOAT_CALLS = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sigmoid", "dot", "sum", "cumsum")
# Operands that keep their meaning anywhere in an arithmetic expression without parentheses.
ATOMS = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)

COMPARE_FLIPS = {ast.Lt: ("<", "<="), ast.LtE: ("<=", "<"), ast.Gt: (">", ">="), ast.GtE: (">=", ">"),
                 ast.Eq: ("==", "!="), ast.NotEq: ("!=", "==")}
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
# Program and sequence indices that address a head, a batch row or a sequence.
INDEX_NAME = re.compile(r"^(i_[bhn][a-z]*|bos|eos)$")
MEMORY_OPS = ("load", "store")
LOOPS = ("range", "static_range")
REDUCTIONS = ("sum", "max", "min", "cumsum", "cumprod", "argmax", "argmin", "reduce", "xor_sum")
SWAPPED_NAMES = {"maximum": "minimum", "minimum": "maximum", "max": "min", "min": "max"}
# Expressions that need no parentheses as the left operand of ``+ 1`` / ``- 1``, or as
# the right operand of ``2 *``.
ADDITIVE_SAFE = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant, ast.BinOp)
ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
PRODUCT_SAFE = (ast.Name, ast.Attribute, ast.Subscript, ast.Call, ast.Constant)


@dataclass(frozen=True)
class Edit:
    """One mutation: replace ``source[start:end]`` (``original``) with ``replacement``.
    ``lines`` are the first and last line of the mutated node (1-based, in the file)."""

    operator: str
    start: int
    end: int
    original: str
    replacement: str
    lines: tuple[int, int]


class SourceMap:
    """Character offsets of AST positions (whose columns count UTF-8 bytes) in a file's text."""

    def __init__(self, text: str):
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:col].decode(errors="replace"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]


def jit_functions(tree: ast.Module) -> Iterator[ast.FunctionDef]:
    """The module's ``@triton.jit`` functions (also those under ``autotune`` / ``heuristics``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list):
            yield node


def _is_jit(decorator: ast.AST) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Name) and target.id == "jit") or (isinstance(target, ast.Attribute) and target.attr == "jit")


def edits(fn: ast.FunctionDef, source: SourceMap, rewrites: bool = False) -> list[Edit]:
    """Every mutation of ``fn``'s body (``rewrites``: every rewrite), in source order; each
    one parses as Python."""
    found: list[Edit] = []
    body = fn.body[1:] if _has_docstring(fn) else fn.body
    for statement in body:
        for node in ast.walk(statement):
            found.extend(_node_rewrites(node, source) if rewrites else _node_edits(node, source))
    # the rest of the file is unchanged, so the function's own text decides whether it parses
    start = source.offset(fn.lineno, 0)
    end = source.offset(fn.end_lineno, fn.end_col_offset)
    valid = [e for e in set(found) if _parses(source.text, start, end, e)]
    return sorted(valid, key=lambda e: (e.start, e.end, e.operator, e.replacement))


def _has_docstring(fn: ast.FunctionDef) -> bool:
    first = fn.body[0] if fn.body else None
    return isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)


def _parses(text: str, start: int, end: int, edit: Edit) -> bool:
    """Whether ``text[start:end]`` (a function, from its ``def`` line) parses with ``edit``."""
    try:
        ast.parse(textwrap.dedent(text[start:edit.start] + edit.replacement + text[edit.end:end]))
    except SyntaxError:
        return False
    return True


def _node_edits(node: ast.AST, source: SourceMap) -> Iterator[Edit]:
    if isinstance(node, ast.Compare):
        yield from _compare(node, source)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        yield from _term(node, source)
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.Add, ast.Sub)):
        yield from _augmented(node, source)
    elif isinstance(node, ast.Call):
        yield from _call(node, source)
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and INDEX_NAME.match(node.id):
        yield _whole(node, source, "wrong_index", f"({node.id} ^ 1)")
    elif isinstance(node, ast.Subscript):
        yield from _broadcast(node, source)
    elif isinstance(node, ast.Constant) and type(node.value) is float:
        value = node.value * 2 if node.value != 0.0 else 1.0
        yield _whole(node, source, "change_constant", repr(value))
    elif isinstance(node, ast.Attribute) and node.attr in SWAPPED_NAMES and isinstance(node.ctx, ast.Load):
        start, end = source.span(node)
        yield Edit("change_constant", end - len(node.attr), end, node.attr, SWAPPED_NAMES[node.attr],
                   (node.lineno, node.end_lineno))


def _whole(node: ast.AST, source: SourceMap, operator: str, replacement: str) -> Edit:
    start, end = source.span(node)
    return Edit(operator, start, end, source.text[start:end], replacement, (node.lineno, node.end_lineno))


def _operator_token(source: SourceMap, left: ast.AST, right: ast.AST, token: str) -> tuple[int, int] | None:
    """Offsets of ``token`` in the text between two operands (parentheses may sit there)."""
    gap_start = source.span(left)[1]
    gap_end = source.span(right)[0]
    match = re.search(r"(?<![<>=!])" + re.escape(token) + r"(?![<>=])", source.text[gap_start:gap_end])
    if match is None:
        return None
    return gap_start + match.start(), gap_start + match.end()


def _compare(node: ast.Compare, source: SourceMap) -> Iterator[Edit]:
    lines = (node.lineno, node.end_lineno)
    operands = [node.left, *node.comparators]
    for i, op in enumerate(node.ops):
        flip = COMPARE_FLIPS.get(type(op))
        if flip is None:
            continue
        token = _operator_token(source, operands[i], operands[i + 1], flip[0])
        if token is not None:
            yield Edit("compare_flip", *token, flip[0], flip[1], lines)
    if len(node.ops) == 1 and isinstance(node.ops[0], ORDERING):
        bound = node.comparators[0]
        text = source.segment(bound)
        yield _whole(bound, source, "off_by_one", f"{_operand(bound, text, ADDITIVE_SAFE)} - 1")


def _operand(node: ast.AST, text: str, safe) -> str:
    """``text`` as an operand of ``+ 1`` / ``- 1`` (``ADDITIVE_SAFE``) or of ``2 *``."""
    if isinstance(node, ast.BinOp):
        return text if safe is ADDITIVE_SAFE and isinstance(node.op, ARITHMETIC) else f"({text})"
    return text if isinstance(node, safe) else f"({text})"


def _term(node: ast.BinOp, source: SourceMap) -> Iterator[Edit]:
    left = source.segment(node.left)
    right = source.segment(node.right)
    yield _whole(node, source, "drop_term", _operand(node.left, left, ADDITIVE_SAFE))
    start, end = source.span(node.right)
    yield Edit("scale_term", start, end, right, f"2 * {_operand(node.right, right, PRODUCT_SAFE)}",
               (node.lineno, node.end_lineno))


def _augmented(node: ast.AugAssign, source: SourceMap) -> Iterator[Edit]:
    token = "+=" if isinstance(node.op, ast.Add) else "-="
    lines = (node.lineno, node.end_lineno)
    where = _operator_token(source, node.target, node.value, token)
    if where is not None:
        yield Edit("drop_term", *where, token, "=", lines)
    value = source.segment(node.value)
    start, end = source.span(node.value)
    yield Edit("scale_term", start, end, value, f"2 * {_operand(node.value, value, PRODUCT_SAFE)}", lines)


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _call(node: ast.Call, source: SourceMap) -> Iterator[Edit]:
    name = _called_name(node)
    if name in MEMORY_OPS and isinstance(node.func, ast.Attribute) and node.args:
        pointer = node.args[0]
        text = source.segment(pointer)
        yield _whole(pointer, source, "off_by_one", f"{_operand(pointer, text, ADDITIVE_SAFE)} + 1")
    if name in LOOPS and node.args:
        stop = node.args[1] if len(node.args) >= 2 else node.args[0]
        text = source.segment(stop)
        yield _whole(stop, source, "off_by_one", f"{_operand(stop, text, ADDITIVE_SAFE)} - 1")
    axes = [k.value for k in node.keywords if k.arg == "axis"]
    if name in REDUCTIONS and len(node.args) >= 2:
        axes.append(node.args[1])
    for axis in axes:
        if isinstance(axis, ast.Constant) and axis.value in (0, 1) and type(axis.value) is int:
            yield _whole(axis, source, "change_constant", str(1 - axis.value))


def _is_full_slice(node: ast.AST) -> bool:
    return isinstance(node, ast.Slice) and node.lower is None and node.upper is None and node.step is None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _broadcast(node: ast.Subscript, source: SourceMap) -> Iterator[Edit]:
    index = node.slice
    if not (isinstance(index, ast.Tuple) and len(index.elts) == 2):
        return
    a, b = index.elts
    if _is_full_slice(a) and _is_none(b):
        replacement = "[None, :]"
    elif _is_none(a) and _is_full_slice(b):
        replacement = "[:, None]"
    else:
        return
    start = source.span(node.value)[1]
    end = source.span(node)[1]
    yield Edit("swap_broadcast", start, end, source.text[start:end], replacement, (node.lineno, node.end_lineno))


def _atom(node: ast.AST, source: SourceMap) -> str:
    text = source.segment(node)  # a negative literal is a UnaryOp, so parenthesised
    return text if isinstance(node, ATOMS) else f"({text})"


def _node_rewrites(node: ast.AST, source: SourceMap) -> Iterator[Edit]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)) \
            and isinstance(node.left, ast.BinOp) and type(node.left.op) is type(node.op) and _holds_float(node):
        sign = " + " if isinstance(node.op, ast.Add) else " * "
        a, b, c = (_atom(n, source) for n in (node.left.left, node.left.right, node.right))
        yield _whole(node, source, "reassociate", f"{a}{sign}({b}{sign}{c})")
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and not _is_unit(node.left):
        # (a numerator of +-1 is skipped: 1.0 * (1.0 / b) rounds as 1.0 / b does, an edit
        # that cannot move an error)
        a, b = _atom(node.left, source), _atom(node.right, source)
        yield _whole(node, source, "reciprocal", f"{a} * (1.0 / {b})")
    elif isinstance(node, ast.Call) and _called_name(node) == "exp" and isinstance(node.func, ast.Attribute) \
            and len(node.args) == 1 and not node.keywords:
        module = source.segment(node.func.value)
        yield _whole(node, source, "exp_as_exp2", f"{module}.exp2({_atom(node.args[0], source)} * {LOG2_E})")


def _is_unit(node: ast.AST) -> bool:
    """The literal 1 or -1 (int or float)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 1


def _holds_float(node: ast.AST) -> bool:
    for part in ast.walk(node):
        if isinstance(part, ast.Name) and part.id.startswith("b_"):
            return True
        if isinstance(part, ast.Constant) and type(part.value) is float:
            return True
        if isinstance(part, ast.Call) and _called_name(part) in FLOAT_CALLS:
            return True
    return False
