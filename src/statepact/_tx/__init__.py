"""The transaction layer's parts behind ``statepact.tx`` (its public front)."""
