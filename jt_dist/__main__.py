"""``python -m jt_dist``: the doctor (see ``jt_dist/_doctor.py``)."""

import sys

from jt_dist import _doctor

if __name__ == "__main__":
  sys.exit(_doctor.main())
