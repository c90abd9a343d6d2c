"""What kind of thing `tracking.uri` points at, checked before anything opens it.

MLflow meets a wrong store late and loudly: a SQLite URI on a folder retries for about two
minutes and ends in a long traceback, a file that is not SQLite fails inside Alembic, and a
database URI without its Python driver fails with `No module named ...` from SQLAlchemy. Every
command that opens a store (sweep, trial, report) calls `store_kind_problems` first, so each
of these is one line naming the field and the fix, exit 2, before any lock, run or Ray exists.
"""
from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
# Python DB-API modules SQLAlchemy loads for a database URI -> what to install for it.
DRIVER_INSTALL = {"psycopg": 'pip install "fp8lab[postgres]"', "psycopg2": 'pip install "fp8lab[postgres]" and use postgresql+psycopg://',
                  "MySQLdb": 'pip install "fp8lab[mysql]" and use mysql+pymysql://', "pymysql": 'pip install "fp8lab[mysql]"'}
CONNECT_TIMEOUT_S = 5


def store_kind_problems(uri: str) -> list[str]:
    """One line per problem with the store `uri` names (empty: it is the kind of store it claims)."""
    parsed = urlparse(uri)
    if parsed.scheme == "sqlite":
        return _sqlite_problems(Path(unquote(uri.removeprefix("sqlite:///"))).expanduser())
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path if parsed.scheme == "file" else uri)).expanduser()
        if path.exists() and not path.is_dir():
            return [f"tracking.uri: {path} is a file, but an MLflow file store is a folder (fix: tracking.uri=sqlite:///{path} "
                    "if it is an MLflow SQLite file, or a folder path)"]
        return []
    if parsed.scheme.split("+")[0] in ("postgresql", "mysql", "mssql", "oracle"):
        return _database_problems(uri)
    return []


def _sqlite_problems(path: Path) -> list[str]:
    if path.is_dir():
        return [f"tracking.uri: {path} is a folder, not a SQLite file (fix: tracking.uri=sqlite:///{path / 'mlflow.db'})"]
    if not path.is_file():
        return []  # a new store: MLflow creates it
    try:
        with path.open("rb") as handle:
            head = handle.read(len(SQLITE_MAGIC))
    except OSError as exc:
        return [f"tracking.uri: {path} cannot be read ({exc.strerror}) (fix: fix its permissions or choose another file)"]
    if head and head != SQLITE_MAGIC:  # SQLite itself treats an empty file as a new database
        return [f"tracking.uri: {path} is not a SQLite database (it starts with {head[:8]!r}) (fix: point tracking.uri at "
                "an MLflow SQLite file, or at a new path such as sqlite:///mlflow.db)"]
    return []


def _database_problems(uri: str) -> list[str]:
    """The URI's DB-API driver is importable (SQLAlchemy's own choice for the dialect) and the
    server answers within CONNECT_TIMEOUT_S."""
    import sqlalchemy  # noqa: PLC0415 - MLflow's own dependency; only database URIs need it
    from sqlalchemy.engine.url import make_url  # noqa: PLC0415

    shown = make_url(uri).render_as_string(hide_password=True)
    try:
        make_url(uri).get_dialect().import_dbapi()
    except ImportError as exc:
        module = getattr(exc, "name", None) or str(exc)
        fix = DRIVER_INSTALL.get(str(module), f"pip install the Python driver that provides {module}")
        return [f"tracking.uri: {shown} needs the database driver {module}, which is not installed (fix: {fix})"]
    engine = sqlalchemy.create_engine(uri, connect_args={"connect_timeout": CONNECT_TIMEOUT_S})
    try:
        with engine.connect():
            return []
    except Exception as exc:  # noqa: BLE001 - every driver raises its own connection errors
        first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return [f"tracking.uri: database {shown} is not reachable ({first}) (fix: start it, check the address and "
                "credentials, or use tracking.uri=sqlite:///mlflow.db)"]
    finally:
        engine.dispose()
