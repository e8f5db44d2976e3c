"""The driver's CurveZMQ authenticator serves before anything binds, admits the authorised keys on the first
connection, refuses others, and stops within its time limit."""
from __future__ import annotations

import os
import threading

import pytest
import zmq
import zmq.auth

from driver import authenticator


@pytest.fixture
def keys(tmp_path):
    made, authorised = tmp_path / "keys", tmp_path / "authorised"
    made.mkdir()
    authorised.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(made, "server")
    client_public, client_secret = zmq.auth.create_certificates(made, "client")
    _, stranger_secret = zmq.auth.create_certificates(made, "stranger")
    os.replace(client_public, authorised / "client.key")
    return {"server": zmq.auth.load_certificate(server_secret), "client": zmq.auth.load_certificate(client_secret),
            "stranger": zmq.auth.load_certificate(stranger_secret), "authorised": str(authorised)}


def _handshake(ctx: zmq.Context, endpoint: str, server_public: bytes, pair: tuple[bytes, bytes],
               wait_s: float = 5.0) -> bool:
    """True when a REQ with these keys completes its handshake within wait_s (IMMEDIATE: writable only then;
    a refused handshake ends the connection for good)."""
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.setsockopt(zmq.IMMEDIATE, 1)
    req.curve_serverkey, (req.curve_publickey, req.curve_secretkey) = server_public, pair
    req.connect(endpoint)
    try:
        return bool(req.poll(int(wait_s * 1000), zmq.POLLOUT))
    finally:
        req.close(0)


def test_a_server_bound_right_after_start_admits_the_authorised_key_on_its_first_connection(keys):
    """Bound the moment start() returns, the secured socket judges the very first handshake with the
    authorised keys loaded: repeated on fresh contexts, the client is admitted every time; a stranger is
    not."""
    public, secret = keys["server"]
    for k in range(10):
        ctx = zmq.Context()
        auth = authenticator.start(ctx, keys["authorised"], public)
        try:
            server = ctx.socket(zmq.ROUTER)
            server.setsockopt(zmq.LINGER, 0)
            server.curve_secretkey, server.curve_publickey, server.curve_server = secret, public, True
            port = server.bind_to_random_port("tcp://127.0.0.1")
            endpoint = f"tcp://127.0.0.1:{port}"
            assert _handshake(ctx, endpoint, public, keys["client"])
            if k == 0:
                assert not _handshake(ctx, endpoint, public, keys["stranger"], wait_s=1.0)
            server.close(0)
        finally:
            authenticator.stop(auth)
            ctx.destroy(linger=0)


def test_a_context_whose_zap_endpoint_is_taken_is_refused_by_name_and_nothing_is_left_running(keys):
    ctx = zmq.Context()
    squatter = ctx.socket(zmq.REP)           # a handler that never answers, bound first
    squatter.bind(authenticator.ZAP_ENDPOINT)
    before = threading.active_count()
    try:
        with pytest.raises(authenticator.AuthenticatorError, match="authenticator did not start: .*in use"):
            authenticator.start(ctx, keys["authorised"], keys["server"][0])
        assert threading.active_count() == before
    finally:
        squatter.close(0)
        ctx.destroy(linger=0)


def test_stop_ends_the_thread_and_frees_the_endpoint_for_the_next_authenticator_at_once(keys):
    """A restarted driver starts a new authenticator on the same context right after stopping the old one."""
    ctx = zmq.Context()
    try:
        for _ in range(5):
            auth = authenticator.start(ctx, keys["authorised"], keys["server"][0])
            thread = auth.thread
            authenticator.stop(auth, timeout_s=5.0)
            assert not thread.is_alive()
            authenticator.stop(auth)                                # again: nothing to do
    finally:
        ctx.destroy(linger=0)
