"""Ports and readiness probes for the brokers kdiv starts on this machine.

The probes speak raw Kafka requests over a blocking socket, so they work from sync code
and from inside a running event loop alike (a broker is often started from async tests).
"""

from __future__ import annotations

import errno
import socket
import struct
import subprocess

_PROBE_TIMEOUT_S = 1.0
_PROBE_CORRELATION_ID = 0x6B646976
_PROBE_CLIENT_ID = b"kdiv-devbroker"
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

# ApiVersions v0 (API key 18): the request every Kafka client sends first.
_API_VERSIONS_KEY = 18
# Metadata v4 (API key 3): the oldest version Kafka 4 still answers that carries the cluster id.
_METADATA_KEY = 3
_METADATA_VERSION = 4
# FindCoordinator v2 (API key 10): not flexible yet, and answered by Kafka 4.
_FIND_COORDINATOR_KEY = 10
_FIND_COORDINATOR_VERSION = 2


class BrokerError(RuntimeError):
    """A development broker could not be found, installed or started."""


def wait_or_kill(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Wait up to `timeout` for a signalled broker process to exit, then SIGKILL it and reap it."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def host_for_address(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def socket_family(host: str, port: int) -> socket.AddressFamily:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise BrokerError(f"cannot resolve the broker host {host!r}: {exc}") from exc


def ensure_port_free(host: str, port: int) -> None:
    with socket.socket(socket_family(host, port), socket.SOCK_STREAM) as probe:
        # The option brokers' listeners use, so TIME_WAIT leftovers of a stopped broker
        # count as free, as they are for the broker.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise BrokerError(
                    f"port {port} on {host} is already in use; stop whatever listens there "
                    "(another broker?) or pick another port (0 picks a free one)"
                ) from None
            raise BrokerError(f"cannot listen on {host}:{port}: {exc}") from exc


def free_port(host: str) -> int:
    with socket.socket(socket_family(host, 0), socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def answers_kafka_api_versions(host: str, port: int) -> bool:
    """True once a broker on host:port answers ApiVersions: it is ready for clients."""
    response = _request(host, port, _API_VERSIONS_KEY, 0, b"")
    if response is None or len(response) < 2:
        return False
    (error_code,) = _INT16.unpack_from(response)
    return error_code == 0


def live_brokers(host: str, port: int) -> tuple[str | None, list[int]] | None:
    """(cluster id, ids of the brokers the cluster serves with) as the broker on host:port
    sees them, or None while it does not answer. KRaft lists only unfenced brokers, so a
    cluster is ready for clients once every node is listed."""
    no_topics_named = _INT32.pack(-1)  # null: every topic; a fresh cluster has none to list
    allow_auto_topic_creation = b"\x00"
    response = _request(host, port, _METADATA_KEY, _METADATA_VERSION, no_topics_named + allow_auto_topic_creation)
    if response is None:
        return None
    try:
        _throttle_ms, count = struct.unpack_from(">ii", response)
        position = 8
        node_ids = []
        for _ in range(count):
            node_id, host_length = struct.unpack_from(">ih", response, position)
            position += 6 + host_length + 4  # node id, host, port
            (rack_length,) = _INT16.unpack_from(response, position)
            position += 2 + max(rack_length, 0)
            node_ids.append(node_id)
        (cluster_id_length,) = _INT16.unpack_from(response, position)
        position += 2
        cluster_id = response[position : position + cluster_id_length].decode() if cluster_id_length >= 0 else None
    except (struct.error, UnicodeDecodeError):
        return None  # a truncated or foreign answer: not a ready Kafka broker
    return cluster_id, sorted(node_ids)


def group_coordinator_ready(host: str, port: int) -> bool:
    """True once the broker on host:port names a coordinator for consumer groups.

    The first FindCoordinator of a new cluster makes it create its offsets topic; until
    that is done every group join fails with GroupCoordinatorNotAvailable, which clients
    retry but log as errors. A broker is ready for groups once this answers.
    """
    group = b"kdiv-readiness"
    body = struct.pack(">h", len(group)) + group + b"\x00"  # key, key type 0: a group
    response = _request(host, port, _FIND_COORDINATOR_KEY, _FIND_COORDINATOR_VERSION, body)
    if response is None or len(response) < 6:
        return False
    _throttle_ms, error_code = struct.unpack_from(">ih", response)
    return error_code == 0


def _request(host: str, port: int, api_key: int, api_version: int, body: bytes) -> bytes | None:
    """One request over a fresh connection; the response body, or None when no answer came."""
    header = struct.pack(">hhih", api_key, api_version, _PROBE_CORRELATION_ID, len(_PROBE_CLIENT_ID))
    request = header + _PROBE_CLIENT_ID + body
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S) as conn:
            conn.sendall(_INT32.pack(len(request)) + request)
            (size,) = _INT32.unpack(_recv_exactly(conn, _INT32.size))
            response = _recv_exactly(conn, size)
    except OSError:
        return None  # not listening yet, or the connection dropped: not ready
    if len(response) < _INT32.size or _INT32.unpack_from(response)[0] != _PROBE_CORRELATION_ID:
        return None
    return response[_INT32.size :]


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = conn.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks += chunk
    return bytes(chunks)
