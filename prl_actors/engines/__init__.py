"""Generation engines: torch (built-in, default), sim (control-plane tests), vllm (optional)."""
