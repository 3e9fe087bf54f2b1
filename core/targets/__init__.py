"""What a target engine expects and serves: the engine table and its kernels, the conversion target, the served table and verdicts, split rules."""
