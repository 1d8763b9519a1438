"""``TransactionConformance``'s areas, one mixin each (``statepact.testing.tx_suite``)."""
