"""The TRL seam: every private TRL override and touch, TRL's head and scoring passes on a CPU, and the Hugging Face trainer arguments."""
