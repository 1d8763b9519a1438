"""The parts of ``statepact queue`` (cli/queue.py): how items are shown, and the actions
that stop, pause and clean up a queue."""
