"""Triton's autotuner protocol through ``triton_call``: pruning as Triton
calls it, config pre_hooks, subclasses, TRITON_PRINT_AUTOTUNING, progress."""

import contextlib
import functools
import io
import logging
import os
import re
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import triton
import triton.language as tl
from triton.runtime import autotuner as triton_autotuner
from triton.tools import tensor_descriptor as host_descriptor

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _progress  # pylint: disable=g-import-not-at-top,wrong-import-position


def _scaled_fn(x_ptr, n, out_ptr, BLOCK: tl.constexpr, SCALE: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * SCALE,
           mask=mask)


def _accumulate_fn(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.atomic_add(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask),
                mask=mask)


def _desc_rows_fn(in_desc, out_ptr, N: tl.constexpr, BLOCK: tl.constexpr):
  """Each program copies BLOCK rows of an (M, N) array read by descriptor."""
  i = tl.program_id(0)
  block = in_desc.load([i * BLOCK, 0])
  rows = i * BLOCK + tl.arange(0, BLOCK)[:, None]
  tl.store(out_ptr + rows * N + tl.arange(0, N)[None, :], block)


def _desc_out_rows_fn(x_ptr, out_desc, N: tl.constexpr, BLOCK: tl.constexpr):
  """Each program copies BLOCK rows of an (M, N) array, stored by descriptor."""
  i = tl.program_id(0)
  rows = i * BLOCK + tl.arange(0, BLOCK)[:, None]
  out_desc.store([i * BLOCK, 0], tl.load(x_ptr + rows * N
                                         + tl.arange(0, N)[None, :]))


def _grid(meta):
  return (triton.cdiv(meta["n"], meta["BLOCK"]),)


_CONFIGS = (triton.Config({"BLOCK": 8}, num_warps=1),
            triton.Config({"BLOCK": 32}, num_warps=2))


def _set_block_hook(nargs):
  """As Triton's tutorials 06 and 09 do: size the descriptor per config,
  and return at once for a plain pointer."""
  if not isinstance(nargs["in_desc"], host_descriptor.TensorDescriptor):
    return
  nargs["in_desc"].block_shape = [nargs["BLOCK"], nargs["N"]]


class _Timed(testing.TestCase):
  """Tests whose CPU calls time every config, as a GPU would."""

  def setUp(self):
    super().setUp()
    self.enter_context(testing.isolated_settings())
    self.enter_context(testing.isolated_caches())
    jt_dist.configure_autotune(cpu_rule="time")
    jt_dist.forget_autotune_choices()


class PruneTest(_Timed):

  def test_early_config_prune_is_called_as_triton_calls_it(self):
    seen = {}

    def prune(configs, named_args, **kwargs):
      seen.update(named=named_args["x_ptr"].shape, scale=kwargs["SCALE"],
                  n=kwargs["n"])
      return [c for c in configs if c.kwargs["BLOCK"] == 32]

    kernel = triton.autotune(list(_CONFIGS), key=["n"], prune_configs_by={
        "early_config_prune": prune})(triton.jit(_scaled_fn))
    x = self.random((70,))
    out = jt_dist.triton_call(x, x.size, kernel=kernel, out_shape=x,
                              grid=_grid, SCALE=3)
    self.assertAllClose(out, 3 * x)
    self.assertEqual(seen, {"named": (70,), "scale": 3, "n": 70})
    self.assertEqual(jt_dist.autotune_choices(kernel), [])  # One left.

  def test_a_subclass_own_prune_configs_is_honoured(self):

    class Pruning(triton_autotuner.Autotuner):

      def prune_configs(self, kwargs):
        self.seen = (self.nargs["n"], kwargs["SCALE"])
        return [self.configs[1]]

    inner = triton.jit(_scaled_fn)
    kernel = Pruning(inner, inner.arg_names, list(_CONFIGS), ["n"], None,
                     None)
    x = self.random((70,))
    out = jax.jit(lambda a: jt_dist.triton_call(
        a, a.size, kernel=kernel, out_shape=a, grid=_grid, SCALE=2))(x)
    self.assertAllClose(out, 2 * x)
    self.assertEqual(kernel.seen, (70, 2))
    self.assertIsNone(kernel.nargs)


