"""jt_dist in several processes joined by jax.distributed.

Two processes with four virtual CPU devices each form one global mesh of 8
(on any host: the processes run on the CPU). Each runs
``multiprocess_worker.py``; this test reads what they print. On a GPU host,
``python benchmarks/run.py --suite multiprocess`` runs the same worker with one process
per GPU.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from jt_dist import testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tests"))
import fork_server  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "multiprocess_worker.py")
_TAGS = (1, 2, 3, 4)


def _run(cache_root, seed, *args, rule="time"):
  env = {**os.environ, "JT_DIST_TEST_SEED": str(seed),
         "JT_DIST_TEST_CACHE_ROOT": cache_root,
         "JT_DIST_AUTOTUNE_CPU": rule}
  env.pop("JT_DIST_AUTOTUNE_PIN", None)
  outputs = testing.run_processes([sys.executable, _WORKER, *args],
                                  num_processes=2, cpu_devices_per_process=4,
                                  timeout_s=240, env=env,
                                  popen=fork_server.popen)
  return [{line["case"]: line for line in out.json_lines()}
          for out in outputs]


class MultiProcessTest(testing.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.cache_root = tempfile.mkdtemp(prefix="jt_dist_multiprocess_")
    cls.seed = int.from_bytes(os.urandom(4), "little")
    cls.results = _run(cls.cache_root, cls.seed)

  @classmethod
  def tearDownClass(cls):
    shutil.rmtree(cls.cache_root, ignore_errors=True)
    super().tearDownClass()

  def test_global_mesh_of_two_processes(self):
    for p, cases in enumerate(self.results):
      self.assertEqual(cases["start"]["devices"], 8, cases)
      self.assertEqual(cases["start"]["local"], 4, cases)
      self.assertIn("done", cases, f"process {p} did not finish: {cases}")

  def test_sharded_add_jit_and_eager(self):
    for cases in self.results:
      for label in ("jit", "eager"):
        case = cases[f"sharded_add_{label}"]
        self.assertEqual(case["max_error"], 0.0, f"seed {self.seed}: {case}")
        self.assertEqual((case["addressable"], case["devices"]), (4, 8))

  def test_k_split_matmul_with_cross_process_sum(self):
    for cases in self.results:
      self.assertLess(cases["k_split_matmul"]["rel_error"], 1e-5,
                      f"seed {self.seed}")

  def test_layernorm_training_example(self):
    for cases in self.results:
      case = cases["layernorm_training"]
      for name, error in case["grad_rel_error"].items():
        self.assertLess(error, 1e-4, f"grad {name}, seed {self.seed}")
      self.assertLess(case["losses"][-1], case["losses"][0])
    self.assertEqual(self.results[0]["layernorm_training"]["losses"],
                     self.results[1]["layernorm_training"]["losses"])

  def test_every_shard_of_every_process_runs_process_0s_choice(self):
    # Process 1 pinned TAG=4 for the first call and TAG=2 for the second;
    # process 0 timed the configs, then pinned TAG=3. Process 0 decides.
    first = [c["autotune_chosen_by_process_0"] for c in self.results]
    pinned = [c["autotune_pinned_in_process_0"] for c in self.results]
    self.assertEqual(first[0]["source"], "timed")
    self.assertEqual(pinned[0]["source"], "pinned")
    for p in (0, 1):
      self.assertEqual(first[p]["tags"], [_TAGS[first[0]["choice_index"]]] * 8)
      self.assertEqual(pinned[p]["tags"], [3] * 8)
      self.assertEqual(first[p]["max_error"], 0.0)
    self.assertEqual(first[1]["source"], "process 0")
    self.assertEqual(pinned[1]["source"], "process 0")

  def test_a_second_run_loads_the_choice_and_does_not_time(self):
    again = _run(self.cache_root, self.seed, "autotune")
    before = self.results[0]["autotune_chosen_by_process_0"]
    for p in (0, 1):
      case = again[p]["autotune_chosen_by_process_0"]
      self.assertEqual(case["tags"], before["tags"])
    self.assertEqual(again[0]["autotune_chosen_by_process_0"]["source"],
                     "disk")

  def test_waiting_in_vain_for_process_0_names_the_process(self):
    self.assertRegex(
        self.results[1]["choice_never_sent"]["message"],
        r"kernel 'tag_kernel' \(in process 1 of 2\) waited 0.25 s for process"
        r" 0's autotuning choice.*same autotuned call.*"
        r"JT_DIST_AUTOTUNE_TIMEOUT_S")

  def test_device_of_another_process_is_refused(self):
    p0 = self.results[0]["placement_errors"]
    self.assertRegex(
        p0["messages"]["index"],
        r"device=4 is not a local device index \(in process 0 of 2\).*"
        r"addresses 4 cpu devices.*jax.devices\(\)\[4\] is cpu:\d+ of process 1")
    for p, cases in enumerate(self.results):
      case = cases["placement_errors"]
      self.assertRegex(
          case["messages"]["device"],
          rf"device={case['other']} belongs to process {1 - p} \(in process"
          rf" {p} of 2\).*jax.local_devices\(\)")
      self.assertRegex(
          case["messages"]["committed_local"],
          rf"shape \(64,\) and dtype float32 \(in process {p} of 2\) is"
          r" committed to cpu:\d+.*spec P\('x',\).*mesh of 8 devices in"
          r" processes \[0, 1\].*make_array_from_process_local_data")
      self.assertTrue(case["local_ok"])
      self.assertEqual(case["local_device"], case["expected_device"])


_SLEEPER = "import os, time\nif os.environ['JT_DIST_PROCESS_ID'] == '1': time.sleep(600)\nprint('{\"ok\": 1}')\n"
_DIER = ("import os, sys, time\nprint('process', os.environ['JT_DIST_PROCESS_ID'])\n"
         "if os.environ['JT_DIST_PROCESS_ID'] == '1': sys.exit('boom in 1')\n"
         "time.sleep(600)\n")


# Process 1 raises after the group's first collective while process 0 waits
# in the next one; jax.distributed's shutdown in process 1 then waits for
# process 0, so neither exits by itself.
_RAISER = """
from jt_dist import testing
pid, _ = testing.initialize_process()
import numpy as np
from jax.experimental import multihost_utils
multihost_utils.process_allgather(np.arange(2) + pid)
print("first collective done", flush=True)
def broken_step():
  raise RuntimeError(f"worker {pid} broke after the first collective")
