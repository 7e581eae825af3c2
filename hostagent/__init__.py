"""The bwfabric host agent (`bwfabric agent`; docs/architecture.md, docs/deploy.md): one per server,
configured by the controller over an authenticated channel; per VM it marks
and shapes BG at the guarantee (bwf_mark's buckets, HTB), makes every
connection MPTCP with a BG first subflow and a WC join (bwf_sockops), runs
the fair WC congestion control (bwf_wc) or a coupled one (bwf_coupled), and
LRC's pair rates (:mod:`hostagent.lrc`). It reports only what it reads back
from the kernel."""
