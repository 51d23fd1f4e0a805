"""open_instruct: async-streaming GRPO with verifiable rewards."""

__version__ = "0.1.0"
