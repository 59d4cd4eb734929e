"""``triton.autotune`` and ``triton.heuristics`` through ``triton_call``."""

import copy
import json
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import triton
import triton.language as tl

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._core import binding as _binding  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._core import options as _options  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _settings  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._autotune import store as _store  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._autotune import choose as _choose  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position
from jax.sharding import PartitionSpec as P  # pylint: disable=g-import-not-at-top,wrong-import-position


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
      _options.CallOptions(), metaparams)
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


def _accumulate_fn(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.atomic_add(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask),
                mask=mask)


def _scale_in_place_fn(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  # With x aliased to out, both pointers address one buffer.
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2,
           mask=mask)


class TritonOptionsTest(testing.TestCase):
  """Triton's own autotune options: honoured, or refused by name."""

  def test_reset_to_zero_zeroes_outputs_before_every_launch(self):
    kernel = triton.autotune(configs=list(_CONFIGS), key=["n"],
                             reset_to_zero=["out_ptr"])(
                                 triton.jit(_accumulate_fn))
    x = self.random((70,))
    out = jax.jit(lambda a: jt_dist.triton_call(
        a, a.size, kernel=kernel, out_shape=a, grid=_grid))(x)
    self.assertAllClose(out, x)
    spec = _binding.bind_call(
        (x, x.size), kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), _grid,
        _options.CallOptions(), {})[1]
    self.assertEqual([l.zeroed_outputs for l in spec.launches], [(0,), (0,)])

  def test_reset_to_zero_of_an_input_refused(self):
    kernel = triton.autotune(configs=list(_CONFIGS), key=["n"],
                             reset_to_zero=["x_ptr"])(triton.jit(_add_fn))
    x = self.random((16,))
    with self.assertRaisesRegex(
        ValueError, r"'_add_fn'.*reset_to_zero=\['x_ptr'\].*'x_ptr' is input"
        r" array 0, which no output aliases.*input_output_aliases"):
      jt_dist.triton_call(x, x, x.size, kernel=kernel, out_shape=x,
                          grid=_grid)

  def test_restore_value_keeps_in_place_results_exact(self):
    # Timing runs on inputs of its own; the caller's buffer is scaled once.
    kernel = triton.autotune(configs=list(_CONFIGS), key=["n"],
                             restore_value=["x_ptr"])(
                                 triton.jit(_scale_in_place_fn))
    x = self.random((70,))
    self.enter_context(mock.patch.object(
        _settings, "_configured", _settings._configured))  # pylint: disable=protected-access
    _settings.configure_autotune(cpu_rule="time")
    out = jax.jit(lambda a: jt_dist.triton_call(
        a, a.size, kernel=kernel, out_shape=a, grid=_grid,
        input_output_aliases={0: 0}))(x)
    self.assertAllClose(out, 2 * x)

  def test_perf_model_keeps_top_k(self):
    seen = []

    def model(**kwargs):
      seen.append((kwargs["x_ptr"].shape, kwargs["n"], kwargs["num_warps"]))
      return -kwargs["BLOCK"]  # Larger blocks "faster".

    kernel = triton.autotune(
        configs=list(_CONFIGS) + [triton.Config({"BLOCK": 16})], key=["n"],
        prune_configs_by={"perf_model": model, "top_k": 2})(
            triton.jit(_add_fn))
    x, y = self.random((70,)), self.random((70,))
    spec = _bind(kernel, x, y)
    self.assertEqual([dict(l.config.kwargs)["BLOCK"] for l in spec.launches],
                     [32, 16])
    self.assertIn(((70,), 70, 2), seen)

  def test_bad_top_k_refused(self):
    kernel = triton.autotune(
        configs=list(_CONFIGS), key=["n"],
        prune_configs_by={"perf_model": lambda **kw: 0, "top_k": "two"})(
            triton.jit(_add_fn))
    x = self.random((16,))
    with self.assertRaisesRegex(TypeError, r"'_add_fn'.*top_k='two'"):
      _bind(kernel, x, x)


_TAG_CONFIGS = [triton.Config({"BLOCK": 16, "TAG": 1}, num_warps=1),
                triton.Config({"BLOCK": 32, "TAG": 2}, num_warps=2),
                triton.Config({"BLOCK": 64, "TAG": 3}, num_warps=4)]


def _tagged_kernel():
  return triton.autotune(configs=list(_TAG_CONFIGS), key=["n"])(
      testing.tag_kernel)


