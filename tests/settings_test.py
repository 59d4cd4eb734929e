"""The settings module: the one reader of ``JT_DIST_*``, and its parsers."""

import ast
import glob
import os
import re
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from jt_dist import testing

testing.configure_cpu_devices()

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _settings  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._backend import cache as _cache  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist._call import memo as _memo  # pylint: disable=g-import-not-at-top,wrong-import-position

_PACKAGE = os.path.dirname(os.path.abspath(jt_dist.__file__))
# The module that starts processes and the ones it starts: it alone reads
# the variables of that protocol (see _settings' docstring).
_PROTOCOL_MODULE = os.path.join("_tools", "processes.py")


def _sources() -> dict[str, str]:
  found = {}
  for path in glob.glob(os.path.join(_PACKAGE, "**", "*.py"), recursive=True):
    with open(path, encoding="utf-8") as f:
      found[os.path.relpath(path, _PACKAGE)] = f.read()
  return found


class OwnershipTest(absltest.TestCase):

  def test_settings_imports_nothing_of_jt_dist(self):
    imported = []
    for node in ast.walk(ast.parse(_sources()["_settings.py"])):
      if isinstance(node, ast.Import):
        imported.extend(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        imported.append("." * node.level + (node.module or ""))
    self.assertEqual([n for n in imported if n.startswith(("jt_dist", "."))],
                     [])

  def test_only_settings_reads_the_environment(self):
    readers = sorted(path for path, source in _sources().items()
                     if re.search(r"os\.environ|os\.getenv", source))
    self.assertEqual(readers, ["_settings.py", _PROTOCOL_MODULE])

  def test_every_variable_named_is_described(self):
    documented = ast.get_docstring(ast.parse(_sources()["_settings.py"]))
    for path, source in _sources().items():
      for name in set(re.findall(r"JT_DIST_[A-Z0-9_]+", source)):
        self.assertIn(f"``{name}``", documented, f"{name} ({path})")


def _fresh():
  """No configure_* override: every setting from the environment."""
  return mock.patch.object(_settings, "_configured", _settings.Configured())


class ParsingTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(_fresh())

  def env(self, **values):
    self.enter_context(mock.patch.dict(os.environ, values))

  @parameterized.parameters(
      ("1", True), ("Yes", True), (" on ", True), ("0", False),
      ("OFF", False), ("", True))
  def test_strict_flag(self, value, expected):
    self.env(JT_DIST_DISK_CACHE=value)
    self.assertEqual(_settings.disk_cache(), expected)

  def test_strict_flag_names_variable_value_and_fix(self):
    self.env(JT_DIST_DISK_CACHE="maybe")
    with self.assertRaisesRegex(
        ValueError, r"JT_DIST_DISK_CACHE='maybe' is neither on \(1, true, on,"
        r" yes\) nor off \(0, false, off, no\)\. Set it to 1 or 0, or unset"
        r" it \(it is on by default\)"):
      _settings.disk_cache()

  @parameterized.parameters(("1", True), ("true", True), ("0", False),
                            ("2", False), ("", False))
  def test_lenient_flag_keeps_its_default_for_other_values(self, value,
                                                           expected):
    self.env(JT_DIST_SYNC_LAUNCHES=value)
    self.assertEqual(_settings.sync_launches(), expected)

  @parameterized.parameters(("0", False), ("no", False), ("1", True),
                            ("x", True))
  def test_bounds_check(self, value, expected):
    self.env(JT_DIST_BOUNDS_CHECK=value)
    self.assertEqual(_settings.bounds_check(), expected)

  @parameterized.parameters(("0", "off"), ("false", "off"), ("check", "check"),
                            (" CHECK", "check"), ("1", "on"), ("x", "on"))
  def test_vectorize(self, value, expected):
    self.env(JT_DIST_VECTORIZE=value)
    self.assertEqual(_settings.vectorize(), expected)

  def test_choice(self):
    self.env(JT_DIST_AUTOTUNE=" JAXLIB")
    self.assertEqual(_settings.autotune_mode(), "jaxlib")
    self.env(JT_DIST_AUTOTUNE="fast")
    with self.assertRaisesRegex(
        ValueError, r"JT_DIST_AUTOTUNE='fast' is not one of \['choose',"
        r" 'jaxlib'\]\. Set one of them, or unset it"):
      _settings.autotune_mode()

  def test_number(self):
    self.assertEqual(_settings.autotune_timeout_s(), 600.0)
    self.env(JT_DIST_AUTOTUNE_TIMEOUT_S="2.5")
    self.assertEqual(_settings.autotune_timeout_s(), 2.5)
    for bad in ("soon", "0", "-1", "nan"):
      self.env(JT_DIST_AUTOTUNE_TIMEOUT_S=bad)
      with self.assertRaisesRegex(
          ValueError, rf"JT_DIST_AUTOTUNE_TIMEOUT_S='{bad}' is not a positive"
          r" number\. Set it to one, e\.g\. 600\.0"):
        _settings.autotune_timeout_s()

  def test_whole_number(self):
    self.assertEqual(_settings.cpu_devices(3), 3)
    self.env(JT_DIST_CPU_DEVICES="5")
    self.assertEqual(_settings.cpu_devices(3), 5)
    self.env(JT_DIST_CPU_DEVICES="2.5")
    with self.assertRaisesRegex(
        ValueError, r"JT_DIST_CPU_DEVICES='2\.5' is not a positive whole"):
      _settings.cpu_devices(3)

  def test_paths(self):
    self.env(JT_DIST_CACHE_DIR="", JT_DIST_DUMP_DIR="")
    self.assertEqual(_settings.cache_dir(), os.path.join(
        os.path.expanduser("~"), ".cache", "jt_dist"))
    self.assertIsNone(_settings.dump_dir())
    self.env(JT_DIST_CACHE_DIR="/tmp/a", JT_DIST_DUMP_DIR="/tmp/b")
    self.assertEqual(_settings.cache_dir(), "/tmp/a")
    self.assertEqual(_settings.dump_dir(), "/tmp/b")

  def test_json_pins(self):
    self.assertEqual(_settings.autotune_pins(), {})
    self.env(JT_DIST_AUTOTUNE_PIN='{"k": {"BLOCK": 32}}')
    self.assertEqual(_settings.autotune_pins(), {"k": {"BLOCK": 32}})
    self.env(JT_DIST_AUTOTUNE_PIN='{"k": 32}')
    with self.assertRaisesRegex(
        ValueError, r"JT_DIST_AUTOTUNE_PIN='\{\"k\": 32\}' must map kernel"
        r" names to objects of config fields"):
      _settings.autotune_pins()


class ConfigureTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.object(
        _settings, "_configured", _settings._configured))  # pylint: disable=protected-access

  def test_configured_values_win_over_the_environment(self):
    self.enter_context(mock.patch.dict(os.environ, {
        "JT_DIST_DISK_CACHE": "bogus", "JT_DIST_AUTOTUNE": "bogus"}))
    jt_dist.configure_cache(disk_cache=False, cache_dir="/tmp/c")
    jt_dist.configure_autotune(mode="jaxlib", timeout_s=3)
    self.assertFalse(_settings.disk_cache())
    self.assertEqual(_settings.cache_dir(), "/tmp/c")
    self.assertEqual(_settings.autotune_mode(), "jaxlib")
    self.assertEqual(_settings.autotune_timeout_s(), 3.0)

  def test_a_bad_argument_changes_nothing(self):
    before = _settings._configured  # pylint: disable=protected-access
    with self.assertRaisesRegex(ValueError, "dispatch_entries=0"):
      jt_dist.configure_cache(memory_entries=5, dispatch_entries=0)
    with self.assertRaisesRegex(TypeError, "disk_cache='no'"):
      jt_dist.configure_cache(cache_dir="/tmp/d", disk_cache="no")
    self.assertIs(_settings._configured, before)  # pylint: disable=protected-access

  def test_lowering_a_limit_trims_the_caches_at_once(self):
    for memo in (_memo.triton_calls, _memo.sharded_calls):
      self.addCleanup(memo.clear)
    self.addCleanup(_cache.memory_cache.clear)
    for i in range(4):
      _memo.triton_calls.put(("test", i), i)
      _memo.sharded_calls.put(("test", i), i)
      _cache.memory_cache.put(f"test{i}", i)
    jt_dist.configure_cache(dispatch_entries=2, memory_entries=1)
    self.assertEqual(_settings.dispatch_entries(), 2)
    self.assertLessEqual(len(_memo.triton_calls), 2)
    self.assertLessEqual(len(_memo.sharded_calls), 2)
    self.assertEqual(_memo.triton_calls.get(("test", 3)), 3)
    self.assertLen(_cache.memory_cache, 1)
    self.assertIn("test3", _cache.memory_cache)


if __name__ == "__main__":
  absltest.main()
