"""The public face of autotuning choices: see, pin and forget them."""

from __future__ import annotations

from typing import Any, Mapping

import jax

from jt_dist import _compat
from jt_dist._autotune import choose as _choose
from jt_dist._autotune import store as _store

AutotuneChoice = _store.AutotuneChoice


def autotune_choices(kernel: Any = None) -> list[AutotuneChoice]:
  """The autotuning choices this process made, loaded or received.

  Args:
    kernel: a kernel object or name to filter by; None for all.

  Returns:
    One ``AutotuneChoice`` per autotuned call lowered so far, oldest first:
    its chosen config, the candidates, where the choice came from and, when
    timed, every candidate's time.
  """
  name = None if kernel is None else _choose.kernel_name(kernel)
  return [c for c in _store.choices() if name in (None, c.kernel)]


def pin_autotune_config(kernel: Any, config: Any = None, **fields: Any) -> None:
  """Pins the config an autotuned kernel runs, in every call lowered later.

  The first candidate of a call whose fields include the given ones is
  used, without timing. In a multi-process run process 0's pin counts and
  is sent to the others: call this in every process, as SPMD code does, so
  that each one asks process 0 again. ``JT_DIST_AUTOTUNE_PIN`` pins from the
  environment; a pin set here takes precedence.

  Args:
    kernel: the kernel object (``@triton.autotune`` or inner) or its name.
    config: a ``triton.Config``, or a mapping of fields; None with no
      ``fields`` unpins the kernel.
    **fields: constexpr values and launch options (``num_warps``,
      ``num_stages``, ``num_ctas``, ``maxnreg``) to match.

  Raises:
    TypeError: ``config`` is neither a ``triton.Config`` nor a mapping.
  """
  if isinstance(config, _compat.Config):
    pinned = _choose.config_fields(config)
    if pinned["maxnreg"] is None:
      del pinned["maxnreg"]
  elif config is None or isinstance(config, Mapping):
    pinned = dict(config or {})
  else:
    raise TypeError(
        f"pin_autotune_config: config={config!r} of type"
        f" {type(config).__name__} must be a triton.Config, a mapping of"
        " config fields, or None.")
  pinned.update(fields)
  _choose.pin(kernel, pinned or None)
  _store.forget_in_memory(_choose.kernel_name(kernel))
  # Choices are made at lowering: later calls must lower again.
  jax.clear_caches()


def forget_autotune_choices(kernel: Any = None) -> int:
  """Forgets autotuning choices in this process and on disk.

  Calls lowered afterwards choose again (timing the configs on a GPU).

  On disk it removes only files that jt_dist wrote: those in
  ``<cache dir>/autotune/`` that parse as an autotuning choice of this
  jt_dist's format, with its fields, named by their own key. Any other
  ``*.json`` there (unparsable, or foreign even if its ``"kernel"`` field
  names this kernel) is left in place, and one WARNING on the ``jt_dist``
  logger names each such file and why it was kept. Other files are not
  read.

  Args:
    kernel: a kernel object or name; None forgets every kernel's choices.

  Returns:
    How many choices were forgotten, in memory and on disk together (files
    left alone are not counted).
  """
  count = _store.forget(None if kernel is None else _choose.kernel_name(kernel))
  jax.clear_caches()  # As pin_autotune_config does.
  return count
