"""_compat.attributes_replaced: jt_dist's one scoped, locked patch of Triton."""

import random
import threading
import types

from absl.testing import absltest

from jt_dist import _compat


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
