"""Secrets injected outside the sandbox (--secrets, initialize_sandbox secrets): the sandbox
holds a placeholder; the egress proxy puts the value into requests to the secret's hosts only,
and to other hosts the placeholder goes out unchanged and the ledger says so. The value is
found nowhere the sandbox, its results or the logs could show it."""
from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import uuid

import pytest

from conftest import IMAGE, INSTANCE_LABEL, docker, docker_inspect, instance_of, start_server
from secret_upstream import bearer_secret, make_ca, upstream

FETCH = (
    "import os, urllib.request\n"
    "ph = os.environ['API_KEY']\n"
    "def get(url, headers):\n"
    "    try:\n"
    "        print(url.rsplit('/', 1)[1], urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10).read().decode())\n"
    "    except Exception as e:\n"
    "        print('ERROR', url, type(e).__name__, e)\n"
    "get('http://{ip}:8080/bearer', {{'Authorization': 'Bearer ' + ph}})\n"
    "get('http://{ip}:8080/added', {{}})\n"
    "get('http://{ip}:8081/elsewhere', {{'Authorization': 'Bearer ' + ph}})\n"
    "get('http://{ip}:8080/query?x=1', {{}})\n"
    "print('PLACEHOLDER', ph, os.environ['Q_KEY'])\n"
)


def secrets_file(tmp_path, value: str, qvalue: str, ip: str, **extra) -> str:
    (tmp_path / "api-key").write_text(value + "\n")
    doc = {"secrets": [
        {"name": "API_KEY", "value_file": str(tmp_path / "api-key"), "hosts": [f"{ip}:8080", f"{ip}:8443"],
         "header": "Authorization", "template": "Bearer {value}", **extra},
        {"name": "Q_KEY", "value_env": "TEST_Q_KEY", "hosts": [f"{ip}:8080"], "query": "key"},
    ]}
    path = tmp_path / "secrets.json"
    path.write_text(json.dumps(doc))
    return str(path)


def grep_container(container_id: str, value: str) -> str:
    """Files of the container holding value (as root, the value on grep's stdin, not its command line)."""
    r = subprocess.run(["docker", "exec", "-i", "-u", "0", container_id, "sh", "-c",
                        "grep -rlF -f /dev/stdin / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null; true"],
                       input=value, capture_output=True, text=True, timeout=170)
    return r.stdout


async def test_a_secret_goes_to_its_hosts_only_and_is_nowhere_in_the_sandbox(tmp_path, state_dir):
    value, qvalue = "sk-live-" + uuid.uuid4().hex, "qk" + uuid.uuid4().hex
    with upstream("8080", "8081") as up:
        path = secrets_file(tmp_path, value, qvalue, up.address)
        args = ("--allow-network", "--state-dir", str(state_dir), "--log-level", "debug", "--secrets", path,
                "--egress-allow", f"{up.address}:8080", "--egress-allow", f"{up.address}:8081")
        async with start_server(*args, env={"TEST_Q_KEY": qvalue}) as srv:
            sb = await srv.new_sandbox(network=True, secrets=["API_KEY", "Q_KEY"])
            sid = sb["sandbox_id"]
            sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": FETCH.format(ip=up.address)})
            out = sc["stdout"]
            assert "bearer ok" in out and "added ok" in out and "elsewhere ok" in out and "query?x=1 ok" in out, sc
            placeholder = out.split("PLACEHOLDER ")[1].split()[0]
            assert placeholder.startswith("cubicle-secret-API_KEY-") and value not in placeholder, out

            # The upstream saw the value on the secret's host, the placeholder on the other.
            assert up.headers_of("/bearer")["authorization"] == f"Bearer {value}"
            assert up.headers_of("/added")["authorization"] == f"Bearer {value}"
            assert up.headers_of("/elsewhere")["authorization"] == f"Bearer {placeholder}"
            query = [r for r in up.requests() if r["path"].startswith("/query")]
            assert query and query[0]["path"] == f"/query?x=1&key={qvalue}", up.requests()

            # A command (run_command) with the placeholder in another header, and a body.
            post = ("import os, urllib.request; print(urllib.request.urlopen(urllib.request.Request("
                    f"'http://{up.address}:8080/cmd', data=b'x' * 5000, headers={{'X-Api-Key': os.environ['API_KEY']}})).read().decode())")
            rc = await srv.sh(sid, f"python3 -c \"{post}\"")
            assert rc["stdout"].strip() == "ok", rc
            # only the declared header (Authorization) takes the value; X-Api-Key keeps the placeholder
            assert up.headers_of("/cmd")["x-api-key"] == placeholder
            assert up.headers_of("/cmd")["authorization"] == f"Bearer {value}"
            assert [r["body_len"] for r in up.requests() if r["path"].startswith("/cmd")] == [5000]

            # The ledger names the secrets used, and the placeholder sent elsewhere.
            by_port = {e["port"]: e for e in sc["network"]}
            assert sorted(by_port[8080]["secret"]) == ["API_KEY", "Q_KEY"], sc["network"]
            assert "placeholder" not in by_port[8080], sc["network"]
            assert by_port[8081]["placeholder"] == ["API_KEY"] and "secret" not in by_port[8081], sc["network"]
            status = await srv.ok("get_sandbox_status", {"sandbox_id": sid})
            totals = {e["port"]: e for e in status["sandboxes"][0]["network_ledger"]}
            assert sorted(totals[8080]["secret"]) == ["API_KEY", "Q_KEY"], totals

            # Nowhere: the sandbox's environment, files, container config, the proxy's config,
            # results, the server's log.
            env = await srv.sh(sid, "cat /proc/self/environ | tr '\\0' '\\n'; env")
            assert placeholder in env["stdout"]
            seen = json.dumps([sc, rc, status, env])
            proxy = docker("ps", "-q", "--filter", "name=cubicle-proxy-").stdout.split()
            inspected = json.dumps([docker_inspect(sb["container_id"])] + [docker_inspect(p) for p in proxy])
            for v in (value, qvalue):
                assert v not in seen and v not in inspected
                assert grep_container(sb["container_id"], v) == ""
        for v in (value, qvalue):
            assert v not in srv.log_path.read_text(errors="replace")


