"""LRC: logistic rate control of VM-pair rates. Not implemented yet (a later issue)."""
