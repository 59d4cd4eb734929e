"""A kernel's Python control flow rewritten to run its programs in lockstep.

Loops, ``if``s and ``return``s whose Python value differs per program run
through ``lockstep`` as SIMD runs SIMT code: a loop as often as its longest
program, an ``if`` both branches, each masked; variables read later are then
merged per program, or the launch gives way. ``and``, ``or`` and ``not``
become Triton's elementwise operations, as its code generator makes them.
Left alone (giving way where programs disagree): ``for`` loops not over a
call or with ``else``, a non-name target or jumps; ``if``s holding
``break``/``continue``; ``while`` (a spin lock in lockstep never lets go);
``x if c else y``.
"""

from __future__ import annotations

import ast
import threading
import weakref

from jt_dist._cpu import interpreter as _interpreter
from jt_dist._cpu import lockstep as _lockstep

# The closure variable the rewritten code calls, and its generated names.
_PREFIX = "_jt_ls"


def _name_nodes(nodes, ctx) -> list[ast.Name]:
  """Name nodes of ``ctx`` in ``nodes``, not generated; ``x += 1`` both."""
  found = []
  for node in nodes:
    for sub in ast.walk(node):
      if isinstance(sub, ast.AugAssign) and isinstance(sub.target, ast.Name):
        found.append(sub.target)
      elif (isinstance(sub, ast.Name) and isinstance(sub.ctx, ctx)
            and not sub.id.startswith(_PREFIX)):
        found.append(sub)
  return found


def _names(nodes, ctx) -> set[str]:
  return {n.id for n in _name_nodes(nodes, ctx)}


def _position(node, end: bool = False) -> tuple[int, int]:
  # A node without a position (one upstream's rewrite made) counts as last.
  prefix = "end_" if end else ""
  return (getattr(node, prefix + "lineno", None) or 1 << 30,
          getattr(node, prefix + "col_offset", None) or 0)


def _jumps(nodes, kinds) -> bool:
  """Whether ``nodes`` hold a statement of ``kinds`` for their own loop."""
  for node in nodes:
    if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
      # A nested loop owns its break/continue, not a return.
      inner = node.body + node.orelse, (ast.Return,)
    elif isinstance(node, (ast.FunctionDef, ast.Lambda, ast.ClassDef)):
      continue
    else:
      inner = list(ast.iter_child_nodes(node)), kinds
    if isinstance(node, kinds) or _jumps(*inner):
      return True
  return False


def _call(method: str, *args, target: str = _PREFIX, keywords=()):
  return ast.Call(
      func=ast.Attribute(value=ast.Name(id=target, ctx=ast.Load()),
                         attr=method, ctx=ast.Load()),
      args=list(args), keywords=list(keywords))


def _locals():
  return ast.Call(ast.Name("locals", ast.Load()), args=[], keywords=[])


def _assign(name: str, value) -> ast.Assign:
  return ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())], value=value)


def _merges(region: str, test: str, names, how: str = "pick") -> ast.If:
  """``if region.test(): name = region.how('name', locals())`` per name."""
  body = [_assign(n, _call(how, ast.Constant(n), _locals(), target=region))
          for n in sorted(names)]
  return ast.If(test=_call(test, target=region), body=body or [ast.Pass()],
                orelse=[])


