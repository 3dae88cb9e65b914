"""``python -m llmretry.testing``: the mock server's command line (see the
package's docstring)."""

import sys

from ._server import main

sys.exit(main())
