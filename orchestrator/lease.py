"""One driver per sweep, and a safe first use of a file-backed MLflow store.

Why a lock file and not only a tag: MLflow has no compare-and-swap on tags (the last writer
wins), so two drivers that read "no holder" at the same moment would both go on. For a store
that is a file on this machine (SQLite, ./mlruns) the kernel's `flock` is a real mutual
exclusion, and the kernel releases it the moment its holder dies (SIGKILL, OOM killer): a lost
driver is known at once, with no timeout to wait out. The lock file holds who has it (host,
pid, since) for the refusal line.

For a server store (http://...) no shared file exists: the lease is the heartbeat tag on the
sweep's parent run, refreshed every `HEARTBEAT_S`; a parent whose heartbeat is older than
`LEASE_TIMEOUT_S` has lost its driver. Two drivers started within the same second against one
server can both pass that check (documented in docs/reliability.md).

The same lock files serialize the store's creation and schema migration: two processes opening
a new SQLite store at once would otherwise both run Alembic and leave it half-migrated.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

from fp8lab_conf.contracts import TAG_DRIVER, TAG_DRIVER_HEARTBEAT
from fp8lab_conf.filesystem import process_exists
from orchestrator.errors import UserInputError

DRIVER_LOST = "driver lost"  # the `fp8lab.reason` of those runs
HEARTBEAT_S = 15.0
LEASE_TIMEOUT_S = 90.0  # a few missed heartbeats: a busy store is not a dead driver
LOCK_DIR = ".fp8lab-locks"


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int
    since: str

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.since}"

    @classmethod
    def me(cls) -> "Holder":
        since = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        return cls(socket.gethostname(), os.getpid(), since)


def local_store_path(uri: str) -> Path | None:
    """The file or folder of a store on this machine (SQLite file, file: folder), else None."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        return Path(uri.removeprefix("sqlite:///")).expanduser().resolve()
    if parsed.scheme in ("file", ""):
        return Path(parsed.path or uri).expanduser().resolve()
    return None


def _lock_file(store: Path, name: str) -> Path:
    folder = store.parent / LOCK_DIR
    folder.mkdir(exist_ok=True)
    return folder / f"{store.name}.{name}.lock"


@contextlib.contextmanager
def store_init_lock(uri: str) -> Iterator[None]:
    """Held while this process creates or migrates a local store; a no-op for server stores."""
    store = local_store_path(uri)
    if store is None or not store.parent.is_dir():
        yield
        return
    with open(_lock_file(store, "init"), "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # wait: the other process finishes the migration in seconds
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ready_store(uri: str) -> None:
    """Create/migrate the store once, under the init lock. MLflow caches the store object per
    URI in the process, so every later MlflowClient(uri) here reuses the migrated one."""
    from mlflow.tracking._tracking_service.utils import _get_store

    with store_init_lock(uri):
        _get_store(uri)


class SweepBusy(UserInputError):
    """Another live driver holds the sweep."""

    def __init__(self, sweep_id: str, holder: str):
        super().__init__(f"sweep {sweep_id}: already being run by {holder} (fix: wait for it to finish or stop "
                         "that process; a rerun then picks up only the missing trials)")


class SweepLease:
    """The right to drive one sweep. `acquire()` refuses (SweepBusy) while another live driver
    has it; `release()` (or process death) frees it."""

    def __init__(self, uri: str, sweep_id: str):
        self.uri, self.sweep_id = uri, sweep_id
        self.holder = Holder.me()
        self._handle: Any = None
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(self) -> None:
        store = local_store_path(self.uri)
        if store is None:
            return  # server store: the heartbeat check on the parent run is the lease (check_parent)
        handle = open(_lock_file(store, f"sweep-{self.sweep_id}"), "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe_live_holder(lambda: (handle.seek(0), handle.read())[1])
            handle.close()
            raise SweepBusy(self.sweep_id, holder) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(asdict(self.holder)))
        handle.flush()
        self._handle = handle

    def check_parent(self, tags: dict[str, str]) -> None:
        """Server stores: refuse when the parent run's heartbeat is fresh and not ours."""
        if local_store_path(self.uri) is not None:
            return
        if heartbeat_fresh(tags) and tags.get(TAG_DRIVER) != self.holder.describe():
            raise SweepBusy(self.sweep_id, f"{tags.get(TAG_DRIVER)} (heartbeat {heartbeat_age(tags):.0f}s ago)")

    def start_heartbeat(self, client: Any, parent_run_id: str) -> None:
        """Tag the parent with its driver and keep its heartbeat fresh from a daemon thread."""
        client.set_tag(parent_run_id, TAG_DRIVER, self.holder.describe())
        client.set_tag(parent_run_id, TAG_DRIVER_HEARTBEAT, f"{time.time():.0f}")

        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                with contextlib.suppress(Exception):  # a store hiccup is not fatal; the lease only ages
                    client.set_tag(parent_run_id, TAG_DRIVER_HEARTBEAT, f"{time.time():.0f}")

        self._beat = threading.Thread(target=beat, name="fp8lab-heartbeat", daemon=True)
        self._beat.start()

    def release(self) -> None:
        self._stop.set()
        if self._handle is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._handle, fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> "SweepLease":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _describe_holder(text: str) -> str:
    try:
        return Holder(**json.loads(text)).describe()
    except (ValueError, TypeError):
        return "another fp8lab process (no holder recorded yet)"


HOLDER_WAIT_S = 1.0


def describe_live_holder(read_text: Callable[[], str], wait_s: float = HOLDER_WAIT_S) -> str:
    """Who holds a lock, read from its file. The new holder writes itself there just after taking
    the lock, so a reader that lost the race may find the file empty or still naming the previous
    holder, dead since; it re-reads for up to `wait_s` until the file names a live process."""
    deadline = time.monotonic() + wait_s
    while True:
        text = read_text()
        if _names_live_process(text) or time.monotonic() >= deadline:
            return _describe_holder(text)
        time.sleep(0.05)


def _names_live_process(text: str) -> bool:
    try:
        holder = Holder(**json.loads(text))
    except (ValueError, TypeError):
        return False
    if holder.host != socket.gethostname():
        return True  # another machine's process: nothing to check from here
    return process_exists(holder.pid)


def heartbeat_age(tags: dict[str, str]) -> float:
    try:
        return time.time() - float(tags.get(TAG_DRIVER_HEARTBEAT, ""))
    except ValueError:
        return float("inf")


def heartbeat_fresh(tags: dict[str, str]) -> bool:
    return heartbeat_age(tags) < LEASE_TIMEOUT_S


def driver_alive(uri: str, sweep_id: str, parent_tags: dict[str, str]) -> bool:
    """Is a driver of this sweep alive now? Local store: someone holds its lock (asked without
    taking it for long). Server store: the parent's heartbeat is fresh."""
    store = local_store_path(uri)
    if store is None:
        return heartbeat_fresh(parent_tags)
    return lock_held(store.parent / LOCK_DIR / f"{store.name}.sweep-{sweep_id}.lock")


def lock_held(path: Path) -> bool:
    """Does a live process hold this lock file now? (Asked without taking it for long; a lock
    file nobody holds is left behind by a process that is gone.)"""
    if not path.exists():
        return False
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False
