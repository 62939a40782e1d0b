"""postrl: reinforcement learning from policy gradients to LLM post-training."""

__version__ = "0.1.0"
