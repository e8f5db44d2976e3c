"""Bounded waiting for the tests: poll a predicate until it holds or a deadline passes."""
from __future__ import annotations

import time
from typing import Callable


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, step: float = 0.002) -> bool:
    """True as soon as predicate() is true, False once timeout (s) has passed without it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False
