"""VXI-11 for the emulated instruments that offer it (the Keysight N77xx meters): the
transport Keysight's own tools address them by, ``TCPIP0::<host>::inst0::INSTR``.

VXI-11 (VXIbus Consortium, "TCP/IP Instrument Protocol Specification", rev. 1.0) is ONC RPC
(RFC 5531) over TCP, records marked as RFC 5531 section 11 says, arguments in XDR (RFC 4506):

- the core channel, program 0x0607AF version 1: create_link, device_write (the message in
  pieces, the last flagged END), device_read (the reply, END on its last piece), device_readstb,
  device_clear, trigger, remote, local, lock, unlock, enable_srq, docmd (not supported, as on
  most instruments), destroy_link, create/destroy_intr_chan (not supported: no SRQ channel);
- the port mapper (program 100000 version 2, RFC 1833), which a client asks for the core
  channel's port. It must listen on port 111, so it is served only where that can be bound
  (as root, one per loopback address). pyvisa-py can skip it:
  ``TCPIP0::127.0.0.1,<port>::inst0::INSTR`` names the core port itself.

Each link has its own input and output buffers, as a real instrument's; the SCPI device behind
them is the same one the raw socket serves (its error queue and settings are shared, as an
instrument's are between its LAN sessions). A read with no reply pending waits the client's
io_timeout and answers io_timeout, as an instrument does after a query that failed."""

from __future__ import annotations

import itertools
import socketserver
import struct
import threading
import time

from lumion_hil.instruments.emulators.scpi_transports import ThreadingServer

DEVICE_CORE_PROG, DEVICE_CORE_VERS = 0x0607AF, 1
PMAP_PROG, PMAP_VERS, PMAP_PORT = 100000, 2, 111
IPPROTO_TCP = 6

# device_error codes (VXI-11 B.5.2)
NO_ERROR, SYNTAX_ERROR, NOT_ACCESSIBLE, INVALID_LINK = 0, 1, 3, 4
PARAMETER_ERROR, NOT_SUPPORTED, IO_TIMEOUT, IO_ERROR = 5, 8, 15, 17
NO_LOCK_HELD, LOCKED_BY_ANOTHER = 12, 11
# device_read reasons and flags
RX_REQCNT, RX_CHR, RX_END = 1, 2, 4
OP_FLAG_END, OP_FLAG_TERMCHAR_SET = 8, 128
MAX_RECV = 1 << 20


