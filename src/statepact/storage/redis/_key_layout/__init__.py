"""The parts of the one Redis key codec, ``_keys.py``, by layout: ``grammar`` (segments
and references), ``state``, ``queue``, ``tx``, ``integrations`` (ADK, LangGraph) and
``workers``. Only ``_keys.py`` imports them; everything else imports ``_keys``.
"""
