"""LRC: logistic rate control of VM-pair rates (docs/lrc.md).

- the paper's equations and the two stateful halves (link factors, a
  host's pair rates) are shared with the agents: :mod:`bwcommon.lrc`;
- ``logic``: one controller round, pure (agents' reports -> pairs, paths,
  factors); ``_kernels``: its compiled weighted max-min;
- ``service``: the loop in the controller process (port statistics in,
  terms out to the agents every tau_r);
- ``settings``: its section of the configuration.

The host side (pairs from conntrack, rates to tc and the marker's buckets)
is the agent's: :mod:`hostagent.lrc`."""
