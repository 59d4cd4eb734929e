"""What jt_dist does with a kernel, for the home page: the front doors, and
where each call runs."""

from __future__ import annotations

from . import svg

_WIDTH = 700


def overview() -> str:
  canvas = svg.Canvas(
      "overview", _WIDTH, 236,
      "A Triton kernel and JAX arrays go through triton_call or kernel_call"
      " to one device, a GPU or the CPU, or through sharded_triton_call or a"
      " sharding rule to one launch per shard of a mesh")
  for x, heading in ((14, "You bring"), (244, "jt_dist"),
                     (486, "It runs on")):
    canvas.text(x, 18, heading, "prose heading")
  kernel = canvas.box(14, 52, "@triton.jit kernel", "purple",
                      sub="from Triton, or PyTorch code", w=190,
                      sub_mono=False)
  arrays = canvas.box(14, 140, "jax.Arrays, scalars", "blue",
                      sub="eager, or under jax.jit", w=190,
                      sub_mono=False)
  one = canvas.box(244, 40, "triton_call, kernel_call", "grey",
                   sub="bind, check where inputs live", w=220,
                   sub_mono=False)
  mesh = canvas.box(244, 150, "sharded_triton_call", "grey",
                    sub="or a kernel's ShardingRule", w=220,
                    sub_mono=False)
  gpu = canvas.box(486, 32, "a GPU: CUDA or ROCm", "green",
                   sub="compiled by Triton", w=204, mono=False)
  cpu = canvas.box(486, 90, "the CPU", "green",
                   sub="Triton's interpreter, checked", w=204,
                   mono=False)
  canvas.box(486, 150, "a mesh of devices", "green",
             sub="one launch per shard", w=204, mono=False)
  # Both go to either front door.
  join = (kernel.right + 16, (kernel.cy + arrays.cy) / 2)
  for source in (kernel, arrays):
    canvas.edge(source.right + 1, source.cy, *join, "grey", bend="h",
                arrow=False)
  for door in (one, mesh):
    canvas.edge(*join, door.x - 2, door.cy, "grey", bend="h")
  canvas.edge(one.right + 2, one.cy - 4, gpu.x - 2, gpu.cy, "grey", bend="h")
  canvas.edge(one.right + 2, one.cy + 4, cpu.x - 2, cpu.cy, "grey", bend="h")
  canvas.edge(mesh.right + 2, mesh.cy, 484, mesh.cy, "grey", bend="")
  canvas.text(244, 222, "A call on sharded inputs that names neither is"
              " refused, not gathered.", "prose small muted")
  return canvas.svg()
