"""A headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe:
commands on fd 3, replies and events on fd 4, each message JSON ended by a NUL byte), so no
port, no websocket library and nothing but Debian's python3 and chromium."""
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-extensions", "--disable-default-apps", "--mute-audio", "--hide-scrollbars",
                  "--remote-debugging-pipe"]


def find_chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Browser:
    """One Chromium process with a fresh profile; .session(url) opens a page."""

    def __init__(self, executable, timeout=60):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="epx-chromium-")
        cmd_r, cmd_w = os.pipe()  # we write commands, Chromium reads them on fd 3
        out_r, out_w = os.pipe()  # Chromium writes on fd 4, we read
        # Above 3 and 4 (close-on-exec), so the child's dup2 onto 3 and 4 cannot clobber them.
        hi_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(out_w, fcntl.F_DUPFD_CLOEXEC, 10)

        def child_fds():
            os.dup2(hi_r, 3)
            os.dup2(hi_w, 4)

        # Chromium's own log goes to a file (a pipe nobody reads could fill and stall it).
        self.log = open(os.path.join(self.profile, "chromium.log"), "w+b")
        # close_fds=False: Python's own descriptors are close-on-exec already; 3 and 4 must stay.
        self.proc = subprocess.Popen([executable] + CHROMIUM_FLAGS + ["--user-data-dir=" + self.profile, "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log,
                                     preexec_fn=child_fds, close_fds=False)
        for fd in (cmd_r, out_w, hi_r, hi_w):
            os.close(fd)
        self.w, self.r = cmd_w, out_r
        self.buf = b""
        self.next_id = 0
        self.events = []

    def send(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        return self.wait_reply(self.next_id, method)

    def read_message(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe: " + self.stderr_tail())
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def wait_reply(self, id_, method):
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self.read_message(deadline)
            if msg is None:
                raise RuntimeError("no reply to %s within %d s" % (method, self.timeout))
            if msg.get("id") == id_:
                if "error" in msg:
                    raise RuntimeError("%s: %s" % (method, msg["error"]))
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method, session, seconds):
        deadline = time.monotonic() + seconds
        while True:
            for i, e in enumerate(self.events):
                if e.get("method") == method and e.get("sessionId") == session:
                    return self.events.pop(i)
            msg = self.read_message(deadline)
            if msg is None:
                raise RuntimeError("no %s within %d s" % (method, seconds))
            self.events.append(msg)

    def drain(self, seconds=0.2):
        """Reads the events that arrive within `seconds` (late console messages)."""
        deadline = time.monotonic() + seconds
        while True:
            msg = self.read_message(deadline)
            if msg is None:
                return
            self.events.append(msg)

    def stderr_tail(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def close(self):
        try:
            os.write(self.w, json.dumps({"id": self.next_id + 1, "method": "Browser.close", "params": {}}).encode() + b"\0")
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.w, self.r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
