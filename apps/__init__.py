"""User-facing apps: the framegraph CLI, demo, servers, benches."""
