"""The core: what every release needs, knowing no mechanism by name."""
