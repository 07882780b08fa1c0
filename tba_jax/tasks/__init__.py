"""Tasks: problems, prompt formats and rewards (pure Python)."""
