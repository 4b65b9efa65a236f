"""ox's partial indexes, on every database. PostgreSQL and SQLite index only the rows a
condition picks (the READY backlog, the RUNNING set, finished rows). MySQL and MariaDB have
no partial indexes, and Django would write the condition there anyway (a syntax error). There
a PartialIndex is a full index that leads with the column its condition fixes (status), so
the same queries read the same range of it; the partial unique index of unique tasks is a
generated column there instead (migration 0016)."""

from typing import Any

from django.db import models


class PartialIndex(models.Index):
    """models.Index with a condition; where the database has no partial indexes, a full index
    on `fallback` (default: status, then the index's fields)."""

    def __init__(self, *expressions: Any, fallback: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*expressions, **kwargs)
        self.fallback = list(fallback) if fallback is not None else self._led_by_status()

    def _led_by_status(self) -> list[str]:
        return self.fields if self.fields[:1] == ["status"] else ["status", *self.fields]

    def create_sql(self, model: Any, schema_editor: Any, using: str = "", **kwargs: Any) -> Any:
        if schema_editor.connection.features.supports_partial_indexes:
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        full = models.Index(fields=self.fallback, name=self.name, db_tablespace=self.db_tablespace)
        return full.create_sql(model, schema_editor, using=using, **kwargs)

    def check(self, model: Any, connection: Any) -> list[Any]:
        # Index.check warns that the condition is ignored where there are no partial
        # indexes: here it is not ignored, the fallback stands in for it.
        return [e for e in super().check(model, connection) if e.id != "models.W037"]

    def deconstruct(self) -> tuple[str, Any, dict[str, Any]]:
        _path, args, kwargs = super().deconstruct()
        if self.fallback != self._led_by_status():
            kwargs["fallback"] = self.fallback
        return "ox.db.indexes.PartialIndex", args, kwargs


class PartialUnique(models.UniqueConstraint):
    """models.UniqueConstraint with a condition; where the database has no partial indexes,
    nothing here (Django writes nothing there either): migration 0016 makes the generated
    column and its unique index that enforce it."""

    def check(self, model: Any, connection: Any) -> list[Any]:
        return [e for e in super().check(model, connection) if e.id != "models.W036"]

    def deconstruct(self) -> tuple[str, Any, dict[str, Any]]:
        _path, args, kwargs = super().deconstruct()
        return "ox.db.indexes.PartialUnique", args, kwargs
