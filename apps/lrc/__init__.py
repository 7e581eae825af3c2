"""LRC: logistic rate control of VM-pair rates (docs/lrc.md).

- ``model``: the paper's equations, pure (Eqs. 2, 7, 27, 28; the pair terms;
  the link-factor equilibrium);
- ``control``: link factors (:class:`LinkFactors`) and a host's pair rates
  (:class:`PairRates`);
- ``logic``: one controller round, pure (agents' reports -> pairs, paths,
  factors); ``_kernels``: its compiled weighted max-min;
- ``service``: the loop in the controller process (port statistics in,
  terms out to the agents every tau_r).

The host side (pairs from conntrack, rates to tc and the marker's buckets)
is the agent's: :mod:`hostagent.lrc`."""
