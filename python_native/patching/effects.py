"""Side effects: what a forward writes besides its result, read from its source before any probe runs.

A forward that counts its calls, logs, or keeps state on a module or in a global would lose that
effect once its module is routed to an op, and a probe running it would leave a trace. ``writes``
reads the function's source (``inspect`` and ``ast``, for the function the method resolves to, every
wrapper around it, and the methods of the class it calls on ``self``) and names the first effect it
finds:

- an attribute or item written, augmented or deleted on anything but a fresh local (a name the
  forward binds itself, not from an argument, an attribute or a view of one): ``self.calls += 1``,
  ``self.cache = x``, ``d[k] = v``, ``obj.attr = ...``;
- an in-place tensor method (``add_``, ``copy_``, ...) on an argument, an attribute, or a local
  that aliases one (``h = x``, ``h = x.view(...)``);
- a ``global`` or ``nonlocal`` statement;
- a call of ``print`` or a logger (``logger.info``, ``logging.warning``, ``log.debug``, ...).

``warnings.warn`` is not counted: probes run with warnings ignored, which leaves no trace (not even
in a module's warning registry), and a warning speaks of a call's arguments, which a replacement
routes only where the probe confirmed them.

A function whose source cannot be read (built in, compiled, defined in a string) is reported as
such: nothing can say it has no effect. Functions of torch itself are trusted.
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
import threading
from collections.abc import Callable
from typing import Any

# Methods that may return their receiver or a view of it: a local bound from one aliases its source.
VIEWS = frozenset({
    "view", "view_as", "reshape", "reshape_as", "to", "type", "type_as", "float", "half", "bfloat16", "double",
    "contiguous", "detach", "transpose", "permute", "expand", "expand_as", "narrow", "select", "squeeze",
    "unsqueeze", "flatten", "unflatten", "chunk", "split", "unbind", "movedim", "swapaxes", "t", "mT", "T",
    "as_strided", "diagonal", "real", "imag", "cpu", "cuda", "data", "get", "setdefault", "values", "items",
})
LOG_METHODS = ("debug", "info", "warning", "warn", "error", "exception", "critical", "log", "fatal")

KINDS = ("state", "global", "print", "logger", "source")
_cache: dict[Any, tuple[list[tuple[str, str]], tuple[str, ...]]] = {}  # code -> (effects, methods called on self)
_lock = threading.Lock()


def writes(function: Callable[..., Any], what: str = "its forward", kinds: tuple[str, ...] = KINDS,
           owner: type | None = None, _seen: set | None = None) -> str | None:
    """Why ``function`` (or a wrapper between it and its original, or a method of ``owner`` it
    calls on ``self``) is not free of side effects of ``kinds``, as ``"<what> writes self.calls
    (model.py:12)"``; None where its source shows none."""
    seen = set() if _seen is None else _seen
    while function is not None and id(function) not in seen:
        seen.add(id(function))
        target = getattr(function, "__func__", function)
        module = getattr(target, "__module__", None) or ""
        if module == "torch" or module.startswith("torch."):  # trusted; what it wraps is read
            function = getattr(target, "__wrapped__", None)
            continue
        code = getattr(target, "__code__", None)
        if code is None:
            return f"{what} has no Python source to read ({type(function).__name__}): it may have side effects"
        with _lock:
            found = _cache.get(code)
        if found is None:
            found = _read(code)
            with _lock:
                _cache[code] = found
        first = next((text for kind, text in found[0] if kind in kinds), None)
        if first is not None:
            return f"{what} {first}"
        for name in found[1] if owner is not None else ():
            method = inspect.getattr_static(owner, name, None)
            method = getattr(method, "__func__", method)  # a staticmethod or classmethod's function
            if callable(method) and hasattr(method, "__code__"):
                why = writes(method, f"{what}, through self.{name},", kinds, owner, seen)
                if why is not None:
                    return why
        function = getattr(target, "__wrapped__", None)
    return None


def _read(code: Any) -> tuple[list[tuple[str, str]], tuple[str, ...]]:
    """(kind, what and where) for every effect in the source of ``code``, and the methods it calls on self."""
    unreadable = [("source", f"has no readable source ({code.co_filename}): it may have side effects")], ()
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(code)))
    except (OSError, TypeError, SyntaxError, IndentationError):
        return unreadable
    node = next((n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                 and getattr(n, "name", "<lambda>") == code.co_name), None)
    if node is None:
        return unreadable
    where = os.path.basename(code.co_filename)
    finder = _Finder(node)
    return ([(kind, f"{text} ({where}:{code.co_firstlineno + offset - 1})") for kind, text, offset in finder.all()],
            finder.methods())


