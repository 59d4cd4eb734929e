"""``python -m jt_dist [doctor]``: the doctor (see ``jt_dist/_tools/doctor.py``)."""

import sys

from jt_dist._tools import doctor as _doctor

if __name__ == "__main__":
  sys.exit(_doctor.main())
