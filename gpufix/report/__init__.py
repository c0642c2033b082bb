"""Reports: the same findings drawn for people (terminal, Markdown) and machines (JSON)."""
