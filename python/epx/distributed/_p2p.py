"""The user's send / recv on a group's own PPBuffer."""
import threading
import time

import torch

from ._util import _DTYPES, _INFLIGHT, _P2P_BYTES, _code, _flat, _is, _u8, _with_rank
from ._work import _P2PWork

# -- point-to-point: asynchronous, matched by (source, tag) as gloo does -------------------
# Every user message is a 32-byte header (bytes, dtype code, tag, kind) and then its bytes in
# chunks of at most EPX_DIST_P2P_BYTES, on the group's own point-to-point PPBuffer. A thread
# per destination sends the queued messages in issue order (so isend returns at once, whatever
# the receiver does); a thread per source, running while a receive that a message from that
# source could match is posted, takes each message as it comes: into the first posted receive
# of its tag (in posting order, any-source receives included), or else into a stash that the
# next matching receive takes. The threads wait inside epx with the GIL released.
_HEAD = 32
_DATA, _CLOSE = 0, 1


class _Recv:
    """A posted receive: its flat bytes, dtype code and tag, and where the bytes go back."""

    def __init__(self, work, src, tag, tensor):
        flat, self.back = _flat(tensor)
        self.u8, self.code, self.dtype = _u8(flat), _code(tensor.dtype), tensor.dtype
        self.work, self.src, self.tag = work, src, tag

    def takes(self, src, tag):
        return (self.src is None or self.src == src) and self.tag == tag


class _Stash:
    """A message that arrived before a receive matched it."""

    def __init__(self, src, tag, code, nbytes):
        self.src, self.tag, self.code = src, tag, code
        self.data = torch.empty(nbytes, dtype=torch.uint8)
        self.ready, self.taker, self.error = False, None, None


