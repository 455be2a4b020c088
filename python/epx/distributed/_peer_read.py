"""One copy on one machine: a rank reads its pieces straight out of its peers' own tensors.

The window paths copy every byte twice: the sender into the shared window, the receiver out
of it into its tensor. Where every rank of a group runs on this kernel in one pid namespace,
Linux's cross-memory attach (process_vm_readv) lets a receiver copy from the sender's tensor
into its own: one copy, made by the receiver, in parallel on every rank. A call then is: one
small all_gather of every rank's addresses and sizes (which also checks the ranks' arguments
against each other, so a mismatch raises on every rank before anything moves), the reads, and
one small all_gather of each rank's outcome (the senders' tensors must stay as they are until
every reader is done; a failed read raises on every rank).

Whether the group can is agreed at its first such call: every rank publishes its pid, host
name, pid namespace, boot id and a random 16-byte word, reads each peer's word back, and the
reads are used only if every rank read every word right (ranks on other machines, in other
pid namespaces or with another host name — the transports' notion of a machine — fail that:
the window paths and the network transport serve them). EPX_DIST_PEER_READ=0 in the
environment when a group first needs it turns it off for that group.
"""
import ctypes
import errno
import os
import secrets
import socket
import zlib

import torch

from ._agree import _Agreements



class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_libc = ctypes.CDLL(None, use_errno=True)  # a CDLL call releases the GIL
_readv = getattr(_libc, "process_vm_readv", None)
if _readv is not None:
    _readv.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                       ctypes.c_ulong]
    _readv.restype = ctypes.c_ssize_t


def read_from(pid, remote, local, nbytes):
    """Copies nbytes at address `remote` of process `pid` to address `local` of this one;
    OSError (errno's) if the kernel refuses or the peer is gone."""
    done = 0
    while done < nbytes:
        loc, rem = _Iovec(local + done, nbytes - done), _Iovec(remote + done, nbytes - done)
        n = _readv(pid, ctypes.byref(loc), 1, ctypes.byref(rem), 1, 0)
        if n < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))
        if n == 0:
            raise OSError(errno.EIO, "process_vm_readv moved nothing")
        done += n


def _boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return int(f.read().strip().replace("-", "")[:15], 16)
    except OSError:
        return 0


class _PeerReads(_Agreements):
    """Mixin of ProcessGroupEpx: whether the group reads from its peers, and the reads."""

    def _peer_pids(self):
        """The peers' pids if this group reads from its peers, else None (collective on first use)."""
        state = self.__dict__.get("_peer_read_state")
        if state is None:
            state = self._agree_peer_reads()
            self._peer_read_state = state
        return state[0]

    def _agree_peer_reads(self):
        P, me = self._size, self._rank
        word = torch.tensor([secrets.randbits(62), secrets.randbits(62)], dtype=torch.int64)
        ns = os.stat("/proc/self/ns/pid").st_ino if os.path.exists("/proc/self/ns/pid") else 0
        host = zlib.crc32(socket.gethostname().encode())
        recs = self._records("peer read setup", [os.getpid(), host, ns, _boot_id(), word.data_ptr(), *word.tolist()])
        ok = os.environ.get("EPX_DIST_PEER_READ", "1") != "0" and _readv is not None and P > 1
        back = torch.zeros(2, dtype=torch.int64)
        for r, (pid, r_host, r_ns, r_boot, addr, w0, w1) in enumerate(recs):
            if not ok:
                break
            if r == me:
                continue
            ok = recs[me][1:4] == [r_host, r_ns, r_boot]
            if ok:
                try:
                    read_from(pid, addr, back.data_ptr(), 16)
                    ok = back.tolist() == [w0, w1]
                except OSError:
                    ok = False
        agreed = all(v for v, in self._records("peer read setup", [int(ok)]))
        # the word stays alive with the group: a late peer's probe may still read it
        return ([r[0] for r in recs] if agreed else None), word

    def _read_pieces(self, op, pids, pieces):
        """pieces: (source rank, its address, the local uint8 tensor to fill), read in turn;
        the first failure as an error naming the source (for _settle), or None."""
        for src, addr, dst in pieces:
            if dst.numel() == 0:
                continue
            try:
                read_from(pids[src], addr, dst.data_ptr(), dst.numel())
            except OSError as e:
                return RuntimeError(f"epx backend: {op}: rank {self._rank} could not read {dst.numel()} bytes from "
                                    f"rank {src} (pid {pids[src]}): {e}")
        return None
