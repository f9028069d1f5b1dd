"""Fakes of the engines that cannot run here (vLLM, SGLang), in their documented shapes."""
