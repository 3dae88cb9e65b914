"""``python -m llmretry``: the ``llmretry`` command (see :mod:`llmretry.cli`)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
