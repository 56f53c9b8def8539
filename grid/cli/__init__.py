"""gridctl: one module per command group, composed in main.py."""
