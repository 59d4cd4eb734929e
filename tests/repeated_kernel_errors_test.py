"""A program that launches failing kernels again and again on the CPU.

One jitted program that calls a broken kernel twice (``f(f(a))``), in a
``jax.lax.map``, in a ``jax.lax.fori_loop``, or once per batch element
under ``jax.vmap`` with ``vmap_method="sequential"``: the caller gets the
first launch's error (the kernel's own exception, or jax's runtime error
carrying it), the process goes on, and a correct kernel still runs after
it. Each case runs in a child process, so that an abort (XLA's runtime
terminating on an exception it cannot pass on) fails the test instead of
killing the test runner; the child reports what it caught as JSON. Both
of the CPU's routes into the interpreter are taken: JAX's buffer callback
and jt_dist's own custom-call target.
"""

import json
import os
import tempfile
import textwrap

from absl.testing import absltest
from absl.testing import parameterized

from jt_dist import testing
import script_util

_CHILD = textwrap.dedent("""
    import json, sys
    import jt_dist
    import jax
    import jax.numpy as jnp
    import numpy as np
    import triton
    import triton.language as tl

    @triton.jit
    def undefined_name_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.arange(0, BLOCK)
      tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * undefined_name)

    @triton.jit
    def pointer_times_float_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.arange(0, BLOCK)
      tl.store(out_ptr + offsets, tl.load(x_ptr * 2.0 + offsets))

    @triton.jit
    def double_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
      offsets = tl.arange(0, BLOCK)
      tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) * 2)

    KERNELS = {"undefined_name": undefined_name_kernel,
               "pointer_times_float": pointer_times_float_kernel}
    program, first, second, route, seed = sys.argv[1:6]
    options = ({"vmap_method": "sequential"} if program == "vmap_sequential"
               else {})
    if route == "ffi_target":  # jt_dist's own CPU custom call
      options["cost_estimate"] = {"flops": 16}
    else:  # as where jt_dist's target cannot register
      from jt_dist._cpu import ffi_target
      ffi_target.ensure_registered = lambda: False

    def call(kernel, a):
      return jt_dist.triton_call(a, kernel=kernel, out_shape=a, grid=(1,),
                                 BLOCK=16, **options)

    def body(a):  # first's kernel, then second's on its result
      return call(KERNELS[second], call(KERNELS[first], a))

    x = np.random.default_rng(int(seed)).standard_normal((3, 16), np.float32)
    programs = {
        "eager": lambda: body(x[0]),
        "jit": lambda: jax.jit(body)(x[0]),
        "map": lambda: jax.lax.map(body, x),
        "fori_loop": lambda: jax.lax.fori_loop(
            0, 3, lambda i, a: body(a), x[0]),
        "vmap_sequential": lambda: jax.vmap(body)(x),
    }
    errors = []
    for attempt in range(2):  # The same program again, in the same process.
      try:
        jax.block_until_ready(programs[program]())
        errors.append({"type": None})
      except Exception as e:  # pylint: disable=broad-except
        errors.append({"type": type(e).__name__, "message": str(e)})
    # The process goes on: a correct kernel runs, eagerly and jitted.
    doubled = [np.asarray(f(jnp.asarray(x[0]))) for f in (
        lambda a: jt_dist.triton_call(a, kernel=double_kernel, out_shape=a,
                                      grid=(1,), BLOCK=16),
        jax.jit(lambda a: jt_dist.triton_call(
            a, kernel=double_kernel, out_shape=a, grid=(1,), BLOCK=16)))]
    print(json.dumps({
        "errors": errors,
        "doubled": all(np.array_equal(d, x[0] * 2) for d in doubled),
    }), flush=True)
""")

# What the interpreter reports for a kernel broken at run time, after the
# kernel's name, program id and line; an undefined name is refused when the
# kernel is lowered, by Triton's code generator.
_MESSAGES = {
    "pointer_times_float":
        "invalid operands of type pointer<fp32> and triton.language.float32",
}
_PROGRAMS = ("eager", "jit", "map", "fori_loop", "vmap_sequential")
_PAIRS = (("undefined_name", "undefined_name"),
          ("pointer_times_float", "pointer_times_float"),
          ("undefined_name", "pointer_times_float"),
          ("pointer_times_float", "undefined_name"))
# The CPU's two ways into the interpreter: jt_dist's own custom-call target
# (here with a cost_estimate), and JAX's buffer callback where it cannot
# register.
_ROUTES = {"buffer_callback": _PAIRS, "ffi_target": _PAIRS[2:]}


def _cases():
  for route, pairs in _ROUTES.items():
    for program in _PROGRAMS:
      for first, second in pairs:
        name = first if first == second else f"{first}_then_{second}"
        yield f"{route}_{program}_{name}", program, first, second, route


class RepeatedKernelErrorsTest(testing.TestCase):

  def _run(self, program, first, second, route):
    with tempfile.TemporaryDirectory() as tmp:
      # Triton reads a kernel's source from its file.
      child = os.path.join(tmp, "failing_kernels.py")
      with open(child, "w") as f:
        f.write(_CHILD)
      done = script_util.run_python(
          [child, program, first, second, route, str(self.seed)],
          env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    self.assertEqual(done.returncode, 0,
                     f"the child died (seed {self.seed}):\n"
                     + done.stderr[-4000:])
    self.assertNotIn("terminate called", done.stderr)
    self.assertEqual(script_util.without_plugin_lines(done.stderr), "",
                     "nothing but the error may reach the user")
    return json.loads(done.stdout.strip().splitlines()[-1])

  @parameterized.named_parameters(*_cases())
  def test_first_error_raised_and_process_goes_on(self, program, first,
                                                  second, route):
    result = self._run(program, first, second, route)
    self.assertTrue(result["doubled"], "a correct kernel failed afterwards")
    head = f"kernel '{first}_kernel', program id (0, 0, 0), at "
    for attempt, error in enumerate(result["errors"]):
      with self.subTest(attempt=attempt):
        kind, message = error["type"], error.get("message", "")
        if first == "undefined_name" or (
            second == "undefined_name"
            and program not in ("eager", "vmap_sequential")):
          # Refused when lowered, before any launch of the program, as
          # compiling for a GPU refuses it.
          self.assertEqual(kind, "CompilationError", str(error))
          self.assertIn("NameError('undefined_name is not defined')",
                        message)
          continue
        # Outside any trace the kernel's own exception; from a jitted
        # program on the CPU, jax's runtime error with it inside.
        self.assertIn(kind, ("InterpreterError", "JaxRuntimeError"),
                      str(error))
        if kind == "InterpreterError":
          self.assertStartsWith(message, head)
        else:
          self.assertIn(f"InterpreterError: {head}", message)
        self.assertEqual(message.count(" program id "), 1, message)
        self.assertIn(_MESSAGES[first], message)
        if second != first:
          self.assertNotIn(f"'{second}_kernel'", message)
          self.assertNotIn(_MESSAGES.get(second, "undefined_name"), message)


if __name__ == "__main__":
  absltest.main()
