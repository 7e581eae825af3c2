"""Two-priority (BG/WC) queues keyed on ToS. Not implemented yet: tracked by
issue #4. Table 0 of the pipeline is reserved for its classification rules."""