class _Xdr:
    """Just the XDR this protocol uses: reading."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def uint(self) -> int:
        (value,) = struct.unpack_from(">I", self.data, self.pos)
        self.pos += 4
        return value

    def int(self) -> int:
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def opaque(self) -> bytes:
        n = self.uint()
        value = self.data[self.pos:self.pos + n]
        self.pos += (n + 3) & ~3
        return value


def _uint(v: int) -> bytes:
    return struct.pack(">I", v & 0xFFFFFFFF)


def _int(v: int) -> bytes:
    return struct.pack(">i", v)


def _opaque(b: bytes) -> bytes:
    return _uint(len(b)) + b + b"\0" * ((4 - len(b) % 4) % 4)


def _read_record(rfile) -> bytes | None:
    """One RPC record (its fragments joined); None when the client has gone."""
    parts = []
    while True:
        head = rfile.read(4)
        if len(head) < 4:
            return None
        (mark,) = struct.unpack(">I", head)
        body = rfile.read(mark & 0x7FFFFFFF)
        parts.append(body)
        if mark & 0x80000000:
            return b"".join(parts)


def _reply(xid: int, accept_stat: int, results: bytes = b"") -> bytes:
    # REPLY, MSG_ACCEPTED, a null verifier, the accept status, the results; one last fragment.
    body = _uint(xid) + _uint(1) + _uint(0) + _uint(0) + _uint(0) + _uint(accept_stat) + results
    return _uint(0x80000000 | len(body)) + body


class _RpcHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while True:
            record = _read_record(self.rfile)
            if record is None:
                return
            call = _Xdr(record)
            try:
                xid, msg_type, rpcvers = call.uint(), call.uint(), call.uint()
                prog, vers, proc = call.uint(), call.uint(), call.uint()
                call.uint(), call.opaque(), call.uint(), call.opaque()  # credential, verifier
            except struct.error:
                return  # not RPC: nothing sensible to answer
            if msg_type != 0 or rpcvers != 2:
                continue
            answer = self.server.serve_call(prog, vers, proc, call, self)  # type: ignore[attr-defined]
            accept, results = answer if isinstance(answer, tuple) else (0, answer)
            try:
                self.wfile.write(_reply(xid, accept, results))
                self.wfile.flush()
            except (BrokenPipeError, ConnectionError):
                return


class _Link:
    def __init__(self, lid: int, device: str):
        self.lid, self.device = lid, device
        self.incoming = bytearray()
        self.outgoing = b""


class Vxi11Server:
    """Serve ``device`` (a ScpiDevice) over VXI-11's core channel on ``host``; with
    ``portmapper`` (True: try, and do without where port 111 cannot be bound) answer the port
    mapper on ``host``:111 too."""

    def __init__(self, device, host: str = "127.0.0.1", port: int = 0, portmapper: bool = True):
        self.device, self.host = device, host
        self._links: dict[int, _Link] = {}
        self._lock = threading.Lock()
        self._lids = itertools.count(1)
        self._locked_by: int | None = None
        self._core = ThreadingServer((host, port), _RpcHandler)
        self._core.serve_call = self._core_call  # type: ignore[attr-defined]
        self._pmap: ThreadingServer | None = None
        if portmapper:
            try:
                self._pmap = ThreadingServer((host, PMAP_PORT), _RpcHandler)
                self._pmap.serve_call = self._pmap_call  # type: ignore[attr-defined]
            except OSError:  # not root, or a port mapper (rpcbind) already there
                self._pmap = None
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return self._core.server_address[1]

    @property
    def resource(self) -> str:
        """The VISA resource string: the standard one where the port mapper is served here,
        else pyvisa-py's form that names the core port."""
        return f"TCPIP0::{self.host}::inst0::INSTR" if self._pmap else f"TCPIP0::{self.host},{self.port}::inst0::INSTR"

    def start(self) -> "Vxi11Server":
        for server in filter(None, (self._core, self._pmap)):
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                                      name=f"vxi11-{self.device.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in filter(None, (self._core, self._pmap)):
            server.shutdown()
            server.server_close()

    # -- the port mapper ---------------------------------------------------------------------

    def _pmap_call(self, prog, vers, proc, args: _Xdr, handler):
        if prog != PMAP_PROG:
            return 1, b""  # PROG_UNAVAIL
        if proc == 0:  # NULL
            return b""
        if proc == 3:  # GETPORT(prog, vers, prot, port)
            want, want_vers, prot = args.uint(), args.uint(), args.uint()
            ok = want == DEVICE_CORE_PROG and want_vers == DEVICE_CORE_VERS and prot == IPPROTO_TCP
            return _uint(self.port if ok else 0)
        if proc == 4:  # DUMP: one mapping
            return _uint(1) + _uint(DEVICE_CORE_PROG) + _uint(DEVICE_CORE_VERS) + _uint(IPPROTO_TCP) + \
                _uint(self.port) + _uint(0)
        return 3, b""  # PROC_UNAVAIL

    # -- the core channel --------------------------------------------------------------------

    def _core_call(self, prog, vers, proc, args: _Xdr, handler):
        if prog != DEVICE_CORE_PROG:
            return 1, b""
        if vers != DEVICE_CORE_VERS:
            return 2, _uint(DEVICE_CORE_VERS) + _uint(DEVICE_CORE_VERS)  # PROG_MISMATCH (low, high)
        if proc == 0:
            return b""
        method = {10: self._create_link, 11: self._write, 12: self._read, 13: self._readstb, 14: self._generic,
                  15: self._clear, 16: self._generic, 17: self._generic, 18: self._lock_device, 19: self._unlock,
                  20: self._enable_srq, 22: self._docmd, 23: self._destroy_link, 25: self._no_intr_chan,
                  26: self._no_intr_chan}.get(proc)
        if method is None:
            return 3, b""
        return method(args)

    def _link(self, lid: int) -> _Link | None:
        with self._lock:
            return self._links.get(lid)

    def _create_link(self, args: _Xdr) -> bytes:
        args.int(), args.uint(), args.uint()  # client id, lock_device, lock_timeout
        name = args.opaque().decode("ascii", "replace")
        if not name.lower().startswith("inst"):
            return _int(NOT_ACCESSIBLE) + _int(0) + _uint(0) + _uint(0)
        lid = next(self._lids)
        with self._lock:
            self._links[lid] = _Link(lid, name)
        return _int(NO_ERROR) + _int(lid) + _uint(0) + _uint(MAX_RECV)

    def _write(self, args: _Xdr) -> bytes:
        lid, _io_timeout, _lock_timeout, flags = args.int(), args.uint(), args.uint(), args.int()
        data = args.opaque()
        link = self._link(lid)
        if link is None:
            return _int(INVALID_LINK) + _uint(0)
        if self._locked_by not in (None, lid):
            return _int(LOCKED_BY_ANOTHER) + _uint(0)
        link.incoming += data
        if flags & OP_FLAG_END:  # the message is whole: the instrument parses it now
            message, link.incoming = bytes(link.incoming), bytearray()
            reply = self.device.handle_line(message.decode("ascii", "replace").strip())
            if reply is not None:
                body = reply if isinstance(reply, bytes) else reply.encode("ascii")
                link.outgoing = body + b"\n"
        return _int(NO_ERROR) + _uint(len(data))

    def _read(self, args: _Xdr) -> bytes:
        lid, request_size, io_timeout_ms = args.int(), args.uint(), args.uint()
        args.uint()  # lock_timeout
        flags, term_char = args.int(), args.int()
        link = self._link(lid)
        if link is None:
            return _int(INVALID_LINK) + _int(0) + _opaque(b"")
        if not link.outgoing:
            time.sleep(io_timeout_ms / 1000)  # nothing will come: the instrument has nothing to say
            return _int(IO_TIMEOUT) + _int(0) + _opaque(b"")
        size = max(1, min(request_size, MAX_RECV))
        chunk = link.outgoing[:size]
        reason = 0
        if flags & OP_FLAG_TERMCHAR_SET and bytes([term_char & 0xFF]) in chunk:
            chunk = chunk[:chunk.index(bytes([term_char & 0xFF])) + 1]
            reason |= RX_CHR
        link.outgoing = link.outgoing[len(chunk):]
        if not link.outgoing:
            reason |= RX_END
        elif len(chunk) == size:
            reason |= RX_REQCNT
        return _int(NO_ERROR) + _int(reason) + _opaque(chunk)

    def _readstb(self, args: _Xdr) -> bytes:
        link = self._link(args.int())
        if link is None:
            return _int(INVALID_LINK) + _uint(0)
        stb = self.device.status_byte() | (16 if link.outgoing else 0)  # MAV: a reply waits to be read
        return _int(NO_ERROR) + _uint(stb)

    def _generic(self, args: _Xdr) -> bytes:  # trigger, remote, local: accepted, nothing to do
        return _int(NO_ERROR if self._link(args.int()) else INVALID_LINK)

    def _clear(self, args: _Xdr) -> bytes:
        """Device clear (IEEE 488.2 5.8): input and output buffers emptied; the error queue and
        settings stay."""
        link = self._link(args.int())
        if link is None:
            return _int(INVALID_LINK)
        link.incoming, link.outgoing = bytearray(), b""
        return _int(NO_ERROR)

    def _lock_device(self, args: _Xdr) -> bytes:
        lid = args.int()
        if self._link(lid) is None:
            return _int(INVALID_LINK)
        with self._lock:
            if self._locked_by not in (None, lid):
                return _int(LOCKED_BY_ANOTHER)
            self._locked_by = lid
        return _int(NO_ERROR)

    def _unlock(self, args: _Xdr) -> bytes:
        lid = args.int()
        with self._lock:
            if self._locked_by != lid:
                return _int(NO_LOCK_HELD)
            self._locked_by = None
        return _int(NO_ERROR)

    def _enable_srq(self, args: _Xdr) -> bytes:
        return _int(NO_ERROR if self._link(args.int()) else INVALID_LINK)

    def _docmd(self, args: _Xdr) -> bytes:
        return _int(NOT_SUPPORTED) + _opaque(b"")

    def _destroy_link(self, args: _Xdr) -> bytes:
        lid = args.int()
        with self._lock:
            gone = self._links.pop(lid, None)
            if self._locked_by == lid:
                self._locked_by = None
        return _int(NO_ERROR if gone else INVALID_LINK)

    def _no_intr_chan(self, args: _Xdr) -> bytes:
        return _int(NOT_SUPPORTED)

