"""``triton.language`` as Triton's interpreter patches it, recorded once.

Upstream's ``_patch_lang`` wraps every builtin anew per launch (a third of
a tiny launch). The wrappers are the same while the originals are, unless
they bind a builder: 3.9's read ``interpreter_semantic`` at call time, and
3.6's get that one while recording. So they are recorded once and reapplied.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from typing import Any

import triton
# Imported before any launch patches the language: the code generator keys
# tl.static_assert by the objects tl holds at its (lazy) first import, and
# keyed by the interpreter's stand-ins, GPU compiles would skip the asserts.
from triton.compiler import code_generator as _code_generator  # pylint: disable=unused-import
import triton.language as tl
from triton.language import core as tl_core
from triton.language.extra import libdevice as _libdevice_stubs
from triton.language.extra.cuda import libdevice as _cuda_libdevice
from triton.runtime import interpreter as _interpreter

from jt_dist._compat import attributes_replaced
from jt_dist._compat.triton_api import LANGUAGE_LOCK

_ABSENT = object()

_LANGUAGE_MODULES = (tl, tl_core)


# Triton 3.9's wrappers never bind a builder.
_SHARED_SEMANTIC = tuple(
    int(v) for v in re.findall(r"\d+", triton.__version__)[:2]) >= (3, 9)


class _Recorder:
  """Stands in for upstream's ``_LangPatchScope``: records, sets nothing."""

  def __init__(self):
    # id(owner) -> (owner, {name: value}).
    self.changes: dict[int, tuple[Any, dict]] = {}
    self.shared = False  # A wrapper took `interpreter_semantic`.
    self.bound = False  # A wrapper bound a semantic of its own.

  def set_attr(self, obj, name, value):
    # Set twice (tl.tensor is tl.core.tensor): the last wins, as upstream.
    self.changes.setdefault(id(obj), (obj, {}))[1][name] = value

  def restore(self):
    pass

  def semantic_for(self, make_semantic):
    shared = getattr(_interpreter, "interpreter_semantic", None)

    def semantic(builder):
      if shared is not None and builder is getattr(shared, "builder", None):
        self.shared = True
        return shared
      self.bound = True
      return make_semantic(builder)
    return semantic


def _assign(obj, values: dict) -> None:
  if inspect.ismodule(obj):
    vars(obj).update(values)  # One update for a module's ~250 names.
  else:
    for name, value in values.items():
      setattr(obj, name, value)


class _OwnerPlan:
  """Upstream's patches of one module or class, applied with no reads back."""

  def __init__(self, obj, replacements):
    own = vars(obj)
    self.obj, self.replacements = obj, replacements
    self.originals = {name: own.get(name, _ABSENT) for name in replacements}
    self.restored = {name: value for name, value in self.originals.items()
                     if value is not _ABSENT}
    self.absent = [name for name in replacements if name not in own]

  def current(self) -> bool:
    """Whether the owner still holds what the wrappers wrap."""
    own = vars(self.obj)
    return all(own.get(name, _ABSENT) is original
               for name, original in self.originals.items())

  def apply(self) -> None:
    _assign(self.obj, self.replacements)

  def restore(self) -> None:
    _assign(self.obj, self.restored)
    for name in self.absent:
      if name in vars(self.obj):
        delattr(self.obj, name)


# The recorded _OwnerPlans (None once unusable), under LANGUAGE_LOCK.
_cache: dict[str, Any] = {}


def _probe():
  """Never called: its globals name both language modules."""
  return tl, tl_core


class _Collected:
  """A patch scope that keeps the wrappers it is given."""

  def __init__(self):
    self.values: dict[str, Any] = {}

  def set_attr(self, obj, name, value):
    del obj
    self.values[name] = value


def _patch_libdevice(scope) -> None:
  """CUDA's libdevice patched as upstream patches ``tl.math``, and the stubs
  of ``triton.language.extra.libdevice`` pointed at it, as the code
  generator maps them for a CUDA target."""
  collected = _Collected()
  _interpreter._patch_builtin(  # pylint: disable=protected-access
      _cuda_libdevice, _interpreter.interpreter_builder, collected)
  for name, wrapper in collected.values.items():
    scope.set_attr(_cuda_libdevice, name, wrapper)
    if callable(vars(_libdevice_stubs).get(name)):
      scope.set_attr(_libdevice_stubs, name, wrapper)


def _recorded_plan(patch_lang) -> list[_OwnerPlan] | None:
  recorder = _Recorder()
  replacements = {"_LangPatchScope": lambda: recorder}
  if "TritonSemantic" in vars(_interpreter):
    replacements["TritonSemantic"] = recorder.semantic_for(
        _interpreter.TritonSemantic)
  try:
    with attributes_replaced(_interpreter, replacements):
      returned = patch_lang(_probe)
      _patch_libdevice(recorder)
  except Exception:  # pylint: disable=broad-except
    return None  # Upstream's own walk, run next, reports any real fault.
  # Reusable where the wrappers serve any builder, any launch.
  if (returned is not recorder or recorder.bound or not recorder.changes
      or not (recorder.shared or _SHARED_SEMANTIC)):
    return None
  return [_OwnerPlan(obj, changes)
          for obj, changes in recorder.changes.values()]


def _plan_for_launch(patch_lang) -> list[_OwnerPlan] | None:
  plan = _cache.get("plan", [])
  if plan is None or (plan and all(owner.current() for owner in plan)):
    return plan
  # An owner changed: recorded again (None: patched per launch from now).
  plan = _cache["plan"] = _recorded_plan(patch_lang)
  return plan


def _visibility_check(fn):
  """Upstream's ``_patch_lang(fn)`` with the modules already patched."""
  assert any(inspect.ismodule(v) and v in _LANGUAGE_MODULES
             for v in fn.__globals__.values()), (
                 "triton.language must be visible from within jit'd function")
  return _interpreter._LangPatchScope()  # pylint: disable=protected-access


@contextlib.contextmanager
def language_patched():
  """Patches the language for one launch; within it upstream's
  ``_patch_lang`` only checks visibility, so replacements entered inside
  stay."""
  with LANGUAGE_LOCK, contextlib.ExitStack() as stack:
    patch_lang = _interpreter._patch_lang  # pylint: disable=protected-access
    if patch_lang is _visibility_check:
      yield  # Within a launch's patches already (the lock is reentrant).
      return
    if (plan := _plan_for_launch(patch_lang)) is None:
      scope = patch_lang(_probe)
      _patch_libdevice(scope)
      stack.callback(scope.restore)
    else:
      for owner in plan:
        owner.apply()
        stack.callback(owner.restore)
    stack.enter_context(attributes_replaced(
        _interpreter, {"_patch_lang": _visibility_check}))
    yield
