"""Stage 2: :mod:`.releaser` merges the partitions' handovers of a window, :mod:`.release` builds its DP release
through the kind's handler and charges the ledger (:mod:`agents.ledger`, sealed by :mod:`.ledger_seal`;
:mod:`.lost_ledger` refuses to start over a ledger topic that lost its history)."""
