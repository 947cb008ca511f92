"""``python -m tests.integration.lagging_operator operator ...``: Tessera's operator whose
ResourceClaim watch lags behind the scheduler by ``TESSERA_CLAIM_EVENT_LAG`` seconds, as a
loaded cluster's can. A test seam: the production handlers know nothing of it. Each claim event
reaches the Controller that much later, in the order it came, so a handover that held only by a
prompt watch would cut a device a claim was just allocated (tests/integration/test_handover.py).
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from tessera.cli import main
from tessera.controller.runtime import Controller

LAG_SECONDS = float(os.environ.get("TESSERA_CLAIM_EVENT_LAG", "1.0"))
_claim_seen = Controller.claim_seen


def _lagging_claim_seen(self: Controller, kind: str, body: Any) -> None:
    asyncio.get_running_loop().call_later(LAG_SECONDS, _claim_seen, self, kind, body)


if __name__ == "__main__":
    Controller.claim_seen = _lagging_claim_seen  # type: ignore[method-assign]
    sys.exit(main(sys.argv[1:]))