class _Transformer(ast.NodeTransformer):
  """Rewrites one kernel function's loops, ``if``s and returns."""

  def __init__(self, function: ast.FunctionDef):
    self._loads = _name_nodes([function], ast.Load)
    self._loops: list[ast.AST] = []  # Loops around the node visited.
    self._count = 0

  def _live(self, region, stores, skip=()) -> set[str]:
    """Of ``stores``, those read after ``region`` or in a loop around it
    (outside ``skip``); a loop's own trips need no merge: a program its
    bound masks stays masked until the loop ends."""
    end = max(_position(node, end=True) for node in region)
    again = set()
    if self._loops:
      again = {id(n) for n in _name_nodes(self._loops[:1], ast.Load)}
      again -= {id(n) for n in _name_nodes(skip, ast.Load)}
    read = {n.id for n in self._loads if _position(n) > end or id(n) in again}
    return set(stores) & read

  def visit_While(self, node):
    self._loops.append(node)
    self.generic_visit(node)
    self._loops.pop()
    return node

  def _fresh(self) -> str:
    self._count += 1
    return f"{_PREFIX}_{self._count}"

  def visit_FunctionDef(self, node):
    if node.name.startswith(_PREFIX):
      return node
    self.generic_visit(node)
    frame = self._fresh()
    leave = ast.Expr(_call("leave", ast.Name(frame, ast.Load())))
    node.body = [_assign(frame, _call("enter")),
                 ast.Try(body=node.body, handlers=[], orelse=[],
                         finalbody=[leave])]
    return node

  def visit_Lambda(self, node):
    return node

  def visit_BoolOp(self, node):
    # Elementwise on tensors, as compiled; each operand a thunk, so that a
    # deciding constexpr skips the rest's evaluation.
    self.generic_visit(node)
    method = "logical_and" if isinstance(node.op, ast.And) else "logical_or"
    thunks = [ast.Lambda(args=ast.arguments(
        posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                         body=value) for value in node.values]
    return ast.copy_location(
        _call("boolean", ast.Constant(method), *thunks), node)

  def visit_UnaryOp(self, node):
    self.generic_visit(node)
    if not isinstance(node.op, ast.Not):
      return node
    return ast.copy_location(_call("negation", node.operand), node)

  def visit_Return(self, node):
    has_value = ast.Constant(node.value is not None)
    return ast.If(test=_call("returns", has_value), body=[node], orelse=[])

  def visit_For(self, node):
    if (node.orelse or not isinstance(node.iter, ast.Call)
        or not isinstance(node.target, ast.Name)
        or _jumps(node.body, (ast.Break, ast.Continue, ast.Return))):
      return self.visit_While(node)
    # The target is assigned before its loop's body reads it.
    live = (self._live(node.body, _names(node.body, ast.Store))
            | self._live(node.body, {node.target.id}, skip=node.body))
    self.visit_While(node)  # Visits the body inside this loop.
    region, index = self._fresh(), self._fresh()
    call = node.iter
    static = ast.Constant(_static_range(call.func))
    node.iter = _call("loop", static, call.func, *call.args, target=region,
                      keywords=call.keywords)
    target, node.target = node.target.id, ast.Name(index, ast.Store())
    node.body = ([ast.Expr(_call("save", _locals(), target=region)),
                  _assign(target, ast.Name(index, ast.Load()))]
                 + node.body + [_merges(region, "narrowed", live)])
    return [_assign(region, _call("Loop", _constants(live))), node,
            ast.Expr(_call("done", target=region))]

  def visit_If(self, node):
    if _jumps(node.body + node.orelse, (ast.Break, ast.Continue)):
      return self.generic_visit(node)
    then_stores = _names(node.body, ast.Store)
    else_stores = _names(node.orelse, ast.Store)
    # What the else branch reads of what the if branch assigned: put back.
    restored = then_stores & _names(node.orelse, ast.Load)
    live = self._live(node.body + node.orelse, then_stores | else_stores)
    self.generic_visit(node)
    region = self._fresh()
    branch = _assign(region, _call(
        "Branch", node.test, _constants(live | restored),
        _constants(live & else_stores)))
    then = ast.If(test=_call("then", _locals(), target=region),
                  body=node.body, orelse=[])
    put_back = [_merges(region, "diverged", restored, "old")]
    otherwise = ast.If(
        test=_call("otherwise", _locals(), ast.Constant(bool(node.orelse)),
                   target=region),
        body=put_back + (node.orelse or [ast.Pass()]), orelse=[])
    return [branch, then, otherwise, _merges(region, "merging", live)]


def _static_range(func) -> bool:
  """Whether a loop is over ``tl.static_range`` (the interpreter makes it
  the same function as ``tl.range``): its indices stay Python ints."""
  name = getattr(func, "attr", getattr(func, "id", None))
  return name == "static_range"


def _constants(names) -> ast.Tuple:
  return ast.Tuple([ast.Constant(n) for n in sorted(names)], ast.Load())


# Python function -> its lockstep form, made once whichever thread asks.
_REWRITTEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def rewrite(python_fn, fallback):
  """``python_fn`` in lockstep (``lockstep`` a closure variable), or
  ``fallback()`` where its source cannot be read."""
  if (rewritten := _REWRITTEN.get(python_fn)) is not None:
    return rewritten
  with _LOCK:
    if python_fn not in _REWRITTEN:
      rewritten = _interpreter.function_rewriter(
          python_fn, lambda tree: _lockstep_tree(tree, python_fn.__globals__),
          _PREFIX, _lockstep) or fallback()
      # Named as the kernel (launch decisions are logged by this name).
      rewritten.__qualname__ = python_fn.__qualname__
      _REWRITTEN[python_fn] = rewritten
    return _REWRITTEN[python_fn]


def _lockstep_tree(tree: ast.Module, scope: dict) -> ast.Module:
  function = tree.body[0]
  function = _ImportedBuiltins(function, scope).visit(function)
  tree.body[0] = _Transformer(function).visit(function)
  return tree


def _language_builtin(value) -> bool:
  """A builtin of triton.language, or a stub the code generator maps."""
  module = getattr(value, "__module__", None) or ""
  return callable(value) and (
      module == "triton.language.extra.libdevice"
      or (module.startswith("triton.language")
          and getattr(value, "__triton_builtin__", False)))


class _ImportedBuiltins(ast.NodeTransformer):
  """A language builtin imported by name (``from triton.language.math import
  rsqrt``) read through its module at run time, where the launch patched
  it, as the code generator finds it by its module."""

  def __init__(self, function: ast.FunctionDef, scope: dict):
    arguments = function.args
    self.local = _names([function], ast.Store) | {
        a.arg for a in arguments.posonlyargs + arguments.args
        + arguments.kwonlyargs}
    self.scope = scope

  def visit_Name(self, node):
    if (isinstance(node.ctx, ast.Load) and node.id not in self.local
        and _language_builtin(self.scope.get(node.id))):
      return ast.copy_location(_call("language", node), node)
    return node
