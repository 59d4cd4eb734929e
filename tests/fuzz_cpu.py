"""A differential fuzzer for the CPU interpreter: vectorised against one
program at a time.

Each case draws a kernel over what the vectorised path handles: loops whose
int32 or int64 bounds differ per program, nested ``if``s and ``else``s, early
returns, atomics in several statements and inside loops (their old values
used or not), reductions and scans, masks, bf16 and fp8 arithmetic, and
``and``/``or``/``not`` on scalars and on blocks. It runs the kernel with ``JT_DIST_VECTORIZE=1`` and ``=0`` and
compares every output bit for bit (or the error types). On a mismatch it
shrinks the kernel, statement by statement, and prints the smallest source
that still mismatches; the exit status is the number of mismatching cases.

  python tests/fuzz_cpu.py --seed 0 --cases 200
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import collections
import itertools
import logging
import os
import sys
import tempfile

import numpy as np

_HEADER = """import triton
import triton.language as tl


@triton.jit
def {name}(x_ptr, n, big, out_ptr, iout_ptr, facc_ptr, cnt_ptr,
           B: tl.constexpr, P: tl.constexpr):
  pid = tl.program_id(0)
  offs = tl.arange(0, B)
  acc = tl.load(x_ptr + pid * B + offs)
  s = tl.sum(acc, 0) * 0.5
  k = pid * 0