def _tag_call(kernel, x, tags=1):
  return jt_dist.triton_call(
      x, x.size, kernel=kernel,
      out_shape=(jax.ShapeDtypeStruct(x.shape, x.dtype),
                 jax.ShapeDtypeStruct((tags,), np.int32)),
      grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),))


class AutotuneChoiceTest(testing.TestCase):
  """One config per call, chosen at lowering, persisted, pinned, forgotten."""

  def setUp(self):
    super().setUp()
    tmp = tempfile.mkdtemp(prefix="jt_dist_autotune_test_")
    self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
    self.enter_context(mock.patch.object(
        _settings, "_configured", _settings._configured))  # pylint: disable=protected-access
    _settings.configure_cache(disk_cache=True, cache_dir=tmp)
    self.cache_dir = tmp
    rule = "time" if testing.platform() == "cpu" else None
    _settings.configure_autotune(cpu_rule=rule or "first")
    self.addCleanup(jt_dist.forget_autotune_choices)
    self.x = self.random((200,))

  def _run(self, kernel, jit=True):
    f = lambda a: _tag_call(kernel, a)
    out, tag = (jax.jit(f) if jit else f)(self.x)
    self.assertAllClose(out, 2 * self.x)
    return int(np.asarray(tag)[0])

  @parameterized.parameters(False, True)
  def test_chosen_config_runs_and_is_visible(self, jit):
    kernel = _tagged_kernel()
    tag = self._run(kernel, jit)
    (choice,) = jt_dist.autotune_choices(kernel)
    self.assertEqual(choice.source, "timed")
    self.assertEqual(tag, choice.index + 1)
    self.assertIn(f"TAG: {tag}", choice.config)
    self.assertEqual(len(choice.timings_s), 3)
    self.assertTrue(all(t > 0 for t in choice.timings_s.values()))

  def test_cpu_rule_first_takes_the_first_config_untimed(self):
    if testing.platform() != "cpu":
      self.skipTest("the CPU rule applies on the CPU only")
    _settings.configure_autotune(cpu_rule="first")
    kernel = _tagged_kernel()
    with mock.patch.object(_choose, "time_configs",
                           side_effect=AssertionError("timed")):
      self.assertEqual(self._run(kernel), 1)
    (choice,) = jt_dist.autotune_choices(kernel)
    self.assertEqual(choice.source, "first config")

  def test_a_new_process_loads_the_choice_and_does_not_time(self):
    kernel = _tagged_kernel()
    tag = self._run(kernel)
    files = os.listdir(os.path.join(self.cache_dir, "autotune"))
    self.assertLen(files, 1)
    # What a new process sees: nothing in memory, the file on disk.
    _store._memory.clear()
    jax.clear_caches()
    with mock.patch.object(_choose, "time_configs",
                           side_effect=AssertionError("timed again")):
      self.assertEqual(self._run(kernel), tag)
    (choice,) = jt_dist.autotune_choices(kernel)
    self.assertEqual(choice.source, "disk")

  def test_every_shard_runs_the_same_config(self):
    devices = self.devices(2)
    mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
    kernel = _tagged_kernel()
    x = self.random((64 * len(devices),))
    out, tags = jax.jit(lambda a: jt_dist.sharded_triton_call(
        a, jt_dist.shard_size(0), kernel=kernel,
        out_shape=(jax.ShapeDtypeStruct(a.shape, a.dtype),
                   jax.ShapeDtypeStruct((len(devices),), np.int32)),
        grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
        mesh=mesh, in_specs=P("x"), out_specs=P("x")))(x)
    self.assertAllClose(out, 2 * x)
    (choice,) = jt_dist.autotune_choices(kernel)
    self.assertEqual(set(np.asarray(tags).tolist()), {choice.index + 1})

  @parameterized.parameters("function", "config", "env")
  def test_pinned_config_runs_untimed(self, how):
    kernel = _tagged_kernel()
    if how == "function":
      jt_dist.pin_autotune_config(kernel, TAG=2)
    elif how == "config":
      jt_dist.pin_autotune_config("tag_kernel", _TAG_CONFIGS[1])
    else:
      self.enter_context(mock.patch.dict(os.environ, {
          "JT_DIST_AUTOTUNE_PIN": json.dumps({"tag_kernel": {"BLOCK": 32}})}))
    self.addCleanup(jt_dist.pin_autotune_config, kernel, None)
    with mock.patch.object(_choose, "time_configs",
                           side_effect=AssertionError("timed")):
      self.assertEqual(self._run(kernel), 2)
    (choice,) = jt_dist.autotune_choices(kernel)
    self.assertEqual(choice.source, "pinned")

  def test_pin_matching_nothing_names_the_candidates(self):
    kernel = _tagged_kernel()
    jt_dist.pin_autotune_config(kernel, BLOCK=128)
    self.addCleanup(jt_dist.pin_autotune_config, kernel, None)
    with self.assertRaisesRegex(
        ValueError, r"'tag_kernel', \{'BLOCK': 128\}.*3 candidates.*"
        r"\[0\] BLOCK: 16, TAG: 1"):
      self._run(kernel)

  def test_bad_pin_environment_is_explained(self):
    self.enter_context(mock.patch.dict(
        os.environ, {"JT_DIST_AUTOTUNE_PIN": "tag_kernel=2"}))
    with self.assertRaisesRegex(ValueError,
                                r"JT_DIST_AUTOTUNE_PIN='tag_kernel=2'.*JSON"):
      self._run(_tagged_kernel())

  def test_pin_of_wrong_type_refused(self):
    with self.assertRaisesRegex(TypeError, r"config=3 of type int"):
      jt_dist.pin_autotune_config("tag_kernel", 3)

  def test_forget_drops_memory_and_disk(self):
    kernel = _tagged_kernel()
    self._run(kernel)
    self.assertEqual(jt_dist.forget_autotune_choices(kernel), 2)
    self.assertEqual(jt_dist.autotune_choices(kernel), [])
    self.assertEqual(os.listdir(os.path.join(self.cache_dir, "autotune")), [])
    self._run(kernel)
    self.assertEqual(jt_dist.autotune_choices(kernel)[0].source, "timed")

  @parameterized.named_parameters(("by_kernel", True), ("all", False))
  def test_forget_leaves_files_it_did_not_write(self, by_kernel):
    kernel = _tagged_kernel()
    self._run(kernel)
    folder = os.path.join(self.cache_dir, "autotune")
    (own,) = os.listdir(folder)
    with open(os.path.join(folder, own)) as f:
      lookalike = json.load(f)
    del lookalike["source"]  # A field short of jt_dist's own format.
    others = {
        "unparsable.json": b'{"format": 1, "kernel": "tag_kernel", ',
        "foreign.json": json.dumps({"kernel": "tag_kernel",
                                    "seed": self.seed}).encode(),
        os.urandom(32).hex() + ".json": json.dumps(lookalike).encode(),
        "array.json": b"[1, 2]",
        "notes.txt": b"not JSON at all"}
    for name, data in others.items():
      with open(os.path.join(folder, name), "wb") as f:
        f.write(data)
    with self.assertLogs("jt_dist", level="WARNING") as logs:
      forgotten = jt_dist.forget_autotune_choices(
          kernel if by_kernel else None)
    self.assertEqual(forgotten, 2)  # In memory and on disk.
    self.assertEqual(sorted(os.listdir(folder)), sorted(others))
    for name, data in others.items():
      with open(os.path.join(folder, name), "rb") as f:
        self.assertEqual(f.read(), data, name)
    self.assertLen(logs.records, 1, logs.output)
    message = logs.output[0]
    self.assertRegex(message, rf"left 4 files in {folder} alone")
    for name in others:
      if name.endswith(".json"):
        self.assertIn(name, message)
    self.assertNotIn("notes.txt", message)
    self.assertRegex(message, r"unparsable.json \(not valid JSON")
    # Nothing left to forget; the others are still reported, still kept.
    with self.assertLogs("jt_dist", level="WARNING"):
      self.assertEqual(jt_dist.forget_autotune_choices(), 0)
    self.assertEqual(sorted(os.listdir(folder)), sorted(others))

  def test_damaged_choice_file_is_ignored(self):
    kernel = _tagged_kernel()
    self._run(kernel)
    folder = os.path.join(self.cache_dir, "autotune")
    (name,) = os.listdir(folder)
    with open(os.path.join(folder, name), "w") as f:
      f.write('{"format": 1, "index": 7')
    _store._memory.clear()
    jax.clear_caches()
    with self.assertLogs("jt_dist", level="WARNING") as logs:
      self._run(kernel)
    self.assertRegex("\n".join(logs.output),
                     rf"ignoring the autotuning choice .*{name}.*unreadable")
    self.assertEqual(jt_dist.autotune_choices(kernel)[0].source, "timed")

  def test_triton_key_arguments_are_part_of_the_key(self):
    kernel = triton.autotune(configs=list(_CONFIGS), key=["n"])(
        triton.jit(_add_fn))
    for n in (64, 63):
      x = self.random((64,))
      jax.jit(lambda a, n=n: jt_dist.triton_call(
          a, a, n, kernel=kernel, out_shape=a, grid=_grid))(x)
    keys = {c.key for c in jt_dist.autotune_choices(kernel)}
    self.assertLen(keys, 2)

  def test_bad_settings_refused(self):
    with self.assertRaisesRegex(ValueError, r"mode='fast' is not one of"):
      jt_dist.configure_autotune(mode="fast")
    with self.assertRaisesRegex(ValueError, r"timeout_s=0 must be positive"):
      jt_dist.configure_autotune(timeout_s=0)
    self.enter_context(mock.patch.dict(os.environ,
                                       {"JT_DIST_AUTOTUNE_CPU": "fastest"}))
    self.enter_context(mock.patch.object(
        _settings, "_configured", _settings.Configured()))
    with self.assertRaisesRegex(ValueError, r"JT_DIST_AUTOTUNE_CPU='fastest'"):
      _settings.autotune_cpu_rule()

  def test_config_that_fails_is_dropped_with_a_warning(self):
    if testing.platform() != "cpu":
      self.skipTest("the interpreter refuses the non-power-of-2 block")
    configs = [triton.Config({"BLOCK": 48, "TAG": 1}),
               triton.Config({"BLOCK": 32, "TAG": 2})]
    kernel = triton.autotune(configs=configs, key=["n"])(testing.tag_kernel)
    with self.assertLogs("jt_dist", level="WARNING") as logs:
      self.assertEqual(self._run(kernel), 2)
    self.assertRegex("\n".join(logs.output),
                     r"autotuning drops config BLOCK: 48, TAG: 1.*'tag_kernel'")
    (choice,) = jt_dist.autotune_choices(kernel)
    self.assertIsNone(choice.timings_s[choice.candidates[0]])

  def test_unwritable_cache_logs_and_still_runs(self):
    blocker = os.path.join(self.cache_dir, "not_a_dir")
    with open(blocker, "w") as f:
      f.write("x")
    _settings.configure_cache(cache_dir=blocker)
    with self.assertLogs("jt_dist", level="WARNING") as logs:
      tag = self._run(_tagged_kernel())
    self.assertIn(tag, (1, 2, 3))
    self.assertRegex("\n".join(logs.output),
                     r"cannot save the autotuning choice in .*not_a_dir")

  def test_jaxlib_mode_warns_in_multi_process_runs(self):
    from jt_dist._autotune import choose  # pylint: disable=g-import-not-at-top
    self.enter_context(mock.patch.object(jax, "process_count",
                                         return_value=2))
    self.enter_context(mock.patch.object(choose, "_warned_jaxlib_mode",
                                         False))
    spec = _bind(_autotuned(), self.x, self.x)
    with self.assertLogs("jt_dist", level="WARNING") as logs:
      choose._leave_to_jaxlib(spec, "cuda", True)  # pylint: disable=protected-access
    self.assertRegex("\n".join(logs.output),
                     r"JT_DIST_AUTOTUNE=jaxlib in a run of 2 processes.*"
                     r"different config")

  def test_multi_process_without_coordination_service_is_explained(self):
    from jt_dist import _compat  # pylint: disable=g-import-not-at-top
    self.enter_context(mock.patch.object(jax, "process_count",
                                         return_value=2))
    self.enter_context(mock.patch.object(_compat, "distributed_client",
                                         return_value=None))
    with self.assertRaisesRegex(
        jt_dist.AutotuneError, r"'tag_kernel' \(in process 0 of 2\).*without"
        r" jax.distributed's coordination service.*JT_DIST_AUTOTUNE_PIN"):
      self._run(_tagged_kernel())

  def test_no_config_runs_raises_autotune_error(self):
    kernel = _tagged_kernel()
    failure = ValueError("out of shared memory")
    with mock.patch.object(_choose, "_compile",
                           return_value=(None, failure)):
      with self.assertRaisesRegex(
          jt_dist.AutotuneError, r"no autotuning config of kernel"
          r" 'tag_kernel' compiled and ran on .*The first config \(BLOCK: 16,"
          r" TAG: 1.*ValueError: out of shared memory"):
        self._run(kernel)


if __name__ == "__main__":
  absltest.main()
