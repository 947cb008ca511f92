"""MPS control daemons, one per GPU or MIG device: start, find again, restart, set defaults, stop.

Both backends use it: NVML with NVIDIA's ``nvidia-cuda-mps-control``, the simulated backend
with the stand-in (``tessera.agent.backends.mpsstandin``), which keeps the same commands and
files. Each device has a folder under the MPS root: ``<root>/<device UUID>/pipe`` (the
daemon's ``CUDA_MPS_PIPE_DIRECTORY``: its ``control`` socket and
``nvidia-cuda-mps-control.pid``), ``log``, and ``tessera-mps.json``, the agent's record of the
daemon it started (the defaults it set, how often it had to restart it).

Daemons outlive the agent: they are started in the background (``-d``), not as its children,
and where the agent runs in a container (whose end takes every process in it along) the agent
does not start them at all: it asks the node's MPS host (``tessera.agent.backends.mpshost``, a
Pod of its own) through a request file in the device's folder (``host_program``). A restarted
agent finds them again through the pid file, and trusts it only when that pid is
alive and has this pipe folder in its environment (a pid file or socket left by a daemon that
died is stale, and cleared before a new daemon starts). ``state()`` tells ``RUNNING``,
``CRASHED`` (a record, no live daemon: it died without being asked to stop) or ``ABSENT``.

Defaults: a client that sets nothing gets the daemon's defaults, so ``start`` sets them with
the daemon's own commands, ``set_default_active_thread_percentage`` and
``set_default_device_pinned_mem_limit`` (device ordinal 0: the daemon sees only its device).
MPS enforces the pinned-memory limit on allocations and the thread percentage as a ceiling of
SMs a client's kernels use; it does not isolate memory bandwidth, caches or faults.
Not for: deciding when a device needs MPS (``tessera.agent.reconciler``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from tessera.agent.backends.base import BackendError, BackendTimeoutError, MpsDefaults, NotSupportedError

PID_FILE = "nvidia-cuda-mps-control.pid"
RECORD = "tessera-mps.json"
LAUNCH_REQUEST = "tessera-mps-launch.json"  # agent -> MPS host: start this folder's daemon
LAUNCH_ERROR = "tessera-mps-launch.error"  # MPS host -> agent: why it could not


@dataclass(frozen=True, slots=True)
class CommandResult:
    returncode: int
    stdout: str
    stderr: str


# argv, extra environment, stdin -> result. Raises FileNotFoundError when the program is missing.
CommandRunner = Callable[[list[str], dict[str, str], str | None], CommandResult]


def run_command(argv: list[str], env: dict[str, str], stdin: str | None) -> CommandResult:
    """The default runner: a subprocess with a 30 s limit."""
    done = subprocess.run(
        argv, input=stdin, env={**os.environ, **env}, capture_output=True, text=True, timeout=30, check=False
    )
    return CommandResult(done.returncode, done.stdout, done.stderr)


def run_checked(runner: CommandRunner, what: str, argv: list[str], env: dict[str, str], stdin: str | None) -> str:
    """Run a command; its stdout, or a BackendError that says what failed."""
    try:
        done = runner(argv, env, stdin)
    except FileNotFoundError:
        raise NotSupportedError(f"{what}: {argv[0]} is not installed on this node") from None
    except subprocess.TimeoutExpired:
        raise BackendTimeoutError(f"{what}: {argv[0]} did not finish in time") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
        raise BackendError(f"{what}: {' '.join(argv)} failed: {detail}")
    return done.stdout


def mps_log_directory(pipe_directory: str) -> str | None:
    """The log folder beside a daemon's pipe folder (``<root>/<uuid>/pipe`` -> ``<root>/<uuid>/log``),
    which client containers mount too; None for a pipe folder not laid out by ``MpsDaemons``."""
    pipe = Path(pipe_directory)
    return str(pipe.parent / "log") if pipe.name == "pipe" else None


class DaemonState(StrEnum):
    RUNNING = "Running"
    CRASHED = "Crashed"  # the agent started it and did not stop it, and it is gone
    ABSENT = "Absent"


@dataclass(frozen=True, slots=True)
class DaemonRecord:
    """What the agent remembers about a daemon it started (``tessera-mps.json``)."""

    device_uuid: str
    defaults: MpsDefaults
    restarts: int = 0


def defaults_commands(defaults: MpsDefaults) -> str:
    """The control commands that set ``defaults`` (stdin of the control program)."""
    lines = []
    if defaults.active_thread_percentage is not None:
        lines.append(f"set_default_active_thread_percentage {defaults.active_thread_percentage}")
    if defaults.pinned_memory_mib is not None:
        lines.append(f"set_default_device_pinned_mem_limit 0 {defaults.pinned_memory_mib}M")
    return "".join(f"{line}\n" for line in lines)


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
        return True  # no /proc here: the signal said it exists


def _serves(pid: int, pipe: Path) -> bool:
    """Whether process ``pid`` is the daemon of ``pipe`` (its environment names the folder), so a
    pid reused by an unrelated process is not mistaken for the daemon."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except PermissionError:
        return True  # cannot look (not root): the live pid is the best we know
    except OSError:
        return False
    return f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode() in environ


