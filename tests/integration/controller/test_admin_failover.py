"""`--admin` names every controller's admin API: when one cannot be reached the next is asked.

Two real controllers on one JetStream log, each with its own home and the same operator token (as
the README's scale-out says to set up a second one). With the first one's admin API gone,
`gridctl status` and `gridctl mode` given both URLs are answered by the second, which says so on
stderr; with no URL answering, the error names every URL tried. Before, the CLI talked to one URL
only, so losing the active controller's machine left the operator without `status`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

from grid.transport.embedded import free_port
from grid.transport.jetstream import JetStreamLog

from tests.integration.controller.statuskit import serving_controller
from tests.integration.controller.test_cli_admin import gridctl


async def test_admin_calls_go_to_the_next_controller_when_one_is_gone(js_log: JetStreamLog, tmp_path: Path) -> None:
    home_a, home_b = tmp_path / "a", tmp_path / "b"
    first = serving_controller(js_log, home_a, "ctl-a")
    await first.__aenter__()
    running = True
    try:
        home_b.mkdir()
        shutil.copy2(home_a / "operator.token", home_b / "operator.token")  # one operator token for the grid
        async with serving_controller(js_log, home_b, "ctl-b"):
            url_a, url_b = ((h / "admin.url").read_text().strip() for h in (home_a, home_b))
            both = f"{url_a},{url_b}"
            rc, out, err = await gridctl(home_a, "status", "--json", "--admin", both)
            assert rc == 0 and "asking" not in err, err

            await first.__aexit__(None, None, None)  # the first controller's machine is gone
            running = False
            rc, out, err = await gridctl(home_a, "status", "--json", "--admin", both)
            assert rc == 0, err
            assert f"admin API at {url_a} did not answer" in err and f"asking {url_b}" in " ".join(err.split())
            assert json.loads(out)["hosts"] == []
            rc, out, err = await gridctl(home_a, "mode", "observe", "--admin", both)
            assert rc == 0 and "mode observe" in out, err
            deadline = time.monotonic() + 10
            while True:  # recorded in the log, folded by the controller that answered
                rc, out, _ = await gridctl(home_a, "status", "--json", "--admin", both)
                if rc == 0 and json.loads(out)["mode"]["requested"] == "observe":
                    break
                assert time.monotonic() < deadline, out[:500]
                await asyncio.sleep(0.3)

            dead = f"http://127.0.0.1:{free_port()}"
            rc, out, err = await gridctl(home_a, "status", "--admin", f"{url_a},{dead}")
            assert rc != 0 and url_a in err and dead in " ".join(err.split()), err
    finally:
        if running:
            await first.__aexit__(None, None, None)
