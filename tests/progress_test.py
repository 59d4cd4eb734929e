"""Progress lines for long work: silent when short, on the logger and a tty."""

import io
import logging
import os
import re
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jt_dist import testing

testing.configure_cpu_devices()

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top,wrong-import-position

import jt_dist  # pylint: disable=g-import-not-at-top,wrong-import-position
from jt_dist import _progress  # pylint: disable=g-import-not-at-top,wrong-import-position
from feature_kernels import add_kernel  # pylint: disable=g-import-not-at-top,wrong-import-position


class _Tty(io.StringIO):

  def isatty(self):
    return True


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


class _SlowClock(_Clock):
  """Each reading is 6 s after the last: every launch looks long."""

  def __call__(self):
    self.now += 6.0
    return self.now


class ProgressTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.clock = _Clock()
    self.enter_context(mock.patch.object(_progress.time, "monotonic",
                                         self.clock))
    self.enter_context(mock.patch.dict(os.environ))
    os.environ.pop("JT_DIST_PROGRESS", None)

  def _run(self, steps, *, seconds_per_step, **kwargs):
    with _progress.Progress("autotuning k", steps, unit="configs",
                            **kwargs) as progress:
      for done in range(1, steps + 1):
        self.clock.now += seconds_per_step
        progress.update(done)

  def test_short_work_is_silent(self):
    with self.assertNoLogs("jt_dist", level="INFO"):
      self._run(4, seconds_per_step=1.0)

  def test_long_work_logs_at_info_and_says_when_it_ends(self):
    with self.assertLogs("jt_dist", level="INFO") as logs:
      self._run(12, seconds_per_step=1.0)
    lines = [r.getMessage() for r in logs.records]
    self.assertEqual(lines[0], "jt_dist: autotuning k: 5/12 configs (41%),"
                     " 5.0 s")
    self.assertEqual(lines[1], "jt_dist: autotuning k: 10/12 configs (83%),"
                     " 10.0 s")
    self.assertEqual(lines[-1], "jt_dist: autotuning k: done after 12.0 s")

  @parameterized.parameters("0", "off")
  def test_the_setting_silences_it(self, value):
    os.environ["JT_DIST_PROGRESS"] = value
    tty = _Tty()
    with mock.patch.object(_progress.sys, "stderr", tty), \
        self.assertNoLogs("jt_dist", level="INFO"):
      self._run(12, seconds_per_step=1.0)
    self.assertEqual(tty.getvalue(), "")

  def test_a_terminal_gets_one_line_kept_up_to_date(self):
    tty = _Tty()
    logger = logging.getLogger("jt_dist")
    # No handler prints the lines: the terminal is drawn on.
    with mock.patch.object(_progress.sys, "stderr", tty), \
        mock.patch.object(logger, "hasHandlers", return_value=False):
      self._run(12, seconds_per_step=1.0)
    drawn = tty.getvalue()
    self.assertIn("\rjt_dist: autotuning k: 12/12 configs (100%), 12.0 s",
                  drawn)
    self.assertTrue(drawn.endswith("done after 12.0 s\033[K\n"), drawn)

  def test_a_pipe_is_not_drawn_on(self):
    pipe = io.StringIO()
    with mock.patch.object(_progress.sys, "stderr", pipe):
      self._run(12, seconds_per_step=1.0)
    self.assertEqual(pipe.getvalue(), "")

  def test_an_unknown_total_counts_steps(self):
    with self.assertLogs("jt_dist", level="INFO") as logs:
      with _progress.Progress("running k on the CPU", None,
                              unit="programs") as progress:
        self.clock.now += 6
        progress.update(3000)
    self.assertEqual(logs.records[0].getMessage(),
                     "jt_dist: running k on the CPU: 3000 programs, 6.0 s")

  def test_a_heartbeat_reports_work_that_gives_no_updates(self):
    with self.assertLogs("jt_dist", level="INFO") as logs:
      with _progress.Progress("running k on the CPU", 4, unit="programs",
                              heartbeat=True) as progress:
        progress.update(1)
        self.clock.now += 6
        deadline = time.time() + 30
        while not logs.records and time.time() < deadline:
          time.sleep(0.01)
    lines = [r.getMessage() for r in logs.records]
    self.assertEqual(lines[0], "jt_dist: running k on the CPU: 1/4 programs"
                     " (25%), 6.0 s")
    self.assertEqual(lines[-1], "jt_dist: running k on the CPU: done after"
                     " 6.0 s")


class CpuLaunchProgressTest(parameterized.TestCase):
  """A long CPU launch reports the programs it has run."""

  _LINE = re.compile(r"jt_dist: running add_kernel on the CPU: (\d+)/12"
                     r" programs \(\d+%\), \d+\.\d s")

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("kernels run through the interpreter only on the CPU")
    self.enter_context(mock.patch.dict(os.environ))
    os.environ.pop("JT_DIST_PROGRESS", None)
    rng = np.random.default_rng(0)
    self.x, self.y = (jnp.asarray(rng.standard_normal(48, np.float32))
                      for _ in range(2))

  def _add(self):
    out = jt_dist.triton_call(
        self.x, self.y, 48, kernel=add_kernel,
        out_shape=jax.ShapeDtypeStruct((48,), jnp.float32), grid=(12,),
        BLOCK=4)
    np.testing.assert_array_equal(np.asarray(out),
                                  np.asarray(self.x) + np.asarray(self.y))

  @parameterized.parameters("on", "off", "check")
  def test_a_long_launch_logs_its_programs_at_info(self, vectorize):
    os.environ["JT_DIST_VECTORIZE"] = vectorize
    self.enter_context(mock.patch.object(_progress.time, "monotonic",
                                         _SlowClock()))
    with self.assertLogs("jt_dist", level="INFO") as logs:
      self._add()
    lines = [r.getMessage() for r in logs.records
             if "running add_kernel" in r.getMessage()]
    counts = [int(m[1]) for m in map(self._LINE.fullmatch, lines) if m]
    self.assertNotEmpty(counts, lines)
    self.assertTrue(all(0 <= c <= 12 for c in counts), lines)
    self.assertRegex(lines[-1], r"running add_kernel on the CPU: done after"
                     r" \d+\.\d s$")

  def test_a_long_launch_draws_on_a_terminal(self):
    self.enter_context(mock.patch.object(_progress.time, "monotonic",
                                         _SlowClock()))
    tty = _Tty()
    with mock.patch.object(_progress.sys, "stderr", tty), \
        mock.patch.object(logging.getLogger("jt_dist"), "hasHandlers",
                          return_value=False):
      self._add()
    self.assertRegex(tty.getvalue(), r"\rjt_dist: running add_kernel on the"
                     r" CPU: \d+/12 programs")
    self.assertRegex(tty.getvalue(), r"done after \d+\.\d s\033\[K\n$")

  def test_a_short_launch_is_silent(self):
    with self.assertNoLogs("jt_dist", level="INFO"):
      self._add()

  def test_the_setting_silences_a_long_launch(self):
    os.environ["JT_DIST_PROGRESS"] = "0"
    self.enter_context(mock.patch.object(_progress.time, "monotonic",
                                         _SlowClock()))
    with self.assertNoLogs("jt_dist", level="INFO"):
      self._add()


if __name__ == "__main__":
  absltest.main()
