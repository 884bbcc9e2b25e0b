"""Testing tools for intentlog: crash points, a reference service, a crash harness."""
