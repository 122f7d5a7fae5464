"""Open a page in Debian's headless Chromium and say what went wrong in it: console errors,
uncaught exceptions, resources that failed, and pictures that did not load.

Chromium is driven through its DevTools protocol over `--remote-debugging-pipe` (fds 3 and 4,
NUL-terminated JSON messages), so the tests need neither a websocket client nor a browser
download: only the `chromium` package.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
"""None where Debian's `chromium` package is not installed (the browser tests then skip)."""

BROKEN_IMAGES_JS = (
    "Array.from(document.images)"
    ".filter(i => !i.complete || i.naturalWidth === 0)"
    ".map(i => i.alt || i.src.slice(0, 60))"
)


@dataclass
class PageCheck:
    """What a browser saw opening a page."""

    errors: list[str] = field(default_factory=list)
    """Console errors, uncaught exceptions and failed loads, as Chromium worded them."""
    broken_images: list[str] = field(default_factory=list)
    """Each picture that did not decode or load, by its alt text."""
    num_images: int = 0
    text: str = ""
    """The page's visible text (`document.body.innerText`)."""
    screenshot_png: bytes = b""


class _Pipe:
    """The DevTools protocol over Chromium's pipe: send commands, collect every event."""

    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int) -> None:
        self.proc, self.out, self.inp = proc, to_browser, from_browser
        self.next_id = 0
        self.buf = b""
        self.events: list[dict[str, Any]] = []

    def _read(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.inp], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self.inp, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe (exit {self.proc.poll()})")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def call(self, method: str, session: str = "", timeout_s: float = 10, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self.out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply.get("result", {})
                return result
            if "method" in reply:
                self.events.append(reply)

    def wait_for(self, method: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e["method"] == method for e in self.events):
            reply = self._read(deadline)
            if "method" in reply:
                self.events.append(reply)


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        p = e.get("params", {})
        if e["method"] == "Runtime.exceptionThrown":
            d = p["exceptionDetails"]
            out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
        elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append(
                "console."
                + p["type"]
                + ": "
                + " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
            )
        elif e["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
            out.append(
                f"log ({p['entry']['source']}): {p['entry']['text']} {p['entry'].get('url', '')}".strip()
            )
    return out


def open_page(path: Path, *, timeout_s: float = 15) -> PageCheck:
    """Load `path` in a fresh headless Chromium, wait for its load event, and report."""
    assert CHROMIUM, "chromium is not installed (Debian package `chromium`)"
    to_r, to_w = os.pipe()  # we write commands; chromium reads them on fd 3
    from_r, from_w = os.pipe()  # chromium writes replies and events on fd 4
    with tempfile.TemporaryDirectory(prefix="gyre-chromium-") as profile:
        args = [
            CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-dev-shm-usage", "--remote-debugging-pipe", f"--user-data-dir={profile}",
            "--window-size=1200,900", "about:blank",
        ]  # fmt: skip

        # In the child, before exec: the pipe ends where chromium expects them (os.dup2 makes
        # them inheritable). close_fds=False, since Popen would close 3 and 4 after this hook;
        # every other fd Python opened is non-inheritable (PEP 446) and closes at exec anyway.
        def fds() -> None:
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)
            for fd in (3, 4):  # dup2 onto itself (from_w already 4) leaves close-on-exec set
                os.set_inheritable(fd, True)

        proc = subprocess.Popen(
            args, close_fds=False, preexec_fn=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(to_r)
        os.close(from_w)
        pipe = _Pipe(proc, to_w, from_r)
        try:
            target = pipe.call("Target.createTarget", url="about:blank", timeout_s=timeout_s)["targetId"]
            session = pipe.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                pipe.call(f"{domain}.enable", session)
            pipe.events.clear()  # about:blank's own events are not the page's
            pipe.call("Page.navigate", session, url=path.resolve().as_uri())
            pipe.wait_for("Page.loadEventFired", timeout_s)

            def value(expression: str) -> Any:
                got = pipe.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
                return got["result"].get("value")

            check = PageCheck(
                broken_images=list(value(BROKEN_IMAGES_JS)),
                num_images=int(value("document.images.length")),
                text=str(value("document.body.innerText")),
                screenshot_png=base64.b64decode(
                    pipe.call("Page.captureScreenshot", session, captureBeyondViewport=True)["data"]
                ),
            )
            check.errors = _errors(pipe.events)
            pipe.call("Browser.close")
            return check
        finally:
            os.close(to_w)
            os.close(from_r)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
