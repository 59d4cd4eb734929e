"""``triton.autotune`` and ``triton.heuristics`` through ``triton_call``."""

import copy

from absl.testing import absltest
from absl.testing import parameterized
import jax
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _binding  # pylint: disable=g-import-not-at-top,wrong-import-position


def _add_fn(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  x = tl.load(x_ptr + offsets, mask=mask)
  y = tl.load(y_ptr + offsets, mask=mask)
  tl.store(out_ptr + offsets, x + y, mask=mask)


def _scaled_add_fn(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr,
                   EVEN: tl.constexpr, SCALE: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  if EVEN:
    x = tl.load(x_ptr + offsets)
    y = tl.load(y_ptr + offsets)
    tl.store(out_ptr + offsets, x * SCALE + y)
  else:
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * SCALE + y, mask=mask)


_CONFIGS = [
    triton.Config({"BLOCK": 8}, num_warps=1),
    triton.Config({"BLOCK": 32}, num_warps=2),
]


def _grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def _autotuned():
  return triton.autotune(configs=list(_CONFIGS), key=["n"])(
      triton.jit(_add_fn))


def _state(obj):
  """A comparable snapshot of a decorator object's attributes."""
  return {k: (v if isinstance(v, (int, float, str, bool, type(None), tuple))
              else repr(v)) for k, v in vars(obj).items()}


def _bind(kernel, x, y, grid=_grid, **metaparams):
  _, spec, _ = _binding.bind_call(
      (x, y, x.size), kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), grid,
      _binding.CallOptions(), metaparams)
  return spec


class AutotuneTest(testing.TestCase):

  @parameterized.parameters(False, True)
  def test_autotuned_add(self, jit):
    kernel = _autotuned()
    x, y = self.random((70,)), self.random((70,))

    def f(x, y):
      return jt_dist.triton_call(x, y, x.size, kernel=kernel, out_shape=x,
                                 grid=_grid)

    out = (jax.jit(f) if jit else f)(x, y)
    self.assertAllClose(out, x + y)

  def test_grid_is_evaluated_per_config(self):
    spec = _bind(_autotuned(), self.random((70,)), self.random((70,)))
    grids = [launch.grid for launch in spec.launches]
    self.assertEqual(grids, [(9, 1, 1), (3, 1, 1)])
    self.assertEqual([launch.config.num_warps for launch in spec.launches],
                     [1, 2])

  def test_autotuner_is_not_mutated(self):
    kernel = _autotuned()
    before = _state(kernel)
    configs_before = copy.deepcopy([c.__dict__ for c in kernel.configs])
    x, y = self.random((70,)), self.random((70,))
    out = jax.jit(lambda x, y: jt_dist.triton_call(
        x, y, x.size, kernel=kernel, out_shape=x, grid=_grid))(x, y)
    self.assertAllClose(out, x + y)
    self.assertEqual(_state(kernel), before)
    self.assertEqual([c.__dict__ for c in kernel.configs], configs_before)

  def test_explicit_metaparam_selects_matching_configs(self):
    spec = _bind(_autotuned(), self.random((70,)), self.random((70,)),
                 BLOCK=32)
    self.assertEqual([dict(l.config.kwargs)["BLOCK"] for l in spec.launches],
                     [32])

  def test_explicit_metaparam_matching_no_config_raises(self):
    with self.assertRaisesRegex(ValueError, r"_add_fn.*BLOCK.*64"):
      _bind(_autotuned(), self.random((70,)), self.random((70,)), BLOCK=64)

  def test_early_config_prune(self):
    seen = []

    def prune(configs, named_args, **kwargs):
      del kwargs
      seen.append(named_args["n"])
      return [c for c in configs if c.kwargs["BLOCK"] == 32]

    kernel = triton.autotune(configs=list(_CONFIGS), key=["n"],
                             prune_configs_by={"early_config_prune": prune})(
                                 triton.jit(_add_fn))
    x, y = self.random((70,)), self.random((70,))
    spec = _bind(kernel, x, y)
    self.assertEqual(len(spec.launches), 1)
    self.assertEqual(seen, [70])
    out = jt_dist.triton_call(x, y, x.size, kernel=kernel, out_shape=x,
                              grid=_grid)
    self.assertAllClose(out, x + y)


