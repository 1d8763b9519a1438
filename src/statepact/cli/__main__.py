"""``python -m statepact.cli``: the ``statepact`` command line."""

from statepact.cli import main

raise SystemExit(main())