"""
_FOOTER = ["tl.store(out_ptr + pid * B + offs, acc + s)",
           "tl.store(iout_ptr + pid, k)"]


@dataclasses.dataclass
class Stmt:
  """A line of kernel code and, for a header (``if``, ``for``), its body."""

  line: str
  body: list | None = None
  orelse: list | None = None

  def render(self, depth: int) -> list[str]:
    pad = "  " * depth
    lines = [pad + self.line]
    if self.body is not None:
      lines += _render(self.body or [Stmt("pass")], depth + 1)
    if self.orelse:
      lines += [pad + "else:"] + _render(self.orelse, depth + 1)
    return lines


def _render(stmts, depth):
  return [line for s in stmts for line in s.render(depth)]


def source(name: str, body: list[Stmt]) -> str:
  """The kernel ``name`` with ``body`` between the fixed head and tail."""
  return (_HEADER.format(name=name) + "\n".join(_render(body, 1)) + "\n"
          + "\n".join("  " + line for line in _FOOTER) + "\n")


class Draw:
  """Draws one kernel body from ``rng``."""

  def __init__(self, rng):
    self.rng = rng
    self.indices: list[str] = []  # Of the loops around the statement.
    self.names = itertools.count()  # A loop's index is named once.

  def pick(self, options):
    return options[int(self.rng.integers(len(options)))]

  def small(self) -> int:
    return int(self.rng.integers(0, 4))

  def int_scalar(self) -> str:
    names = ["pid", "n", "k % 5", "(pid + n) % 4"]
    names += [i for i in self.indices if self.rng.random() < 0.3]
    return self.pick(names)

  def cond(self) -> str:
    a = self.pick([f"{self.int_scalar()} % {self.small() + 2} == {self.small()}",
                   f"{self.int_scalar()} < {self.small() + 1}",
                   f"s > {self.pick(['0.0', '-1.0', '1.0'])}"])
    roll = self.rng.random()
    if roll < 0.15:
      return f"not ({a})"
    if roll < 0.35:
      return f"({a}) {self.pick(['and', 'or'])} ({self.cond()})"
    return a

  def load(self) -> str:
    shift = self.pick(["0", "1", "n", "pid"] + self.indices)
    mask = self.pick(["", f", mask=offs < {self.small() + 1}, other=0.0",
                      ", mask=offs % 2 == 0, other=1.0"])
    return f"tl.load(x_ptr + (pid * B + offs + {shift}) % (P * B){mask})"

  def block(self) -> str:
    x = self.load()
    forms = [
        f"acc + {x}", f"acc * 0.5 + {x}", f"tl.maximum(acc, {x})",
        f"tl.where(offs < {self.small() + 1}, acc, {x})",
        "tl.cumsum(acc, 0) * 0.25",
        f"(acc.to(tl.bfloat16) * {x}.to(tl.bfloat16)).to(tl.float32)",
        f"acc + {x}.to(tl.float8e5).to(tl.float32)",
        f"(acc * 0.125).to(tl.float8e4nv).to(tl.float32) + {x}",
        "acc + s",
        f"tl.where((acc > 0.0) and ({x} < 1.0), acc, -acc)",
        "tl.where(not (acc > 0.0), acc, acc * 2.0)",
    ]
    return self.pick(forms)

  def atomic(self) -> Stmt:
    # Slots 0 to 7: shared by programs, or each program's own.
    slot = self.pick(["0", "pid % 2", "pid", "pid", "1"] + [
        f"{i} % 2" for i in self.indices])
    return self.pick([
        Stmt(f"tl.atomic_add(cnt_ptr + {slot}, 1)"),
        Stmt(f"k += tl.atomic_add(cnt_ptr + {slot}, 1)"),
        Stmt(f"tl.atomic_add(facc_ptr + offs, acc * 0.125,"
             f" mask=offs < {self.small() + 1})"),
        Stmt(f"s += tl.atomic_add(facc_ptr + B + {slot}, s)"),
        Stmt(f"tl.atomic_max(cnt_ptr + 8 + {slot}, k)"),
        Stmt(f"k += tl.atomic_cas(cnt_ptr + 16 + {slot}, 0, pid + 1)"),
    ])

  def loop(self, depth: int) -> Stmt:
    i = f"i{next(self.names)}"
    bounds = self.pick([
        f"range({self.int_scalar()} % 4)",
        f"range(pid % 3, {self.small() + 2})",
        f"range({self.small()}, pid + 1)",
        "tl.range(0, pid + 2, 2)",
        f"range(n % 3, (pid + {self.small()}) % 5)",
    ])
    head = []
    if self.rng.random() < 0.3:  # int64 bounds that differ per program.
      lo = "big + pid.to(tl.int64)"
      bounds = f"range({lo}, {lo} + {self.pick(['pid % 3', 'n % 3', '2'])})"
      head = [Stmt(f"{i} = ({i}_ - big).to(tl.int32)")]
    self.indices.append(i)
    body = head + self.stmts(depth + 1, 3)
    self.indices.pop()
    return Stmt(f"for {i}{'_' if head else ''} in {bounds}:", body)

  def stmt(self, depth: int) -> Stmt:
    roll = self.rng.random()
    if depth < 3 and roll < 0.2:
      return self.loop(depth)
    if depth < 3 and roll < 0.4:
      orelse = self.stmts(depth + 1, 2) if self.rng.random() < 0.5 else None
      return Stmt(f"if {self.cond()}:", self.stmts(depth + 1, 3), orelse)
    if roll < 0.47 and not self.indices:
      return Stmt(f"if {self.cond()}:", [Stmt("return")])
    if roll < 0.62:
      return self.atomic()
    if roll < 0.7:
      return Stmt(self.pick(["s = tl.max(acc, 0)", "s += tl.sum(acc, 0)",
                             "s = s * 0.5 + tl.min(acc, 0)"]))
    if roll < 0.78:
      return Stmt(f"k += {self.int_scalar()}")
    return Stmt(f"acc = {self.block()}")

  def stmts(self, depth: int, most: int) -> list[Stmt]:
    return [self.stmt(depth) for _ in range(int(self.rng.integers(1, most + 1)))]


@dataclasses.dataclass
class Case:
  """One drawn kernel and its launch."""

  seed: int
  body: list[Stmt]
  programs: int
  block: int
  n: int
  big: int


def draw(seed: int) -> Case:
  rng = np.random.default_rng(seed)
  body = Draw(rng).stmts(0, 6)
  return Case(seed, body, int(rng.integers(2, 9)), int(rng.choice([4, 8, 16])),
              int(rng.integers(0, 6)),
              int(rng.choice([7, 2**31 + 3, 2**33 + 5])))


_counter = itertools.count()


def _kernel(text_of, directory: str):
  """Imports a fresh kernel (a fresh name: its launches decide afresh)."""
  name = f"fuzz_kernel_{next(_counter)}"
  path = os.path.join(directory, f"{name}.py")
  with open(path, "w", encoding="utf-8") as f:
    f.write(text_of(name))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return getattr(module, name)


def _launch(case: Case, kernel, mode: str):
  """The outputs' bytes, or the error's type name."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import jt_dist  # pylint: disable=import-outside-toplevel
  p, b = case.programs, case.block
  x = np.random.default_rng(case.seed).standard_normal(p * b).astype(
      np.float32)
  spec = jax.ShapeDtypeStruct
  previous = os.environ.get("JT_DIST_VECTORIZE")
  os.environ["JT_DIST_VECTORIZE"] = mode
  try:
    outs = jt_dist.triton_call(
        jnp.asarray(x), case.n, case.big, kernel=kernel,
        out_shape=(spec((p * b,), jnp.float32), spec((p,), jnp.int32),
                   spec((b + 8,), jnp.float32), spec((24,), jnp.int32)),
        grid=(p,), zeroed_outputs=(0, 1, 2, 3), B=b, P=p)
    return [np.asarray(o).tobytes() for o in outs]
  except Exception as e:  # pylint: disable=broad-except
    return type(e).__name__
  finally:
    if previous is None:
      os.environ.pop("JT_DIST_VECTORIZE")
    else:
      os.environ["JT_DIST_VECTORIZE"] = previous


