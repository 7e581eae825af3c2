"""The bwfabric host agent (`bwfabric agent`): MPTCP BG/WC subflows, marking,
HTB guarantees, fair-WC congestion control. Not implemented yet: issue #4."""