class _P2P:
    def __init__(self, pg, pp):
        self.pg, self.pp, self.me, self.P = pg, pp, pg._rank, pg._size
        self.cv = threading.Condition()
        self.posted = []      # _Recv in posting order
        self.stash = []       # _Stash in arrival order
        self.queues = {}      # dst -> [(work, u8, code, tag)]
        self.busy = set()     # dsts whose thread is moving a message
        self.senders, self.receivers = {}, {}
        self.broken = {}      # peer -> the error that broke the pair
        self.closing = False
        # One pp.send at a time: the PPBuffer puts every message's header from one staging
        # word of its own, which a send to another peer from another thread would overwrite
        # before a put still queued in the transport has read it (over UCX to another machine).
        self.send_lock = threading.Lock()

    # -- threads ---------------------------------------------------------------------------
    def _thread(self, table, peer, fn):
        t = table.get(peer)
        if t is None or not t.is_alive():
            t = threading.Thread(target=fn, args=(peer,), daemon=True, name=f"epx-p2p-{fn.__name__}-{peer}")
            table[peer] = t
            t.start()

    def _native(self, fn, ptr, n, peer):
        """One PPBuffer call, again after epx's timeout (a wait longer than the group's timeout is
        the waiting Work's to report); None once the group is closing."""
        while True:
            try:
                if fn == self.pp.send:
                    with self.send_lock:
                        fn(ptr, n, peer)
                else:
                    fn(ptr, n, peer)
                return True
            except RuntimeError as e:
                if not _is(e, "timeout"):
                    raise
                if self.closing:
                    return None

    def _error(self, what, peer, e):
        if str(e).startswith("epx"):
            return e
        return RuntimeError(f"epx backend: {what}: {_with_rank(str(e), self.me)}")

    def _break(self, peer, err):
        """The pair with `peer` failed: every queued or posted message of it fails with `err`."""
        with self.cv:
            self.broken.setdefault(peer, err)
            doomed = [r for r in self.posted if r.src == peer]
            self.posted = [r for r in self.posted if r.src != peer]
            sends = self.queues.pop(peer, [])
        for r in doomed:
            r.work._finish(err)
        for w, *_ in sends:
            if not w.is_completed():
                w._finish(err)

    def _free_slot(self, dst):
        """Waits in Python (not inside epx) until the pair has a free slot, so that the send
        after it does not wait: a sender thread never waits inside epx, where an exit of the
        process could find it (a thread that comes back from epx while the interpreter
        finalizes aborts the process). None once the group is closing."""
        delay = 0.0
        while self.pp.in_flight(dst) >= _INFLIGHT:
            if self.closing:
                return None
            time.sleep(delay)
            delay = min(max(2 * delay, 2e-5), 1e-3)
        return True

    def _send_loop(self, dst):
        pp, head = self.pp, torch.empty(4, dtype=torch.int64)
        cap = _P2P_BYTES
        while True:
            with self.cv:
                while (not self.queues.get(dst) or dst in self.busy) and not self.closing:
                    self.cv.wait()
                q = self.queues.get(dst)
                if not q:
                    return
                work, u8, code, tag, kind = q[0]
                self.busy.add(dst)
            try:
                head[0], head[1], head[2], head[3] = u8.numel(), code, tag, kind
                ok = self._free_slot(dst) and self._native(pp.send, head.data_ptr(), _HEAD, dst)
                for s in range(0, u8.numel(), cap):
                    if not ok:
                        break
                    piece = u8[s:s + cap]
                    ok = self._free_slot(dst) and self._native(pp.send, piece.data_ptr(), piece.numel(), dst)
            except RuntimeError as e:
                with self.cv:
                    self.busy.discard(dst)
                self._break(dst, self._error(f"send to rank {dst}", dst, e))
                return
            with self.cv:
                self.busy.discard(dst)
                if q and q[0][0] is work:
                    q.pop(0)
                self.cv.notify_all()
            if ok is None:
                work._finish(RuntimeError(f"epx backend: send: rank {self.me}: the group was destroyed while the "
                                          f"message to rank {dst} was in flight"))
                return
            work._finish()

    def _wanted(self, src):
        return any(r.src is None or r.src == src for r in self.posted)

    def _recv_loop(self, src):
        pp, head = self.pp, torch.empty(4, dtype=torch.int64)
        cap = _P2P_BYTES
        while True:
            with self.cv:
                while not self.closing and not self._wanted(src):
                    self.cv.wait()
                if self.closing:
                    return
            try:
                if self._native(pp.recv, head.data_ptr(), _HEAD, src) is None:
                    return
                nbytes, code, tag, kind = (int(v) for v in head)
                if kind == _CLOSE:
                    self._break(src, RuntimeError(f"epx backend: rank {self.me}: rank {src} destroyed the group "
                                                  f"(or exited): no message from it will come, none to it be taken"))
                    return
                with self.cv:
                    mine = next((r for r in self.posted if r.takes(src, tag)), None)
                    if mine is not None:
                        self.posted.remove(mine)
                        stash = None
                    else:
                        stash = _Stash(src, tag, code, nbytes)
                        self.stash.append(stash)
                if stash is not None:
                    dst = stash.data
                elif nbytes == mine.u8.numel():
                    dst = mine.u8
                else:
                    dst = None  # drained
                for s in range(0, nbytes, cap):
                    m = min(cap, nbytes - s)
                    if dst is None:
                        v = pp.recv_view(src, -1)
                        pp.release(v)
                    elif self._native(pp.recv, dst[s:s + m].data_ptr(), m, src) is None:
                        return
            except RuntimeError as e:
                self._break(src, self._error(f"recv from rank {src}", src, e))
                return
            if stash is None:
                self._deliver(mine, src, nbytes, code, None)
            else:
                with self.cv:
                    stash.ready = True
                    taker = stash.taker
                if taker is not None:
                    self._deliver(taker, src, nbytes, code, stash.data)

    def _deliver(self, r, src, nbytes, code, data):
        """Completes the receive r with a message of src (data: a stashed copy, else already in r)."""
        if nbytes != r.u8.numel() or (code and r.code and code != r.code):
            got = f"{nbytes} bytes" + (f" of {_DTYPES[code - 1]}" if 0 < code <= len(_DTYPES) else "")
            r.work._finish(RuntimeError(
                f"epx backend: recv: rank {src} sends {got} (tag {r.tag}), rank {self.me} expects "
                f"{r.u8.numel()} bytes of {r.dtype}"))
            return
        try:
            if data is not None and nbytes:
                r.u8.copy_(data)
            r.back()
        except RuntimeError as e:
            r.work._finish(e)
            return
        r.work._finish(None, src)

    # -- what the ProcessGroup calls --------------------------------------------------------
    def send(self, tensor, dst, tag, kind=_DATA, what="send"):
        u8 = _u8(_flat(tensor)[0])  # the tensor itself when contiguous: torch's rule is not to touch it before wait()
        work = _P2PWork(self.pg, what, [tensor], dst)
        if dst == self.me:  # to itself: matched here, a copy (no thread waits on this rank)
            data = u8.clone()
            with self.cv:
                mine = next((r for r in self.posted if r.takes(dst, int(tag))), None)
                if mine is not None:
                    self.posted.remove(mine)
                else:
                    st = _Stash(dst, int(tag), _code(tensor.dtype), 0)
                    st.data, st.ready = data, True
                    self.stash.append(st)
            if mine is not None:
                self._deliver(mine, dst, data.numel(), _code(tensor.dtype), data)
            work._finish()
            return work
        with self.cv:
            if self.closing:
                raise RuntimeError(f"epx backend: {what}: rank {self.me}: the group was destroyed")
            if dst in self.broken:
                raise self.broken[dst]
            inline = (not self.queues.get(dst) and dst not in self.busy and u8.numel() <= _P2P_BYTES
                      and self.pp.in_flight(dst) + 1 + (u8.numel() > 0) <= _INFLIGHT)
            if inline:  # the pair's slots are free: sent from here at once, no thread hand-off
                self.busy.add(dst)
        if inline:
            try:
                head = torch.tensor([u8.numel(), _code(tensor.dtype), int(tag), kind], dtype=torch.int64)
                with self.send_lock:  # neither waits: a slot is free for each
                    self.pp.send(head.data_ptr(), _HEAD, dst)
                    if u8.numel():
                        self.pp.send(u8.data_ptr(), u8.numel(), dst)
            except RuntimeError as e:
                with self.cv:
                    self.busy.discard(dst)
                    self.cv.notify_all()
                self._break(dst, self._error(f"send to rank {dst}", dst, e))
                raise self.broken[dst]
            with self.cv:
                self.busy.discard(dst)
                self.cv.notify_all()
            work._finish()
            return work
        with self.cv:
            self.queues.setdefault(dst, []).append((work, u8, _code(tensor.dtype), int(tag), kind))
            self._thread(self.senders, dst, self._send_loop)
            self.cv.notify_all()
        return work

    def recv(self, tensor, src, tag, what="recv"):
        work = _P2PWork(self.pg, what, [tensor], src)
        r = _Recv(work, src, int(tag), tensor)
        with self.cv:
            if self.closing:
                raise RuntimeError(f"epx backend: {what}: rank {self.me}: the group was destroyed")
            if src is not None and src in self.broken:
                raise self.broken[src]
            hit = next((s for s in self.stash if r.takes(s.src, s.tag) and s.taker is None), None)
            if hit is not None:
                self.stash.remove(hit)
                if not hit.ready:
                    hit.taker = r
            else:
                self.posted.append(r)
                for p in ([src] if src is not None else range(self.P)):
                    if p not in self.broken and p != self.me:
                        self._thread(self.receivers, p, self._recv_loop)
                self.cv.notify_all()
        if hit is not None and hit.ready:
            self._deliver(r, hit.src, hit.data.numel(), hit.code, hit.data)
        return work

    def cancel(self, work):
        """Withdraws a posted receive that no message matched yet (True if it was withdrawn)."""
        with self.cv:
            for r in self.posted:
                if r.work is work:
                    self.posted.remove(r)
                    return True
        return False

    def close(self):
        """Local: the threads stop. Each peer whose pair is idle gets a close message, which ends
        a receive thread of that peer still waiting for this rank (an any-source receive's)."""
        with self.cv:
            self.closing = True
            self.cv.notify_all()
            idle = [d for d in range(self.P) if d != self.me and not self.queues.get(d) and d not in self.busy
                    and d not in self.broken]
        head = torch.tensor([0, 0, 0, _CLOSE], dtype=torch.int64)
        for d in idle:
            try:
                # a sender thread still inside a send to a lost peer holds the lock for up to
                # the timeout: a close message is not worth waiting for that
                if self.pp.in_flight(d) < _INFLIGHT and self.send_lock.acquire(timeout=0.5):
                    try:
                        self.pp.send(head.data_ptr(), _HEAD, d)
                    finally:
                        self.send_lock.release()
            except RuntimeError:
                pass
        deadline = time.monotonic() + 2.0  # a receive thread still waiting ends with its peer's close
        for table in (self.senders, self.receivers):
            for t in list(table.values()):
                t.join(timeout=max(0.0, deadline - time.monotonic()))
        with self.cv:
            pending = [r for r in self.posted]
            self.posted = []
        for r in pending:
            r.work._finish(RuntimeError(f"epx backend: recv: rank {self.me}: the group was destroyed before a "
                                        f"message matched"))

