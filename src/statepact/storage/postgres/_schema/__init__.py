"""The table definitions of :mod:`statepact.storage.postgres.schema`, by area; that
module builds them into its one ``MetaData`` and re-exports what is public."""
