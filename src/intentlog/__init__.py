"""intentlog."""
