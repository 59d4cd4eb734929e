"""``triton.language`` as Triton's interpreter patches it, recorded once.

Triton's interpreter (3.6 through 3.9) makes ``triton.language`` run on
NumPy by calling ``_patch_lang(fn)`` at every launch: it walks
``triton.language``, its ``core`` and ``math`` modules and the tensor classes
with ``inspect.getmembers`` and wraps every builtin anew. On a tiny kernel
that walk is about a third of a launch, and jt_dist's runtime used to pay
it twice (once for ``triton.language.core``, which library helpers such as
``tl.zeros`` call, once in the executor).

The walk gives the same wrappers at every launch while the modules hold the
same originals, provided the wrappers do not bind the launch's builder.
Triton 3.9's read the interpreter's module-level ``interpreter_semantic`` at
call time. Triton 3.6's each bind a ``TritonSemantic(builder)`` made as they
are made; while recording, that constructor hands out
``interpreter_semantic`` itself, whose ``builder`` is the one in place, so
the wrappers follow the builder as 3.9's do (the vectorised launch sets
that attribute). So the patches are recorded once, without applying them,
and re-applied for each launch; the executor's own ``_patch_lang`` then
only checks that the kernel can see ``triton.language``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from typing import Any

import triton
# Imported before any launch patches the language modules: Triton's code
# generator keys what it runs at compile time (tl.static_assert,
# tl.static_print) by the objects triton.language holds when it is first
# imported, and Triton imports it lazily. First imported inside a launch, it
# would key them by the interpreter's stand-ins, and every later compile for
# a GPU in the process would skip the kernel's static asserts.
from triton.compiler import code_generator as _code_generator  # pylint: disable=unused-import
import triton.language as tl
from triton.language import core as tl_core
from triton.runtime import interpreter as _interpreter

from jt_dist._compat import attributes_replaced
from jt_dist._compat.triton_api import LANGUAGE_LOCK

_ABSENT = object()

# The only modules upstream's `_patch_lang(fn)` patches, whichever of them a
# kernel's globals name.
_LANGUAGE_MODULES = (tl, tl_core)


@functools.cache
def _wrappers_read_shared_semantic() -> bool:
  """Whether, as read in Triton 3.9, wrappers never bind a builder."""
  match = re.match(r"(\d+)\.(\d+)", triton.__version__)
  return match is not None and (int(match[1]), int(match[2])) >= (3, 9)


class _Recorder:
  """Stands in for upstream's ``_LangPatchScope``: records, sets nothing."""

  def __init__(self):
    # id(owner) -> (owner, {name: value}).
    self.changes: dict[int, tuple[Any, dict]] = {}
    self.shared = False  # A wrapper took `interpreter_semantic`.
    self.bound = False  # A wrapper bound a semantic of its own.

  def set_attr(self, obj, name, value):
    # The same attribute may be set twice (tl.tensor is tl.core.tensor);
    # both values wrap the same original, and the last wins as upstream.
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

  def reusable(self) -> bool:
    """Whether the recorded wrappers serve any builder, any launch."""
    if self.bound or not self.changes:
      return False
    return self.shared or _wrappers_read_shared_semantic()


class _Plan:
  """Upstream's patches of the language modules, made once, applied often.

  A launch applies and undoes about 250 attributes. Where the plan is
  current, what each owner holds is what was recorded, so nothing is read
  back: a module's dictionary is updated in one call, and only classes
  (whose ``__dict__`` is read-only) take one ``setattr`` per attribute.
  """

  def __init__(self, owners):
    self._owners = [_OwnerPlan(obj, replacements)
                    for obj, replacements in owners]

  def current(self) -> bool:
    """Whether the modules still hold what the plan's wrappers wrap."""
    return all(owner.current() for owner in self._owners)

  @contextlib.contextmanager
  def applied(self):
    """The patches in place for the block; the originals back after it."""
    done = []
    try:
      for owner in self._owners:
        owner.apply()
        done.append(owner)
      yield
    finally:
      for owner in reversed(done):
        owner.restore()


