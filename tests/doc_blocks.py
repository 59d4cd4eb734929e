"""Finds the fenced code blocks of a Markdown page and runs its python ones.

Shared by tests/readme_test.py (README.md) and tests/docs_test.py (docs/).

A python block runs as pasted, in a fresh process that must write nothing to
standard error (a fork of a process that imported jt_dist, when the chain
imports jt_dist before jax: see tests/fork_server.py). HTML comments on the lines just above a block's fence (blank
lines between them are allowed) say how:

* ``<!-- block: NAME -->`` names the block;
* ``<!-- continues: NAME -->`` runs the block after the named block of the
  same page, in its process and namespace (with every block that continued
  it before). A block without it is self-contained: it starts a process of
  its own;
* ``<!-- not run: REASON -->`` leaves the block out (a shell session, a
  multi-process script); the reason is required;
* ``<!-- gpu only: REASON -->`` runs the block's chain only on a host with
  NVIDIA GPUs; elsewhere it is skipped with the reason;
* ``<!-- on cpu: REASON -->`` runs the block's chain on the CPU platform
  (``JAX_PLATFORMS=cpu``) even on a GPU host: for blocks about the CPU
  interpreter, or that need 8 devices;
* ``<!-- stdout has: TEXT -->`` requires TEXT in the chain's standard output.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import textwrap

import fork_server

_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*([a-z][a-z ]*?)\s*:(.*?)-->\s*$")
_KINDS = ("block", "continues", "not run", "gpu only", "on cpu",
          "stdout has")

# Runs the blocks given as JSON on stdin, in one namespace; each keeps its
# page's line numbers in tracebacks.
_RUNNER = """
import json, sys
namespace = {"__name__": "__main__"}
for path, line, code in json.load(sys.stdin):
  exec(compile("\\n" * line + code, path, "exec"), namespace)
