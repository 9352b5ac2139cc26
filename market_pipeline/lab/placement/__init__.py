"""Placement offline: the FGD saturation replay (`saturation`) of the live policies on a node list
and a pod list, `placement replay` and `bench placement`."""
