"""``python -m tessera`` with a memory witness beside it: to tell where a long run's resident
memory goes when it grows (issue #21, item 6). RSS alone cannot say whether Python objects pile
up (a leak in our code), or glibc's malloc keeps freed memory it cannot give back (fragmentation,
one arena per thread that ever allocated), or a native library holds more.

    python -m benchmarks.traced_tessera agent --node-name n1 ...      (the arguments of tessera)

Every ``TESSERA_TRACE_EVERY`` seconds (default 30) one JSON line goes to ``TESSERA_TRACE_OUT``
(default stderr): VmRSS and RssAnon, the thread count, pymalloc's arenas and how full they are
(``sys._debugmallocstats``), glibc's ``mallinfo2`` (bytes in use, bytes free inside the heaps,
mmapped bytes) and ``malloc_info``'s heap (arena) count and sizes, the largest anonymous mappings,
and, with ``TESSERA_TRACE_PYTHON=1``, tracemalloc's traced total and the ten source lines whose
allocations grew most since the first line; with ``TESSERA_TRACE_TYPES=1``, the object types whose
count grew most since the first line (so not start-up's imports). ``TESSERA_TRACE_TRIM=<s>`` calls ``malloc_trim(0)``
every so many seconds, to see how much of the growth glibc would give back.
Run from the repository root (``benchmarks`` is found from the working directory); the churn
benchmark starts one agent through it for each ``--variant``.
Not for: production (tracemalloc slows every allocation), or other C libraries than glibc.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import gc
import json
import os
import re
import runpy
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import IO, Any


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.open_memstream.restype = ctypes.c_void_p
        libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        return libc
    except (OSError, AttributeError):  # not glibc, or a glibc before 2.33 (no mallinfo2)
        return None


def _malloc_info(libc: ctypes.CDLL) -> str:
    buffer, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
    if not stream:
        return ""
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    text = (buffer.value or b"").decode(errors="replace")
    ctypes.CDLL(None).free(buffer)
    return text


_PYMALLOC = {
    "pymalloc_arenas": re.compile(r"# arenas allocated current\s*=\s*([\d,]+)"),
    "pymalloc_in_blocks_kib": re.compile(r"# bytes in allocated blocks\s*=\s*([\d,]+)"),
    "pymalloc_free_in_pools_kib": re.compile(r"# bytes in available blocks\s*=\s*([\d,]+)"),
    "pymalloc_free_pools_kib": re.compile(r"\d+ unused pools \* \d+ bytes\s*=\s*([\d,]+)"),
}


def _pymalloc_stats() -> dict[str, int]:
    """Python's small-object allocator (pymalloc), which takes its 1 MiB arenas from mmap, past
    glibc's malloc: what ``sys._debugmallocstats`` writes to fd 2, caught in a file for a moment
    (another thread's write to stderr in that moment lands in the file too: a witness's price)."""
    with tempfile.TemporaryFile() as caught:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(caught.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        text = caught.read().decode(errors="replace")
    found = {}
    for key, pattern in _PYMALLOC.items():
        match = pattern.search(text)
        if match:
            value = int(match.group(1).replace(",", ""))
            found[key] = value if key == "pymalloc_arenas" else value // 1024
    return found


_HEAP = re.compile(r'<heap nr="(\d+)">.*?<system type="current" size="(\d+)"/>', re.S)


def _status() -> dict[str, int]:
    wanted = {"VmRSS", "RssAnon", "RssFile", "Threads"}
    fields: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in wanted:
            fields[key] = int(value.split()[0])
    return fields


def _anonymous_mappings(top: int = 12) -> list[str]:
    """The anonymous mappings holding the most resident memory, as ``start:size:rss`` (KiB): a
    region that grows between samples is where the growth is (glibc's arenas are 64 MiB
    regions, pymalloc's 1 MiB ones merge into their neighbours, a thread's stack is 8 MiB)."""
    found: list[tuple[int, str]] = []
    name, size = "", 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and not head[0].endswith(":"):
            start = head[0].split("-")[0]
            name = head[5] if len(head) > 5 else ""
            name = start if not name else name if name.startswith("[") else ""
        elif head[0] == "Size:":
            size = int(head[1])
        elif head[0] == "Rss:" and name and int(head[1]) > 0:
            found.append((int(head[1]), f"{name}:{size}:{head[1]}"))
    return [text for _, text in sorted(found, reverse=True)[:top]]


def _census() -> collections.Counter[str]:
    """How many objects the garbage collector tracks, by type (containers and instances;
    strings, numbers and bytes are not tracked: tracemalloc sees those)."""
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.get_objects())


def _sample(libc: ctypes.CDLL | None, first: tracemalloc.Snapshot | None, started: float,
            census: collections.Counter[str] | None = None) -> dict[str, Any]:
    line: dict[str, Any] = {"t": round(time.monotonic() - started, 1), **_status(),
                            "py_blocks": sys.getallocatedblocks(), **_pymalloc_stats(),
                            "anon": _anonymous_mappings()}
    if libc is not None:
        info = libc.mallinfo2()
        line.update(malloc_in_use_kib=(info.uordblks + info.hblkhd) // 1024,
                    malloc_free_kib=info.fordblks // 1024, malloc_mmapped_kib=info.hblkhd // 1024)
        heaps = [(int(nr), int(size) // 1024) for nr, size in _HEAP.findall(_malloc_info(libc))]
        line.update(arenas=len(heaps), arena_kib=[size for _, size in heaps])
    if census is not None:
        now = _census()
        grown = sorted(((now[k] - census.get(k, 0), k) for k in now), reverse=True)[:10]
        line["objects"] = sum(now.values())
        line["types_grown"] = [f"{name} {count:+d}" for count, name in grown if count > 0]
    if tracemalloc.is_tracing():
        line["traced_kib"] = tracemalloc.get_traced_memory()[0] // 1024
        if first is not None:
            top = tracemalloc.take_snapshot().compare_to(first, "lineno")[:10]
            line["grew"] = [f"{stat.traceback[0].filename}:{stat.traceback[0].lineno} {stat.size_diff // 1024:+d} KiB"
                            for stat in top]
    return line


def _witness(out: IO[str], every: float, trim_every: float) -> None:
    libc = _libc()
    started = time.monotonic()
    first = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
    counting = os.environ.get("TESSERA_TRACE_TYPES") == "1"
    census: collections.Counter[str] | None = None
    next_trim = started + trim_every if trim_every > 0 else float("inf")
    while True:
        time.sleep(every)
        if libc is not None and time.monotonic() >= next_trim:
            libc.malloc_trim(0)
            next_trim = time.monotonic() + trim_every
        if counting and census is None:
            census = _census()  # the baseline: at the first line, after start-up's imports
        with contextlib.suppress(Exception):  # a witness must never take the process down
            out.write(json.dumps(_sample(libc, first, started, census)) + "\n")
            out.flush()


def main() -> None:
    if os.environ.get("TESSERA_TRACE_PYTHON") == "1":
        tracemalloc.start(1)
    target = os.environ.get("TESSERA_TRACE_OUT")
    out: IO[str] = open(target, "a", encoding="utf-8") if target else sys.stderr  # noqa: SIM115 (lives as long as the process)
    every = float(os.environ.get("TESSERA_TRACE_EVERY", "30"))
    trim_every = float(os.environ.get("TESSERA_TRACE_TRIM", "0"))
    threading.Thread(target=_witness, args=(out, every, trim_every), name="memory-witness", daemon=True).start()
    sys.argv = ["tessera", *sys.argv[1:]]
    runpy.run_module("tessera", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
