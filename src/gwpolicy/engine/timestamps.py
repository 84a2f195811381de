"""`metadata.creationTimestamp` in every form an input can hold, as one RFC 3339 UTC text (S5.4 age).

The age order decides conflicts, so a timestamp must mean the same instant however it was written:
quoted text (`"2024-01-01T02:00:00+02:00"`), an unquoted YAML timestamp (PyYAML gives a `datetime`,
or a `date`), with or without fractional seconds or a zone. A time without a zone is taken as UTC,
as the API server writes every time in UTC. Anything else cannot be parsed: the caller warns and
the object counts as having no timestamp (it sorts as the newest).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any


class BadTimestamp(ValueError):
    """A creationTimestamp that is set but is no time; the message says what it is."""


def parse(value: Any) -> datetime | None:
    """The instant `value` names, in UTC; None when unset (absent, null or empty); BadTimestamp otherwise."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):  # a bare YAML date: its midnight
        moment = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        text = value.strip()
        if len(text) > 10 and text[10] in "tT ":
            text = text[:10] + "T" + text[11:]
        if text[-1:] in ("z", "Z"):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise BadTimestamp(f"{value!r} is not an RFC 3339 time such as 2024-01-31T12:00:00Z") from None
    else:
        raise BadTimestamp(f"{value!r} is not an RFC 3339 time such as 2024-01-31T12:00:00Z")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc)


def rfc3339(moment: datetime) -> str:
    """`2024-01-01T00:00:00Z`, with the fraction of a second only when there is one."""
    text = moment.astimezone(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds")
    if moment.microsecond:
        text += f".{moment.microsecond:06d}".rstrip("0")
    return text + "Z"


#: sorts after every time: the key of an object without a creationTimestamp (it is not created yet)
NO_TIME_KEY = "~"


@dataclass(frozen=True, slots=True)
class CreationTime:
    """What an object's creationTimestamp says: RFC 3339 UTC text, or None when unset or unreadable."""

    text: str | None
    sort_key: str = NO_TIME_KEY  # fixed-width text that sorts as time does
    problem: str | None = None  # why a value that was set could not be read


def creation_time(value: Any) -> CreationTime:
    """Read a creationTimestamp value of any form (see the module docstring)."""
    if (isinstance(value, str) and len(value) == 20 and value[19] == "Z" and value[10] == "T"
            and value[4] == value[7] == "-" and value[13] == value[16] == ":"):
        try:  # the form the API server writes, so the common case: only check that it is a time
            datetime.fromisoformat(value[:19])
        except ValueError:
            pass
        else:
            return CreationTime(value, value[:19] + ".000000")
    try:
        moment = parse(value)
    except BadTimestamp as exc:
        return CreationTime(None, problem=str(exc))
    except (OverflowError, OSError) as exc:  # a zone offset that leaves the calendar
        return CreationTime(None, problem=f"{value!r} is out of range: {exc}")
    if moment is None:
        return CreationTime(None)
    return CreationTime(rfc3339(moment), moment.replace(tzinfo=None).isoformat(timespec="microseconds"))
