"""The ranks' key-value store, served by rank 0 only to processes that know the run's secret.

    server = StoreServer(secret, "127.0.0.1", 0, on_refused=print)      # rank 0
    conn = connect(secret, "127.0.0.1", server.port, deadline)         # every rank (runtime/ranks/rendezvous.py)
    call(conn, b"set", b"key", b"value"); call(conn, b"get", b"key", b"30000")   # -> [b"ok", b"value"]

torch's TCPStore serves anyone who reaches its port: it listens on every interface whatever host it is given
(``*:PORT``, seen with ``ss -ltn`` on torch 2.13), has no authentication, and lists its keys to any client
(``LIST_KEYS``, torch/csrc/distributed/c10d/TCPStoreBackend.hpp). A stranger who connects can read the run's
keys, write its own, or join as a missing rank. This store does what process-group setup needs (set, get,
add, compare_set, check, wait, delete, num_keys, append, multi_get/set) and nothing before a handshake:

    server -> client   MAGIC, server nonce (32 random bytes)
    client -> server   MAGIC, client nonce, HMAC-SHA256(secret, "client" + both nonces)
    server -> client   HMAC-SHA256(secret, "server" + both nonces)

so each side proves it knows the secret without sending it, and a recorded exchange is worthless for another
connection (fresh nonces). A peer that sends anything else is refused: its address goes to ``on_refused``
(the worker ends the run with one line naming it, runtime/ranks/worker.py); a connection that closes without a word
(a port scan) is only closed. Messages are frames of byte strings (a count, then a length and the bytes of
each), at most ``MAX_FRAME`` bytes, read only from authenticated peers. No pickles: values are bytes.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
import time

MAGIC = b"distlab-store/1\n"
NONCE = 32
MAC = 32
HANDSHAKE_S = 10.0               # a peer has this long to authenticate
MAX_FRAME = 64 << 20             # bytes in one message (gloo's and NCCL's entries are bytes to kilobytes)


class StoreError(ConnectionError):
    """The store cannot be reached, or it (or a peer) broke the protocol."""


def mac(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secret, role + server_nonce + client_nonce, hashlib.sha256).digest()


def address(addr) -> str:
    """``host:port`` of a socket address (IPv6 in brackets)."""
    host, port = addr[0], addr[1]
    host = host.removeprefix("::ffff:")          # an IPv4 peer of a dual-stack socket
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- framing -----------------------------------------------------------------------------------------------------
def recv_exact(sock, n: int, expect: bytes = b"") -> bytes:
    """``n`` bytes; with ``expect``, fail as soon as the bytes so far are not its prefix (no waiting for the rest
    from a peer that speaks another protocol)."""
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise StoreError(f"connection closed after {len(buf)} of {n} bytes" if buf else "connection closed")
        buf += chunk
        if expect and not expect.startswith(buf[:len(expect)]):
            raise StoreError("not distlab's store protocol")
    return buf


def send(sock, *parts: bytes) -> None:
    sock.sendall(struct.pack("!I", len(parts)) + b"".join(struct.pack("!I", len(p)) + p for p in parts))


def recv(sock) -> list[bytes]:
    (count,) = struct.unpack("!I", recv_exact(sock, 4))
    parts, total = [], 0
    for _ in range(count):
        (size,) = struct.unpack("!I", recv_exact(sock, 4))
        total += size + 4
        if total > MAX_FRAME:
            raise StoreError(f"a message over {MAX_FRAME} bytes")
        parts.append(recv_exact(sock, size))
    return parts


def connect(secret: bytes, host: str, port: int, deadline: float) -> socket.socket:
    """A socket to the store at host:port, both sides authenticated; retried (the server may not listen yet)
    until ``deadline`` (time.monotonic())."""
    where = address((host, port))
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(0.1, min(HANDSHAKE_S, deadline - time.monotonic())))
            break
        except OSError as e:
            if time.monotonic() >= deadline:
                raise StoreError(f"cannot reach the run's store at {where}: {e.strerror or e}") from None
            time.sleep(0.05)
    try:
        server_nonce = recv_exact(sock, len(MAGIC) + NONCE, MAGIC)[len(MAGIC):]
        client_nonce = os.urandom(NONCE)
        sock.sendall(MAGIC + client_nonce + mac(secret, b"client", server_nonce, client_nonce))
        proof = recv_exact(sock, MAC)
    except (OSError, StoreError) as e:
        sock.close()
        raise StoreError(f"the run's store at {where} refused this rank (is DISTLAB_RUN_SECRET the same on every "
                         f"node?): {e}") from None
    if not hmac.compare_digest(proof, mac(secret, b"server", server_nonce, client_nonce)):
        sock.close()
        raise StoreError(f"the program at {where} does not know this run's secret: not the run's store")
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def call(sock, *parts: bytes) -> list[bytes]:
    send(sock, *parts)
    return recv(sock)


# -- the server (rank 0) -----------------------------------------------------------------------------------------
class StoreServer:
    """Rank 0's store on (host, port) (port 0: any free one, then ``.port``). ``on_refused(address, reason)`` is
    called, from the connection's thread, for each peer refused."""

    def __init__(self, secret: bytes, host: str, port: int, on_refused=None):
        self.secret, self.on_refused = secret, on_refused
        if host in ("", "::") and socket.has_dualstack_ipv6():
            self.listener = socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=512)
        else:
            self.listener = socket.create_server((host or "0.0.0.0", port), backlog=512)
        self.port = self.listener.getsockname()[1]
        self.data: dict[bytes, bytes] = {}
        self.cond = threading.Condition()
        self.refused: list[tuple[str, str]] = []
        threading.Thread(target=self._accept, daemon=True, name="distlab-store").start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self.listener.accept()
            except OSError:
                return                                  # closed
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True, name="distlab-store-peer").start()

    def _refuse(self, conn, addr, reason: str) -> None:
        conn.close()
        self.refused.append((address(addr), reason))
        if self.on_refused is not None:
            self.on_refused(address(addr), reason)

    def _serve(self, conn, addr) -> None:
        conn.settimeout(HANDSHAKE_S)
        server_nonce = os.urandom(NONCE)
        try:
            conn.sendall(MAGIC + server_nonce)
            first = conn.recv(1)
        except OSError:
            first = b""
        if not first:
            conn.close()                                # connected and left without a word: nothing to refuse
            return
        try:
            if first != MAGIC[:1]:
                return self._refuse(conn, addr, "it did not present this run's secret (it spoke another protocol)")
            head = first + recv_exact(conn, len(MAGIC) + NONCE + MAC - 1, MAGIC[1:])
        except (OSError, StoreError) as e:
            return self._refuse(conn, addr, f"it did not present this run's secret ({e})")
        client_nonce, proof = head[len(MAGIC):len(MAGIC) + NONCE], head[len(MAGIC) + NONCE:]
        if not head.startswith(MAGIC) or not hmac.compare_digest(proof, mac(self.secret, b"client", server_nonce,
                                                                              client_nonce)):
            return self._refuse(conn, addr, "it did not present this run's secret")
        try:
            conn.sendall(mac(self.secret, b"server", server_nonce, client_nonce))
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                send(conn, *self._handle(recv(conn)))
        except (OSError, StoreError, ValueError, IndexError):
            conn.close()                                # the rank left (or broke the protocol)

    def _wait(self, keys, timeout_ms: bytes) -> bool:
        """Wait until every key is set; a timeout of 0 is c10d's kNoTimeout (wait as long as it takes)."""
        ms = int(timeout_ms)
        return self.cond.wait_for(lambda: all(k in self.data for k in keys), ms / 1000 if ms > 0 else None)

    def _handle(self, parts: list[bytes]) -> list[bytes]:
        op, args = parts[0], parts[1:]
        d = self.data
        with self.cond:
            if op == b"set":
                d[args[0]] = args[1]
                self.cond.notify_all()
                return [b"ok"]
            if op == b"get":                            # key, timeout (ms)
                return [b"ok", d[args[0]]] if self._wait(args[:1], args[1]) else [b"timeout"]
            if op == b"mget":                           # timeout, keys...
                return [b"ok", *(d[k] for k in args[1:])] if self._wait(args[1:], args[0]) else [b"timeout"]
            if op == b"wait":                           # timeout, keys...
                return [b"ok"] if self._wait(args[1:], args[0]) else [b"timeout"]
            if op == b"add":
                d[args[0]] = str(int(d.get(args[0], b"0")) + int(args[1])).encode()
                self.cond.notify_all()
                return [b"ok", d[args[0]]]
            if op == b"cas":                            # key, expected, desired: torch's compareSet rules
                key, expected, desired = args
                if key not in d:
                    if expected:
                        return [b"ok", expected]
                    d[key] = desired
                elif d[key] == expected:
                    d[key] = desired
                self.cond.notify_all()
                return [b"ok", d[key]]
            if op == b"append":
                d[args[0]] = d.get(args[0], b"") + args[1]
                self.cond.notify_all()
                return [b"ok"]
            if op == b"mset":
                d.update(zip(args[0::2], args[1::2]))
                self.cond.notify_all()
                return [b"ok"]
            if op == b"check":
                return [b"ok", b"1" if all(k in d for k in args) else b"0"]
            if op == b"del":
                return [b"ok", b"1" if d.pop(args[0], None) is not None else b"0"]
            if op == b"num":
                return [b"ok", str(len(d)).encode()]
        return [b"error", b"unknown operation " + op[:40]]
