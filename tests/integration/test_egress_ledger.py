"""The network ledger: each run of a networked sandbox says what its connections through the
egress proxy reached (host, port, allowed, requests, bytes each way; never what was sent), and
get_sandbox_status adds it up per sandbox."""
from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from conftest import bridge_web_server, start_server

BODY = "hello-from-web-" + "x" * 985   # index.html: 1000 bytes

FETCH_MANY = (
    "import urllib.request, urllib.error\n"
    "for url in {urls!r}:\n"
    "    try:\n"
    "        r = urllib.request.Request(url, headers={{'Authorization': 'Bearer {secret}'}})\n"
    "        print(len(urllib.request.urlopen(r, timeout=10).read()))\n"
    "    except urllib.error.HTTPError as e:\n"
    "        print('HTTP', e.code)\n"
    "    except Exception as e:\n"
    "        print('ERROR', type(e).__name__, e)\n"
)


@pytest.fixture(scope="module")
def web_server():
    with bridge_web_server(BODY) as address:
        yield address


def entry(ledger, host, port, allowed=True):
    found = [e for e in ledger if (e["host"], e["port"], e["allowed"]) == (host, port, allowed)]
    assert len(found) == 1, ledger
    return found[0]


async def test_a_run_shows_what_its_connections_reached_and_status_adds_it_up(web_server):
    secret = "s3cr3t" + uuid.uuid4().hex[:10]
    async with start_server("--allow-network", "--egress-allow", f"{web_server}:8080") as srv:
        async with srv.sandbox(network=True) as sb:
            sid = sb["sandbox_id"]
            urls = [f"http://{web_server}:8080/index.html?token={secret}"] * 3
            sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": FETCH_MANY.format(urls=urls, secret=secret)})
            assert sc["stdout"].split() == ["1000"] * 3, sc
            web = entry(sc["network"], web_server, 8080)
            assert web["approved_by"] == "allowlist" and web["requests"] == 3, web
            # Each answer is the body and a head of a few hundred bytes.
            assert 3 * 1000 < web["bytes_in"] < 3 * 1600, web
            assert 3 * 60 < web["bytes_out"] < 3 * 600, web
            assert "network_refused" not in sc
            assert secret not in json.dumps(sc["network"])

            # A port not on the list: refused, named with the flag that would allow it.
            # This run's ledger holds only this run's connections.
            sc2 = await srv.ok("execute_code", {"sandbox_id": sid, "code": FETCH_MANY.format(
                urls=[f"http://{web_server}:9/?token={secret}"], secret=secret)})
            assert "HTTP 403" in sc2["stdout"], sc2
            assert sc2["network"] == [{"host": web_server, "port": 9, "allowed": False, "approved_by": None,
                                       "requests": 1, "bytes_out": 0, "bytes_in": 0,
                                       "refused": "not in the allow list; the client cannot ask the user (no elicitation)"}], sc2
            assert f"--egress-allow {web_server}:9" in sc2["network_refused"], sc2

            # run_command: each command has its own.
            rc = await srv.sh(sid, f"python3 -c \"import urllib.request; urllib.request.urlopen('http://{web_server}:8080/').read()\"")
            assert entry(rc["network"], web_server, 8080)["requests"] == 1, rc

            status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
            totals = status["sandboxes"][0]["network_ledger"]
            assert entry(totals, web_server, 8080)["requests"] == 4, totals
            assert entry(totals, web_server, 8080)["bytes_in"] == web["bytes_in"] + entry(rc["network"], web_server, 8080)["bytes_in"]
            assert entry(totals, web_server, 9, allowed=False)["requests"] == 1, totals
            assert secret not in json.dumps(status)
        assert secret not in srv.stderr_tail()


async def test_a_run_that_reaches_nothing_has_an_empty_ledger_and_others_none(web_server):
    async with start_server("--allow-network", "--egress-allow", f"{web_server}:8080") as srv:
        async with srv.sandbox(network=True) as sb:
            sc = await srv.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": "print(1)"})
            assert sc["network"] == [], sc
        async with srv.sandbox() as sb:
            sc = await srv.ok("execute_code", {"sandbox_id": sb["sandbox_id"], "code": "print(1)"})
            assert "network" not in sc, sc
            status = await srv.ok("get_sandbox_status", {"sandbox_id": sb["sandbox_id"]})
            assert "network_ledger" not in status["sandboxes"][0]


async def test_a_background_runs_connections_count_in_the_sandboxs_totals(web_server):
    async with start_server("--allow-network", "--egress-allow", f"{web_server}:8080") as srv:
        async with srv.sandbox(network=True) as sb:
            sid = sb["sandbox_id"]
            await srv.ok("run_command", {"sandbox_id": sid, "background": True, "command":
                                         f"python3 -c \"import urllib.request; urllib.request.urlopen('http://{web_server}:8080/').read()\""})
            deadline = asyncio.get_running_loop().time() + 15
            while True:
                status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
                ledger = status["sandboxes"][0].get("network_ledger", [])
                if ledger:
                    break
                assert asyncio.get_running_loop().time() < deadline, status
                await asyncio.sleep(0.2)
            assert entry(ledger, web_server, 8080)["requests"] == 1, ledger
