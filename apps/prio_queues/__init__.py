"""Two-priority (BG/WC) queues keyed on ToS (docs/apps.md): ``logic`` (pure:
the classification table, per-VM ToR meters and their entries), ``app`` (the
os-ken adapter), ``settings`` (its section of the configuration). Table 0 of
the pipeline holds its classification rules."""
