"""Every jt_dist entry point on 4 MiB shards, with collectives after the kernel.

On the CPU a kernel is a host callback. Through ``jax.pure_callback`` (the
route before), jaxlib 0.10 copied each operand of 100 KiB or more
asynchronously on the thread pool that also runs the devices' programs;
with a collective after the kernel, every thread could end up waiting and
XLA aborted the process after its 40 s rendezvous timeout. Each case runs
``large_shards_worker.py`` in a subprocess bounded by a timeout, so that a
hang or an abort fails its test instead of the suite. CPU only: on GPUs the
kernels are compiled and no host callback is involved.
"""

import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax

from jt_dist import testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "tests"))
import fork_server  # pylint: disable=g-import-not-at-top,wrong-import-position

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "large_shards_worker.py")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIMEOUT_S = 300


def _env(seed):
  env = fork_server.tree_env(_ROOT, JT_DIST_TEST_SEED=str(seed),
                             JAX_PLATFORMS="cpu")
  env.pop("JT_DIST_CPU_DEVICES", None)
  return env


def _cases(stdout):
  lines = [json.loads(line) for line in stdout.splitlines()
           if line.startswith("{")]
  return {line["case"]: line for line in lines}


class LargeShardsTest(testing.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() != "cpu":
      self.skipTest("the host-callback route exists only on the CPU")
    self.seed = int.from_bytes(os.urandom(4), "little")

  def assertCasesRight(self, cases, names, where):
    # float32 sums of up to 2**21 terms against float64.
    for name in names:
      self.assertIn(name, cases, where)
      self.assertLess(cases[name]["rel_error"], 1e-5,
                      f"{name}, seed {self.seed}: {cases[name]}")
    self.assertIn("done", cases, where)

  @parameterized.named_parameters(
      ("out_reduce", "out_reduce", ["out_reduce_jit", "out_reduce_eager"]),
      ("rule", "rule", ["rule_reduction", "rule_all_gather", "rule_reshard",
                        "rule_reshard_sum"]),
      ("vmap", "vmap", ["vmap_psum"]),
      ("user_collectives", "user_collectives",
       ["user_psum", "user_all_gather", "user_ppermute"]),
  )
  def test_eight_devices(self, case, names):
    try:
      done = fork_server.run([_WORKER, case], env=_env(self.seed), cwd=_ROOT,
                             timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
      self.fail(f"case {case!r} hung: no result within {_TIMEOUT_S} s."
                f"\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    where = (f"case {case!r}, seed {self.seed}, exit status"
             f" {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n"
             f"{done.stderr[-6000:]}")
    self.assertEqual(done.returncode, 0, where)
    self.assertCasesRight(_cases(done.stdout), names, where)

  def test_two_processes_of_four_devices(self):
    outputs = testing.run_processes(
        [sys.executable, _WORKER, "processes"], num_processes=2,
        cpu_devices_per_process=4, timeout_s=_TIMEOUT_S, env=_env(self.seed),
        cwd=_ROOT, popen=fork_server.popen)
    for out in outputs:
      self.assertCasesRight(
          _cases(out.stdout),
          ["processes_out_reduce", "processes_out_reduce_eager",
           "processes_psum"],
          f"process {out.process_id}, seed {self.seed}")


if __name__ == "__main__":
  absltest.main()
