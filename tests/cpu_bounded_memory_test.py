"""A vectorised CPU launch takes bounded working memory, whatever its grid.

Each case runs in a child process, which measures its own resident memory
(Linux's /proc and getrusage) and reports it as JSON: one launch over a
grid of 2**31 - 1 programs, stopped by SIGINT, and one launch over a
1000 x 65,536 float32 array, vectorised against one program at a time (in
two children at once). A guard thread in the child exits it once its memory
grows past a limit the case sets, so that a launch that does not bound its
memory fails the test instead of taking the host's memory.
"""

import json
import os
import sys
import tempfile
import textwrap

from absl.testing import absltest
import jax

from jt_dist import testing

import fork_server

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_GiB = 1 << 30
# The working memory a vectorised launch may take beyond its operands and
# outputs: the CPU interpreter's bound, whatever the grid.
_WORKING_MEMORY_BOUND = 256 << 20

# What every child runs first: the platform, its memory readings and the
# guard against runaway growth (argv[1], in bytes).
_PRELUDE = textwrap.dedent("""
    import json, os, resource, signal, sys, threading, time
    import jt_dist
    from jt_dist import testing
    testing.configure_cpu_devices(1)
    import jax
    import numpy as np
    import triton
    import triton.language as tl

    def rss():
      with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def peak():
      return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def guard(base, limit):
      def watch():
        while True:
          if rss() - base > limit:
            print(json.dumps({"guard": rss() - base}), flush=True)
            os._exit(3)
          time.sleep(0.01)
      threading.Thread(target=watch, daemon=True).start()
""")

_HUGE_GRID = _PRELUDE + textwrap.dedent("""
    @triton.jit
    def one_element_kernel(x_ptr, out_ptr):
      tl.store(out_ptr, tl.load(x_ptr) + 1.0)

    def call(x, programs):
      return jt_dist.triton_call(
          x, kernel=one_element_kernel,
          out_shape=jax.ShapeDtypeStruct((1,), np.float32),
          grid=(programs,))

    limit, delay = int(sys.argv[1]), float(sys.argv[2])
    value = float(sys.argv[3])
    x = np.asarray([value], np.float32)
    jax.block_until_ready(call(x, 3))  # The backend starts, the kernel runs.
    base = rss()
    guard(base, limit)
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
      jax.block_until_ready(call(x, 2**31 - 1))
      caught = "nothing"
    except KeyboardInterrupt:
      caught = "KeyboardInterrupt"
    except Exception as e:
      caught = type(e).__name__ + ": " + str(e)[-300:]
    late = time.monotonic() - start - delay
    after = np.asarray(call(x, 7))
    print(json.dumps({"caught": caught, "late": late, "growth": peak() - base,
                      "next_call_right": bool(after[0] == x[0] + 1)}))
""")

_LARGE_LAUNCH = _PRELUDE + textwrap.dedent("""
    @triton.jit
    def add_rows_kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
      offsets = tl.program_id(0).to(tl.int64) * N + tl.arange(0, N)
      tl.store(out_ptr + offsets, tl.load(x_ptr + offsets)
               + tl.load(y_ptr + offsets))

    def call(x, y, programs):
      return jt_dist.triton_call(
          x, y, kernel=add_rows_kernel,
          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
          grid=(programs,), N=x.shape[1])

    limit, seed, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    os.environ["JT_DIST_VECTORIZE"] = how
    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal((1000, 65536), dtype=np.float32)
            for _ in range(2))
    jax.block_until_ready(call(x[:2], y[:2], 2))  # Starts, and sizes chunks.
    base = rss()
    guard(base, limit)
    start = time.monotonic()
    out = np.asarray(call(x, y, 1000))
    seconds = time.monotonic() - start
    print(json.dumps({"growth": peak() - base, "seconds": seconds,
                      "right": bool((out == x + y).all())}))
""")


class BoundedMemoryTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")
    if not sys.platform.startswith("linux"):
      self.skipTest("the children read their memory from Linux's /proc")

  def run_children(self, code, *argvs, timeout=300):
    """Runs ``code`` once per ``argvs`` item, at once; their last JSON lines."""
    env = fork_server.tree_env(_ROOT, JAX_PLATFORMS="cpu",
                               JT_DIST_VECTORIZE="1", JT_DIST_BOUNDS_CHECK="1")
    with tempfile.TemporaryDirectory() as tmp:
      # Triton reads a kernel's source from its file.
      path = os.path.join(tmp, "bounded_launch.py")
      with open(path, "w") as f:
        f.write(code)
      done = fork_server.run_together(
          [[path, *map(str, argv)] for argv in argvs], env=env, cwd=_ROOT,
          timeout=timeout)
    results = []
    for child in done:
      lines = child.stdout.strip().splitlines()
      result = json.loads(lines[-1]) if lines else {}
      self.assertNotIn("guard", result,
                       f"the launch's memory grew past the guard: {result}")
      self.assertEqual(child.returncode, 0, child.stderr[-4000:])
      results.append(result)
    return results

  def test_huge_grid_stays_bounded_and_stops_on_ctrl_c(self):
    allowed = _GiB
    value = float(self.np_rng.integers(-1000, 1000))
    (result,) = self.run_children(_HUGE_GRID, (2 * allowed, 2.0, value))
    self.assertEqual(result["caught"], "KeyboardInterrupt", str(result))
    # Between chunks, not after 2**31 programs.
    self.assertLess(result["late"], 10, str(result))
    self.assertLess(result["growth"], allowed, str(result))
    self.assertTrue(result["next_call_right"], str(result))

  def test_large_launch_peaks_within_its_operands_and_the_bound(self):
    bound = _WORKING_MEMORY_BOUND
    seed = int(self.np_rng.integers(1 << 31))
    # One program at a time, the launch takes what its operands, outputs and
    # copies of them take, and next to nothing more.
    vectorised, one_at_a_time = self.run_children(
        _LARGE_LAUNCH, (8 * _GiB, seed, "1"), (8 * _GiB, seed, "0"))
    self.assertTrue(vectorised["right"], str(vectorised))
    self.assertTrue(one_at_a_time["right"], str(one_at_a_time))
    working = vectorised["growth"] - one_at_a_time["growth"]
    self.assertLess(working, bound,
                    f"{working / 2**20:.0f} MiB of working memory over a"
                    f" {bound / 2**20:.0f} MiB bound: vectorised {vectorised},"
                    f" one program at a time {one_at_a_time}")


if __name__ == "__main__":
  absltest.main()
