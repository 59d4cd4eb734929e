"""JAX transformations, devices, threads, logging and interpreted kernels."""

import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import threading

from absl.testing import absltest
import chex
import jax
from jax._src.interpreters import partial_eval as pe  # DCE has no public API.
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from variants_util import VariantsTestCase  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import scale_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _add_fn(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


add_kernel = triton.jit(_add_fn)


def _grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def add(x, y, kernel=add_kernel, **kwargs):
  return jt_dist.triton_call(
      x, y, x.size, kernel=kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=_grid, BLOCK=16,
      **kwargs)


class VmapTest(VariantsTestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_vmap_sequential_matches_loop(self):
    xs, ys = self.random((4, 20)), self.random((4, 20))
    fn = jax.vmap(lambda x, y: add(x, y, vmap_method="sequential"))
    out = self.variant(fn)(xs, ys)
    expected = np.stack([np.asarray(add(x, y)) for x, y in zip(xs, ys)])
    self.assertAllClose(out, expected, rtol=0, atol=0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_vmap_sequential_unbatched_operand_and_axis(self):
    xs, y = self.random((20, 3)), self.random((20,))
    out = self.variant(jax.vmap(
        lambda x: add(x, jnp.asarray(y), vmap_method="sequential"),
        in_axes=1, out_axes=1))(xs)
    self.assertAllClose(out, xs + y[:, None])

  @chex.variants(with_jit=True, without_jit=True)
  def test_nested_vmap_sequential(self):
    xs, ys = self.random((2, 3, 8)), self.random((2, 3, 8))
    out = self.variant(jax.vmap(jax.vmap(
        lambda x, y: add(x, y, vmap_method="sequential"))))(xs, ys)
    self.assertAllClose(out, xs + ys)


class DifferentiationTest(VariantsTestCase):

  def test_grad_refused(self):
    x, y = self.random((16,)), self.random((16,))
    with self.assertRaisesRegex(NotImplementedError,
                                r"'_add_fn'.*jax\.custom_vjp"):
      jax.grad(lambda x: add(x, y).sum())(x)

  def test_jvp_refused(self):
    x, y = self.random((16,)), self.random((16,))
    with self.assertRaisesRegex(NotImplementedError,
                                r"'_add_fn'.*jax\.custom_vjp"):
      jax.jvp(lambda x: add(x, y), (x,), (jnp.ones_like(x),))

  @chex.variants(with_jit=True, without_jit=True)
  def test_grad_through_other_inputs_is_fine(self):
    # Differentiating with respect to something the kernel does not see
    # treats the kernel's output as a constant.
    x, y = self.random((16,)), self.random((16,))
    g = self.variant(jax.grad(
        lambda a: (a * add(jnp.asarray(x), jnp.asarray(y))).sum()))(1.0)
    self.assertAllClose(g, (x + y).sum(), rtol=1e-5)


class DeadCodeTest(testing.TestCase):

  def test_unused_call_is_kept_by_jax_and_dropped_by_xla(self):
    # jax-triton 0.4's rule: jax never drops a kernel call; XLA drops an
    # unused one that is not marked has_side_effect=True.
    x, y = self.random((16,)), self.random((16,))

    def f(x, y):
      add(x, y)  # Unused.
      return x * 2

    jaxpr = jax.make_jaxpr(f)(x, y).jaxpr
    self.assertIn("jt_dist_triton_call", str(jaxpr))
    dced, used_inputs = pe.dce_jaxpr(jaxpr, [True])
    self.assertIn("jt_dist_triton_call", str(dced))
    self.assertEqual(used_inputs, [True, True])
    launches = testing.kernel_launches
    self.assertEqual(launches(jax.jit(f).lower(x, y).as_text()), 1)
    self.assertEqual(launches(jax.jit(f).lower(x, y).compile().as_text()), 0)
    self.assertEqual(launches(jax.jit(add).lower(x, y).compile().as_text()),
                     1)

  def test_unused_output_of_two_keeps_call(self):
    x, y = self.random((16,)), self.random((16,))
    out = jax.jit(lambda x, y: add(x, y) + 0)(x, y)
    self.assertAllClose(out, x + y)


class DevicesTest(testing.TestCase):

  def test_each_device(self):
    devices = self.devices(8)
    x, y = self.random((40,)), self.random((40,))
    for jit in (False, True):
      fn = jax.jit(add) if jit else add
      for device in devices:
        xd = jax.device_put(x, device)
        yd = jax.device_put(y, device)
        out = fn(xd, yd)
        self.assertEqual(out.devices(), {device})
        self.assertEqual(out.devices(), xd.devices())
        self.assertAllClose(out, x + y, msg=str(device))

  def test_threads_on_many_devices(self):
    devices = self.devices(8)
    inputs = [(self.random((50,)), self.random((50,))) for _ in range(16)]
    results = [None] * len(inputs)
    errors = []
    start = threading.Barrier(len(inputs))

    def work(i):
      try:
        device = devices[i % len(devices)]
        x, y = (jax.device_put(a, device) for a in inputs[i])
        start.wait()
        out = add(x, y) if i % 2 else jax.jit(add)(x, y)
        results[i] = (np.asarray(out), out.devices())
      except Exception as e:  # pylint: disable=broad-except
        errors.append(e)

    threads = [threading.Thread(target=work, args=(i,))
               for i in range(len(inputs))]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    self.assertEqual(errors, [])
    for i, (x, y) in enumerate(inputs):
      out, out_devices = results[i]
      self.assertEqual(out_devices, {devices[i % len(devices)]})
      self.assertAllClose(out, x + y)


class LoggingTest(testing.TestCase):

  def test_logs_once_per_kernel(self):
    if testing.platform() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")
    # A fresh kernel (its own qualified name), so no earlier test logged it.
    def _logged_add_fn(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
      mask = offsets < n
      tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask)
               + tl.load(y_ptr + offsets, mask=mask), mask=mask)

    kernel = triton.jit(_logged_add_fn)
    x, y = self.random((20,)), self.random((20,))
    with self.assertLogs("jt_dist", logging.INFO) as logs:
      jax.block_until_ready(add(x, y, kernel=kernel))
      jax.block_until_ready(add(x, y, kernel=kernel))
      jax.block_until_ready(jax.jit(lambda x, y: add(x, y, kernel=kernel))(
          x, y))
      # Another kernel logs its own line.
      jax.block_until_ready(jt_dist.triton_call(
          x, 2.0, x.size, kernel=scale_kernel, out_shape=x, grid=_grid,
          BLOCK=16))
    mine = [r for r in logs.output if "_logged_add_fn" in r]
    self.assertLen(mine, 1)
    self.assertIn("interpreter", mine[0])

  def test_import_has_no_side_effects(self):
    code = ("import logging, jax; import jt_dist;"
            " assert not logging.getLogger('jt_dist').handlers;"
            " assert not jax._src.xla_bridge._backends, 'backend initialised'")
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": _REPO_ROOT}, timeout=120,
        check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-2000:])