class MpsDaemons:
    """The MPS control daemons under ``root``, driven through ``control`` (the program's argv)."""

    def __init__(
        self,
        root: Path,
        control: Sequence[str],
        runner: CommandRunner = run_command,
        ready_timeout_s: float = 10.0,
        host_program: str | None = None,
    ) -> None:
        """``host_program``: None, the agent runs ``control -d`` itself; otherwise the name the
        node's MPS host knows this program by (``mpshost.PROGRAMS``), and the host starts it."""
        self.root = root
        self.control = list(control)
        self.runner = runner
        self.ready_timeout_s = ready_timeout_s
        self.host_program = host_program

    # -- paths --

    def folder(self, device_uuid: str) -> Path:
        return self.root / device_uuid

    def pipe(self, device_uuid: str) -> Path:
        return self.folder(device_uuid) / "pipe"

    def env(self, device_uuid: str) -> dict[str, str]:
        return {
            "CUDA_VISIBLE_DEVICES": device_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe(device_uuid)),
            "CUDA_MPS_LOG_DIRECTORY": str(self.folder(device_uuid) / "log"),
        }

    # -- reading --

    def pid(self, device_uuid: str) -> int | None:
        """The live daemon's pid, or None: a pid file is trusted only if its process serves it."""
        pipe = self.pipe(device_uuid)
        try:
            pid = int((pipe / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _pid_alive(pid) and _serves(pid, pipe) else None

    def record(self, device_uuid: str) -> DaemonRecord | None:
        try:
            data = json.loads((self.folder(device_uuid) / RECORD).read_text())
            return DaemonRecord(data["device_uuid"], MpsDefaults(**data["defaults"]), int(data.get("restarts", 0)))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def state(self, device_uuid: str) -> DaemonState:
        if self.pid(device_uuid) is not None:
            return DaemonState.RUNNING
        return DaemonState.CRASHED if self.record(device_uuid) is not None else DaemonState.ABSENT

    def _write_record(self, record: DaemonRecord) -> None:
        path = self.folder(record.device_uuid) / RECORD
        tmp = path.with_name(RECORD + ".tmp")
        tmp.write_text(json.dumps(asdict(record), sort_keys=True))
        os.replace(tmp, path)

    # -- changing --

    def start(self, device_uuid: str, defaults: MpsDefaults | None = None) -> tuple[str, bool]:
        """Make sure a daemon serves ``device_uuid`` with ``defaults`` (None: the ones it had).
        Returns (pipe folder, whether this restarted a daemon that had died). A live daemon is
        adopted, not restarted; a stale pipe folder is cleared first."""
        what = f"start an MPS daemon for {device_uuid}"
        record = self.record(device_uuid)
        wanted = defaults if defaults is not None else (record.defaults if record is not None else MpsDefaults())
        pipe = self.pipe(device_uuid)
        restarted = False
        if self.pid(device_uuid) is None:
            restarted = record is not None
            try:
                if pipe.exists():
                    shutil.rmtree(pipe)  # stale: a socket and pid file nobody serves any more
                pipe.mkdir(parents=True)
                (self.folder(device_uuid) / "log").mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise BackendError(f"{what}: cannot prepare {pipe}: {e}") from None
            if self.host_program is None:
                run_checked(self.runner, what, [*self.control, "-d"], self.env(device_uuid), None)
            else:
                self._ask_host(device_uuid, what)
            self._wait_ready(device_uuid, what)
            record = None  # a new daemon has no defaults yet
        if record is None or record.defaults != wanted:
            commands = defaults_commands(wanted)
            if commands:
                run_checked(self.runner, f"set the MPS defaults of {device_uuid}", self.control,
                            self.env(device_uuid), commands)
        previous = self.record(device_uuid)
        restarts = (previous.restarts if previous is not None else 0) + (1 if restarted else 0)
        self._write_record(DaemonRecord(device_uuid, wanted, restarts))
        return str(pipe), restarted

    def _ask_host(self, device_uuid: str, what: str) -> None:
        folder = self.folder(device_uuid)
        try:
            (folder / LAUNCH_ERROR).unlink(missing_ok=True)
            tmp = folder / (LAUNCH_REQUEST + ".tmp")
            tmp.write_text(json.dumps({"program": self.host_program}))
            os.replace(tmp, folder / LAUNCH_REQUEST)
        except OSError as e:
            raise BackendError(f"{what}: cannot ask the MPS host: {e}") from None

    def _wait_ready(self, device_uuid: str, what: str) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while self.pid(device_uuid) is None or not (self.pipe(device_uuid) / "control").exists():
            if self.host_program is not None:
                with contextlib.suppress(OSError):
                    refused = (self.folder(device_uuid) / LAUNCH_ERROR).read_text().strip()
                    if refused:  # the host writes it whole (rename); empty is a host still writing
                        raise BackendError(f"{what}: the MPS host could not: {refused}")
            if time.monotonic() > deadline:
                if self.host_program is not None:
                    with contextlib.suppress(OSError):
                        (self.folder(device_uuid) / LAUNCH_REQUEST).unlink()
                    raise BackendTimeoutError(
                        f"{what}: no MPS host started it within {self.ready_timeout_s:.0f} s; is the "
                        "tessera-mps-host DaemonSet's Pod running on this node (kubectl -n tessera-system get pods)?"
                    )
                raise BackendTimeoutError(f"{what}: the daemon did not come up within {self.ready_timeout_s:.0f} s")
            time.sleep(0.02)

    def stop(self, device_uuid: str) -> None:
        """Ask the daemon to quit and forget it. Idempotent; a daemon that does not quit in
        time is killed (its clients are gone: the reconciler stops only idle daemons)."""
        pid = self.pid(device_uuid)
        if pid is not None:
            what = f"stop the MPS daemon of {device_uuid}"
            with contextlib.suppress(BackendError):
                run_checked(self.runner, what, self.control, self.env(device_uuid), "quit\n")
            deadline = time.monotonic() + self.ready_timeout_s
            while _pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if _pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        with contextlib.suppress(FileNotFoundError):
            (self.folder(device_uuid) / RECORD).unlink()
        shutil.rmtree(self.pipe(device_uuid), ignore_errors=True)

    def kill_all(self) -> list[int]:
        """SIGKILL every live daemon under the root (tests and the demo clean up with it)."""
        killed = []
        for folder in sorted(self.root.glob("*/")) if self.root.is_dir() else []:
            pid = self.pid(folder.name)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
                killed.append(pid)
        return killed
