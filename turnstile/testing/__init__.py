"""Test support shipped with the package: fake engines (vLLM, SGLang) in their documented
shapes, held to golden answers recorded from the real servers (``tests/fakes/golden``), and a
recording relay. Turnstile's tests and benchmarks use them, and a user can test a harness
against a fake engine the same way (as httpx ships ``MockTransport``).

Nothing else in ``turnstile`` imports this package (``tests/test_architecture.py``): it is the
top layer, never on a request's path.
"""
