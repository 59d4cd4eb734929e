"""``jax.vmap`` of calls with tuple operands: one launch over a batched grid.

The generated wrapper kernel rebuilds each tuple parameter with its batched
pointers moved by the batch index; unbatched leaves and scalar leaves pass
through unchanged.
"""

import unittest

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
import gpu_lowering_util as util  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import nested_tuple_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import tuple_add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import tuple_inplace_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_N = 16
_BLOCK = 8


def _struct(shape):
  return jax.ShapeDtypeStruct(shape, np.float32)


def _add(x, y, z, **kwargs):
  return jt_dist.triton_call(
      x, (y, z), _N, kernel=tuple_add_kernel, out_shape=_struct((_N,)),
      grid=(_N // _BLOCK,), BLOCK=_BLOCK, **kwargs)


def _nested(a, c, scale, shift, **kwargs):
  return jt_dist.triton_call(
      scale, ((a, shift), c), kernel=nested_tuple_kernel,
      out_shape=_struct((_N,)), grid=(1,), BLOCK=_N, **kwargs)


def _launches(f, *args):
  return testing.kernel_launches(jax.jit(f).lower(*args).as_text())


class TupleVmapTest(testing.TestCase):

  @parameterized.named_parameters(
      ("all_batched", (0, 0, 0)),
      ("only_a_leaf", (None, None, 0)),
      ("first_leaf_and_x", (0, 0, None)),
      ("leaf_at_axis_1", (None, 1, None)),
      ("tuple_unbatched", (0, None, None)),
  )
  def test_one_launch(self, in_axes):
    # The batched leaves move with the program's batch index, wherever they
    # sit in the tuple; unbatched ones stay.
    shapes = {None: (_N,), 0: (3, _N), 1: (_N, 3)}
    args = [self.random(shapes[a]) for a in in_axes]
    f = jax.vmap(lambda x, y, z: _add(x, y, z, vmap_method="grid"),
                 in_axes=in_axes)
    self.assertEqual(_launches(f, *args), 1)
    rows = [a if d in (None, 0) else a.T for a, d in zip(args, in_axes)]
    self.assertAllClose(f(*args), rows[0] + rows[1] + rows[2])

  def test_same_as_sequential(self):
    x, ys, z = self.random((_N,)), self.random((4, _N)), self.random((4, _N))
    grid = jax.vmap(lambda y, z: _add(x, y, z))(ys, z)
    seq = jax.vmap(lambda y, z: _add(x, y, z, vmap_method="sequential"))(
        ys, z)
    self.assertAllClose(grid, seq)

  def test_nested_tuple_with_a_scalar_leaf(self):
    a, c = self.random((3, _N)), self.random((_N,))
    scale, shift = (float(v) for v in self.np_rng.uniform(1, 3, size=2))
    f = jax.vmap(lambda a: _nested(a, c, scale, shift, vmap_method="grid"))
    self.assertEqual(_launches(f, a), 1)
    self.assertAllClose(
        f(a), np.float32(scale) * a + np.float32(shift) + c, rtol=1e-5)

  def test_nested_vmaps_fold_into_one_launch(self):
    a, c = self.random((2, 3, _N)), self.random((3, _N))
    f = jax.vmap(jax.vmap(lambda a, c: _nested(a, c, 2.0, 0.5)),
                 in_axes=(0, None))
    self.assertEqual(_launches(f, a, c), 1)
    self.assertAllClose(f(a, c), 2 * a + 0.5 + c[None])

  def test_aliased_tuple_leaf(self):
    # 0.4's aliasing: xy[1] (flattened operand 1) is output 0's buffer.
    xs, y = self.random((3, _N)), self.random((_N,))
    f = jax.vmap(lambda x: jt_dist.triton_call(
        (x, y), _N, kernel=tuple_inplace_kernel, out_shape=_struct((_N,)),
        grid=(1,), BLOCK=_N, input_output_aliases={1: 0},
        vmap_method="grid"))
    self.assertEqual(_launches(f, xs), 1)
    self.assertAllClose(f(xs), xs + y)

  def test_bounds_checker_names_the_batched_leaf(self):
    if testing.platform() != "cpu":
      self.skipTest("the bounds check is the CPU interpreter's")
    x, ys = self.random((_N,)), self.random((3, _N // 2))
    with self.assertRaisesRegex(jt_dist.OutOfBoundsAccessError, r"yz\[0\]"):
      jax.block_until_ready(jax.vmap(
          lambda y: _add(x, y, x, vmap_method="grid"))(ys))


@unittest.skipUnless(util.HAS_TRITON_CALL, util.SKIP_REASON)
class CudaLoweringTest(util.IsolatedCacheMixin, testing.TestCase):

  def test_one_compiled_launch_batch_on_axis_y(self):
    args = [jax.ShapeDtypeStruct(s, np.float32)
            for s in ((_N,), (5, _N), (_N,))]
    f = jax.vmap(lambda x, y, z: _add(x, y, z, compute_capability=90),
                 in_axes=(None, 0, None))
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",))
    (call,) = util.triton_custom_calls(lowered)
    (kernel,) = call["calls"]
    self.assertEqual(kernel["grid"], (_N // _BLOCK, 5, 1))
    self.assertIn("%ctaid.y", kernel["ptx"])
    self.assertLen([p for p in kernel["params"] if p[0] == "array"], 4)


if __name__ == "__main__":
  absltest.main()
