"""The docs' pictures, drawn as SVG from the code in this folder.

``docs/_diagrams/hook.py`` (a MkDocs hook) puts picture NAME wherever a
page has a line ``<!-- diagram: NAME -->``. From the command line,
``python docs/_diagrams/hook.py DIR`` writes every picture to DIR.
"""

from __future__ import annotations

from typing import Callable
from xml.etree import ElementTree

from . import binding
from . import calls
from . import overview
from . import sharding

PICTURES: dict[str, Callable[[], str]] = {
    "binding": binding.binding,
    "binding-positional": binding.binding_positional,
    "calls": calls.eager_and_jitted,
    "overview": overview.overview,
    "mesh-sharded-call": sharding.sharded_call,
    "mesh-out-reduce": sharding.out_reduce,
    "mesh-sharding-rule": sharding.sharding_rule,
}


def render(name: str) -> str:
  """Picture ``name`` as an ``<svg>`` element, checked to be well-formed.

  Raises:
    KeyError: no picture has that name.
    ValueError: the picture is not well-formed XML.
  """
  svg = PICTURES[name]()
  try:
    ElementTree.fromstring(svg)
  except ElementTree.ParseError as e:
    raise ValueError(f"picture {name!r} is not well-formed SVG: {e}") from e
  return svg
