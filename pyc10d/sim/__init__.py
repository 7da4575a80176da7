"""A simulated network to run the real collective algorithms at thousands of ranks."""
