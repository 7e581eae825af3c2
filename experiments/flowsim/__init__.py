"""A flow-level fabric simulator with the product's code in the loop
(issue #34 §1): what one machine cannot emulate -- FatTree k = 8 to 32,
hundreds to thousands of hosts at any link speed -- simulated with the
same routing and allocation code the controller and the agents run.

- :mod:`.net`: the fabric as the controller sees it (its ``NetworkView``)
  and as the simulator needs it (directed links as array indices);
- :mod:`.routing`: where each subflow goes -- ``single_path`` and ``ecmp``
  by the product's ``DestinationRouting`` (its bucket layouts, hashed per
  5-tuple), ``lessor`` and ``hedera`` by ``LessorLogic``/``HederaLogic``
  fed ToR counters on PRE's own polling schedule (Algorithm 1 decides the
  period), their placements taking effect when the controller would have
  installed them;
- :mod:`.sharing`: how subflows share links -- max-min (TCP at flow level)
  with two priorities (BG first, up to each VM-pair's guarantee by Eqs. 1-2
  of LRC; WC max-min over the rest), by the compiled weighted max-min
  kernel LRC's controller uses (``apps.lrc._kernels.waterfill_csr``);
- :mod:`.engine`: event-driven: arrivals, completions and controller
  events; one allocation per window of ``window_s`` (flows arriving inside
  it are counted from their own arrival; completions inside it free their
  capacity at its end);
- :mod:`.command`: ``bwfabric simulate fabric ...``: JSON and plots.
"""