class HeuristicsTest(testing.TestCase):

  @parameterized.parameters(64, 70)
  def test_heuristics(self, n):
    calls = []

    def even(args):
      calls.append(dict(args))
      return args["n"] % args["BLOCK"] == 0

    kernel = triton.heuristics({"EVEN": even, "SCALE": lambda args: 2})(
        triton.jit(_scaled_add_fn))
    x, y = self.random((n,)), self.random((n,))
    out = jax.jit(lambda x, y: jt_dist.triton_call(
        x, y, x.size, kernel=kernel, out_shape=x, grid=_grid, BLOCK=16))(x, y)
    self.assertAllClose(out, 2 * x + y)
    self.assertEqual(calls[-1]["n"], n)
    spec = _bind(kernel, x, y, BLOCK=16)
    self.assertEqual(dict(spec.launches[0].config.kwargs)["EVEN"], n == 64)

  @parameterized.named_parameters(
      ("autotune_outside", "autotune_outside"),
      ("heuristics_outside", "heuristics_outside"))
  def test_autotune_and_heuristics_combined(self, order):
    fn = triton.jit(_scaled_add_fn)
    heuristics = triton.heuristics({
        "EVEN": lambda args: args["n"] % args.get("BLOCK", 1 << 30) == 0,
        "SCALE": lambda args: 3,
    })
    autotune = triton.autotune(configs=list(_CONFIGS), key=["n"])
    if order == "autotune_outside":
      kernel = autotune(heuristics(fn))
    else:
      kernel = heuristics(autotune(fn))
    before = _state(kernel)
    x, y = self.random((64,)), self.random((64,))
    spec = _bind(kernel, x, y)
    kwargs = [dict(l.config.kwargs) for l in spec.launches]
    self.assertEqual([k["BLOCK"] for k in kwargs], [8, 32])
    self.assertEqual([l.grid[0] for l in spec.launches], [8, 2])
    if order == "autotune_outside":
      # The heuristic runs per config and sees that config's BLOCK.
      self.assertEqual([k["EVEN"] for k in kwargs], [True, True])
    for jit in (False, True):
      f = lambda x, y: jt_dist.triton_call(
          x, y, x.size, kernel=kernel, out_shape=x, grid=_grid)
      out = (jax.jit(f) if jit else f)(x, y)
      self.assertAllClose(out, 3 * x + y)
    self.assertEqual(_state(kernel), before)


class HookRefusalTest(testing.TestCase):

  def _call(self, kernel):
    x, y = self.random((16,)), self.random((16,))
    return jt_dist.triton_call(x, y, x.size, kernel=kernel, out_shape=x,
                               grid=_grid)

  def test_autotune_pre_hook_refused(self):
    kernel = triton.autotune(configs=list(_CONFIGS), key=["n"],
                             pre_hook=lambda args, reset_only=False: None)(
                                 triton.jit(_add_fn))
    with self.assertRaisesRegex(NotImplementedError,
                                r"'_add_fn'.*pre_hook.*zeroed_outputs"):
      self._call(kernel)

  def test_autotune_post_hook_refused(self):
    kernel = triton.autotune(configs=list(_CONFIGS), key=["n"],
                             post_hook=lambda args, exception: None)(
                                 triton.jit(_add_fn))
    with self.assertRaisesRegex(NotImplementedError, r"'_add_fn'.*post_hook"):
      self._call(kernel)

  def test_reset_to_zero_refused(self):
    kernel = triton.autotune(configs=list(_CONFIGS), key=["n"],
                             reset_to_zero=["out_ptr"])(triton.jit(_add_fn))
    with self.assertRaisesRegex(
        NotImplementedError, r"'_add_fn'.*reset_to_zero=\['out_ptr'\].*"
        r"zeroed_outputs"):
      self._call(kernel)

  def test_config_pre_hook_refused(self):
    configs = [triton.Config({"BLOCK": 8}, pre_hook=lambda args: None)]
    kernel = triton.autotune(configs=configs, key=["n"])(triton.jit(_add_fn))
    with self.assertRaisesRegex(NotImplementedError,
                                r"'_add_fn'.*pre_hook.*zeroed_outputs"):
      self._call(kernel)


if __name__ == "__main__":
  absltest.main()
