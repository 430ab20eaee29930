"""The TypeScript snippets of README.md and docs/gateway.md, as a newcomer runs them against the demo's gateway.

- The page (README.md's and docs/gateway.md's ```html block, the same page) runs in headless Chromium at
  ``http://localhost:8000/`` beside the ESM bundle (``npm run build``), the token placeholder replaced by a token;
  the demo's gateway at ``http://127.0.0.1:8088`` is played by Playwright's routing with the demo spec's document, so
  the fingerprint the page pins is checked against the real spec: a stale pin makes ``open`` fail.
- README.md's Node script (```js block) runs with ``node`` from a folder laid out like the checkout's root (its
  ``clients/`` the checkout's, ``out/demo-device.token`` written), its gateway URL pointed at a small aiohttp server
  answering ``/v1/spec`` with the demo spec and ``/v1/reports`` with a 202; its pinned fingerprint is checked the
  same way. Both must print a result whose ``outcome`` is ``accepted``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ptel.local_process import free_port
from schemas.spec import load_spec
from schemas.spec_document import spec_document_json
from testbed.browser import browser
from testbed.ts_client_page import BUNDLE, build_bundle

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
DEMO = spec_document_json(load_spec(ROOT / "examples" / "demo-spec.yaml"))
TOKEN = "demo-page:k1:readme"
ACCEPTED = {"accepted": 1, "window_start": 0, "late": False, "window_mismatch": False}


def _block(document: str, lang: str) -> str:
    text = (ROOT / document).read_text(encoding="utf-8")
    blocks: list[str] = re.findall(rf"```{lang}\n(.*?)```", text, re.S)
    assert len(blocks) == 1, f"{document} has {len(blocks)} ```{lang} blocks"
    return blocks[0]


@pytest.mark.parametrize("document", ["README.md", "docs/gateway.md"])
async def test_the_documented_page_sends_through_the_demo_gateway(document: str) -> None:
    build_bundle()
    html = _block(document, "html")
    assert html.count('"PASTE out/demo-device.token"') == 1
    html = html.replace('"PASTE out/demo-device.token"', json.dumps(TOKEN))
    posted: list[str] = []

    async def serve(route: Any) -> None:
        url, request = route.request.url, route.request
        cors = {"Access-Control-Allow-Origin": "http://localhost:8000", "Access-Control-Allow-Headers": "*"}
        if url == "http://localhost:8000/":
            await route.fulfill(body=html, content_type="text/html")
        elif url == "http://localhost:8000/ptel-client.js":
            await route.fulfill(body=BUNDLE.read_bytes(), content_type="text/javascript")
        elif request.method == "OPTIONS":
            await route.fulfill(status=204, headers={**cors, "Access-Control-Allow-Methods": "GET, POST"})
        elif url == "http://127.0.0.1:8088/v1/spec":
            await route.fulfill(body=DEMO, content_type="application/json", headers={**cors, "ETag": '"demo"'})
        elif url == "http://127.0.0.1:8088/v1/reports" and request.method == "POST":
            posted.append(request.headers.get("authorization", ""))
            await route.fulfill(status=202, json=ACCEPTED, headers=cors)
        else:
            await route.fulfill(status=404, body="")

    async with browser() as chromium:
        page = await (await chromium.new_context()).new_page()
        await page.route("**/*", serve)
        await page.goto("http://localhost:8000/")
        await page.wait_for_function("document.body && document.body.textContent.length > 0", timeout=30_000)
        shown = json.loads(await page.evaluate("document.body.textContent"))
    assert shown["outcome"] == "accepted" and shown["admitted"] is True, shown
    assert posted == [f"Bearer {TOKEN}"], posted


async def test_the_readme_node_script_sends_through_the_demo_gateway(tmp_path: Path) -> None:
    node = shutil.which("node")
    assert node is not None, "Node.js >= 20 is needed (make setup says how)"
    build = subprocess.run(
        [node, "build.mjs"], cwd=ROOT / "clients" / "typescript", capture_output=True, text=True, timeout=120
    )
    assert build.returncode == 0, build.stderr
    posted: list[str] = []

    async def spec(_: web.Request) -> web.Response:
        return web.Response(body=DEMO, content_type="application/json", headers={"ETag": '"demo"'})

    async def reports(request: web.Request) -> web.Response:
        posted.append(request.headers.get("Authorization", ""))
        await request.read()
        return web.json_response(ACCEPTED, status=202)

    app = web.Application()
    app.router.add_get("/v1/spec", spec)
    app.router.add_post("/v1/reports", reports)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        script = _block("README.md", "js")
        assert script.count('"http://127.0.0.1:8088"') == 1
        (tmp_path / "send.mjs").write_text(script.replace('"http://127.0.0.1:8088"', f'"http://127.0.0.1:{port}"'))
        (tmp_path / "clients").symlink_to(ROOT / "clients")
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "demo-device.token").write_text(TOKEN + "\n")
        env = {**os.environ, "HOME": str(tmp_path)}
        done = await _run([node, "send.mjs"], tmp_path, env)
    finally:
        await runner.cleanup()
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    assert "outcome: 'accepted'" in done.stdout, done.stdout
    assert posted == [f"Bearer {TOKEN}"], posted
    assert (tmp_path / ".ptel" / "client.secret").stat().st_mode & 0o077 == 0


async def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``argv`` in a thread, so that this event loop keeps serving the script's requests."""
    return await asyncio.to_thread(
        subprocess.run, argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False
    )
