"""``python -m oncebox_tool build``: see :mod:`oncebox_tool._build`."""

import sys

from ._build import main

sys.exit(main())
