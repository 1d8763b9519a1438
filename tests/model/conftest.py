"""The model lane's fixtures: ``model_backing`` runs each machine against every backing."""

from tests.model._harness import (  # noqa: F401 - fixtures, registered by import
    memory_model_backing,
    model_backing,
    postgres_model_backing,
    redis_model_backing,
)
