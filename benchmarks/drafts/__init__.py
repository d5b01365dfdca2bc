"""Draft quality: acceptance per draft kind, the ceiling any draft can reach, trained drafts (training, speed)."""