def _owner(node: ast.AST) -> str:
    """The last name before a method: ``logger`` in ``self.logger.info``, ``getLogger`` in ``logging.getLogger().info``."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


class _Finder:
    """One function's effects: the names it binds, which of them are fresh, and the first write."""

    def __init__(self, node: ast.AST):
        self.node = node
        body = [node.body] if isinstance(node, ast.Lambda) else node.body
        self.nodes = [n for stmt in body for n in ast.walk(stmt)]
        args = node.args
        self.params = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
        self.packed = {a.arg for a in (args.vararg, args.kwarg) if a}  # a new tuple and dict on every call
        self.fresh = self._fresh()

    def _bindings(self) -> list[tuple[str, ast.AST | None]]:
        """(name, value or None when unknown) for every name the function binds."""
        out: list[tuple[str, ast.AST | None]] = []

        def bind(target: ast.AST, value: ast.AST | None) -> None:
            if isinstance(target, ast.Name):
                out.append((target.id, value))
            elif isinstance(target, (ast.Tuple, ast.List)):
                for element in target.elts:
                    bind(element, value)
            elif isinstance(target, ast.Starred):
                bind(target.value, value)

        for n in self.nodes:
            if isinstance(n, ast.Assign):
                for target in n.targets:
                    bind(target, n.value)
            elif isinstance(n, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
                bind(n.target, getattr(n, "value", None) if not isinstance(n, ast.AugAssign) else n.target)
            elif isinstance(n, (ast.For, ast.AsyncFor, ast.comprehension)):
                bind(n.target, n.iter)
            elif isinstance(n, ast.withitem) and n.optional_vars is not None:
                bind(n.optional_vars, n.context_expr)
        return out

    def _fresh(self) -> set[str]:
        """Locals bound only from values that are not an argument, an attribute or a view of one."""
        bindings = self._bindings()
        fresh = {name for name, _ in bindings} - self.params
        changed = True
        while changed:
            changed = False
            for name, value in bindings:
                if name in fresh and (value is None or self._aliases(value, fresh)):
                    fresh.discard(name)
                    changed = True
        return fresh

    def _aliases(self, value: ast.AST, fresh: set[str]) -> bool:
        if isinstance(value, (ast.Tuple, ast.List)):
            return any(self._aliases(v, fresh) for v in value.elts)
        if isinstance(value, ast.IfExp):
            return self._aliases(value.body, fresh) or self._aliases(value.orelse, fresh)
        if isinstance(value, ast.Call):
            func = value.func
            return isinstance(func, ast.Attribute) and func.attr in VIEWS and self._aliases(func.value, fresh)
        if isinstance(value, (ast.Attribute, ast.Subscript, ast.Starred)):
            return self._aliases(value.value, fresh)
        return isinstance(value, ast.Name) and value.id not in fresh

    def _outside(self, node: ast.AST) -> str | None:
        """The source of ``node`` when it is (or may alias) state outside the fresh locals."""
        return ast.unparse(node) if self._aliases(node, self.fresh) else None

    def methods(self) -> tuple[str, ...]:
        """The names called as methods of the first parameter (``self._norm(x)``)."""
        args = self.node.args
        first = ([*args.posonlyargs, *args.args] or [None])[0]
        if first is None:
            return ()
        return tuple(dict.fromkeys(
            n.func.attr for n in self.nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == first.arg))

    def all(self) -> list[tuple[str, str, int]]:
        found = [(n, self._effect(n)) for n in self.nodes]
        return sorted(((effect[0], effect[1], getattr(n, "lineno", 1)) for n, effect in found if effect is not None),
                      key=lambda e: e[2])

    def _effect(self, n: ast.AST) -> tuple[str, str] | None:
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            return "global", f"declares {type(n).__name__.lower()} {', '.join(n.names)}"
        if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            if self._outside(n.value) is None or (isinstance(n.value, ast.Name) and n.value.id in self.packed):
                return None
            return "state", f"{'deletes' if isinstance(n.ctx, ast.Del) else 'writes'} {ast.unparse(n)}"
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name) and n.target.id not in self.fresh:
            return "state", f"augments {n.target.id} in place (an argument or outer name)"
        if isinstance(n, ast.Call):
            return self._call(n)
        return None

    def _call(self, n: ast.Call) -> tuple[str, str] | None:
        func = n.func
        if isinstance(func, ast.Name) and func.id == "print":
            return "print", "calls print"
        if not isinstance(func, ast.Attribute):
            return None
        owner = _owner(func.value).lower()
        if (owner in ("logging", "log", "_log") or owner.endswith("logger")) and func.attr.split("_")[0] in LOG_METHODS:
            return "logger", f"calls a logger ({ast.unparse(func)})"
        if func.attr.endswith("_") and not func.attr.startswith("_"):  # an in-place tensor method
            where = self._outside(func.value)
            return None if where is None else ("state", f"writes {where} in place ({func.attr})")
        return None
