"""An order service on SQLAlchemy 2 (async), Alembic and FastAPI, with statepact beside it.

- :mod:`orders_app.models`: the application's own ``MetaData`` and ``orders`` table;
- :mod:`orders_app.services`: one engine and session factory, shared by the
  application's tables and statepact's state store and work queue;
- :mod:`orders_app.api`: the FastAPI app; ``POST /orders`` writes the order, its
  statepact run and its work item in one transaction;
- :mod:`orders_app.worker`: claims the work, marks the order processed, finishes
  the run and acknowledges the item, again in one transaction.

See docs/example-app.md in statepact's repository for a walk through it.
"""
