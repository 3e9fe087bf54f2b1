"""The converter: source checkpoint -> Marlin-order checkpoint (plan, transform, write, publish) and back."""
