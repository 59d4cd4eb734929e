"""Ctrl-C during a CPU launch stops the kernel and raises KeyboardInterrupt.

Each case runs in a child process (a signal to the test runner would stop the
suite): a kernel that would take minutes is launched, eagerly or under
jax.jit, SIGINT arrives a second later, and the child reports what the
caller caught, how long the launch took, and whether the next launch still
computes the right result.
"""

import json
import os
import tempfile
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import jax

from jt_dist import testing

import fork_server

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import jt_dist
    from jt_dist import testing
    testing.configure_cpu_devices(1)
    import jax
    import numpy as np
    import triton
    import triton.language as tl

    @triton.jit
    def slow_kernel(x_ptr, out_ptr, ITERS: tl.constexpr, BLOCK: tl.constexpr):
      offsets = tl.arange(0, BLOCK)
      acc = tl.load(x_ptr + offsets)
      for _ in range(ITERS):
        acc = acc + 1.0
      tl.store(out_ptr + offsets, acc)

    def call(x, iters):
      return jt_dist.triton_call(
          x, kernel=slow_kernel, out_shape=jax.ShapeDtypeStruct(x.shape,
                                                                x.dtype),
          grid=(1,), ITERS=iters, BLOCK=16)

    jit = sys.argv[1] == "jit"
    f = jax.jit(call, static_argnums=1) if jit else call
    x = np.arange(16, dtype=np.float32)
    # JAX's backend starts at its first use: SIGINT there would fail the
    # start instead of stopping a kernel. One short launch first.
    jax.block_until_ready(f(x, 1))
    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
      jax.block_until_ready(f(x, 10**8))
      caught = "nothing"
    except KeyboardInterrupt:
      caught = "KeyboardInterrupt"
    except Exception as e:
      caught = type(e).__name__ + ": " + str(e)[-300:]
    seconds = time.monotonic() - start
    after = np.asarray(f(x, 3))
    print(json.dumps({"caught": caught, "seconds": seconds,
                      "next_call_right": bool((after == x + 3).all()),
                      "profiler_left": sys.getprofile() is not None}))
""")


class CpuInterruptTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")

  @parameterized.parameters("eager", "jit")
  def test_ctrl_c_raises_keyboard_interrupt_and_stops_the_kernel(self, mode):
    env = fork_server.tree_env(_ROOT, JAX_PLATFORMS="cpu")
    with tempfile.TemporaryDirectory() as tmp:
      # Triton reads a kernel's source from its file.
      child = os.path.join(tmp, "interrupted_launch.py")
      with open(child, "w") as f:
        f.write(_CHILD)
      # A fork of a process that imported jt_dist (the signal reaches the
      # child alone, as it would a process of its own).
      done = fork_server.run([child, mode], env=env, cwd=_ROOT, timeout=300)
    self.assertEqual(done.returncode, 0, done.stderr[-4000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    self.assertEqual(result["caught"], "KeyboardInterrupt", str(result))
    # 10**8 interpreted iterations would take hours: the kernel stopped.
    self.assertLess(result["seconds"], 60, str(result))
    self.assertTrue(result["next_call_right"], str(result))
    self.assertFalse(result["profiler_left"], str(result))


if __name__ == "__main__":
  absltest.main()
