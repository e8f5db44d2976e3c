"""What the user sees while numba compiles: a notice on stderr the first time a kernel is compiled in a
process, then one line per kernel (its name when it starts, its time when it ends).

numba compiles a kernel the first time it is called with new argument types and keeps the machine code in
its cache (`__pycache__` beside the sources, or NUMBA_CACHE_DIR; where the sources' folder is not writable,
numba falls back to a per-user folder, ~/.cache/numba or NUMBA_CACHE_DIR). A later process loads it from
there in milliseconds. So only the first process after an install or an upgrade compiles; `armid warmup`
compiles every kernel once (a deploy step, a container build).

numba announces a compile only when its cache misses (the event "numba:compile"), so the notice appears
exactly when the cache is cold, whatever the reason (fresh install, upgrade, another CPU, a cleared cache).
"""
from __future__ import annotations

import re

import sys
import threading
import time

NOTICE = ("armid: compiling numba kernels for this machine (the first run after an install or an upgrade; "
          "they are cached, later runs load them; `armid warmup` compiles them all at once)")


def _kernel_name(event) -> str:
    data = event.data or {}
    dispatcher = data.get("dispatcher")
    func = getattr(dispatcher, "py_func", None)
    if func is None:
        return "a kernel"
    return f"{func.__module__}.{func.__qualname__}"


class CompileNotice:
    """A numba event listener: the notice once, then `compiling NAME ...` / `compiled NAME in T s` for each
    outermost compile (the functions a kernel calls are compiled within it). `ticker_s` > 0: while one
    kernel compiles longer than that, a `still compiling` line every ticker_s seconds."""

    def __init__(self, stream=None, prefix: str = "armid", ticker_s: float = 15.0):
        self.stream = stream
        self.prefix = prefix
        self.ticker_s = ticker_s
        self.announced = False
        self.compiled: list[tuple[str, float]] = []     # (kernel, seconds) of every outermost compile
        self._depth = 0
        self._started = 0.0
        self._name = ""
        self._done = threading.Event()

    def _print(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            print(text, file=stream, flush=True)
        except (OSError, ValueError):       # stderr closed (a broken pipe): nothing to tell
            pass

    def on_start(self, event) -> None:
        self._depth += 1
        if self._depth != 1:
            return
        if not self.announced:
            self.announced = True
            self._print(NOTICE)
        self._name = _kernel_name(event)
        self._started = time.perf_counter()
        self._print(f"{self.prefix}: compiling {self._name} ...")
        if self.ticker_s > 0:
            self._done = threading.Event()
            threading.Thread(target=self._tick, args=(self._name, self._started, self._done), daemon=True,
                             name="armid-compile-ticker").start()

    def on_end(self, event) -> None:
        self._depth -= 1
        if self._depth != 0:
            return
        self._done.set()
        seconds = time.perf_counter() - self._started
        self.compiled.append((self._name, seconds))
        self._print(f"{self.prefix}: compiled {self._name} in {seconds:.1f} s")

    def _tick(self, name: str, started: float, done: threading.Event) -> None:
        while not done.wait(self.ticker_s):
            self._print(f"{self.prefix}: still compiling {name} ({time.perf_counter() - started:.0f} s)")

    # numba.core.event.Listener's interface (duck-typed: numba is imported only when the listener is installed)
    def notify(self, event) -> None:
        if event.is_start:
            self.on_start(event)
        elif event.is_end:
            self.on_end(event)


_installed: CompileNotice | None = None


def install_notice(stream=None, prefix: str = "armid") -> CompileNotice:
    """Listen for numba's compiles in this process (once; later calls return the same listener)."""
    global _installed
    if _installed is None:
        from numba.core import event

        event.Listener.register(CompileNotice)     # a virtual subclass: numba's register() checks isinstance
        listener = CompileNotice(stream, prefix)
        event.register("numba:compile", listener)
        _installed = listener
    return _installed


def cached_signatures(dispatcher) -> int | None:
    """How many compiled signatures of a numba kernel (an @njit(cache=True) function) its on-disk cache holds
    for its current source: 0 on a cold cache (fresh install, upgrade, cleared cache); None when numba's cache
    cannot be inspected (its layout is numba's own and may change)."""
    try:
        return len(dispatcher._cache._cache_file._load_index())
    except Exception:       # noqa: BLE001 - numba internals: unknown means "do not guess"
        return None


_COMPILE_LINE = re.compile(r"^\S+: (compiling \S+ \.\.\.|compiled \S+ in [0-9.]+ s|still compiling \S+ \([0-9]+ s\))$")


def is_compile_line(line: str) -> bool:
    """True for a line this module prints while kernels compile (the notice, a kernel's start, end or ticker),
    so that a reader of a command's stderr can tell them from the command's own lines."""
    return line == NOTICE or bool(_COMPILE_LINE.match(line))