if pid == 1:
  broken_step()
multihost_utils.process_allgather(np.arange(2))
"""


class HarnessTest(parameterized.TestCase):

  def test_raise_after_a_collective_is_reported_with_its_traceback(self):
    start = time.monotonic()
    with self.assertRaises(testing.MultiProcessError) as cm:
      # Forks (the harness's real processes are the other tests'): the
      # handling of a raise is the harness's, whatever started the process.
      testing.run_processes([sys.executable, "-c", _RAISER],
                            cpu_devices_per_process=1, timeout_s=150,
                            grace_s=0.25, popen=fork_server.popen)
    elapsed = time.monotonic() - start
    message = str(cm.exception)
    self.assertNotIn("did not finish", message)
    self.assertIn("failed in process(es) [1] of 2", message)
    headline, _, logs = message.partition("----- process 0 (")
    self.assertRegex(
        headline, r"(?s)process 1 failed first.*\n----- process 1 traceback"
        r" -----\nTraceback \(most recent call last\):.*in broken_step\n.*"
        r"RuntimeError: worker 1 broke after the first collective")
    self.assertIn("first collective done", logs)
    self.assertIn("process 1 (raised, then killed by run_processes)", logs)
    self.assertLess(elapsed, 150)

  @parameterized.parameters(0, -1)
  def test_no_processes_is_refused(self, count):
    with self.assertRaisesRegex(
        ValueError, rf"run_processes: num_processes={count} must be at"
        r" least 1"):
      testing.run_processes([sys.executable, "-c", "pass"],
                            num_processes=count)

  # An array has __index__ but refuses a float or a vector.
  @parameterized.parameters(("2",), (2.0,), (True,), (np.array(2.0),),
                            (np.array([2, 3]),))
  def test_num_processes_of_another_type_is_refused(self, count):
    with self.assertRaisesRegex(
        TypeError, rf"run_processes: num_processes={re.escape(repr(count))}"
        rf" of type {type(count).__name__} must be an int"):
      testing.run_processes([sys.executable, "-c", "pass"],
                            num_processes=count)

  def test_hang_fails_with_every_log(self):
    with self.assertRaises(testing.MultiProcessError) as cm:
      # Process 0 (without jax: tens of milliseconds) finishes well within.
      testing.run_processes([sys.executable, "-c", _SLEEPER], timeout_s=1)
    message = str(cm.exception)
    for part in ("did not finish within 1 s", "process 0 (exit status 0)",
                 '{"ok": 1}', "process 1 (killed by run_processes)"):
      self.assertIn(part, message)

  def test_death_stops_the_others_and_fails_with_every_log(self):
    with self.assertRaises(testing.MultiProcessError) as cm:
      testing.run_processes([sys.executable, "-c", _DIER], timeout_s=60,
                            grace_s=0.5)
    message = str(cm.exception)
    for part in ("failed in process(es) [1] of 2",
                 "process 1 (exit status 1)", "boom in 1", "process 0\n",
                 "process 0 (killed by run_processes)"):
      self.assertIn(part, message)

  def test_popen_starts_each_process_in_its_own_session(self):
    started = []

    def popen(argv, **kwargs):
      started.append((argv, kwargs, subprocess.Popen(argv, **kwargs)))
      return started[-1][2]

    root = os.path.dirname(os.path.dirname(os.path.abspath(testing.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, "elsewhere"])}
    code = "import json, os; print(json.dumps({'session': os.getsid(0)}))"
    outputs = testing.run_processes([sys.executable, "-c", code],
                                    num_processes=2, timeout_s=60, env=env,
                                    popen=popen)
    self.assertLen(started, 2)
    for i, (argv, kwargs, process) in enumerate(started):
      self.assertEqual(argv, [sys.executable, "-c", code])
      self.assertTrue(kwargs["start_new_session"])
      self.assertEqual(kwargs["env"]["JT_DIST_PROCESS_ID"], str(i))
      # The tree's root once, ahead of the rest of the caller's path.
      self.assertEqual(kwargs["env"]["PYTHONPATH"],
                       os.pathsep.join([root, "elsewhere"]))
      self.assertEqual(outputs[i].json_lines(), [{"session": process.pid}])

  def test_outputs_and_json_lines(self):
    outputs = testing.run_processes(
        [sys.executable, "-c",
         "import os; print('x'); print('{\"id\": %s}' % os.environ['JT_DIST_PROCESS_ID'])"],
        num_processes=3, timeout_s=60)
    self.assertEqual([o.json_lines() for o in outputs],
                     [[{"id": 0}], [{"id": 1}], [{"id": 2}]])
    self.assertEqual([o.returncode for o in outputs], [0, 0, 0])


if __name__ == "__main__":
  absltest.main()
