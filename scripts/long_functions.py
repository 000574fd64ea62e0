"""The package's long functions: each function's logical lines (the statements of its own body,
its docstring and nested functions and classes left out; those are counted on their own), the
ones over ``LIMIT`` listed, longest first.

A function may stay long when the comment block right above it (above its decorators) opens
with ``# long: <why>``, saying why a split would not read better; ``--check`` fails (exit 1) on a long
function without one (``tests/test_layers.py`` runs it). Usage::

    python scripts/long_functions.py [--limit N] [--check]
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "stability_callbacks"
LIMIT = 60
REASON = "# long:"


def _own_lines(fn: ast.AST) -> int:
    """The lines holding a statement of ``fn``'s own body (not of a nested def or class), its
    docstring left out."""
    lines: set[int] = set()
    body = list(fn.body)  # type: ignore[attr-defined]
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    todo = list(body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            lines.add(node.lineno)   # the def line itself is one line here
            continue
        if isinstance(node, ast.stmt):
            lines.add(node.lineno)
        todo.extend(ast.iter_child_nodes(node))
    return len(lines)


def _has_reason(lines: list[str], fn) -> bool:
    """Whether the comment block right above ``fn`` (above its decorators) opens with ``# long:``."""
    i = min([fn.lineno] + [d.lineno for d in fn.decorator_list]) - 2
    block = []
    while i >= 0 and lines[i].strip().startswith("#"):
        block.append(lines[i].strip())
        i -= 1
    return bool(block) and block[-1].startswith(REASON)


def long_functions(limit: int = LIMIT, package: Path = PACKAGE) -> list[tuple[int, str, bool]]:
    """``(logical lines, "path:line qualname", has a reason)`` of every function over ``limit``."""
    out = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        lines = source.splitlines()
        tree = ast.parse(source)
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{prefix}{child.name}"
                    stack.append((child, name + "."))
                    if isinstance(child, ast.ClassDef):
                        continue
                    n = _own_lines(child)
                    if n > limit:
                        out.append((n, f"{path.relative_to(package.parent)}:{child.lineno} {name}",
                                    _has_reason(lines, child)))
    return sorted(out, reverse=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=LIMIT)
    ap.add_argument("--check", action="store_true", help="exit 1 on a long function without a reason")
    args = ap.parse_args()
    found = long_functions(args.limit)
    for n, where, reason in found:
        print(f"{n:4d}  {where}{'  (reason given)' if reason else ''}")
    bare = [where for _, where, reason in found if not reason]
    if args.check and bare:
        print(f"{len(bare)} function(s) over {args.limit} logical lines without a '{REASON} ...' comment above",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
