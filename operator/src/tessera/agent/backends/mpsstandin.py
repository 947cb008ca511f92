"""A stand-in for ``nvidia-cuda-mps-control``, for the simulated backend: a real process with a
pid, a pipe folder and a control socket, so MPS lifecycles (start, find again after an agent
restart, crash, restart, quit) are tested for real where there is no NVIDIA driver.

It keeps the real program's surface, as far as Tessera uses it:

- ``-d`` starts the control daemon in the background and returns once it is ready. The daemon
  takes ``CUDA_MPS_PIPE_DIRECTORY`` (default ``/tmp/nvidia-mps``), creates ``control`` (a unix
  socket) and ``nvidia-cuda-mps-control.pid`` there, and refuses to start while another live
  daemon owns the folder. ``quit`` removes the pid file and ends it; a daemon that is killed
  leaves both files behind, stale.
- Without ``-d`` it is the client: commands on stdin, one per line, answers on stdout; with no
  daemon it says so on stderr and exits 1.
- Commands: ``set_default_active_thread_percentage N``, ``get_default_active_thread_percentage``,
  ``set_default_device_pinned_mem_limit DEV VALUE``, ``get_default_device_pinned_mem_limit DEV``,
  ``get_server_list`` (always empty: no CUDA client ever connects here), ``quit``. Defaults live
  in the daemon's memory only, as in the real one.

The daemon also ends by itself when its pipe folder disappears or its pid file names another
process, so a test that deletes its folders leaves no process behind.
Run: ``python -m tessera.agent.backends.mpsstandin [-d]``.
Not for: real GPUs (the NVML backend runs NVIDIA's program).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import sys
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL = "control"
_NO_DAEMON = "Cannot find MPS control daemon process"


def pipe_directory() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _running_pid(pipe: Path) -> int | None:
    try:
        pid = int((pipe / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


class _Daemon:
    def __init__(self, pipe: Path) -> None:
        self.pipe = pipe
        self.thread_percentage = "100.0"
        self.pinned: dict[str, str] = {}

    def answer(self, line: str) -> tuple[str, bool]:
        """(reply, quit)."""
        words = line.split()
        if not words:
            return "", False
        match words:
            case ["quit"]:
                return "", True
            case ["get_server_list"]:
                return "", False
            case ["get_default_active_thread_percentage"]:
                return self.thread_percentage, False
            case ["set_default_active_thread_percentage", value] if _number(value):
                self.thread_percentage = f"{float(value):.1f}"
                return self.thread_percentage, False
            case ["get_default_device_pinned_mem_limit", device]:
                return self.pinned.get(device, "0"), False
            case ["set_default_device_pinned_mem_limit", device, value] if _memory(value):
                self.pinned[device] = value
                return "", False
        return f"Unknown or malformed command: {line.strip()}", False

    def serve(self, server: socket.socket) -> None:
        clients: dict[socket.socket, bytes] = {}
        while True:
            ready, _, _ = select.select([server, *clients], [], [], 2.0)
            if not ready and not self._still_ours():
                return
            for sock in ready:
                if sock is server:
                    conn, _ = server.accept()
                    clients[conn] = b""
                    continue
                data = sock.recv(4096)
                if not data:
                    del clients[sock]
                    sock.close()
                    continue
                buffer = clients[sock] + data
                while b"\n" in buffer:
                    raw, buffer = buffer.split(b"\n", 1)
                    reply, stop = self.answer(raw.decode(errors="replace"))
                    sock.sendall(reply.encode() + b"\n")
                    if stop:
                        return
                clients[sock] = buffer

    def _still_ours(self) -> bool:
        try:
            return int((self.pipe / PID_FILE).read_text().strip()) == os.getpid()
        except (OSError, ValueError):
            return False


def _number(value: str) -> bool:
    try:
        return 0 < float(value) <= 100
    except ValueError:
        return False


def _memory(value: str) -> bool:
    return value[:-1].isdigit() and value[-1:] in ("M", "G")


def start_daemon() -> int:
    """``-d``: fork the daemon, wait until it serves, return its status for our caller."""
    pipe = pipe_directory()
    if _running_pid(pipe) is not None:
        print(f"An MPS control daemon already runs for {pipe}", file=sys.stderr)
        return 1
    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(write_end)
        with os.fdopen(read_end) as ready:
            answer = ready.read()
        os.waitpid(child, 0)
        if answer != "ok":
            print(answer or "the MPS control daemon did not start", file=sys.stderr)
            return 1
        return 0
    os.close(read_end)
    os.setsid()
    if os.fork():  # the daemon is the grandchild: nobody's child, it outlives whoever started it
        os._exit(0)
    with os.fdopen(write_end, "w") as report:
        try:
            pipe.mkdir(parents=True, exist_ok=True)
            control = pipe / CONTROL
            with contextlib.suppress(FileNotFoundError):
                control.unlink()  # stale: no live daemon owns the folder (checked above)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            os.chdir(pipe)  # bind by relative name: a unix socket's path is limited to 107 bytes
            server.bind(CONTROL)
            os.chdir("/")
            server.listen(16)
            (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        except OSError as e:
            report.write(f"the MPS control daemon cannot use {pipe}: {e}")
            report.flush()
            os._exit(1)
        report.write("ok")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    try:
        _Daemon(pipe).serve(server)
    finally:
        with contextlib.suppress(OSError):
            if int((pipe / PID_FILE).read_text().strip()) == os.getpid():
                (pipe / PID_FILE).unlink()
        server.close()
    os._exit(0)


def client() -> int:
    """Commands from stdin to the daemon of ``CUDA_MPS_PIPE_DIRECTORY``; answers to stdout."""
    pipe = pipe_directory()
    if _running_pid(pipe) is None:
        print(_NO_DAEMON, file=sys.stderr)
        return 1
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            os.chdir(pipe)  # connect by relative name, as the daemon bound it
            sock.connect(CONTROL)
            stream = sock.makefile("rwb")
            for line in sys.stdin:
                if not line.strip():
                    continue
                stream.write(line.strip().encode() + b"\n")
                stream.flush()
                reply = stream.readline()
                if not reply:  # the daemon quit
                    return 0
                text = reply.decode().rstrip("\n")
                if text:
                    print(text)
    except OSError:
        print(_NO_DAEMON, file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    return start_daemon() if "-d" in argv else client()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