async def test_secrets_are_refused_with_clear_errors(tmp_path, state_dir):
    with upstream("8080") as up:
        path = secrets_file(tmp_path, "v-" + uuid.uuid4().hex, "q", up.address)
        async with start_server("--allow-network", "--state-dir", str(state_dir), "--secrets", path,
                                env={"TEST_Q_KEY": "q"}) as srv:
            _, err = await srv.tool_error("initialize_sandbox", {"secrets": ["API_KEY"]})
            assert "network: true" in err, err
            _, err = await srv.tool_error("initialize_sandbox", {"network": True, "secrets": ["NOPE"]})
            assert "no secret NOPE" in err and "--secrets" in err, err


@pytest.mark.parametrize("doc, why", [
    ("{", "not JSON"),
    ('{"secrets": [{"name": "A", "hosts": ["x"], "header": "H"}]}', "value_file or value_env"),
    ('{"secrets": [{"name": "A", "value_env": "NOT_SET_ANYWHERE_42", "hosts": ["x"], "header": "H"}]}', "has no NOT_SET_ANYWHERE_42"),
    ('{"secrets": [{"name": "A", "value_env": "HOME", "hosts": [], "header": "H"}]}', "at least one host"),
    ('{"secrets": [{"name": "A", "value_env": "HOME", "hosts": ["x"]}]}', "header (with template) or query"),
    ('{"secrets": [{"name": "A-B", "value_env": "HOME", "hosts": ["x"], "header": "H"}]}', "letters, digits and _"),
])
def test_a_bad_secrets_file_stops_the_server_at_start_with_why(tmp_path, state_dir, doc, why):
    from conftest import CUBICLE_BIN, server_args, server_env
    path = tmp_path / "secrets.json"
    path.write_text(doc)
    r = subprocess.run([str(CUBICLE_BIN), *server_args(["--state-dir", str(state_dir), "--secrets", str(path)])],
                       env=server_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r
    assert why in r.stderr and "--secrets" in r.stderr, r.stderr


def test_secrets_without_any_trusted_certificate_stop_the_server_at_start(tmp_path, state_dir):
    """The proxy could verify no secret's host: say so at start rather than fail every request."""
    from conftest import CUBICLE_BIN, server_args, server_env
    path = tmp_path / "secrets.json"
    path.write_text('{"secrets": [{"name": "A", "value_env": "HOME", "hosts": ["x"], "header": "H"}]}')
    env = {**server_env(), "SSL_CERT_FILE": str(tmp_path / "none.pem"), "SSL_CERT_DIR": str(tmp_path / "none")}
    r = subprocess.run([str(CUBICLE_BIN), *server_args(["--state-dir", str(state_dir), "--secrets", str(path)])],
                       env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r
    assert "no trusted certificates" in r.stderr and "--secrets" in r.stderr, r.stderr


HTTPS_PY = (
    "import os, ssl, urllib.request, urllib.error\n"
    "ph = os.environ['API_KEY']\n"
    "def get(url, data=None):\n"
    "    try:\n"
    "        r = urllib.request.Request(url, data=data, headers={{'Authorization': 'Bearer ' + ph}})\n"
    "        print(url.rsplit('/', 1)[1], urllib.request.urlopen(r, timeout=15).read().decode())\n"
    "    except Exception as e:\n"
    "        print('ERROR', url.rsplit('/', 1)[1], type(e).__name__, e)\n"
    "get('https://{ip}:8443/urllib')\n"
    "get('https://{ip}:8443/urllib-post', b'y' * 100000)\n"
    "get('https://{ip}:8444/other')\n"
    "get('https://{ip}:8445/wrong-cert')\n"
)

# Node 18's fetch ignores HTTPS_PROXY: Node's TLS over a CONNECT it makes itself, which
# trusts the sandbox's CA only through NODE_EXTRA_CA_CERTS.
HTTPS_NODE = """
const net = require('net'), tls = require('tls');
const proxy = new URL(process.env.HTTPS_PROXY);
const s = net.connect(+proxy.port, proxy.hostname, () => s.write('CONNECT %(ip)s:8443 HTTP/1.1\\r\\nHost: %(ip)s:8443\\r\\n\\r\\n'));
s.once('data', (d) => {
  if (!String(d).startsWith('HTTP/1.1 200')) { console.log('CONNECT', String(d)); s.end(); return; }
  const t = tls.connect({socket: s, host: '%(ip)s', servername: ''}, () => t.write(
    'GET /node HTTP/1.1\\r\\nHost: %(ip)s:8443\\r\\nAuthorization: Bearer ' + process.env.API_KEY + '\\r\\nConnection: close\\r\\n\\r\\n'));
  let body = '';
  t.on('data', (d) => body += d);
  t.on('end', () => console.log('node', body.split('\\r\\n\\r\\n')[1]));
  t.on('error', (e) => console.log('ERROR node', e.message));
});
s.on('error', (e) => console.log('ERROR node', e.message));
"""


async def test_https_to_a_secrets_host_is_terminated_and_verified_and_other_hosts_are_tunnelled(tmp_path, state_dir):
    value = "sk-tls-" + uuid.uuid4().hex
    test_ca, other_ca = make_ca(tmp_path, "test-upstream-ca"), make_ca(tmp_path, "untrusted-ca")
    with upstream("8443s", "8444s", "8445s", cas={"8443": test_ca, "8444": test_ca, "8445": other_ca}) as up:
        ip = up.address
        (tmp_path / "api-key").write_text(value)
        (tmp_path / "secrets.json").write_text(json.dumps({"secrets": [
            {"name": "API_KEY", "value_file": str(tmp_path / "api-key"), "hosts": [f"{ip}:8443", f"{ip}:8445"],
             "header": "Authorization", "template": "Bearer {value}"}]}))
        args = ["--allow-network", "--state-dir", str(state_dir), "--log-level", "debug",
                "--secrets", str(tmp_path / "secrets.json"), "--test-upstream-ca", str(test_ca)]
        for port in (8443, 8444, 8445):
            args += ["--egress-allow", f"{ip}:{port}"]
        async with start_server(*args) as srv:
            sb = await srv.new_sandbox(network=True, secrets=["API_KEY"])
            sid = sb["sandbox_id"]
            sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": HTTPS_PY.format(ip=ip)})
            out = sc["stdout"]
            assert "urllib ok" in out and "urllib-post ok" in out, sc
            assert up.headers_of("/urllib")["authorization"] == f"Bearer {value}"
            assert [r["body_len"] for r in up.requests() if r["path"] == "/urllib-post"] == [100000]
            # Another host is an untouched tunnel: the sandbox does not trust it (its CA is the
            # test's, not the sandbox's), so the request fails inside the sandbox and carries
            # nothing of the secret.
            assert "ERROR other" in out and "CERTIFICATE_VERIFY_FAILED" in out, out
            assert not [r for r in up.requests() if r["path"] == "/other"]
            # A secret's host whose certificate the proxy cannot verify: refused, and the result says why.
            assert "ERROR wrong-cert" in out and "502" in out, out
            by_port = {e["port"]: e for e in sc["network"]}
            assert "certificate verify failed" in by_port[8445]["error"], sc["network"]
            assert by_port[8443]["secret"] == ["API_KEY"], sc["network"]

            node = await srv.sh(sid, f"node -e {shlex.quote(HTTPS_NODE % {'ip': ip})}")
            assert node["stdout"].strip() == "node ok", node
            assert up.headers_of("/node")["authorization"] == f"Bearer {value}"

            seen = json.dumps([sc, node, await srv.ok("get_sandbox_status", {"sandbox_id": sid})])
            proxy = docker("ps", "-q", "--filter", "name=cubicle-proxy-").stdout.split()
            inspected = json.dumps([docker_inspect(sb["container_id"])] + [docker_inspect(p) for p in proxy])
            assert value not in seen and value not in inspected
            assert grep_container(sb["container_id"], value) == ""
        assert value not in srv.log_path.read_text(errors='replace')


def image_has(command: str) -> bool:
    return docker("run", "--rm", "--entrypoint", "sh", IMAGE, "-c", command, check=False).returncode == 0


@pytest.mark.parametrize("client", ["curl", "requests"])
async def test_curl_and_requests_reach_a_secrets_host_through_the_sandbox_ca(tmp_path, state_dir, client):
    if not image_has("command -v curl" if client == "curl" else "python3 -c 'import requests'"):
        pytest.skip(f"the test image ({IMAGE}) has no {client}")
    value = "sk-tls-" + uuid.uuid4().hex
    test_ca = make_ca(tmp_path, "test-upstream-ca")
    with upstream("8443s", cas={"8443": test_ca}) as up:
        bearer_secret(tmp_path, value, [f"{up.address}:8443"])
        async with start_server("--allow-network", "--state-dir", str(state_dir), "--secrets", str(tmp_path / "secrets.json"),
                                "--test-upstream-ca", str(test_ca), "--egress-allow", f"{up.address}:8443") as srv:
            sid = (await srv.new_sandbox(network=True, secrets=["API_KEY"]))["sandbox_id"]
            url = f"https://{up.address}:8443/{client}"
            command = (f'curl -s -H "Authorization: Bearer $API_KEY" {url}' if client == "curl" else
                       f"python3 -c \"import os, requests; print(requests.get('{url}', headers={{'Authorization': 'Bearer ' + os.environ['API_KEY']}}).text)\"")
            rc = await srv.sh(sid, command)
            assert rc["stdout"].strip() == "ok", rc
            assert up.headers_of(f"/{client}")["authorization"] == f"Bearer {value}"


async def test_a_proxy_that_dies_is_replaced_with_the_sandboxes_secrets(tmp_path, state_dir):
    """The proxy killed from outside: a new one joins the network under the same name and gets
    every sandbox's secrets again, so the same sandbox's next request carries the value."""
    value = "sk-again-" + uuid.uuid4().hex
    get = ("import os, urllib.request; print(urllib.request.urlopen(urllib.request.Request('http://{ip}:8080/{path}', "
           "headers={{'Authorization': 'Bearer ' + os.environ['API_KEY']}}), timeout=10).read().decode())")
    with upstream("8080") as up:
        path = secrets_file(tmp_path, value, "q", up.address)
        async with start_server("--allow-network", "--state-dir", str(state_dir), "--secrets", path,
                                "--egress-allow", f"{up.address}:8080", env={"TEST_Q_KEY": "q"}) as srv:
            sb = await srv.new_sandbox(network=True, secrets=["API_KEY"])
            sid = sb["sandbox_id"]
            mine = f"label={INSTANCE_LABEL}={instance_of(sb['container_id'])}"

            def proxies() -> list[str]:
                return docker("ps", "-aq", "--no-trunc", "--filter", mine, "--filter", "name=cubicle-proxy-").stdout.split()

            assert (await srv.ok("execute_code", {"sandbox_id": sid, "code": get.format(ip=up.address, path="before")}))["stdout"] == "ok\n"
            [first] = proxies()
            docker("kill", first)
            for _ in range(150):
                if "a new egress proxy serves" in srv.log_path.read_text(errors="replace"):
                    break
                await asyncio.sleep(0.1)
            now = proxies()
            assert len(now) == 1 and first not in now, (now, srv.stderr_tail())  # the dead one removed, one new
            sc = await srv.ok("execute_code", {"sandbox_id": sid, "code": get.format(ip=up.address, path="after")})
            assert sc["stdout"] == "ok\n", sc
            assert up.headers_of("/after")["authorization"] == f"Bearer {value}"
        # exactly once: the exit's sweep removes the proxy, and that one is not replaced
        assert srv.log_path.read_text(errors="replace").count("exited; starting a new one") == 1
