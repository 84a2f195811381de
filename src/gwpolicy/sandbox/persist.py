"""The sandbox's etcd: objects and the resourceVersion counter in one SQLite file (`--data-dir DIR`),
written in the same transaction as each change, so a restart, also after `kill -9`, comes back
with every acknowledged write and never hands out a resourceVersion again.

SQLite in WAL mode with synchronous=NORMAL: a commit is in the OS's hands before the API answers,
which survives the process being killed (not a power cut, which a playground need not survive).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Iterator

import orjson

Key = tuple[str, str, str, str]


class DataDirError(Exception):
    """The data directory cannot be used (not writable, not a sandbox's database, ...)."""


class Persistence:
    def __init__(self, data_dir: str | Path) -> None:
        self.dir = Path(data_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.dir / "sandbox.db", isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS objects (grp TEXT, plural TEXT, ns TEXT, name TEXT, body BLOB, "
                            "PRIMARY KEY (grp, plural, ns, name))")
            self.db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        except (OSError, sqlite3.Error) as exc:
            raise DataDirError(f"cannot use --data-dir {self.dir}: {exc}") from exc

    def load(self) -> tuple[int, Iterator[tuple[Key, dict[str, Any]]]]:
        """The last resourceVersion handed out, and every stored object."""
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key = 'rv'").fetchone()
            rows = self.db.execute("SELECT grp, plural, ns, name, body FROM objects").fetchall()
        except sqlite3.Error as exc:
            raise DataDirError(f"cannot read {self.dir / 'sandbox.db'}: {exc}") from exc
        return int(row[0]) if row else 0, (((g, p, ns, n), orjson.loads(b)) for g, p, ns, n, b in rows)

    def write(self, rv: int, key: Key, obj: dict[str, Any] | None) -> None:
        """Store (or, with None, remove) one object and the counter, in one transaction."""
        with self.db:
            self.db.execute("BEGIN")
            if obj is None:
                self.db.execute("DELETE FROM objects WHERE grp=? AND plural=? AND ns=? AND name=?", key)
            else:
                self.db.execute("INSERT OR REPLACE INTO objects VALUES (?, ?, ?, ?, ?)", (*key, orjson.dumps(obj)))
            self.db.execute("INSERT OR REPLACE INTO meta VALUES ('rv', ?)", (str(rv),))

    def close(self) -> None:
        self.db.close()
