"""``python -m ttsvc.cli``: the ``ttsvc`` command, as the tests and the benchmarks start it."""

import sys

from ttsvc.cli import main

sys.exit(main())
