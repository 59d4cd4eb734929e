"""The vectorised interpreter against Triton's, one program at a time.

Every kernel runs twice on the same fresh random inputs: once as jt_dist
runs it (all programs at once where it can) and once one program at a time
(Triton's own interpreter loop). The results must be equal bit for bit:
the vectorised path keeps upstream's order of operations, atomics included.
Each test also checks which path the kernel took.
"""

import importlib.util
import inspect
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _settings  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._core import tensordesc  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import bounds  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import host_memory  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_builder  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_launch  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._cpu import vector_reviewed  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import desc_copy_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position

VECTORISED = vector_launch.VECTORISED
ONE_AT_A_TIME = vector_launch.ONE_AT_A_TIME


def _example(name):
  root = os.path.join(os.path.dirname(os.path.dirname(__file__)), "examples")
  spec = importlib.util.spec_from_file_location(
      f"vec_test_{name}", os.path.join(root, f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_add = _example("add")
_softmax = _example("softmax")
_matmul = _example("matmul")
_layernorm = _example("layernorm_training")
_attention = _example("sharded_attention")


@triton.jit
def counter_kernel(x_ptr, n, counter_ptr, slots_ptr, BLOCK: tl.constexpr):
  # Each program takes a ticket; the tickets' order is the programs' order.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  ticket = tl.atomic_add(counter_ptr, 1)
  tl.store(slots_ptr + tl.program_id(0), ticket)
  x = tl.load(x_ptr + offsets, mask=mask, other=0)
  tl.atomic_max(counter_ptr + 1, tl.max(x, 0))


@triton.jit
def reductions_kernel(x_ptr, out_ptr, idx_ptr, scan_ptr, M: tl.constexpr,
                      N: tl.constexpr):
  base = tl.program_id(0) * M * N
  rm = tl.arange(0, M)
  rn = tl.arange(0, N)
  x = tl.load(x_ptr + base + rm[:, None] * N + rn[None, :])
  row = tl.program_id(0) * 8
  tl.store(out_ptr + row + 0, tl.sum(x))
  tl.store(out_ptr + row + 1, tl.max(tl.max(x, 1), 0))
  tl.store(out_ptr + row + 2, tl.min(tl.sum(x, 0, keep_dims=True)))
  tl.store(out_ptr + row + 3, tl.sum(tl.reduce(x, 1, _mul_add), 0))
  tl.store(out_ptr + row + 4, tl.xor_sum(tl.arange(0, N) * tl.program_id(0)))
  tl.store(idx_ptr + tl.program_id(0) * 2, tl.argmax(tl.sum(x, 1), 0))
  tl.store(idx_ptr + tl.program_id(0) * 2 + 1, tl.argmin(tl.sum(x, 0), 0))
  scan_base = tl.program_id(0) * 3 * M * N
  grid = rm[:, None] * N + rn[None, :]
  tl.store(scan_ptr + scan_base + grid, tl.cumsum(x, 1))
  tl.store(scan_ptr + scan_base + M * N + grid,
           tl.associative_scan(x, 0, _mul_add, reverse=True))
  tl.store(scan_ptr + scan_base + 2 * M * N + grid, tl.cumprod(x, 0))


@triton.jit
def _mul_add(a, b):
  return a * 0.5 + b


@triton.jit
def shapes_kernel(x_ptr, w_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr):
  base = tl.program_id(0) * M * N
  rm = tl.arange(0, M)
  rn = tl.arange(0, N)
  x = tl.load(x_ptr + base + rm[:, None] * N + rn[None, :])
  w = tl.load(w_ptr + rn[:, None] * N + rn[None, :])  # Shared by programs.
  y = tl.dot(x, w) + tl.trans(tl.reshape(x, (N, M))) + tl.reshape(x, (N, M)).T
  a, b = tl.split(tl.reshape(y, (M, N // 2, 2)))
  z = tl.join(b, a)
  z = tl.permute(z, (1, 0, 2))
  z = tl.reshape(z, (M, N))
  z = tl.where(z > 0, z, tl.exp(z) - tl.program_id(0).to(tl.float32))
  z = tl.broadcast_to(tl.expand_dims(tl.sum(z, 1), 1), (M, N)) + z
  tl.store(out_ptr + base + rm[:, None] * N + rn[None, :], z)


@triton.jit
def causal_attention_kernel(q_ptr, k_ptr, v_ptr, seq_len, o_ptr,
                            D: tl.constexpr, BLOCK: tl.constexpr):
  """Causal attention: the key loop stops at the program's own block."""
  pid_m = tl.program_id(0)
  base = tl.program_id(1) * seq_len * D
  rm = pid_m * BLOCK + tl.arange(0, BLOCK)
  rd = tl.arange(0, D)
  q = tl.load(q_ptr + base + rm[:, None] * D + rd[None, :])
  m_i = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
  l_i = tl.zeros([BLOCK], dtype=tl.float32)
  acc = tl.zeros([BLOCK, D], dtype=tl.float32)
  for start in range(0, (pid_m + 1) * BLOCK, BLOCK):
    rn = start + tl.arange(0, BLOCK)
    k = tl.load(k_ptr + base + rn[:, None] * D + rd[None, :])
    s = tl.dot(q, tl.trans(k))
    s = tl.where(rm[:, None] >= rn[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(v_ptr + base + rn[:, None] * D + rd[None, :])
    acc = acc * alpha[:, None] + tl.dot(p, v)
    m_i = m_new
  tl.store(o_ptr + base + rm[:, None] * D + rd[None, :], acc / l_i[:, None])


@triton.jit
def store_then_branch_kernel(in_ptr, io_ptr, flags_ptr, BLOCK: tl.constexpr):
  """Writes, then loops on the program: the attempt must be undone.

  ``in_ptr`` is aliased to ``io_ptr``. A ``while`` loop whose condition
  differs between programs never runs in lockstep.
  """
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.store(io_ptr + offsets, tl.load(io_ptr + offsets) + 1.0)
  tl.atomic_add(flags_ptr, 1)
  odd = tl.program_id(0) % 2
  while odd > 0:
    tl.atomic_add(flags_ptr + 1, 1)
    odd -= 1


@triton.jit
def uniform_branch_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  """Python control flow every program takes alike stays vectorised."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  if tl.program_id(0) >= tl.num_programs(0):
    return
  acc = tl.zeros((BLOCK,), tl.float32)
  for i in range(0, n // 100):
    acc += tl.load(x_ptr + offsets) * i
  if n > 100:
    acc = acc * 2.0
  tl.store(out_ptr + offsets, acc)


@triton.jit
def bf16_kernel(x_ptr, y_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  y = tl.load(y_ptr + offsets)
  tl.store(out_ptr + offsets, (x * y + x).to(tl.bfloat16))


@triton.jit
def descriptor_kernel(x_ptr, m, n, out_ptr, BM: tl.constexpr,
                      BN: tl.constexpr):
  src = tl.make_tensor_descriptor(x_ptr, shape=[m, n], strides=[n, 1],
                                  block_shape=[BM, BN])
  dst = tl.make_tensor_descriptor(out_ptr, shape=[m, n], strides=[n, 1],
                                  block_shape=[BM, BN])
  row = tl.program_id(0) * BM
  dst.store([row, 0], src.load([row, 0]) * 2.0)


@triton.jit
def block_pointer_kernel(x_ptr, m, n, out_ptr, BM: tl.constexpr,
                         BN: tl.constexpr):
  row = tl.program_id(0) * BM
  src = tl.make_block_ptr(x_ptr, shape=(m, n), strides=(n, 1),
                          offsets=(row, 0), block_shape=(BM, BN), order=(1, 0))
  dst = tl.make_block_ptr(out_ptr, shape=(m, BN), strides=(BN, 1),
                          offsets=(row, 0), block_shape=(BM, BN), order=(1, 0))
  acc = tl.zeros((BM, BN), tl.float32)
  for _ in range(2):
    acc += tl.load(src, boundary_check=(0, 1), padding_option="zero")
    src = tl.advance(src, (0, BN))
  tl.store(dst, acc, boundary_check=(0, 1))


def _spec(shape, dtype=jnp.float32):
  return jax.ShapeDtypeStruct(shape, dtype)


class VectorisedMatchesOneAtATimeTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the vectorised interpreter is the CPU path; the default"
                    f" backend here is {jax.default_backend()}")

  def both(self, call, *arrays):
    """``call``'s outputs vectorised and one program at a time, as NumPy."""
    arrays = [jnp.asarray(a) for a in arrays]
    vectorised = jax.tree.map(np.asarray, call(*arrays))
    with mock.patch.dict(os.environ, {_settings.VECTORIZE: "0"}):
      stock = jax.tree.map(np.asarray, call(*arrays))
    return vectorised, stock

  def assertSame(self, vectorised, stock):
    for v, s in zip(jax.tree.leaves(vectorised), jax.tree.leaves(stock)):
      np.testing.assert_array_equal(v, s)

  def assertRan(self, kernel, how):
    while not hasattr(kernel, "__code__"):  # Autotuner, JITFunction.
      kernel = kernel.fn
    self.assertEqual(vector_launch.decisions_of(kernel), {how})

  def test_add(self):
    x, y = self.random((3000,)), self.random((3000,))
    self.assertSame(*self.both(
        lambda x, y: _add.add(x, y, block=256), x, y))
    self.assertRan(_add.add_kernel, VECTORISED)

  def test_softmax(self):
    self.assertSame(*self.both(_softmax.softmax, self.random((37, 50))))
    self.assertRan(_softmax.softmax_kernel, VECTORISED)

  def test_matmul(self):
    a, b = self.random((48, 36)), self.random((36, 40))
    vectorised, stock = self.both(_matmul.matmul, a, b)
    # A batched matmul may order its sums differently from one at a time.
    self.assertAllClose(vectorised, stock, rtol=1e-6, atol=1e-6)
    self.assertRan(_matmul.matmul_kernel, VECTORISED)

  # d=40 masks lanes of the 64-wide block; d=64 fills it.
  @parameterized.parameters(40, 64)
  def test_layer_norm_forward_and_backward(self, d):
    rows = 24
    x, w, b, dy = (self.random(s) for s in ((rows, d), (d,), (d,), (rows, d)))

    def forward(x, w, b):
      return jt_dist.triton_call(
          x, w, b, d, 1e-5, kernel=_layernorm.ln_fwd_kernel,
          out_shape=(_spec((rows, d)), _spec((rows,)), _spec((rows,))),
          grid=(rows,), BLOCK_D=64)

    outs, stock = self.both(forward, x, w, b)
    self.assertSame(outs, stock)
    _, mean, rstd = outs

    def backward(x, w, mean, rstd, dy):
      return jt_dist.triton_call(
          x, w, mean, rstd, dy, d, kernel=_layernorm.ln_bwd_kernel,
          out_shape=(_spec((rows, d)), _spec((d,)), _spec((d,))),
          grid=(rows,), zeroed_outputs=[1, 2], BLOCK_D=64)

    self.assertSame(*self.both(backward, x, w, mean, rstd, dy))
    self.assertRan(_layernorm.ln_fwd_kernel, VECTORISED)
    self.assertRan(_layernorm.ln_bwd_kernel, VECTORISED)

  def test_attention_example(self):
    q, k, v = (self.random((2, 40, 16)) for _ in range(3))

    def attention(q, k, v):
      return jt_dist.triton_call(
          q, k, v, 40, 0.25, kernel=_attention.attention_kernel,
          out_shape=_spec(q.shape), grid=(3, 2), HEAD_DIM=16, BLOCK_M=16,
          BLOCK_N=16)

    vectorised, stock = self.both(attention, q, k, v)
    self.assertAllClose(vectorised, stock, rtol=1e-6, atol=1e-6)
    self.assertRan(_attention.attention_kernel, VECTORISED)

  def test_atomic_tickets_keep_the_programs_order(self):
    x = self.np_rng.integers(-50, 50, size=(100,)).astype(np.int32)

    def tickets(x):
      return jt_dist.triton_call(
          x, 100, kernel=counter_kernel,
          out_shape=(_spec((2,), jnp.int32), _spec((7,), jnp.int32)),
          grid=(7,), zeroed_outputs=[0, 1], BLOCK=16)

    vectorised, stock = self.both(tickets, x)
    self.assertSame(vectorised, stock)
    np.testing.assert_array_equal(vectorised[1], np.arange(7))
    self.assertEqual(vectorised[0][1], x.max())
    self.assertRan(counter_kernel, VECTORISED)

  def test_histogram_atomics(self):
    idx = self.np_rng.integers(0, 16, size=(90,)).astype(np.int32)

    def histogram(idx):
      return jt_dist.triton_call(
          idx, 90, jnp.full((17,), -1, jnp.int32),
          kernel=_histogram_with_first,
          out_shape=(_spec((16,), jnp.int32), _spec((17,), jnp.int32)),
          grid=(6,), zeroed_outputs=[0], input_output_aliases={1: 1},
          BLOCK=16)

    vectorised, stock = self.both(histogram, idx)
    self.assertSame(vectorised, stock)
    np.testing.assert_array_equal(vectorised[0], np.bincount(idx, minlength=16))
    self.assertRan(_histogram_with_first, VECTORISED)

  @parameterized.parameters(True, False)
  def test_tl_histogram(self, masked):
    rows, n = 4, 40
    idx = self.np_rng.integers(0, 8, size=(rows, n)).astype(np.int32)

    def histogram(idx):
      return jt_dist.triton_call(
          idx, n, kernel=_block_histogram,
          out_shape=_spec((rows, 8), jnp.int32), grid=(rows,), BLOCK=64,
          BINS=8, MASKED=masked)

    vectorised, stock = self.both(histogram, idx)
    self.assertSame(vectorised, stock)
    # Unmasked, the block's lanes past n load 0 and count in bin 0.
    want = np.stack([np.bincount(r, minlength=8) for r in idx])
    want[:, 0] += 0 if masked else 64 - n
    np.testing.assert_array_equal(vectorised, want)
    self.assertRan(_block_histogram, VECTORISED)

  def test_reductions_and_scans(self):
    x = self.random((5, 4, 8))

    def reductions(x):
      return jt_dist.triton_call(
          x, kernel=reductions_kernel,
          out_shape=(_spec((40,)), _spec((10,), jnp.int32),
                     _spec((5 * 3 * 32,))),
          grid=(5,), zeroed_outputs=[0], M=4, N=8)

    self.assertSame(*self.both(reductions, x))
    self.assertRan(reductions_kernel, VECTORISED)

  def test_shape_operations(self):
    x, w = self.random((6, 8, 16)), self.random((16, 16))

    def shapes(x, w):
      return jt_dist.triton_call(
          x, w, kernel=shapes_kernel, out_shape=_spec(x.shape), grid=(6,),
          M=8, N=16)

    vectorised, stock = self.both(shapes, x, w)
    self.assertAllClose(vectorised, stock, rtol=1e-6, atol=1e-6)
    self.assertRan(shapes_kernel, VECTORISED)

  def test_bfloat16(self):
    x, y = (self.random((512,)).astype(jnp.bfloat16) for _ in range(2))

    def fn(x, y):
      return jt_dist.triton_call(
          x, y, kernel=bf16_kernel, out_shape=_spec((512,), jnp.bfloat16),
          grid=(4,), BLOCK=128)

    self.assertSame(*self.both(fn, x, y))
    self.assertRan(bf16_kernel, VECTORISED)

  def test_uniform_control_flow_stays_vectorised(self):
    x = self.random((128,))

    def fn(x):
      return jt_dist.triton_call(
          x, 350, kernel=uniform_branch_kernel, out_shape=_spec((128,)),
          grid=(4,), BLOCK=32)

    self.assertSame(*self.both(fn, x))
    self.assertRan(uniform_branch_kernel, VECTORISED)

  def test_causal_attention_runs_in_lockstep(self):
    # The key loop's bound depends on the program: its shorter loops run
    # masked, all programs at once.
    q, k, v = (self.random((2, 64, 16)) for _ in range(3))

    def attention(q, k, v):
      return jt_dist.triton_call(
          q, k, v, 64, kernel=causal_attention_kernel,
          out_shape=_spec(q.shape), grid=(4, 2), D=16, BLOCK=16)

    vectorised, stock = self.both(attention, q, k, v)
    self.assertSame(vectorised, stock)
    self.assertRan(causal_attention_kernel, VECTORISED)

  def test_branch_after_a_store_is_undone_before_falling_back(self):
    io = self.random((64,))

    def fn(io):
      return jt_dist.triton_call(
          io, kernel=store_then_branch_kernel,
          out_shape=(_spec((64,)), _spec((2,), jnp.int32)), grid=(4,),
          input_output_aliases={0: 0}, zeroed_outputs=[1], BLOCK=16)

    vectorised, stock = self.both(fn, io)
    self.assertSame(vectorised, stock)
    np.testing.assert_array_equal(vectorised[0], io + np.float32(1))
    np.testing.assert_array_equal(vectorised[1], [4, 2])
    self.assertRan(store_then_branch_kernel, ONE_AT_A_TIME)

  def test_out_of_bounds_names_the_same_program_as_before(self):
    x, y = self.random((64,)), self.random((64,))

    def fn(x, y):
      return jt_dist.triton_call(
          x, y, 100, kernel=_add.add_kernel, out_shape=_spec((64,)),
          grid=(7,), BLOCK=16)

    messages = []
    for one_at_a_time in (False, True):
      # The checker on whatever the environment says: its report is the
      # subject (unchecked, the kernel would read past its inputs).
      one = {_settings.VECTORIZE: "0"} if one_at_a_time else {}
      with mock.patch.dict(os.environ, one), \
          mock.patch.dict(os.environ, {_settings.BOUNDS_CHECK: "1"}):
        with self.assertRaises(jt_dist.OutOfBoundsAccessError) as e:
          jax.block_until_ready(fn(jnp.asarray(x), jnp.asarray(y)))
      messages.append(str(e.exception))
    self.assertIn("program id (4, 0, 0): load through 'x_ptr'", messages[0])
    self.assertIn("element offsets [64, 65,", messages[0])
    self.assertEqual(messages[0], messages[1])

  def test_tensor_descriptor(self):
    if not hasattr(tl, "make_tensor_descriptor"):
      self.skipTest(f"Triton {triton.__version__} has no tensor descriptors")
    x = self.random((48, 16))

    def fn(x):
      return jt_dist.triton_call(
          x, 48, 16, kernel=descriptor_kernel, out_shape=_spec(x.shape),
          grid=(3,), BM=16, BN=16)

    self.assertSame(*self.both(fn, x))
    self.assertRan(descriptor_kernel, VECTORISED)

  def test_block_pointers(self):
    x = self.random((40, 32))

    def fn(x):
      return jt_dist.triton_call(
          x, 40, 32, kernel=block_pointer_kernel, out_shape=_spec((40, 16)),
          grid=(3,), BM=16, BN=16)

    try:
      vectorised, stock = self.both(fn, x)
    except Exception as e:  # pylint: disable=broad-except
      if "Block pointers have been removed" in str(e):
        self.skipTest(f"Triton {triton.__version__} has no block pointers")
      raise
    self.assertSame(vectorised, stock)
    self.assertRan(block_pointer_kernel, VECTORISED)


@triton.jit
def _block_histogram(idx_ptr, n, out_ptr, BLOCK: tl.constexpr,
                     BINS: tl.constexpr, MASKED: tl.constexpr):
  row = tl.program_id(0)
  offsets = tl.arange(0, BLOCK)
  inside = offsets < n
  idx = tl.load(idx_ptr + row * n + offsets, mask=inside, other=0)
  if MASKED:
    counts = tl.histogram(idx, BINS, mask=inside)
  else:
    counts = tl.histogram(idx, BINS)
  tl.store(out_ptr + row * BINS + tl.arange(0, BINS), counts)


@triton.jit
def _histogram_with_first(idx_ptr, n, first_in_ptr, hist_ptr, first_ptr,
                          BLOCK: tl.constexpr):
  # first_in_ptr is aliased to first_ptr.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  bins = tl.load(idx_ptr + offsets, mask=mask, other=0)
  tl.atomic_add(hist_ptr + bins, 1, mask=mask)
  # The first program to reach each bin claims it, lane by lane.
  tl.atomic_cas(first_ptr + bins, tl.full((BLOCK,), -1, tl.int32),
                tl.where(mask, offsets, -1), sem="relaxed")
  tl.atomic_xchg(first_ptr + 16, tl.program_id(0))


class AddPtrTest(testing.TestCase):
  """The vectorised builder's pointer arithmetic, against upstream's."""

  @parameterized.parameters(
      (tl.float32, (3, 8), (1, 8)),   # Shared pointer, per-program offsets.
      (tl.float64, (3, 8), (3, 8)),
      (tl.int1, (2, 4), (2, 4)),      # Bytes, as upstream counts int1.
      (tl.float16, (1, 1), (3, 8)),   # One offset for a block of pointers.
  )
  def test_same_addresses_as_upstream(self, element, offset_shape, ptr_shape):
    from jt_dist._cpu import vector_builder  # pylint: disable=g-import-not-at-top
    from triton.runtime import interpreter  # pylint: disable=g-import-not-at-top
    pointer = tl.pointer_type(element)
    ptrs = interpreter.TensorHandle(
        np.uint64(1 << 40) + self.np_rng.integers(
            0, 1 << 20, size=ptr_shape, dtype=np.uint64), pointer)
    # Negative offsets wrap, as upstream's uint64 arithmetic does.
    offsets = interpreter.TensorHandle(self.np_rng.integers(
        -1000, 1000, size=offset_shape, dtype=np.int32), tl.int32)
    before = offsets.data.copy()
    got = vector_builder.VectorBuilder((3, 1, 1)).create_addptr(ptrs, offsets)
    want = interpreter.InterpreterBuilder().create_addptr(ptrs, offsets)
    self.assertEqual(got.data.dtype, np.uint64)
    np.testing.assert_array_equal(got.data, want.data)
    self.assertEqual(got.dtype, want.dtype)
    np.testing.assert_array_equal(offsets.data, before)  # Not modified.


# Every method of Triton's interpreter builder is redefined for the program
# axis, listed as reviewed (it broadcasts over that axis), or refused before
# it computes anything (tests/vectorized_reviewed_test.py runs kernels that
# call one).
def _upstream_methods() -> list[str]:
  return [name for name, value in inspect.getmembers(
      interpreter.InterpreterBuilder)
          if not name.startswith("_") and callable(value)]


class ReviewedListTest(testing.TestCase):

  def test_every_builder_method_is_redefined_reviewed_or_refused(self):
    grid = (3, 1, 1)
    builder = vector_builder.VectorBuilder(grid, range(3))
    upstream = interpreter.InterpreterBuilder
    for name in _upstream_methods():
      ours = inspect.getattr_static(vector_builder.VectorBuilder, name)
      if name in vars(vector_builder.VectorBuilder) and (
          name not in vector_builder.UNREVIEWED):
        self.assertNotIn(name, vector_reviewed.REVIEWED,
                         f"{name} is redefined: the list need not name it")
      elif name in vector_reviewed.REVIEWED:
        self.assertIs(ours, inspect.getattr_static(upstream, name), name)
      else:
        self.assertIn(name, vector_builder.UNREVIEWED)
        with self.assertRaisesRegex(
            vector_builder.Unsupported,
            f"^{name} is not reviewed for a leading program axis"
            r" \(vector_reviewed\.REVIEWED\)$"):
          getattr(builder, name)()

  def test_a_method_a_later_triton_adds_is_refused_before_it_runs(self):
    calls = []

    class NewerBuilder(interpreter.InterpreterBuilder):
      """A builder with an operation along the first axis, as upstream's."""

      def create_first_axis_sum(self, arg):
        calls.append(arg)
        return interpreter.TensorHandle(np.sum(arg.data, axis=0),
                                        arg.dtype.scalar)

    class NewerVectorBuilder(vector_builder.VectorBuilder, NewerBuilder):
      pass

    refused = vector_reviewed.refuse_unreviewed(NewerVectorBuilder,
                                                NewerBuilder)
    self.assertEqual(refused, ["create_first_axis_sum"])
    builder = NewerVectorBuilder((4, 1, 1), range(4))
    block = interpreter.TensorHandle(self.random((4, 8)), tl.float32)
    with self.assertRaisesRegex(vector_builder.Unsupported,
                                "^create_first_axis_sum is not reviewed"):
      builder.create_first_axis_sum(block)
    self.assertEqual(calls, [])
    # The builder's own forms stay (a program id per program).
    np.testing.assert_array_equal(builder.create_get_program_id(0).data,
                                  np.arange(4))


class _RecordingNative:
  """Stands for the interpreter's native memory module: records fallbacks."""

  def __init__(self):
    self.calls = []
    self.addresses = []

  def load(self, ptrs, mask, other, dtype):
    del mask, other
    self.calls.append("load")
    self.addresses.append(np.asarray(ptrs, np.uint64))
    return np.zeros(np.shape(ptrs), dtype)

  def store(self, ptrs, values, mask):
    del values, mask
    self.calls.append("store")
    self.addresses.append(np.asarray(ptrs, np.uint64))


class HostMemoryTest(testing.TestCase):
  """Loads and stores on known buffers are NumPy gathers and scatters."""

  def setUp(self):
    super().setUp()
    self.buffer = self.random((64,))
    self.native = _RecordingNative()
    self.memory = host_memory.HostMemory(self.native, [self.buffer])
    self.base = np.uint64(self.buffer.ctypes.data)

  def test_aligned_access_is_a_gather_and_a_scatter(self):
    index = self.np_rng.permutation(64)[:16]
    ptrs = self.base + index.astype(np.uint64) * np.uint64(4)
    mask = np.ones(16, bool)
    loaded = self.memory.load(ptrs, mask, 0.0, np.float32)
    np.testing.assert_array_equal(loaded, self.buffer[index])
    order = np.sort(index)
    values = self.random((16,))
    self.memory.store(self.base + order.astype(np.uint64) * np.uint64(4),
                      values, mask)
    np.testing.assert_array_equal(self.buffer[order], values)
    self.assertEqual(self.native.calls, [])

  @parameterized.named_parameters(("one_byte_off", 1), ("two_bytes_off", 2))
  def test_misaligned_access_goes_to_the_native_module(self, shift):
    ptrs = self.base + np.arange(16, dtype=np.uint64) * np.uint64(4)
    ptrs[5] += np.uint64(shift)
    mask = np.ones(16, bool)
    self.memory.load(ptrs, mask, 0.0, np.float32)
    self.memory.store(ptrs, self.random((16,)), mask)
    self.assertEqual(self.native.calls, ["load", "store"])

  def test_access_outside_the_buffers_goes_to_the_native_module(self):
    ptrs = self.base + np.arange(60, 70, dtype=np.uint64) * np.uint64(4)
    self.memory.load(ptrs, np.ones(10, bool), 0.0, np.float32)
    self.assertEqual(self.native.calls, ["load"])

  def test_offsets_into_a_buffer_are_a_gather_and_a_scatter(self):
    index = self.np_rng.permutation(64)[:16]
    mask = self.np_rng.random(16) < 0.7
    offsets = np.where(mask, index * 4, 0).astype(np.int64)
    loaded = self.memory.load_at(0, offsets, mask, -1.0, np.float32)
    np.testing.assert_array_equal(loaded,
                                  np.where(mask, self.buffer[index], -1.0))
    # The load took its offsets as scratch: they are element indices now.
    np.testing.assert_array_equal(offsets, np.where(mask, index, 0))
    order = np.sort(index)
    before = self.buffer.copy()
    values = self.random((16,))
    self.memory.store_at(0, order.astype(np.int64) * 4, values, mask)
    np.testing.assert_array_equal(self.buffer[order[mask]], values[mask])
    np.testing.assert_array_equal(self.buffer[order[~mask]],
                                  before[order[~mask]])
    self.assertEqual(self.native.calls, [])

  def test_misaligned_offsets_go_to_the_native_module_as_addresses(self):
    offsets = np.arange(16, dtype=np.int64) * 4
    offsets[3] += 2
    mask = np.ones(16, bool)
    self.memory.load_at(0, offsets, mask, 0.0, np.float32)
    self.memory.store_at(0, offsets, self.random((16,)), mask)
    self.assertEqual(self.native.calls, ["load", "store"])
    for ptrs in self.native.addresses:
      np.testing.assert_array_equal(ptrs, self.base + offsets.astype(np.uint64))


  def test_empty_buffer_with_every_lane_off_goes_to_the_native_module(self):
    memory = host_memory.HostMemory(self.native, [np.zeros((0,), np.float32)])
    mask = np.zeros(4, bool)
    memory.load_at(0, np.zeros(4, np.int64), mask, 0.0, np.float32)
    memory.store_at(0, np.zeros(4, np.int64), np.ones(4, np.float32), mask)
    self.assertEqual(self.native.calls, ["load", "store"])


class CheckedHostMemoryTest(testing.TestCase):
  """Checked accesses that stay in one buffer reach it by their offsets."""

  def setUp(self):
    super().setUp()
    self.a = self.random((64,))
    self.out = np.zeros((32,), np.int32)
    self.checker = bounds.MemoryChecker("k", [
        bounds.Buffer("a_ptr", "input", self.a),
        bounds.Buffer("out_ptr", "output", self.out,
                      written=np.zeros(self.out.nbytes, bool))])
    self.native = _RecordingNative()
    self.memory = bounds.CheckedMemory(
        host_memory.HostMemory(self.native, [self.a, self.out]), self.checker)

  def _ptrs(self, k, elements, itemsize=4):
    return (np.uint64(self.checker.tagged_address(k))
            + np.asarray(elements, np.uint64) * np.uint64(itemsize))

  def test_one_buffer_is_read_and_written_without_the_native_module(self):
    index = self.np_rng.permutation(64)[:16]
    np.testing.assert_array_equal(
        self.memory.load(self._ptrs(0, index), True, 0.0, np.float32),
        self.a[index])
    values = self.np_rng.integers(-9, 9, 8).astype(np.int32)
    self.memory.store(self._ptrs(1, np.arange(8)), values, True)
    np.testing.assert_array_equal(self.out[:8], values)
    np.testing.assert_array_equal(
        self.memory.load(self._ptrs(1, np.arange(8)), True, 0, np.int32),
        values)
    self.assertEqual(self.native.calls, [])

  def test_unwritten_and_out_of_bounds_lanes_still_raise(self):
    with self.assertRaisesRegex(jt_dist.UnwrittenOutputReadError,
                                r"'out_ptr' \(output\) reads 1 element"):
      self.memory.load(self._ptrs(1, [8]), True, 0, np.int32)
    with self.assertRaisesRegex(jt_dist.OutOfBoundsAccessError,
                                r"element offsets \[64\]"):
      self.memory.load(self._ptrs(0, [60, 64]), True, 0.0, np.float32)
    self.assertEqual(self.native.calls, [])

  def test_two_buffers_go_to_the_native_module_as_real_addresses(self):
    self.memory.store(self._ptrs(1, np.arange(32)), np.ones(32, np.int32),
                      True)
    ptrs = np.concatenate([self._ptrs(0, [1, 2]), self._ptrs(1, [3])])
    self.memory.load(ptrs, True, 0, np.int32)
    self.assertEqual(self.native.calls, ["load"])
    np.testing.assert_array_equal(self.native.addresses[0], [
        self.a.ctypes.data + 4, self.a.ctypes.data + 8,
        self.out.ctypes.data + 12])


class DescriptorBoundsTest(testing.TestCase):
  """The checker stands behind the call's own check of a descriptor."""

  def test_descriptor_accesses_are_bounds_checked(self):
    if jax.default_backend() != "cpu":
      self.skipTest("the interpreter's checker is the CPU path; the default"
                    f" backend here is {jax.default_backend()}")
    x = jnp.asarray(self.random((4, 16)))
    desc = jt_dist.TensorDescriptor(x, (8, 16), (16, 1), (8, 16))
    # The call checks a descriptor's extent against its array; with that
    # check out of the way the interpreter's checker still catches it.
    with mock.patch.object(tensordesc.Info, "extent", 0):
      with self.assertRaisesRegex(jt_dist.OutOfBoundsAccessError,
                                  r"in_desc"):
        jt_dist.triton_call(
            desc, kernel=desc_copy_kernel,
            out_shape=jax.ShapeDtypeStruct((8, 16), jnp.float32), grid=1,
            M=8, N=16)


if __name__ == "__main__":
  absltest.main()