class SubclassTest(_Timed):

  def test_a_cached_autotuner_subclass(self):
    # As flash-linear-attention's: extra state, its own None-safe default
    # pre_hook for reset_to_zero, and run() overridden.

    class Cached(triton_autotuner.Autotuner):

      def __init__(self, fn, arg_names, configs, key, reset_to_zero,
                   restore_value, **kwargs):
        super().__init__(fn, arg_names, configs, key, reset_to_zero,
                         restore_value, **kwargs)
        self.kernel_name = fn.fn.__name__

        def pre_hook(kw, reset_only=False):
          del reset_only
          for name in self.reset_to_zero:
            if kw[name] is not None:
              kw[name].zero_()

        self.pre_hook = pre_hook

      def run(self, *args, **kwargs):
        return super().run(*args, **kwargs)

    inner = triton.jit(_accumulate_fn)
    kernel = Cached(inner, inner.arg_names, list(_CONFIGS), ["n"],
                    ["out_ptr"], None, prune_configs_by=None)
    x = self.random((70,))
    out = jax.jit(lambda a: jt_dist.triton_call(
        a, a.size, kernel=kernel, out_shape=a, grid=_grid))(x)
    self.assertAllClose(out, x)
    (choice,) = jt_dist.autotune_choices(kernel)
    self.assertEqual(choice.source, "timed")

  def test_a_heuristics_subclass(self):

    class Rules(triton_autotuner.Heuristics):
      pass

    inner = triton.jit(_scaled_fn)
    kernel = Rules(inner, inner.arg_names,
                   {"BLOCK": lambda args: triton.next_power_of_2(args["n"])})
    x = self.random((70,))
    out = jt_dist.triton_call(x, x.size, kernel=kernel, out_shape=x,
                              grid=_grid, SCALE=2)
    self.assertAllClose(out, 2 * x)


