"""A test case with jt_dist's fresh random inputs and chex's variants.

``@chex.variants(with_jit=True, without_jit=True)`` on a test method makes
one test per variant; in each, ``self.variant(fn)`` is ``jax.jit(fn)`` or
``fn`` itself (``with_device`` / ``without_device``: the arguments put on
the device first, or passed as given). So a suite states once what it
checks, and runs it both traced and eager.
"""

import chex

from jt_dist import testing


class VariantsTestCase(testing.TestCase, chex.TestCase):
  """``jt_dist.testing.TestCase`` whose tests may use ``@chex.variants``."""
