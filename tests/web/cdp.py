"""Headless Chromium (Debian's package) driven over the Chrome DevTools Protocol, for page tests.

:func:`open_browser` starts ``chromium --headless`` on a fresh profile with the debugging port
chosen by the OS, connects to its first page over a websocket (trio-websocket) and yields a
:class:`Page`; the browser process is stopped on the way out.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio
from trio_websocket import open_websocket_url

#: Flags for a quiet, sandbox-free headless run that talks to nothing but the page's server.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio"]
#: Seconds allowed for one DevTools command, and for the browser to start.
CDP_TIMEOUT_S = 30.0


def _die_with_parent() -> None:
    """Linux: the browser gets SIGTERM if the test process dies without cleaning up."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    def __init__(self, ws) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    async def call(self, method: str, **params) -> dict:
        """Send one command; return its result (events arriving meanwhile are skipped)."""
        msg_id = next(self._ids)
        await self.ws.send_message(json.dumps({"id": msg_id, "method": method, "params": params}))
        with trio.fail_after(CDP_TIMEOUT_S):
            while True:
                reply = json.loads(await self.ws.get_message())
                if reply.get("id") == msg_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def navigate(self, url: str) -> None:
        await self.call("Page.enable")
        await self.call("Page.navigate", url=url)
        with trio.fail_after(CDP_TIMEOUT_S):
            while await self.evaluate("document.readyState") != "complete":
                await trio.sleep(0.1)

    async def screenshot(self, path: Path) -> None:
        data = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        Path(path).write_bytes(base64.b64decode(data["data"]))


async def _page_ws_url(port: int) -> str:
    async with httpx.AsyncClient(timeout=5) as client:
        targets = (await client.get(f"http://127.0.0.1:{port}/json/list")).json()
    return next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")


@asynccontextmanager
async def open_browser(width: int = 1280, height: int = 1400):
    exe = chromium_path()
    if exe is None:
        raise RuntimeError("chromium is not installed")
    with tempfile.TemporaryDirectory(prefix="echo-swarm-chromium-") as profile:
        cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0",
               "--remote-debugging-address=127.0.0.1", f"--window-size={width},{height}", "about:blank"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                preexec_fn=_die_with_parent)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            with trio.fail_after(CDP_TIMEOUT_S):
                while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                    if proc.poll() is not None:
                        raise RuntimeError(f"chromium exited at start (status {proc.returncode})")
                    await trio.sleep(0.1)
                port = int(port_file.read_text().splitlines()[0])
                url = await _page_ws_url(port)
            async with open_websocket_url(url, max_message_size=64 * 2**20) as ws:
                yield Page(ws)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