class _OwnerPlan:
  """One owner's share of a plan (a module or a class)."""

  def __init__(self, obj, replacements):
    self.obj = obj
    self.names = names = tuple(replacements)
    self.originals = originals = tuple(vars(obj).get(name, _ABSENT)
                                       for name in names)
    self.replacements = replacements
    self.is_module = inspect.ismodule(obj)
    self.restored = {n: v for n, v in zip(names, originals)
                     if v is not _ABSENT}
    self.absent = tuple(n for n, v in zip(names, originals) if v is _ABSENT)

  def current(self) -> bool:
    own = vars(self.obj)
    return all(own.get(name, _ABSENT) is original
               for name, original in zip(self.names, self.originals))

  def apply(self) -> None:
    if self.is_module:
      vars(self.obj).update(self.replacements)
      return
    for name, value in self.replacements.items():
      setattr(self.obj, name, value)

  def restore(self) -> None:
    if self.is_module:
      own = vars(self.obj)
      own.update(self.restored)
      for name in self.absent:
        own.pop(name, None)
      return
    for name, value in self.restored.items():
      setattr(self.obj, name, value)
    for name in self.absent:
      if name in vars(self.obj):
        delattr(self.obj, name)


# "plan": the recorded _Plan; "unusable": recording cannot be reused here.
# Read and written under LANGUAGE_LOCK.
_cache: dict[str, Any] = {}


def _probe():
  """Never called: its globals name both language modules."""
  return tl, tl_core


def _recorded_plan(patch_lang) -> _Plan | None:
  recorder = _Recorder()
  replacements = {"_LangPatchScope": lambda: recorder}
  if "TritonSemantic" in vars(_interpreter):
    replacements["TritonSemantic"] = recorder.semantic_for(
        _interpreter.TritonSemantic)
  try:
    with attributes_replaced(_interpreter, replacements):
      returned = patch_lang(_probe)
  except Exception:  # pylint: disable=broad-except
    return None  # Upstream's own walk, run next, reports any real fault.
  if returned is not recorder or not recorder.reusable():
    return None
  return _Plan(recorder.changes.values())


def _plan_for_launch(patch_lang) -> _Plan | None:
  if _cache.get("unusable"):
    return None
  plan = _cache.get("plan")
  if plan is not None and plan.current():
    return plan
  plan = _recorded_plan(patch_lang)
  if plan is None:
    # Not upstream's shape, or wrappers bound to one builder: from now on
    # patch as upstream does, once per launch.
    _cache["unusable"] = True
  _cache["plan"] = plan
  return plan


def _visibility_check(fn):
  """Upstream's ``_patch_lang(fn)`` with the modules already patched."""
  assert any(inspect.ismodule(v) and v in _LANGUAGE_MODULES
             for v in fn.__globals__.values()), (
                 "triton.language must be visible from within jit'd function")
  return _interpreter._LangPatchScope()  # pylint: disable=protected-access


@contextlib.contextmanager
def language_patched():
  """Patches ``triton.language`` and its core for one interpreted launch.

  As upstream's executor patches them, for both modules, whichever the
  kernel's globals name; within the block upstream's ``_patch_lang`` only
  checks that ``triton.language`` is visible, so that jt_dist's own
  replacements entered inside the block stay. Restored exactly on exit (an
  attribute the owner only inherited is deleted again). Holds
  ``LANGUAGE_LOCK``.
  """
  with LANGUAGE_LOCK, contextlib.ExitStack() as stack:
    patch_lang = _interpreter._patch_lang  # pylint: disable=protected-access
    if patch_lang is _visibility_check:
      yield  # Within a launch's patches already (the lock is reentrant).
      return
    plan = _plan_for_launch(patch_lang)
    if plan is None:
      stack.callback(patch_lang(_probe).restore)
    else:
      stack.enter_context(plan.applied())
    stack.enter_context(attributes_replaced(
        _interpreter, {"_patch_lang": _visibility_check}))
    yield
