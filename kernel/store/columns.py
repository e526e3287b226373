"""Column types shared by every table module: UTC timestamps on both dialects, and the two field
shapes most columns take."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, DateTime, Text, TypeDecorator
from sqlmodel import Field


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every dialect (SQLite hands back naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    # SQLite keeps these as text in SQLAlchemy's DATETIME storage format, `YYYY-MM-DD
    # HH:MM:SS.ffffff`. The chain above (our processor, then the dialect's: a %-format of a dict
    # one way, `fromisoformat` then `replace` the other) cost ~2.4 and ~0.9 µs a value, a dozen
    # binds and twenty results per step round trip; these give the same text and values in ~1
    # and ~0.1 µs, and hand anything else to the chain.
    def bind_processor(self, dialect: Any) -> Any:
        chain = super().bind_processor(dialect)
        if dialect.name != "sqlite" or chain is None:
            return chain

        # A use case binds the one `now` it read many times (a step's row, its events, the
        # execution's updated_at, the decision): the last value formatted, kept by identity,
        # answers the repeats. One tuple, replaced whole, so threads never see half of one.
        last: list[tuple[Any, str]] = [(object(), "")]  # never `is` a bound value

        def process(value: Any) -> Any:
            seen = last[0]
            if seen[0] is value:
                return seen[1]
            if value.__class__ is datetime and value.tzinfo is UTC:
                text = value.isoformat(" ", "microseconds")[:26]  # without its "+00:00"
                last[0] = (value, text)
                return text
            return chain(value)

        return process

    def result_processor(self, dialect: Any, coltype: Any) -> Any:
        chain = super().result_processor(dialect, coltype)
        if dialect.name != "sqlite" or chain is None:
            return chain
        parse = datetime.fromisoformat

        def process(value: Any) -> Any:
            if value.__class__ is str and len(value) == 26 and value[19] == ".":  # the storage format
                return parse(value + "+00:00")  # tzinfo is then the UTC singleton, as replace gives
            if value is None:  # NULL: an unset deadline, a step not completed yet
                return None
            return chain(value)

        return process


def ts(nullable: bool = False, index: bool = False) -> Any:
    return Field(sa_column=Column(UTCDateTime(), nullable=nullable, index=index))


def text_field(nullable: bool = True) -> Any:
    return Field(default=None, sa_column=Column(Text, nullable=nullable))
