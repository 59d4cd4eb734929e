"""``triton.language`` as the CPU interpreter patches it, once per launch.

Triton's interpreter rebuilds its patches of the language modules at every
launch; jt_dist records them once and re-applies them. Every launch must
leave Triton's modules and classes exactly as they were, record the patches
only once while the modules are unchanged, and record them again when they
change. ``_compat.attributes_replaced``, jt_dist's one scoped, locked patch
of Triton, restores what it replaced whatever happens inside.
"""

import random
import threading
import types
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import triton
import triton.language as tl
from triton.language import core as tl_core
from triton.language import math as tl_math
from triton.runtime import interpreter as _interpreter

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _compat  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu.interpreter import language as interpreter_language  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_launch  # pylint: disable=g-import-not-at-top,wrong-import-position

_BLOCK = 16


@triton.jit
def scale_kernel(x_ptr, s, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  # tl.zeros is a @triton.jit helper calling builtins through tl.core.
  acc = tl.zeros((BLOCK,), tl.float32) + tl.load(x_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, acc * s, mask=mask)


@triton.jit
def asserting_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  tl.static_assert(BLOCK % 1024 == 0, "BLOCK must be a multiple of 1024")
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


# Everything a launch patches: the language modules and classes upstream's
# `_patch_lang` walks, the interpreter module, its builder class and
# JITFunction.
_OWNERS = (tl, tl_core, tl_math, tl_core.tensor, tl_core.condition,
           tl_core.dtype, tl_core.tensor_descriptor_base, _interpreter,
           _interpreter.InterpreterBuilder,
           _compat.JITFunction)


def _snapshot():
  return [dict(vars(owner)) for owner in _OWNERS]


def _scale(x, s, programs):
  cpu = jax.devices("cpu")[0]
  x = jax.device_put(x, cpu)
  return np.asarray(jt_dist.triton_call(
      x, s, x.size, kernel=scale_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(programs,), BLOCK=x.size // programs))


class InterpreterLanguageTest(testing.TestCase):

  def _assert_unchanged(self, before):
    for owner, was in zip(_OWNERS, before):
      now = dict(vars(owner))
      name = getattr(owner, "__name__", type(owner).__name__)
      self.assertEqual(sorted(now), sorted(was), msg=name)
      changed = [k for k in was if now[k] is not was[k]]
      self.assertEqual(changed, [], msg=name)

  @parameterized.named_parameters(("one_program", 1), ("vectorised", 4))
  def test_launch_leaves_triton_unchanged(self, programs):
    x = self.random((programs * _BLOCK,))
    s = float(self.np_rng.uniform(-3, 3))
    _scale(x, s, programs)  # Compiles; the patches are recorded.
    before = _snapshot()
    for _ in range(2):
      self.assertAllClose(_scale(x, s, programs), x * np.float32(s))
      self._assert_unchanged(before)

  def test_failing_launch_leaves_triton_unchanged(self):
    x = jax.device_put(self.random((_BLOCK,)), jax.devices("cpu")[0])
    before = _snapshot()
    with self.assertRaisesRegex(jt_dist.KernelAssertionError,
                                "asserting_kernel.*multiple of 1024"):
      jt_dist.triton_call(
          x, kernel=asserting_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=(1,), BLOCK=_BLOCK)
    self._assert_unchanged(before)

  @parameterized.named_parameters(("one_program_first", (1, 4, 1, 4)),
                                  ("vectorised_first", (4, 1, 4, 1)))
  def test_patches_are_recorded_once(self, programs_per_launch):
    # Recorded under one builder, they serve the other launch's too.
    x = self.random((4 * _BLOCK,))
    _scale(x, 1.5, 1)
    walk = mock.Mock(wraps=_interpreter._patch_lang)  # pylint: disable=protected-access
    with mock.patch.dict(interpreter_language._cache, clear=True), \
        mock.patch.object(_interpreter, "_patch_lang", walk):
      for programs in programs_per_launch:
        s = float(self.np_rng.uniform(-3, 3))
        self.assertAllClose(_scale(x, s, programs), x * np.float32(s))
      # None would mean recordings proved unusable.
      self.assertIsNotNone(interpreter_language._cache["plan"])
    # Once, to record; the executor's own call only checks visibility.
    self.assertEqual(walk.call_count, 1)
    self.assertEqual(vector_launch.decisions_of(scale_kernel.fn),
                     {vector_launch.VECTORISED})

  def test_changed_module_is_patched_anew(self):
    x = self.random((_BLOCK,))
    _scale(x, 1.0, 1)
    calls = []
    original = tl_core.program_id

    @tl_core.builtin
    def counting_program_id(axis, _semantic=None):
      # The interpreter's calls: the code generator's check, before the
      # launch, passes a constexpr.
      if not isinstance(axis, tl.constexpr):
        calls.append(axis)
      return original(axis, _semantic=_semantic)

    with mock.patch.object(tl, "program_id", counting_program_id):
      self.assertAllClose(_scale(x, 3.0, 1), x * 3)
    self.assertEqual(calls, [0])
    # And the original again once it is back.
    self.assertAllClose(_scale(x, 4.0, 1), x * 4)
    self.assertEqual(calls, [0])


class _Base:

  def method(self):
    return "base"


class _Child(_Base):

  @staticmethod
  def static():
    return "static"


class AttributesReplacedTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.value = random.Random(0).randrange(1 << 30)

  def test_replaces_inside_and_restores_after(self):
    module = types.SimpleNamespace(a=self.value, b="b")
    with _compat.attributes_replaced(module, {"a": self.value + 1, "c": 3}):
      self.assertEqual((module.a, module.b, module.c),
                       (self.value + 1, "b", 3))
    self.assertEqual(vars(module), {"a": self.value, "b": "b"})

  def test_restores_after_an_exception(self):
    module = types.SimpleNamespace(a=self.value)
    with self.assertRaisesRegex(KeyError, "inside"):
      with _compat.attributes_replaced(module, {"a": None}):
        raise KeyError("inside")
    self.assertEqual(module.a, self.value)

  def test_inherited_attribute_is_not_left_shadowed(self):
    with _compat.attributes_replaced(_Child, {"method": lambda self: "new"}):
      self.assertEqual(_Child().method(), "new")
    self.assertNotIn("method", vars(_Child))
    _Base.method = lambda self: "changed"
    try:
      self.assertEqual(_Child().method(), "changed")
    finally:
      _Base.method = lambda self: "base"

  def test_static_method_is_restored_as_one(self):
    with _compat.attributes_replaced(_Child, {"static": lambda: "patched"}):
      pass
    self.assertIsInstance(vars(_Child)["static"], staticmethod)
    self.assertEqual(_Child().static(), "static")

  def test_holds_the_language_lock(self):
    module = types.SimpleNamespace(a=self.value)
    acquired = []
    with _compat.attributes_replaced(module, {"a": 0}):
      thread = threading.Thread(target=lambda: acquired.append(
          _compat.LANGUAGE_LOCK.acquire(timeout=0.05)))
      thread.start()
      thread.join()
    self.assertEqual(acquired, [False])
    # Reentrant: a launch that holds it may patch again.
    with _compat.LANGUAGE_LOCK:
      with _compat.attributes_replaced(module, {"a": 1}):
        self.assertEqual(module.a, 1)
    self.assertEqual(module.a, self.value)


if __name__ == "__main__":
  absltest.main()
