"""One process of a multi-process jt_dist run, started by ``run_processes``.

Every process runs the same program over a global mesh of every process's
devices, as users do with ``jax.distributed``: the sharded add, the K-split
matmul with its cross-process sum, the layer-norm training example, an
autotuned kernel whose configs write their own tag, and the placement errors
only one process sees. Each case prints one JSON line; results are gathered
to every process and compared with NumPy in float64.

    JT_DIST_TEST_SEED=1 python -c "..."  # through jt_dist.testing only
"""

import functools
import json
import os
import sys

from jt_dist import testing

PROCESS_ID, NUM_PROCESSES = testing.initialize_process()

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P
import numpy as np
import triton

import jt_dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from examples import layernorm_training
from examples import sharded_add
from examples import sharded_matmul
# pylint: enable=g-import-not-at-top,wrong-import-position

ON_CPU = jax.devices()[0].platform == "cpu"


def _report(case, **fields):
  print(json.dumps({"case": case, "process": PROCESS_ID, **fields}),
        flush=True)


def _gather(x):
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _rel_error(actual, expected):
  actual = np.asarray(actual, np.float64)
  return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def case_sharded_add(rng, mesh):
  n = 64 * mesh.size
  x = rng.standard_normal(n).astype(np.float32)
  y = rng.standard_normal(n).astype(np.float32)
  jitted = jax.jit(lambda a, b: sharded_add.sharded_add(a, b, mesh, block=32))
  for label, out in (("jit", jitted(x, y)),
                     ("eager", sharded_add.sharded_add(x, y, mesh, block=32))):
    _report(f"sharded_add_{label}",
            max_error=float(np.max(np.abs(_gather(out) - (x + y)))),
            addressable=len(out.addressable_shards),
            devices=len(out.sharding.device_set))


def case_k_split_matmul(rng, mesh_k):
  m, k, n = 32, 16 * mesh_k.size, 32
  a = rng.standard_normal((m, k)).astype(np.float32)
  b = rng.standard_normal((k, n)).astype(np.float32)
  blocks = (16, 16, 16) if ON_CPU else (32, 32, 16)
  out = jax.jit(lambda p, q: sharded_matmul.matmul_k_split(
      p, q, mesh_k, blocks))(a, b)
  # out_specs=P(): every device holds the summed result; gather this
  # process's copy and check it.
  local = np.asarray(out.addressable_shards[0].data)
  _report("k_split_matmul",
          rel_error=_rel_error(local, a.astype(np.float64) @ b))


def case_layernorm_training(rng, mesh_data):
  rows, d = 2 * mesh_data.size, 32
  x = (rng.standard_normal((rows, d)) * 3 + 1).astype(np.float32)
  target = rng.standard_normal((rows, d)).astype(np.float32)
  params = {"w": rng.uniform(0.5, 1.5, d).astype(np.float32),
            "b": rng.standard_normal(d).astype(np.float32)}
  grads = jax.jit(jax.grad(functools.partial(
      layernorm_training.loss_fn, mesh=mesh_data)))(params, x, target)

  def reference_loss(p):
    y = layernorm_training.layer_norm_reference(
        x.astype(np.float64), p["w"], p["b"])
    return jnp.mean(jnp.sum((y - target) ** 2, axis=-1))

  # One executable on this process's first device (eagerly, each of the
  # reference's operations would compile one of its own).
  with jax.default_device(jax.local_devices(backend="cpu")[0]):
    expected = jax.jit(jax.grad(reference_loss))(
        {k: np.asarray(v, np.float32) for k, v in params.items()})
  errors = {name: _rel_error(_gather(grads[name]), np.asarray(expected[name]))
            for name in ("w", "b")}
  _, losses = layernorm_training.train(x, target, params, mesh_data, steps=4)
  _report("layernorm_training", grad_rel_error=errors, losses=losses)


# Four configs that cost the same: without one choice for every process,
# each would pick its own.
TAGGED = triton.autotune(
    configs=[triton.Config({"BLOCK": 64, "TAG": t}, num_warps=4)
             for t in (1, 2, 3, 4)], key=["n"])(testing.tag_kernel)


def case_autotune(rng, mesh, label):
  n = 256 * mesh.size
  x = rng.standard_normal(n).astype(np.float32)
  out, tags = jax.jit(lambda a: jt_dist.sharded_triton_call(
      a, jt_dist.shard_size(0), kernel=TAGGED,
      out_shape=(jax.ShapeDtypeStruct((n,), np.float32),
                 jax.ShapeDtypeStruct((mesh.size,), np.int32)),
      grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
      mesh=mesh, in_specs=P("x"), out_specs=P("x")))(x)
  (choice,) = jt_dist.autotune_choices(TAGGED)
  _report(f"autotune_{label}", tags=_gather(tags).tolist(),
          max_error=float(np.max(np.abs(_gather(out) - 2 * x))),
          choice_index=choice.index, source=choice.source)


