"""``triton.language`` as Triton's interpreter patches it, once per launch.

Triton's interpreter (3.6 through 3.9) makes ``triton.language`` run on
NumPy by calling ``_patch_lang(fn)`` at every launch: it walks
``triton.language``, its ``core`` and ``math`` modules and the tensor classes
with ``inspect.getmembers`` and wraps every builtin anew. On a tiny kernel
that walk is about 40% of a launch, and jt_dist's runtime used to pay it
twice (once for ``triton.language.core``, which library helpers such as
``tl.zeros`` call, once in the executor).

The walk's result is the same at every launch while the modules hold the
same originals and, on Triton before 3.9, the same builder: its wrappers
bind ``TritonSemantic(builder)`` when they are made (Triton 3.9 reads the
interpreter's module-level semantic at call time). So it is recorded once,
without applying it, and re-applied with plain attribute writes for each
launch; the executor's own ``_patch_lang`` finds the modules patched and
only checks that the kernel can see ``triton.language``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from typing import Any

import triton
import triton.language as tl
from triton.language import core as tl_core
from triton.runtime import interpreter as _interpreter

from jt_dist._compat.interpreter import attributes_replaced
from jt_dist._compat.triton_api import LANGUAGE_LOCK

_ABSENT = object()

# The only modules upstream's `_patch_lang(fn)` patches, whichever of them a
# kernel's globals name.
_LANGUAGE_MODULES = (tl, tl_core)


@functools.cache
def _binds_builder() -> bool:
  # Read in Triton 3.6 and 3.9: 3.6 binds the builder in place when it
  # patches, 3.9 does not. 3.7 and 3.8 are treated as 3.6, which is only
  # slower (a plan per builder), never wrong.
  match = re.match(r"(\d+)\.(\d+)", triton.__version__)
  return match is None or (int(match[1]), int(match[2])) < (3, 9)


class _Recorder:
  """Stands in for upstream's ``_LangPatchScope``: records, sets nothing."""

  def __init__(self):
    self.changes: dict[tuple[int, str], tuple[Any, str, Any]] = {}

  def set_attr(self, obj, name, value):
    # The same attribute may be set twice (tl.tensor is tl.core.tensor);
    # both values wrap the same original, and the last wins as upstream.
    self.changes[(id(obj), name)] = (obj, name, value)

  def restore(self):
    pass


class _Plan:
  """Upstream's patches of the language modules, made once, applied often."""

  def __init__(self, builder, patches):
    self.builder = builder
    # (owner, name, value, what owner itself held when recorded)
    self.patches = [(obj, name, value, vars(obj).get(name, _ABSENT))
                    for obj, name, value in patches]
    owners = {}
    for obj, name, value in patches:
      owners.setdefault(id(obj), (obj, {}))[1][name] = value
    self.by_owner = list(owners.values())

  def current(self, builder) -> bool:
    """Whether the modules still hold what the plan's wrappers wrap."""
    if _binds_builder() and builder is not self.builder:
      return False
    return all(vars(obj).get(name, _ABSENT) is own
               for obj, name, _, own in self.patches)


_plans: dict[bool, _Plan] = {}  # Read and written under LANGUAGE_LOCK.


def _probe():
  """Never called: its globals name both language modules."""
  return tl, tl_core


def _recorded_plan(patch_lang, builder) -> _Plan | None:
  recorder = _Recorder()
  with attributes_replaced(_interpreter,
                           {"_LangPatchScope": lambda: recorder}):
    returned = patch_lang(_probe)
  if returned is not recorder or not recorder.changes:
    return None  # Not upstream's shape: patch as upstream does.
  return _Plan(builder, list(recorder.changes.values()))


def _plan_for_launch(patch_lang) -> _Plan | None:
  builder = _interpreter.interpreter_builder
  # Keep one plan for the builder of one-at-a-time launches; a per-launch
  # builder (the vectorised launch's) is planned for that launch alone.
  stock = type(builder) is _interpreter.InterpreterBuilder
  plan = _plans.get(stock)
  if plan is not None and plan.current(builder):
    return plan
  plan = _recorded_plan(patch_lang, builder)
  if plan is not None and (stock or not _binds_builder()):
    _plans[stock] = plan
  return plan


def _visibility_check(fn):
  """Upstream's ``_patch_lang(fn)`` with the modules already patched."""
  langs = [v for v in fn.__globals__.values()
           if inspect.ismodule(v) and v in _LANGUAGE_MODULES]
  assert langs, "triton.language must be visible from within jit'd function"
  return _interpreter._LangPatchScope()  # pylint: disable=protected-access


@contextlib.contextmanager
def interpreter_language_patched():
  """Patches ``triton.language`` and its core for one interpreted launch.

  As upstream's executor patches them, for both modules, whichever the
  kernel's globals name; within the block upstream's ``_patch_lang`` only
  checks that ``triton.language`` is visible. Everything is restored
  exactly on exit (an attribute the owner only inherited is deleted again).
  Holds ``LANGUAGE_LOCK``.
  """
  with LANGUAGE_LOCK:
    patch_lang = _interpreter._patch_lang  # pylint: disable=protected-access
    plan = _plan_for_launch(patch_lang)
    if plan is None:
      scope = patch_lang(_probe)
      try:
        yield
      finally:
        scope.restore()
      return
    with contextlib.ExitStack() as stack:
      for owner, replacements in plan.by_owner:
        stack.enter_context(attributes_replaced(owner, replacements))
      stack.enter_context(attributes_replaced(
          _interpreter, {"_patch_lang": _visibility_check}))
      yield