class PreHookTest(_Timed):

  def _rows(self, kernel, m=64, n=16):
    x = self.random((m, n))
    desc = jt_dist.TensorDescriptor.from_array(x, block_shape=[1, 1])
    out = jax.jit(lambda d: jt_dist.triton_call(
        d, kernel=kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=lambda meta: (m // meta["BLOCK"],), N=n))(desc)
    return x, out

  def test_a_pre_hook_sets_each_configs_descriptor_block_shape(self):
    configs = [triton.Config({"BLOCK": b}, pre_hook=_set_block_hook)
               for b in (8, 16)]
    kernel = triton.autotune(configs, key=["N"])(triton.jit(_desc_rows_fn))
    x, out = self._rows(kernel)
    self.assertAllClose(out, x)
    (choice,) = jt_dist.autotune_choices(kernel)
    self.assertEqual(len(choice.timings_s), 2)
    self.assertNotIn(None, choice.timings_s.values())  # Both configs ran.
    for block in (8, 16):
      jt_dist.pin_autotune_config(kernel, BLOCK=block)
      self.assertAllClose(*reversed(self._rows(kernel)))
    jt_dist.pin_autotune_config(kernel, None)

  def test_a_pre_hook_sets_an_output_descriptors_block_shape(self):
    def hook(nargs):  # Tutorial 06's hook, for its output descriptor.
      nargs["out_desc"].block_shape = [nargs["BLOCK"], nargs["N"]]

    configs = [triton.Config({"BLOCK": b}, pre_hook=hook) for b in (8, 16)]
    kernel = triton.autotune(configs, key=["N"])(triton.jit(_desc_out_rows_fn))
    x = self.random((64, 16))
    out_desc = jt_dist.TensorDescriptor(
        jax.ShapeDtypeStruct(x.shape, x.dtype), x.shape, (16, 1), [1, 1])
    for block in (None, 8, 16):
      jt_dist.pin_autotune_config(kernel, None if block is None
                                  else {"BLOCK": block})
      out = jax.jit(lambda a: jt_dist.triton_call(
          a, kernel=kernel, out_shape=out_desc,
          grid=lambda meta: (64 // meta["BLOCK"],), N=16))(x)
      self.assertAllClose(out, x)
    jt_dist.pin_autotune_config(kernel, None)

  def test_a_single_config_pre_hook_sets_the_block_shape(self):
    configs = [triton.Config({"BLOCK": 16}, pre_hook=_set_block_hook)]
    kernel = triton.autotune(configs, key=["N"])(triton.jit(_desc_rows_fn))
    x, out = self._rows(kernel)
    self.assertAllClose(out, x)

  def test_a_hook_for_descriptors_returns_at_once_for_arrays(self):
    calls = []

    def hook(nargs):
      calls.append(nargs["BLOCK"])
      if not isinstance(nargs["x_ptr"], host_descriptor.TensorDescriptor):
        return
      raise AssertionError("not a descriptor")

    configs = [triton.Config(c.kwargs, pre_hook=hook) for c in _CONFIGS]
    kernel = triton.autotune(configs, key=["n"])(triton.jit(_scaled_fn))
    x = self.random((70,))
    out = jt_dist.triton_call(x, x.size, kernel=kernel, out_shape=x,
                              grid=_grid, SCALE=2)
    self.assertAllClose(out, 2 * x)
    self.assertCountEqual(calls, [8, 32])

  def test_a_pre_hook_zeroing_an_output_makes_it_a_zeroed_output(self):
    def hook(nargs):
      nargs["out_ptr"].zero_()

    configs = [triton.Config(c.kwargs, pre_hook=hook) for c in _CONFIGS]
    kernel = triton.autotune(configs, key=["n"])(triton.jit(_accumulate_fn))
    x = self.random((70,))
    out = jax.jit(lambda a: jt_dist.triton_call(
        a, a.size, kernel=kernel, out_shape=a, grid=_grid))(x)
    self.assertAllClose(out, x)

  @parameterized.named_parameters(
      ("changes_an_input", lambda nargs: nargs["x_ptr"].add_(1),
       r"used x_ptr\.add_"),
      ("zeroes_an_input", lambda nargs: nargs["x_ptr"].zero_(),
       r"zeroed 'x_ptr', an input.*input_output_aliases"),
      ("writes_an_output", lambda nargs: nargs["out_ptr"].fill_(1.0),
       r"filled 'out_ptr' with 1\.0"),
      ("sets_block_shape_of_an_array",
       lambda nargs: setattr(nargs["x_ptr"], "block_shape", [8]),
       r"set x_ptr\.block_shape = \[8\].*TensorDescriptor only"),
  )
  def test_a_pre_hook_doing_what_jax_cannot_is_refused(self, hook, tried):
    configs = [triton.Config(c.kwargs, pre_hook=hook) for c in _CONFIGS]
    kernel = triton.autotune(configs, key=["n"])(triton.jit(_accumulate_fn))
    x = self.random((70,))
    with self.assertRaisesRegex(
        NotImplementedError, r"pre_hook .*<lambda>.* of kernel"
        r" '_accumulate_fn' " + tried):
      jt_dist.triton_call(x, x.size, kernel=kernel, out_shape=x, grid=_grid)

  def test_a_bad_block_shape_is_refused(self):
    def hook(nargs):
      nargs["in_desc"].block_shape = [nargs["BLOCK"], 12]

    configs = [triton.Config({"BLOCK": 8}, pre_hook=hook)]
    kernel = triton.autotune(configs, key=["N"])(triton.jit(_desc_rows_fn))
    with self.assertRaisesRegex(
        NotImplementedError, r"set in_desc\.block_shape = \[8, 12\].*2 powers"
        " of two"):
      self._rows(kernel)


class PrintAutotuningTest(_Timed):
  """``TRITON_PRINT_AUTOTUNING``: what Triton's Autotuner.run prints."""

  def _tune(self, kernel, x):
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
      out = jax.jit(lambda a: jt_dist.triton_call(
          a, a.size, kernel=kernel, out_shape=a, grid=_grid, SCALE=2))(x)
    self.assertAllClose(out, 2 * x)
    return stdout.getvalue()

  @parameterized.parameters("time", "first")
  def test_prints_what_triton_prints(self, rule):
    jt_dist.configure_autotune(cpu_rule=rule)
    kernel = triton.autotune(list(_CONFIGS), key=["n"])(
        triton.jit(_scaled_fn))
    with triton.knobs.autotuning.scope():
      triton.knobs.autotuning.print = True
      printed = self._tune(kernel, self.random((70,)))
    (choice,) = jt_dist.autotune_choices(kernel)
    best = str(_CONFIGS[choice.index])
    # Triton's words (triton/runtime/autotuner.py, Autotuner.run and _bench).
    # The CPU rule applies on the CPU only: a GPU always times the configs.
    timed = rule == "time" or testing.platform() == "gpu"
    benched = "".join(f"Autotuning kernel _scaled_fn with config {c}\n"
                      for c in _CONFIGS) if timed else ""
    self.assertRegex(printed, "^" + re.escape(
        f"{benched}Triton autotuning for function _scaled_fn,\nwith key as"
        " (70, 'float32', 'float32'),\nfinished after ") + r"\d+\.\d\ds,\n"
        + re.escape(f"best config selected: {best};\n") + "$")

  def test_the_environment_variable_and_a_recalled_choice(self):
    kernel = triton.autotune(list(_CONFIGS), key=["n"])(
        triton.jit(_scaled_fn))
    x = self.random((70,))
    with mock.patch.dict(os.environ, {"TRITON_PRINT_AUTOTUNING": "1"}):
      self.assertIn("Triton autotuning for function _scaled_fn",
                    self._tune(kernel, x))
      jax.clear_caches()
      self.assertEqual(self._tune(kernel, x), "")  # Recalled: not tuned.
    jt_dist.forget_autotune_choices()
    with mock.patch.dict(os.environ, {"TRITON_PRINT_AUTOTUNING": "0"}):
      self.assertEqual(self._tune(kernel, x), "")


class ProgressTest(_Timed):

  def _tune(self):
    kernel = triton.autotune(list(_CONFIGS), key=["n"])(
        triton.jit(_scaled_fn))
    x = self.random((70,))
    self.enter_context(mock.patch.object(
        _progress, "Progress", functools.partial(_progress.Progress,
                                                 after_s=0.0, every_s=0.0)))
    jax.jit(lambda a: jt_dist.triton_call(
        a, a.size, kernel=kernel, out_shape=a, grid=_grid, SCALE=2))(x)

  def test_long_autotuning_reports_progress_at_info(self):
    with self.assertLogs("jt_dist", level=logging.INFO) as logs:
      self._tune()
    lines = [r.getMessage() for r in logs.records
             if "autotuning _scaled_fn" in r.getMessage()]
    self.assertIn("jt_dist: autotuning _scaled_fn: 1/2 configs (50%)",
                  "\n".join(lines))
    self.assertRegex(lines[-1], r"autotuning _scaled_fn: done after")

  def test_progress_setting_silences_it(self):
    self.enter_context(mock.patch.dict(os.environ, {"JT_DIST_PROGRESS": "0"}))
    with self.assertLogs("jt_dist", level=logging.INFO) as logs:
      self._tune()
    self.assertFalse([r for r in logs.records
                      if "autotuning _scaled_fn:" in r.getMessage()])


if __name__ == "__main__":
  absltest.main()
