"""``python -m turnstile``: the ``turnstile`` command."""

from turnstile.app.cli import main

main()
