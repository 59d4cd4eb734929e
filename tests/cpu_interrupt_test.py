"""Ctrl-C during a CPU launch stops the kernel and raises KeyboardInterrupt.

Under the caller's own jax.jit, jax's runtime error carries it.

Each case runs in a child process (a signal to the test runner would stop the
suite): a kernel that would take hours is launched, eagerly or under
jax.jit, SIGINT arrives a quarter of a second later, and the child reports
what the caller caught, how long the launch took, and whether the next
launch of the same kernel still computes the right result.
"""

import json
import os
import signal
import sys
import tempfile
import textwrap
import threading
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import numpy as np
import triton
import triton.language as tl

import jt_dist
from jt_dist import _compat
from jt_dist import testing
from jt_dist import _settings
from jt_dist._cpu import interrupts
from jt_dist._cpu import lowering
from jt_dist._cpu import vector_builder
from jt_dist._cpu import vector_launch

import fork_server

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import jt_dist
    from jt_dist import testing
    devices = int(sys.argv[2])
    testing.configure_cpu_devices(devices)
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    import numpy as np
    import triton
    import triton.language as tl

    @triton.jit
    def slow_kernel(x_ptr, iters_ptr, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
      acc = tl.load(x_ptr + offsets)
      for _ in range(tl.load(iters_ptr)):
        acc = acc + 1.0
      tl.store(out_ptr + offsets, acc)

    def call(x, iters):
      options = dict(kernel=slow_kernel, grid=(1,), BLOCK=16,
                     out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))
      if devices == 1:
        return jt_dist.triton_call(x, iters, **options)
      # Over several devices the launches run on XLA's threads, one after
      # another, while the main thread waits for the computation.
      return jt_dist.sharded_triton_call(
          x, iters, mesh=mesh, in_specs=(P("x"), P()), out_specs=P("x"),
          **options)

    mesh = jax.make_mesh((devices,), ("x",))
    # One device takes host arrays, several their shards.
    place = lambda a, spec: (a if devices == 1 else
                             jax.device_put(a, NamedSharding(mesh, spec)))
    jit = sys.argv[1] == "jit"
    f = jax.jit(call) if jit else call
    x = place(np.arange(16 * devices, dtype=np.float32), P("x"))
    # An operand, read by the kernel.
    count = lambda n: place(np.asarray([n], np.int32), P())
    # JAX's backend starts at its first use: SIGINT there would fail the
    # start instead of stopping a kernel. One short launch first, which also
    # compiles what the long launch runs (the count is an operand): nothing
    # but the kernel runs between the timer's start and its signal.
    jax.block_until_ready(f(x, count(1)))
    threading.Timer(0.25, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
      jax.block_until_ready(f(x, count(10**8)))
      caught = "nothing"
    except KeyboardInterrupt:
      caught = "KeyboardInterrupt"
    except Exception as e:
      # Under the caller's jax.jit the kernel ran in a host callback: jax's
      # error carries the interrupt.
      caught = ("jax's error carrying KeyboardInterrupt"
                if "KeyboardInterrupt: " in str(e)
                else type(e).__name__ + ": " + str(e)[-300:])
    seconds = time.monotonic() - start
    start = time.monotonic()
    after = np.asarray(f(x, count(3)))
    print(json.dumps({"caught": caught, "seconds": seconds,
                      "next_seconds": time.monotonic() - start,
                      "next_call_right": bool((after == np.asarray(x) + 3)
                                              .all()),
                      "profiler_left": sys.getprofile() is not None}))
""")


class CpuInterruptTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")

  @parameterized.product(mode=("eager", "jit"), devices=(1, 8))
  def test_ctrl_c_raises_keyboard_interrupt_and_stops_the_kernel(
      self, mode, devices):
    env = fork_server.tree_env(_ROOT, JAX_PLATFORMS="cpu")
    env.pop("JT_DIST_CPU_DEVICES", None)
    with tempfile.TemporaryDirectory() as tmp:
      # Triton reads a kernel's source from its file.
      child = os.path.join(tmp, "interrupted_launch.py")
      with open(child, "w") as f:
        f.write(_CHILD)
      # A fork of a process that imported jt_dist (the signal reaches the
      # child alone, as it would a process of its own).
      done = fork_server.run([child, mode, str(devices)], env=env,
                             cwd=_ROOT, timeout=300)
    self.assertEqual(done.returncode, 0, done.stderr[-4000:])
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # On one device under jit the launch ran in the main thread, inside
    # the caller's program: jax's error carries the interrupt.
    expected = ("jax's error carrying KeyboardInterrupt"
                if (mode, devices) == ("jit", 1) else "KeyboardInterrupt")
    self.assertEqual(result["caught"], expected, str(result))
    # 10**8 interpreted iterations would take hours: every device's launch
    # stopped within 2 s of the signal (0.25 s in), and the next launch,
    # of 3 trips, ran at once.
    self.assertLess(result["seconds"], 2.25, str(result))
    self.assertLess(result["next_seconds"], 30, str(result))
    self.assertTrue(result["next_call_right"], str(result))
    self.assertFalse(result["profiler_left"], str(result))


class _Interrupted(Exception):
  """What the tests' own SIGINT handler raises (never the runner's)."""


@triton.jit
def _add_one_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + 1.0)


def _add_one(mode: str):
  """x + 1 through the kernel on one block of 16, eager or under jax.jit."""
  def call(a):
    return jt_dist.triton_call(
        a, kernel=_add_one_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), BLOCK=16,
        grid=(1,))
  return jax.jit(call) if mode == "jit" else call


@triton.jit
def _add_one_rows_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + 1.0)


def _raises_interrupt(mode: str):
  """Expects the handler's first exception out of a call in ``mode``.

  Under the caller's jax.jit the kernel runs in a host callback of the
  caller's program, and jax's runtime error carries the exception.
  """
  test = absltest.TestCase()
  if mode == "jit":
    # jax's error type for it varies with jax's version.
    return test.assertRaisesRegex(Exception, "_Interrupted: interrupt 1")
  return test.assertRaisesRegex(_Interrupted, "interrupt 1")


class SignalKeptTest(parameterized.TestCase):
  """SIGINT's exception leaves a launch even where the launch replaced it.

  The signal is raised in this process, under a handler of the test's own
  that raises ``_Interrupted``, never under the runner's.
  """

  def setUp(self):
    super().setUp()
    if threading.current_thread() is not threading.main_thread():
      self.skipTest("signal handlers are set on the main thread only")
    self.raised = []

    def handler(signum, frame):
      del signum, frame
      self.raised.append(_Interrupted(f"interrupt {len(self.raised) + 1}"))
      raise self.raised[-1]

    self.handler = handler
    previous = signal.signal(signal.SIGINT, handler)
    self.addCleanup(signal.signal, signal.SIGINT, previous)

  def test_replaced_interrupt_leaves_as_itself(self):
    # As NumPy does when a shape's Python __iter__ raises.
    with self.assertRaises(_Interrupted) as cm:
      with interrupts.signal_kept():
        try:
          signal.raise_signal(signal.SIGINT)
        except _Interrupted:
          raise TypeError("expected a sequence of integers") from None
    self.assertIs(cm.exception, self.raised[0])
    self.assertIsNone(cm.exception.__cause__)
    self.assertIs(signal.getsignal(signal.SIGINT), self.handler)

  def test_interrupt_that_leaves_unchanged_is_the_same_object(self):
    with self.assertRaises(_Interrupted) as cm:
      with interrupts.signal_kept():
        signal.raise_signal(signal.SIGINT)
    self.assertEqual(self.raised, [cm.exception])

  def test_other_errors_pass_without_a_signal(self):
    with self.assertRaisesRegex(TypeError, "the block's own"):
      with interrupts.signal_kept():
        raise TypeError("the block's own")
    self.assertIs(signal.getsignal(signal.SIGINT), self.handler)

  def test_handler_that_raises_nothing_changes_nothing(self):
    quiet = []
    signal.signal(signal.SIGINT, lambda signum, frame: quiet.append(signum))
    with self.assertRaisesRegex(ValueError, "after the signal"):
      with interrupts.signal_kept():
        signal.raise_signal(signal.SIGINT)
        raise ValueError("after the signal")
    self.assertEqual(quiet, [signal.SIGINT])

  def test_other_threads_leave_the_handler_alone(self):
    seen = []

    def body():
      with interrupts.signal_kept():
        seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    self.assertEqual(seen, [self.handler])

  @parameterized.parameters("eager", "jit")
  def test_interrupt_while_numpy_reads_a_shape_raises_it(self, mode):
    # The real path: Triton 3.9's block shapes are tl.tuple objects, whose
    # __iter__ is Python; NumPy reads a shape through it (np.full in the
    # interpreter's splat) and turns any exception there into a TypeError.
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")
    shape = tl.block_type(tl.float32, [16]).shape
    if not isinstance(shape, tl.core.tuple):
      self.skipTest(f"this Triton's block shapes are {type(shape).__name__}"
                    " objects, which NumPy reads without Python code")
    original = tl.core.tuple.__iter__
    fired = []

    def iterate(self_):
      caller = os.path.basename(sys._getframe(1).f_code.co_filename)  # pylint: disable=protected-access
      if not fired and caller == "numeric.py":  # numpy's np.full
        fired.append(caller)
        signal.raise_signal(signal.SIGINT)
      return original(self_)

    x = np.arange(16, dtype=np.float32)
    f = _add_one(mode)
    jax.block_until_ready(f(x))
    with mock.patch.object(tl.core.tuple, "__iter__", iterate):
      with _raises_interrupt(mode):
        jax.block_until_ready(f(x))
    self.assertEqual(fired, ["numeric.py"])
    np.testing.assert_array_equal(np.asarray(f(x)), x + 1)

  @parameterized.parameters("eager", "jit")
  def test_interrupt_a_vectorised_launch_replaced_stops_it(self, mode):
    # The vectorised path gives way to one program at a time on any error;
    # an interrupt it met as another error must stop the launch instead,
    # and say nothing about whether the kernel vectorises.
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")
    if vector_launch.mode() != vector_launch.VECTORISED:
      self.skipTest(f"{_settings.VECTORIZE} runs launches"
                    f" {vector_launch.mode()}; the vectorised path is tested")
    original = vector_builder.VectorBuilder.create_make_range
    fired = []

    def make_range(builder, *args, **kwargs):
      if not fired:
        fired.append(True)
        try:
          signal.raise_signal(signal.SIGINT)
        except _Interrupted:
          # As NumPy reports an exception of Python code it called.
          raise TypeError("expected a sequence of integers") from None
      return original(builder, *args, **kwargs)

    def call(a):
      return jt_dist.triton_call(
          a, kernel=_add_one_rows_kernel,
          out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype), BLOCK=16,
          grid=(a.size // 16,))

    f = jax.jit(call) if mode == "jit" else call
    x = np.arange(64, dtype=np.float32)
    with mock.patch.object(vector_builder.VectorBuilder, "create_make_range",
                           make_range):
      with _raises_interrupt(mode):
        jax.block_until_ready(f(x))
      np.testing.assert_array_equal(np.asarray(f(x)), x + 1)
    self.assertEqual(fired, [True])
    self.assertEqual(vector_launch.decisions_of(_add_one_rows_kernel.fn),
                     {vector_launch.VECTORISED})

  @parameterized.parameters("eager", "jit")
  def test_launch_that_replaced_the_interrupt_raises_it(self, mode):
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")
    original = lowering._interpreter_runtime.run  # pylint: disable=protected-access
    launches = []

    def interrupted_run(*args, **kwargs):
      launches.append(1)
      if len(launches) == 1:
        # The interpreter reports what NumPy made of the interrupt as a
        # fault of the kernel.
        try:
          signal.raise_signal(signal.SIGINT)
        except _Interrupted as e:
          raise _compat.InterpreterError(
              repr(TypeError("expected a sequence of integers"))) from e
      return original(*args, **kwargs)

    x = np.arange(16, dtype=np.float32)
    f = _add_one(mode)
    with mock.patch.object(lowering._interpreter_runtime, "run",  # pylint: disable=protected-access
                           interrupted_run):
      with _raises_interrupt(mode):
        jax.block_until_ready(f(x))
      # The next launch runs and computes.
      np.testing.assert_array_equal(np.asarray(f(x)), x + 1)
    # The handler in force is the test's, wrapped (where a CPU call was
    # lowered) so that an interrupt also stops launches on XLA's threads.
    handler = signal.getsignal(signal.SIGINT)
    self.assertIs(getattr(handler, "previous", handler), self.handler)


if __name__ == "__main__":
  absltest.main()
