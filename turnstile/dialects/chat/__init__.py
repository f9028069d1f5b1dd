"""The Chat Completions dialect: ``dialect`` (its edge), ``request`` (its body → the internal
request, ``messages`` and ``fields`` its checks; the other dialects' readers end in it too) and
``answer`` (the completion and its chunks)."""
