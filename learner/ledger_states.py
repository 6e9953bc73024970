"""The ledger states of a prompt group (``learner.coordinator``): pending, leased, held
(awaiting verification), completed (kept, not yet trained) and trained; dropped groups are
``dropped:<reason>``."""

PENDING, LEASED, HELD, COMPLETED, TRAINED = "pending", "leased", "held", "completed", "trained"
