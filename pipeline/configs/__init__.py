"""Named configs: each module exposes get_config()."""
