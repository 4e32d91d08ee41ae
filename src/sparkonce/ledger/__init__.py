"""Owner epochs and the batch ledger (the protocol in :mod:`sparkonce.protocol`)."""

from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry, Owner
from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE, SqlLedger

__all__ = [
    "LEDGER_TABLE",
    "OWNER_TABLE",
    "BatchContext",
    "CommitResult",
    "LedgerEntry",
    "Owner",
    "SqlLedger",
]
