"""The queue front's private parts, re-exported by :mod:`statepact.queue`: the
``WorkQueue`` protocol and the hooks a backing implements."""
