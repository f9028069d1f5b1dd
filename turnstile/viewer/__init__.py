"""The trajectory viewer: a page at ``/ui`` (static HTML/CSS and one script, no build step,
nothing fetched from elsewhere) over the trainer's JSON routes, plus the few routes it needs that
no trainer route gives (session summaries, text pieces of each token, a Parquet download).

``turnstile serve`` mounts it beside the gateway; ``turnstile view --data DIR`` serves it over a
store alone, read-only (:mod:`.app`)."""