class InterpretedFunctionTest(testing.TestCase):

  def test_interpreted_function(self):
    kernel = interpreter.InterpretedFunction(_add_fn)
    x, y = self.random((30,)), self.random((30,))
    self.assertAllClose(add(x, y, kernel=kernel), x + y)
    self.assertAllClose(jax.jit(lambda x, y: add(x, y, kernel=kernel))(x, y),
                        x + y)

  def test_interpreted_function_autotuned(self):
    kernel = triton.autotune(
        configs=[triton.Config({"BLOCK": 8}), triton.Config({"BLOCK": 16})],
        key=["n"])(interpreter.InterpretedFunction(_add_fn))
    x, y = self.random((30,)), self.random((30,))
    out = jt_dist.triton_call(x, y, x.size, kernel=kernel, out_shape=x,
                              grid=_grid)
    self.assertAllClose(out, x + y)

  def test_kernels_defined_under_triton_interpret(self):
    script = textwrap.dedent("""
        import numpy as np
        import jax, jax.numpy as jnp
        import triton, triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction
        import jt_dist

        @triton.jit
        def double(x):
          return x * 2

        @triton.jit
        def kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
          offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
          mask = offsets < n
          acc = tl.zeros((BLOCK,), tl.float32)
          tl.store(out_ptr + offsets,
                   double(tl.load(x_ptr + offsets, mask=mask)) + acc,
                   mask=mask)

        assert isinstance(kernel, InterpretedFunction), type(kernel)
        x = np.random.default_rng().uniform(-2, 2, 37).astype(np.float32)
        call = lambda x: jt_dist.triton_call(
            x, x.size, kernel=kernel, out_shape=x,
            grid=lambda m: (triton.cdiv(m["n"], m["BLOCK"]),), BLOCK=16)
        np.testing.assert_allclose(call(x), 2 * x, rtol=1e-6)
        np.testing.assert_allclose(jax.jit(call)(x), 2 * x, rtol=1e-6)
        # vmap's wrapper kernel calls the kernel, which calls the helper.
        xs = np.stack([x, -x])
        np.testing.assert_allclose(jax.jit(jax.vmap(call))(xs), 2 * xs,
                                   rtol=1e-6)
        print("OK")
    """)
    # A file, not `python -c`: Triton reads a kernel's source from its file.
    # (tempfile rather than self.create_tempfile, which needs absl's flags
    # parsed, and pytest does not parse them.)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, "interpreted_kernel.py")
      with open(path, "w") as f:
        f.write(script)
      env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": _REPO_ROOT}
      result = subprocess.run([sys.executable, path], capture_output=True,
                              text=True, env=env, timeout=300, check=False)
    self.assertEqual(result.returncode, 0, result.stderr[-3000:])
    self.assertIn("OK", result.stdout)


if __name__ == "__main__":
  absltest.main()
