"""A headless Chromium driven over the DevTools protocol, for the report's browser tests (issue 44).

No driver package is needed: Chromium is started with ``--remote-debugging-pipe`` and reads the protocol's JSON
commands on file descriptor 3 and writes its answers and events on descriptor 4, each message ended by a NUL
byte. :func:`find_chromium` returns Debian's ``chromium`` (``apt-get install chromium``; .ci/run installs it when
it is missing) or ``None``, so a test can skip with the reason.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
SKIP_REASON = ("no Chromium on PATH (install Debian's: apt-get install -y chromium; .ci/run does this when it is "
               "missing)")


def find_chromium() -> str | None:
    explicit = os.environ.get("COUNTERFACTORY_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) or Path(explicit).is_file() else None
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class BrowserError(RuntimeError):
    pass


class Chromium:
    """One headless Chromium with one page (``width`` x ``height``); use as a context manager."""

    def __init__(self, binary: str, profile: str | Path, width: int = 1400, height: int = 1000, timeout: float = 60):
        self.timeout = timeout
        cmd_r, self._cmd_w = os.pipe()       # we write commands; Chromium reads them as fd 3
        self._res_r, res_w = os.pipe()       # Chromium writes answers as fd 4
        # the child's ends moved to descriptors >= 10, so that moving them to 3 and 4 cannot clobber one another
        # (os.pipe() itself may return 3 or 4)
        low = (cmd_r, res_w)
        cmd_r, res_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in low)
        for fd in low:
            os.close(fd)
        args = [binary, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check", "--hide-scrollbars",
                "--disable-extensions", "--mute-audio", f"--user-data-dir={profile}",
                f"--window-size={width},{height}", "about:blank"]
        script = f'exec "$@" 3<&{cmd_r} 4>&{res_w} {cmd_r}<&- {res_w}>&-'
        Path(profile).mkdir(parents=True, exist_ok=True)
        self.log = Path(profile) / "chromium.log"      # a file, not a pipe nobody reads: Chromium never blocks on it
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(["bash", "-c", script, "chromium", *args], pass_fds=(cmd_r, res_w),
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        os.close(cmd_r)
        os.close(res_w)
        self._next = 0
        self._answers: dict[int, dict] = {}
        self.events: list[dict] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.session = None
        page = next((t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page"), None)
        target = page["targetId"] if page else self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    # ------------------------------------------------------------------ protocol
    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._res_r, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._cond.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                with self._cond:
                    if "id" in msg:
                        self._answers[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                    self._cond.notify_all()

    def call(self, method: str, **params: Any) -> dict:
        self._next += 1
        ident = self._next
        msg = {"id": ident, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        with self._cond:
            while ident not in self._answers:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    err = self.log.read_text(errors="replace")[-2000:] if self.proc.poll() is not None else ""
                    raise BrowserError(f"{method}: no answer from Chromium within {self.timeout} s {err}")
                self._cond.wait(min(left, 0.5))
            answer = self._answers.pop(ident)
        if "error" in answer:
            raise BrowserError(f"{method}: {answer['error']}")
        return answer.get("result", {})

    # ------------------------------------------------------------------ page helpers
    def js(self, expression: str, context: int | None = None) -> Any:
        """Evaluate ``expression`` in the page (or in execution context ``context``) and return its value."""
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context is not None:
            params["contextId"] = context
        out = self.call("Runtime.evaluate", **params)
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression[:80]}: {out['exceptionDetails'].get('text')} "
                               f"{out['exceptionDetails'].get('exception', {}).get('description', '')}")
        return out["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30, context: int | None = None) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression, context)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out after {timeout} s waiting for: {expression[:200]}")
            time.sleep(0.2)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def click(self, x: float, y: float) -> None:
        """A real left click at page coordinates (mouse moved, pressed, released)."""
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        self.call("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=1)
        self.call("Input.dispatchMouseEvent", type="mouseReleased", x=x, y=y, button="left", clickCount=1)

    def click_link(self, text: str) -> dict:
        """Scroll the first link whose text contains ``text`` into view and click its centre; its rectangle."""
        rect = self.wait_for(
            "(() => { const a = [...document.querySelectorAll('a')].find(a => a.textContent.includes("
            + json.dumps(text) + ")); if (!a) return null; a.scrollIntoView({block: 'center'});"
            " const r = a.getBoundingClientRect(); return {x: r.x + Math.min(r.width / 2, 40), y: r.y + r.height / 2,"
            " w: r.width, h: r.height, href: a.getAttribute('href')}; })()")
        self.click(rect["x"], rect["y"])
        return rect

    def frame_context(self, url_prefix: str, timeout: float = 20) -> int:
        """An execution context in the child frame whose URL starts with ``url_prefix`` (e.g. ``data:``)."""
        deadline = time.monotonic() + timeout
        while True:
            tree = self.call("Page.getFrameTree")["frameTree"]
            for child in tree.get("childFrames", []):
                if child["frame"].get("url", "").startswith(url_prefix):
                    return self.call("Page.createIsolatedWorld", frameId=child["frame"]["id"],
                                     worldName="counterfactory-test")["executionContextId"]
            if time.monotonic() > deadline:
                raise BrowserError(f"no child frame with a {url_prefix} URL")
            time.sleep(0.2)

    def screenshot(self, path: str | Path, full_page: bool = False) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                try:
                    self.call("Browser.close")
                except BrowserError:
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=10)
        finally:
            for fd in (self._cmd_w, self._res_r):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_headline_opens(browser: Chromium, report: Path, link_text: str, expect_in_table: str,
                         label: str, shots: Path) -> dict:
    """Open ``report`` (a Snakemake report), screenshot its front page, click the headline link ``link_text`` and
    check that the result opens in the content pane: a visible frame holding a table with ``expect_in_table``,
    and the navigation panel naming the result by its ``label``. Returns what was measured."""
    browser.open(report.resolve().as_uri())
    browser.wait_for("document.querySelector('#app .prose a') !== null")
    front = browser.screenshot(shots / "front_page.png")
    front_text = browser.js("document.querySelector('#app .prose').innerText")
    rect = browser.click_link(link_text)
    frame = browser.wait_for(
        "(() => { const f = document.querySelector('#app iframe'); if (!f) return null;"
        " const r = f.getBoundingClientRect(); return {w: r.width, h: r.height, x: r.x, y: r.y,"
        " src: f.src.slice(0, 40)}; })()")
    ctx = browser.frame_context("data:")
    table = browser.wait_for(
        "(() => { const t = [...document.querySelectorAll('table')].find(t => t.innerText.includes("
        + json.dumps(expect_in_table) + ")); if (!t) return null; const r = t.getBoundingClientRect();"
        " return {w: r.width, h: r.height, text: t.innerText.slice(0, 200)}; })()", context=ctx)
    nav = browser.wait_for("(() => { const n = document.querySelector('#app nav');"
                           " return n && n.innerText.includes(" + json.dumps(label) + ") ? n.innerText : null; })()")
    opened = browser.screenshot(shots / "headline_opened.png")
    return {"front_text": front_text, "link": rect, "frame": frame, "table": table, "nav": nav, "front_png": str(front),
            "opened_png": str(opened)}


__all__ = ["SKIP_REASON", "BrowserError", "Chromium", "check_headline_opens", "find_chromium"]
