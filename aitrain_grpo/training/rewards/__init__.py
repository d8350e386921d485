"""Rewards beside the environment's score: reward functions and the judge."""
