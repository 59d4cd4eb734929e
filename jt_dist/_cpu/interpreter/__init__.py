"""Triton's interpreter, as jt_dist's CPU runtime adapts it.

The only package of jt_dist that imports ``triton.runtime.interpreter``:

- ``upstream``: the interpreter's names and hooks (its builder, memory,
  program id, block pointers, AST rewriter) that the runtime uses.
- ``language``: ``triton.language`` patched as the interpreter patches it,
  recorded once.
- ``triton36_floats``: where Triton 3.6's interpreter treats floats
  otherwise than 3.9's (remove when Triton 3.6 support ends).
"""

from jt_dist._cpu.interpreter.language import language_patched
from jt_dist._cpu.interpreter.triton36_floats import builder_backported
from jt_dist._cpu.interpreter.triton36_floats import nan_ignoring
from jt_dist._cpu.interpreter.upstream import ATOMIC_OP
from jt_dist._cpu.interpreter.upstream import block_pointer
from jt_dist._cpu.interpreter.upstream import builder
from jt_dist._cpu.interpreter.upstream import builder_replaced
from jt_dist._cpu.interpreter.upstream import dtype_refusing_function
from jt_dist._cpu.interpreter.upstream import function_rewriter
from jt_dist._cpu.interpreter.upstream import GridExecutor
from jt_dist._cpu.interpreter.upstream import implicit_cvt
from jt_dist._cpu.interpreter.upstream import InterpretedFunction
from jt_dist._cpu.interpreter.upstream import InterpreterBuilder
from jt_dist._cpu.interpreter.upstream import LangPatchScope
from jt_dist._cpu.interpreter.upstream import native_memory
from jt_dist._cpu.interpreter.upstream import native_memory_replaced
from jt_dist._cpu.interpreter.upstream import np_dtype
from jt_dist._cpu.interpreter.upstream import patch_lang
from jt_dist._cpu.interpreter.upstream import program_id
from jt_dist._cpu.interpreter.upstream import ReduceOps
from jt_dist._cpu.interpreter.upstream import ScanOps
from jt_dist._cpu.interpreter.upstream import TensorHandle
from jt_dist._cpu.interpreter.upstream import TritonSemantic
