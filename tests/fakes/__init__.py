"""What the engine fakes (``turnstile.testing``) are held to: golden answers recorded from the
real vLLM and SGLang (``golden/``), the request shapes they answer (``vllm_golden.py``,
``sglang_golden.py``) and the recorders (``record_*_golden.py``)."""
