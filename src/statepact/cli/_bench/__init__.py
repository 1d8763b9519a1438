"""The parts of ``statepact bench`` (the command itself is ``cli/bench.py``).

``report`` (results, the progress bar, the table), ``counting`` (round trips per
operation), ``floors`` (the raw calls a scenario is held against), ``seed`` (the
minimal transaction designs held against the transaction scenarios), ``targets``
(which floors stand beside which scenario, and the ratio asked of each) and
``scenarios`` (statepact's own scenarios), ``lifecycle`` (the queue lifecycle's cells:
``stats()`` against finished items, cancel to handler stop). Only ``cli/bench.py`` imports them.
What is measured and how to read it: docs/benchmarks.md.
"""