class _Decisions(logging.Handler):
  """Counts how the vectorised launches ran, from the jt_dist logger."""

  def __init__(self):
    super().__init__(logging.DEBUG)
    self.counts = collections.Counter()

  def emit(self, record):
    message = record.getMessage()
    if "runs vectorised" in message:
      self.counts["vectorised"] += 1
    elif "runs one program at a time" in message:
      # Why it gave way, its kind: ``(Unsupported: ...)``.
      self.counts[message.split("on the CPU (", 1)[-1].split(":")[0]] += 1


def mismatches(case: Case, body, directory: str, outcomes=None) -> bool:
  """Whether ``body`` runs differently vectorised and one at a time."""
  kernel = _kernel(lambda name: source(name, body), directory)
  vectorised = _launch(case, kernel, "1")
  if outcomes is not None and isinstance(vectorised, str):
    outcomes[vectorised] += 1
  return vectorised != _launch(case, kernel, "0")


def _smaller(body):
  """Bodies with one statement removed, or an ``if``/``for`` flattened."""
  for i, stmt in enumerate(body):
    yield body[:i] + body[i + 1:]
    for part in (stmt.body, stmt.orelse):
      if part:
        if not stmt.line.startswith("for"):
          yield body[:i] + part + body[i + 1:]
        for inner in _smaller(part):
          changed = dataclasses.replace(
              stmt, **{"body" if part is stmt.body else "orelse": inner})
          yield body[:i] + [changed] + body[i + 1:]


def shrink(case: Case, directory: str):
  """The smallest body found that still mismatches (greedy)."""
  body = case.body
  progress = True
  while progress:
    progress = False
    for candidate in _smaller(body):
      if mismatches(case, candidate, directory):
        body, progress = candidate, True
        break
  return body


def run(seed: int, cases: int, out=sys.stdout) -> list[int]:
  """Runs ``cases`` cases from ``seed`` on; the seeds that mismatched (each
  printed with its smallest kernel)."""
  failed = []
  decisions = _Decisions()
  logger = logging.getLogger("jt_dist")
  level = logger.level
  logger.addHandler(decisions)
  logger.setLevel(logging.DEBUG)
  errors = collections.Counter()
  try:
    with tempfile.TemporaryDirectory() as directory:
      for case_seed in range(seed, seed + cases):
        case = draw(case_seed)
        if mismatches(case, case.body, directory, errors):
          failed.append(case_seed)
          _report(case, shrink(case, directory), out)
  finally:
    logger.removeHandler(decisions)
    logger.setLevel(level)
  print(f"launches: {dict(decisions.counts)}; errors in both ways:"
        f" {dict(errors)}", file=out)
  return failed


def _report(case: Case, body, out) -> None:
  print(f"case {case.seed} mismatches (grid ({case.programs},), B="
        f"{case.block}, n={case.n}, big={case.big}); smallest kernel:\n"
        f"{source('kernel', body)}", file=out, flush=True)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--cases", type=int, default=200)
  args = parser.parse_args(argv)
  failed = run(args.seed, args.cases)
  print(f"{args.cases} cases from seed {args.seed}: {len(failed)} mismatch(es)"
        + (f" (seeds {failed})" if failed else ""))
  return min(len(failed), 125)


if __name__ == "__main__":
  sys.exit(main())
