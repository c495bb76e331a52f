"""``python -m ttsvc``: the same command line as the ``ttsvc`` script."""

from ttsvc.cli import main

raise SystemExit(main())
