"""Journal stores: one module per backend over the small contract in ``_base``.

:class:`Store` is the contract a synchronous backend implements and :class:`AsyncStore` its
asyncio twin (:class:`TaskUpdate` is what ``write_task`` takes); ``Journal.store`` and
``AsyncJournal.store`` are one of them. The backends are
``intentlog.stores.sqlite``, ``intentlog.stores.sqlite_async`` and ``intentlog.stores.postgres``.
"""

from intentlog.stores._async_store import AsyncStore
from intentlog.stores._base import Store, TaskUpdate

__all__ = ["AsyncStore", "Store", "TaskUpdate"]
