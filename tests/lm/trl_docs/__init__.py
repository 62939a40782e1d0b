"""TRL's documented ``environment_factory`` examples, copied verbatim (tests/lm/test_agents_trl_example.py)."""
