"""The driver's CurveZMQ authenticator (ZAP, RFC 27): started and proven to serve before a secured socket binds,
stopped within a time limit, its endpoint free again when stop() returns.

pyzmq's ThreadAuthenticator answers ZAP requests in a thread of its own. Its start() returns once that thread
runs, not once it answers; its stop() waits for the thread without a limit. Here the driver sends the
authenticator one ZAP request of its own and binds only after the answer (so the first client is judged by a
handler that serves, with the authorised keys loaded), and stopping waits at most a given time.
"""
from __future__ import annotations

import logging
import os

import zmq
from zmq.utils import z85

ZAP_ENDPOINT = "inproc://zeromq.zap.01"     # ZeroMQ's fixed endpoint of a context's ZAP handler
READY_S = 10.0          # s the authenticator may take to answer its first request
STOP_S = 5.0            # s its thread may take to end
_log = logging.getLogger(__name__)


class AuthenticatorError(RuntimeError):
    """The authenticator could not be started; the message says why."""


def start(ctx: zmq.Context, authorized_clients_dir: str, server_public: bytes, ready_s: float = READY_S):
    """A ThreadAuthenticator on `ctx` that admits the clients whose public certificates (*.key) are in
    authorized_clients_dir, returned once it has answered a ZAP request (within ready_s seconds) that presents
    `server_public` (Z85, as zmq.auth.load_certificate returns it) as a client's key.

    Raises AuthenticatorError (the authenticator stopped again) when it cannot bind its endpoint (another
    authenticator serves this context), does not start, or does not answer in time."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    try:
        auth.start()
        auth.configure_curve(domain="*", location=os.fspath(authorized_clients_dir))
        _probe(ctx, server_public, ready_s)
    except (zmq.ZMQError, RuntimeError) as exc:
        stop(auth)
        raise AuthenticatorError(f"the CurveZMQ authenticator did not start: {exc}") from None
    return auth


def _probe(ctx: zmq.Context, key: bytes, ready_s: float) -> None:
    """One ZAP request (CURVE, `key`) to the context's handler; RuntimeError when no answer comes in ready_s."""
    req = ctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    try:
        req.connect(ZAP_ENDPOINT)
        if not req.poll(int(ready_s * 1000), zmq.POLLOUT):
            raise RuntimeError(f"its endpoint {ZAP_ENDPOINT} took no request within {ready_s:g} s")
        req.send_multipart([b"1.0", b"armid-ready", b"", b"127.0.0.1", b"", b"CURVE", z85.decode(key)],
                           zmq.NOBLOCK)
        if not req.poll(int(ready_s * 1000)):
            raise RuntimeError(f"it did not answer a request within {ready_s:g} s")
        req.recv_multipart(zmq.NOBLOCK)
    finally:
        req.close(0)


def stop(auth, timeout_s: float = STOP_S) -> None:
    """Stop the authenticator's thread (waiting at most timeout_s; one that does not end is logged and left,
    a daemon thread) and close its sockets."""
    thread, pipe = auth.thread, auth.pipe
    if pipe is not None:
        try:
            pipe.send(b"TERMINATE", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
    ended = True
    if thread is not None:
        thread.join(timeout_s)
        ended = not thread.is_alive()
        if not ended:
            _log.error("the CurveZMQ authenticator's thread did not end within %g s; left running", timeout_s)
    if ended and auth.zap_socket is not None:
        try:                    # at once: a closed socket's endpoint is freed later, and a new authenticator
            auth.zap_socket.unbind(ZAP_ENDPOINT)    # on this context (a restarted driver) could not bind
        except zmq.ZMQError:
            pass
    auth.thread = None          # so that pyzmq's stop() below neither signals nor waits again
    if pipe is not None:
        pipe.close(0)
        auth.pipe = None
    auth.stop()
