"""A kernel's error under jax.jit on the CPU reaches the user in jt_dist's words.

Each case runs in a subprocess, so that the test sees everything written to
the process's stderr (XLA's and jax's logging included): a kernel that reads
past its input, or that Triton's interpreter rejects, is called under
jax.jit on one device and over 8 devices.
"""

import json
import os
import re
import tempfile
import textwrap

from absl.testing import absltest
from absl.testing import parameterized
import jax

from jt_dist import testing
import fork_server

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD = textwrap.dedent("""
    import json, os, sys
    import jt_dist
    from jt_dist import testing
    testing.configure_cpu_devices(int(sys.argv[2]))
    import jax
    from jax.sharding import PartitionSpec as P
    import numpy as np
    import triton
    import triton.language as tl

    @triton.jit
    def add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
      mask = offsets < n
      x = tl.load(x_ptr + offsets, mask=mask)  # LOAD LINE
      tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask),
               mask=mask)

    @triton.jit
    def mismatch_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.arange(0, BLOCK)
      y = tl.load(x_ptr + offsets) + tl.zeros((2 * BLOCK,), tl.float32)
      tl.store(out_ptr + offsets, y)

    def call(kind, x, y):
      out = jax.ShapeDtypeStruct(x.shape, x.dtype)
      if kind == "mismatch":
        return jt_dist.triton_call(x, kernel=mismatch_kernel, out_shape=out,
                                   grid=(1,), BLOCK=16)
      # n is 100 too large: the last program reads past both inputs.
      return jt_dist.triton_call(x, y, x.size + 100, kernel=add_kernel,
                                 out_shape=out, grid=(x.size // 64 + 2,),
                                 BLOCK=64)

    kind = sys.argv[1]
    devices = jax.device_count()
    f = lambda x, y: call(kind, x, y)
    if devices > 1:
      mesh = jax.make_mesh((devices,), ("x",))
      f = lambda x, y: jax.shard_map(
          lambda a, b: call(kind, a, b), mesh=mesh, in_specs=P("x"),
          out_specs=P("x"))(x, y)
    x = np.zeros(256 * devices, np.float32)
    if devices > 1:
      x = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("x")))
    try:
      jax.block_until_ready(jax.jit(f)(x, x))
      result = {"type": None}
    except Exception as e:
      result = {"type": type(e).__name__, "message": str(e)}
    print(json.dumps(result), flush=True)
    if devices > 1:
      # jax reports a failed multi-device computation with host callbacks
      # again at exit (its effects barrier), whoever raised the error: skip
      # that report, which is jax's, not the call's.
      os._exit(0)
""")

# What the CUDA plugin prints at start-up on a host without GPUs (it has
# nothing to do with the kernel's error).
_PLUGIN_NOISE = re.compile(r"cuda|absl::InitializeLog", re.IGNORECASE)


def _kernels_message(message: str, error_type: str) -> str:
  """The kernel's message inside jax's runtime error."""
  head = f"{error_type}: "
  if head not in message:
    raise AssertionError(f"no {head!r} in jax's message: {message}")
  return message[message.index(head) + len(head):]


class CpuKernelErrorTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")

  def _run(self, kind, devices):
    env = fork_server.tree_env(_ROOT, JAX_PLATFORMS="cpu")
    env.pop("JT_DIST_BOUNDS_CHECK", None)
    with tempfile.TemporaryDirectory() as tmp:
      # Triton reads a kernel's source from its file.
      child = os.path.join(tmp, "failing_kernel.py")
      with open(child, "w") as f:
        f.write(_CHILD)
      done = fork_server.run([child, kind, str(devices)], env=env,
                             cwd=_ROOT, timeout=300)
    self.assertEqual(done.returncode, 0, done.stderr[-4000:])
    stderr = [line for line in done.stderr.splitlines()
              if not _PLUGIN_NOISE.search(line)]
    self.assertEqual(stderr, [], "nothing but the error may reach the user")
    return json.loads(done.stdout.strip().splitlines()[-1])

  def test_out_of_bounds_on_one_device_carries_jt_dists_error(self):
    result = self._run("bounds", 1)
    # The kernel ran in a host callback of the caller's program: jax raises
    # its error, with the kernel's exception type and message in it.
    self.assertEqual(result["type"], "JaxRuntimeError", str(result))
    # Its first line is the kernel's fault, with no traceback before it.
    self.assertRegex(result["message"], r"^[A-Z_]+: jt_dist\."
                     r"OutOfBoundsAccessError: kernel 'add_kernel', program"
                     r" id \(4, 0, 0\): load")
    self.assertNotIn("Traceback", result["message"])
    message = _kernels_message(result["message"], "OutOfBoundsAccessError")
    self.assertStartsWith(
        message, "kernel 'add_kernel', program id (4, 0, 0): load through"
        " 'x_ptr' (input 0)")
    self.assertRegex(message, r"The access is at \S*failing_kernel\.py:\d+"
                     r" \(`x = tl\.load\(x_ptr \+ offsets, mask=mask\)")

  def test_interpreter_error_names_kernel_program_and_line(self):
    result = self._run("mismatch", 1)
    self.assertEqual(result["type"], "JaxRuntimeError", str(result))
    self.assertRegex(
        _kernels_message(result["message"], "InterpreterError"),
        r"^kernel 'mismatch_kernel', program id \(0, 0, 0\), at"
        r" \S*failing_kernel\.py:\d+ \(`y = tl\.load\(x_ptr \+ offsets\) \+"
        r" tl\.zeros")

  @parameterized.parameters("bounds", "mismatch")
  def test_over_eight_devices_jaxs_message_is_short(self, kind):
    # XLA's threads run the kernels there: the error is jax's, its first
    # line the kernel's, with no traceback and nothing on stderr.
    result = self._run(kind, 8)
    self.assertEqual(result["type"], "JaxRuntimeError", str(result))
    message = result["message"]
    self.assertRegex(message.splitlines()[0],
                     r"^[A-Z_]+: \S+Error: kernel '\w+', program id")
    self.assertNotIn("Traceback", message)
    self.assertNotIn("interpreter.py", message)


if __name__ == "__main__":
  absltest.main()
