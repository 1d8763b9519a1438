"""``StateStoreConformance``'s areas, one mixin each (``statepact.testing.state_suite``)."""
