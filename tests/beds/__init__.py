"""Real servers the tests start themselves (beside llama-server, which the testbed builds)."""
