"""bwfabric's shared lower layer: what the controller, its apps and the host
agent all speak, and nothing else (it imports none of them;
docs/architecture.md, tests/unit/test_architecture.py).

- ``contract``: the BG/WC ToS contract and the burst every enforcer shares;
- ``validate``: strict models and numbers (NaN and infinity refused by name);
- ``loops``: the guard every periodic loop runs its rounds through;
- ``channel``, ``transport``, ``agentclient``: the authenticated
  controller-agent channel (messages, frames, one request at a time);
- ``hostconfig``: the agent's configuration, one schema for both sides;
- ``policy``: the WC fairness policy's formulas (competition level, Eq. 1);
- ``lrc``: LRC's equations and its two stateful halves (link factors at
  the controller, pair rates at the agents).
"""
