"""``python -m tessera``: the same as the ``tessera`` command."""

import sys

from tessera.cli import main

sys.exit(main())
