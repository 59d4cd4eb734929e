"""The compiled part of jt_dist: the eager lean hit (optional).

Everything else lives in pyproject.toml. ``jt_dist/_call/lean_hit/`` is
built against Python's limited API (one wheel for Python 3.11 and newer).
Where it cannot be built (no C compiler), the install goes on without it and
jt_dist takes the same logic in Python (``jt_dist/_call/lean.py``).
"""

from setuptools import Extension
from setuptools import setup

setup(
    ext_modules=[
        Extension(
            "jt_dist._call._lean_hit",
            sources=["jt_dist/_call/lean_hit/module.c",
                     "jt_dist/_call/lean_hit/key.c",
                     "jt_dist/_call/lean_hit/memo.c"],
            depends=["jt_dist/_call/lean_hit/lean_hit.h"],
            # Only PyInit__lean_hit leaves the library.
            extra_compile_args=["-fvisibility=hidden"],
            define_macros=[("Py_LIMITED_API", "0x030B0000")],
            py_limited_api=True,
            optional=True,
        ),
    ],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