def case_eight_calls(rng, mesh):
  """Eight autotuned calls (one shape each), four equal configs apiece.

  Reports, per call, the tag every shard of every process wrote: with one
  choice they agree; with jaxlib's per-process tuning they may not.
  """
  tags_by_call = []
  for i in range(8):
    n = 64 * (i + 1) * mesh.size
    x = rng.standard_normal(n).astype(np.float32)
    _, tags = jax.jit(lambda a: jt_dist.sharded_triton_call(
        a, jt_dist.shard_size(0), kernel=TAGGED,
        out_shape=(jax.ShapeDtypeStruct(a.shape, a.dtype),
                   jax.ShapeDtypeStruct((mesh.size,), np.int32)),
        grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),),
        mesh=mesh, in_specs=P("x"), out_specs=P("x")))(x)
    tags_by_call.append(_gather(tags).tolist())
  _report("eight_calls", tags=tags_by_call,
          disagreeing=sum(len(set(t)) > 1 for t in tags_by_call))


def case_choice_never_sent(rng):
  """Process 1 lowers an autotuned call that process 0 never makes."""
  if PROCESS_ID != 1:
    return
  jt_dist.configure_autotune(timeout_s=0.25)
  x = rng.standard_normal(64).astype(np.float32)
  try:
    jax.jit(lambda a: jt_dist.triton_call(
        a, a.size, kernel=TAGGED,
        out_shape=(jax.ShapeDtypeStruct(a.shape, a.dtype),
                   jax.ShapeDtypeStruct((1,), np.int32)),
        grid=lambda meta: (triton.cdiv(meta["n"], meta["BLOCK"]),)))(x)
    message = None
  except jt_dist.AutotuneError as e:
    message = str(e)
  _report("choice_never_sent", message=message)


def case_placement_errors(global_mesh):
  x = jnp.ones((16,), jnp.float32)
  local = jax.local_devices()
  other = [d for d in jax.devices() if d.process_index != PROCESS_ID][0]
  global_index = jax.devices().index(other)
  messages = {}
  for label, device in (("index", global_index), ("device", other)):
    try:
      sharded_add.add_kernel  # pylint: disable=pointless-statement
      jt_dist.triton_call(x, x, 16, kernel=sharded_add.add_kernel,
                          out_shape=x, grid=(1,), BLOCK=16, device=device)
      messages[label] = None
    except jt_dist.DevicePlacementError as e:
      messages[label] = str(e)
  out = jt_dist.triton_call(x, x, 16, kernel=sharded_add.add_kernel,
                            out_shape=x, grid=(1,), BLOCK=16,
                            device=len(local) - 1)
  try:
    sharded_add.sharded_add(jax.device_put(jnp.ones(8 * len(jax.devices())),
                                           local[0]),
                            jnp.ones(8 * len(jax.devices())), global_mesh, 8)
    messages["committed_local"] = None
  except jt_dist.ShardingSpecError as e:
    messages["committed_local"] = str(e)
  _report("placement_errors", messages=messages, other=str(other),
          global_index=global_index,
          local_ok=bool(np.allclose(out, 2.0)),
          local_device=str(list(out.devices())[0]),
          expected_device=str(local[-1]))


def main():
  seed = int(os.environ["JT_DIST_TEST_SEED"])
  rng = np.random.default_rng(seed)  # The same data in every process.
  cache_root = os.environ.get("JT_DIST_TEST_CACHE_ROOT")
  if cache_root:
    # A cache of its own per process: a choice must travel between the
    # processes, not through a shared disk.
    jt_dist.configure_cache(
        cache_dir=os.path.join(cache_root, f"process{PROCESS_ID}"))
  devices = jax.devices()
  mesh = jax.make_mesh((len(devices),), ("x",), devices=devices)
  mesh_k = jax.make_mesh((len(devices),), ("k",), devices=devices)
  mesh_data = jax.make_mesh((len(devices),), ("data",), devices=devices)
  _report("start", devices=len(devices), local=len(jax.local_devices()),
          platform=devices[0].platform)
  if sys.argv[1:] == ["autotune"]:
    case_autotune(rng, mesh, "chosen_by_process_0")
    _report("done")
    return
  if sys.argv[1:] == ["eight"]:
    case_eight_calls(rng, mesh)
    _report("done")
    return
  case_sharded_add(rng, mesh)
  case_k_split_matmul(rng, mesh_k)
  case_layernorm_training(rng, mesh_data)
  # Process 1 pins another config: process 0's choice must still win.
  if PROCESS_ID == 1:
    jt_dist.pin_autotune_config(TAGGED, TAG=4)
  case_autotune(rng, mesh, "chosen_by_process_0")
  # A pin in every process, as SPMD code has it: process 0's counts.
  jt_dist.pin_autotune_config(TAGGED, TAG=3 if PROCESS_ID == 0 else 2)
  case_autotune(rng, mesh, "pinned_in_process_0")
  case_placement_errors(mesh)
  case_choice_never_sent(rng)
  _report("done")


if __name__ == "__main__":
  main()
