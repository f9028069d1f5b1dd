"""The composition root: what a process runs, built from the layers below (nothing below imports
this package; ``python -m turnstile`` runs its CLI): ``cli`` (the ``turnstile`` command),
``serve_options`` (``turnstile serve``'s options), ``wiring`` (a server built from them: the
store, the engines, the gateways, the app), ``workers`` (``serve --workers N``: the front and
its worker processes) and ``ray`` (``serve --ray``: gateway replicas as a Ray Serve
application, the ``ray`` extra)."""
