"""Copy one key from one torch TCPStore to another, speaking its wire protocol: what any local
user can do to a job's rendezvous store with no torch, no token and no ttmesh.

Run as a program (``python rawstore.py SRC_PORT DST_PORT KEY``, both stores on 127.0.0.1): a
test hands its source to another user's Python. The protocol is torch 2.13's (the client in
torch/csrc/distributed/c10d/TCPStore.cpp, the query types of TCPStoreBackend.hpp): a 1-byte
query type, integers little-endian, a string or value as its 8-byte length and its bytes; a
client validates with a magic number and pings; every key carries TCPStore's "/" prefix.
"""

import socket
import struct
import sys

VALIDATE, SET, GET, CHECK, PING = 0, 1, 3, 5, 13
MAGIC = 0x3C85F7CE


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError("the store closed the connection")
        out += chunk
    return out


def _text(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(struct.pack("<BI", VALIDATE, MAGIC) + struct.pack("<BI", PING, 4242))
    if struct.unpack("<I", _read(sock, 4))[0] != 4242:
        raise RuntimeError("not a TCPStore")
    return sock


def get(sock: socket.socket, key: str) -> bytes:
    sock.sendall(struct.pack("<B", GET) + _text(b"/" + key.encode()))
    return _read(sock, struct.unpack("<Q", _read(sock, 8))[0])


def put(sock: socket.socket, key: str, value: bytes) -> None:
    sock.sendall(struct.pack("<B", SET) + _text(b"/" + key.encode()) + _text(value))
    # A SET has no answer: a CHECK after it is answered once the store has it.
    sock.sendall(struct.pack("<BQ", CHECK, 1) + _text(b"/" + key.encode()))
    if _read(sock, 1) != b"\x00":
        raise RuntimeError(f"{key} was not set")


if __name__ == "__main__":
    source, target, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    put(connect(target), key, get(connect(source), key))
    print("copied", key)
