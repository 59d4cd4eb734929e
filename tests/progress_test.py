"""Progress lines for long work: silent when short, on the logger and a tty."""

import io
import logging
import os
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from jt_dist import _progress


class _Tty(io.StringIO):

  def isatty(self):
    return True


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
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


if __name__ == "__main__":
  absltest.main()
