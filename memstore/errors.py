"""The store's own exceptions. Only the API layer turns them into HTTP answers."""

from __future__ import annotations


class MemstoreError(Exception):
    """Base class of every error memstore raises on purpose."""


class InvalidInputError(MemstoreError, ValueError):
    """The caller sent something that cannot be stored or searched; nothing was written."""


class DimensionMismatchError(InvalidInputError):
    def __init__(self, *, expected: int, got: int, where: str = "vector") -> None:
        super().__init__(f"{where}: expected {expected} dimensions, not {got}")
        self.expected = expected
        self.got = got


class NotFoundError(MemstoreError, LookupError):
    """Something named by the caller does not exist."""


class CollectionNotFoundError(NotFoundError):
    def __init__(self, name: str) -> None:
        super().__init__(f"collection {name!r} does not exist")
        self.name = name


class SpaceNotFoundError(NotFoundError):
    def __init__(self, collection: str, space: str, spaces: list[str]) -> None:
        super().__init__(f"collection {collection!r} has no space {space!r} (it has: {', '.join(spaces)})")
        self.collection = collection
        self.space = space


class ItemNotFoundError(NotFoundError):
    def __init__(self, collection: str, item: int | str) -> None:
        super().__init__(f"item {item!r} does not exist in collection {collection!r}")
        self.collection = collection
        self.item = item


class ConflictError(MemstoreError):
    """The request collides with existing state."""


class CollectionExistsError(ConflictError):
    def __init__(self, name: str) -> None:
        super().__init__(f"collection {name!r} already exists")
        self.name = name


class DatabaseUnavailableError(MemstoreError):
    """The database could not be reached or started."""


class SchemaNotReadyError(DatabaseUnavailableError):
    """The database has no memstore schema yet (its migrations have not run)."""

    def __init__(self) -> None:
        super().__init__(
            "the database has no memstore schema yet: run `memstore db upgrade`, or from Python "
            "memstore.db.migrate.upgrade() (memstore serve does it at start)"
        )


class EncoderUnavailableError(MemstoreError):
    """A request needs the encoder, and this process has none ready (loading, failed or not run)."""

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after