"""


@dataclasses.dataclass(frozen=True)
class Block:
  line: int  # 0-based index of the block's first code line.
  language: str
  code: str
  not_run: str | None  # The reason, when marked "not run".
  name: str | None = None
  continues: str | None = None
  gpu_only: str | None = None  # The reason, when marked "gpu only".
  stdout_has: tuple[str, ...] = ()
  on_cpu: str | None = None  # The reason, when marked "on cpu".


@dataclasses.dataclass
class Chain:
  """Blocks that run in order in one process."""
  blocks: list[Block]

  @property
  def gpu_only(self) -> str | None:
    return next((b.gpu_only for b in self.blocks if b.gpu_only), None)

  @property
  def on_cpu(self) -> str | None:
    return next((b.on_cpu for b in self.blocks if b.on_cpu), None)

  @property
  def first_line(self) -> int:
    return self.blocks[0].line


def code_blocks(text: str, where: str = "README") -> list[Block]:
  """The fenced code blocks of a Markdown text, with their marks.

  Args:
    text: Markdown.
    where: the page's name, for error messages.

  Returns:
    Every fenced block, in order.

  Raises:
    ValueError: a fence is never closed, or a mark is unknown or gives no
      value.
  """
  lines = text.splitlines()
  blocks = []
  i = 0
  while i < len(lines):
    opening = _FENCE.match(lines[i])
    if not opening:
      i += 1
      continue
    indent, ticks, language = opening.groups()
    end = next((j for j in range(i + 1, len(lines))
                if lines[j].strip() == ticks), None)
    if end is None:
      raise ValueError(f"{where} line {i + 1}: the {ticks}{language} fence is"
                       " never closed.")
    code = textwrap.dedent("\n".join(lines[i + 1:end])) + "\n"
    if indent:
      code = textwrap.dedent(code)
    marks = _marks(lines, i, where)
    blocks.append(Block(
        i + 1, language, code, marks.get("not run"), marks.get("block"),
        marks.get("continues"), marks.get("gpu only"),
        tuple(marks.get("stdout has", "").split("\0")) if "stdout has" in marks
        else (), marks.get("on cpu")))
    i = end + 1
  return blocks


def _marks(lines: list[str], fence: int, where: str) -> dict[str, str]:
  """The marks in the HTML comments just above line `fence`."""
  marks: dict[str, str] = {}
  j = fence - 1
  while j >= 0 and (not lines[j].strip() or _MARK.match(lines[j])):
    mark = _MARK.match(lines[j])
    j -= 1
    if not mark:
      continue
    kind, value = mark.group(1), mark.group(2).strip()
    if kind not in _KINDS:
      raise ValueError(f"{where} line {j + 2}: unknown mark `<!-- {kind}: -->`"
                       f"; the marks are {', '.join(_KINDS)}.")
    if not value:
      raise ValueError(f"{where} line {j + 2}: `<!-- {kind}: -->` gives no"
                       " value; write what it needs (a block's name, or the"
                       " reason why the block below cannot run).")
    if kind == "stdout has" and kind in marks:
      value = f"{value}\0{marks[kind]}"
    marks[kind] = value
  return marks


def chains(blocks: list[Block], where: str = "README") -> list[Chain]:
  """The runnable python blocks, grouped into the processes that run them.

  Args:
    blocks: a page's blocks, from `code_blocks`.
    where: the page's name, for error messages.

  Returns:
    One chain per self-contained block, with the blocks that continue it.

  Raises:
    ValueError: a block continues a name no earlier block has, or that of a
      block that does not run, or two blocks share a name.
  """
  result: list[Chain] = []
  by_name: dict[str, Chain | None] = {}
  for block in blocks:
    if block.language != "python":
      continue
    runs = block.not_run is None
    if block.continues is not None:
      if block.continues not in by_name:
        raise ValueError(
            f"{where} line {block.line}: the block continues"
            f" {block.continues!r}, which no earlier block is named (mark that"
            f" block with `<!-- block: {block.continues} -->`).")
      chain = by_name[block.continues]
      if chain is None and runs:
        raise ValueError(
            f"{where} line {block.line}: the block continues"
            f" {block.continues!r}, which is marked not to run; mark this one"
            " `<!-- not run: ... -->` too, or make it self-contained.")
      if runs:
        chain.blocks.append(block)
    else:
      chain = Chain([block]) if runs else None
      if chain is not None:
        result.append(chain)
    if block.name is not None:
      if block.name in by_name:
        raise ValueError(f"{where} line {block.line}: a second block named"
                         f" {block.name!r}.")
      by_name[block.name] = chain if runs else None
  return result


@dataclasses.dataclass(frozen=True)
class Result:
  returncode: int
  stdout: str
  stderr: str


def run_chain(chain: Chain, path: str, cwd: str) -> Result:
  """Runs a chain's blocks in a fresh Python process (or a fork server's child).

  Args:
    chain: the blocks.
    path: the page's path, shown in tracebacks.
    cwd: the directory the blocks run in (the repository's root).

  Returns:
    The process's exit status and output.
  """
  payload = json.dumps([(path, b.line, b.code) for b in chain.blocks])
  with tempfile.TemporaryDirectory() as cache:
    env = fork_server.tree_env(cwd, JT_DIST_CACHE_DIR=cache)
    # Every block asks for its own CPU devices, as a reader's would.
    env.pop("JT_DIST_CPU_DEVICES", None)
    # The test process may already hold most of a GPU's memory (JAX's
    # preallocation); a child that preallocates too retries smaller blocks
    # and logs each failure to stderr.
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if chain.on_cpu:
      env["JAX_PLATFORMS"] = "cpu"
    result = fork_server.run(["-c", _RUNNER], input=payload, cwd=cwd,
                             env=env, timeout=600)
  return Result(result.returncode, result.stdout, result.stderr)


def failure(chain: Chain, path: str, result: Result) -> str | None:
  """Why a chain's run failed, or None when it passed."""
  lines = f"{path} blocks at lines {[b.line for b in chain.blocks]}"
  if result.returncode != 0:
    return f"{lines} failed:\n{result.stderr}"
  if result.stderr:
    return f"{lines} wrote to stderr:\n{result.stderr}"
  for block in chain.blocks:
    for text in block.stdout_has:
      if text not in result.stdout:
        return (f"{lines}: stdout lacks {text!r} (marked at line"
                f" {block.line}):\n{result.stdout}")
  return None
