"""Float atomics return their old values in program order, vectorised too.

``tl.atomic_max`` and ``tl.atomic_min`` on floats are two integer atomics
on the bits (signed for lanes of one sign, unsigned for the others). One
program at a time (``JT_DIST_VECTORIZE=0``), program 0 runs both before
program 1 runs either; the vectorised launch must hand every lane the same
old value, on fresh random values of both signs that several lanes of every
program send to the same addresses. ``tl.atomic_add`` into such addresses
(a lane going back to an earlier address) must do the same, and so must a
float32 ``tl.atomic_xchg`` and a bfloat16 ``tl.atomic_add``, which Triton's
interpreter cannot run natively; the final values are checked against
NumPy, the lanes taken in order.
"""

from __future__ import annotations

import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position

_PROGRAMS = 6
_BLOCK = 16
_SLOTS = 4


@triton.jit
def shared_slots_kernel(x_ptr, acc_ptr, old_ptr, OP: tl.constexpr,
                        BLOCK: tl.constexpr, SLOTS: tl.constexpr):
  # acc_ptr is the aliased input (output 0); every program updates the same
  # SLOTS addresses, lane i and lane i + SLOTS the same one.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  slots = acc_ptr + tl.arange(0, BLOCK) % SLOTS
  if OP == "max":
    old = tl.atomic_max(slots, x)
  elif OP == "min":
    old = tl.atomic_min(slots, x)
  elif OP == "xchg":
    old = tl.atomic_xchg(slots, x)
  else:
    old = tl.atomic_add(slots, x)
  tl.store(old_ptr + offsets, old)


class FloatAtomicsOrderTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the vectorised interpreter is the CPU path; the default"
                    f" backend here is {jax.default_backend()}")

  def _call(self, op, x, acc):
    spec = jax.ShapeDtypeStruct
    return jax.tree.map(np.asarray, jt_dist.triton_call(
        jnp.asarray(x), jnp.asarray(acc), kernel=shared_slots_kernel,
        out_shape=(spec(acc.shape, acc.dtype), spec(x.shape, x.dtype)),
        input_output_aliases={1: 0}, grid=(_PROGRAMS,), OP=op, BLOCK=_BLOCK,
        SLOTS=_SLOTS))

  @parameterized.parameters(("max", np.float32), ("min", np.float32),
                            ("add", np.float32), ("xchg", np.float32),
                            ("add", jnp.bfloat16))
  def test_old_values_match_one_program_at_a_time(self, op, dtype):
    x = self.random((_PROGRAMS * _BLOCK,)).astype(dtype)
    acc = self.random((_SLOTS,)).astype(dtype)
    with self.assertLogs("jt_dist", level="DEBUG") as logs:
      vectorised_acc, vectorised_old = self._call(op, x, acc)
    with mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": "0"}):
      acc_one, old_one = self._call(op, x, acc)
    msg = f"atomic_{op} on {np.dtype(dtype).name}, seed {self.seed}"
    np.testing.assert_array_equal(vectorised_old, old_one, err_msg=msg)
    np.testing.assert_array_equal(vectorised_acc, acc_one, err_msg=msg)
    per_slot = x.reshape(-1, _SLOTS)
    if op == "add":
      # Lanes and programs in order, each sum rounded to the dtype.
      expected = acc.copy()
      for row in per_slot:
        expected = (expected.astype(np.float32) + row.astype(np.float32)
                    ).astype(dtype)
      np.testing.assert_array_equal(acc_one, expected, err_msg=msg)
    elif op == "xchg":
      np.testing.assert_array_equal(acc_one, per_slot[-1], err_msg=msg)
      np.testing.assert_array_equal(
          old_one.reshape(-1, _SLOTS),
          np.concatenate([acc[None], per_slot[:-1]]), err_msg=msg)
    else:
      extreme = np.maximum if op == "max" else np.minimum
      np.testing.assert_array_equal(
          acc_one, extreme(acc, extreme.reduce(per_slot, axis=0)),
          err_msg=msg)
    # The vectorised launch ran as one (a fallback would match trivially).
    self.assertTrue(any("shared_slots_kernel runs vectorised" in line
                        for line in logs.output), logs.output)


if __name__ == "__main__":
  absltest.main()
