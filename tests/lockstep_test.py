"""Control flow that depends on the program runs vectorised, masked.

Loop bounds, ``if``s and early returns that differ between a launch's
programs run in masked lockstep: each kernel here runs vectorised and one
program at a time (or both, compared, under ``JT_DIST_VECTORIZE=check``),
on fresh random inputs, and must agree bit for bit and with a NumPy or jnp
reference. What lockstep cannot prove right runs one program at a time.
"""

import contextlib
import importlib.util
import io
import os
import re
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


def _example(name):
  root = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples")
  spec = importlib.util.spec_from_file_location(
      f"lockstep_test_{name}", os.path.join(root, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_attention = _example("causal_attention")


def _fuzzer():
  import fuzz_cpu  # pylint: disable=g-import-not-at-top
  return fuzz_cpu

# How the interpreter says (on the ``jt_dist`` logger, at DEBUG, once per
# kernel and argument signature) that a kernel's launches run.
VECTORISED = "vectorised"
ONE_AT_A_TIME = "one program at a time"
_DECISION = re.compile(r"jt_dist: kernel (\S+) runs (.+?) on the CPU \(")


@triton.jit
def prefix_kernel(x_ptr, step, out_ptr, counter_ptr, N: tl.constexpr):
  """Row p: the sum of rows 0..p, doubled or less one; program 3 returns."""
  pid = tl.program_id(0)
  cols = tl.arange(0, N)
  acc = tl.zeros([N], dtype=tl.float32)
  for i in range(0, pid + 1, step):
    acc += tl.load(x_ptr + i * N + cols)
  if pid % 2 == 0:
    acc = acc * 2.0
  else:
    acc = acc - 1.0
    tl.atomic_add(counter_ptr, 1)
  if pid == 3:
    return
  tl.store(out_ptr + pid * N + cols, acc)


@triton.jit
def window_kernel(x_ptr, rows, out_ptr, N: tl.constexpr):
  """Row p: the sum of rows p..min(p + 2, rows - 1) (starts differ)."""
  pid = tl.program_id(0)
  cols = tl.arange(0, N)
  acc = tl.zeros([N], dtype=tl.float32)
  last = tl.minimum(pid + 3, rows)
  for i in range(pid, last):
    acc += tl.load(x_ptr + i * N + cols)
  tl.store(out_ptr + pid * N + cols, acc)


@triton.jit
def last_row_kernel(x_ptr, out_ptr, N: tl.constexpr):
  """Row p: row p of x, the last one its loop (p + 1 trips) loaded."""
  pid = tl.program_id(0)
  cols = tl.arange(0, N)
  for i in range(pid + 1):
    last = tl.load(x_ptr + i * N + cols)
  tl.store(out_ptr + pid * N + cols, last)


@triton.jit
def _count_unless_third(counts_ptr, pid):
  if pid % 3 == 0:
    return
  tl.atomic_add(counts_ptr + pid, 1.0)


@triton.jit
def nested_kernel(x_ptr, out_ptr, lock_ptr, counts_ptr, N: tl.constexpr):
  """Nested loops, a per-program start and step, a CAS in a branch, and a
  helper's early return."""
  pid = tl.program_id(0)
  cols = tl.arange(0, N)
  acc = tl.zeros([N], dtype=tl.float32)
  # Every program takes a first trip: i, read after the loop, then has a
  # value per program to merge.
  for i in range(pid + 1):
    for j in range(i, pid, 2):
      acc += tl.load(x_ptr + j * N + cols) * (i + 1)
  for i in range(pid % 3, 8, pid % 2 + 1):
    if i % 2 == 0:
      acc = acc + 1.0
    else:
      acc = acc * 0.5
  if pid % 2 == 1:
    acc += tl.atomic_cas(lock_ptr + pid, 0, pid + 1).to(tl.float32)
  _count_unless_third(counts_ptr, pid)
  tl.store(out_ptr + pid * N + cols, acc)


@triton.jit
def masked_assert_kernel(x_ptr, out_ptr, N: tl.constexpr):
  """The assert fails only where the branch is not taken."""
  pid = tl.program_id(0)
  x = tl.load(x_ptr + pid * N + tl.arange(0, N))
  if pid < 4:
    tl.device_assert(pid < 4, "taken by programs 0 to 3 only")
    x = x + 1.0
  tl.store(out_ptr + pid * N + tl.arange(0, N), x)


@triton.jit
def _halve_or_keep(x, pid):
  if pid % 2 == 0:
    return x * 0.5
  return x


@triton.jit
def value_return_kernel(x_ptr, out_ptr, N: tl.constexpr):
  """A helper returns a value from a branch some programs take."""
  pid = tl.program_id(0)
  offsets = pid * N + tl.arange(0, N)
  tl.store(out_ptr + offsets, _halve_or_keep(tl.load(x_ptr + offsets), pid))


@triton.jit
def int64_window_kernel(base, out_ptr, TRIPS: tl.constexpr):
  """Row p: its trips 0, 1, ...; its int64 bounds differ per program, so
  its index is int64 and ``i * 1000003`` does not wrap."""
  pid = tl.program_id(0)
  lo = base + pid.to(tl.int64) * 5000
  for i in range(lo, lo + TRIPS):
    tl.store(out_ptr + pid * TRIPS + (i - lo),
             (i * 1000003 // 1000003 - lo).to(tl.int32))


@triton.jit
def index_type_kernel(n, wide, out_ptr, TRIPS: tl.constexpr):
  """Loop indices typed as compiled Triton types them: int32 over int32
  bounds (run-time, constexpr or a per-program end), int64 where a bound is
  int64, uint32 over a constant in [2**31, 2**32); ``.to`` works on each."""
  pid = tl.program_id(0)
  total = pid * 0
  for i in range(TRIPS):
    tl.static_assert(i.dtype == tl.int32)
    total += i.to(tl.int64).to(tl.int32)
  for i in range(n):
    tl.static_assert(i.dtype == tl.int32)
    total += i
  for i in range(pid + 1):
    tl.static_assert(i.dtype == tl.int32)
    total += i
  for i in tl.range(wide - 2, wide, 1):
    tl.static_assert(i.dtype == tl.int64)
    total += (i - wide + 2).to(tl.int32)
  for i in range(2**31, 2**31 + 2):
    tl.static_assert(i.dtype == tl.uint32)
    total += (i - 2**31).to(tl.int32)
  for i in tl.static_range(2):
    total += i
  tl.store(out_ptr + pid, total)


@triton.jit
def tickets_kernel(counter_ptr, out_ptr):
  """Two tickets per program from one counter, in two statements."""
  pid = tl.program_id(0)
  first = tl.atomic_add(counter_ptr, 1)
  second = tl.atomic_add(counter_ptr, 1)
  tl.store(out_ptr + 2 * pid, first)
  tl.store(out_ptr + 2 * pid + 1, second)


@triton.jit
def two_part_sum_kernel(x_ptr, sum_ptr, TRIPS: tl.constexpr):
  """A float sum of TRIPS values per program, one atomic per loop trip."""
  pid = tl.program_id(0)
  for k in range(TRIPS):
    tl.atomic_add(sum_ptr, tl.load(x_ptr + TRIPS * pid + k))


@triton.jit
def own_slot_kernel(x_ptr, slots_ptr, sums_ptr, TRIPS: tl.constexpr):
  """Atomics on each program's own slots over its trips, then into one
  total: program order is kept as they run, so the launch vectorises."""
  pid = tl.program_id(0)
  for k in range(pid % TRIPS + 1):
    tl.atomic_add(slots_ptr + pid, tl.load(x_ptr + TRIPS * pid + k))
    tl.atomic_max(slots_ptr + 64 + pid, k)
  tl.atomic_add(sums_ptr, tl.load(x_ptr + TRIPS * pid))


@triton.jit
def late_divergence_kernel(n, out_ptr):
  """A run-time loop bound, then a while loop on which programs 1 on
  disagree: the first chunk (program 0) runs vectorised, the rest give
  way one program at a time."""
  pid = tl.program_id(0)
  acc = pid * 0
  for _ in range(n):
    acc += 1
  left = pid
  while left > 0:
    left -= 1
    acc += 1
  tl.store(out_ptr + pid, acc)


def _spec(shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


class LockstepTest(testing.TestCase, parameterized.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("lockstep is the CPU interpreter's; the default backend"
                    f" here is {jax.default_backend()}")

  @contextlib.contextmanager
  def deciding(self, mode):
    """Runs the block in ``mode``, keeping how its kernels were run.

    Each test launches its kernels with constexprs no other launch uses, so
    the interpreter decides (and logs) how to run them afresh.

    Args:
      mode: the ``JT_DIST_VECTORIZE`` setting to run the block under.
    """
    with mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": mode}), \
        self.assertLogs("jt_dist", "DEBUG") as logs:
      yield
    self.decisions = {}
    for record in logs.records:
      found = _DECISION.match(record.getMessage())
      if found:
        self.decisions.setdefault(found[1], set()).add(found[2])

  def both(self, mode, call, *arrays):
    """``call``'s outputs in ``mode`` and one program at a time, as NumPy."""
    with self.deciding(mode):
      ours = jax.tree.map(np.asarray, call(*arrays))
    with mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": "0"}):
      stock = jax.tree.map(np.asarray, call(*arrays))
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(stock)):
      np.testing.assert_array_equal(a, b)
    return ours

  def assertRan(self, kernel, how):
    self.assertEqual(self.decisions.get(kernel.fn.__qualname__), {how},
                     self.decisions)

  # Each mode its own row width: a fresh decision for each to log.
  @parameterized.parameters(("1", 16), ("check", 32))
  def test_loop_bound_if_else_and_early_return(self, mode, width):
    x = jnp.asarray(self.random((8, width)))
    out, count = self.both(mode, lambda x: jt_dist.triton_call(
        x, 1, kernel=prefix_kernel, out_shape=(_spec((8, width)),
                                            _spec((1,), jnp.int32)),
        grid=(8,), zeroed_outputs=[0, 1], N=width), x)
    sums = np.cumsum(np.asarray(x), axis=0, dtype=np.float32)
    want = np.where((np.arange(8) % 2 == 0)[:, None], sums * 2, sums - 1)
    want[3] = 0
    np.testing.assert_allclose(out, want, rtol=1e-6)
    self.assertEqual(int(count[0]), 4)
    self.assertRan(prefix_kernel, VECTORISED)

  @parameterized.parameters(("1", 16), ("check", 32))
  def test_loop_start_that_differs(self, mode, width):
    x = jnp.asarray(self.random((8, width)))
    out = self.both(mode, lambda x: jt_dist.triton_call(
        x, 8, kernel=window_kernel, out_shape=_spec((8, width)), grid=(8,),
        N=width),
                    x)
    rows = np.asarray(x)
    want = np.stack([rows[p:min(p + 3, 8)].sum(0) for p in range(8)])
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    self.assertRan(window_kernel, VECTORISED)

  def test_a_value_first_assigned_in_the_loop_is_refused_as_compiled(self):
    # Triton's code generator carries only the names bound before a loop.
    x = jnp.asarray(self.random((8, 16)))
    with self.assertRaisesRegex(Exception, r"NameError\('last is not defined"):
      jt_dist.triton_call(x, kernel=last_row_kernel,
                          out_shape=_spec((8, 16)), grid=(8,), N=16)

  @parameterized.parameters(("1", 16), ("check", 32))
  def test_nested_loops_cas_and_a_helpers_return(self, mode, width):
    x = jnp.asarray(self.random((8, width)))
    out, lock, counts = self.both(mode, lambda x: jt_dist.triton_call(
        x, kernel=nested_kernel, out_shape=(
            _spec((8, width)), _spec((8,), jnp.int32), _spec((8,))),
        grid=(8,), zeroed_outputs=[0, 1, 2], N=width), x)
    rows = np.asarray(x)
    for p in range(8):
      want = np.zeros(width, np.float32)
      for i in range(p + 1):
        for j in range(i, p, 2):
          want += rows[j] * np.float32(i + 1)
      for i in range(p % 3, 8, p % 2 + 1):
        want = want + 1 if i % 2 == 0 else want * np.float32(0.5)
      np.testing.assert_allclose(out[p], want, rtol=1e-5, atol=1e-5)
    odd = np.arange(8) % 2 == 1
    np.testing.assert_array_equal(lock, np.where(odd, np.arange(1, 9), 0))
    np.testing.assert_array_equal(counts, (np.arange(8) % 3 != 0) * 1.0)
    self.assertRan(nested_kernel, VECTORISED)

  def test_asserts_hold_only_where_the_branch_is_taken(self):
    x = jnp.asarray(self.random((8, 16)))
    out = self.both("1", lambda x: jt_dist.triton_call(
        x, kernel=masked_assert_kernel, out_shape=_spec((8, 16)), grid=(8,),
        debug=True, N=16), x)
    want = np.asarray(x) + (np.arange(8) < 4)[:, None]
    np.testing.assert_array_equal(out, want.astype(np.float32))
    self.assertRan(masked_assert_kernel, VECTORISED)

  def test_a_value_returned_by_some_programs_runs_one_at_a_time(self):
    x = jnp.asarray(self.random((6, 16)))
    out = self.both("1", lambda x: jt_dist.triton_call(
        x, kernel=value_return_kernel, out_shape=_spec((6, 16)), grid=(6,),
        N=16), x)
    want = np.asarray(x) * np.where(np.arange(6) % 2 == 0, 0.5, 1.0)[:, None]
    np.testing.assert_array_equal(out, want.astype(np.float32))
    self.assertRan(value_return_kernel, ONE_AT_A_TIME)


  @parameterized.parameters(("1", 3), ("check", 4))
  def test_int64_loop_bounds_that_differ_index_in_int64(self, mode, trips):
    out = self.both(mode, lambda: jt_dist.triton_call(
        7, kernel=int64_window_kernel,
        out_shape=_spec((4 * trips,), jnp.int32), grid=(4,), TRIPS=trips))
    np.testing.assert_array_equal(
        out, np.tile(np.arange(trips), 4).astype(np.int32))
    self.assertRan(int64_window_kernel, VECTORISED)

  @parameterized.parameters(("1", 2), ("check", 3), ("0", 4))
  def test_loop_indices_have_their_bounds_type(self, mode, trips):
    with mock.patch.dict(os.environ, {"JT_DIST_VECTORIZE": mode}):
      got = np.asarray(jt_dist.triton_call(
          3, 2**33, kernel=index_type_kernel,
          out_shape=_spec((4,), jnp.int32), grid=(4,), TRIPS=trips))
    pid = np.arange(4)
    want = trips * (trips - 1) // 2 + 3 + pid * (pid + 1) // 2 + 1 + 1 + 1
    np.testing.assert_array_equal(got, want.astype(np.int32))

  def test_tickets_taken_in_two_statements_keep_program_order(self):
    counter, out = self.both("1", lambda: jt_dist.triton_call(
        kernel=tickets_kernel, out_shape=(_spec((1,), jnp.int32),
                                          _spec((8,), jnp.int32)),
        grid=(4,), zeroed_outputs=[0, 1]))
    np.testing.assert_array_equal(out, np.arange(8, dtype=np.int32))
    self.assertEqual(int(counter[0]), 8)
    self.assertRan(tickets_kernel, ONE_AT_A_TIME)

  def test_a_float_sum_over_loop_trips_keeps_program_order(self):
    # Program 1 adds 1 and 1, program 2 then 2**24: exactly 2**24 + 2. Trip
    # by trip over programs, 2**24 would meet each 1 alone and drop it.
    x = np.zeros((8, 2), np.float32)
    x[1] = 1.0
    x[2, 0] = 2.0**24
    total = self.both("1", lambda x: jt_dist.triton_call(
        x, kernel=two_part_sum_kernel, out_shape=_spec((1,)), grid=(8,),
        zeroed_outputs=[0], TRIPS=2), jnp.asarray(x))
    self.assertEqual(float(total[0]), 2.0**24 + 2)
    self.assertRan(two_part_sum_kernel, ONE_AT_A_TIME)

  @parameterized.parameters(("1", 3), ("check", 4))
  def test_atomics_in_program_order_as_they_run_stay_vectorised(self, mode,
                                                               trips):
    x = jnp.asarray(self.random((64 * trips,)))
    slots, sums = self.both(mode, lambda x: jt_dist.triton_call(
        x, kernel=own_slot_kernel, out_shape=(_spec((128,)), _spec((1,))),
        grid=(64,), zeroed_outputs=[0, 1], TRIPS=trips), x)
    rows = np.asarray(x).reshape(64, trips)
    for p in range(64):
      want = np.float32(0)
      for k in range(p % trips + 1):
        want += rows[p, k]
      self.assertEqual(slots[p], want)
      self.assertEqual(slots[64 + p], p % trips)
    self.assertRan(own_slot_kernel, VECTORISED)

  def test_a_launch_giving_way_after_its_first_chunk_reads_loop_bounds(self):
    out = self.both("1", lambda: jt_dist.triton_call(
        3, kernel=late_divergence_kernel, out_shape=_spec((6,), jnp.int32),
        grid=(6,)))
    np.testing.assert_array_equal(out, 3 + np.arange(6, dtype=np.int32))
    self.assertRan(late_divergence_kernel, ONE_AT_A_TIME)

  # Head widths other launches (the example's own run) do not use.
  @parameterized.parameters(("1", 16), ("check", 64))
  def test_causal_flash_attention_forward_and_backward(self, mode, d):
    heads, n_ctx = 2, 128
    q, k, v, do = (jnp.asarray(self.random((heads, n_ctx, d)))
                   for _ in range(4))
    sm_scale = d ** -0.5

    def loss(f):
      return lambda q, k, v: jnp.sum(f(q, k, v, sm_scale) * do)

    with self.deciding(mode):
      out = _attention.causal_attention(q, k, v, sm_scale)
      grads = jax.grad(loss(_attention.causal_attention), (0, 1, 2))(q, k, v)
    np.testing.assert_allclose(out, _attention.reference(q, k, v, sm_scale),
                               rtol=2e-4, atol=2e-4)
    want = jax.grad(loss(_attention.reference), (0, 1, 2))(q, k, v)
    for got, expected in zip(grads, want):
      np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)
    for kernel in (_attention.attention_fwd_kernel,
                   _attention.attention_bwd_kernel):
      self.assertRan(kernel, VECTORISED)


class DrawnKernelsTest(testing.TestCase):
  """Drawn kernels (``tests/fuzz_cpu.py``) agree bit for bit
  vectorised and one program at a time."""

  def test_drawn_kernels_agree_with_one_program_at_a_time(self):
    if jax.default_backend() != "cpu":
      self.skipTest("the vectorised interpreter is the CPU path; the default"
                    f" backend here is {jax.default_backend()}")
    report = io.StringIO()
    failed = _fuzzer().run(seed=0, cases=200, out=report)
    self.assertEqual(failed, [], report.getvalue())
    # The draws reach the vectorised path, not only its giving way.
    launches = re.search(r"'vectorised': (\d+)", report.getvalue())
    self.assertGreater(int(launches[1]), 100, report.getvalue())


if __name__ == "__main__":
  absltest.main()
